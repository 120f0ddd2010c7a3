"""Two real processes: tcp and local paths, both APIs, a dead peer, a
process killed mid-transfer."""

import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orbitte
from orbitte.mooncake import TransferEngine


def sha(b) -> str:
    return hashlib.sha256(bytes(b)).hexdigest()


@pytest.mark.parametrize("path", ["tcp", "local"])
def test_engine_api_between_processes(spawn_target, path):
    target = spawn_target("engine", size=1 << 20, fill=0x11)
    with orbitte.Engine(path=path) as eng:
        src = eng.alloc(1 << 20)
        src.view[:] = os.urandom(1 << 20)
        reg = eng.register(src, remote=False)
        peer = eng.connect(target.session)
        assert peer.path == path, peer.fell_back
        assert peer.ranges[0].address == target.address
        eng.submit(peer, [orbitte.write(reg, peer.range(0), 1 << 19, remote_offset=1 << 19)]).wait()
        assert target.ask(f"sha {1 << 19} {1 << 19}") == sha(src.view[: 1 << 19])
        assert target.ask(f"sha 0 {1 << 19}") == sha(b"\x11" * (1 << 19))
        # READ back what the target holds.
        dst = eng.alloc(1 << 20)
        dreg = eng.register(dst, remote=False)
        eng.transfer(peer, [orbitte.read(dreg, peer.range(0))])
        assert sha(dst.view) == sha(b"\x11" * (1 << 19) + bytes(src.view[: 1 << 19]))


def test_mooncake_api_between_processes(spawn_target):
    target = spawn_target("mooncake", size=1 << 20)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8).copy()
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    blocks = 256
    rc = te.batch_transfer_sync_write(
        target.session,
        [src.ctypes.data + i * 4096 for i in range(blocks)],
        [target.address + i * 4096 for i in range(blocks)],
        [4096] * blocks,
    )
    assert rc == 0, te.last_error()
    assert target.ask(f"sha 0 {blocks * 4096}") == sha(src[: blocks * 4096])
    te.close()


def test_mooncake_style_script_runs_with_only_the_import_changed(spawn_target, tmp_path):
    """The quick-start script of Mooncake's Python docs, with its import
    switched to orbitte.mooncake, as a separate process."""
    target = spawn_target("mooncake", size=1 << 20)
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        from orbitte.mooncake import TransferEngine  # was: from mooncake.engine import TransferEngine

        HOSTNAME = "localhost"
        METADATA_SERVER = "P2PHANDSHAKE"
        PROTOCOL = "tcp"
        DEVICE_NAME = ""

        client_engine = TransferEngine()
        client_engine.initialize(HOSTNAME, METADATA_SERVER, PROTOCOL, DEVICE_NAME)
        session_id = "{target.session}"
        client_buffer = np.ones(1024 * 1024, dtype=np.uint8)
        client_ptr = client_buffer.ctypes.data
        client_len = client_buffer.nbytes
        ret = client_engine.register_memory(client_ptr, client_len)
        if ret != 0:
            raise RuntimeError("Mooncake memory registration failed.")
        server_ptr = {target.address}
        for i in range(3):
            ret = client_engine.transfer_sync_write(session_id, client_ptr, server_ptr, client_len)
            if ret < 0:
                raise RuntimeError(f"transfer failed: {{client_engine.last_error()}}")
        client_buffer[:] = 0
        ret = client_engine.transfer_sync_read(session_id, client_ptr, server_ptr, client_len)
        assert ret == 0 and client_buffer.all()
        client_engine.unregister_memory(client_ptr)
        print("ok")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert target.ask(f"sha 0 {1 << 20}") == sha(b"\x01" * (1 << 20))


def test_dead_peer_gives_a_negative_code_and_no_hang(spawn_target):
    target = spawn_target("mooncake", size=1 << 16)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.zeros(1 << 16, dtype=np.uint8)
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    assert te.transfer_sync_write(target.session, src.ctypes.data, target.address, 4096) == 0
    target.proc.kill()
    target.proc.wait()
    rcs = [te.transfer_sync_write(target.session, src.ctypes.data, target.address, 4096) for _ in range(3)]
    assert all(rc < 0 for rc in rcs), rcs
    assert te.last_error().message
    te.close()


def test_killed_initiator_leaves_the_target_serving(spawn_target):
    target = spawn_target("mooncake", size=4 << 20)
    # An initiator process that writes in a loop until it is killed.
    loop = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import numpy as np, sys
        from orbitte.mooncake import TransferEngine
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        src = np.full(4 << 20, 7, dtype=np.uint8)
        assert te.register_memory(src.ctypes.data, src.nbytes) == 0
        print("started", flush=True)
        while True:
            te.transfer_sync_write("{target.session}", src.ctypes.data, {target.address}, src.nbytes)
    """)], stdout=subprocess.PIPE, text=True)
    assert loop.stdout.readline().strip() == "started"
    loop.send_signal(signal.SIGKILL)
    loop.wait()
    # Another initiator is served as before.
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.full(1 << 20, 9, dtype=np.uint8)
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    assert te.transfer_sync_write(target.session, src.ctypes.data, target.address, src.nbytes) == 0, te.last_error()
    assert target.ask(f"sha 0 {1 << 20}") == sha(b"\x09" * (1 << 20))
    te.close()


def test_a_mooncake_import_shim_switches_an_unchanged_script(spawn_target, tmp_path):
    """docs/python.md's switch for SGLang/vLLM: a `mooncake.engine` module
    that re-exports orbitte.mooncake, and a script whose import is Mooncake's."""
    target = spawn_target("mooncake", size=1 << 16)
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "__init__.py").write_text("")
    (tmp_path / "mooncake" / "engine.py").write_text(
        "from orbitte.mooncake import TransferEngine, TransferOpcode, TransferNotify  # noqa: F401\n")
    script = textwrap.dedent(f"""
        import numpy as np
        from mooncake.engine import TransferEngine
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        buf = np.full(4096, 3, dtype=np.uint8)
        assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
        assert te.batch_transfer_sync_write("{target.session}", [buf.ctypes.data], [{target.address}], [4096]) == 0
        print(type(te).__module__)
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "orbitte.mooncake"
    assert target.ask("sha 0 4096") == sha(b"\x03" * 4096)


def test_target_killed_mid_transfer_gives_a_negative_code_with_the_outcome(spawn_target):
    import threading

    target = spawn_target("mooncake", size=32 << 20)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.full(32 << 20, 1, dtype=np.uint8)
    assert te.register_memory(src.ctypes.data, src.nbytes) == 0
    assert te.transfer_sync_write(target.session, src.ctypes.data, target.address, 4096) == 0
    rcs, errors, started = [], [], threading.Event()

    def writer() -> None:
        started.set()
        for _ in range(200):
            rc = te.batch_transfer_sync_write(target.session, [src.ctypes.data + i * (1 << 20) for i in range(32)],
                                              [target.address + i * (1 << 20) for i in range(32)], [1 << 20] * 32)
            rcs.append(rc)
            if rc != 0:
                errors.append(te.last_error())
                return

    t = threading.Thread(target=writer)
    t.start()
    started.wait()
    target.proc.kill()
    target.proc.wait()
    t.join(60)
    assert not t.is_alive(), "a transfer to a dead target must end"
    assert rcs and rcs[-1] < 0
    err = errors[0]
    assert err.message
    if err.outcomes:  # the batch ran: every outcome says how far it got
        assert any(o.status != "complete" for o in err.outcomes)
        for o in err.outcomes:
            assert o.remote_effect in ("none", "possible", "complete") and o.drain == "drained"
    te.close()
