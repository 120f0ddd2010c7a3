"""orbitte.nixl's "VRAM" descriptors on Engine.register_device (the
cuda-staging path), without a GPU: on orbitte-cuda's fake libcuda (built by
test_gpu_mooncake.py's fixture), and on this host's own driver when it has
a device."""

import os
import subprocess
import sys
from pathlib import Path

from test_gpu_mooncake import gpu_or_skip, stub_dir  # noqa: F401 (the fixture)

HERE = Path(__file__).parent


def run(stub) -> None:
    env = dict(os.environ)
    if stub is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(stub)] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p])
        env["ORBITTE_STUB_LIBCUDA"] = str(stub / "libcuda.so.1")
    else:
        env["ORBITTE_STUB_LIBCUDA"] = "libcuda.so.1"
    env["ORBITTE_STUB_MODE"] = "fake-gpu"
    env["ORBITTE_STUB_COPY_DELAY_US"] = "200"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, str(HERE / "nixl_gpu_guest.py")], env=env, capture_output=True, text=True,
                       timeout=120)
    text = f"{r.stdout}\n--- stderr ---\n{r.stderr}"
    assert r.returncode == 0, text
    assert "ok nixl_vram" in r.stdout, text


def test_vram_descriptors_by_prepared_lists_on_the_stub_driver(stub_dir):  # noqa: F811
    run(stub_dir)


def test_vram_descriptors_on_a_real_gpu_or_skip():
    gpu_or_skip()
    run(None)
