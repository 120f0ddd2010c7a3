"""What registered memory must stay, and what happens when it does not:
a range unmapped or made read-only while registered fails its transfer
with an outcome that names it (never a signal), and read-only buffers are
refused at registration."""

import ctypes
import json
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import orbitte

HERE = Path(__file__).parent


def probe(*args: str) -> dict:
    """Runs unmapped_probe.py; a signal (SIGSEGV) fails the test with it."""
    r = subprocess.run([sys.executable, str(HERE / "unmapped_probe.py"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        f"probe {' '.join(args)} exited with {r.returncode}"
        f"{' (killed by signal %d)' % -r.returncode if r.returncode < 0 else ''}\n"
        f"stdout: {r.stdout}\nstderr: {r.stderr[-4000:]}"
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", ["tcp", "local"])
@pytest.mark.parametrize("op", ["read", "write"])
def test_a_transfer_on_unmapped_memory_fails_with_an_outcome(path, op):
    res = probe(path, op, "unmap")
    assert res["path"] == path
    assert res["hole"], f"something was mapped where the range was: the probe proves nothing {res}"
    assert not res["ok"] and res["status"] == "failed", res
    assert "no longer mapped" in res["failure"], res
    assert res["drain"] == "drained", res
    assert res["after_ok"], res


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_a_read_into_memory_made_read_only_fails_and_changes_nothing(path):
    res = probe(path, "read", "protect")
    assert res["path"] == path
    assert not res["ok"] and "no longer mapped read-write" in res["failure"], res
    assert res["kept"], res
    assert res["after_ok"], res


@pytest.mark.parametrize("op,how", [("read", "unmap"), ("write", "unmap"), ("write", "protect")])
def test_a_target_whose_published_memory_is_gone_fails_the_request_and_serves_on(op, how):
    res = probe("tcp", op, how, "target")
    assert res["path"] == "tcp"
    assert not res["ok"] and res["status"] == "failed", res
    assert res["hole"] and res["kept"], res
    assert res["after_ok"], res


def test_mooncake_buffer_copies_of_unmapped_memory_fail_with_the_range():
    res = probe("buffer")
    assert res["before"] == [0, b"live".hex()], res
    assert res["write_rc"] == -1 and res["read"] == "", res
    for err in (res["write_error"], res["read_error"]):
        assert f"caller memory {res['addr']}+4 is no longer mapped" in err, res


def test_read_only_buffers_are_refused():
    e = orbitte.Engine(path="tcp")
    try:
        frozen = np.zeros(4096, dtype=np.uint8)
        frozen.flags.writeable = False
        ro_map = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)
        for obj in [b"immutable bytes", memoryview(bytearray(64)).toreadonly(), frozen, ro_map]:
            with pytest.raises(orbitte.RegisterError, match="read-only"):
                e.register(obj)

        class DLPackOnly:
            """A tensor that offers DLPack and no buffer protocol."""

            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        with pytest.raises(orbitte.RegisterError, match="cannot be exported writable"):
            e.register(DLPackOnly(frozen))
        assert e.register(DLPackOnly(np.zeros(64, dtype=np.uint8))).length == 64
        # A raw range mapped without PROT_WRITE.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        try:
            with pytest.raises(orbitte.RegisterError, match="not mapped readable and writable"):
                e.register((addr, 4096))
        finally:
            libc.munmap(addr, 4096)
    finally:
        e.close()
