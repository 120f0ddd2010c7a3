"""orbitte.nixl between two processes: NIXL agents over tcp and local,
WRITE and READ by initialize_xfer and by prepared lists, notifications,
metadata through bytes and etcd, a dead peer."""

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import orbitte
from orbitte import nixl
from conftest import Child
from test_etcd import etcd  # noqa: F401 (the fixture)

HERE = Path(__file__).parent


def sha(b) -> str:
    return hashlib.sha256(bytes(b)).hexdigest()


class Agent(Child):
    """A NIXL agent in a child process (nixl_process.py)."""

    def __init__(self, name: str, size: int, fill: int, etcd_url=None):
        cmd = [sys.executable, str(HERE / "nixl_process.py"), "--name", name, "--size", str(size),
               "--fill", str(fill)]
        super().__init__(cmd + (["--etcd", etcd_url] if etcd_url else []))
        self.name = self.info["name"]
        self.metadata = base64.b64decode(self.info["metadata"])
        self.address = self.info["address"]
        self.length = self.info["length"]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def spawn_agent():
    agents = []

    def make(name: str, size: int = 1 << 20, fill: int = 0, etcd_url=None) -> Agent:
        a = Agent(name, size, fill, etcd_url)
        agents.append(a)
        return a

    yield make
    for a in agents:
        a.close()


def local_agent(name: str, path: str = "auto", **kw) -> nixl.nixl_agent:
    return nixl.nixl_agent(name, nixl.nixl_agent_config(listen="127.0.0.1:0", path=path, rdma=False, **kw))


def wait_state(agent, handle, timeout: float = 30.0) -> str:
    deadline = time.time() + timeout
    state = agent.check_xfer_state(handle)
    while state == "PROC" and time.time() < deadline:
        time.sleep(0.001)
        state = agent.check_xfer_state(handle)
    return state


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_initialize_xfer_write_and_read_between_processes(spawn_agent, path):
    target = spawn_agent(unique("decode"), size=1 << 20, fill=0x11)
    agent = local_agent(unique("prefill"), path)
    src = orbitte.Buffer(1 << 20)
    src.view[:] = os.urandom(1 << 20)
    agent.register_memory(agent.get_reg_descs([src]))
    assert agent.add_remote_agent(target.metadata) == target.name.encode()
    assert agent.peer(target.name).path == path, agent.peer(target.name).fell_back

    half = 1 << 19
    local = agent.get_xfer_descs([(src.address, half, 0)], "DRAM")
    remote = agent.get_xfer_descs([(target.address + half, half, 0)], "DRAM")
    h = agent.initialize_xfer("WRITE", local, remote, target.name, b"req-7:written")
    assert agent.transfer(h) in ("PROC", "DONE")
    assert wait_state(agent, h) == "DONE", h.error
    agent.release_xfer_handle(h)
    # The notification came after every byte: the target hashes at once.
    assert target.ask(f"notif_sha {agent.name} req-7 10 {half} {half}") == f"yes {sha(src.view[:half])}"
    assert target.ask(f"sha 0 {half}") == sha(b"\x11" * half)

    dst = orbitte.Buffer(1 << 20)
    agent.register_memory(agent.get_reg_descs([dst]))
    h = agent.initialize_xfer("READ", agent.get_xfer_descs([(dst.address, 1 << 20, 0)], "DRAM"),
                              agent.get_xfer_descs([(target.address, 1 << 20, 0)], "DRAM"), target.name)
    agent.transfer(h)
    assert wait_state(agent, h) == "DONE", h.error
    assert bytes(dst.view) == b"\x11" * half + bytes(src.view[:half])
    # A transfer without a notification delivers none.
    assert json.loads(target.ask("notifs 0.2")) == {}
    agent.close()


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_prepared_lists_by_index_between_processes(spawn_agent, path):
    blocks, block = 256, 4096
    target = spawn_agent(unique("decode"), size=blocks * block, fill=0)
    agent = local_agent(unique("prefill"), path)
    src = orbitte.Buffer(blocks * block)
    src.view[:] = os.urandom(blocks * block)
    agent.register_memory(agent.get_reg_descs([src]))
    agent.add_remote_agent(target.metadata)
    rows = lambda base: np.stack([base + np.arange(blocks, dtype=np.uint64) * block,  # noqa: E731
                                  np.full(blocks, block, np.uint64), np.zeros(blocks, np.uint64)], axis=1)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", rows(src.address), "DRAM")
    remote = agent.prep_xfer_dlist(target.name, rows(target.address), "DRAM")
    rng = np.random.default_rng(3)
    li = rng.permutation(blocks).astype(np.int32)
    ri = rng.permutation(blocks).astype(np.int32)
    h = agent.make_prepped_xfer("WRITE", local, li, remote, ri, b"layer-0:req-9")
    agent.transfer(h)
    assert wait_state(agent, h) == "DONE", h.error
    expect = bytearray(blocks * block)
    for a, b in zip(li, ri):
        expect[b * block:(b + 1) * block] = src.view[a * block:(a + 1) * block]
    assert target.ask(f"notif_sha {agent.name} layer-0 10 0 {blocks * block}") == f"yes {sha(expect)}"
    # The same handle posted again (NIXL allows a repost once DONE).
    assert agent.transfer(h, b"layer-0:again") in ("PROC", "DONE")
    assert wait_state(agent, h) == "DONE", h.error
    assert target.ask(f"notif_sha {agent.name} layer-0:again 10 0 0").startswith("yes")
    agent.release_xfer_handle(h)

    # READ by prepared lists, indices as plain lists (adjacent ones merge).
    dst = orbitte.Buffer(blocks * block)
    agent.register_memory(agent.get_reg_descs([dst]))
    dlocal = agent.prep_xfer_dlist("", rows(dst.address), "DRAM")
    h = agent.make_prepped_xfer("READ", dlocal, list(range(blocks)), remote, list(range(blocks)))
    assert h._native.requests == 1 and h._native.descriptors == blocks
    agent.transfer(h)
    assert wait_state(agent, h) == "DONE", h.error
    assert bytes(dst.view) == bytes(expect)
    agent.release_xfer_handle(h)
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    agent.close()


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_notifications_both_ways_without_a_transfer(spawn_agent, path):
    target = spawn_agent(unique("decode"), size=1 << 16)
    agent = local_agent(unique("prefill"), path)
    agent.add_remote_agent(target.metadata)
    assert target.ask("add " + base64.b64encode(agent.get_agent_metadata()).decode()) == agent.name
    agent.send_notif(target.name, b"abc-123")
    agent.send_notif(target.name, "xyz")
    got = json.loads(target.ask("notifs 0.5"))
    assert got == {agent.name: [b"abc-123".hex(), b"xyz".hex()]}
    # The other way, matched by prefix as NIXL does; a match is taken once.
    assert target.ask(f"send_notif {agent.name} {b'kv-ready:42'.hex()}") == "ok"
    deadline = time.time() + 10
    while not agent.check_remote_xfer_done(target.name, b"kv-ready") and time.time() < deadline:
        time.sleep(0.005)
    assert time.time() < deadline
    assert not agent.check_remote_xfer_done(target.name, b"kv-ready")
    assert target.ask(f"send_notif {agent.name} {b'x-tail-y'.hex()}") == "ok"
    deadline = time.time() + 10
    while not agent.check_remote_xfer_done(target.name, b"tail", tag_is_prefix=False) and time.time() < deadline:
        time.sleep(0.005)
    assert time.time() < deadline
    assert target.ask(f"send_notif nobody {b'x'.hex()}") == "nixlNotFoundError"
    agent.close()


def test_a_transfer_that_fails_never_notifies(spawn_agent):
    """The target deregisters the memory a prepared list names: the
    transfer is refused or ends ERR, and no notification arrives. (Over
    tcp: on the local path a mapping cannot be revoked, docs/paths.md.)"""
    target = spawn_agent(unique("decode"), size=1 << 16)
    agent = local_agent(unique("prefill"), "tcp")
    src = orbitte.Buffer(1 << 16)
    agent.register_memory(agent.get_reg_descs([src]))
    agent.add_remote_agent(target.metadata)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(src.address, 1 << 16, 0)], "DRAM")
    remote = agent.prep_xfer_dlist(target.name, [(target.address, 1 << 16, 0)], "DRAM")
    assert target.ask("deregister") == "ok"
    h = agent.make_prepped_xfer("WRITE", local, [0], remote, [0], b"must-not-arrive")
    try:
        state = agent.transfer(h)
        if state != "ERR":
            state = wait_state(agent, h)
        assert state == "ERR", state
        assert h.error
    except nixl.nixlNotFoundError as e:  # the target's retire reached us first
        assert "refused" in str(e)
    assert json.loads(target.ask("notifs 0.5")) == {}
    agent.close()


def test_transfer_to_a_dead_agent_raises_remote_disconnect(spawn_agent):
    target = spawn_agent(unique("decode"), size=1 << 20)
    agent = local_agent(unique("prefill"), "tcp", request_timeout=3.0)
    src = orbitte.Buffer(1 << 20)
    agent.register_memory(agent.get_reg_descs([src]))
    agent.add_remote_agent(target.metadata)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(src.address, 1 << 20, 0)], "DRAM")
    remote = agent.prep_xfer_dlist(target.name, [(target.address, 1 << 20, 0)], "DRAM")
    h = agent.make_prepped_xfer("WRITE", local, [0], remote, [0], b"never")
    agent.transfer(h)
    assert wait_state(agent, h) == "DONE", h.error
    target.kill()
    # As NIXL does: transfer() to an agent that is gone raises
    # nixlRemoteDisconnectError (vLLM handles the exception), and the handle
    # says ERR. The first post may still find the rail up and end in ERR.
    states, raised = [], None
    for _ in range(3):
        h = agent.make_prepped_xfer("WRITE", local, [0], remote, [0], b"never")
        try:
            state = agent.transfer(h)
        except nixl.nixlRemoteDisconnectError as e:
            raised = e
            state = agent.check_xfer_state(h)
        if state == "PROC":
            state = wait_state(agent, h, timeout=30)
        states.append(state)
        agent.release_xfer_handle(h)
        if raised is not None:
            break
    assert raised is not None, states
    assert "no usable rail" in str(raised) and target.name in str(raised)
    assert set(states) == {"ERR"}, states
    with pytest.raises(nixl.nixlRemoteDisconnectError):
        agent.send_notif(target.name, b"hello?")
    agent.close()


def test_metadata_through_etcd(spawn_agent, etcd):  # noqa: F811
    url = f"etcd://{etcd}/orbitte/nixl-test"
    name = unique("decode")
    target = None
    for _ in range(50):  # etcd may take a moment to answer after its port opens
        try:
            target = spawn_agent(name, size=1 << 16, fill=0x5A, etcd_url=url)
            break
        except RuntimeError:
            time.sleep(0.2)
    assert target is not None
    agent = local_agent(unique("prefill"), "tcp", metadata=url)
    assert not agent.check_remote_metadata(name)
    agent.fetch_remote_metadata(name)
    assert agent.check_remote_metadata(name)
    dst = orbitte.Buffer(1 << 16)
    agent.register_memory(agent.get_reg_descs([dst]))
    h = agent.initialize_xfer("READ", agent.get_xfer_descs([(dst.address, 1 << 16, 0)], "DRAM"),
                              agent.get_xfer_descs([(target.address, 1 << 16, 0)], "DRAM"), name)
    agent.transfer(h)
    assert wait_state(agent, h) == "DONE", h.error
    assert bytes(dst.view) == b"\x5a" * (1 << 16)
    with pytest.raises(nixl.nixlNotFoundError):
        agent.fetch_remote_metadata(unique("nobody"))
    agent.close()


def test_without_etcd_metadata_server_calls_say_so():
    agent = local_agent(unique("solo"))
    with pytest.raises(nixl.nixlNotSupportedError, match="no metadata server"):
        agent.fetch_remote_metadata("someone")
    with pytest.raises(nixl.nixlNotSupportedError, match="listen thread"):
        agent.send_local_metadata("10.0.0.1", 5555)
    agent.close()


def test_vllm_shaped_calls_run_unchanged_under_orbitte_replace(spawn_agent):
    """docs/python.md's switch for vLLM's NixlConnector: ORBITTE_REPLACE=nixl,
    and a script making the connector's calls with NIXL's imports (the
    decode side READs blocks by prepared lists, then tells the prefill side
    with send_notif)."""
    import textwrap

    prefill = spawn_agent(unique("prefill"), size=64 * 4096, fill=0x42)
    script = textwrap.dedent(f"""
        import base64, time, uuid
        import numpy as np
        from nixl._api import nixl_agent as NixlWrapper
        from nixl._api import nixl_agent_config
        from nixl._bindings import nixlXferTelemetry

        config = nixl_agent_config(backends=["UCX"], capture_telemetry=True)
        wrapper = NixlWrapper(str(uuid.uuid4()), config)
        kv = np.zeros(64 * 4096, dtype=np.uint8)
        caches_data = [(kv.ctypes.data, kv.nbytes, 0, "")]
        descs = wrapper.get_reg_descs(caches_data, "DRAM")
        wrapper.register_memory(descs, backends=["UCX"])
        blocks_data = [(kv.ctypes.data + i * 4096, 4096, 0) for i in range(64)]
        src = wrapper.prep_xfer_dlist("NIXL_INIT_AGENT", wrapper.get_xfer_descs(blocks_data, "DRAM"))
        remote_agent = wrapper.add_remote_agent(base64.b64decode("{base64.b64encode(prefill.metadata).decode()}"))
        remote_blocks = [({prefill.address} + i * 4096, 4096, 0) for i in range(64)]
        dst = wrapper.prep_xfer_dlist(remote_agent, wrapper.get_xfer_descs(remote_blocks, "DRAM"))
        handle = wrapper.make_prepped_xfer("READ", src, np.arange(0, 64, 2), dst, np.arange(1, 64, 2),
                                           notif_msg=b"req-1")
        status = wrapper.transfer(handle)
        deadline = time.time() + 30
        while status == "PROC" and time.time() < deadline:
            status = wrapper.check_xfer_state(handle)
        assert status == "DONE", (status, handle.error)
        telemetry = wrapper.get_xfer_telemetry(handle)
        assert isinstance(telemetry, nixlXferTelemetry) and telemetry.totalBytes == 32 * 4096
        assert telemetry.descCount == 32  # no two blocks adjacent on both sides: none merged
        wrapper.release_xfer_handle(handle)
        assert (kv.reshape(64, 4096)[0::2] == 0x42).all() and (kv.reshape(64, 4096)[1::2] == 0).all()
        wrapper.send_notif(remote_agent, notif_msg=b"done:req-1")
        wrapper.remove_remote_agent(remote_agent.decode())
        print(type(wrapper).__module__, wrapper.name)
    """)
    env = dict(os.environ, ORBITTE_REPLACE="nixl")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    module, name = out.stdout.split()
    assert module == "orbitte.nixl"
    got = json.loads(prefill.ask("notifs 0.5"))
    assert got == {name: [b"req-1".hex(), b"done:req-1".hex()]}
