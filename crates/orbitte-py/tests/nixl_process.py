"""A NIXL agent (orbitte.nixl) in its own process, driven over stdin/stdout.

    python nixl_process.py --name NAME --size N [--fill B] [--etcd URL]

Registers N bytes of orbitte.Buffer memory (memfd: same-host peers can use
the local path) filled with B, then prints one JSON line: {"name",
"metadata" (base64 of get_agent_metadata()), "address", "length", "pid"}.
Then reads commands, one per line, answering one line each:
    sha OFF LEN             sha256 hex of the registered memory at OFF
    add META_B64            add_remote_agent: the name it returns
    notif_sha NAME TAG T OFF LEN
                            waits up to T s for a notification from NAME
                            starting with TAG (check_remote_xfer_done), then
                            at once the sha256 of OFF..OFF+LEN: "yes SHA",
                            or "no"
    notifs T                waits T s, then every notification that came, as
                            JSON {name: [hex, ...]}
    send_notif NAME HEX     send_notif: "ok" or the exception's class name
    deregister              deregister_memory of the registered memory: "ok"
    quit
"""

import argparse
import base64
import hashlib
import json
import os
import sys
import time

import orbitte
from orbitte import nixl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--fill", type=int, default=0)
    ap.add_argument("--etcd", default=None)
    args = ap.parse_args()
    agent = nixl.nixl_agent(args.name, nixl.nixl_agent_config(listen="127.0.0.1:0", metadata=args.etcd))
    buf = orbitte.Buffer(args.size)
    buf.view[:] = bytes([args.fill]) * args.size
    descs = agent.register_memory(agent.get_reg_descs([buf]))
    print(json.dumps({"name": args.name, "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                      "address": buf.address, "length": args.size, "pid": os.getpid()}), flush=True)
    view = buf.view
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "sha":
            off, n = int(cmd[1]), int(cmd[2])
            print(hashlib.sha256(view[off:off + n]).hexdigest(), flush=True)
        elif cmd[0] == "add":
            print(agent.add_remote_agent(base64.b64decode(cmd[1])).decode(), flush=True)
        elif cmd[0] == "notif_sha":
            name, tag, t, off, n = cmd[1], cmd[2].encode(), float(cmd[3]), int(cmd[4]), int(cmd[5])
            deadline = time.time() + t
            found = False
            while not found and time.time() < deadline:
                found = agent.check_remote_xfer_done(name, tag)
                if not found:
                    time.sleep(0.001)
            digest = hashlib.sha256(view[off:off + n]).hexdigest() if found else ""
            print(f"yes {digest}" if found else "no", flush=True)
        elif cmd[0] == "notifs":
            time.sleep(float(cmd[1]))
            got = agent.update_notifs()
            print(json.dumps({k: [m.hex() for m in v] for k, v in got.items() if v}), flush=True)
            agent.notifs.clear()
        elif cmd[0] == "send_notif":
            try:
                agent.send_notif(cmd[1], bytes.fromhex(cmd[2]))
                print("ok", flush=True)
            except nixl.nixlError as e:
                print(type(e).__name__, flush=True)
        elif cmd[0] == "deregister":
            agent.deregister_memory(descs)
            print("ok", flush=True)
        else:
            print(f"unknown command {cmd[0]}", flush=True)
    agent.close()


if __name__ == "__main__":
    main()
