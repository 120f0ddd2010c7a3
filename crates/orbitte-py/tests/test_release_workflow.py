"""The release workflow (.github/workflows/release.yml) builds the wheel
for every tag the way `cargo xtask wheel` does and attaches it to the
release. It cannot run here; this reads it as the CI service would."""

from pathlib import Path

import pytest

from conftest import in_ci

try:
    import yaml
except ImportError:
    if in_ci():
        raise
    pytest.skip("skipped: PyYAML is not installed (.ci/run installs it)", allow_module_level=True)

WORKFLOW = Path(__file__).resolve().parents[3] / ".github" / "workflows" / "release.yml"


def test_every_tag_builds_checks_and_attaches_the_wheel():
    doc = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the bare key `on` as True.
    on = doc.get("on", doc.get(True))
    assert on["push"]["tags"] == ["v*"], on
    assert doc["permissions"]["contents"] == "write"
    steps = doc["jobs"]["wheel"]["steps"]
    runs = [s.get("run", "") for s in steps]
    uses = [s.get("uses", "") for s in steps]
    build = next(i for i, r in enumerate(runs) if "cargo xtask wheel" in r)
    check = next(i for i, r in enumerate(runs) if "import orbitte" in r)
    attach = next(i for i, u in enumerate(uses) if u.startswith("softprops/action-gh-release"))
    assert build < check < attach
    out = runs[build].split("--out", 1)[1].split()[0]
    assert steps[attach]["with"]["files"].startswith(f"{out}/orbitte-"), steps[attach]
    assert any(u.startswith("actions/checkout") for u in uses[:build])
    # The wheel carries the NIXL plugin: the headers come first and the
    # build is pointed at them; the check prints the plugin's folder.
    headers = next(i for i, r in enumerate(runs) if "ai-dynamo/nixl" in r)
    assert headers < build
    assert steps[build]["env"]["NIXL_INCLUDE_DIR"] in runs[headers]
    assert "orbitte.nixl_plugin" in runs[check]
