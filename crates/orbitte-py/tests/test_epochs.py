"""A Peer is bound to the incarnation it was opened on: after the target
restarts at the same address (a newer epoch), an old Peer's requests never
touch the new process's memory, and once the engine has opened the new
incarnation they are refused naming both epochs. Nothing reopens a peer
behind the caller."""

import pytest

import orbitte


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_an_old_peer_is_refused_after_the_target_restarts(path):
    first = orbitte.Engine("py-restarting-target", listen="127.0.0.1:0", path=path)
    addr = first.address
    old_dst = first.alloc(4096)
    first.register(old_dst)
    initiator = orbitte.Engine(path=path)
    src = bytearray(b"\xab" * 4096)
    reg = initiator.register(src, remote=False)
    old = initiator.connect(addr)
    assert old.path == path
    initiator.transfer(old, [orbitte.write(reg, old.range(0), 16)])
    assert bytes(old_dst.view[:16]) == b"\xab" * 16
    first.close()
    # A dead target is an error, not the cached Peer.
    with pytest.raises(orbitte.ConnectError):
        initiator.connect(addr)

    second = orbitte.Engine("py-restarting-target", listen=addr, path=path)
    assert second.epoch > old.epoch
    new_dst = second.alloc(4096)
    second.register(new_dst)
    # Until this engine opens the address again it knows the old
    # incarnation only, and the old Peer's requests go to that one, never
    # to the new process: over tcp its session is gone (refused); over the
    # local path its memory is still mapped here, but the target stopped
    # serving the mapping, so nothing is reported delivered.
    if path == "tcp":
        for call in (initiator.transfer, initiator.submit):
            with pytest.raises(orbitte.SubmitError, match="no usable rail"):
                call(old, [orbitte.write(reg, old.range(0), 16)])
    else:
        (late,) = initiator.submit(old, [orbitte.write(reg, old.range(0), 16)]).wait(
            10, check=False)
        assert not late.ok, late
    assert bytes(new_dst.view[:16]) == bytes(16), "the new incarnation's memory is untouched"

    new = initiator.connect(addr)
    assert new.epoch == second.epoch
    # Now the engine knows the peer restarted: the old Peer is refused.
    for call in (initiator.transfer, initiator.submit):
        with pytest.raises(orbitte.PeerRestartedError) as refused:
            call(old, [orbitte.write(reg, old.range(0), 16)])
        assert refused.value.handle_epoch == old.epoch
        assert refused.value.current_epoch == second.epoch
        assert "restarted" in str(refused.value)
        assert isinstance(refused.value, orbitte.SubmitError)
    assert bytes(new_dst.view[:16]) == bytes(16), "the new incarnation's memory is untouched"

    # A range of the old Peer in a batch for the new one is refused too.
    with pytest.raises(orbitte.PeerRestartedError):
        initiator.transfer(new, [orbitte.write(reg, old.range(0), 16)])
    initiator.transfer(new, [orbitte.write(reg, new.range(0), 16)])
    assert bytes(new_dst.view[:16]) == b"\xab" * 16
    initiator.close()
    second.close()
