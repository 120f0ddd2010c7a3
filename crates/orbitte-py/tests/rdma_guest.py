"""The rdma path from Python: two processes on a real verbs device.

    python3 rdma_guest.py [--device rxe0]

`cargo xtask softroce test` runs it in the Soft-RoCE guest with the orbitte
wheel unpacked on PYTHONPATH (stdlib only: no numpy, no pytest). A target
process registers memory with Host Direct on the device and listens; this
process connects to it and, through orbitte.Engine, WRITEs a batch with a
notification and READs it back, then through orbitte.mooncake.TransferEngine
with protocol "rdma" does transfer_sync_write/read and the batch calls, then
through orbitte.nixl's agent API WRITEs by prepared lists and indices with a
notification, READs back by initialize_xfer and sends a notification alone.
Every byte, every outcome field and the path are checked: a peer served by
any path other than rdma (a fall back to tcp) fails the run. Exits 0 only
when every check passed.

The target role (``--role target --api engine|mooncake|nixl``) prints one
JSON line (session, address, length, registration path; nixl: the agent's
metadata in base64) and answers one line per command read from stdin:
    sha OFF LEN      sha256 hex of its registered memory at OFF
    notify T         the next notification: "SOURCE PATH PAYLOAD_HEX"
                     (engine), "NAME MSG" (mooncake) or "NAME PAYLOAD_HEX"
                     (nixl), "none" after T s
    quit
"""

import argparse
import base64
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time

import orbitte
from orbitte import nixl
from orbitte.mooncake import TransferEngine, TransferNotify, TransferOpcode

# Soft-RoCE under emulation moves about 16 MB/s with milliseconds of
# latency: generous limits, small buffers.
SIZE = 256 << 10
TIMEOUT = 120.0
FILL = 0x5A


def say(msg: str) -> None:
    print(f"rdma-guest: {msg}", flush=True)


class Failed(Exception):
    pass


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Failed(what)


def pattern(n: int, seed: int) -> bytearray:
    return bytearray((i * 7 + seed * 13 + (i >> 8)) % 251 for i in range(n))


def pinned(mem: bytearray) -> tuple[int, object]:
    """The address of a bytearray, with the ctypes view that keeps it."""
    view = (ctypes.c_char * len(mem)).from_buffer(mem)
    return ctypes.addressof(view), view


# -- target process -----------------------------------------------------------

def target(api: str, device: str) -> None:
    mem = bytearray([FILL]) * SIZE
    if api == "engine":
        eng = orbitte.Engine(listen="127.0.0.1:0", rdma=True, devices=[device],
                             request_timeout=TIMEOUT, handshake_timeout=TIMEOUT)
        reg = eng.register(mem)
        info = {"session": eng.address, "address": reg.address, "registration": reg.path}
    elif api == "nixl":
        agent = nixl_agent("guest-nixl-target", device)
        address, keep = pinned(mem)
        agent.register_memory([(address, SIZE, 0, "")], "DRAM")
        info = {"session": agent.engine.address, "address": address, "registration": "register_memory",
                "metadata": base64.b64encode(agent.get_agent_metadata()).decode()}
    else:
        te = TransferEngine()
        rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", device)
        if rc != 0:
            raise Failed(f"target initialize(protocol='rdma', device_name={device!r}) = {rc}: "
                         f"{te.last_error()}")
        address, keep = pinned(mem)
        rc = te.register_memory(address, SIZE)
        if rc != 0:
            raise Failed(f"target register_memory = {rc}: {te.last_error()}")
        info = {"session": f"127.0.0.1:{te.get_rpc_port()}", "address": address,
                "registration": "register_memory, protocol rdma"}
    info.update(length=SIZE, pid=os.getpid())

    def sha(off: str, n: str) -> str:
        return hashlib.sha256(mem[int(off):int(off) + int(n)]).hexdigest()

    def notify(timeout: str) -> str:
        if api == "engine":
            n = eng.wait_notification(float(timeout))
            return "none" if n is None else f"{n.source_id} {n.path} {n.payload.hex()}"
        if api == "nixl":
            deadline = time.monotonic() + float(timeout)
            while time.monotonic() < deadline:
                for name, msgs in agent.get_new_notifs().items():
                    if msgs:  # one notification per answer: the rest stays for the next
                        agent.notifs.setdefault(name, []).extend(msgs[1:])
                        return f"{name} {msgs[0].hex()}"
                for name, msgs in agent.notifs.items():
                    if msgs:
                        return f"{name} {msgs.pop(0).hex()}"
                time.sleep(0.05)
            return "none"
        deadline = time.monotonic() + float(timeout)
        got = te.get_notifies()
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
            got = te.get_notifies()
        return "none" if not got else f"{got[0].name} {got[0].msg}"

    commands = {"sha": sha, "notify": notify}
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd == ["quit"]:
            break
        if cmd:
            run = commands.get(cmd[0])
            print(run(*cmd[1:]) if run else f"unknown command {cmd[0]}", flush=True)
    {"engine": lambda: eng, "nixl": lambda: agent, "mooncake": lambda: te}[api]().close()


class Target:
    def __init__(self, api: str, device: str):
        self.api = api
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--role", "target", "--api", api, "--device", device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise Failed(f"the {api} target process exited with {self.proc.wait()} before "
                         "listening (its error is above)")
        self.info = json.loads(line)
        say(f"{api} target process {self.info['pid']}: {self.info['session']}, "
            f"{self.info['length']} bytes at {self.info['address']:#x} "
            f"({self.info['registration']})")

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer:
            raise Failed(f"the {self.api} target process died (exit {self.proc.wait()})")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                rc = self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
                raise Failed(f"the {self.api} target process did not exit on quit") from None
        else:
            rc = self.proc.returncode
        expect(rc == 0, f"the {self.api} target process exited with {rc}")


def check_outcomes(outcomes: list, op: str, lengths: list[int], notified: bool) -> None:
    expect(len(outcomes) == len(lengths), f"{len(outcomes)} outcomes for {len(lengths)} requests")
    for o, n in zip(outcomes, lengths):
        d = o.to_dict()
        expect(o.ok and d["status"] == "complete", f"{op}: {o!r}")
        expect(d["op"] == op and d["length"] == n and d["completed_prefix"] == n,
               f"{op}: completed prefix {d['completed_prefix']} of {n}: {d}")
        expect(d["failure"] is None and d["uncertain"][0] == d["uncertain"][1],
               f"{op}: a completed request reports a failure or uncertain bytes: {d}")
        expect(d["drain"] == "drained", f"{op}: not drained after wait: {d}")
        want_effect = "complete" if op == "write" else "none"
        expect(d["remote_effect"] == want_effect,
               f"{op}: remote effect {d['remote_effect']}, want {want_effect}: {d}")
        want_note = "sent" if notified else "not_requested"
        expect(d["notification"] == want_note,
               f"{op}: notification {d['notification']}, want {want_note}: {d}")


# -- orbitte.Engine -----------------------------------------------------------

def engine_api(device: str) -> None:
    t = Target("engine", device)
    eng = orbitte.Engine(rdma=True, devices=[device], request_timeout=TIMEOUT,
                         handshake_timeout=TIMEOUT)
    try:
        expect(t.info["registration"] == "host_direct",
               f"target registration path {t.info['registration']}, want host_direct")
        src = pattern(SIZE, 1)
        dst = bytearray(SIZE)
        rs = eng.register(src, remote=False)
        rd = eng.register(dst, remote=False)
        expect(rs.path == rd.path == "host_direct",
               f"initiator registration paths {rs.path}, {rd.path}, want host_direct")
        peer = eng.connect(t.info["session"])
        say(f"engine: connected to {peer.source_id} epoch {peer.epoch}: path {peer.path}, "
            f"fell back from {peer.fell_back}")
        expect(peer.path == "rdma",
               f"the peer is served by {peer.path!r}, not rdma (given up: {peer.fell_back})")
        expect(len(peer.ranges) == 1 and peer.range(0).address == t.info["address"]
               and peer.range(0).length == SIZE, f"published ranges {peer.ranges}")

        # WRITE the first half in four requests, with a notification.
        half, block = SIZE // 2, SIZE // 8
        writes = [orbitte.write(rs, peer.range(0), block, local_offset=o, remote_offset=o, label=i)
                  for i, o in enumerate(range(0, half, block))]
        started = time.monotonic()
        outcomes = eng.submit(peer, writes, notify=b"rdma-guest:write").wait(TIMEOUT)
        check_outcomes(outcomes, "write", [block] * 4, notified=True)
        say(f"engine: WRITE 4 x {block} bytes with a notification: complete, drained "
            f"({time.monotonic() - started:.2f} s)")
        note = t.ask(f"notify {TIMEOUT}").split()
        expect(note != ["none"], "the target got no notification")
        expect(note == [eng.source_id, "rdma", b"rdma-guest:write".hex()],
               f"the target's notification is {note}, want [{eng.source_id}, rdma, payload]")
        say("engine: the target got the notification over rdma, once the batch was placed")
        expect(t.ask(f"sha 0 {half}") == hashlib.sha256(src[:half]).hexdigest(),
               "the target's memory does not hold the bytes written")
        expect(t.ask(f"sha {half} {half}") == hashlib.sha256(bytes([FILL]) * half).hexdigest(),
               "the target's memory past the written half changed")

        # READ everything back: the written half and the untouched one.
        reads = [orbitte.read(rd, peer.range(0), half, local_offset=0, remote_offset=0),
                 orbitte.read(rd, peer.range(0), half, local_offset=half, remote_offset=half)]
        started = time.monotonic()
        outcomes = eng.submit(peer, reads).wait(TIMEOUT)
        check_outcomes(outcomes, "read", [half, half], notified=False)
        expect(dst[:half] == src[:half], "READ back: the written half differs")
        expect(dst[half:] == bytes([FILL]) * half, "READ back: the untouched half differs")
        say(f"engine: READ back 2 x {half} bytes: every byte matches "
            f"({time.monotonic() - started:.2f} s)")
        again = eng.connect(t.info["session"])
        expect(again.path == "rdma", f"after the transfers the peer's path is {again.path!r}")
    finally:
        eng.close()
        t.close()
    say("engine: ok")


# -- orbitte.nixl -------------------------------------------------------------

def nixl_agent(name: str, device: str) -> "nixl.nixl_agent":
    conf = nixl.nixl_agent_config(listen="127.0.0.1:0", path="rdma", rdma=True, devices=[device],
                                  request_timeout=TIMEOUT, handshake_timeout=TIMEOUT)
    return nixl.nixl_agent(name, conf)


def nixl_done(agent, handle, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    state = agent.check_xfer_state(handle)
    while state == "PROC" and time.monotonic() < deadline:
        time.sleep(0.005)
        state = agent.check_xfer_state(handle)
    expect(state == "DONE", f"nixl: {what} ended {state}: {handle.error}")


def nixl_api(device: str) -> None:
    t = Target("nixl", device)
    agent = nixl_agent("guest-nixl-initiator", device)
    try:
        src, dst = pattern(SIZE, 3), bytearray(SIZE)
        src_addr, src_keep = pinned(src)
        dst_addr, dst_keep = pinned(dst)
        agent.register_memory([(src_addr, SIZE, 0, ""), (dst_addr, SIZE, 0, "")], "DRAM")
        name = agent.add_remote_agent(base64.b64decode(t.info["metadata"]))
        expect(name == b"guest-nixl-target", f"add_remote_agent returned {name!r}")
        peer = agent.peer("guest-nixl-target")
        say(f"nixl: added agent {name.decode()} epoch {peer.epoch}: path {peer.path}, "
            f"fell back from {peer.fell_back}")
        expect(peer.path == "rdma", f"the agent is served by {peer.path!r}, not rdma (given up: {peer.fell_back})")
        blocks = 8
        n = SIZE // 2 // blocks
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", [(src_addr + i * n, n, 0) for i in range(blocks)], "DRAM")
        remote = agent.prep_xfer_dlist("guest-nixl-target",
                                       [(t.info["address"] + i * n, n, 0) for i in range(blocks)], "DRAM")
        order = list(range(blocks))[::-1]
        started = time.monotonic()
        h = agent.make_prepped_xfer("WRITE", local, list(range(blocks)), remote, order, b"rdma-guest:nixl")
        agent.transfer(h)
        nixl_done(agent, h, "WRITE by prepared lists")
        agent.release_xfer_handle(h)
        say(f"nixl: WRITE of {blocks} x {n} bytes by index with a notification: DONE "
            f"({time.monotonic() - started:.2f} s)")
        expect(t.ask(f"notify {TIMEOUT}") == f"guest-nixl-initiator {b'rdma-guest:nixl'.hex()}",
               "the nixl target got no notification from the initiator")
        want = bytearray(SIZE // 2)
        for i, j in zip(range(blocks), order):
            want[j * n:(j + 1) * n] = src[i * n:(i + 1) * n]
        expect(t.ask(f"sha 0 {SIZE // 2}") == hashlib.sha256(want).hexdigest(),
               "the nixl target's memory does not hold the blocks written by index")
        h = agent.initialize_xfer("READ", agent.get_xfer_descs([(dst_addr, SIZE, 0)], "DRAM"),
                                  agent.get_xfer_descs([(t.info["address"], SIZE, 0)], "DRAM"),
                                  "guest-nixl-target")
        agent.transfer(h)
        nixl_done(agent, h, "READ by initialize_xfer")
        agent.release_xfer_handle(h)
        expect(dst[:SIZE // 2] == want and dst[SIZE // 2:] == bytes([FILL]) * (SIZE // 2),
               "nixl: READ back: the bytes differ")
        agent.send_notif("guest-nixl-target", b"standalone")
        expect(t.ask(f"notify {TIMEOUT}") == f"guest-nixl-initiator {b'standalone'.hex()}",
               "the nixl target did not get send_notif's notification")
        expect(agent.peer("guest-nixl-target").path == "rdma", "after the transfers the agent is not on rdma")
        say("nixl: READ back by initialize_xfer matches; send_notif delivered")
    finally:
        agent.close()
        t.close()
    say("nixl: ok")


# -- orbitte.mooncake.TransferEngine ------------------------------------------

def mooncake_api(device: str) -> None:
    t = Target("mooncake", device)
    te = TransferEngine()
    try:
        rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", device)
        expect(rc == 0, f"initialize(protocol='rdma', device_name={device!r}) = {rc}: "
               f"{te.last_error()}")
        expect(device in te.get_local_topology().split(","),
               f"get_local_topology() = {te.get_local_topology()!r} lacks {device}")
        src, dst = pattern(SIZE, 2), bytearray(SIZE)
        src_addr, src_keep = pinned(src)
        dst_addr, dst_keep = pinned(dst)
        expect(te.register_memory(src_addr, SIZE) == 0, f"register_memory: {te.last_error()}")
        expect(te.register_memory(dst_addr, SIZE) == 0, f"register_memory: {te.last_error()}")
        session, remote = t.info["session"], t.info["address"]
        quarter = SIZE // 4

        def ok(call: str, rc: int) -> None:
            expect(rc == 0, f"{call} = {rc}: {te.last_error()}")

        started = time.monotonic()
        ok("transfer_sync_write", te.transfer_sync_write(session, src_addr, remote, quarter))
        path = te._native.connect(session).path
        say(f"mooncake: transfer_sync_write of {quarter} bytes: 0, session {session} on path {path}")
        expect(path == "rdma", f"the session is served by {path!r}, not rdma")
        ok("transfer_sync(WRITE, notify)",
           te.transfer_sync(session, src_addr + quarter, remote + quarter, quarter,
                            TransferOpcode.WRITE, notify=TransferNotify("rdma-guest", "kv-ready")))
        expect(t.ask(f"notify {TIMEOUT}") == "rdma-guest kv-ready",
               "the target's get_notifies() lacks the notification")
        blocks = 8
        n = quarter // blocks
        ok("batch_transfer_sync_write",
           te.batch_transfer_sync_write(session, [src_addr + 2 * quarter + i * n for i in range(blocks)],
                                        [remote + 2 * quarter + i * n for i in range(blocks)],
                                        [n] * blocks))
        expect(t.ask(f"sha 0 {3 * quarter}") == hashlib.sha256(src[:3 * quarter]).hexdigest(),
               "the target's memory does not hold the bytes written")
        ok("transfer_sync_read", te.transfer_sync_read(session, dst_addr, remote, 2 * quarter))
        ok("batch_transfer_sync_read",
           te.batch_transfer_sync_read(session, [dst_addr + 2 * quarter + i * n for i in range(2 * blocks)],
                                       [remote + 2 * quarter + i * n for i in range(2 * blocks)],
                                       [n] * 2 * blocks))
        expect(dst[:3 * quarter] == src[:3 * quarter], "READ back: the written bytes differ")
        expect(dst[3 * quarter:] == bytes([FILL]) * quarter, "READ back: the untouched bytes differ")
        path = te._native.connect(session).path
        expect(path == "rdma", f"after the transfers the session's path is {path!r}")
        say(f"mooncake: write, write with notify, batch write, read and batch read: every byte "
            f"matches on path {path} ({time.monotonic() - started:.2f} s)")
        ok("unregister_memory", te.unregister_memory(src_addr))
        ok("unregister_memory", te.unregister_memory(dst_addr))
    finally:
        te.close()
        t.close()
    say("mooncake: ok")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["initiator", "target"], default="initiator")
    ap.add_argument("--api", choices=["engine", "mooncake", "nixl"], default="engine")
    ap.add_argument("--device", default=os.environ.get("ORBITTE_TEST_DEVICE") or "rxe0")
    args = ap.parse_args()
    if args.role == "target":
        target(args.api, args.device)
        return 0
    try:
        # The package under test is the one on PYTHONPATH (the unpacked wheel).
        site = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
        say(f"orbitte from {os.path.dirname(orbitte.__file__)}, Python {sys.version.split()[0]}")
        expect(not site or os.path.abspath(orbitte.__file__).startswith(os.path.abspath(site) + os.sep),
               f"orbitte was imported from {orbitte.__file__}, not from PYTHONPATH {site}")
        probe = orbitte.Engine(rdma=True)
        devices = probe._native.rdma_devices()
        probe.close()
        say(f"rdma devices: {devices}")
        expect(args.device in devices, f"{args.device} is not among the rdma devices {devices}")
        engine_api(args.device)
        mooncake_api(args.device)
        nixl_api(args.device)
    except Failed as e:
        say(f"FAILED: {e}")
        return 1
    say("all checks passed (engine, mooncake and nixl APIs on path rdma)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
