"""examples/bench.py (the Python layer's overhead, outside the wheel) runs
and reports both loops."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "examples" / "bench.py"


def test_bench_reports_the_python_and_the_rust_loop():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--path", "tcp", "--duration", "0.1", "--rounds", "1",
         "--threads", "1,2", "--cases", "64x4096,2x1048576", "--orbitte", "", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["batch"], r["block"], r["threads"]) for r in rows] == [
        (64, 4096, 1), (64, 4096, 2), (2, 1 << 20, 1), (2, 1 << 20, 2)]
    for r in rows:
        assert r["path"] == "tcp"
        assert r["python_gbps"] > 0 and r["rust_gbps"] > 0 and r["ratio"] > 0


def test_the_wheel_has_no_bench():
    import orbitte

    assert not (Path(orbitte.__file__).parent / "bench.py").exists()
