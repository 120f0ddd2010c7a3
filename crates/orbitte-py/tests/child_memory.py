"""Memory for the child processes of the switch tests: a ctypes buffer
and the loop that reports its sha256 (nothing of OrbitTE's)."""

import ctypes
import hashlib
import sys


def buffer(size: int, fill: bytes):
    """``size`` bytes repeating ``fill``: (the ctypes array, its address)."""
    mem = (ctypes.c_char * size).from_buffer(bytearray((fill * (size // len(fill) + 1))[:size]))
    return mem, ctypes.addressof(mem)


def answer_sha(mem) -> None:
    """Answers each "sha" line on stdin with the sha256 of ``mem``, until
    "quit" or the end of input."""
    for line in sys.stdin:
        if line.strip() == "sha":
            print(hashlib.sha256(bytes(mem)).hexdigest(), flush=True)
        elif line.strip() == "quit":
            break
