"""``python -m orbitte.nixl_plugin``: prepare the folder NIXL loads
OrbitTE's plugin from and print it (stdout: the folder alone). ``--env``
prints the ``export`` lines instead, for ``eval "$(python -m
orbitte.nixl_plugin --env)"``."""

from __future__ import annotations

import argparse
import shlex
import sys

from . import NoPluginError, ld_library_path, plugin_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orbitte.nixl_plugin",
        description="Prepare a NIXL_PLUGIN_DIR holding OrbitTE's NIXL plugin and nixl-cu12's plugins, and print it.",
    )
    parser.add_argument("--dir", help="the folder to prepare (default: orbitte/nixl-plugins under ~/.cache)")
    parser.add_argument("--env", action="store_true", help="print export lines for NIXL_PLUGIN_DIR and LD_LIBRARY_PATH")
    args = parser.parse_args(argv)
    try:
        folder = plugin_dir(args.dir)
    except (NoPluginError, OSError) as e:
        print(f"python -m orbitte.nixl_plugin: {e}", file=sys.stderr)
        return 1
    libs = ld_library_path()
    ld_line = f'export LD_LIBRARY_PATH={shlex.quote(libs)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"' if libs else None
    if args.env:
        print(f"export NIXL_PLUGIN_DIR={shlex.quote(str(folder))}")
        if ld_line:
            print(ld_line)
        return 0
    print(folder)
    if ld_line:
        print(f"NIXL's own plugins there need their libraries: {ld_line}", file=sys.stderr)
    else:
        print("nixl-cu12 is not installed here: the folder holds OrbitTE's plugin only", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
