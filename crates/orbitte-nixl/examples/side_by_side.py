"""UCX against OrbitTE under NIXL's own agent, side by side.

Usage:
  side_by_side.py --plugin target/release/libplugin_OrbitTE.so [--rounds 3] [--seconds 1] [--json FILE]

One NIXL program, two processes (an initiator and a target), both agents
created with ``backends=["UCX", "OrbitTE"]``; every transfer names the one
backend it measures (``backends=["UCX"]`` or ``backends=["OrbitTE"]``), so
both backends move bytes between the same agents and the same registered
memory. The run holds two settings, each its own pair of processes:

- ``tcp``: ``UCX_TLS=tcp``, and ``ORBITTE_NIXL_CMA=0`` so OrbitTE takes its
  tcp path as well;
- ``local``: UCX's defaults, so UCX copies between the two processes of this
  host with ``cma``, and OrbitTE with its same-host copies.

In each setting: READ and WRITE of 64 KiB and 1 MiB blocks (two transfers
of 16 MiB kept posted) and of 16,384-descriptor prepared lists of 4 KiB
(``prep_xfer_dlist`` + ``make_prepped_xfer``), with the remote indices in
sequence and in a random order. Each cell runs ``--seconds`` (at least
three transfers) per round; rounds alternate which backend goes first, and
a cell's figure is the median of its rounds. Before each measurement the
receiving side zeroes its memory and the sending side writes fresh random
bytes; after it the receiving side compares the sha256 of what it holds
with the sha256 of what should have arrived, and a difference fails the
run.

``--plugin`` names the OrbitTE plugin; the program makes a plugin folder
with it and the wheel's UCX plugin and sets ``NIXL_PLUGIN_DIR`` and
``LD_LIBRARY_PATH`` for the processes it starts. NIXL's agent crashes at
interpreter exit (its bundled libraries), so the NIXL processes end with
``os._exit``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

KIB, MIB = 1 << 10, 1 << 20
BACKENDS = ("UCX", "OrbitTE")
OPS = ("WRITE", "READ")
# (cell name, block size, descriptors per transfer, transfers in flight, prepared, random order)
SHAPES = (
    ("64 KiB blocks", 64 * KIB, 256, 2, False, False),
    ("1 MiB blocks", MIB, 16, 2, False, False),
    ("16,384 x 4 KiB prepared, in sequence", 4 * KIB, 16384, 1, True, False),
    ("16,384 x 4 KiB prepared, random order", 4 * KIB, 16384, 1, True, True),
)
REGION = 64 * MIB
SETTINGS = ("tcp", "local")
MIN_XFERS = 3
DEADLINE = 120.0


def finish(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def random_bytes(seed: int, n: int):
    import numpy as np

    return np.frombuffer(np.random.default_rng(seed).bytes(n), dtype=np.uint8)


def perm_for(seed: int, n: int):
    import numpy as np

    return np.random.default_rng(seed).permutation(n).astype(np.int32)


def source_layout(op: str, seed: int, length: int, block: int, perm_seed):
    """What the sending side holds so that the receiver ends with random_bytes(seed)."""
    want = random_bytes(seed, length)
    if perm_seed is None:
        return want
    perm = perm_for(perm_seed, length // block)
    blocks = want.reshape(-1, block)
    # Local block i travels to (WRITE) or from (READ) remote block perm[i].
    if op == "WRITE":  # the initiator sends: remote perm[i] <- local i
        return blocks[perm].reshape(-1)
    import numpy as np  # READ: the target sends: local i <- remote perm[i]

    src = np.empty_like(blocks)
    src[perm] = blocks
    return src.reshape(-1)


def private_stdout():
    """The real stdout for this program's own lines; NIXL's prints go to stderr."""
    out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    return out


def make_agent(name: str):
    from nixl_cu12._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=list(BACKENDS)))


# ------------------------------------------------------------------ target


def target_main() -> None:
    import numpy as np

    out = private_stdout()
    agent = make_agent("target")
    buf = np.zeros(REGION, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, REGION, 0, "")], "DRAM")
    out.write(json.dumps({"addr": buf.ctypes.data, "md": base64.b64encode(agent.get_agent_metadata()).decode()}))
    out.write("\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        reply = {"ok": True}
        if cmd["cmd"] == "zero":
            buf[: cmd["len"]] = 0
        elif cmd["cmd"] == "fill":
            buf[: cmd["len"]] = source_layout(cmd["op"], cmd["seed"], cmd["len"], cmd["block"], cmd["perm_seed"])
        elif cmd["cmd"] == "check":
            got = hashlib.sha256(buf[: cmd["len"]]).hexdigest()
            want = hashlib.sha256(random_bytes(cmd["seed"], cmd["len"])).hexdigest()
            reply = {"ok": got == want, "got": got, "want": want}
        elif cmd["cmd"] == "quit":
            finish(0)
        out.write(json.dumps(reply) + "\n")
        out.flush()
    finish(0)


# --------------------------------------------------------------- initiator


class Target:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", "target"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self.proc.stdout.readline()
        if not hello:
            raise SystemExit(f"the target process exited {self.proc.wait()} before publishing its metadata")
        info = json.loads(hello)
        self.addr = info["addr"]
        self.md = base64.b64decode(info["md"])

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the target process exited {self.proc.wait()} during {cmd['cmd']}")
        return json.loads(line)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def initiator_main(args) -> None:
    import numpy as np

    out = private_stdout()
    target = Target()
    try:
        cells = run_cells(args, target, np)
    except BaseException as e:  # report, stop the target, and end without NIXL's teardown
        target.stop()
        print(f"FAIL: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finish(1)
    target.stop()
    out.write(json.dumps(cells) + "\n")
    out.flush()
    finish(0)


def run_cells(args, target, np):
    agent = make_agent("initiator")
    local = np.zeros(REGION, dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, REGION, 0, "")], "DRAM")
    remote = agent.add_remote_agent(target.md)
    if isinstance(remote, bytes):
        remote = remote.decode()
    laddr, raddr = local.ctypes.data, target.addr

    # Prepared lists: 16,384 x 4 KiB on each side, once per backend.
    n4k = REGION // (4 * KIB)
    lrows = [(laddr + i * 4 * KIB, 4 * KIB, 0) for i in range(n4k)]
    rrows = [(raddr + i * 4 * KIB, 4 * KIB, 0) for i in range(n4k)]
    prepped = {}
    for b in BACKENDS:
        prepped[b] = (
            agent.prep_xfer_dlist("NIXL_INIT_AGENT", lrows, "DRAM", backends=[b]),
            agent.prep_xfer_dlist(remote, rrows, "DRAM", backends=[b]),
        )

    def handles(op, b, block, descs, inflight, is_prepped, perm):
        if is_prepped:
            lh, rh = prepped[b]
            idx = np.arange(descs, dtype=np.int32)
            ridx = perm if perm is not None else idx
            return [agent.make_prepped_xfer(op, lh, idx, rh, ridx, backends=[b])]
        out = []
        for k in range(inflight):
            at = k * descs * block
            ls = agent.get_xfer_descs([(laddr + at + i * block, block, 0) for i in range(descs)], "DRAM")
            rs = agent.get_xfer_descs([(raddr + at + i * block, block, 0) for i in range(descs)], "DRAM")
            out.append(agent.initialize_xfer(op, ls, rs, remote, backends=[b]))
        return out

    def settle(h):
        end = time.monotonic() + DEADLINE
        while True:
            s = agent.check_xfer_state(h)
            if s == "DONE":
                return
            if s != "PROC":
                raise RuntimeError(f"transfer ended {s}")
            if time.monotonic() > end:
                raise RuntimeError("transfer did not end")

    def post(h):
        if agent.transfer(h) == "ERR":
            raise RuntimeError("transfer posted in ERR")

    seed = args.seed * 1_000_003
    results = []
    for rnd in range(args.rounds):
        order = BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]
        for name, block, descs, inflight, is_prepped, rand in chosen_shapes(args.shapes):
            for op in OPS:
                for b in order:
                    seed += 1
                    length = block * descs * inflight
                    perm_seed = seed + 500_000 if rand else None
                    perm = perm_for(perm_seed, descs) if rand else None
                    # The receiver zeroes, the sender writes fresh bytes.
                    if op == "WRITE":
                        target.ask(cmd="zero", len=length)
                        local[:length] = source_layout(op, seed, length, block, perm_seed)
                    else:
                        local[:length] = 0
                        target.ask(cmd="fill", op=op, seed=seed, len=length, block=block, perm_seed=perm_seed)
                    hs = handles(op, b, block, descs, inflight, is_prepped, perm)
                    for h in hs:  # one untimed pass: connections, first touch
                        post(h)
                        settle(h)
                    done, start = 0, time.perf_counter()
                    for h in hs:
                        post(h)
                    posted = list(hs)
                    while posted:
                        h = posted.pop(0)
                        settle(h)
                        done += 1
                        if time.perf_counter() - start < args.seconds or done + len(posted) < MIN_XFERS:
                            post(h)
                            posted.append(h)
                    took = time.perf_counter() - start
                    used = {agent.query_xfer_backend(h) for h in hs}
                    for h in hs:
                        agent.release_xfer_handle(h)
                    if used != {b}:
                        raise RuntimeError(f"asked for {b}, NIXL used {used}")
                    # The receiving side checks the bytes.
                    if op == "WRITE":
                        r = target.ask(cmd="check", seed=seed, len=length)
                        ok, got, want = r["ok"], r["got"], r["want"]
                    else:
                        got = hashlib.sha256(local[:length]).hexdigest()
                        want = hashlib.sha256(random_bytes(seed, length)).hexdigest()
                        ok = got == want
                    if not ok:
                        raise RuntimeError(f"{b} {op} {name}: sha256 {got} received, {want} sent")
                    per_xfer = block * descs
                    results.append(
                        {
                            "round": rnd,
                            "shape": name,
                            "op": op,
                            "backend": b,
                            "transfers": done,
                            "seconds": took,
                            "gbps": done * per_xfer / took / 1e9,
                            "descs_per_s": done * descs / took,
                        }
                    )
                    print(f"  {args.setting} round {rnd} {op} {name} {b}: {done * per_xfer / took / 1e9:.2f} GB/s",
                          file=sys.stderr, flush=True)
    return results


# ------------------------------------------------------------------ driver


def plugin_env(plugin: str, folder: str) -> dict:
    import nixl_cu12

    libs = os.path.dirname(nixl_cu12.__file__) + ".libs"
    for name, to in (("libplugin_OrbitTE.so", os.path.abspath(plugin)),
                     ("libplugin_UCX.so", os.path.join(libs, "nixl", "libplugin_UCX.so"))):
        if not os.path.exists(to):
            raise SystemExit(f"{to} is missing: build the plugin (docs/nixl-plugin.md) or install nixl-cu12")
        os.symlink(to, os.path.join(folder, name))
    env = dict(os.environ)
    env["NIXL_PLUGIN_DIR"] = folder
    env["LD_LIBRARY_PATH"] = libs + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def chosen_shapes(spec: str) -> list:
    """The shapes `spec` names: comma-separated numbers, 1 to 4, in the order of SHAPES."""
    try:
        picked = {int(k) for k in spec.split(",")}
    except ValueError:
        raise SystemExit(f"--shapes: {spec!r} is not a list of numbers 1 to {len(SHAPES)}")
    if not picked or not picked <= set(range(1, len(SHAPES) + 1)):
        raise SystemExit(f"--shapes: {spec!r}: use numbers 1 to {len(SHAPES)}")
    return [s for i, s in enumerate(SHAPES, 1) if i in picked]


def run_setting(setting: str, args, env: dict) -> list:
    env = dict(env)
    env.pop("UCX_TLS", None)
    env.pop("UCX_NET_DEVICES", None)
    env.pop("ORBITTE_NIXL_CMA", None)
    if setting == "tcp":
        env["UCX_TLS"] = "tcp"
        env["ORBITTE_NIXL_CMA"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "initiator", "--setting", setting,
           "--rounds", str(args.rounds), "--seconds", str(args.seconds), "--seed", str(args.seed),
           "--shapes", args.shapes]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"setting {setting}: the initiator exited {p.returncode} (its messages are above)")
    cells = json.loads(p.stdout.strip().splitlines()[-1])
    for c in cells:
        c["setting"] = setting
    return cells


def summarize(rows: list) -> list:
    table = []
    for setting in SETTINGS:
        for name, block, descs, *_ in SHAPES:
            for op in OPS:
                cell = {"setting": setting, "shape": name, "op": op}
                for b in BACKENDS:
                    mine = [r for r in rows if (r["setting"], r["shape"], r["op"], r["backend"]) == (setting, name, op, b)]
                    if not mine:
                        break
                    cell[b] = {
                        "gbps": statistics.median(r["gbps"] for r in mine),
                        "descs_per_s": statistics.median(r["descs_per_s"] for r in mine),
                        "rounds_gbps": [round(r["gbps"], 3) for r in mine],
                    }
                else:
                    cell["ratio"] = cell["OrbitTE"]["gbps"] / cell["UCX"]["gbps"]
                    cell["ahead"] = cell["ratio"] > 1.0
                    table.append(cell)
    return table


def print_table(table: list) -> None:
    print("| setting | op | shape | UCX | OrbitTE | OrbitTE/UCX |")
    print("|---|---|---|---|---|---|")
    for c in table:
        def fig(b):
            f = c[b]
            if "prepared" in c["shape"]:
                return f"{f['descs_per_s'] / 1e3:.0f} k desc/s, {f['gbps']:.2f} GB/s"
            return f"{f['gbps']:.2f} GB/s"

        mark = "" if c["ahead"] else " (not ahead)"
        print(f"| {c['setting']} | {c['op']} | {c['shape']} | {fig('UCX')} | {fig('OrbitTE')} | "
              f"{c['ratio']:.2f}{mark} |")
    behind = [c for c in table if not c["ahead"]]
    print(f"\n{len(table) - len(behind)} of {len(table)} cells ahead; not ahead: "
          + ("; ".join(f"{c['setting']} {c['op']} {c['shape']}" for c in behind) or "none"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugin", help="path of libplugin_OrbitTE.so")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell; a cell is the median")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: tcp, local")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(1, len(SHAPES) + 1)),
                    help="comma-separated shapes to run: 1 64 KiB blocks, 2 1 MiB blocks, "
                         "3 4 KiB prepared in sequence, 4 4 KiB prepared in a random order")
    ap.add_argument("--json", help="also write every round and the table to this file")
    ap.add_argument("--role", choices=["target", "initiator"], help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "target":
        target_main()
    if args.role == "initiator":
        initiator_main(args)
    if not args.plugin:
        raise SystemExit("--plugin: name the OrbitTE plugin (target/release/libplugin_OrbitTE.so)")
    settings = args.settings.split(",")
    chosen_shapes(args.shapes)
    for s in settings:
        if s not in SETTINGS:
            raise SystemExit(f"--settings: unknown setting {s!r}; use tcp, local or both")
    rows = []
    with tempfile.TemporaryDirectory(prefix="orbitte-nixl-plugins-") as folder:
        env = plugin_env(args.plugin, folder)
        for s in settings:
            rows += run_setting(s, args, env)
    table = summarize(rows)
    print_table(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rows, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
