"""Notifications end to end: a batch's bytes arrive at the target once,
after every byte of the batch, and a failed batch sends none."""

import hashlib
import os

import numpy as np
import pytest

import orbitte
from orbitte.mooncake import TransferEngine, TransferNotify, TransferOpcode


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_prefill_decode_hand_off_between_processes(spawn_target, path):
    decode = spawn_target("engine", size=1 << 20)
    with orbitte.Engine(path=path) as prefill:
        kv = prefill.alloc(1 << 20)
        kv.view[:] = os.urandom(1 << 20)
        reg = prefill.register(kv, remote=False)
        peer = prefill.connect(decode.session)
        assert peer.path == path
        blocks = [orbitte.write(reg, peer.range(0), 64 << 10, local_offset=o, remote_offset=o)
                  for o in range(0, 1 << 20, 64 << 10)]
        outcomes = prefill.submit(peer, blocks, notify=b"request-42 placed").wait()
        assert all(o.notification == "sent" for o in outcomes)
        # The target waits for the notification, then checks the bytes.
        source, via, payload = decode.ask("wait_notify 10").split()
        assert source == prefill.source_id and via == path
        assert bytes.fromhex(payload) == b"request-42 placed"
        assert decode.ask(f"sha 0 {1 << 20}") == hashlib.sha256(kv.view).hexdigest()
        assert decode.ask("wait_notify 0.2") == "none"  # delivered once


def test_failed_batch_sends_no_notification():
    target = orbitte.Engine(listen="127.0.0.1:0", path="tcp")
    initiator = orbitte.Engine(path="tcp")
    try:
        dst = target.alloc(1 << 16)
        target.register(dst)
        src = initiator.register(bytearray(1 << 16), remote=False)
        peer = initiator.connect(target.address)
        with pytest.raises(orbitte.SubmitError):  # refused whole: past the end
            initiator.submit(peer, [orbitte.write(src, peer.range(0)),
                                    orbitte.write(src, peer.range(0), 8, remote_offset=(1 << 16) - 4)],
                             notify=b"never")
        with pytest.raises(orbitte.SubmitError, match="larger than 1048576 bytes"):
            initiator.submit(peer, [orbitte.write(src, peer.range(0))], notify=b"x" * ((1 << 20) + 1))
        assert target.wait_notification(0.3) is None
        initiator.transfer(peer, [orbitte.write(src, peer.range(0))], notify=b"ok")
        n = target.wait_notification(10)
        assert n.payload == b"ok" and n.source_id == initiator.source_id
        assert target.notifications() == []
    finally:
        initiator.close()
        target.close()


def test_mooncake_transfer_sync_with_notify(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    rc = initiator.transfer_sync(session, src.ctypes.data, dst.ctypes.data, 4096, TransferOpcode.WRITE,
                                 TransferNotify("kv", "chunk_1_done"))
    assert rc == 0, initiator.last_error()
    got = []
    for _ in range(500):
        got = target.get_notifies()
        if got:
            break
        import time
        time.sleep(0.01)
    assert got == [TransferNotify("kv", "chunk_1_done")]
    assert (dst[:4096] == src[:4096]).all()
    assert initiator.send_probe(session) == 0
    assert initiator.send_probe("127.0.0.1:1") < 0


def test_a_notification_the_target_cannot_keep_is_reported_to_the_sender():
    """The target never reads: past the 1024 notifications it keeps from
    one sender, transfer(notify=...) raises TransferError whose outcomes say
    "refused" with the fix; refused + arrived == sent; once the target
    reads, one is taken again. A 1 MiB notification arrives whole."""
    target = orbitte.Engine(listen="127.0.0.1:0", path="tcp")
    initiator = orbitte.Engine(path="tcp")
    try:
        target.register(target.alloc(1 << 16))
        src = initiator.register(bytearray(1 << 16), remote=False)
        peer = initiator.connect(target.address)
        sent, refused = 1030, 0
        for i in range(sent):
            try:
                initiator.transfer(peer, [orbitte.write(src, peer.range(0), 8)], notify=b"n%d" % i)
            except orbitte.TransferError as e:
                assert "notification was refused" in str(e), e
                assert all(o.notification == "refused" for o in e.outcomes)
                assert "must read its notifications" in e.outcomes[0].notification_why
                refused += 1
        got = target.notifications()
        assert (len(got), refused) == (1024, sent - 1024)
        assert len(got) + refused == sent
        assert [n.payload for n in got[:2]] == [b"n0", b"n1"]
        big = os.urandom(1 << 20)
        initiator.transfer(peer, [orbitte.write(src, peer.range(0), 8)], notify=big)
        n = target.wait_notification(10)
        assert n is not None and n.payload == big
    finally:
        initiator.close()
        target.close()


def test_mooncake_refused_notification_is_its_own_code(mooncake_pair):
    target, initiator, session, src, dst = mooncake_pair
    codes = [initiator.transfer_sync(session, src.ctypes.data, dst.ctypes.data, 64, TransferOpcode.WRITE,
                                     TransferNotify("kv", "c%d" % i)) for i in range(1025)]
    assert codes[:1024] == [0] * 1024
    err = initiator.last_error()
    assert codes[1024] == err.code == -2, err  # Mooncake's ERR_TOO_MANY_REQUESTS
    assert "must read its notifications" in err.message, err
    assert len(target.get_notifies()) == 1024
    assert initiator.transfer_sync(session, src.ctypes.data, dst.ctypes.data, 64, TransferOpcode.WRITE,
                                   TransferNotify("kv", "after")) == 0
