"""The wheel: one abi3 wheel named orbitte, manylinux_2_28 or older, whose
extension links none of libibverbs, libmlx5, libcuda, libcudart."""

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import in_ci

FORBIDDEN = ("libibverbs", "libmlx5", "libcuda", "libcudart", "libpython")


def wheel_path() -> Path:
    w = os.environ.get("ORBITTE_WHEEL")
    if not w:
        if in_ci():
            pytest.fail("ORBITTE_WHEEL is not set: .ci/run builds the wheel and sets it")
        pytest.skip("set ORBITTE_WHEEL to a wheel built with maturin build --zig --compatibility manylinux_2_28")
    return Path(w)


def test_wheel_name_and_tag():
    w = wheel_path()
    m = re.fullmatch(r"orbitte-[^-]+-cp310-abi3-(.+)\.whl", w.name)
    assert m, f"{w.name}: expected orbitte-VERSION-cp310-abi3-PLATFORM.whl"
    tags = m.group(1).split(".")
    glibc = [tuple(map(int, t.split("_")[1:3])) for t in tags if t.startswith("manylinux_")]
    assert glibc and max(glibc) <= (2, 28), f"{w.name}: not manylinux_2_28 or older"


def test_wheel_needs_no_rdma_cuda_or_python_library(tmp_path):
    w = wheel_path()
    with zipfile.ZipFile(w) as z:
        names = z.namelist()
        assert "orbitte/py.typed" in names
        # The benchmark is a script of the repository (examples/bench.py).
        assert not any(n.endswith("bench.py") for n in names), names
        assert any(n.startswith("orbitte/") and n.endswith(".pyi") for n in names)
        sos = [n for n in names if n.endswith(".so")]
        assert sos, names
        z.extractall(tmp_path)
    for so in sos:
        out = subprocess.run(["readelf", "-d", str(tmp_path / so)], capture_output=True, text=True, check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
        assert needed, out
        bad = [n for n in needed if n.startswith(FORBIDDEN)]
        assert not bad, f"{so} needs {bad}; every NEEDED: {needed}"


def test_wheel_carries_the_switch():
    """ORBITTE_REPLACE's start-up hook sits at the wheel's root (site-packages
    once installed), beside the package."""
    with zipfile.ZipFile(wheel_path()) as z:
        names = z.namelist()
        pth = z.read("orbitte-replace.pth").decode() if "orbitte-replace.pth" in names else ""
    assert "_orbitte_replace.py" in names, names
    assert pth.startswith("import ") and "ORBITTE_REPLACE" in pth, pth
