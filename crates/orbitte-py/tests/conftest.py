import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


class Child:
    """A process of this test suite driven over stdin/stdout: it prints one
    JSON line (``info``), then answers one line per command."""

    def __init__(self, cmd: list, env: dict | None = None):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{Path(cmd[1]).name} exited with {self.proc.wait()}")
        self.info = json.loads(line)

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class Target(Child):
    """A target in a child process (target_process.py)."""

    def __init__(self, api: str, size: int, fill: int = 0):
        super().__init__([sys.executable, str(HERE / "target_process.py"), "--api", api, "--size", str(size),
                          "--fill", str(fill)])
        info = self.info
        self.session = info["session"]
        self.address = info["address"]
        self.length = info["length"]
        self.pid = info["pid"]


@pytest.fixture
def spawn_target():
    targets = []

    def make(api: str = "mooncake", size: int = 1 << 20, fill: int = 0) -> Target:
        t = Target(api, size, fill)
        targets.append(t)
        return t

    yield make
    for t in targets:
        t.close()


@pytest.fixture
def mooncake_pair():
    """A target and an initiator Mooncake engine in this process, each with
    1 MiB registered (numpy)."""
    np = pytest.importorskip("numpy")
    from orbitte.mooncake import TransferEngine

    target, initiator = TransferEngine(), TransferEngine()
    assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, target.last_error()
    assert initiator.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, initiator.last_error()
    dst = np.zeros(1 << 20, dtype=np.uint8)
    src = (np.arange(1 << 20, dtype=np.uint64) * 7 % 251).astype(np.uint8)
    assert target.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert initiator.register_memory(src.ctypes.data, src.nbytes) == 0
    session = f"127.0.0.1:{target.get_rpc_port()}"
    yield target, initiator, session, src, dst
    initiator.close()
    target.close()


def in_ci() -> bool:
    return os.environ.get("CI") == "true"
