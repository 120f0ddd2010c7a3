"""etcd metadata: engines store their record under their local_hostname and
peers name them by it, as with Mooncake's etcd metadata."""

import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

from conftest import in_ci
from orbitte.mooncake import TransferEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd():
    if shutil.which("etcd") is None:
        if in_ci():
            pytest.fail("CI must run the etcd test: etcd not installed (apt-get install etcd-server)")
        pytest.skip("etcd not installed")
    client, peer = free_port(), free_port()
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            ["etcd", "--name", "orbitte-py-test", "--data-dir", d, "--listen-client-urls", c,
             "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
             "--initial-cluster", f"orbitte-py-test={p}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", client), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            yield f"127.0.0.1:{client}"
        finally:
            proc.kill()
            proc.wait()


def test_peers_found_by_name_through_etcd(etcd):
    target, initiator = TransferEngine(), TransferEngine()
    for _ in range(100):  # etcd may take a moment to answer after its port opens
        rc = target.initialize("decode-0", f"etcd://{etcd}/orbitte/py-test", "tcp", "")
        if rc == 0:
            break
        time.sleep(0.2)
    assert rc == 0, target.last_error()
    assert initiator.initialize("prefill-0", f"etcd://{etcd}/orbitte/py-test", "tcp", "") == 0, initiator.last_error()
    dst = np.zeros(1 << 16, dtype=np.uint8)
    src = np.full(1 << 16, 5, dtype=np.uint8)
    assert target.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert initiator.register_memory(src.ctypes.data, src.nbytes) == 0
    assert initiator.transfer_sync_write("decode-0", src.ctypes.data, dst.ctypes.data, 4096) == 0, initiator.last_error()
    assert (dst[:4096] == 5).all()
    assert initiator.transfer_sync_write("nobody-0", src.ctypes.data, dst.ctypes.data, 4096) < 0
    assert "nobody-0" in initiator.last_error().message
    initiator.close()
    target.close()
