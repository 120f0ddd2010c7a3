"""SGLang's own mooncake_transfer_engine.py, downloaded from the sglang
wheel on PyPI (cached under the repository's target/), runs unmodified in
its default settings (protocol "rdma") on a host without RDMA, and with
MC_FORCE_TCP=1: two processes switched by ORBITTE_REPLACE=mooncake, bytes
checked. Under CI=true the download must work; elsewhere a failed download
skips with the reason."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import in_ci

HERE = Path(__file__).parent
CACHE = HERE.parents[2] / "target" / "sglang-cache"
SGLANG = "0.5.23"
FILES = ("sglang/srt/environ.py", "sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py")
SIZE = 1 << 20


def fetch_sglang() -> Path:
    """SGLang's two files from its wheel: downloaded once, kept under
    target/sglang-cache/VERSION."""
    root = CACHE / SGLANG
    if all((root / f).is_file() for f in FILES):
        return root
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"sglang=={SGLANG}", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--platform", "manylinux_2_34_x86_64", "-d", str(wheels), "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = sorted(wheels.glob(f"sglang-{SGLANG}-*.whl"))
    if out.returncode != 0 or not found:
        reason = f"cannot download sglang {SGLANG} from PyPI: {(out.stderr or out.stdout).strip()[-400:]}"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    with zipfile.ZipFile(found[0]) as z:
        for f in FILES:
            dest = root / f
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(z.read(f))
    for w in found:
        w.unlink()  # the two files are all the test reads
    return root


@pytest.fixture(scope="module")
def sglang_dir():
    return fetch_sglang()


def pattern_sha(size: int) -> str:
    import hashlib

    return hashlib.sha256((bytes(range(251)) * (size // 251 + 1))[:size]).hexdigest()


def run_pair(sglang_dir: Path, env: dict) -> tuple:
    script = str(HERE / "sglang_mooncake_process.py")
    target = subprocess.Popen([sys.executable, script, str(sglang_dir), "target", str(SIZE)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = target.stdout.readline()
        if not line:
            target.wait(timeout=30)
            pytest.fail(f"the SGLang target did not start: {target.stderr.read()}")
        info = json.loads(line)
        out = subprocess.run([sys.executable, script, str(sglang_dir), "initiator", info["session"],
                              str(info["address"]), str(SIZE)], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        target.stdin.write("sha\n")
        target.stdin.flush()
        sha = target.stdout.readline().strip()
    finally:
        target.stdin.close()
        target.wait(timeout=30)
    return info, got, sha, out.stderr + target.stderr.read()


def no_rdma_device() -> bool:
    d = Path("/sys/class/infiniband")
    return not d.is_dir() or not any(d.iterdir())


def test_sglang_defaults_protocol_rdma_without_a_device(sglang_dir):
    if not no_rdma_device():
        pytest.skip("this host lists RDMA devices: protocol 'rdma' runs on them, nothing falls back")
    env = dict(os.environ, ORBITTE_REPLACE="mooncake")
    for k in ("MC_FORCE_TCP", "ORBITTE_STRICT_RDMA", "MOONCAKE_PROTOCOL"):
        env.pop(k, None)
    info, got, sha, stderr = run_pair(sglang_dir, env)
    assert info["module"] == got["module"] == "orbitte.mooncake"
    assert got["rcs"] == [0, 0, 0]
    assert sha == got["sha"] == pattern_sha(SIZE)
    # Each process says why protocol "rdma" runs over tcp.
    assert stderr.count("protocol 'rdma' carries on over tcp") == 2, stderr
    assert "no RDMA device" in stderr


def test_sglang_with_mc_force_tcp(sglang_dir):
    env = dict(os.environ, ORBITTE_REPLACE="mooncake", MC_FORCE_TCP="1", ORBITTE_STRICT_RDMA="1")
    env.pop("MOONCAKE_PROTOCOL", None)
    info, got, sha, stderr = run_pair(sglang_dir, env)
    assert info["device"] == ""  # SGLang passes no device under MC_FORCE_TCP
    assert got["rcs"] == [0, 0, 0]
    assert sha == got["sha"] == pattern_sha(SIZE)
    assert "carries on over tcp" not in stderr


def test_strict_rdma_refuses_as_before(sglang_dir):
    if not no_rdma_device():
        pytest.skip("this host lists RDMA devices: nothing to refuse")
    env = dict(os.environ, ORBITTE_REPLACE="mooncake", ORBITTE_STRICT_RDMA="1")
    env.pop("MC_FORCE_TCP", None)
    out = subprocess.run([sys.executable, str(HERE / "sglang_mooncake_process.py"), str(sglang_dir), "target",
                          str(SIZE)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    assert "Mooncake Transfer Engine initialization failed" in out.stderr
