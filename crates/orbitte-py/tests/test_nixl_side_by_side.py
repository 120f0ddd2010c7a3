"""examples/nixl_side_by_side.py (outside the wheel) runs its two
processes on orbitte.nixl, reports every round, and names the fix when
the interpreter it is given cannot import NIXL."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "examples" / "nixl_side_by_side.py"


def test_orbitte_side_reports_each_op_and_round():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--impls", "orbitte", "--block-size", "64K", "--descriptors", "4",
         "--seconds", "0.2", "--rounds", "2", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    cells = json.loads(out.stdout)
    assert [(c["op"], c["block_size"], c["descriptors"], c["inflight"]) for c in cells] == [
        ("write", 65536, 4, 2), ("read", 65536, 4, 2)]
    for c in cells:
        assert len(c["orbitte_rounds_gbps"]) == 2 and all(g > 0 for g in c["orbitte_rounds_gbps"])
        assert c["orbitte_gbps"] == sum(c["orbitte_rounds_gbps"]) / 2  # the median of two rounds
        assert "nixl_gbps" not in c and "orbitte_over_nixl" not in c


@pytest.mark.skipif(importlib.util.find_spec("nixl") is not None, reason="NIXL is importable here")
def test_an_interpreter_without_nixl_is_named_with_the_fix():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--impls", "nixl", "--nixl-python", sys.executable, "--ops", "write",
         "--seconds", "0.1", "--rounds", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert f"is NIXL importable by {sys.executable}?" in out.stderr and "--nixl-python" in out.stderr


def test_an_unknown_engine_is_refused_by_name():
    out = subprocess.run([sys.executable, str(SCRIPT), "--impls", "ucx"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "--impls: unknown engine 'ucx'" in out.stderr
