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


PLUGIN = "orbitte/nixl_plugin/libplugin_OrbitTE.so"
# What manylinux_2_28 lets a library need (auditwheel's policy): these
# libraries, and symbol versions no newer than AlmaLinux 8's.
MANYLINUX_2_28_LIBS = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2",
    "libgcc_s.so.1", "libstdc++.so.6",
}
MANYLINUX_2_28_VERSIONS = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 25), "CXXABI": (1, 3, 11), "GCC": (7, 0, 0)}


def symbol_versions(so: Path) -> dict:
    """The newest version each versioned library family the file needs."""
    out = subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True, check=True).stdout
    newest: dict = {}
    for fam, ver in re.findall(r"\((GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\)", out):
        v = tuple(map(int, ver.split(".")))
        newest[fam] = max(newest.get(fam, v), v)
    return newest


def test_wheel_carries_a_manylinux_nixl_plugin(tmp_path):
    """Built with NIXL's headers (NIXL_INCLUDE_DIR, always under CI), the
    wheel holds the NIXL plugin, and it stays within manylinux_2_28."""
    with zipfile.ZipFile(wheel_path()) as z:
        names = z.namelist()
        if PLUGIN not in names:
            if in_ci() or os.environ.get("NIXL_INCLUDE_DIR"):
                pytest.fail(f"{PLUGIN} is not in the wheel: under CI, and with NIXL_INCLUDE_DIR set, it must be")
            pytest.skip("the wheel was built without NIXL_INCLUDE_DIR: it has no NIXL plugin")
        z.extractall(tmp_path)
    for name in [n for n in names if n.endswith(".so")]:
        so = tmp_path / name
        out = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
        assert needed <= MANYLINUX_2_28_LIBS, f"{name} needs {needed - MANYLINUX_2_28_LIBS}"
        for fam, newest in symbol_versions(so).items():
            assert newest <= MANYLINUX_2_28_VERSIONS[fam], f"{name} needs {fam}_{'.'.join(map(str, newest))}"
