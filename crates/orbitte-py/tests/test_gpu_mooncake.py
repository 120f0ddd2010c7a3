"""GPU device pointers given to the Mooncake-compatible API (and to
``orbitte.Engine.register_device``, NIXL's "VRAM" entry), without a GPU.

The fake libcuda of orbitte-cuda (``testing/stub_libcuda.c``) is built here
with ``cc`` and put first on the LD_LIBRARY_PATH of a child process
(``gpu_stub_guest.py``), since the loader reads that variable only at
process start. Its device memory is an address range the process cannot
touch and its copies complete late (only once waited for, or after
``ORBITTE_STUB_COPY_DELAY_US``), so a transfer that skipped a wait or used
the host path for device memory reads wrong bytes. The child checks its
bytes with the stub's own ``cuMemcpyDtoHAsync``.

Without ``cc`` the stub tests skip, except under CI=true. The refusal of an
address that is neither host nor device memory runs in this process, with
whatever driver this host has (none on CI). On a host with an NVIDIA driver
and a device, the round trip and the engine API scenarios also run against
the real driver (``ORBITTE_REQUIRE_GPU=1`` turns their skip into a failure).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from conftest import in_ci

HERE = Path(__file__).parent
STUB_SOURCE = HERE.parents[1] / "orbitte-cuda" / "testing" / "stub_libcuda.c"


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory) -> Path:
    """A directory holding the stub as libcuda.so.1, and libcuda.so linked
    to the same file (cudarc tries that name first; one file, so the engine
    and ctypes load one library)."""
    cc = shutil.which("cc")
    if cc is None:
        if in_ci():
            pytest.fail("CI has a C compiler, but cc is not on PATH")
        pytest.skip("no C compiler for the stub driver")
    d = tmp_path_factory.mktemp("stub-libcuda")
    out = d / "libcuda.so.1"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(STUB_SOURCE), "-lpthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"cc failed to build the stub driver:\n{r.stderr}"
    (d / "libcuda.so").symlink_to(out.name)
    return d


def run_guest(stub_dir: Optional[Path], scenario: str, **env: str) -> str:
    """Runs `scenario` of gpu_stub_guest.py on the stub in `stub_dir`, or
    with None on this host's own driver."""
    child_env = dict(os.environ)
    if stub_dir is not None:
        child_env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(stub_dir)] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])
        child_env["ORBITTE_STUB_LIBCUDA"] = str(stub_dir / "libcuda.so.1")
    else:
        child_env["ORBITTE_STUB_LIBCUDA"] = "libcuda.so.1"
    child_env["ORBITTE_STUB_MODE"] = "fake-gpu"
    child_env.pop("ORBITTE_STUB_FAIL_SYNC_AFTER", None)
    child_env.pop("ORBITTE_STUB_COPY_DELAY_US", None)
    child_env.update(env)
    r = subprocess.run([sys.executable, str(HERE / "gpu_stub_guest.py"), scenario], env=child_env,
                       capture_output=True, text=True, timeout=120)
    text = f"{r.stdout}\n--- stderr ---\n{r.stderr}"
    assert r.returncode == 0, f"scenario {scenario} failed ({r.returncode}):\n{text}"
    assert f"ok {scenario}" in r.stdout, text
    return text


def test_device_pointer_round_trip_through_mooncake(stub_dir):
    """register_memory(device pointer) goes on the cuda-staging path; WRITE
    and READ, single, batched and asynchronous, move the device's bytes;
    the report says staged; misuse is refused with the reason."""
    run_guest(stub_dir, "round_trip", ORBITTE_STUB_COPY_DELAY_US="200")


def test_device_pointer_round_trip_with_copies_held_until_waited(stub_dir):
    """The same with every copy done only once something waits for it."""
    run_guest(stub_dir, "round_trip")


def test_failing_staging_copy_fails_the_transfer_with_the_reason(stub_dir):
    """A staging copy whose wait fails: a negative return code, last_error()
    says staged and names the device copy, no hang, no crash."""
    run_guest(stub_dir, "staging_copy_fails")


def test_register_device_is_the_staged_entry_of_the_engine_api(stub_dir):
    """orbitte.Engine.register_device: a staged Registration, transfers
    through the engine API, and doctor still reports the direct GPU paths
    not implemented."""
    run_guest(stub_dir, "engine_api")


def libcuda_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_a_driver_without_a_device_is_named_in_the_refusal(stub_dir):
    """libcuda loads but has no device: the refusal says so."""
    run_guest(stub_dir, "driver_without_device", ORBITTE_STUB_MODE="no-device")


def gpu_or_skip() -> None:
    """Returns when this host's driver loads and reports a device; else
    skips (fails with ORBITTE_REQUIRE_GPU=1)."""
    why = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            why = "no CUDA device"
    except OSError:
        why = "no CUDA driver (libcuda.so.1 not found)"
    if why is None:
        return
    if os.environ.get("ORBITTE_REQUIRE_GPU") == "1":
        pytest.fail(f"ORBITTE_REQUIRE_GPU=1 but {why}")
    pytest.skip(why)


@pytest.mark.parametrize("scenario", ["round_trip", "engine_api"])
def test_real_gpu_device_pointers_or_skip(scenario):
    """The same scenarios on device 0 of this host's own driver."""
    gpu_or_skip()
    run_guest(None, scenario)


def test_an_address_neither_host_nor_device_is_refused_with_the_reason():
    from orbitte.mooncake import TransferEngine

    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error()
    try:
        # Below vm.mmap_min_addr: never mapped in any process.
        assert e.register_memory(0x2000, 4096) == -1
        msg = e.last_error().message
        assert "0x2000" in msg, msg
        assert "neither mapped host memory nor a CUDA device pointer" in msg, msg
        assert "is not mapped" in msg, msg
        if libcuda_loads():
            assert "is loaded and says it is memory unknown to CUDA" in msg, msg
        else:
            assert "no CUDA driver (libcuda.so.1 not found)" in msg, msg
    finally:
        e.close()


def test_register_device_without_a_device_pointer_names_the_reason():
    import numpy as np
    import orbitte

    eng = orbitte.Engine("no-gpu")
    host = np.zeros(4096, dtype=np.uint8)
    try:
        with pytest.raises(orbitte.RegisterError) as info:
            eng.register_device(host.ctypes.data, host.nbytes)
        msg = str(info.value)
        assert f"{host.ctypes.data:#x}" in msg, msg
        assert "cannot be registered as CUDA device memory" in msg, msg
        if not libcuda_loads():
            assert "no CUDA driver (libcuda.so.1 not found)" in msg, msg
        assert eng.registrations() == []
    finally:
        eng.close()


def test_doctor_reports_direct_gpu_paths_not_implemented():
    import orbitte

    rows = {r["path"]: r for r in orbitte.doctor()}
    for p in ("gpudirect-rdma", "cuda-ipc", "nvlink"):
        assert rows[p]["completion"]["status"] == "not_implemented", rows[p]
