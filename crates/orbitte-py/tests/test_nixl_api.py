"""orbitte.nixl in one process: descriptor forms, what this build serves,
and bad input answered with NIXL's exception classes."""

import json
import os
import time

import numpy as np
import pytest

import orbitte
from orbitte import nixl


def agent(name: str, **kw) -> nixl.nixl_agent:
    kw.setdefault("listen", "127.0.0.1:0")
    return nixl.nixl_agent(f"{name}-{os.getpid()}-{time.monotonic_ns()}", nixl.nixl_agent_config(rdma=False, **kw))


@pytest.fixture
def pair():
    a, b = agent("a"), agent("b")
    sa, sb = orbitte.Buffer(1 << 16), orbitte.Buffer(1 << 16)
    sa.view[:] = os.urandom(1 << 16)
    a.register_memory(a.get_reg_descs([sa]))
    b.register_memory(b.get_reg_descs([sb]))
    a.add_remote_agent(b.get_agent_metadata())
    yield a, b, sa, sb
    a.close()
    b.close()


def done(ag, h) -> str:
    deadline = time.time() + 30
    s = ag.check_xfer_state(h)
    while s == "PROC" and time.time() < deadline:
        s = ag.check_xfer_state(h)
    return s


def test_exceptions_are_nixl_names_under_orbitte_error():
    for name in ["nixlInvalidParamError", "nixlNotFoundError", "nixlNotSupportedError", "nixlBackendError",
                 "nixlMismatchError", "nixlNotAllowedError", "nixlNotPostedError", "nixlRepostActiveError",
                 "nixlRemoteDisconnectError", "nixlCancelledError", "nixlNoTelemetryError", "nixlUnknownError"]:
        cls = getattr(nixl, name)
        assert issubclass(cls, nixl.nixlError) and issubclass(cls, orbitte.Error)
        assert cls.__name__ == name


def test_descriptor_forms(pair):
    a, _, sa, _ = pair
    base = sa.address
    tuples = a.get_xfer_descs([(base, 10, 0), (base + 10, 20, 0)], "DRAM")
    arr = a.get_xfer_descs(np.array([[base, 10, 0], [base + 10, 20, 0]], dtype=np.uint64), "cpu")
    assert tuples == arr and tuples.descCount() == 2 and tuples[1] == (base + 10, 20, 0)
    assert tuples.getType() == "DRAM_SEG" and not tuples.isEmpty()
    reg = a.get_reg_descs([(base, 10, 0, "t0"), (base + 10, 20, 0, b"t1")], "DRAM")
    assert reg[0] == (base, 10, 0, b"t0") and reg[1][3] == b"t1"
    reg4 = a.get_reg_descs(np.array([[base, 10, 0, 7]], dtype=np.int64), "DRAM")
    assert reg4[0] == (base, 10, 0, b"")
    assert a.get_reg_descs([sa])[0] == (sa.address, sa.length, 0, b"")
    # Serialization round trip, never pickle.
    for d in (tuples, reg):
        s = a.get_serialized_descs(d)
        assert a.deserialize_descs(s) == d
    with pytest.raises(nixl.nixlMismatchError):
        a.deserialize_descs(b"\x80\x04not json")


def test_what_this_build_serves():
    ag = agent("caps")
    assert ag.get_plugin_list() == ["UCX"]
    types = ag.get_backend_mem_types("UCX")
    assert types[0] == "DRAM_SEG"
    assert ("VRAM_SEG" in types) == hasattr(orbitte.Engine, "register_device")
    with pytest.raises(nixl.nixlNotSupportedError, match="GDS"):
        ag.create_backend("GDS")
    with pytest.raises(nixl.nixlNotSupportedError, match="GPU-side device API"):
        ag.prep_mem_view(None)
    ag.close()
    for storage in (["UCX", "POSIX"], ["OBJ"], ["GDS_MT"]):
        with pytest.raises(nixl.nixlNotSupportedError, match="not part of OrbitTE"):
            nixl.nixl_agent_config(backends=storage)
    with pytest.raises(nixl.nixlNotFoundError, match="no backend plugin"):
        nixl.nixl_agent_config(backends=["NOPE"])


def test_wrong_tuple_width_and_unknown_mem_type(pair):
    a, _, sa, _ = pair
    with pytest.raises(nixl.nixlInvalidParamError, match="4-tuple"):
        a.get_xfer_descs([(sa.address, 10, 0, "")], "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError, match="3-tuple"):
        a.get_reg_descs([(sa.address, 10, 0)], "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError, match="Nx3"):
        a.get_xfer_descs(np.zeros((2, 4), dtype=np.uint64), "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError, match="mem_type"):
        a.get_xfer_descs([(sa.address, 10, 0)], "HBM")
    with pytest.raises(nixl.nixlInvalidParamError, match="give mem_type"):
        a.get_xfer_descs([(sa.address, 10, 0)])
    with pytest.raises(nixl.nixlNotSupportedError, match="storage"):
        a.get_reg_descs([(sa.address, 10, 0, "")], "FILE")
    with pytest.raises(nixl.nixlInvalidParamError, match="non-negative"):
        a.get_xfer_descs([(-1, 10, 0)], "DRAM")


def test_vram_that_is_not_device_memory_says_so(pair):
    a, _, sa, _ = pair
    stray = np.zeros(4096, dtype=np.uint8)
    if not hasattr(orbitte.Engine, "register_device"):
        with pytest.raises(nixl.nixlNotSupportedError, match="VRAM without libcuda/this build"):
            a.register_memory([(stray.ctypes.data, 4096, 0, "")], "VRAM")
        return
    # Host memory named as VRAM: the driver (or its absence) is named, and
    # nothing is registered.
    before = a.engine.registrations()
    with pytest.raises(nixl.nixlBackendError, match="cannot be registered as CUDA device memory"):
        a.register_memory([(stray.ctypes.data, 4096, 0, "")], "VRAM")
    assert a.engine.registrations() == before


def test_unregistered_range_and_unknown_agent(pair):
    a, b, sa, sb = pair
    stray = orbitte.Buffer(4096)
    with pytest.raises(nixl.nixlNotFoundError, match="not inside a registered range"):
        a.prep_xfer_dlist("NIXL_INIT_AGENT", [(stray.address, 4096, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError, match="not inside memory agent"):
        a.prep_xfer_dlist(b.name, [(sb.address + (1 << 16) - 10, 20, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError, match="was not added"):
        a.prep_xfer_dlist("nobody", [(sb.address, 10, 0)], "DRAM")
    with pytest.raises(nixl.nixlNotFoundError, match="was not added"):
        a.send_notif("nobody", b"x")
    with pytest.raises(nixl.nixlNotFoundError, match="was not added"):
        a.initialize_xfer("WRITE", a.get_xfer_descs([(sa.address, 10, 0)], "DRAM"),
                          a.get_xfer_descs([(sb.address, 10, 0)], "DRAM"), "nobody")
    with pytest.raises(nixl.nixlNotFoundError, match="not registered"):
        a.deregister_memory(a.get_reg_descs([(stray.address, 4096, 0, "")], "DRAM"))
    with pytest.raises(nixl.nixlMismatchError):
        a.add_remote_agent(b"{not metadata")
    with pytest.raises(nixl.nixlInvalidParamError, match="registered already"):
        a.register_memory([(sa.address, 16, 0, "")], "DRAM")


def test_index_and_length_errors(pair):
    a, b, sa, sb = pair
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address + i * 1024, 1024, 0) for i in range(4)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address, 1024, 0), (sb.address + 4096, 512, 0)], "DRAM")
    with pytest.raises(nixl.nixlInvalidParamError, match="local index out of range"):
        a.make_prepped_xfer("WRITE", local, [9], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="remote index out of range"):
        a.make_prepped_xfer("WRITE", local, np.array([0]), remote, np.array([-1]))
    with pytest.raises(nixl.nixlInvalidParamError, match="different number of indices"):
        a.make_prepped_xfer("WRITE", local, [0, 1], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="length mismatch"):
        a.make_prepped_xfer("WRITE", local, [0], remote, [1])
    with pytest.raises(nixl.nixlInvalidParamError, match="invalid sides"):
        a.make_prepped_xfer("WRITE", remote, [0], local, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="operation"):
        a.make_prepped_xfer("COPY", local, [0], remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="empty transfer"):
        a.make_prepped_xfer("WRITE", local, [], remote, [])


def test_released_handles_are_refused(pair):
    a, b, sa, sb = pair
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address, 4096, 0)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address, 4096, 0)], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0], remote, [0])
    with pytest.raises(nixl.nixlNotPostedError):
        a.check_xfer_state(h)
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    assert bytes(sb.view[:4096]) == bytes(sa.view[:4096])
    a.release_xfer_handle(h)
    with pytest.raises(nixl.nixlInvalidParamError, match="released"):
        a.transfer(h)
    with pytest.raises(nixl.nixlInvalidParamError, match="released"):
        a.check_xfer_state(h)
    with pytest.raises(nixl.nixlInvalidParamError, match="released"):
        a.release_xfer_handle(h)
    a.release_dlist_handle(local)
    with pytest.raises(nixl.nixlInvalidParamError, match="released already"):
        a.release_dlist_handle(local)
    with pytest.raises(nixl.nixlInvalidParamError, match="released"):
        a.make_prepped_xfer("WRITE", local, [0], remote, [0])
    a.remove_remote_agent(b.name)
    with pytest.raises(nixl.nixlNotFoundError, match="removed"):
        a.make_prepped_xfer("WRITE", a.prep_xfer_dlist("", [(sa.address, 4096, 0)], "DRAM"), [0], remote, [0])
    with pytest.raises(nixl.nixlNotFoundError):
        a.remove_remote_agent(b.name)


def test_notification_too_large_is_refused_and_nothing_sent(pair):
    a, b, sa, sb = pair
    b.add_remote_agent(a.get_agent_metadata())
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address, 4096, 0)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address, 4096, 0)], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0], remote, [0], b"x" * ((1 << 20) + 1))
    with pytest.raises(nixl.nixlInvalidParamError):
        a.transfer(h)
    assert b.get_new_notifs() == {}
    # A failed transfer never notifies: memory unregistered under a
    # prepared list refuses the post, and no notification comes.
    h = a.make_prepped_xfer("WRITE", local, [0], remote, [0], b"must-not-arrive")
    a.deregister_memory(a.get_reg_descs([sa]))
    with pytest.raises(nixl.nixlNotFoundError):
        a.transfer(h)
    time.sleep(0.2)
    assert b.get_new_notifs() == {}


def test_a_notification_the_agent_cannot_keep_raises_and_its_transfer_is_err(pair):
    """b never reads its notifications: past the 1024 it keeps from a,
    send_notif raises and a transfer carrying one ends ERR, not DONE; once
    b reads them, a notification is taken again."""
    a, b, sa, sb = pair
    kept = 1024
    for i in range(kept):
        a.send_notif(b.name, b"n%d" % i)
    with pytest.raises(nixl.nixlBackendError, match="refused.*must read its notifications"):
        a.send_notif(b.name, b"one too many")
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address, 4096, 0)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address, 4096, 0)], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0], remote, [0], b"kv-ready")
    a.transfer(h)
    assert done(a, h) == "ERR"
    assert "refused" in h.error
    assert bytes(sb.view[:4096]) == bytes(sa.view[:4096])  # the bytes moved
    got = b.get_new_notifs()[a.name]
    assert len(got) == kept and got[0] == b"n0" and got[-1] == b"n%d" % (kept - 1)
    a.send_notif(b.name, b"after")
    assert b.get_new_notifs() == {a.name: [b"after"]}


def test_a_1_mib_notification_arrives_whole(pair):
    a, b, sa, sb = pair
    big = os.urandom(1 << 20)
    a.send_notif(b.name, big)
    assert b.get_new_notifs() == {a.name: [big]}


def test_telemetry_when_captured(pair):
    a, b, sa, sb = pair
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address + i * 4096, 4096, 0) for i in range(3)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address + i * 4096, 4096, 0) for i in range(3)], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0, 2], remote, [1, 0])
    with pytest.raises(nixl.nixlNoTelemetryError, match="capture_telemetry"):
        a.get_xfer_telemetry(h)
    a._conf.capture_telemetry = True
    with pytest.raises(nixl.nixlNotPostedError):
        a.get_xfer_telemetry(h)
    before = time.time()
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    t = a.get_xfer_telemetry(h)
    assert (t.totalBytes, t.descCount) == (8192, 2)
    # descCount counts descriptors after merging, as NIXL does: three blocks
    # adjacent on both sides by index make one; initialize_xfer never merges.
    h = a.make_prepped_xfer("WRITE", local, [0, 1, 2], remote, [0, 1, 2])
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    assert (a.get_xfer_telemetry(h).totalBytes, a.get_xfer_telemetry(h).descCount) == (3 * 4096, 1)
    rows = [(sa.address + i * 4096, 4096, 0) for i in range(3)]
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(rows, "DRAM"),
                          a.get_xfer_descs([(sb.address + i * 4096, 4096, 0) for i in range(3)], "DRAM"), b.name)
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    assert a.get_xfer_telemetry(h).descCount == 3
    h = a.make_prepped_xfer("WRITE", local, [0, 2], remote, [1, 0])
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    t = a.get_xfer_telemetry(h)
    assert before - 1 <= t.startTime / 1e6 <= time.time() + 1
    assert 0 <= t.postDuration <= t.xferDuration
    assert a.get_xfer_telemetry(h).xferDuration == t.xferDuration  # ended: fixed


def test_strided_rows_and_loopback(pair):
    a, b, sa, sb = pair
    # Two strided rows: 3 blocks of 1 KiB every 4 KiB, then 1 block.
    rows = np.array([[sa.address, 1024, 0, 4096, 3], [sa.address + 512, 256, 0, 0, 1]], dtype=np.uint64)
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows, "DRAM")
    assert len(local) == 4
    remote = a.prep_xfer_dlist(b.name, [(sb.address + i * 1024, 1024, 0) for i in range(3)]
                               + [(sb.address + 8192, 256, 0)], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0, 1, 2, 3], remote, [0, 1, 2, 3])
    a.transfer(h)
    assert done(a, h) == "DONE", h.error
    for i in range(3):
        assert bytes(sb.view[i * 1024:(i + 1) * 1024]) == bytes(sa.view[i * 4096:i * 4096 + 1024])
    assert bytes(sb.view[8192:8192 + 256]) == bytes(sa.view[512:768])
    with pytest.raises(nixl.nixlInvalidParamError, match="mem_type"):
        a.prep_xfer_dlist("NIXL_INIT_AGENT", rows)
    with pytest.raises(nixl.nixlNotSupportedError, match="loopback"):
        a.prep_xfer_dlist(a.name, [(sa.address, 16, 0)], "DRAM")


def test_threads_share_one_agent_and_its_prepared_lists(pair):
    import threading

    a, b, sa, sb = pair
    blocks = 16
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address + i * 4096, 4096, 0) for i in range(blocks)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address + i * 4096, 4096, 0) for i in range(blocks)], "DRAM")
    errors = []

    def run(t: int) -> None:
        try:
            mine = list(range(t, blocks, 4))  # disjoint blocks per thread
            for _ in range(20):
                h = a.make_prepped_xfer("WRITE", local, mine[::-1], remote, mine, f"t{t}".encode())
                a.transfer(h)
                assert done(a, h) == "DONE", h.error
                a.release_xfer_handle(h)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for t in range(4):
        mine = list(range(t, blocks, 4))
        for src, dst in zip(mine[::-1], mine):
            assert bytes(sb.view[dst * 4096:(dst + 1) * 4096]) == bytes(sa.view[src * 4096:(src + 1) * 4096])
    deadline = time.time() + 10
    got: dict = {}
    while sum(map(len, got.values())) < 80 and time.time() < deadline:
        for k, v in b.get_new_notifs().items():
            got.setdefault(k, []).extend(v)
        time.sleep(0.01)
    assert sorted(got[a.name]) == sorted([f"t{t}".encode() for t in range(4)] * 20)


def test_index_forms(pair):
    a, b, sa, sb = pair
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(sa.address + i * 256, 256, 0) for i in range(8)], "DRAM")
    remote = a.prep_xfer_dlist(b.name, [(sb.address + i * 256, 256, 0) for i in range(8)], "DRAM")
    forms = [
        (np.array([3, 1], dtype=np.int32), np.array([0, 6], dtype=np.int32)),
        (np.array([3, 1], dtype=np.uint64), [0, 6]),
        (np.array([9, 3, 8, 1])[1::2], np.array([0, 6], dtype=">i8")),  # strided view, big-endian
        ((3, 1), range(0, 7, 6)),
    ]
    for li, ri in forms:
        sb.view[:] = bytes(len(sb.view))
        h = a.make_prepped_xfer("WRITE", local, li, remote, ri)
        a.transfer(h)
        assert done(a, h) == "DONE", h.error
        assert bytes(sb.view[0:256]) == bytes(sa.view[3 * 256:4 * 256])
        assert bytes(sb.view[6 * 256:7 * 256]) == bytes(sa.view[256:512])
        a.release_xfer_handle(h)
    with pytest.raises(nixl.nixlInvalidParamError, match="1-D integer"):
        a.make_prepped_xfer("WRITE", local, np.zeros((1, 1), dtype=np.int64), remote, [0])
    with pytest.raises(nixl.nixlInvalidParamError, match="1-D integer"):
        a.make_prepped_xfer("WRITE", local, np.array([0.0]), remote, [0])


def test_large_local_transfers_leave_their_copies_to_the_workers(pair):
    """On the local path a transfer of 1 MiB or more is posted queued: its
    copies run on the rails' workers, every byte lands, the notification
    follows; a release right after transfer() cancels or settles it; a
    refusal raises from transfer() as on every path, and nothing is sent."""
    a, b, _, _ = pair
    src, dst = orbitte.Buffer(2 << 20), orbitte.Buffer(2 << 20)
    src.view[:] = os.urandom(2 << 20)
    a.register_memory(a.get_reg_descs([src]))
    b.register_memory(b.get_reg_descs([dst]))
    a.add_remote_agent(b.get_agent_metadata())
    assert a.peer(b.name).path == "local"
    rows = lambda base: [(base + i * 4096, 4096, 0) for i in range(512)]  # noqa: E731
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows(src.address), "DRAM")
    remote = a.prep_xfer_dlist(b.name, rows(dst.address), "DRAM")
    order = np.random.default_rng(5).permutation(512)
    h = a.make_prepped_xfer("WRITE", local, order, remote, np.arange(512), b"big")
    assert a.transfer(h) in ("PROC", "DONE")
    assert done(a, h) == "DONE", h.error
    got = np.frombuffer(bytes(dst.view[:512 * 4096]), np.uint8).reshape(512, 4096)
    want = np.frombuffer(bytes(src.view[:512 * 4096]), np.uint8).reshape(512, 4096)
    assert (got == want[order]).all()
    deadline = time.time() + 10
    notes: dict = {}
    while not notes and time.time() < deadline:
        notes = b.get_new_notifs()
    assert notes == {a.name: [b"big"]}
    # Released right after it was posted.
    h2 = a.make_prepped_xfer("WRITE", local, np.arange(512), remote, np.arange(512))
    a.transfer(h2)
    a.release_xfer_handle(h2)
    # Refused at submit: raised, with the reason.
    h3 = a.make_prepped_xfer("WRITE", local, np.arange(512), remote, np.arange(512), b"never")
    a.deregister_memory(a.get_reg_descs([src]))
    with pytest.raises(nixl.nixlNotFoundError, match="not published"):
        a.transfer(h3)
    time.sleep(0.2)
    assert b.get_new_notifs() == {}


def test_ipv6_listen_addresses_travel_in_the_metadata():
    import json

    try:
        a, b = agent("v6a", listen="::1"), agent("v6b", listen="[::1]:0")
    except nixl.nixlBackendError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    meta = json.loads(b.get_agent_metadata())
    assert meta["address"].startswith("[::1]:")
    a.add_remote_agent(b.get_agent_metadata())
    a.send_notif(b.name, b"over v6")
    deadline = time.time() + 10
    while not b.check_remote_xfer_done(a.name, b"over v6"):
        assert time.time() < deadline
        time.sleep(0.005)
    a.close()
    b.close()


def test_thread_sync_modes_and_backend_handle_are_nixls():
    assert [m.name for m in nixl.nixl_thread_sync_t] == [
        "NIXL_THREAD_SYNC_NONE", "NIXL_THREAD_SYNC_STRICT", "NIXL_THREAD_SYNC_RW"]
    assert nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT is nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
    assert nixl.nixl_backend_handle is int
    conf = nixl.nixl_agent_config(backends=[], sync_mode=nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    assert conf.sync_mode is nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
    with pytest.raises(TypeError, match="nixl_thread_sync_t"):
        nixl.nixl_agent_config(sync_mode="strict")


def test_partial_metadata_carries_what_was_asked(pair):
    a, b, sa, sb = pair
    extra = orbitte.Buffer(1 << 12)
    b.register_memory(b.get_reg_descs([extra]))
    whole = json.loads(b.get_agent_metadata())
    assert sorted(r[0] for r in whole["registrations"]) == sorted([sb.address, extra.address])
    partial = b.get_partial_agent_metadata(b.get_reg_descs([extra]), inc_conn_info=False)
    doc = json.loads(partial)
    assert [r[0] for r in doc["registrations"]] == [extra.address]
    assert "address" not in doc and "token" not in doc
    # Without connection information only an agent that added b already takes it.
    c = agent("c")
    with pytest.raises(nixl.nixlNotFoundError, match="no connection information"):
        c.add_remote_agent(partial)
    c.close()
    assert a.add_remote_agent(partial) == b.name.encode()
    with_conn = json.loads(b.get_partial_agent_metadata([], inc_conn_info=True))
    assert with_conn["registrations"] == [] and with_conn["address"] and with_conn["token"] == whole["token"]
    with pytest.raises(nixl.nixlNotFoundError, match="not the start of a registration"):
        b.get_partial_agent_metadata(b.get_reg_descs([(sb.address + 8, 8, 0, "")], "DRAM"))


def test_a_backend_name_given_alone_is_one_backend(pair):
    a, b, sa, sb = pair
    extra = orbitte.Buffer(4096)
    descs = a.get_reg_descs([extra])
    a.register_memory(descs, backends="UCX")
    a.deregister_memory(descs, "UCX")
    with pytest.raises(nixl.nixlNotFoundError):
        a.deregister_memory(descs, "UCX")
    with pytest.raises(nixl.nixlNotSupportedError, match="GDS"):
        a.deregister_memory(a.get_reg_descs([sa]), "GDS")
