"""GPU memory a peer READs and WRITEs, across two processes: the target
(gpu_target_process.py, on orbitte-cuda's fake libcuda) registers device
memory as NIXL "VRAM" and through Mooncake's register_memory; this process,
with host memory only, READs and WRITEs both over tcp, and the bytes are
checked on the device through the driver's own copies."""

import base64
import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import Child
from gpu_stub_guest import pattern
from orbitte import nixl
from orbitte.mooncake import TransferEngine
from test_gpu_mooncake import stub_dir  # noqa: F401 (the fixture)

HERE = Path(__file__).parent
SIZE = 2 * (1 << 20) + 4096
BLOCK = 64 << 10
STAGED = "staged through host memory"


class GpuTarget(Child):
    """The target process (gpu_target_process.py) on the stub driver."""

    def __init__(self, stub: Path):
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(stub)] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])
        env["ORBITTE_STUB_LIBCUDA"] = str(stub / "libcuda.so.1")
        env["ORBITTE_STUB_MODE"] = "fake-gpu"
        env["ORBITTE_STUB_COPY_DELAY_US"] = "200"
        env.pop("ORBITTE_STUB_FAIL_SYNC_AFTER", None)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        super().__init__([sys.executable, str(HERE / "gpu_target_process.py"), "--size", str(SIZE)], env)

    def close(self) -> None:
        """Ends the process; it must exit 0 (its own checks held)."""
        if self.proc.poll() is None:
            self.ask("quit")
        assert self.proc.wait(30) == 0


@pytest.fixture
def target(stub_dir):  # noqa: F811
    t = GpuTarget(stub_dir)
    yield t
    t.close()


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def test_a_remote_agent_reads_and_writes_vram_descriptors(target):
    agent = nixl.nixl_agent(f"host-side-{os.getpid()}", nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    host = np.zeros(SIZE, dtype=np.uint8)
    agent.register_memory([(host.ctypes.data, host.nbytes, 0, "")], "DRAM")
    name = agent.add_remote_agent(base64.b64decode(target.info["nixl_metadata"]))
    assert name.decode() == target.info["nixl_name"]
    blocks = SIZE // BLOCK
    vram = target.info["vram"]
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(host.ctypes.data + i * BLOCK, BLOCK, 0)
                                                      for i in range(blocks)], "DRAM")
    remote = agent.prep_xfer_dlist(target.info["nixl_name"], [(vram + i * BLOCK, BLOCK, 0) for i in range(blocks)],
                                   "VRAM")
    order = np.arange(blocks)[::-1].copy()

    def run(op: str) -> None:
        h = agent.make_prepped_xfer(op, local, np.arange(blocks), remote, order)
        assert agent.transfer(h) in ("DONE", "PROC")
        state = agent.check_xfer_state(h)
        for _ in range(300000):
            if state != "PROC":
                break
            state = agent.check_xfer_state(h)
        assert state == "DONE", (state, h.error)
        agent.release_xfer_handle(h)

    # READ the target's GPU blocks, in reverse order.
    run("READ")
    want = pattern(SIZE, 1)[:blocks * BLOCK].reshape(blocks, BLOCK)
    assert (host[:blocks * BLOCK].reshape(blocks, BLOCK) == want[order]).all()

    # WRITE host blocks into the target's GPU memory; the device bytes are
    # those written once the transfer is done.
    host[:] = pattern(SIZE, 7)
    run("WRITE")
    sent = host[:blocks * BLOCK].reshape(blocks, BLOCK)
    on_device = np.empty_like(sent)
    on_device[order] = sent
    assert target.ask(f"sha vram 0 {blocks * BLOCK}") == sha(on_device)
    agent.close()


def test_a_peer_reads_and_writes_a_mooncake_device_registration(target):
    report = target.info["report"]
    assert STAGED in report and "published" in report and "gpudirect" not in report.lower(), report
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, engine.last_error()
    host = np.zeros(SIZE, dtype=np.uint8)
    assert engine.register_memory(host.ctypes.data, host.nbytes) == 0, engine.last_error()
    session, device = target.info["mooncake"], target.info["device"]

    assert engine.transfer_sync_read(session, host.ctypes.data, device, SIZE) == 0, engine.last_error()
    assert np.array_equal(host, pattern(SIZE, 2))

    host[:] = pattern(SIZE, 9)
    off, n = 4096 + 3, SIZE - 8192
    assert engine.transfer_sync_write(session, host.ctypes.data + off, device + off, n) == 0, engine.last_error()
    assert target.ask(f"sha mooncake {off} {n}") == sha(host[off:off + n])
    assert target.ask("sha mooncake 0 4096") == sha(pattern(SIZE, 2)[:4096]), "bytes before the WRITE untouched"

    # A device copy that fails on the target fails the request; it is
    # never acknowledged as done.
    assert target.ask("fail_syncs 1") == "ok"
    rc = engine.transfer_sync_write(session, host.ctypes.data, device, 4096)
    rc_read = engine.transfer_sync_read(session, host.ctypes.data, device, 4096)
    assert target.ask("fail_syncs 0") == "ok"
    assert rc < 0 and rc_read < 0, (rc, rc_read)
    err = engine.last_error()
    (o,) = err.outcomes
    assert o.status == "failed" and "internal" in err.message, err
    assert np.array_equal(host[:4096], pattern(SIZE, 9)[:4096]), "a failed READ delivered no bytes"

    # The target serves again once its copies work.
    assert engine.transfer_sync_write(session, host.ctypes.data, device, 4096) == 0, engine.last_error()
    assert target.ask("sha mooncake 0 4096") == sha(host[:4096])
    engine.close()
