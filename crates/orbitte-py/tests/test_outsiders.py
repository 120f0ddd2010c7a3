"""Nobody reads, writes, notifies or fences an engine that did not let
them in: an outsider in a second process (outsider_process.py) against
each API's engine, bytes checked unchanged; the same outsider given the
key (the metadata's token, the cluster secret) gets in."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import orbitte
from orbitte import nixl
from orbitte.mooncake import TransferEngine

HERE = Path(__file__).parent
SIZE = 64 << 10
FILL = b"\x5a" * SIZE


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


def outsider(address: str, *, token=None, source_id=None, secret_file=None) -> dict:
    cmd = [sys.executable, str(HERE / "outsider_process.py"), address]
    if token:
        cmd += ["--token", token]
    if source_id:
        cmd += ["--source-id", source_id]
    env = dict(os.environ)
    env.pop("ORBITTE_SECRET_FILE", None)
    if secret_file:
        env["ORBITTE_SECRET_FILE"] = str(secret_file)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def kept_out(done: dict) -> None:
    assert not done["connected"], done
    assert not (done["read"] or done["wrote"] or done["notified"]), done
    assert "authentication" in done["error"] or "proof" in done["error"], done


def let_in(done: dict) -> None:
    assert done["connected"] and done["read"] and done["wrote"] and done["notified"], done


@pytest.fixture
def secret_file(tmp_path):
    p = tmp_path / "secret"
    p.write_bytes(os.urandom(32))
    return p


@pytest.fixture
def no_env_secret(monkeypatch):
    monkeypatch.delenv("ORBITTE_SECRET_FILE", raising=False)


def test_a_nixl_agent_is_closed_with_no_setting(no_env_secret):
    victim = nixl.nixl_agent(unique("decode"), nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    buf = orbitte.Buffer(SIZE)
    buf.view[:] = FILL
    victim.register_memory(victim.get_reg_descs([buf]))
    meta = json.loads(victim.get_agent_metadata())
    real_peer = unique("prefill")

    # Never given the metadata: no READ, no WRITE, no notification, and a
    # hello under a real peer's name fences nobody out.
    kept_out(outsider(meta["address"]))
    kept_out(outsider(meta["address"], source_id=real_peer))
    assert bytes(buf.view) == FILL
    assert victim.get_new_notifs() == {}
    assert not victim.check_remote_xfer_done(real_peer, b"forged")

    # The real peer, handed the metadata, still gets in and notifies.
    peer = nixl.nixl_agent(real_peer, nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False, path="tcp"))
    src = orbitte.Buffer(SIZE)
    src.view[:] = b"\x01" * SIZE
    peer.register_memory(peer.get_reg_descs([src]))
    peer.add_remote_agent(victim.get_agent_metadata())
    h = peer.initialize_xfer("WRITE", peer.get_xfer_descs([(src.address, SIZE, 0)], "DRAM"),
                             peer.get_xfer_descs([(buf.address, SIZE, 0)], "DRAM"), victim.name, b"real")
    peer.transfer(h)
    deadline = time.time() + 30
    while peer.check_xfer_state(h) == "PROC" and time.time() < deadline:
        time.sleep(0.001)
    assert peer.check_xfer_state(h) == "DONE", h.error
    assert bytes(buf.view) == src.view[:]
    deadline = time.time() + 10
    arrived = victim.check_remote_xfer_done(real_peer, b"real")
    while not arrived and time.time() < deadline:
        time.sleep(0.01)
        arrived = victim.check_remote_xfer_done(real_peer, b"real")
    assert arrived

    # The metadata's token is the key: the same outsider with it gets in.
    buf.view[:] = FILL
    let_in(outsider(meta["address"], token=meta["token"]))
    assert bytes(buf.view[:4096]) == b"\xee" * 4096
    peer.close()
    victim.close()


def test_relabelled_empty_and_own_metadata_are_refused(no_env_secret):
    a = nixl.nixl_agent(unique("a"), nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    b = nixl.nixl_agent(unique("b"), nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    c = nixl.nixl_agent(unique("c"), nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    doc = json.loads(b.get_agent_metadata())
    with pytest.raises(nixl.nixlMismatchError, match="describes engine"):
        c.add_remote_agent(json.dumps(dict(doc, name=a.name)).encode())
    with pytest.raises(nixl.nixlInvalidParamError, match="empty name"):
        c.add_remote_agent(json.dumps(dict(doc, name="")).encode())
    with pytest.raises(nixl.nixlInvalidParamError, match="this agent itself"):
        c.add_remote_agent(json.dumps(dict(doc, name=c.name)).encode())
    # Another engine's token does not open b.
    other = json.loads(a.get_agent_metadata())["token"]
    with pytest.raises(nixl.nixlRemoteDisconnectError, match="proof"):
        c.add_remote_agent(json.dumps(dict(doc, token=other)).encode())
    with pytest.raises(nixl.nixlMismatchError, match="token"):
        c.add_remote_agent(json.dumps({k: v for k, v in doc.items() if k != "token"}).encode())
    # Deeply nested metadata is a mismatch, not a RecursionError.
    with pytest.raises(nixl.nixlMismatchError):
        c.add_remote_agent(b"[" * 100000)
    assert c.add_remote_agent(b.get_agent_metadata()) == b.name.encode()
    for x in (a, b, c):
        x.close()


def engine_target(**kw):
    eng = orbitte.Engine(listen="127.0.0.1:0", **kw)
    buf = eng.alloc(SIZE)
    buf.view[:] = FILL
    eng.register(buf)
    return eng, buf


def test_an_engine_with_a_cluster_secret_admits_only_holders(no_env_secret, secret_file):
    eng, buf = engine_target(cluster_secret_file=str(secret_file))
    kept_out(outsider(eng.address))
    kept_out(outsider(eng.address, source_id="some-peer"))
    assert bytes(buf.view) == FILL
    assert eng.notifications() == []
    let_in(outsider(eng.address, secret_file=secret_file))
    assert bytes(buf.view[:4096]) == b"\xee" * 4096
    eng.close()


def test_an_engine_with_a_listener_token_admits_only_holders(no_env_secret):
    eng, buf = engine_target(listener_token=True)
    assert len(eng.token) == 64
    kept_out(outsider(eng.address))
    assert bytes(buf.view) == FILL
    let_in(outsider(eng.address, token=eng.token))
    eng.close()


def test_the_environment_variable_closes_engines_built_without_a_setting(monkeypatch, secret_file):
    monkeypatch.setenv("ORBITTE_SECRET_FILE", str(secret_file))
    eng, buf = engine_target()
    kept_out(outsider(eng.address))
    let_in(outsider(eng.address, secret_file=secret_file))
    eng.close()


def test_a_mooncake_engine_with_the_secret_admits_only_holders(monkeypatch, secret_file):
    import ctypes

    monkeypatch.setenv("ORBITTE_SECRET_FILE", str(secret_file))
    te = TransferEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("error", orbitte.OpenEngineWarning)
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    mem = bytearray(FILL)
    pin = (ctypes.c_char * SIZE).from_buffer(mem)
    assert te.register_memory(ctypes.addressof(pin), SIZE) == 0, te.last_error()
    session = f"127.0.0.1:{te.get_rpc_port()}"
    kept_out(outsider(session))
    assert bytes(mem) == FILL
    let_in(outsider(session, secret_file=secret_file))
    assert bytes(mem[:4096]) == b"\xee" * 4096


def test_an_open_engine_beyond_loopback_warns_and_a_closed_one_does_not(no_env_secret):
    with pytest.warns(orbitte.OpenEngineWarning, match="ORBITTE_SECRET_FILE"):
        e = orbitte.Engine(listen="0.0.0.0:0")
    e.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", orbitte.OpenEngineWarning)
        orbitte.Engine(listen="0.0.0.0:0", listener_token=True).close()
        orbitte.Engine(listen="127.0.0.1:0").close()
        a = nixl.nixl_agent(unique("quiet"), nixl.nixl_agent_config(rdma=False))
        a.close()
    with pytest.warns(orbitte.OpenEngineWarning):
        te = TransferEngine()
        assert te.initialize("0.0.0.0", "P2PHANDSHAKE", "tcp", "") == 0
