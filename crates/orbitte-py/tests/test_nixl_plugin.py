"""``python -m orbitte.nixl_plugin``: the folder it prepares for
NIXL_PLUGIN_DIR holds OrbitTE's plugin and links to nixl-cu12's plugins,
and NIXL's own agent loads the plugin from it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import orbitte.nixl
import orbitte.nixl_plugin
from conftest import in_ci

ROOT = Path(__file__).resolve().parents[3]


def run(args, env_extra=None, **kw):
    env = dict(os.environ)
    env.pop("ORBITTE_NIXL_PLUGIN", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "orbitte.nixl_plugin", *args], capture_output=True, text=True, env=env, **kw)


def packaged_plugin() -> Path:
    """The plugin inside the installed package: it must be there where the
    wheel was built with NIXL's headers, and under CI."""
    path = Path(orbitte.nixl_plugin.__file__).parent / "libplugin_OrbitTE.so"
    if not path.is_file():
        if in_ci() or os.environ.get("NIXL_INCLUDE_DIR"):
            pytest.fail(f"{path} is missing: under CI, and with NIXL_INCLUDE_DIR set, the wheel must carry the plugin")
        pytest.skip("this orbitte wheel carries no NIXL plugin (built without NIXL_INCLUDE_DIR)")
    return path


def fake_nixl(tmp_path: Path) -> Path:
    """A nixl-cu12 installation as the wheel lays it out, with two plugins."""
    site = tmp_path / "site"
    (site / "nixl_cu12").mkdir(parents=True)
    (site / "nixl_cu12" / "__init__.py").write_text("")
    plugins = site / "nixl_cu12.libs" / "nixl"
    plugins.mkdir(parents=True)
    for name in ("libplugin_UCX.so", "libplugin_POSIX.so", "libtelemetry_exporter_prometheus.so"):
        (plugins / name).write_bytes(b"")
    return site


def test_folder_links_our_plugin_and_nixls(tmp_path):
    ours = tmp_path / "libplugin_OrbitTE.so"
    ours.write_bytes(b"")
    site = fake_nixl(tmp_path)
    folder = tmp_path / "plugins"
    (folder).mkdir()
    # A link left by an earlier run whose plugin is gone.
    (folder / "libplugin_GONE.so").symlink_to(tmp_path / "gone.so")
    path = [str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    env = {"ORBITTE_NIXL_PLUGIN": str(ours), "PYTHONPATH": os.pathsep.join(path)}
    out = run(["--dir", str(folder)], env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(folder)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["libplugin_OrbitTE.so", "libplugin_POSIX.so", "libplugin_UCX.so"], names
    assert (folder / "libplugin_OrbitTE.so").resolve() == ours.resolve()
    assert (folder / "libplugin_UCX.so").resolve() == (site / "nixl_cu12.libs/nixl/libplugin_UCX.so").resolve()
    libs = str(site / "nixl_cu12.libs")
    assert f"export LD_LIBRARY_PATH={libs}" in out.stderr, out.stderr
    env_out = run(["--dir", str(folder), "--env"], env)
    assert env_out.stdout.splitlines() == [
        f"export NIXL_PLUGIN_DIR={folder}",
        f'export LD_LIBRARY_PATH={libs}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
    ], env_out.stdout


def test_default_folder_is_in_the_user_cache(tmp_path):
    ours = tmp_path / "libplugin_OrbitTE.so"
    ours.write_bytes(b"")
    out = run([], {"ORBITTE_NIXL_PLUGIN": str(ours), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.strip())
    assert folder == tmp_path / "cache" / "orbitte" / "nixl-plugins"
    assert (folder / "libplugin_OrbitTE.so").resolve() == ours.resolve()


def test_missing_plugin_is_named(tmp_path):
    out = run(["--dir", str(tmp_path)], {"ORBITTE_NIXL_PLUGIN": str(tmp_path / "nothing.so")})
    assert out.returncode == 1
    assert "ORBITTE_NIXL_PLUGIN=" in out.stderr and "cargo build --release -p orbitte-nixl" in out.stderr, out.stderr
    assert out.stdout == ""


def test_python_api_matches_the_command(tmp_path, monkeypatch):
    plugin = packaged_plugin()
    monkeypatch.delenv("ORBITTE_NIXL_PLUGIN", raising=False)
    folder = orbitte.nixl.plugin_dir(tmp_path / "d")
    assert (folder / "libplugin_OrbitTE.so").resolve() == plugin.resolve()
    out = run(["--dir", str(tmp_path / "e")])
    assert out.returncode == 0, out.stderr
    assert (Path(out.stdout.strip()) / "libplugin_OrbitTE.so").resolve() == plugin.resolve()


def nixl_python() -> Path:
    """A Python with nixl-cu12: ORBITTE_NIXL_PYTHON, or the venv the CI
    creates for the plugin's tests."""
    p = os.environ.get("ORBITTE_NIXL_PYTHON")
    path = Path(p) if p else ROOT / "target/nixl-venv-1.5.1/bin/python"
    if not path.exists():
        if in_ci():
            pytest.fail(f"{path} is missing: .ci/run creates target/nixl-venv-1.5.1 before this stage")
        pytest.skip("no Python with nixl-cu12: set ORBITTE_NIXL_PYTHON")
    return path


def test_nixls_agent_lists_the_wheels_plugin(tmp_path):
    packaged_plugin()
    py = nixl_python()
    out = run(["--dir", str(tmp_path / "plugins")])
    assert out.returncode == 0, out.stderr
    env = dict(os.environ, NIXL_PLUGIN_DIR=out.stdout.strip())
    code = (
        "import json\n"
        "from nixl_cu12._api import nixl_agent, nixl_agent_config\n"
        "a = nixl_agent('wheelcheck', nixl_agent_config(backends=[]))\n"
        "print(json.dumps([a.get_plugin_list(), a.get_plugin_params('OrbitTE')]))\n"
    )
    got = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    # NIXL logs to stdout too: the answer is the last line.
    plugins, params = json.loads(got.stdout.splitlines()[-1])
    assert "OrbitTE" in plugins, got.stdout
    assert "listen" in params, got.stdout
