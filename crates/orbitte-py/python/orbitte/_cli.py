"""The ``orbitte`` command the wheel installs: the same program as the
Rust binary (doctor, topology, bench, serve), run in this process."""

import sys

from ._orbitte import cli_main


def main() -> None:
    sys.exit(cli_main(["orbitte", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
