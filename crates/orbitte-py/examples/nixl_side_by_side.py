"""``python crates/orbitte-py/examples/nixl_side_by_side.py --nixl-python PY``:
one NIXL-API program on two engines, target and initiator in two processes.

Both processes are this script. They call NIXL's agent API (``nixl_agent``,
``register_memory``, ``get_agent_metadata``, ``add_remote_agent``,
``get_xfer_descs``, ``initialize_xfer``, ``transfer``, ``check_xfer_state``)
imported from one of two places:

- **nixl**: NIXL itself (``nixl._api``), run by the interpreter that
  ``--nixl-python`` names, over UCX's tcp transport on loopback
  (``UCX_TLS=tcp,self``, ``UCX_NET_DEVICES=lo`` unless the environment sets
  them);
- **orbitte**: ``orbitte.nixl`` on OrbitTE's tcp path, run by this
  interpreter.

The initiator keeps ``--inflight`` transfers of ``--descriptors`` blocks
posted (each reposted as soon as ``check_xfer_state`` says DONE) for
``--seconds``; the engines take turns ``--rounds`` times and each cell is
its median round, in GB/s (10^9 bytes/s). After each round the side that
received the bytes compares them with what was sent; a difference fails
the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZES = {"K": 1 << 10, "M": 1 << 20}


def _size(text: str) -> int:
    unit = SIZES.get(text[-1:].upper())
    return int(text[:-1]) * unit if unit else int(text)


def _api(impl: str):
    if impl == "orbitte":
        from orbitte.nixl import nixl_agent, nixl_agent_config

        return nixl_agent, nixl_agent_config(backends=["UCX"], path="tcp", listen="127.0.0.1:0", rdma=False)
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent, nixl_agent_config(backends=["UCX"])


def _pattern(size: int) -> np.ndarray:
    return (np.arange(size, dtype=np.uint64) % 251).astype(np.uint8)


def _publish(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def _wait_for(path: Path, timeout: float) -> bytes:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise SystemExit(f"gave up waiting for {path.name} after {timeout:.0f} s: "
                             "the other process did not get there")
        time.sleep(0.01)
    return path.read_bytes()


def role_main(args: argparse.Namespace) -> None:
    agent_cls, conf = _api(args.impl)
    block, count = _size(args.block_size), args.descriptors
    size = block * count
    receives = (args.role == "target") == (args.op == "write")
    buf = np.zeros(size, dtype=np.uint8) if receives else _pattern(size)
    agent = agent_cls(args.role, conf)
    # Held for the whole run: the registration lives while its list does.
    registered = agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")  # noqa: F841
    rows = [(buf.ctypes.data + i * block, block, 0) for i in range(count)]
    d = Path(args.dir)
    if args.role == "target":
        _publish(d / "descs", agent.get_serialized_descs(agent.get_xfer_descs(rows, "DRAM")))
        _publish(d / "meta", agent.get_agent_metadata())
        _wait_for(d / "stop", args.seconds + 120)
    else:
        remote_name = agent.add_remote_agent(_wait_for(d / "meta", 60))
        remote = agent.deserialize_descs((d / "descs").read_bytes())
        local = agent.get_xfer_descs(rows, "DRAM")
        handles = [agent.initialize_xfer(args.op.upper(), local, remote, remote_name) for _ in range(args.inflight)]

        def post(h) -> None:
            if agent.transfer(h) == "ERR":
                raise SystemExit("transfer refused (ERR)")

        def settle(h) -> None:
            while (state := agent.check_xfer_state(h)) == "PROC":
                pass
            if state != "DONE":
                raise SystemExit(f"transfer ended {state}")

        for h in handles:
            post(h)
            settle(h)
        done, start = 0, time.perf_counter()
        for h in handles:
            post(h)
        posted = list(handles)
        while posted:
            h = posted.pop(0)
            settle(h)
            done += 1
            if time.perf_counter() - start < args.seconds:
                post(h)
                posted.append(h)
        took = time.perf_counter() - start
        for h in handles:
            agent.release_xfer_handle(h)
        _publish(d / "result", json.dumps({"gbps": done * size / took / 1e9}).encode())
        (d / "stop").write_bytes(b"")
    if receives and not np.array_equal(buf, _pattern(size)):
        raise SystemExit(f"{args.role}: the {size} bytes received differ from the {size} sent")
    if args.impl == "nixl":
        # NIXL 1.5.1's wheel crashes (SIGSEGV) in its teardown at interpreter
        # exit, even for an agent that moved nothing: end without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _round(impl: str, python: str, op: str, args: argparse.Namespace) -> float:
    env = dict(os.environ)
    if impl == "nixl":
        env.setdefault("UCX_TLS", "tcp,self")
        env.setdefault("UCX_NET_DEVICES", "lo")
    with tempfile.TemporaryDirectory(prefix="nixl-side-") as d:
        common = ["--impl", impl, "--dir", d, "--op", op, "--block-size", args.block_size,
                  "--descriptors", str(args.descriptors), "--inflight", str(args.inflight),
                  "--seconds", str(args.seconds)]
        me = [python, os.path.abspath(__file__)]
        target = subprocess.Popen(me + ["--role", "target"] + common, env=env, stderr=subprocess.PIPE, text=True)
        initiator = subprocess.run(me + ["--role", "initiator"] + common, env=env, stderr=subprocess.PIPE,
                                   text=True, timeout=args.seconds + 180)
        if initiator.returncode != 0:
            target.kill()
        _, target_err = target.communicate(timeout=120)
        for name, rc, err in (("initiator", initiator.returncode, initiator.stderr),
                              ("target", target.returncode, target_err)):
            if rc != 0:
                hint = (f" (is NIXL importable by {python}? name an interpreter that has it with --nixl-python)"
                        if impl == "nixl" and "No module named" in err else "")
                raise SystemExit(f"{impl} {op}: the {name} process exited {rc}{hint}:\n{err[-2000:]}")
        return json.loads((Path(d) / "result").read_text())["gbps"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="nixl_side_by_side.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nixl-python", default=sys.executable, help="interpreter that can import nixl")
    ap.add_argument("--impls", default="nixl,orbitte", help="comma-separated: nixl, orbitte")
    ap.add_argument("--ops", default="write,read", help="comma-separated: write, read")
    ap.add_argument("--block-size", default="1M", help="bytes per descriptor (K and M suffixes)")
    ap.add_argument("--descriptors", type=int, default=16, help="descriptors per transfer")
    ap.add_argument("--inflight", type=int, default=2, help="transfers kept posted")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each cell is the median")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", choices=["target", "initiator"], help=argparse.SUPPRESS)
    ap.add_argument("--impl", choices=["nixl", "orbitte"], help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--op", choices=["write", "read"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        role_main(args)
        return
    impls = args.impls.split(",")
    for impl in impls:
        if impl not in ("nixl", "orbitte"):
            raise SystemExit(f"--impls: unknown engine {impl!r}; use nixl, orbitte or both")
    ops = args.ops.split(",")
    for op in ops:
        if op not in ("write", "read"):
            raise SystemExit(f"--ops: unknown operation {op!r}; use write, read or both")
    python = {"nixl": args.nixl_python, "orbitte": sys.executable}
    rounds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for op in ops:
            for impl in impls:
                rounds.setdefault((op, impl), []).append(_round(impl, python[impl], op, args))
    cells = []
    for op in ops:
        cell = {"op": op, "block_size": _size(args.block_size), "descriptors": args.descriptors,
                "inflight": args.inflight}
        for impl in impls:
            cell[f"{impl}_gbps"] = statistics.median(rounds[(op, impl)])
            cell[f"{impl}_rounds_gbps"] = rounds[(op, impl)]
        if len(impls) == 2:
            cell["orbitte_over_nixl"] = cell["orbitte_gbps"] / cell["nixl_gbps"] if cell["nixl_gbps"] else 0.0
        cells.append(cell)
        if not args.json:
            figures = "  ".join(f"{impl} {cell[f'{impl}_gbps']:.2f} GB/s" for impl in impls)
            ratio = f"  orbitte/nixl {cell['orbitte_over_nixl']:.2f}" if len(impls) == 2 else ""
            print(f"{op:5} {args.descriptors} x {args.block_size}, {args.inflight} in flight:  {figures}{ratio}",
                  flush=True)
    if args.json:
        print(json.dumps(cells, indent=2))


if __name__ == "__main__":
    main()
