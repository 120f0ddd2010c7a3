"""A NIXL user's script, as a deployment runs it: NIXL's imports (the ones
vLLM and SGLang make) and nothing of OrbitTE's (ORBITTE_REPLACE=nixl
decides which engine runs).

    python deployed_nixl.py target NAME SIZE
        registers SIZE bytes, prints {"metadata" (base64), "address",
        "module"}, then answers "wait TAG" with the sha256 of its buffer once
        a notification starting with TAG came ("none" after 30 s), until
        "quit"
    python deployed_nixl.py initiator NAME META_B64 ADDRESS SIZE
        WRITEs a pattern to ADDRESS of the agent in the metadata, by prepared
        lists of 4 KiB blocks, with notification b"done"; prints {"state",
        "sha", "module", "sync"}
"""

import base64
import hashlib
import json
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t
from nixl._bindings import nixlRemoteDisconnectError  # noqa: F401 (SGLang imports it)

BLOCK = 4096


def main() -> None:
    role, name = sys.argv[1], sys.argv[2]
    config = nixl_agent_config(backends=[], sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    agent = nixl_agent(name, config)
    agent.create_backend("UCX", {"num_threads": "1"})
    module = type(agent).__module__
    if role == "target":
        size = int(sys.argv[3])
        kv = np.zeros(size, dtype=np.uint8)
        agent.register_memory([(kv.ctypes.data, size, 0, "")], "DRAM")
        print(json.dumps({"metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                          "address": kv.ctypes.data, "module": module}), flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd and cmd[0] == "wait":
                deadline = time.time() + 30
                while time.time() < deadline:
                    if any(m.startswith(cmd[1].encode()) for ms in agent.get_new_notifs().values() for m in ms):
                        print(hashlib.sha256(kv.tobytes()).hexdigest(), flush=True)
                        break
                    time.sleep(0.005)
                else:
                    print("none", flush=True)
            elif cmd and cmd[0] == "quit":
                break
    else:
        meta, peer, size = base64.b64decode(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        kv = np.frombuffer(bytes(range(251)) * (size // 251 + 1), dtype=np.uint8)[:size].copy()
        agent.register_memory([(kv.ctypes.data, size, 0, "")], "DRAM")
        remote = agent.add_remote_agent(meta)
        n = size // BLOCK
        src = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(kv.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(n)],
                                    "DRAM")
        dst = agent.prep_xfer_dlist(remote, [(peer + i * BLOCK, BLOCK, 0) for i in range(n)], "DRAM")
        handle = agent.make_prepped_xfer("WRITE", src, np.arange(n), dst, np.arange(n), b"done")
        state = agent.transfer(handle)
        deadline = time.time() + 30
        while state == "PROC" and time.time() < deadline:
            state = agent.check_xfer_state(handle)
        print(json.dumps({"state": state, "sha": hashlib.sha256(kv.tobytes()).hexdigest(), "module": module,
                          "sync": type(config.sync_mode).__module__}), flush=True)


if __name__ == "__main__":
    main()
