"""Registers a raw mmap'd range, then unmaps it (or makes it read-only)
and runs one transfer from or into it; run in its own process, so that a
SIGSEGV shows as the exit status instead of ending pytest.

    python unmapped_probe.py PATH OP HOW [SIDE]
    python unmapped_probe.py buffer

PATH is "tcp" or "local", OP "read" or "write", HOW "unmap" or "protect"
(mprotect PROT_READ), SIDE "initiator" (the default: the range is the
request's local memory) or "target" (the range is the target's published
memory, over tcp). "buffer" instead unmaps a range registered with the
Mooncake API and copies into and out of it with write_bytes_to_buffer and
read_bytes_from_buffer. Prints one JSON line: the peer's path, the outcome
(ok, status, failure, drain), whether memory made read-only kept its bytes
and unmapped memory stayed unmapped, and whether a transfer from a fresh
registration completes afterwards.
"""

import ctypes
import json
import mmap
import sys

import orbitte
from orbitte.mooncake import TransferEngine

N = 1 << 20


def libc() -> ctypes.CDLL:
    c = ctypes.CDLL(None, use_errno=True)
    c.mmap.restype = ctypes.c_void_p
    c.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
    c.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    c.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return c


def mappings() -> list[tuple[int, int]]:
    """This process's mappings: (start, end)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = line.split()[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def remote(peer: orbitte.Peer, address: int) -> orbitte.RemoteRange:
    """The peer's range that starts at `address`."""
    return next(r for r in peer.ranges if r.address == address)


def buffer_copies() -> None:
    """The Mooncake API's copies into and out of an unmapped registration."""
    c = libc()
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    addr = c.mmap(None, N, mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert engine.register_memory(addr, N) == 0, engine.last_error()
    before = engine.write_bytes_to_buffer(addr + 8, b"live", 4), engine.read_bytes_from_buffer(addr + 8, 4)
    if c.munmap(addr, N) != 0:
        raise OSError(ctypes.get_errno(), "munmap")
    rc = engine.write_bytes_to_buffer(addr + 8, b"gone", 4)
    write_error = str(engine.last_error())
    got = engine.read_bytes_from_buffer(addr + 8, 4)
    read_error = str(engine.last_error())
    print(json.dumps({
        "before": [before[0], before[1].hex()],
        "write_rc": rc,
        "write_error": write_error,
        "read": got.hex(),
        "read_error": read_error,
        "addr": f"{addr + 8:#x}",
    }), flush=True)


def main() -> None:
    if sys.argv[1] == "buffer":
        return buffer_copies()
    path, op, how = sys.argv[1:4]
    side = sys.argv[4] if len(sys.argv) > 4 else "initiator"
    c = libc()
    addr = c.mmap(None, N, mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    target = orbitte.Engine(listen="127.0.0.1:0", path=path)
    initiator = orbitte.Engine(path=path)
    spare = target.alloc(4096)
    target.register(spare)
    if side == "initiator":
        dst = target.alloc(N)
        target.register(dst)
        remote_at = dst.address
        reg = initiator.register((addr, N), remote=False)
    else:
        target.register((addr, N))
        remote_at = addr
        reg = initiator.register(initiator.alloc(N), remote=False)
    peer = initiator.connect(target.address)
    rc = c.munmap(addr, N) if how == "unmap" else c.mprotect(addr, N, mmap.PROT_READ)
    if rc != 0:
        raise OSError(ctypes.get_errno(), how)
    req = orbitte.read if op == "read" else orbitte.write
    (handle,) = initiator.submit(peer, [req(reg, remote(peer, remote_at))])
    o = handle.wait(30)
    handle.wait_drain(30)
    # Memory made read-only kept its bytes; unmapped memory stayed a hole
    # (had something been mapped there since, the copy would have gone to
    # it: no kernel check can tell).
    kept = how == "unmap" or ctypes.string_at(addr, 64) == bytes(64)
    hole = how != "unmap" or not any(lo < addr + N and addr < hi for lo, hi in mappings())
    # Both engines go on: a transfer between live buffers completes.
    good = initiator.register(bytearray(b"\x22" * 4096), remote=False)
    fresh = initiator.connect(target.address)
    (later,) = initiator.submit(fresh, [orbitte.write(good, remote(fresh, spare.address))]).wait(
        30, check=False)
    print(json.dumps({
        "path": peer.path,
        "ok": o.ok,
        "status": o.status,
        "failure": o.failure,
        "drain": "drained" if handle.drained else "pending",
        "kept": kept,
        "hole": hole,
        "after_ok": later.ok and bytes(spare.view[:4]) == b"\x22" * 4,
    }), flush=True)
    initiator.close()
    target.close()


if __name__ == "__main__":
    main()
