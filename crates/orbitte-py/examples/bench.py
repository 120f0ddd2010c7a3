"""``python crates/orbitte-py/examples/bench.py``: what the Python layer costs.

Moves the same blocks three ways, in one run, between two engines of this
process over one path (tcp by default, as ``orbitte bench`` loops back):

- **python**: ``orbitte.mooncake.TransferEngine.batch_transfer_sync_write``
  called in a Python loop (what SGLang/vLLM do), 1 and 8 threads;
- **rust**: the same batch repeated by the engine in a Rust loop
  (``MooncakeEngine.repeat_batch``, GIL released), 1 and 8 threads;
- **orbitte bench**: the command-line bench with the same block size, batch
  size, threads and path, when the ``orbitte`` binary is found (``--orbitte``,
  ``$ORBITTE_BIN`` or ``PATH``).

Default cases: 1,024 x 4 KiB and 16 x 1 MiB per batch. Figures are GB/s
(10^9 bytes per second) of payload; ``python/rust`` is the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
from typing import Optional

from orbitte.mooncake import TransferEngine

CASES = [(1024, 4 << 10), (16, 1 << 20)]


def _engines(path: str, size: int):
    os.environ["ORBITTE_PATH"] = path
    target, initiator = TransferEngine(), TransferEngine()
    for te in (target, initiator):
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise SystemExit(f"initialize failed: {te.last_error()}")
    # Managed buffers are memfd memory: the local path can map them.
    dst = target.allocate_managed_buffer(size)
    src = initiator.allocate_managed_buffer(size)
    if not dst or not src:
        raise SystemExit(f"allocation of {size} bytes failed: {target.last_error() or initiator.last_error()}")
    return target, initiator, f"127.0.0.1:{target.get_rpc_port()}", src, dst


def _run_threads(threads: int, fn) -> float:
    """Bytes moved by `threads` threads each running fn(thread) -> bytes."""
    out = [0] * threads
    start = threading.Barrier(threads)

    def go(t: int) -> None:
        start.wait()
        out[t] = fn(t)

    ts = [threading.Thread(target=go, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(out)


def measure(path: str, batch: int, block: int, threads: int, seconds: float, rounds: int = 3) -> dict:
    per_thread = batch * block
    target, initiator, session, src, dst = _engines(path, per_thread * threads)
    native = initiator._engine()
    lens = [block] * batch

    def addrs(t: int):
        base = t * per_thread
        return ([src + base + i * block for i in range(batch)],
                [dst + base + i * block for i in range(batch)])

    # Warm up (connect, first registration lookups).
    l0, r0 = addrs(0)
    if initiator.batch_transfer_sync_write(session, l0, r0, lens) != 0:
        raise SystemExit(f"warm-up failed: {initiator.last_error()}")

    def python_loop(t: int) -> int:
        ls, rs = addrs(t)
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            if initiator.batch_transfer_sync_write(session, ls, rs, lens) != 0:
                raise RuntimeError(str(initiator.last_error()))
            n += 1
        return n * per_thread

    def rust_loop(t: int) -> int:
        ls, rs = addrs(t)
        n, _ = native.repeat_batch(session, True, ls, rs, lens, seconds)
        return n * per_thread

    def rate(loop) -> float:
        t0 = time.perf_counter()
        moved = _run_threads(threads, loop)
        return moved / (time.perf_counter() - t0) / 1e9

    # Alternate the two loops and keep the best round of each, so a burst
    # of other load on the machine does not count against one side only.
    py = rs = 0.0
    for _ in range(rounds):
        py = max(py, rate(python_loop))
        rs = max(rs, rate(rust_loop))
    path_used = native.connect(session).path
    initiator.close()
    target.close()
    return {"path": path_used, "batch": batch, "block": block, "threads": threads,
            "python_gbps": py, "rust_gbps": rs, "ratio": py / rs if rs else 0.0}


def cli_bench(binary: str, path: str, batch: int, block: int, threads: int, seconds: float) -> Optional[float]:
    """GB/s that `orbitte bench` reports for the same settings, or None."""
    cmd = [binary, "bench", "--json", "--quiet", "--no-baseline", "--path", path,
           "--block-size", str(block), "--batch-size", str(batch), "--threads", str(threads),
           "--duration", str(seconds)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 4 + 60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        return None

    def find(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("gbps", "gb_per_s", "throughput_gbps") and isinstance(x, (int, float)):
                    return float(x)
            for x in v.values():
                r = find(x)
                if r is not None:
                    return r
        if isinstance(v, list):
            for x in v:
                r = find(x)
                if r is not None:
                    return r
        return None

    return find(doc)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="tcp", choices=["tcp", "local", "auto"])
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--threads", default="1,8", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each side counts")
    ap.add_argument("--orbitte", default=os.environ.get("ORBITTE_BIN") or shutil.which("orbitte"),
                    help="the orbitte binary for the command-line figure")
    ap.add_argument("--cases", default=",".join(f"{b}x{n}" for b, n in CASES),
                    help="comma-separated BATCHxBLOCK cases (block in bytes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    for batch, block in cases:
        for threads in [int(t) for t in args.threads.split(",")]:
            r = measure(args.path, batch, block, threads, args.duration, args.rounds)
            if args.orbitte and args.path != "auto":
                r["cli_gbps"] = cli_bench(args.orbitte, args.path, batch, block, threads, args.duration)
            rows.append(r)
            if not args.json:
                cli = r.get("cli_gbps")
                print(f"{r['path']:5} {batch:5} x {block >> 10:5} KiB  threads {threads}:  "
                      f"python {r['python_gbps']:6.2f} GB/s  rust {r['rust_gbps']:6.2f} GB/s  "
                      f"python/rust {r['ratio']:.2f}"
                      + (f"  orbitte bench {cli:6.2f} GB/s" if cli is not None else ""), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
