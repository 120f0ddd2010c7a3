"""orbitte.nixl with "VRAM" descriptors, run by test_nixl_gpu.py in a child
process whose LD_LIBRARY_PATH starts with orbitte-cuda's fake libcuda (as
gpu_stub_guest.py is; its Stub class allocates and reads the "device"
memory). With ORBITTE_STUB_LIBCUDA=libcuda.so.1 and no stub on the path it
runs on the host's real driver and device 0.

    python nixl_gpu_guest.py

Exits 0 and prints "ok nixl_vram" when every check held.
"""

from __future__ import annotations

import os
import time

import numpy as np

from gpu_stub_guest import Stub, pattern
from orbitte import nixl

BLOCK, BLOCKS = 64 << 10, 8


def agent(name: str) -> nixl.nixl_agent:
    return nixl.nixl_agent(f"{name}-{os.getpid()}", nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))


def main() -> None:
    stub = Stub(os.environ["ORBITTE_STUB_LIBCUDA"])
    target, initiator = agent("host-side"), agent("gpu-side")
    assert initiator.get_backend_mem_types("UCX") == ["DRAM_SEG", "VRAM_SEG"]
    host = np.zeros(BLOCK * BLOCKS, dtype=np.uint8)
    target.register_memory([(host.ctypes.data, host.nbytes, 0, "")], "DRAM")
    dev = stub.alloc(BLOCK * BLOCKS)
    src = pattern(BLOCK * BLOCKS, 3)
    stub.upload(dev, src)
    vram = initiator.register_memory([(dev, BLOCK * BLOCKS, 0, "kv")], "VRAM")
    assert vram.getType() == "VRAM_SEG"
    initiator.add_remote_agent(target.get_agent_metadata())
    target.add_remote_agent(initiator.get_agent_metadata())
    local = initiator.prep_xfer_dlist("NIXL_INIT_AGENT", [(dev + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)], "cuda")
    remote = initiator.prep_xfer_dlist(target.name, [(host.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)],
                                       "DRAM")
    order = np.arange(BLOCKS)[::-1].copy()

    def done(h, by: nixl.nixl_agent = initiator) -> None:
        deadline = time.time() + 30
        state = by.check_xfer_state(h)
        while state == "PROC" and time.time() < deadline:
            state = by.check_xfer_state(h)
        assert state == "DONE", (state, h.error)

    # WRITE device blocks into host memory by index.
    h = initiator.make_prepped_xfer("WRITE", local, np.arange(BLOCKS), remote, order)
    initiator.transfer(h)
    done(h)
    initiator.release_xfer_handle(h)
    got = host.reshape(BLOCKS, BLOCK)
    assert (got[order] == src.reshape(BLOCKS, BLOCK)).all()

    # READ them back into the device, shifted by one block.
    host[:] = pattern(host.nbytes, 9)
    h = initiator.make_prepped_xfer("READ", local, [1, 2, 3], remote, [0, 1, 2])
    initiator.transfer(h)
    done(h)
    back = stub.download(dev, BLOCK * BLOCKS)
    assert (back[BLOCK:4 * BLOCK] == host[:3 * BLOCK]).all() and (back[:BLOCK] == src[:BLOCK]).all()

    # A staged transfer's notification follows it, once every byte moved:
    # a WRITE's bytes are in the target's memory when it arrives, and a
    # READ's (vLLM's pattern: the decode side READs, the prefill side frees
    # its blocks on the notification) are on the device. The WRITE's
    # notification comes while nobody polls its state.
    host[:] = 0
    h = initiator.make_prepped_xfer("WRITE", local, [0, 1], remote, [2, 3], b"kv-ready")
    initiator.transfer(h)
    deadline = time.time() + 30
    while not target.check_remote_xfer_done(initiator.name, b"kv-ready"):
        assert time.time() < deadline, ("no notification", h.error)
        time.sleep(0.001)
    assert (host[2 * BLOCK:4 * BLOCK] == stub.download(dev, 2 * BLOCK)).all(), "bytes before the notification"
    done(h)
    initiator.release_xfer_handle(h)
    host[:] = pattern(host.nbytes, 11)
    h = initiator.make_prepped_xfer("READ", local, [4], remote, [5])
    initiator.transfer(h, b"read-done")
    done(h)
    assert (stub.download(dev + 4 * BLOCK, BLOCK) == host[5 * BLOCK:6 * BLOCK]).all()
    deadline = time.time() + 10
    while not target.check_remote_xfer_done(initiator.name, b"read-done"):
        assert time.time() < deadline, "no notification after the READ"
        time.sleep(0.001)
    # A remote agent names this agent's device memory (VRAM is published):
    # it READs and WRITEs it over tcp, served through host bounce buffers.
    theirs = target.prep_xfer_dlist(initiator.name, [(dev + 6 * BLOCK, BLOCK, 0)], "VRAM")
    mine = target.prep_xfer_dlist("NIXL_INIT_AGENT", [(host.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(2)],
                                  "DRAM")
    host[:] = pattern(host.nbytes, 13)
    h = target.make_prepped_xfer("WRITE", mine, [0], theirs, [0])
    target.transfer(h)
    done(h, target)
    target.release_xfer_handle(h)
    assert (stub.download(dev + 6 * BLOCK, BLOCK) == host[:BLOCK]).all(), "remote WRITE into VRAM"
    host[BLOCK:2 * BLOCK] = 0
    h = target.make_prepped_xfer("READ", mine, [1], theirs, [0])
    target.transfer(h)
    done(h, target)
    target.release_xfer_handle(h)
    assert (host[BLOCK:2 * BLOCK] == host[:BLOCK]).all(), "remote READ of VRAM"
    initiator.deregister_memory(vram)
    # A failing staging copy sends no notification (the fake driver's
    # control: a real one has none).
    if os.environ["ORBITTE_STUB_LIBCUDA"] != "libcuda.so.1":
        # (Its buffers stay retained, as the contract says of a copy that
        # failed: this registration is never deregistered.)
        dev2 = stub.alloc(BLOCK)
        initiator.register_memory([(dev2, BLOCK, 0, "")], "VRAM")
        local2 = initiator.prep_xfer_dlist("NIXL_INIT_AGENT", [(dev2, BLOCK, 0)], "cuda")
        stub.fail_syncs(True)
        h = initiator.make_prepped_xfer("WRITE", local2, [0], remote, [0], b"never")
        initiator.transfer(h)
        deadline = time.time() + 30
        state = initiator.check_xfer_state(h)
        while state == "PROC" and time.time() < deadline:
            state = initiator.check_xfer_state(h)
        stub.fail_syncs(False)
        assert state == "ERR", (state, h.error)
        time.sleep(0.2)
        assert not target.check_remote_xfer_done(initiator.name, b"never"), "a failed transfer notified"
        initiator.release_xfer_handle(h)
    initiator.close()
    target.close()
    print("ok nixl_vram", flush=True)


if __name__ == "__main__":
    main()
