"""An outsider in its own process: an engine that tries to open a target
it was not let into, then to read, write and notify it.

    python outsider_process.py ADDRESS [--source-id ID] [--token HEX]

Takes the cluster secret from ORBITTE_SECRET_FILE when that is set (as
every engine does). Prints one JSON line: {"connected", "error", "read",
"wrote", "notified"}: what it managed.
"""

import argparse
import json

import orbitte


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--source-id", default=None)
    ap.add_argument("--token", default=None)
    args = ap.parse_args()
    done = {"connected": False, "error": "", "read": False, "wrote": False, "notified": False}
    eng = orbitte.Engine(args.source_id, path="tcp", handshake_timeout=2.0, request_timeout=3.0)
    try:
        peer = eng.connect(args.address, args.token)
        done["connected"] = True
        rng = peer.range(0)
        n = min(4096, rng.length)
        sink = eng.alloc(n)
        reg = eng.register(sink, remote=False)
        eng.transfer(peer, [orbitte.read(reg, rng, n)])
        done["read"] = True
        sink.view[:] = b"\xee" * n
        eng.transfer(peer, [orbitte.write(reg, rng, n)], notify=b"forged")
        done["wrote"] = True
        done["notified"] = True
    except orbitte.Error as e:
        done["error"] = str(e)
    finally:
        eng.close()
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
