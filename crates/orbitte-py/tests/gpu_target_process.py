"""GPU memory that peers READ and WRITE, in its own process: run by
test_gpu_target.py with LD_LIBRARY_PATH starting with orbitte-cuda's fake
libcuda (as gpu_stub_guest.py is; its Stub allocates and reads the
"device" memory, which this process cannot touch).

    python gpu_target_process.py --size N

Allocates two device ranges of N bytes: one registered as NIXL "VRAM" by an
agent, one by orbitte.mooncake's register_memory (a device pointer). Prints
one JSON line: {"nixl_metadata" (base64), "nixl_name", "vram", "mooncake"
(the session address), "device" (the Mooncake range's device pointer),
"report" (describe_memory of it)}. Then reads commands, one per line, and
answers each with one line:
    put WHICH SEED          fills range WHICH ("vram" or "mooncake") with
                            pattern(N, SEED) through the driver: "ok"
    sha WHICH OFF LEN       sha256 hex of the device bytes at OFF, read
                            through the driver
    fail_syncs 0|1          the stub's control: every stream wait fails
    quit
"""

import argparse
import base64
import hashlib
import json
import os
import sys

from gpu_stub_guest import Stub, pattern
from orbitte import nixl
from orbitte.mooncake import TransferEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1 << 20)
    args = ap.parse_args()
    stub = Stub(os.environ["ORBITTE_STUB_LIBCUDA"])
    ranges = {"vram": stub.alloc(args.size), "mooncake": stub.alloc(args.size)}
    for which, seed in (("vram", 1), ("mooncake", 2)):
        stub.upload(ranges[which], pattern(args.size, seed))

    agent = nixl.nixl_agent(f"gpu-target-{os.getpid()}",
                            nixl.nixl_agent_config(listen="127.0.0.1:0", rdma=False))
    descs = agent.register_memory([(ranges["vram"], args.size, 0, "kv")], "VRAM")
    assert descs.getType() == "VRAM_SEG"

    mooncake = TransferEngine()
    assert mooncake.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, mooncake.last_error()
    assert mooncake.register_memory(ranges["mooncake"], args.size) == 0, mooncake.last_error()

    print(json.dumps({"nixl_metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
                      "nixl_name": agent.name, "vram": ranges["vram"],
                      "mooncake": f"127.0.0.1:{mooncake.get_rpc_port()}", "device": ranges["mooncake"],
                      "report": mooncake.describe_memory(ranges["mooncake"])}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "put":
            stub.upload(ranges[cmd[1]], pattern(args.size, int(cmd[2])))
            print("ok", flush=True)
        elif cmd[0] == "sha":
            off, n = int(cmd[2]), int(cmd[3])
            print(hashlib.sha256(stub.download(ranges[cmd[1]] + off, n).tobytes()).hexdigest(), flush=True)
        elif cmd[0] == "fail_syncs":
            stub.fail_syncs(cmd[1] == "1")
            print("ok", flush=True)
        else:
            print(f"unknown command {cmd[0]}", flush=True)
    agent.close()
    mooncake.close()


if __name__ == "__main__":
    main()
