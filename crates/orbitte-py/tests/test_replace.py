"""ORBITTE_REPLACE: one setting switches a process from Mooncake's or
NIXL's transfer engine to OrbitTE. Each test starts two processes the way a
deployment starts them (the variable in their environment, an unmodified
script that imports Mooncake's or NIXL's module), and checks the bytes."""

import base64
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SIZE = 1 << 20


def switched_env(packages: str, extra_path=None, **more) -> dict:
    env = dict(os.environ, ORBITTE_REPLACE=packages, **more)
    env.pop("MC_FORCE_TCP", None)
    env.update(more)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def test_the_wheel_installed_the_switch():
    """The switch is the wheel's: its .pth file sits in site-packages."""
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / "orbitte-replace.pth"
    assert pth.is_file(), f"{pth} missing: install the wheel (maturin build), not a source tree"
    assert (site / "_orbitte_replace.py").is_file()
    assert "ORBITTE_REPLACE" in pth.read_text()


def pattern_sha(size: int) -> str:
    import hashlib

    return hashlib.sha256((bytes(range(251)) * (size // 251 + 1))[:size]).hexdigest()


def test_mooncake_deployment_switched_by_one_setting(tmp_path):
    env = switched_env("mooncake")
    target = subprocess.Popen([sys.executable, str(HERE / "deployed_mooncake.py"), "target", str(SIZE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(target.stdout.readline())
        assert info["module"] == "orbitte.mooncake"
        out = subprocess.run([sys.executable, str(HERE / "deployed_mooncake.py"), "initiator", info["session"],
                              str(info["address"]), str(SIZE)], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["rc"] == 0 and got["module"] == "orbitte.mooncake"
        target.stdin.write("sha\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == got["sha"] == pattern_sha(SIZE)
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def test_without_the_setting_nothing_is_switched(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import sys\n"
                          "try:\n import mooncake.engine\nexcept ImportError as e: print('ImportError', e.name)\n"
                          "print('_orbitte_replace' in sys.modules, 'orbitte' in sys.modules)"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "ORBITTE_REPLACE": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ImportError", "mooncake", "False", "False"]


def test_the_real_packages_other_modules_stay_importable(tmp_path):
    """With a real `mooncake` and `nixl` installed, only their transfer
    engines are OrbitTE's: `mooncake.store` and `nixl.logging` are theirs,
    and the real `nixl/__init__.py` (which binds `nixl._api` itself, as
    NIXL's does) runs."""
    real = tmp_path / "site"
    (real / "mooncake").mkdir(parents=True)
    (real / "mooncake" / "__init__.py").write_text("REAL = True\n")
    (real / "mooncake" / "engine.py").write_text("raise ImportError('the real engine needs RDMA libraries')\n")
    (real / "mooncake" / "store.py").write_text("class MooncakeDistributedStore:\n    pass\n")
    (real / "nixl").mkdir()
    (real / "nixl" / "__init__.py").write_text(
        "import sys, types\n"
        "_api = types.ModuleType('nixl_cu12._api')\n"
        "_api.nixl_agent = 'the real agent'\n"
        "sys.modules['nixl._api'] = _api\n"
        "nixl_agent = _api.nixl_agent\n"
        "from . import logging\n")
    (real / "nixl" / "logging.py").write_text("def get_logger(name):\n    return name\n")
    script = (
        "import mooncake, mooncake.store, nixl, nixl.logging\n"
        "from mooncake.engine import TransferEngine\n"
        "from nixl._api import nixl_agent, nixl_thread_sync_t\n"
        "from nixl._bindings import nixlXferTelemetry\n"
        "from nixl import nixl_agent as top\n"
        "print(mooncake.REAL, mooncake.store.MooncakeDistributedStore.__module__, nixl.logging.get_logger('x'))\n"
        "print(TransferEngine.__module__, nixl_agent.__module__, top is nixl_agent,\n"
        "      nixl_thread_sync_t.__module__, nixlXferTelemetry.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=switched_env("mooncake,nixl", real))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["True", "mooncake.store", "x"]
    assert lines[1].split() == ["orbitte.mooncake", "orbitte.nixl", "True", "orbitte.nixl", "orbitte.nixl"]


def test_an_unknown_name_warns_and_start_up_goes_on():
    out = subprocess.run([sys.executable, "-c", "import mooncake.engine as e; print(e.__name__)"],
                         capture_output=True, text=True, timeout=60, env=switched_env("mooncake, ucx"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "orbitte.mooncake"
    assert "'ucx' not known" in out.stderr and "mooncake, nixl" in out.stderr


def test_nixl_deployment_switched_by_one_setting():
    env = switched_env("nixl")
    name = f"decode-{os.getpid()}"
    target = subprocess.Popen([sys.executable, str(HERE / "deployed_nixl.py"), "target", name, str(SIZE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(target.stdout.readline())
        assert info["module"] == "orbitte.nixl"
        out = subprocess.run([sys.executable, str(HERE / "deployed_nixl.py"), "initiator", f"prefill-{os.getpid()}",
                              info["metadata"], str(info["address"]), str(SIZE)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert (got["state"], got["module"], got["sync"]) == ("DONE", "orbitte.nixl", "orbitte.nixl")
        target.stdin.write("wait done\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == got["sha"] == pattern_sha(SIZE)
        assert base64.b64decode(info["metadata"])  # the metadata went through the side channel as bytes
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def test_every_switched_name_exists_in_orbitte():
    import importlib

    import _orbitte_replace

    for package, table in _orbitte_replace.PACKAGES.items():
        for sub, target in table["modules"].items():
            assert importlib.import_module(target), (package, sub)
        for name, target in table["exports"].items():
            assert hasattr(importlib.import_module(target), name), f"{package}.{name}: {target} has no {name}"


def test_a_real_package_that_fails_to_import_warns_and_the_switch_goes_on(tmp_path):
    """NIXL's __init__ raises ImportError without its CUDA wheel: the switch
    warns with the cause and still serves the switched modules."""
    real = tmp_path / "site"
    (real / "nixl").mkdir(parents=True)
    (real / "nixl" / "__init__.py").write_text("raise ImportError('No NIXL CUDA backend found')\n")
    out = subprocess.run([sys.executable, "-c", "from nixl._api import nixl_agent; print(nixl_agent.__module__)"],
                         capture_output=True, text=True, timeout=60, env=switched_env("nixl", real))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "orbitte.nixl"
    assert "ReplaceWarning" in out.stderr and "No NIXL CUDA backend found" in out.stderr
