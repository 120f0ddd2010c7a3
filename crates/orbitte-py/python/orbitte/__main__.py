"""``python -m orbitte``: ``orbitte doctor``, the same program and the
same output (``--json``: the document docs/json.md describes, whose
``paths`` rows are what ``orbitte.doctor()`` returns)."""

import sys

from ._orbitte import cli_main


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    return cli_main(["orbitte", "doctor", *args])


if __name__ == "__main__":
    sys.exit(main())
