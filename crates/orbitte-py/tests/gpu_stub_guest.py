"""One scenario of test_gpu_mooncake.py, run in a child process whose
LD_LIBRARY_PATH starts with the fake libcuda (orbitte-cuda's
testing/stub_libcuda.c, built by the test): the engine loads it as the CUDA
driver, and this script reaches the same library through ctypes
(ORBITTE_STUB_LIBCUDA names it) to allocate "device memory" (an address
range the process cannot touch; its bytes are reached only by the stub's
copies), fill it and read it back. With ORBITTE_STUB_LIBCUDA=libcuda.so.1
and no stub on the path, the round trip and engine API scenarios run on the
host's real driver and device 0 the same way.

    python gpu_stub_guest.py SCENARIO

Exits 0 and prints "ok SCENARIO" when every check held; an assertion error
(with its traceback) otherwise.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import numpy as np

import orbitte
from orbitte.mooncake import TransferEngine

STAGED = "staged through host memory"
LEN = 1 << 20


class Stub:
    """The fake driver, through ctypes, with a context current on this
    thread (as the stub's pointer queries and a CUDA program need)."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
        lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_void_p]
        lib.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_size_t,
                                             ctypes.c_void_p]
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        assert lib.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert lib.cuCtxSetCurrent(ctx) == 0
        self.stream = ctypes.c_void_p()
        assert lib.cuStreamCreate(ctypes.byref(self.stream), 0) == 0

    def alloc(self, n: int) -> int:
        d = ctypes.c_ulonglong()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(d), n) == 0
        return d.value

    def upload(self, dptr: int, data: np.ndarray) -> None:
        assert self.lib.cuMemcpyHtoDAsync_v2(dptr, data.ctypes.data, data.nbytes, self.stream) == 0
        assert self.lib.cuStreamSynchronize(self.stream) == 0

    def download(self, dptr: int, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.uint8)
        assert self.lib.cuMemcpyDtoHAsync_v2(out.ctypes.data, dptr, n, self.stream) == 0
        assert self.lib.cuStreamSynchronize(self.stream) == 0
        return out

    def fail_syncs(self, on: bool) -> None:
        """The stub's test control (no real driver has it)."""
        control = self.lib.orbitte_stub_fail_syncs
        control.argtypes = [ctypes.c_int]
        control(1 if on else 0)


def pattern(n: int, seed: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.uint64) * 31 + seed) % 251).astype(np.uint8)


def pair():
    target, initiator = TransferEngine(), TransferEngine()
    for e in (target, initiator):
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error()
    return target, initiator, f"127.0.0.1:{target.get_rpc_port()}"


def not_mapped_here(addr: int) -> None:
    """The stub's device memory is not host memory: no read-write mapping
    of this process holds it."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                assert not line.split()[1].startswith("rw"), line


def round_trip(stub: Stub) -> None:
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("orbitte.mooncake").addHandler(handler)
    logging.getLogger("orbitte.mooncake").setLevel(logging.INFO)

    target, initiator, session = pair()
    remote = np.zeros(2 * LEN, dtype=np.uint8)
    assert target.register_memory(remote.ctypes.data, remote.nbytes) == 0, target.last_error()
    dev = stub.alloc(LEN)
    not_mapped_here(dev)
    src = pattern(LEN, 3)
    stub.upload(dev, src)

    assert initiator.register_memory(dev, LEN) == 0, initiator.last_error()
    assert initiator.last_error() is None
    report = initiator.describe_memory(dev)
    assert STAGED in report and "device 0" in report, report
    assert "gpudirect" not in report.lower(), report
    assert any(STAGED in r.getMessage() for r in records), [r.getMessage() for r in records]
    assert initiator.describe_memory(remote.ctypes.data) == ""

    # GPU -> remote host: the bytes the device held arrive.
    assert initiator.transfer_sync_write(session, dev, remote.ctypes.data, LEN) == 0, \
        initiator.last_error()
    assert np.array_equal(remote[:LEN], src)

    # Remote host -> GPU at an offset, checked with the driver's own copy.
    remote[LEN:] = pattern(LEN, 9)
    off, n = 4096, LEN - 8192
    assert initiator.transfer_sync_read(session, dev + off, remote.ctypes.data + LEN + off, n) == 0, \
        initiator.last_error()
    back = stub.download(dev, LEN)
    assert np.array_equal(back[off:off + n], remote[LEN + off:LEN + off + n])
    assert np.array_equal(back[:off], src[:off]), "bytes outside the READ are untouched"

    # A batch of several pieces of the device range, as a KV-cache push.
    remote[:LEN] = 0
    blocks = [0, 3 * 65536, 7 * 65536]
    rc = initiator.batch_transfer_sync_write(session, [dev + b for b in blocks],
                                             [remote.ctypes.data + b for b in blocks],
                                             [65536] * len(blocks))
    assert rc == 0, initiator.last_error()
    for b in blocks:
        assert np.array_equal(remote[b:b + 65536], back[b:b + 65536])
    assert not remote[65536:3 * 65536].any()

    # Asynchronous batches run the same way.
    batch = initiator.batch_transfer_async_read(session, [dev], [remote.ctypes.data + LEN], [LEN])
    assert batch != 0, initiator.last_error()
    assert initiator.get_batch_transfer_status([batch]) == 0, initiator.last_error()
    assert np.array_equal(stub.download(dev, LEN), remote[LEN:])

    # Host copies do not reach device memory: refused, with the reason.
    assert initiator.write_bytes_to_buffer(dev, b"x" * 8, 8) == -1
    msg = initiator.last_error().message
    assert "CUDA device memory" in msg and STAGED in msg, msg

    # A range past its device allocation, and an overlap, are refused.
    other = stub.alloc(65536)
    assert initiator.register_memory(other, 2 * 65536) == -1
    msg = initiator.last_error().message
    assert f"{other:#x}" in msg and "runs past its CUDA allocation" in msg, msg
    assert initiator.register_memory(dev + 4096, 4096) == -7, initiator.last_error()

    # Device memory registered by Mooncake is published: a peer WRITEs it
    # (served through host memory by the target), and the bytes are on the
    # device once the WRITE returns.
    tdev = stub.alloc(65536)
    assert target.register_memory(tdev, 65536) == 0, target.last_error()
    assert "published" in target.describe_memory(tdev), target.describe_memory(tdev)
    host_src = np.ones(4096, dtype=np.uint8)
    assert initiator.register_memory(host_src.ctypes.data, host_src.nbytes) == 0
    assert initiator.describe_memory(host_src.ctypes.data) == "host memory"
    assert initiator.transfer_sync_write(session, host_src.ctypes.data, tdev + 512, 4096) == 0, \
        initiator.last_error()
    assert np.array_equal(stub.download(tdev + 512, 4096), host_src)

    # An address that is neither: the driver was asked and said so.
    assert initiator.register_memory(0x2000, 4096) == -1
    msg = initiator.last_error().message
    assert "0x2000" in msg and "neither mapped host memory nor a CUDA device pointer" in msg, msg
    assert "libcuda" in msg and "is loaded and says it is memory unknown to CUDA" in msg, msg

    assert initiator.unregister_memory(dev) == 0, initiator.last_error()
    assert initiator.describe_memory(dev) == ""
    initiator.close()
    target.close()


def staging_copy_fails(stub: Stub) -> None:
    target, initiator, session = pair()
    remote = np.full(LEN, 0x11, dtype=np.uint8)
    assert target.register_memory(remote.ctypes.data, remote.nbytes) == 0
    dev = stub.alloc(LEN)
    stub.upload(dev, pattern(LEN, 5))
    assert initiator.register_memory(dev, LEN) == 0, initiator.last_error()

    stub.fail_syncs(True)
    rc = initiator.transfer_sync_write(session, dev, remote.ctypes.data, LEN)
    stub.fail_syncs(False)
    assert rc < 0, rc
    err = initiator.last_error()
    assert err.code == rc and err.call == "transfer_sync_write", err
    assert STAGED in err.message and "device copy failed" in err.message, err.message
    assert "gpudirect" not in err.message.lower(), err.message
    (o,) = err.outcomes
    assert o.status == "failed" and o.failure_path == "cuda-staging", o
    assert o.completed_prefix == 0, o
    assert o.remote_effect in ("none", "possible"), o
    assert (remote == 0x11).all(), "nothing of the failed copy reached the peer"

    # The lane whose copy failed is fenced for good (its copies never
    # drained); the device's other lane still serves.
    rc = initiator.transfer_sync_write(session, dev, remote.ctypes.data, 4096)
    assert rc == 0, initiator.last_error()
    assert np.array_equal(remote[:4096], pattern(4096, 5))
    initiator.close()
    target.close()

    # The same through the engine API: TransferError says it is staged.
    target = orbitte.Engine("fault-target", listen="127.0.0.1:0")
    eng = orbitte.Engine("fault-initiator")
    remote[:] = 0x22
    target.register(remote)
    reg = eng.register_device(dev, LEN)
    peer = eng.connect(target.address)
    stub.fail_syncs(True)
    try:
        eng.transfer(peer, [orbitte.write(reg, peer.range(0))])
        raise AssertionError("a failed staging copy reported success")
    except orbitte.TransferError as err:
        text = str(err)
        assert STAGED in text and "request #0" in text and "device copy failed" in text, text
        assert "gpudirect" not in text.lower(), text
        assert err.outcomes[0].failure_path == "cuda-staging", err.outcomes
    finally:
        stub.fail_syncs(False)
    assert (remote == 0x22).all()
    eng.close()
    target.close()


def engine_api(stub: Stub) -> None:
    """orbitte.Engine.register_device: the entry NIXL's "VRAM" uses."""
    target = orbitte.Engine("gpu-target", listen="127.0.0.1:0")
    initiator = orbitte.Engine("gpu-initiator")
    remote = np.zeros(LEN, dtype=np.uint8)
    target.register(remote)
    dev = stub.alloc(LEN)
    src = pattern(LEN, 7)
    stub.upload(dev, src)
    reg = initiator.register_device(dev, LEN, keepalive="the tensor")
    assert reg.staged and reg.path == "cuda_staging" and reg.device == 0, reg
    assert not reg.remote and reg.address == dev and reg.length == LEN
    assert reg.keepalive == "the tensor"
    assert STAGED in reg.report and "gpudirect" not in reg.report.lower(), reg.report
    peer = initiator.connect(target.address)
    initiator.transfer(peer, [orbitte.write(reg, peer.range(0))])
    assert np.array_equal(remote, src)
    remote[:] = pattern(LEN, 1)
    initiator.transfer(peer, [orbitte.read(reg, peer.range(0))])
    assert np.array_equal(stub.download(dev, LEN), remote)

    # A notifying batch cannot carry staged requests: refused, and says why.
    try:
        initiator.transfer(peer, [orbitte.write(reg, peer.range(0))], notify=b"done")
        raise AssertionError("a notifying batch carried a staged request")
    except orbitte.SubmitError as e:
        assert "cuda-staging" in str(e) and STAGED in str(e), e

    host = np.zeros(4096, dtype=np.uint8)
    try:
        initiator.register_device(host.ctypes.data, host.nbytes)
        raise AssertionError("host memory registered as device memory")
    except orbitte.RegisterError as e:
        assert "is not CUDA device memory" in str(e), e
    initiator.unregister(reg)

    # remote=True publishes it: the target's peers READ and WRITE it.
    served = target.register_device(dev, LEN, remote=True)
    assert served.staged and served.remote, served
    assert STAGED in served.report and "published" in served.report, served.report
    peer = initiator.connect(target.address)
    (gpu_range,) = [r for r in peer.ranges if r.address == dev]
    host_side = initiator.register(np.zeros(LEN, dtype=np.uint8))
    initiator.transfer(peer, [orbitte.read(host_side, gpu_range)])
    target.unregister(served)
    for p in ("gpudirect-rdma", "cuda-ipc", "nvlink"):
        (row,) = [r for r in orbitte.doctor() if r["path"] == p]
        assert row["completion"]["status"] == "not_implemented", row
    initiator.close()
    target.close()


def driver_without_device(_: None) -> None:
    """ORBITTE_STUB_MODE=no-device: libcuda loads, cuInit says no device."""
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error()
    assert e.register_memory(0x2000, 4096) == -1
    msg = e.last_error().message
    assert "neither mapped host memory nor a CUDA device pointer" in msg, msg
    assert "is loaded but reports no CUDA device" in msg and "CUDA_ERROR_NO_DEVICE" in msg, msg
    eng = orbitte.Engine("no-device")
    try:
        eng.register_device(0x2000, 4096)
        raise AssertionError("registered without a device")
    except orbitte.RegisterError as err:
        assert "no CUDA device" in str(err) and "nvidia-smi" in str(err), err
    eng.close()
    e.close()


SCENARIOS = {"round_trip": round_trip, "staging_copy_fails": staging_copy_fails,
             "engine_api": engine_api, "driver_without_device": driver_without_device}

if __name__ == "__main__":
    name = sys.argv[1]
    stub = None if name == "driver_without_device" else Stub(os.environ["ORBITTE_STUB_LIBCUDA"])
    SCENARIOS[name](stub)
    print(f"ok {name}", flush=True)
