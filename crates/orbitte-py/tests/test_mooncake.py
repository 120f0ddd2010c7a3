"""The Mooncake-compatible class: the calls SGLang, vLLM and LMCache make,
their return codes and last_error()."""

import numpy as np
import pytest

from orbitte.mooncake import TransferEngine, TransferOpcode


def test_batch_write_and_read_back(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    n = 1024
    offs = [i * 4096 for i in range(16)]
    rc = initiator.batch_transfer_sync_write(
        session,
        [src.ctypes.data + o for o in offs],
        [dst.ctypes.data + o for o in offs],
        [n] * len(offs),
    )
    assert rc == 0, initiator.last_error()
    assert initiator.last_error() is None
    for o in offs:
        assert (dst[o:o + n] == src[o:o + n]).all()
    # Untouched bytes stay zero.
    assert not dst[n:4096].any()
    # READ back into another part of the initiator's buffer.
    src2 = np.zeros(1 << 16, dtype=np.uint8)
    assert initiator.register_memory(src2.ctypes.data, src2.nbytes) == 0
    rc = initiator.batch_transfer_sync_read(session, [src2.ctypes.data], [dst.ctypes.data], [n])
    assert rc == 0, initiator.last_error()
    assert (src2[:n] == src[:n]).all()
    assert initiator.unregister_memory(src2.ctypes.data) == 0


def test_numpy_arrays_as_batch_arguments(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    locals_ = np.array([src.ctypes.data, src.ctypes.data + 8192], dtype=np.uint64)
    remotes = np.array([dst.ctypes.data + 100, dst.ctypes.data + 50000], dtype=np.int64)
    lens = np.array([300, 5000], dtype=np.int32)
    assert initiator.batch_transfer_sync_write(session, locals_, remotes, lens) == 0, initiator.last_error()
    assert (dst[100:400] == src[:300]).all()
    assert (dst[50000:55000] == src[8192:13192]).all()


def test_single_calls_and_opcode(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    assert initiator.transfer_sync_write(session, src.ctypes.data, dst.ctypes.data, 4096) == 0
    assert (dst[:4096] == src[:4096]).all()
    dst[:4096] = 0
    assert initiator.transfer_sync(session, src.ctypes.data, dst.ctypes.data, 4096, TransferOpcode.WRITE) == 0
    assert (dst[:4096] == src[:4096]).all()
    src[:16] = 0
    assert initiator.transfer_sync_read(session, src.ctypes.data, dst.ctypes.data, 16) == 0
    assert (src[:16] == dst[:16]).all()


def test_async_batch_and_status(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    b = initiator.batch_transfer_async_write(session, [src.ctypes.data], [dst.ctypes.data], [65536])
    assert b > 0, initiator.last_error()
    assert initiator.get_batch_transfer_status([b]) == 0
    assert (dst[:65536] == src[:65536]).all()


def test_submit_and_check_status(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    b = initiator.transfer_submit_write(session, src.ctypes.data, dst.ctypes.data, 8192)
    assert b > 0, initiator.last_error()
    for _ in range(1000):
        status = initiator.transfer_check_status(b)
        if status != 0:
            break
        import time
        time.sleep(0.001)
    assert status == 1
    assert (dst[:8192] == src[:8192]).all()
    assert initiator.transfer_check_status(b) == -1  # taken
    assert initiator.transfer_check_status(12345) == -1


def test_get_first_buffer_address_and_managed_buffers(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    assert initiator.get_first_buffer_address(session) == dst.ctypes.data
    addr = initiator.allocate_managed_buffer(8192)
    assert addr != 0, initiator.last_error()
    assert initiator.write_bytes_to_buffer(addr, b"hello", 5) == 0
    assert initiator.read_bytes_from_buffer(addr, 5) == b"hello"
    assert initiator.transfer_sync_write(session, addr, dst.ctypes.data + 7, 5) == 0
    assert bytes(dst[7:12]) == b"hello"
    assert initiator.free_managed_buffer(addr, 8192) == 0


def test_last_error_has_the_full_outcome_of_a_failed_batch(mooncake_pair, spawn_target):
    target, initiator, session, src, dst = mooncake_pair
    peer = spawn_target("mooncake", size=1 << 16)
    assert initiator.transfer_sync_write(peer.session, src.ctypes.data, peer.address, 4096) == 0
    peer.proc.kill()
    peer.proc.wait()
    rc = initiator.batch_transfer_sync_write(peer.session, [src.ctypes.data] * 4, [peer.address] * 4, [4096] * 4)
    assert rc < 0
    err = initiator.last_error()
    assert err.code == rc and err.call == "batch_transfer_sync_write"
    assert err.message
    for o in err.outcomes:
        assert o.status in ("complete", "failed", "timed_out")
        assert o.remote_effect in ("none", "possible", "complete")
        assert o.drain == "drained"
        assert 0 <= o.completed_prefix <= o.length


@pytest.mark.parametrize(
    "call",
    [
        # Unregistered local pointer.
        lambda i, s, src, dst: i.transfer_sync_write(s, 12345, dst.ctypes.data, 16),
        # Local length past the registration.
        lambda i, s, src, dst: i.transfer_sync_write(s, src.ctypes.data + src.nbytes - 8, dst.ctypes.data, 16),
        # Remote address the target never registered.
        lambda i, s, src, dst: i.transfer_sync_write(s, src.ctypes.data, 4096, 16),
        # Remote length past the target's registration.
        lambda i, s, src, dst: i.transfer_sync_write(s, src.ctypes.data, dst.ctypes.data + dst.nbytes - 8, 16),
        # Zero length.
        lambda i, s, src, dst: i.transfer_sync_write(s, src.ctypes.data, dst.ctypes.data, 0),
        # Lists of different lengths.
        lambda i, s, src, dst: i.batch_transfer_sync_write(s, [src.ctypes.data], [dst.ctypes.data, 1], [16]),
        # Unknown session (nothing listens), and a malformed one.
        lambda i, s, src, dst: i.transfer_sync_write("127.0.0.1:1", src.ctypes.data, dst.ctypes.data, 16),
        lambda i, s, src, dst: i.transfer_sync_write("no-port", src.ctypes.data, dst.ctypes.data, 16),
        # Wrong types.
        lambda i, s, src, dst: i.transfer_sync_write(s, "not a pointer", dst.ctypes.data, 16),
        lambda i, s, src, dst: i.batch_transfer_sync_write(s, None, None, None),
        lambda i, s, src, dst: i.transfer_sync_write(s, -1, dst.ctypes.data, 16),
        lambda i, s, src, dst: i.transfer_sync_write(s, src.ctypes.data, dst.ctypes.data, 1 << 70),
    ],
)
def test_bad_input_gives_a_negative_code(mooncake_pair, call):
    target, initiator, session, src, dst = mooncake_pair
    rc = call(initiator, session, src, dst)
    assert isinstance(rc, int) and rc < 0
    assert initiator.last_error().message
    # The engine still works afterwards.
    assert initiator.transfer_sync_write(session, src.ctypes.data, dst.ctypes.data, 16) == 0


def test_registration_errors():
    te = TransferEngine()
    assert te.register_memory(4096, 4096) < 0  # before initialize
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.zeros(8192, dtype=np.uint8)
    assert te.register_memory(0, 16) == -1
    assert te.register_memory(buf.ctypes.data, 0) == -1
    assert te.register_memory(0x1000, 4096) == -1  # not mapped
    assert "not mapped" in te.last_error().message
    assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert te.register_memory(buf.ctypes.data + 4096, 16) == -7  # overlap
    assert te.unregister_memory(buf.ctypes.data + 1) == -3
    assert te.batch_register_memory([buf.ctypes.data], [1, 2]) < 0
    assert te.batch_unregister_memory([buf.ctypes.data]) == 0
    te.close()


def test_initialize_refusals():
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "etcd://127.0.0.1:1", "tcp", "") == -200  # nothing listens
    assert "127.0.0.1:1" in te.last_error().message
    assert te.initialize("127.0.0.1", "redis://127.0.0.1:6379", "tcp", "") == -200
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") < 0
    assert te.initialize("127.0.0.1:0", "P2PHANDSHAKE", "tcp", "") == 0
    assert te.get_rpc_port() > 0
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") < 0  # twice
    te.close()


def test_memory_registered_after_the_session_opened(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    assert initiator.transfer_sync_write(session, src.ctypes.data, dst.ctypes.data, 64) == 0
    late = np.zeros(1 << 16, dtype=np.uint8)
    assert target.register_memory(late.ctypes.data, late.nbytes) == 0
    assert initiator.transfer_sync_write(session, src.ctypes.data, late.ctypes.data + 100, 4096) == 0, \
        initiator.last_error()
    assert (late[100:4196] == src[:4096]).all()
    # Unregistered on the target: refused, not written.
    assert target.unregister_memory(late.ctypes.data) == 0
    late[:] = 0
    assert initiator.transfer_sync_write(session, src.ctypes.data, late.ctypes.data, 4096) < 0
    assert not late.any()
