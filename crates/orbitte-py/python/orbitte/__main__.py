"""``python -m orbitte``: the capability matrix, as ``orbitte doctor``
prints it (``--json`` for the data ``orbitte.doctor()`` returns)."""

import argparse
import json
import sys

from . import doctor


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orbitte", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="the matrix as JSON")
    args = ap.parse_args(argv)
    rows = doctor()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(r["path"])
        for check in ("build", "discovery", "completion", "drain"):
            c = r[check]
            line = f"  {check:<11} {c['result'].replace('_', ' ')}"
            if c["result"] == "fail":
                line += f": {c['reason']} (fix: {c['fix']})"
            elif c["result"] == "skipped":
                line += f": {c['why']}"
            print(line)
        for n in r["notes"]:
            print(f"  note: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
