"""A target (or initiator) in its own process, driven over stdin/stdout.

    python target_process.py --api mooncake|engine --size N [--fill B]

Prints one JSON line: {"session", "address", "length", "pid"}. Then reads
commands, one per line, answering one line each:
    sha OFF LEN      sha256 hex of the published memory at OFF
    wait_notify T    the next notification (engine: SOURCE PATH PAYLOAD_HEX;
                     mooncake: NAME MSG) or "none" after T seconds
    fill OFF LEN B   sets the bytes to B
    write SESSION ADDR LEN B   (mooncake api) fills a local buffer with B and
                     batch_transfer_sync_write's it to ADDR at SESSION: rc
    quit
"""

import argparse
import hashlib
import json
import sys

import orbitte
from orbitte.mooncake import TransferEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", choices=["mooncake", "engine"], default="mooncake")
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--fill", type=int, default=0)
    args = ap.parse_args()
    if args.api == "mooncake":
        te = TransferEngine()
        rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
        assert rc == 0, te.last_error()
        mem = bytearray([args.fill]) * args.size
        import ctypes

        pin = (ctypes.c_char * args.size).from_buffer(mem)
        address = ctypes.addressof(pin)
        assert te.register_memory(address, args.size) == 0, te.last_error()
        scratch = bytearray(args.size)
        spin = (ctypes.c_char * args.size).from_buffer(scratch)
        assert te.register_memory(ctypes.addressof(spin), args.size) == 0
        session = f"127.0.0.1:{te.get_rpc_port()}"
        view = memoryview(mem)
    else:
        eng = orbitte.Engine(listen="127.0.0.1:0")
        buf = eng.alloc(args.size)
        buf.view[:] = bytes([args.fill]) * args.size
        eng.register(buf)
        address = buf.address
        session = eng.address
        view = buf.view
    print(json.dumps({"session": session, "address": address, "length": args.size,
                      "pid": __import__("os").getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "sha":
            off, n = int(cmd[1]), int(cmd[2])
            print(hashlib.sha256(view[off:off + n]).hexdigest(), flush=True)
        elif cmd[0] == "fill":
            off, n, b = int(cmd[1]), int(cmd[2]), int(cmd[3])
            view[off:off + n] = bytes([b]) * n
            print("ok", flush=True)
        elif cmd[0] == "wait_notify":
            if args.api == "engine":
                n = eng.wait_notification(float(cmd[1]))
                print("none" if n is None else f"{n.source_id} {n.path} {n.payload.hex()}", flush=True)
            else:
                import time

                deadline = time.time() + float(cmd[1])
                got = []
                while not got and time.time() < deadline:
                    got = te.get_notifies()
                    time.sleep(0.01)
                print("none" if not got else f"{got[0].name} {got[0].msg}", flush=True)
        elif cmd[0] == "write":
            sess, addr, n, b = cmd[1], int(cmd[2]), int(cmd[3]), int(cmd[4])
            local = ctypes.addressof(spin)
            scratch[:n] = bytes([b]) * n
            rc = te.batch_transfer_sync_write(sess, [local], [addr], [n])
            print(rc, flush=True)
        else:
            print(f"unknown command {cmd[0]}", flush=True)


if __name__ == "__main__":
    main()
