"""Switches a process from Mooncake's or NIXL's transfer engine to OrbitTE
by one setting: ``ORBITTE_REPLACE=mooncake,nixl`` (either name, or both).

The wheel installs ``orbitte-replace.pth``, which Python's ``site`` runs at
start-up: when ``ORBITTE_REPLACE`` is set it calls
:func:`install_from_environment`, which puts a finder first on
``sys.meta_path``. The finder maps only the transfer-engine modules to
OrbitTE's:

- ``mooncake``: ``mooncake.engine`` is ``orbitte.mooncake``;
- ``nixl``: ``nixl._api`` and ``nixl._bindings`` are ``orbitte.nixl``, and
  the names NIXL's package exports (``nixl.nixl_agent``, ...) are OrbitTE's.

Every other module of a real ``mooncake`` or ``nixl`` package that is
installed (``mooncake.store``, ``nixl.logging``, ...) imports from that
package as before. Where the package is not installed, the finder stands in
for it with an empty package holding only the mapped modules.

This module is outside the ``orbitte`` package so that start-up imports
nothing more: OrbitTE itself loads on the first import of a mapped module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

__all__ = ["PACKAGES", "install", "install_from_environment", "installed"]

#: For each package that can be replaced: its modules that OrbitTE stands
#: for, and the names its ``__init__`` exports from them.
PACKAGES = {
    "mooncake": {
        "modules": {"engine": "orbitte.mooncake"},
        "exports": {},
    },
    "nixl": {
        "modules": {"_api": "orbitte.nixl", "_bindings": "orbitte.nixl"},
        "exports": {
            name: "orbitte.nixl"
            for name in (
                "DEFAULT_COMM_PORT", "nixl_agent", "nixl_agent_config", "nixl_backend_handle",
                "nixl_prepped_dlist_handle", "nixl_thread_sync_t", "nixl_xfer_handle",
                # What NIXL's __init__ also binds from nixl._bindings.
                "nixlBackendError", "nixlCancelledError", "nixlError", "nixlInvalidParamError",
                "nixlMismatchError", "nixlNoTelemetryError", "nixlNotAllowedError", "nixlNotFoundError",
                "nixlNotPostedError", "nixlNotSupportedError", "nixlRegDList", "nixlRemoteDisconnectError",
                "nixlRepostActiveError", "nixlUnknownError", "nixlXferDList", "nixlXferTelemetry",
            )
        },
    },
}

ENV = "ORBITTE_REPLACE"


class ReplaceWarning(UserWarning):
    """A problem with the ``ORBITTE_REPLACE`` setting, or with the real
    package it replaces parts of."""


class _Alias(importlib.abc.Loader):
    """Loads a mapped module as the OrbitTE module it stands for: the import
    system then hands out that very module (``sys.modules`` holds it under
    both names)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _Package(importlib.abc.Loader):
    """Loads a replaced package: the real one where it is installed (its
    ``__init__`` runs as usual), else an empty package; then unbinds the
    mapped modules and exports the real ``__init__`` may have bound, so
    that they resolve to OrbitTE's on first use."""

    def __init__(self, name: str, real) -> None:
        self.name = name
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec) if self.real is not None else None

    def exec_module(self, module) -> None:
        if self.real is not None:
            try:
                self.real.exec_module(module)
            except Exception as e:  # noqa: BLE001 (the real package's own failure)
                warnings.warn(
                    f"{ENV}: the installed {self.name!r} package failed to import ({type(e).__name__}: {e}); "
                    f"OrbitTE's modules stand in for its transfer engine, its other modules may not import",
                    ReplaceWarning,
                    stacklevel=2,
                )
        table = PACKAGES[self.name]
        for sub in table["modules"]:
            sys.modules.pop(f"{self.name}.{sub}", None)
            module.__dict__.pop(sub, None)
        for export in table["exports"]:
            module.__dict__.pop(export, None)
        fallback = module.__dict__.get("__getattr__")
        name = self.name

        def __getattr__(attr: str):  # noqa: N807 (PEP 562)
            if attr in table["modules"]:
                return importlib.import_module(f"{name}.{attr}")
            if attr in table["exports"]:
                return getattr(importlib.import_module(table["exports"][attr]), attr)
            if fallback is not None:
                return fallback(attr)
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")

        module.__getattr__ = __getattr__

    def __getattr__(self, attr: str):
        # Resource readers and source access of the real package's loader.
        if self.real is None:
            raise AttributeError(attr)
        return getattr(self.real, attr)


class Finder(importlib.abc.MetaPathFinder):
    """Maps the transfer-engine modules of the replaced packages to
    OrbitTE's; first on ``sys.meta_path``."""

    def __init__(self, packages) -> None:
        self.packages = tuple(packages)

    def find_spec(self, fullname, path=None, target=None):
        top, _, sub = fullname.partition(".")
        if top not in self.packages:
            return None
        if not sub:
            real = self._real_spec(fullname)
            if real is None:
                return importlib.machinery.ModuleSpec(fullname, _Package(fullname, None), is_package=True)
            real.loader = _Package(fullname, real.loader)
            return real
        target_module = PACKAGES[top]["modules"].get(sub)
        if target_module is None:
            return None  # the real package's own module, found as usual
        return importlib.machinery.ModuleSpec(fullname, _Alias(target_module))

    def _real_spec(self, name: str):
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, None)
            if spec is not None:
                return spec
        return None


def installed() -> tuple:
    """The packages this process replaces (empty when none)."""
    for finder in sys.meta_path:
        if isinstance(finder, Finder):
            return finder.packages
    return ()


def install(packages) -> tuple:
    """Replaces the transfer engines of ``packages`` (names from
    :data:`PACKAGES`) in this process, from now on; returns the packages
    replaced. A package already imported keeps its modules (install before
    the framework imports it); the call warns for each such package."""
    wanted = []
    for p in packages:
        if p not in PACKAGES:
            raise ValueError(f"{ENV}: {p!r} is not a package OrbitTE replaces: use {', '.join(sorted(PACKAGES))}")
        if p not in wanted:
            wanted.append(p)
    for p in wanted:
        if p in sys.modules:
            warnings.warn(f"{ENV}: {p!r} was imported before the switch; its modules stay the real ones",
                          ReplaceWarning, stacklevel=2)
    packages = tuple(dict.fromkeys(installed() + tuple(wanted)))
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
    sys.meta_path.insert(0, Finder(packages))
    return packages


def install_from_environment() -> tuple:
    """:func:`install` with the comma-separated names in ``ORBITTE_REPLACE``
    (nothing when it is unset or empty). A name it does not know is
    skipped with a :class:`ReplaceWarning` naming the known ones: start-up
    goes on."""
    names = [n.strip().lower() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in PACKAGES]
    if unknown:
        warnings.warn(
            f"{ENV}={os.environ.get(ENV)!r}: {', '.join(map(repr, unknown))} not known; "
            f"use a comma-separated list of {', '.join(sorted(PACKAGES))}",
            ReplaceWarning,
            stacklevel=2,
        )
    known = [n for n in names if n in PACKAGES]
    return install(known) if known else ()
