"""NIXL's agent API over OrbitTE: ``nixl_agent`` and ``nixl_agent_config``
with the calls vLLM's ``NixlConnector`` and other NIXL clients make, under
NIXL's names, argument forms, return values and exception classes.

An agent wraps one :class:`orbitte.Engine` whose source id is the agent's
name. Its metadata (``get_agent_metadata``) is a versioned JSON document
in bytes: name, listen address, source id, epoch and the registrations;
``add_remote_agent`` opens the engine at that address (a handshake that
brings the peer's publications), so no metadata server is needed. With
etcd (``nixl_agent_config(metadata="etcd://HOST:PORT")`` or
``NIXL_ETCD_ENDPOINTS``), ``fetch_remote_metadata(name)`` finds the agent
by name, as ``orbitte.Engine`` does.

The hot path is native: ``prep_xfer_dlist`` resolves a descriptor list
once (each descriptor to a registration or a published range and an
offset); ``make_prepped_xfer`` takes index arrays (numpy arrays pass as
packed bytes) and builds the engine requests in Rust; ``transfer``
submits them in one call with the notification attached.

What NIXL has and OrbitTE does not (storage backends such as GDS, POSIX
or OBJ, the GPU-side device API, telemetry) raises NIXL's error class with
a message that names it.
"""

from __future__ import annotations

import array
import base64
import enum
import json
import logging
import os
import sys
from typing import Any, Optional, Sequence

from . import Buffer, ConnectError, Engine, Error, Peer, _Kept, buffer_address, read
from ._orbitte import (
    PreparedList as _PreparedList,
    Xfer as _Xfer,
    nixlBackendError,
    nixlCancelledError,
    nixlError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlNoTelemetryError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
)
from .nixl_plugin import plugin_dir

__all__ = [
    "DEFAULT_COMM_PORT",
    "METADATA_FORMAT",
    "NIXL_INIT_AGENT",
    "nixlBackendError",
    "nixlCancelledError",
    "nixlError",
    "nixlInvalidParamError",
    "nixlMismatchError",
    "nixlNoTelemetryError",
    "nixlNotAllowedError",
    "nixlNotFoundError",
    "nixlNotPostedError",
    "nixlNotSupportedError",
    "nixlRegDList",
    "nixlRemoteDisconnectError",
    "nixlRepostActiveError",
    "nixlUnknownError",
    "nixlXferDList",
    "nixlXferTelemetry",
    "nixl_agent",
    "plugin_dir",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]

logger = logging.getLogger(__name__)

DEFAULT_COMM_PORT = 8888
"""NIXL's default listener port; here the port ``enable_listen_thread``
serves on (the engine always listens: port 0 without it)."""

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
"""The agent name that prepares a local descriptor list."""

METADATA_FORMAT = "orbitte-nixl/2"
"""The format tag of the bytes ``get_agent_metadata`` returns."""

BACKEND = "UCX"
"""The one backend name accepted: OrbitTE's own path choice (local, rdma,
tcp) stands behind it."""

# NIXL backends that are storage or another fabric's library: refused.
_OTHER_BACKENDS = {
    "GDS": "GPUDirect Storage (file I/O)",
    "GDS_MT": "GPUDirect Storage (file I/O)",
    "POSIX": "POSIX file I/O",
    "OBJ": "object storage (S3)",
    "AZURE_BLOB": "Azure Blob storage",
    "HF3FS": "3FS file storage",
    "GUSLI": "block storage",
    "INFINIA": "Infinia storage",
    "GPUNETIO": "the GPU-initiated DOCA GPUNetIO path",
    "LIBFABRIC": "libfabric (OrbitTE drives RDMA itself; use UCX)",
    "UCCL": "UCCL (OrbitTE drives RDMA itself; use UCX)",
    "MOONCAKE": "Mooncake's engine (use orbitte.mooncake)",
}

# Memory types: NIXL's names (and the deprecated aliases) to this layer's.
_MEM_TYPES = {"DRAM": "DRAM", "cpu": "DRAM", "VRAM": "VRAM", "cuda": "VRAM",
              "DRAM_SEG": "DRAM", "VRAM_SEG": "VRAM"}
_STORAGE_MEM = {"FILE", "BLOCK", "OBJ", "FILE_SEG", "BLK_SEG", "OBJ_SEG"}


def _mem_type(mem_type: Optional[str]) -> str:
    if mem_type is None:
        raise nixlInvalidParamError("give mem_type (\"DRAM\" or \"VRAM\") for descriptors that are not tensors")
    m = _MEM_TYPES.get(str(mem_type))
    if m is not None:
        return m
    if str(mem_type) in _STORAGE_MEM:
        raise nixlNotSupportedError(
            f"mem_type {mem_type!r} is storage: OrbitTE moves bytes between host (DRAM) and GPU (VRAM) "
            "memory only; NIXL's storage backends (GDS, POSIX, OBJ) are not part of this build"
        )
    raise nixlInvalidParamError(f"unknown mem_type {mem_type!r}: use \"DRAM\" (or \"cpu\") or \"VRAM\" (or \"cuda\")")


def _has_vram() -> bool:
    """Whether this build registers GPU pointers (``Engine.register_device``)."""
    return hasattr(Engine, "register_device")


def _is_tensor(obj: Any) -> bool:
    return hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "numel")


def _tensor_desc(t: Any) -> tuple[tuple[int, int, int], str, Any]:
    if not t.is_contiguous():
        raise nixlInvalidParamError("a tensor that is not contiguous cannot be a descriptor: call .contiguous() first")
    kind = getattr(t.device, "type", "cpu")
    dev = t.get_device() if hasattr(t, "get_device") else -1
    mem = "DRAM" if kind == "cpu" else "VRAM"
    return (int(t.data_ptr()), int(t.numel() * t.element_size()), 0 if dev < 0 else int(dev)), mem, t


class _DList:
    """A descriptor list: the memory type and (address, length, device id)
    rows, packed as little-endian u64 triples (what the native side
    resolves)."""

    __slots__ = ("_mem", "_packed", "_n")
    _rows_width = 3

    def __init__(self, mem_type: str, descs: Sequence = (), *, _packed: Optional[bytes] = None):
        self._mem = _mem_type(mem_type)
        if _packed is None:
            flat = array.array("Q")
            for i, d in enumerate(descs):
                flat.extend(_row(d, i, self._rows_width)[:3])
            _packed = flat.tobytes()
        self._packed = _packed
        self._n = len(_packed) // 24

    def descCount(self) -> int:  # noqa: N802 (NIXL's name)
        return self._n

    def isEmpty(self) -> bool:  # noqa: N802
        return self._n == 0

    def getType(self) -> str:  # noqa: N802
        """``"DRAM_SEG"`` or ``"VRAM_SEG"``."""
        return f"{self._mem}_SEG"

    def __len__(self) -> int:
        return self._n

    def _triple(self, i: int) -> tuple[int, int, int]:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"descriptor index {i} out of range ({self._n} descriptors)")
        a = array.array("Q")
        a.frombytes(self._packed[i * 24:(i + 1) * 24])
        return int(a[0]), int(a[1]), int(a[2])

    def __getitem__(self, i: int):
        return self._triple(i)

    def __iter__(self):
        return (self[i] for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._mem == self._mem and other._packed == self._packed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.getType()} {self._n} descriptors>"


class nixlXferDList(_DList):
    """A transfer descriptor list: (address, length, device id) rows."""

    __slots__ = ()


class nixlRegDList(_DList):
    """A registration descriptor list: (address, length, device id, tag)
    rows; it keeps the objects (tensors, buffers) the rows came from."""

    __slots__ = ("_tags", "_keep")
    _rows_width = 4

    def __init__(self, mem_type: str, descs: Sequence = (), *, _packed: Optional[bytes] = None,
                 _tags: Optional[list] = None, _keep: Optional[list] = None):
        super().__init__(mem_type, descs, _packed=_packed)
        if _tags is None:
            _tags = [_tag(d[3]) for d in descs] if _packed is None else [b""] * self._n
        self._tags = _tags
        self._keep = _keep if _keep is not None else [None] * self._n

    def __getitem__(self, i: int):
        return self._triple(i) + (self._tags[i],)

    def trim(self) -> nixlXferDList:
        """The same rows as a transfer descriptor list."""
        return nixlXferDList(self._mem, _packed=self._packed)


def _tag(t: Any) -> bytes:
    if isinstance(t, bytes):
        return t
    if isinstance(t, str):
        return t.encode()
    raise nixlInvalidParamError(f"a descriptor's tag must be str or bytes, not {type(t).__name__}")


def _row(d: Any, i: int, width: int) -> tuple:
    if not isinstance(d, (tuple, list)) or len(d) != width:
        shape = "(address, length, device_id)" if width == 3 else "(address, length, device_id, tag)"
        got = f"a {len(d)}-tuple" if isinstance(d, (tuple, list)) else f"a {type(d).__name__}"
        raise nixlInvalidParamError(f"descriptor #{i} is {got}: each descriptor here is {shape}")
    for k in range(3):
        v = d[k]
        if isinstance(v, bool) or not hasattr(v, "__index__") or int(v) < 0:
            raise nixlInvalidParamError(f"descriptor #{i}: field {k} ({v!r}) must be a non-negative int")
    return d


def _numpy_packed(a: Any, width_ok: tuple, mem_type: Optional[str]) -> tuple[str, bytes]:
    import numpy as np

    if a.ndim != 2 or a.shape[1] not in width_ok:
        raise nixlInvalidParamError(
            f"a numpy descriptor array must be Nx{' or Nx'.join(map(str, width_ok))}, not shape {a.shape}"
        )
    if a.dtype.kind not in "iu":
        raise nixlInvalidParamError(f"a numpy descriptor array must hold integers, not {a.dtype}")
    if a.dtype.kind == "i" and a.size and int(a.min()) < 0:
        raise nixlInvalidParamError("a numpy descriptor array holds a negative address, length or device id")
    return _mem_type(mem_type), np.ascontiguousarray(a[:, :3], dtype="<u8").tobytes()


def _strided(a: Any) -> Any:
    """Rows (address, length, device, stride, count) as (address, length,
    device) rows: ``count`` blocks of ``length`` bytes, ``stride`` apart."""
    import numpy as np

    a = np.asarray(a, dtype=np.uint64)
    counts = a[:, 4].astype(np.int64)
    rep = np.repeat(np.arange(len(a)), counts)
    step = np.concatenate([np.arange(c, dtype=np.uint64) for c in counts]) if len(a) else np.zeros(0, np.uint64)
    out = np.empty((len(rep), 3), dtype=np.uint64)
    out[:, 0] = a[rep, 0] + step * a[rep, 3]
    out[:, 1] = a[rep, 1]
    out[:, 2] = a[rep, 2]
    return out


def _memory_desc(obj: Any) -> Optional[tuple[tuple[int, int, int], str, Any]]:
    """A descriptor for memory handed in as an object: a torch tensor, an
    :class:`orbitte.Buffer` or a DLPack tensor in host memory."""
    if _is_tensor(obj):
        return _tensor_desc(obj)
    if isinstance(obj, Buffer):
        return (obj.address, obj.length, 0), "DRAM", obj
    if hasattr(obj, "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        kind = int(obj.__dlpack_device__()[0]) if hasattr(obj, "__dlpack_device__") else 1
        if kind in (2, 10):  # kDLCUDA, kDLROCM
            raise nixlNotSupportedError(
                "a GPU DLPack tensor: pass the torch tensor itself (or (address, length, device_id) rows with "
                "mem_type=\"VRAM\")"
            )
        try:
            address, n, keep = buffer_address(obj)
        except Error as e:
            raise nixlInvalidParamError(str(e)) from None
        return (address, n, 0), "DRAM", keep
    return None


def _objects(items: Sequence, reg: bool) -> _DList:
    rows, keep, mems = array.array("Q"), [], set()
    for i, obj in enumerate(items):
        got = _memory_desc(obj)
        if got is None:
            raise nixlInvalidParamError(
                f"item #{i} is a {type(obj).__name__}: a list holds descriptor tuples, or tensors / orbitte.Buffer objects"
            )
        d, mem, k = got
        rows.extend(d)
        keep.append(k)
        mems.add(mem)
    if len(mems) > 1:
        raise nixlInvalidParamError("the tensors are on different kinds of device: one list holds one memory type")
    mem = mems.pop() if mems else "DRAM"
    if reg:
        return nixlRegDList(mem, _packed=rows.tobytes(), _keep=keep)
    return nixlXferDList(mem, _packed=rows.tobytes())


def _descs(descs: Any, mem_type: Optional[str], reg: bool) -> _DList:
    """Any of NIXL's descriptor inputs as a descriptor list."""
    want = nixlRegDList if reg else nixlXferDList
    if isinstance(descs, want):
        return descs
    if isinstance(descs, _DList):
        if reg:
            raise nixlInvalidParamError("a transfer descriptor list was given for registration: use get_reg_descs")
        raise nixlInvalidParamError("a registration descriptor list was given for a transfer: use get_xfer_descs (or .trim())")
    np = sys.modules.get("numpy")
    if np is not None and isinstance(descs, np.ndarray):
        mem, packed = _numpy_packed(descs, (3, 4) if reg else (3,), mem_type)
        return want(mem, _packed=packed)
    single = _memory_desc(descs)
    if single is not None:
        return _objects([descs], reg)
    if not isinstance(descs, (list, tuple)):
        raise nixlInvalidParamError(
            f"cannot make descriptors from a {type(descs).__name__}: pass a list of tuples, an Nx3 numpy array, "
            "a tensor or a list of tensors"
        )
    if len(descs) == 0:
        return want(mem_type or "DRAM")
    if isinstance(descs[0], (tuple, list)):
        return want(_mem_type(mem_type), descs)
    return _objects(descs, reg)


class nixlXferTelemetry:
    """A transfer's telemetry, NIXL's fields: ``startTime`` (µs since the
    Unix epoch), ``postDuration`` (µs the submit took), ``xferDuration`` (µs
    from the start until DONE or ERR was seen by ``check_xfer_state``; until
    now while in flight), ``totalBytes``, ``descCount``."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes", "descCount")

    def __init__(self, startTime: int, postDuration: int, xferDuration: int, totalBytes: int,  # noqa: N803
                 descCount: int):  # noqa: N803
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self) -> str:
        return (f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
                f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, descCount={self.descCount})")


nixl_backend_handle = int
"""NIXL's opaque backend handle type (what ``create_backend`` hands out)."""


class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread synchronization modes, accepted by
    ``nixl_agent_config(sync_mode=...)``. Every call here is thread-safe
    whichever mode is given."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_agent_config:
    """NIXL's agent configuration, with OrbitTE's settings after NIXL's.

    NIXL's arguments: ``enable_prog_thread`` (the engine always has its own
    threads: accepted, no effect), ``enable_listen_thread`` (listen on
    ``listen_port``; otherwise on any free port: the engine listens either
    way, the metadata carries the address), ``capture_telemetry``
    (``get_xfer_telemetry`` answers, else it raises nixlNoTelemetryError as
    NIXL does), ``num_threads`` (accepted, no effect),
    ``backends`` (``["UCX"]``: OrbitTE's own path choice; storage and other
    fabric backends raise nixlNotSupportedError), ``sync_mode`` (a
    :class:`nixl_thread_sync_t` or None; accepted: every call is
    thread-safe).

    OrbitTE's: ``listen`` ("host:port" to serve on; default
    ``$ORBITTE_NIXL_LISTEN`` or "0.0.0.0", the metadata then names this
    host by its hostname), ``path`` ("auto", "tcp", "local", "rdma"),
    ``rdma`` (None: when the host lists RDMA devices), ``devices`` (RDMA
    device filter), ``rails``, ``request_timeout`` and
    ``handshake_timeout`` (seconds) and
    ``metadata`` (None or "etcd://HOST:PORT[/PREFIX]"; default from
    ``NIXL_ETCD_ENDPOINTS``), ``cluster_secret_file`` (default: the file
    ``$ORBITTE_SECRET_FILE`` names; see below).

    Who gets in: every agent draws a random listener token and puts it in
    its metadata; its engine admits only peers that prove it, so only
    agents that were handed the metadata (over the channel you trust with
    it) read, write or notify it. A cluster secret, when set, is needed
    on top."""

    def __init__(self, enable_prog_thread: bool = True, enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT, capture_telemetry: bool = False,
                 num_threads: int = 0, backends: Optional[list] = None, sync_mode: Any = None, *,
                 listen: Optional[str] = None, path: str = "auto", rdma: Optional[bool] = None,
                 devices: Sequence[str] = (), rails: int = 1, request_timeout: float = 10.0,
                 handshake_timeout: float = 5.0, metadata: Optional[str] = None,
                 cluster_secret_file: Optional[str] = None):
        self.backends = list(backends) if backends is not None else [BACKEND]
        for b in self.backends:
            _check_backend(b)
        self.enable_pthread = bool(enable_prog_thread)
        self.enable_listen = bool(enable_listen_thread)
        self.port = int(listen_port)
        self.capture_telemetry = bool(capture_telemetry)
        self.num_threads = int(num_threads)
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.sync_mode = sync_mode
        self.listen = listen
        self.path = path
        self.rdma = rdma
        self.devices = list(devices)
        self.rails = int(rails)
        self.request_timeout = float(request_timeout)
        self.handshake_timeout = float(handshake_timeout)
        self.metadata = metadata
        self.cluster_secret_file = cluster_secret_file


def _check_backend(name: str) -> None:
    if name == BACKEND:
        return
    what = _OTHER_BACKENDS.get(name)
    if what is not None:
        raise nixlNotSupportedError(
            f"backend {name!r} ({what}) is not part of OrbitTE: use backends=[\"UCX\"], which runs OrbitTE's "
            "own path choice (local, rdma, tcp)"
        )
    raise nixlNotFoundError(f"no backend plugin {name!r}: this build serves [\"UCX\"] (OrbitTE's own paths)")


def _etcd_from_env() -> Optional[str]:
    ends = os.environ.get("NIXL_ETCD_ENDPOINTS")
    if not ends:
        return None
    first = ends.split(",")[0].strip()
    host = first.split("://", 1)[-1].rstrip("/")
    prefix = os.environ.get("NIXL_ETCD_NAMESPACE", "/nixl/agents").strip("/")
    return f"etcd://{host}/{prefix}" if prefix else f"etcd://{host}"


class nixl_prepped_dlist_handle:
    """A prepared descriptor list (``prep_xfer_dlist``); ``release()``
    frees it."""

    __slots__ = ("_native", "_agent")

    def __init__(self, agent: "nixl_agent", native: _PreparedList):
        self._native = native
        self._agent = agent

    def release(self) -> None:
        self._native.release()

    @property
    def released(self) -> bool:
        return self._native.released

    def __len__(self) -> int:
        return len(self._native)

    def __repr__(self) -> str:
        return f"nixl_prepped_dlist_handle({self._native!r}, released={self.released})"


class nixl_xfer_handle:
    """A transfer request (``make_prepped_xfer``, ``initialize_xfer``);
    ``release()`` frees it (cancelling it first if it is in flight)."""

    __slots__ = ("_native", "_agent", "_released", "_logged")

    def __init__(self, agent: "nixl_agent", native: _Xfer):
        self._native = native
        self._agent = agent
        self._released = False
        self._logged = False

    def release(self) -> None:
        self._native.release()
        self._released = True

    @property
    def error(self) -> Optional[str]:
        """Why the transfer ended in "ERR" (None otherwise)."""
        return self._native.error

    def __repr__(self) -> str:
        return f"nixl_xfer_handle({self._native!r}, released={self._released})"

    def __del__(self):
        if not getattr(self, "_released", True):
            try:
                self._native.release()
            except Exception:  # noqa: BLE001 (finalizer: nothing to raise to)
                pass


class _Remote:
    """A remote agent: its peer handle and the metadata it was added with."""

    __slots__ = ("peer", "meta", "anchor")

    def __init__(self, peer: Peer, meta: dict):
        self.peer = peer
        self.meta = meta
        # The notification anchor: named by the metadata, else (an etcd
        # record) the agent's first registration, which the agent makes itself.
        ranges = peer.ranges
        named = [r for r in ranges if r.address == meta.get("anchor")]
        self.anchor = named[0] if named else (min(ranges, key=lambda r: r.id) if ranges else None)


def _rdma_listed() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


class nixl_agent:
    """A NIXL agent over one :class:`orbitte.Engine` named ``agent_name``.

    ``nixl_conf`` is a :class:`nixl_agent_config` (default: UCX, that is,
    OrbitTE's own path choice); ``instantiate_all`` is accepted (this build
    has one backend)."""

    def __init__(self, agent_name: str, nixl_conf: Optional[nixl_agent_config] = None,
                 instantiate_all: bool = False):
        if not isinstance(agent_name, str) or not agent_name:
            raise nixlInvalidParamError("agent_name must be a non-empty str")
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self.notifs: dict[str, list[bytes]] = {}
        self.backends: dict[str, int] = {}
        self._conf = conf
        self._remotes: dict[str, _Remote] = {}
        self._regs: dict[int, Any] = {}
        metadata = conf.metadata if conf.metadata is not None else _etcd_from_env()
        self._etcd = metadata
        try:
            self._engine = Engine(
                agent_name,
                rdma=_rdma_listed() if conf.rdma is None else bool(conf.rdma),
                devices=conf.devices,
                path=conf.path,
                rails=conf.rails,
                request_timeout=conf.request_timeout,
                handshake_timeout=conf.handshake_timeout,
                metadata=metadata,
                cluster_secret_file=getattr(conf, "cluster_secret_file", None),
                listener_token=True,
            )
            listen = conf.listen or os.environ.get("ORBITTE_NIXL_LISTEN") or "0.0.0.0"
            host, sep, port = listen.rpartition(":")
            if sep and port.isdigit() and (host.endswith("]") or ":" not in host):
                addr = listen  # "host:port" or "[v6]:port"
            else:  # a host alone
                bare = listen.strip("[]")
                host = f"[{bare}]" if ":" in bare else bare
                addr = f"{host}:{conf.port if conf.enable_listen else 0}"
            self._engine.listen(addr)
        except Error as e:
            raise nixlBackendError(f"agent {agent_name!r}: {e}") from None
        # The first registration: the notification anchor, which send_notif
        # READs one byte of (a notification rides on a transfer).
        self._anchor_mem = Buffer(64)
        self._anchor = self._engine.register(self._anchor_mem)
        for b in conf.backends:
            self.create_backend(b)

    # --- backends and plugins -------------------------------------------------

    def get_plugin_list(self) -> list[str]:
        """The backend plugins this build has: ``["UCX"]`` (OrbitTE's paths)."""
        return [BACKEND]

    def _mem_types(self) -> list[str]:
        return ["DRAM_SEG", "VRAM_SEG"] if _has_vram() else ["DRAM_SEG"]

    def get_plugin_mem_types(self, backend: str) -> list[str]:
        _check_backend(backend)
        return self._mem_types()

    def get_backend_mem_types(self, backend: str) -> list[str]:
        """``["DRAM_SEG"]``, with ``"VRAM_SEG"`` when this build registers GPU
        memory."""
        _check_backend(backend)
        if backend not in self.backends:
            raise nixlNotFoundError(f"backend {backend!r} was not created: create_backend({backend!r}) first")
        return self._mem_types()

    def get_plugin_params(self, backend: str) -> dict[str, str]:
        _check_backend(backend)
        return {}

    def get_backend_params(self, backend: str) -> dict[str, str]:
        return self.get_plugin_params(backend)

    def create_backend(self, backend: str, initParams: Optional[dict] = None) -> None:  # noqa: N803
        """Accepts ``"UCX"`` (the engine's own path choice); any other backend
        raises nixlNotSupportedError or nixlNotFoundError."""
        _check_backend(backend)
        self.backends[backend] = 1

    def _backends(self, backends: Sequence[str]) -> None:
        # A bare name ("UCX") is one backend, not a list of letters.
        for b in ([backends] if isinstance(backends, str) else backends or ()):
            _check_backend(b)

    # --- memory ---------------------------------------------------------------

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None) -> nixlRegDList:
        """A registration list from (address, length, device_id, tag) tuples
        (with ``mem_type``), an Nx3/Nx4 numpy array (with ``mem_type``), a
        tensor, a list of tensors or :class:`orbitte.Buffer` objects."""
        return _descs(descs, mem_type, reg=True)

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None) -> nixlXferDList:
        """A transfer list from (address, length, device_id) tuples (with
        ``mem_type``), an Nx3 numpy array (with ``mem_type``), a tensor or a
        list of tensors."""
        return _descs(descs, mem_type, reg=False)

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None,
                        backends: Sequence[str] = ()) -> nixlRegDList:
        """Registers each descriptor with the engine, published to remote
        agents (who see it once they add this agent's metadata taken after
        this call). All or none: a refusal unregisters what this call
        registered and raises."""
        self._backends(backends)
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs._mem == "VRAM" and not _has_vram():
            raise nixlNotSupportedError(
                "VRAM descriptors: VRAM without libcuda/this build (no GPU memory registration in this orbitte "
                "build): keep the memory in host memory (DRAM)"
            )
        done = []
        try:
            for i in range(len(descs)):
                address, length, dev = descs._triple(i)
                if address in self._regs:
                    raise nixlInvalidParamError(f"{address:#x} is registered already: deregister_memory it first")
                self._regs[address] = self._register(descs._mem, address, length, dev, descs._keep[i])
                done.append(address)
        except BaseException:
            for a in done:
                self._regs.pop(a).unregister()
            raise
        return descs

    def _register(self, mem: str, address: int, length: int, dev: int, keep: Any):
        try:
            if mem == "VRAM":
                # cuda-staging: staged through pinned host memory; published,
                # so a remote agent READs and WRITEs it (over tcp).
                return self._engine.register_device(address, length, keep, remote=True)
            if isinstance(keep, Buffer) and (keep.address, keep.length) == (address, length):
                return self._engine.register(keep)
            if keep is not None:
                native = self._engine._native
                return native.register(address, length, keep, remote=True, kept=isinstance(keep, _Kept))
            return self._engine.register((address, length))
        except nixlError:
            raise
        except Error as e:
            raise nixlBackendError(f"registering {address:#x}+{length}: {e}") from None

    def deregister_memory(self, dereg_list: Any, backends: Sequence[str] = ()) -> None:
        """Removes the registrations of a list that ``register_memory``
        made."""
        self._backends(backends)
        descs = dereg_list if isinstance(dereg_list, _DList) else self.get_reg_descs(dereg_list, "DRAM")
        for i in range(len(descs)):
            address = descs._triple(i)[0]
            reg = self._regs.get(address)
            if reg is None:
                raise nixlNotFoundError(f"{address:#x} is not registered with agent {self.name!r}")
            try:
                reg.unregister()
            except Error as e:
                raise nixlNotAllowedError(f"deregistering {address:#x}: {e}") from None
            del self._regs[address]

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> list:
        raise nixlNotSupportedError("query_memory answers for storage backends, which this build does not have")

    # --- metadata ---------------------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        """This agent's metadata: what a remote agent needs to open it (name,
        listen address, source id, epoch, registrations), as versioned JSON
        bytes."""
        return self._metadata(sorted(self._regs.items()), conn_info=True)

    def _metadata(self, regs: list, conn_info: bool) -> bytes:
        doc = {
            "format": METADATA_FORMAT,
            "name": self.name,
            "source_id": self._engine.source_id,
            "epoch": self._engine.epoch,
            "registrations": [[a, r.length, getattr(r, "device", None) or 0,
                               "VRAM" if getattr(r, "staged", False) else "DRAM"] for a, r in regs],
            "anchor": self._anchor.address,
        }
        if conn_info:
            doc["address"] = self._address()
            doc["token"] = self._engine.token
        return json.dumps(doc, separators=(",", ":")).encode()

    def _address(self) -> str:
        """``host:port`` remote agents connect to (``[v6]:port`` for IPv6)."""
        host, port = self._engine._host, self._engine.port
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def get_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False,
                                   backends: Sequence[str] = ()) -> bytes:
        """Metadata that lists only the registrations ``descs`` names (each
        must start at a registration of this agent: nixlNotFoundError
        otherwise), with the connection information (listen address and
        listener token) only when ``inc_conn_info`` is true. A remote agent
        adds metadata without connection information only once it added this
        agent with it."""
        self._backends(backends)
        wanted = self.get_reg_descs(descs) if descs is not None else nixlRegDList("DRAM")
        regs = []
        for address, _, _ in (wanted._triple(i) for i in range(len(wanted))):
            r = self._regs.get(address)
            if r is None:
                raise nixlNotFoundError(f"{address:#x} is not the start of a registration of agent {self.name!r}")
            regs.append((address, r))
        return self._metadata(regs, conn_info=bool(inc_conn_info))

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Opens the agent the metadata describes (a handshake with its
        engine, which brings its published ranges); returns its name as
        bytes. Adding an agent again replaces its peer (after it registered
        more memory, or restarted)."""
        doc = _parse_metadata(metadata)
        name = doc["name"]
        if "address" not in doc:
            # Partial metadata without connection information: the agent
            # must have been added with it before.
            known = self._remotes.get(name)
            if known is None or known.meta.get("source_id") != doc["source_id"]:
                raise nixlNotFoundError(
                    f"the metadata of agent {name!r} carries no connection information and the agent was not "
                    "added: add its metadata with connection information first (get_agent_metadata, or "
                    "get_partial_agent_metadata(..., inc_conn_info=True))"
                )
            doc["address"], doc["token"] = known.meta["address"], known.meta["token"]
        if not name:
            raise nixlInvalidParamError("the metadata names an agent with an empty name: take it again with get_agent_metadata()")
        if name == self.name:
            raise nixlInvalidParamError(
                f"the metadata names this agent itself ({name!r}): add the metadata of another agent"
            )
        if name != doc["source_id"]:
            raise nixlMismatchError(
                f"the metadata names agent {name!r} but describes engine {doc['source_id']!r}: "
                "take the metadata again from the agent itself"
            )
        try:
            peer = self._engine.connect(doc["address"], doc["token"])
        except ConnectError as e:
            raise nixlRemoteDisconnectError(f"agent {name!r} at {doc['address']}: {e}") from None
        if peer.source_id != doc["source_id"]:
            raise nixlMismatchError(
                f"the engine at {doc['address']} is {peer.source_id!r}, not agent {name!r} of the metadata: "
                "take the metadata again from the agent itself"
            )
        if peer.epoch != doc["epoch"]:
            raise nixlMismatchError(
                f"agent {name!r} runs epoch {peer.epoch}, the metadata is of epoch {doc['epoch']} (it restarted): "
                "take its metadata again"
            )
        self._remotes[name] = _Remote(peer, doc)
        return name.encode()

    def remove_remote_agent(self, agent: str) -> None:
        """Forgets a remote agent: transfers and prepared lists naming it
        are refused afterwards."""
        if self._remotes.pop(_name(agent), None) is None:
            raise nixlNotFoundError(f"agent {agent!r} was not added (add_remote_agent)")

    def check_remote_metadata(self, agent: str, descs: Any = None) -> bool:
        return _name(agent) in self._remotes

    def make_connection(self, remote_agent: str, backends: Sequence[str] = ()) -> None:
        """Nothing to do: ``add_remote_agent`` opened the connection."""
        self._backends(backends)
        self._remote(remote_agent)

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        """With etcd, the engine's record is stored already (it is refreshed
        here); sending to a peer's listener is NIXL's socket exchange, which
        this build does not have."""
        if ip_addr:
            raise nixlNotSupportedError(
                "sending metadata to a peer's listen thread: hand it get_agent_metadata() bytes, or use etcd"
            )
        if self._etcd is None:
            raise nixlNotSupportedError(
                "no metadata server: configure etcd (nixl_agent_config(metadata=\"etcd://HOST:PORT\") or "
                "NIXL_ETCD_ENDPOINTS), or exchange get_agent_metadata() bytes"
            )

    def send_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False,
                                    backends: Sequence[str] = (), ip_addr: str = "",
                                    port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        self.send_local_metadata(ip_addr, port)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT,
                              label: str = "") -> None:
        """With etcd: finds the agent by name and adds it (synchronously;
        ``check_remote_metadata`` is then true)."""
        if ip_addr:
            raise nixlNotSupportedError(
                "fetching metadata from a peer's listen thread: use add_remote_agent with its "
                "get_agent_metadata() bytes, or etcd"
            )
        if self._etcd is None:
            raise nixlNotSupportedError(
                "no metadata server: configure etcd (nixl_agent_config(metadata=\"etcd://HOST:PORT\") or "
                "NIXL_ETCD_ENDPOINTS)"
            )
        name = _name(remote_agent)
        try:
            peer = self._engine.connect(name)
        except ConnectError as e:
            raise nixlNotFoundError(f"agent {name!r} through {self._etcd}: {e}") from None
        doc = {"format": METADATA_FORMAT, "name": name, "address": peer.session,
               "source_id": peer.source_id, "epoch": peer.epoch,
               "registrations": [[r.address, r.length, 0, "DRAM"] for r in peer.ranges]}
        self._remotes[name] = _Remote(peer, doc)

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        raise nixlNotSupportedError(
            "invalidate_local_metadata: the engine's etcd record lives with its lease; remote agents stop "
            "using this agent with remove_remote_agent"
        )

    def peer(self, agent: str) -> Peer:
        """The :class:`orbitte.Peer` behind a remote agent (its ``path``,
        ``fell_back``, ``epoch`` and published ranges)."""
        return self._remote(agent).peer

    def _remote(self, agent: Any) -> _Remote:
        name = _name(agent)
        r = self._remotes.get(name)
        if r is not None:
            return r
        if name == self.name:
            raise nixlNotSupportedError(
                f"loopback (agent {name!r} naming itself): an engine opens no session to itself; "
                "use a second agent in this process for same-process transfers"
            )
        raise nixlNotFoundError(f"agent {name!r} was not added: add_remote_agent(its metadata) first")

    # --- descriptor lists and transfers -------------------------------------------

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: Optional[str] = None,
                        backends: Sequence[str] = ()) -> nixl_prepped_dlist_handle:
        """Resolves a descriptor list once: ``"NIXL_INIT_AGENT"`` (or "") for
        this agent's memory, a remote agent's name for its memory (this
        agent's own name, NIXL's loopback, raises nixlNotSupportedError). Nx5 numpy arrays are strided rows
        (address, length, device, stride, count)."""
        self._backends(backends)
        np = sys.modules.get("numpy")
        if np is not None and isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2 and xfer_list.shape[1] == 5:
            if mem_type is None:
                raise nixlInvalidParamError("strided (Nx5) descriptors need mem_type")
            xfer_list = _strided(xfer_list)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        native = self._engine._native
        name = _name(agent_name)
        if name in (NIXL_INIT_AGENT, ""):
            return nixl_prepped_dlist_handle(self, _PreparedList.local(native, descs._packed))
        remote = self._remote(name)
        return nixl_prepped_dlist_handle(self, _PreparedList.remote(native, remote.peer, name, descs._packed))

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle, local_indices: Any,
                          remote_xfer_side: nixl_prepped_dlist_handle, remote_indices: Any,
                          notif_msg: bytes = b"", backends: Sequence[str] = (),
                          skip_desc_merge: bool = False) -> nixl_xfer_handle:
        """A transfer of ``local[local_indices[i]]`` with
        ``remote[remote_indices[i]]``: lists or integer numpy arrays (passed
        as packed bytes); built natively in one call."""
        if backends:
            self._backends(backends)
        l, r = _prepped(local_xfer_side), _prepped(remote_xfer_side)
        self._live_remote(r)
        li, ri, width = _index_pair(local_indices, remote_indices)
        return nixl_xfer_handle(self, _Xfer.prepped(operation, l, li, r, ri, width, _notif(notif_msg)))

    def initialize_xfer(self, operation: str, local_descs: Any, remote_descs: Any, remote_agent: str,
                        notif_msg: bytes = b"", backends: Sequence[str] = ()) -> nixl_xfer_handle:
        """A transfer of each local descriptor with the remote one at the same
        position, on ``remote_agent``'s memory."""
        self._backends(backends)
        local = self.prep_xfer_dlist(NIXL_INIT_AGENT, local_descs)
        remote = self.prep_xfer_dlist(remote_agent, remote_descs)
        return nixl_xfer_handle(self, _Xfer.whole(operation, local._native, remote._native, _notif(notif_msg)))

    def transfer(self, handle: nixl_xfer_handle, notif_msg: bytes = b"") -> str:
        """Submits the transfer (every request in one call); returns "DONE"
        if it finished meanwhile, "PROC" or "ERR" (``handle.error`` says
        why)."""
        x = handle._native
        if x.agent not in self._remotes:
            raise nixlNotFoundError(f"agent {x.agent!r} was removed: add it again (add_remote_agent)")
        msg = _notif(notif_msg)
        carrier = None
        if msg or x.notifies:
            # A notification of a transfer that moves CUDA memory cannot ride
            # the staged batch: it follows on a one-byte READ of the agent's
            # anchor once every byte moved.
            anchor = self._remotes[x.agent].anchor
            if anchor is not None:
                carrier = read(self._anchor, anchor, 1)
        state = x.post(msg, carrier)
        if state == "ERR":
            self._log_err(handle)
        return state

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """"DONE" (every byte placed, the buffers free, the notification sent),
        "PROC" or "ERR" (``handle.error`` says why). Never waits on the
        network."""
        state = handle._native.state()
        if state == "ERR":
            self._log_err(handle)
        return state

    def _log_err(self, handle: nixl_xfer_handle) -> None:
        if not handle._logged:
            handle._logged = True
            logger.error("transfer to agent %r failed: %s", handle._native.agent, handle._native.error)

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        if handle.released:
            raise nixlInvalidParamError("the prepared list was released already: prepare it again")
        handle.release()

    def _live_remote(self, remote: _PreparedList) -> None:
        name = remote.agent
        if name is None:
            return
        r = self._remotes.get(name)
        if r is None:
            raise nixlNotFoundError(f"agent {name!r} was removed: add it again and prepare its list again")
        if r.peer is not remote.peer and r.peer.epoch != remote.peer.epoch:
            raise nixlMismatchError(
                f"agent {name!r} was added again (epoch {r.peer.epoch}) after this list was prepared: prepare it again"
            )

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        return BACKEND

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle):
        raise nixlNotSupportedError("estimate_xfer_cost: this build has no cost model")

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> "nixlXferTelemetry":
        """The last post's times (µs), bytes and descriptors; needs
        ``capture_telemetry=True`` in the config."""
        if not self._conf.capture_telemetry:
            raise nixlNoTelemetryError("telemetry is off: nixl_agent_config(capture_telemetry=True)")
        t = handle._native.telemetry()
        if t is None:
            raise nixlNotPostedError("the transfer handle was never posted: no telemetry yet")
        return nixlXferTelemetry(*t)

    def prep_mem_view(self, dlist: Any, *, backends: Optional[list] = None) -> int:
        raise nixlNotSupportedError("prep_mem_view is NIXL's GPU-side device API, which OrbitTE does not have")

    def release_mem_view(self, mvh: int) -> None:
        raise nixlNotSupportedError("release_mem_view is NIXL's GPU-side device API, which OrbitTE does not have")

    # --- notifications ----------------------------------------------------------

    def send_notif(self, remote_agent_name: str, notif_msg: bytes, backend: Optional[str] = None) -> None:
        """Sends ``notif_msg`` to a remote agent without a transfer of the
        caller's (it rides on a one-byte READ of the agent's notification
        anchor, so it comes with OrbitTE's rule: delivered once) and returns
        once the agent queued it. Raises ``nixlBackendError`` when the agent
        refused it (it holds as many unread notifications from this agent as
        it keeps: its application must call ``get_new_notifs``)."""
        if backend is not None:
            _check_backend(backend)
        remote = self._remote(remote_agent_name)
        if remote.anchor is None:
            raise nixlNotFoundError(f"agent {remote.meta.get('name')!r} publishes no memory to carry a notification")
        msg = _notif(notif_msg)
        if not msg:
            raise nixlInvalidParamError("an empty notification: give at least one byte")
        try:
            self._engine.transfer(remote.peer, [read(self._anchor, remote.anchor, 1)], notify=msg)
        except Error as e:
            outcomes = getattr(e, "outcomes", None) or []
            if any(o.notification == "refused" for o in outcomes):
                # The agent is there; its application does not read its
                # notifications (get_new_notifs) and it keeps no more.
                raise nixlBackendError(f"notification to agent {_name(remote_agent_name)!r}: {e}") from None
            raise nixlRemoteDisconnectError(f"notification to agent {_name(remote_agent_name)!r}: {e}") from None

    def get_new_notifs(self, backends: Sequence[str] = ()) -> dict[str, list[bytes]]:
        """The notifications that came since the last look, by sender name."""
        out: dict[str, list[bytes]] = {}
        for n in self._engine.notifications():
            out.setdefault(n.source_id, []).append(n.payload)
        return out

    def update_notifs(self, backends: Sequence[str] = ()) -> dict[str, list[bytes]]:
        """Adds the new notifications to ``self.notifs`` and returns it."""
        for name, msgs in self.get_new_notifs(backends).items():
            self.notifs.setdefault(name, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes, backends: Sequence[str] = (),
                               tag_is_prefix: bool = True) -> bool:
        """Whether a notification from ``remote_agent_name`` starts with
        ``lookup_tag`` (or contains it, ``tag_is_prefix=False``); the one
        found is removed."""
        tag = _notif(lookup_tag)
        self.update_notifs(backends)
        msgs = self.notifs.get(_name(remote_agent_name), [])
        for i, m in enumerate(msgs):
            if (m.startswith(tag) if tag_is_prefix else tag in m):
                del msgs[i]
                return True
        return False

    # --- serialization ------------------------------------------------------------

    def get_serialized_descs(self, descs: Any) -> bytes:
        """A descriptor list as bytes (a JSON document, never pickle)."""
        if not isinstance(descs, _DList):
            raise nixlInvalidParamError(f"serialize a descriptor list, not a {type(descs).__name__}")
        doc = {"format": "orbitte-nixl-descs/1", "kind": "reg" if isinstance(descs, nixlRegDList) else "xfer",
               "mem": descs._mem, "rows": base64.b64encode(descs._packed).decode()}
        if isinstance(descs, nixlRegDList):
            doc["tags"] = [base64.b64encode(t).decode() for t in descs._tags]
        return json.dumps(doc, separators=(",", ":")).encode()

    def deserialize_descs(self, serialized_descs: bytes) -> _DList:
        try:
            doc = json.loads(bytes(serialized_descs))
            if doc.get("format") != "orbitte-nixl-descs/1":
                raise ValueError(f"format {doc.get('format')!r}")
            packed = base64.b64decode(doc["rows"], validate=True)
            if len(packed) % 24:
                raise ValueError("rows are not whole triples")
            if doc["kind"] == "reg":
                tags = [base64.b64decode(t, validate=True) for t in doc["tags"]]
                if len(tags) != len(packed) // 24:
                    raise ValueError("tags and rows differ in number")
                return nixlRegDList(doc["mem"], _packed=packed, _tags=tags)
            if doc["kind"] != "xfer":
                raise ValueError(f"kind {doc['kind']!r}")
            return nixlXferDList(doc["mem"], _packed=packed)
        except nixlError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise nixlMismatchError(
                f"not a descriptor list from get_serialized_descs ({e}): both sides must run orbitte.nixl"
            ) from None

    # --- lifetime ----------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The :class:`orbitte.Engine` under this agent."""
        return self._engine

    def close(self, timeout: float = 5.0) -> None:
        """Stops serving, fences the engine and waits for drain."""
        self._remotes.clear()
        self._engine.close(timeout)

    def __enter__(self) -> "nixl_agent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<orbitte.nixl.nixl_agent {self.name!r} at {self._address()} remotes={sorted(self._remotes)}>"


def _name(agent: Any) -> str:
    return agent.decode() if isinstance(agent, bytes) else str(agent)


def _notif(msg: Any) -> bytes:
    if isinstance(msg, str):
        return msg.encode()
    if msg is None:
        return b""
    return bytes(msg)


def _prepped(h: Any) -> _PreparedList:
    if not isinstance(h, nixl_prepped_dlist_handle):
        raise nixlInvalidParamError(
            f"a prepared list handle (prep_xfer_dlist) is needed, not a {type(h).__name__}"
        )
    return h._native


_INDEX_DTYPES: dict = {}


def _index_pair(a: Any, b: Any) -> tuple[Any, Any, int]:
    """Both index sequences for the native side: numpy integer arrays as
    packed little-endian bytes (4-byte when both are int32, else 8-byte),
    anything else as it is (converted there once)."""
    np = sys.modules.get("numpy")
    if np is None or not (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)):
        return a, b, 8
    if not _INDEX_DTYPES:
        _INDEX_DTYPES.update({4: np.dtype("<i4"), 8: np.dtype("<i8")})
    i4 = _INDEX_DTYPES[4]
    width = 4 if getattr(a, "dtype", None) == i4 and getattr(b, "dtype", None) == i4 else 8
    dt = _INDEX_DTYPES[width]
    return _packed_indices(np, a, dt), _packed_indices(np, b, dt), width


def _packed_indices(np: Any, x: Any, dt: Any) -> Any:
    if not isinstance(x, np.ndarray):
        return x
    if x.ndim == 1 and x.dtype == dt and x.flags.c_contiguous:
        return x.tobytes()
    if x.dtype.kind not in "iu" or x.ndim != 1:
        raise nixlInvalidParamError(f"indices must be a 1-D integer array, not {x.dtype} of shape {x.shape}")
    return np.ascontiguousarray(x, dtype=dt).tobytes()


def _parse_metadata(metadata: Any) -> dict:
    try:
        doc = json.loads(bytes(metadata))
    except (ValueError, TypeError, RecursionError):
        raise nixlMismatchError(
            "the metadata is not an orbitte.nixl agent's (a NIXL agent's? both sides must run orbitte.nixl)"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != METADATA_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise nixlMismatchError(f"metadata format {got!r}: this agent reads {METADATA_FORMAT!r}")
    for key, kind in (("name", str), ("address", str), ("source_id", str), ("epoch", int), ("token", str)):
        if key in ("address", "token") and key not in doc and "token" not in doc and "address" not in doc:
            continue  # partial metadata without connection information
        if not isinstance(doc.get(key), kind):
            raise nixlMismatchError(f"the metadata has no valid {key!r}: take it again with get_agent_metadata()")
    return doc
