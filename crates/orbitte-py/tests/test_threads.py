"""The GIL is released on blocking calls: many threads transfer at once,
and a thread blocked on a stalled peer does not stop another's transfer."""

import os
import signal
import threading

import numpy as np

from orbitte.mooncake import TransferEngine


def test_eight_threads_batch_write_at_once(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    threads, blocks, block = 8, 32, 4096
    src[:] = np.frombuffer(os.urandom(src.nbytes), dtype=np.uint8)
    start = threading.Barrier(threads)
    rcs = [None] * threads

    def run(t: int) -> None:
        base = t * blocks * block
        start.wait()
        for _ in range(5):
            rcs[t] = initiator.batch_transfer_sync_write(
                session,
                [src.ctypes.data + base + i * block for i in range(blocks)],
                [dst.ctypes.data + base + i * block for i in range(blocks)],
                [block] * blocks,
            )
            if rcs[t] != 0:
                return

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert rcs == [0] * threads, initiator.last_error()
    n = threads * blocks * block
    assert (dst[:n] == src[:n]).all()


def test_stalled_peer_does_not_block_other_threads(mooncake_pair, spawn_target, monkeypatch):
    target, initiator, session, src, dst = mooncake_pair
    stalled = spawn_target("mooncake", size=8 << 20)
    assert initiator.transfer_sync_write(stalled.session, src.ctypes.data, stalled.address, 4096) == 0
    os.kill(stalled.pid, signal.SIGSTOP)
    entered, result = threading.Event(), []

    def blocked() -> None:
        entered.set()
        # 64 MiB into a stopped process: its socket buffers fill and the
        # transfer cannot finish while the process is stopped.
        result.append(initiator.batch_transfer_sync_write(
            stalled.session, [src.ctypes.data] * 8, [stalled.address] * 8, [1 << 20] * 8))

    t = threading.Thread(target=blocked)
    try:
        t.start()
        entered.wait()
        # Another thread's transfer to a live peer completes meanwhile.
        for _ in range(10):
            assert initiator.transfer_sync_write(session, src.ctypes.data, dst.ctypes.data, 65536) == 0
        assert (dst[:65536] == src[:65536]).all()
        assert t.is_alive() and not result, "the stalled transfer should still be blocked"
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    t.join(60)
    assert not t.is_alive()
    assert isinstance(result[0], int)
