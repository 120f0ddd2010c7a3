"""examples/nixl_bench.py (outside the wheel) runs on both paths and
reports the three loops; the figures themselves are the bench's, not a
test's."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "examples" / "nixl_bench.py"


def test_nixl_bench_reports_the_three_loops():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--paths", "local,tcp", "--descriptors", "256", "--duration", "0.1",
         "--rounds", "1", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["path"], r["order"], r["requests"]) for r in rows] == [
        ("local", "random", 256), ("local", "sequential", 1), ("tcp", "random", 256), ("tcp", "sequential", 1)]
    for r in rows:
        for loop in ("nixl", "rust", "engine", "submit"):
            assert r[f"{loop}_mdesc_s"] > 0 and r[f"{loop}_gbps"] > 0
        assert r["nixl_over_rust"] > 0 and r["engine_over_rust"] > 0
