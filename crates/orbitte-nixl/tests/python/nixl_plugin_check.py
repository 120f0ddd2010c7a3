"""OrbitTE's NIXL plugin under NIXL's own agent, two processes.

Usage: nixl_plugin_check.py SCENARIO   (the initiator; it starts the target)
       nixl_plugin_check.py --target SCENARIO DIR

Scenarios:
  xfer      WRITE and READ by initialize_xfer and by prepared lists with index
            arrays, bytes checked on both sides; notifications arrive once,
            and only after the bytes they follow. Both processes run on one
            host: the plugin's metrics show the bytes copied by
            process_vm_writev/readv and none over the engine's paths.
  xfer-tcp  the same with ORBITTE_NIXL_CMA=0: the bytes go over the engine's
            tcp path, and none is copied by the kernel.
  dies      the target process dies; a transfer to it ends in NIXL's
            exception or ERR within a bound, never a hang.
  dies-tcp  the same with ORBITTE_NIXL_CMA=0.
  ucx-only  initiator [UCX, OrbitTE], target [UCX]: NIXL uses UCX.
  both      both agents [UCX, OrbitTE]: NIXL uses OrbitTE, and the plugin
            engine's metrics count the bytes.
  bench     WRITE and READ 1 MiB blocks with UCX and with OrbitTE, same
            agents (a quick look, not a benchmark).

Prints "ok SCENARIO ..." and exits 0 on success; any failure exits 1.
NIXL's agent crashes at interpreter exit (its bundled libnl), so every
process ends with os._exit after flushing.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from nixl_cu12._api import nixl_agent, nixl_agent_config

MIB = 1 << 20
BLOCK = 4096
BLOCKS = 16
# target buffer layout: [0, 1 MiB) WRITE by initialize_xfer; [1, 2) READ
# source; [2 MiB, 2 MiB + 64 KiB) WRITE by prepared list; [3, 3 MiB+64 KiB)
# READ source of the prepared list.
TARGET_LEN = 4 * MIB
WRITE_AT, READ_AT, PWRITE_AT, PREAD_AT = 0, MIB, 2 * MIB, 3 * MIB
DEADLINE = 60.0
BIG_NOTIF = bytes(range(256)) * 40


def pattern(seed, n):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) % 251).astype(np.uint8)


def finish(code):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


TARGET_PROC = []
# The initiator's scratch folder, removed when it ends.
SCRATCH = []


def cleanup():
    for p in TARGET_PROC:
        if p.poll() is None:
            p.kill()
            p.wait()
    for d in SCRATCH:
        shutil.rmtree(d, ignore_errors=True)


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    cleanup()
    finish(1)


def backends_for(scenario, role):
    if scenario in ("xfer", "xfer-tcp", "dies", "dies-tcp"):
        return ["OrbitTE"]
    if scenario == "ucx-only":
        return ["UCX", "OrbitTE"] if role == "init" else ["UCX"]
    return ["UCX", "OrbitTE"]


def wait_file(path, timeout=DEADLINE, proc=None):
    end = time.time() + timeout
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            fail(f"the target exited with {proc.returncode} before writing {path}")
        if time.time() > end:
            fail(f"timed out waiting for {path}")
        time.sleep(0.01)


def write_file(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def wait_xfer(agent, h):
    end = time.time() + DEADLINE
    while True:
        s = agent.check_xfer_state(h)
        if s == "DONE":
            return
        if s == "ERR":
            fail("transfer ended in ERR")
        if time.time() > end:
            fail("transfer did not end")


# ---------------------------------------------------------------- target


def target(scenario, d):
    agent = nixl_agent("target", nixl_agent_config(backends=backends_for(scenario, "target")))
    buf = np.zeros(TARGET_LEN, dtype=np.uint8)
    buf[READ_AT : READ_AT + MIB] = pattern(2, MIB)
    buf[PREAD_AT : PREAD_AT + BLOCKS * BLOCK] = pattern(4, BLOCKS * BLOCK)
    agent.register_memory([(buf.ctypes.data, TARGET_LEN, 0, "")], "DRAM")
    desc = {"addr": buf.ctypes.data, "len": TARGET_LEN}
    write_file(os.path.join(d, "target.json"), json.dumps(desc).encode())
    write_file(os.path.join(d, "target.md"), agent.get_agent_metadata())
    if scenario not in ("xfer", "xfer-tcp"):
        wait_file(os.path.join(d, "init.done"), 300)
        finish(0)

    # Each notification names what it follows; its bytes must be in place
    # when it is seen.
    expect = {
        b"w-init": (WRITE_AT, pattern(1, MIB)),
        b"w-prep": (PWRITE_AT, prepped_expected()),
        b"": None,  # an empty notification (genNotif), checked for count only
        BIG_NOTIF: None,  # larger than the plugin's first receive buffer
    }
    seen = {}
    end = time.time() + DEADLINE
    done_at = None
    while True:
        for _, msgs in agent.get_new_notifs().items():
            for m in msgs:
                seen[m] = seen.get(m, 0) + 1
                if m not in expect:
                    fail(f"unexpected notification {m!r}")
                if expect[m] is not None:
                    at, want = expect[m]
                    if not np.array_equal(buf[at : at + len(want)], want):
                        fail(f"notification {m!r} arrived before its bytes")
        if done_at is None and os.path.exists(os.path.join(d, "init.done")):
            done_at = time.time()
        # After the initiator ended, poll a while longer for duplicates.
        if done_at is not None and time.time() - done_at > 1.0:
            break
        if time.time() > end:
            fail("target timed out")
        time.sleep(0.001)
    if seen != {b"w-init": 1, b"w-prep": 1, b"": 1, BIG_NOTIF: 1}:
        fail(f"notifications seen {seen}, want each exactly once")
    print("target: notifications once each, after their bytes", flush=True)
    finish(0)


def prepped_expected():
    # The prepared WRITE sends local block i to remote block BLOCKS-1-i.
    src = pattern(3, BLOCKS * BLOCK).reshape(BLOCKS, BLOCK)
    return src[::-1].reshape(-1).copy()


# ---------------------------------------------------------------- initiator


def start_target(scenario, d):
    proc = subprocess.Popen([sys.executable, __file__, "--target", scenario, d])
    TARGET_PROC.append(proc)
    wait_file(os.path.join(d, "target.md"), proc=proc)
    with open(os.path.join(d, "target.json"), "rb") as f:
        desc = json.loads(f.read())
    with open(os.path.join(d, "target.md"), "rb") as f:
        md = f.read()
    return proc, desc, md


def initiator(scenario, d):
    if scenario.endswith("-tcp"):
        # Both processes (the target inherits it).
        os.environ["ORBITTE_NIXL_CMA"] = "0"
    proc, tdesc, md = start_target(scenario, d)
    agent = nixl_agent("init", nixl_agent_config(backends=backends_for(scenario, "init")))
    local = np.zeros(4 * MIB, dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    name = agent.add_remote_agent(md)
    if isinstance(name, bytes):
        name = name.decode()
    base = tdesc["addr"]
    laddr = local.ctypes.data

    def xfer_descs(pairs):
        ls = agent.get_xfer_descs([(laddr + lo, n, 0) for lo, _, n in pairs], "DRAM")
        rs = agent.get_xfer_descs([(base + ro, n, 0) for _, ro, n in pairs], "DRAM")
        return ls, rs

    if scenario in ("xfer", "xfer-tcp"):
        run_xfer(agent, name, local, xfer_descs, laddr, base)
        print(f"ok {scenario}: " + paths_used(cma=scenario == "xfer"), flush=True)
    elif scenario in ("dies", "dies-tcp"):
        run_dies(scenario, agent, name, local, xfer_descs, proc)
    elif scenario == "ucx-only":
        used = write_once(agent, local, xfer_descs, name, [])
        if used != "UCX":
            fail(f"NIXL used {used}, want UCX")
        print(f"ok ucx-only: NIXL used {used}", flush=True)
    elif scenario == "both":
        # NIXL picks among the backends both agents have in an order of its
        # own; the caller names one to be sure.
        by_default = write_once(agent, local, xfer_descs, name, [])
        used = write_once(agent, local, xfer_descs, name, ["OrbitTE"])
        if used != "OrbitTE":
            fail(f"NIXL used {used}, want OrbitTE")
        print(
            f"ok both: NIXL used {by_default} by default and {used} when named; "
            + orbitte_bytes_written(),
            flush=True,
        )
    elif scenario == "bench":
        run_bench(agent, name, local, xfer_descs)
    write_file(os.path.join(d, "init.done"), b"")
    if not scenario.startswith("dies"):
        code = proc.wait(timeout=DEADLINE)
        if code != 0:
            fail(f"target exited with {code}")
    cleanup()
    finish(0)


def write_once(agent, local, xfer_descs, name, backends):
    local[:MIB] = pattern(1, MIB)
    ls, rs = xfer_descs([(0, WRITE_AT, MIB)])
    h = agent.initialize_xfer("WRITE", ls, rs, name, backends=backends)
    if agent.transfer(h) == "ERR":
        fail("WRITE posted in ERR")
    wait_xfer(agent, h)
    used = agent.query_xfer_backend(h)
    agent.release_xfer_handle(h)
    return used


def metrics():
    """(engine bytes by (path, op), same-host copy bytes by op) of the
    plugin's metrics file."""
    path = os.environ.get("ORBITTE_NIXL_METRICS_FILE")
    if not path or not os.path.exists(path):
        fail("the plugin wrote no metrics file (ORBITTE_NIXL_METRICS_FILE)")
    engine, cma = {}, {"write": 0, "read": 0}
    with open(path) as f:
        for line in f:
            value = int(float(line.rsplit(" ", 1)[1])) if not line.startswith("#") else 0
            if line.startswith("orbitte_transfer_bytes_total{"):
                key = tuple(line.split(k + '="', 1)[1].split('"', 1)[0] for k in ("path", "op"))
                engine[key] = engine.get(key, 0) + value
            elif line.startswith("orbitte_capi_cma_bytes_total{"):
                cma[line.split('op="', 1)[1].split('"', 1)[0]] += value
    return engine, cma


def paths_used(cma):
    # run_xfer moves 1 MiB + 64 KiB each way.
    want = MIB + BLOCKS * BLOCK
    engine, copied = metrics()
    moved = {op: sum(v for (_, o), v in engine.items() if o == op) for op in ("write", "read")}
    if cma:
        # The engine carries the notifications (a 1-byte READ each) and
        # the pid proof (32 bytes): nothing of the caller's.
        if copied["write"] < want or copied["read"] < want:
            fail(f"same-host copies counted {copied}, want at least {want} each way")
        if moved["write"] != 0 or moved["read"] > 1024:
            fail(f"the engine's paths moved {engine}: the bytes did not take the same-host copies")
    else:
        if copied["write"] != 0 or copied["read"] != 0:
            fail(f"ORBITTE_NIXL_CMA=0, yet same-host copies counted {copied}")
        if moved["write"] < want or moved["read"] < want:
            fail(f"the engine's paths moved {engine}, want at least {want} each way")
    return f"same-host copies {copied}, the engine's paths {engine}"


def orbitte_bytes_written():
    engine, copied = metrics()
    total = sum(v for (_, op), v in engine.items() if op == "write") + copied["write"]
    paths = {p for (p, op) in engine if op == "write"} | ({"cma"} if copied["write"] else set())
    if total < MIB:
        fail(f"the plugin engine counted {total} bytes written, want at least {MIB}")
    return f"the plugin engine counted {total} bytes written (paths: {', '.join(sorted(paths))})"


def cuda_devices():
    """CUDA devices the driver reports (0 without libcuda)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    n = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return 0
    return n.value


def run_xfer(agent, name, local, xfer_descs, laddr, base):
    # The memory list says VRAM only where the CUDA driver has a device.
    mems = sorted(agent.backend_mems["OrbitTE"])
    want = ["DRAM_SEG", "VRAM_SEG"] if cuda_devices() > 0 else ["DRAM_SEG"]
    if mems != want:
        fail(f"OrbitTE lists {mems}, want {want}")

    # WRITE by initialize_xfer, with a notification.
    local[:MIB] = pattern(1, MIB)
    ls, rs = xfer_descs([(0, WRITE_AT, MIB)])
    h = agent.initialize_xfer("WRITE", ls, rs, name, b"w-init")
    if agent.transfer(h) == "ERR":
        fail("WRITE posted in ERR")
    wait_xfer(agent, h)
    if agent.query_xfer_backend(h) != "OrbitTE":
        fail(f"NIXL used {agent.query_xfer_backend(h)}")
    agent.release_xfer_handle(h)

    # READ by initialize_xfer.
    ls, rs = xfer_descs([(MIB, READ_AT, MIB)])
    h = agent.initialize_xfer("READ", ls, rs, name)
    agent.transfer(h)
    wait_xfer(agent, h)
    agent.release_xfer_handle(h)
    if not np.array_equal(local[MIB : 2 * MIB], pattern(2, MIB)):
        fail("READ by initialize_xfer: bytes differ")

    # Prepared lists with index arrays: local blocks at 2 MiB, remote
    # blocks at PWRITE_AT (WRITE) and PREAD_AT (READ).
    lb = [(laddr + 2 * MIB + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    rb = [(base + PWRITE_AT + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    rr = [(base + PREAD_AT + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)]
    lh = agent.prep_xfer_dlist("NIXL_INIT_AGENT", lb, "DRAM")
    wh = agent.prep_xfer_dlist(name, rb, "DRAM")
    rh = agent.prep_xfer_dlist(name, rr, "DRAM")
    local[2 * MIB : 2 * MIB + BLOCKS * BLOCK] = pattern(3, BLOCKS * BLOCK)
    idx = list(range(BLOCKS))
    rev = idx[::-1]
    h = agent.make_prepped_xfer("WRITE", lh, idx, wh, rev, b"w-prep")
    agent.transfer(h)
    wait_xfer(agent, h)
    agent.release_xfer_handle(h)

    local[2 * MIB : 2 * MIB + BLOCKS * BLOCK] = 0
    h = agent.make_prepped_xfer("READ", lh, rev, rh, idx)
    agent.transfer(h)
    wait_xfer(agent, h)
    agent.release_xfer_handle(h)
    got = local[2 * MIB : 2 * MIB + BLOCKS * BLOCK].reshape(BLOCKS, BLOCK)
    src = pattern(4, BLOCKS * BLOCK).reshape(BLOCKS, BLOCK)
    if not np.array_equal(got, src[::-1]):
        fail("prepared READ with index arrays: bytes differ")

    # A descriptor outside the target's registered memory: NIXL's error.
    ls, rs = xfer_descs([(0, TARGET_LEN - BLOCK, 2 * BLOCK)])
    try:
        h = agent.initialize_xfer("WRITE", ls, rs, name)
        fail("a descriptor outside the remote registration was accepted")
    except Exception as e:
        bad_desc = type(e).__name__

    # A notification alone, empty (NIXL allows it).
    agent.send_notif(name, b"")
    agent.send_notif(name, BIG_NOTIF)
    print(
        f"xfer: memory {'+'.join(mems)}; "
        "WRITE and READ by initialize_xfer and by prepared lists; "
        f"a descriptor outside remote memory: {bad_desc}",
        flush=True,
    )


def run_dies(scenario, agent, name, local, xfer_descs, proc):
    ls, rs = xfer_descs([(0, WRITE_AT, MIB)])
    h = agent.initialize_xfer("WRITE", ls, rs, name)
    agent.transfer(h)
    wait_xfer(agent, h)
    proc.kill()
    proc.wait()
    start = time.time()
    outcome = None
    try:
        if agent.transfer(h) == "ERR":
            outcome = "ERR at post"
        else:
            while outcome is None:
                s = agent.check_xfer_state(h)
                if s == "ERR":
                    outcome = "ERR at check"
                elif s == "DONE":
                    fail("a transfer to a dead agent reported DONE")
                elif time.time() - start > DEADLINE:
                    fail("a transfer to a dead agent did not end (a hang)")
    except Exception as e:  # NIXL's exception (nixlRemoteDisconnectError, ...)
        outcome = f"{type(e).__name__}"
        print(f"{scenario}: {e}", file=sys.stderr, flush=True)
    print(f"ok {scenario}: {outcome} after {time.time() - start:.2f} s", flush=True)


def run_bench(agent, name, local, xfer_descs):
    ls, rs = xfer_descs([(0, WRITE_AT, MIB)])
    out = []
    for op in ("WRITE", "READ"):
        for b in ("UCX", "OrbitTE"):
            h = agent.initialize_xfer(op, ls, rs, name, backends=[b])
            rounds = 200
            for _ in range(20):
                agent.transfer(h)
                wait_xfer(agent, h)
            t = time.perf_counter()
            for _ in range(rounds):
                agent.transfer(h)
                wait_xfer(agent, h)
            dt = time.perf_counter() - t
            if agent.query_xfer_backend(h) != b:
                fail(f"asked for {b}, NIXL used {agent.query_xfer_backend(h)}")
            agent.release_xfer_handle(h)
            out.append(f"{op} {b} {rounds * MIB / dt / 1e9:.2f} GB/s")
    print("ok bench: 1 MiB, " + ", ".join(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--target":
        target(sys.argv[2], sys.argv[3])
    else:
        import tempfile

        scratch = tempfile.mkdtemp(prefix="orbitte-nixl-")
        SCRATCH.append(scratch)
        initiator(sys.argv[1], scratch)
