"""``python crates/orbitte-py/examples/nixl_bench.py``: prepared lists at speed.

Moves the same descriptors three ways, in one run, between two NIXL
agents (``orbitte.nixl``) of this process over one path:

- **nixl**: vLLM's hot path in a Python loop: ``make_prepped_xfer`` with
  numpy index arrays into two prepared lists, ``transfer``, then
  ``check_xfer_state`` until "DONE", ``release_xfer_handle``;
- **rust**: the same engine requests (the handle's) submitted and waited
  for by the engine in a Rust loop, GIL released (``Xfer.repeat``);
- **engine**: the same bytes as one ``orbitte.Engine.transfer`` batch of
  ``orbitte.write`` requests (built once, reused every round).

Default: 16,384 descriptors of 4 KiB per transfer, with the indices in a
random order (no two descriptors adjacent on both sides: one engine
request each) and in sequence (adjacent descriptors merge: one request;
the engine batch still has 16,384). Figures: millions of
descriptors per second moved (``Mdesc/s``) and GB/s (10^9 bytes/s) of
payload; ``nixl/rust`` is the ratio; ``submit`` is descriptors per second
of the ``make_prepped_xfer`` + ``transfer`` calls alone (the engine's
admission and posting included; on the local path posting copies).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import orbitte
from orbitte import nixl


def _agents(path: str, count: int, block: int):
    conf = lambda: nixl.nixl_agent_config(listen="127.0.0.1:0", path=path, rdma=False)  # noqa: E731
    target = nixl.nixl_agent(f"bench-target-{path}", conf())
    initiator = nixl.nixl_agent(f"bench-initiator-{path}", conf())
    # orbitte.Buffer memory is memfd: the local path can map the target's.
    dst, src = orbitte.Buffer(count * block), orbitte.Buffer(count * block)
    src.numpy()[:] = np.arange(count * block, dtype=np.uint64).astype(np.uint8)
    target.register_memory(target.get_reg_descs([dst]))
    initiator.register_memory(initiator.get_reg_descs([src]))
    initiator.add_remote_agent(target.get_agent_metadata())
    return target, initiator, src, dst


def measure(path: str, count: int, block: int, seconds: float, rounds: int, order: str) -> dict:
    target, initiator, src, dst = _agents(path, count, block)
    rows = lambda base: np.stack([base + np.arange(count, dtype=np.uint64) * block,  # noqa: E731
                                  np.full(count, block, np.uint64), np.zeros(count, np.uint64)], axis=1)
    local = initiator.prep_xfer_dlist("NIXL_INIT_AGENT", rows(src.address), "DRAM")
    remote = initiator.prep_xfer_dlist(target.name, rows(dst.address), "DRAM")
    if order == "random":
        rng = np.random.default_rng(7)
        li = rng.permutation(count).astype(np.int64)
        ri = rng.permutation(count).astype(np.int64)
    else:
        li = ri = np.arange(count, dtype=np.int64)

    def nixl_loop() -> tuple[int, float, float]:
        n, submit, start = 0, 0.0, time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            h = initiator.make_prepped_xfer("WRITE", local, li, remote, ri)
            state = initiator.transfer(h)
            submit += time.perf_counter() - t0
            while state == "PROC":
                state = initiator.check_xfer_state(h)
            if state != "DONE":
                raise SystemExit(f"transfer failed: {h.error}")
            initiator.release_xfer_handle(h)
            n += 1
        return n, time.perf_counter() - start, submit

    probe = initiator.make_prepped_xfer("WRITE", local, li, remote, ri)

    # orbitte.Engine: the same descriptors as orbitte.write requests.
    eng = initiator.engine
    peer = initiator._remotes[target.name].peer
    reg = initiator._regs[src.address]
    reqs = [orbitte.write(reg, peer.range(_range_index(peer, dst.address)), block,
                          local_offset=int(a) * block, remote_offset=int(b) * block)
            for a, b in zip(li, ri)]

    def engine_loop() -> tuple[int, float]:
        n, start = 0, time.perf_counter()
        while time.perf_counter() < start + seconds:
            eng.transfer(peer, reqs)
            n += 1
        return n, time.perf_counter() - start

    best = {"nixl": 0.0, "rust": 0.0, "engine": 0.0, "submit": 0.0}
    for _ in range(rounds):
        n, took, submit = nixl_loop()
        best["nixl"] = max(best["nixl"], n * count / took)
        best["submit"] = max(best["submit"], n * count / submit)
        n, took = probe._native.repeat(seconds)
        best["rust"] = max(best["rust"], n * count / took)
        n, took = engine_loop()
        best["engine"] = max(best["engine"], n * count / took)
    probe.release()
    # Every byte where it belongs.
    got, want = dst.numpy().reshape(count, block), src.numpy().reshape(count, block)
    if not (got[ri] == want[li]).all():
        raise SystemExit("the target's bytes differ from what was written")
    used = peer.path
    initiator.close()
    target.close()
    row = {"path": used, "order": order, "descriptors": count, "requests": probe._native.requests,
           "block": block}
    for k, v in best.items():
        row[f"{k}_mdesc_s"] = v / 1e6
        row[f"{k}_gbps"] = v * block / 1e9
    row["nixl_over_rust"] = best["nixl"] / best["rust"] if best["rust"] else 0.0
    row["engine_over_rust"] = best["engine"] / best["rust"] if best["rust"] else 0.0
    return row


def _range_index(peer: orbitte.Peer, address: int) -> int:
    return next(i for i, r in enumerate(peer.ranges) if r.address == address)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="nixl_bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", default="local,tcp", help="comma-separated: local, tcp, auto")
    ap.add_argument("--descriptors", type=int, default=16384)
    ap.add_argument("--block", type=int, default=4096, help="bytes per descriptor")
    ap.add_argument("--orders", default="random,sequential", help="comma-separated: random, sequential")
    ap.add_argument("--duration", type=float, default=0.5, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=11, help="alternating rounds; the best of each side counts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = []
    for path in args.paths.split(","):
        for order in args.orders.split(","):
            r = measure(path, args.descriptors, args.block, args.duration, args.rounds, order)
            out.append(r)
            if args.json:
                continue
            print(f"{r['path']:5} {r['order']:10} {r['descriptors']} x {r['block']} B "
                  f"({r['requests']} requests):  "
                  f"nixl {r['nixl_mdesc_s']:.3f} Mdesc/s ({r['nixl_gbps']:.2f} GB/s)  "
                  f"rust {r['rust_mdesc_s']:.3f} ({r['rust_gbps']:.2f})  "
                  f"engine batches {r['engine_mdesc_s']:.3f} ({r['engine_gbps']:.2f})  "
                  f"nixl/rust {r['nixl_over_rust']:.2f}  engine/rust {r['engine_over_rust']:.2f}  "
                  f"submit {r['submit_mdesc_s']:.3f} Mdesc/s", flush=True)
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
