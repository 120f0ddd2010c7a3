"""SGLang's own ``mooncake_transfer_engine.py`` (from the sglang wheel, read
unmodified from the cache the test fills) in its default settings, in a
process the way SGLang runs it: no OrbitTE import here; ORBITTE_REPLACE in
the environment switches ``from mooncake.engine import TransferEngine``.

    python sglang_mooncake_process.py SGLANG_DIR target SIZE
        prints {"session", "address", "device", "module"}; answers "sha" with
        the sha256 of its registered buffer, until "quit"
    python sglang_mooncake_process.py SGLANG_DIR initiator SESSION ADDRESS SIZE
        registers a buffer with SGLang's register(), writes its first half
        with transfer_sync and its second with batch_transfer_sync; prints
        {"rcs", "sha"}

SGLANG_DIR holds ``sglang/srt/environ.py`` (SGLang's settings, run as they
are) and ``sglang/srt/distributed/device_communicators/
mooncake_transfer_engine.py``. The helpers that module imports from the
rest of SGLang (which needs torch) are stood in for here, with SGLang's
behaviour: ``run_with_deadline`` runs the call in a thread and waits for
it, ``NetworkAddress`` prints "host:port".
"""

import hashlib
import importlib.util
import json
import socket
import sys
import threading
import types
from pathlib import Path

from child_memory import answer_sha, buffer


def stand_ins(root: Path) -> None:
    """SGLang's packages without their __init__ (which imports torch):
    environ runs from the wheel, the other helpers are stood in for."""
    for name, path in (("sglang", root / "sglang"), ("sglang.srt", root / "sglang" / "srt"),
                       ("sglang.srt.utils", None), ("sglang.srt.distributed", None),
                       ("sglang.srt.distributed.device_communicators", None)):
        m = types.ModuleType(name)
        m.__path__ = [str(path)] if path else []
        sys.modules[name] = m

    common = types.ModuleType("sglang.srt.utils.common")

    def run_with_deadline(fn, *, timeout_s, what):
        out, err = [], []

        def run():
            try:
                out.append(fn())
            except BaseException as e:  # noqa: BLE001 (handed to the caller, as SGLang does)
                err.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise RuntimeError(f"{what} did not return within {timeout_s}s on {socket.gethostname()}")
        if err:
            raise err[0]
        return out[0]

    common.run_with_deadline = run_with_deadline
    network = types.ModuleType("sglang.srt.utils.network")

    class NetworkAddress:
        def __init__(self, host, port):
            self.host, self.port = host, port

        def to_host_port_str(self):
            return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    network.NetworkAddress = NetworkAddress
    network.get_free_port = lambda: 0
    network.get_local_ip_auto = lambda: "127.0.0.1"
    context = types.ModuleType("sglang.srt.runtime_context")
    for f in ("get_disagg", "get_exec", "get_memory"):
        setattr(context, f, lambda: (_ for _ in ()).throw(RuntimeError("not a server")))
    for m in (common, network, context):
        sys.modules[m.__name__] = m


def load(root: Path):
    name = "sglang.srt.distributed.device_communicators.mooncake_transfer_engine"
    path = root / "sglang" / "srt" / "distributed" / "device_communicators" / "mooncake_transfer_engine.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    root, role = Path(sys.argv[1]), sys.argv[2]
    stand_ins(root)
    mte = load(root)
    # SGLang's defaults: hostname from get_local_ip_auto, gpu 0, no ib_device.
    engine = mte.init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    module = type(engine.engine).__module__
    if role == "target":
        size = int(sys.argv[3])
        mem, address = buffer(size, b"\0")
        engine.register(address, size)
        print(json.dumps({"session": engine.get_session_id(), "address": address, "device": engine.get_ib_device(),
                          "module": module}), flush=True)
        answer_sha(mem)
    else:
        session, peer, size = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        mem, address = buffer(size, bytes(range(251)))
        engine.register(address, size)
        half = size // 2
        rcs = [engine.transfer_sync(session, address, peer, half),
               engine.batch_transfer_sync(session, [address + half], [peer + half], [size - half])]
        # Mooncake's own 3-argument registration (ptr, length, location).
        extra, extra_address = buffer(4096, b"x")
        rcs.append(engine.engine.register_memory(extra_address, 4096, "cpu:0"))
        print(json.dumps({"rcs": rcs, "sha": hashlib.sha256(bytes(mem)).hexdigest(), "module": module}), flush=True)


if __name__ == "__main__":
    main()
