"""A Mooncake user's script, as a deployment runs it: it imports Mooncake's
module and nothing of OrbitTE's (ORBITTE_REPLACE=mooncake decides which
engine runs).

    python deployed_mooncake.py target SIZE
        prints {"session", "address", "module"}, then answers "sha" with the
        sha256 of its buffer, until "quit"
    python deployed_mooncake.py initiator SESSION ADDRESS SIZE
        fills a buffer with a pattern, writes it to ADDRESS at SESSION with
        batch_transfer_sync_write, prints {"rc", "sha", "module"}
"""

import hashlib
import json
import sys

from child_memory import answer_sha, buffer
from mooncake.engine import TransferEngine


def engine() -> TransferEngine:
    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise SystemExit(f"initialize returned {rc}")
    return te


def main() -> None:
    role = sys.argv[1]
    te = engine()
    module = type(te).__module__
    if role == "target":
        size = int(sys.argv[2])
        mem, address = buffer(size, b"\0")
        assert te.register_memory(address, size) == 0
        print(json.dumps({"session": f"127.0.0.1:{te.get_rpc_port()}", "address": address, "module": module}),
              flush=True)
        answer_sha(mem)
    else:
        session, peer, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        mem, address = buffer(size, bytes(range(251)) * 4)
        assert te.register_memory(address, size) == 0
        rc = te.batch_transfer_sync_write(session, [address], [peer], [size])
        print(json.dumps({"rc": rc, "sha": hashlib.sha256(bytes(mem)).hexdigest(), "module": module}), flush=True)


if __name__ == "__main__":
    main()
