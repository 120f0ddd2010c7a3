"""OrbitTE's NIXL backend plugin, ``libplugin_OrbitTE.so``, as the wheel
carries it, and a folder NIXL can load it from.

NIXL loads plugins from the one folder ``NIXL_PLUGIN_DIR`` names and then
no longer looks in its own, so :func:`plugin_dir` prepares a folder that
holds a link to OrbitTE's plugin and links to every plugin of the
installed ``nixl-cu12`` wheel (UCX among them). Those find their
libraries through ``LD_LIBRARY_PATH``: :func:`ld_library_path` names the
folder to add.

``ORBITTE_NIXL_PLUGIN`` names another ``libplugin_OrbitTE.so`` (one built
from source) to use instead of the wheel's.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

__all__ = ["PLUGIN_NAME", "NoPluginError", "ld_library_path", "nixl_plugins", "plugin_dir", "plugin_file"]

#: NIXL names a backend after its library: ``libplugin_<NAME>.so``.
PLUGIN_NAME = "libplugin_OrbitTE.so"

_BUILD_HINT = (
    "build it with `NIXL_INCLUDE_DIR=/path/to/nixl/include cargo build --release -p orbitte-nixl` "
    "and set ORBITTE_NIXL_PLUGIN to target/release/libplugin_OrbitTE.so, or install a wheel built "
    "with NIXL_INCLUDE_DIR set (`NIXL_INCLUDE_DIR=... cargo xtask wheel`)"
)


class NoPluginError(FileNotFoundError):
    """There is no ``libplugin_OrbitTE.so`` to offer NIXL."""


def plugin_file() -> Path:
    """The plugin library: ``ORBITTE_NIXL_PLUGIN`` where set, else the one
    inside this package. Raises :class:`NoPluginError` naming the cause."""
    chosen = os.environ.get("ORBITTE_NIXL_PLUGIN")
    if chosen:
        path = Path(chosen).absolute()
        if not path.is_file():
            raise NoPluginError(f"ORBITTE_NIXL_PLUGIN={chosen}: no such file; {_BUILD_HINT}")
        return path
    path = Path(__file__).absolute().parent / PLUGIN_NAME
    if not path.is_file():
        raise NoPluginError(
            f"this orbitte package carries no NIXL plugin ({path} does not exist): "
            f"its wheel was built without NIXL's headers; {_BUILD_HINT}"
        )
    return path


def _nixl_libs() -> Optional[Path]:
    """The ``nixl_cu12.libs`` folder of the installed ``nixl-cu12`` wheel
    (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("nixl_cu12")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    libs = Path(spec.origin).parent.with_name("nixl_cu12.libs")
    return libs if libs.is_dir() else None


def nixl_plugins() -> list[Path]:
    """Every plugin of the installed ``nixl-cu12`` wheel (empty when it is
    not installed)."""
    libs = _nixl_libs()
    if libs is None:
        return []
    return sorted(p for p in (libs / "nixl").glob("libplugin_*.so") if p.name != PLUGIN_NAME)


def ld_library_path() -> Optional[str]:
    """The folder ``LD_LIBRARY_PATH`` must include for the ``nixl-cu12``
    wheel's plugins to load (None when that wheel is not installed)."""
    libs = _nixl_libs()
    return str(libs) if libs is not None else None


def _default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "orbitte" / "nixl-plugins"


def _link(target: Path, link: Path) -> None:
    """Point ``link`` at ``target``, replacing what is there in one step
    (another process may be reading the folder)."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def plugin_dir(path: Optional[os.PathLike] = None) -> Path:
    """Prepare and return a folder to give NIXL as ``NIXL_PLUGIN_DIR``: a
    link to OrbitTE's plugin and links to the ``nixl-cu12`` wheel's plugins.
    ``path`` defaults to ``orbitte/nixl-plugins`` under the user's cache
    folder (``XDG_CACHE_HOME``, else ``~/.cache``). Links this function made
    before and whose plugin is gone are removed; other files are left."""
    ours = plugin_file()
    folder = Path(path) if path is not None else _default_dir()
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {PLUGIN_NAME: ours}
    for p in nixl_plugins():
        wanted[p.name] = p
    for old in folder.glob("libplugin_*.so"):
        if old.is_symlink() and old.name not in wanted:
            old.unlink()
    for name, target in wanted.items():
        _link(target, folder / name)
    return folder.absolute()
