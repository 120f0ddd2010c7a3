"""OrbitTE: one-sided READ and WRITE between registered memory on different
processes and hosts, over RDMA (Host Direct), TCP or shared memory.

Three APIs over one native engine:

- :class:`Engine`, OrbitTE's own, with the Rust engine's handles as native
  classes: ``register`` any writable buffer (bytearray, memoryview, numpy,
  DLPack or CPU torch tensors) or ``(address, length)`` for a
  :class:`Registration`, ``connect`` for a :class:`Peer` and its
  :class:`RemoteRange` objects, :func:`write`/:func:`read` for a
  :class:`Request`, non-blocking ``submit`` returning a :class:`Handle` per
  request (``poll``, ``wait``, ``wait_drain``) that ends in an
  :class:`Outcome`. As in Rust, a batch goes to the peer incarnation its
  ranges came from or is refused (:class:`PeerRestartedError`); nothing is
  reopened or retried behind the caller.
- :mod:`orbitte.mooncake`: ``TransferEngine``, a drop-in for the
  ``mooncake.engine.TransferEngine`` calls that SGLang, vLLM and LMCache make.
- :mod:`orbitte.nixl`: ``nixl_agent``, NIXL's agent API (vLLM's
  ``NixlConnector`` calls) over one :class:`Engine`, with prepared
  descriptor lists and transfers by index built natively.

Every blocking call releases the GIL. Errors are :class:`Error` subclasses.
"""

from __future__ import annotations

import ctypes
import itertools
import json as _json
import os
import socket
import warnings
from typing import Any, Iterable, Optional, Sequence, Union

from ._orbitte import (
    PROTOCOL_VERSION,
    __version__,
    Allocation as _Allocation,
    ConfigError,
    ConnectError,
    DrainTimeout,
    Error,
    Handle,
    NativeEngine as _NativeEngine,
    Notification,
    Outcome,
    Peer,
    PeerRestartedError,
    RegisterError,
    Registration,
    RemoteRange,
    Request,
    SubmitError,
    TransferError,
    UnregisterError,
    WaitTimeout,
)
from ._orbitte import capabilities as _capabilities

__all__ = [
    "PROTOCOL_VERSION",
    "__version__",
    "Batch",
    "Buffer",
    "ConfigError",
    "ConnectError",
    "DrainTimeout",
    "Engine",
    "Error",
    "Handle",
    "Notification",
    "Outcome",
    "Peer",
    "OpenEngineWarning",
    "PeerRestartedError",
    "RegisterError",
    "Registration",
    "RemoteRange",
    "Request",
    "SubmitError",
    "TransferError",
    "UnregisterError",
    "WaitTimeout",
    "doctor",
    "read",
    "write",
]

_counter = itertools.count()


def default_source_id(prefix: str = "orbitte-py") -> str:
    """A source id unique to this process and engine: PREFIX-HOST-PID-N."""
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{next(_counter)}"


def doctor() -> list[dict]:
    """The capability matrix as data: one dict per path (rdma, tcp, local,
    cuda-staging, ...) with its build, discovery, completion and drain checks,
    each ``{"status": "pass" | "fail" | "skipped" | "not_implemented", ...}``
    with ``reason`` and ``fix`` on failure, and ``works`` when all four
    pass: the rows of ``orbitte doctor --json``'s ``paths``. Evaluates each path for real, as
    ``orbitte doctor`` does."""
    return list(_capabilities())


class _Kept(tuple):
    """A keepalive that keeps the memory mapped while held: a buffer export
    (the exporter cannot free, resize or close the buffer while it is
    exported) or a DLPack capsule (it owns a reference to the storage). Such
    memory is copied with memcpy; a plain address, whose mapping nothing
    holds, is copied through the kernel so that unmapping it fails the
    transfer instead of the process."""


def buffer_address(obj: Any, length: Optional[int] = None) -> tuple[int, int, Any]:
    """``(address, length, keepalive)`` of memory handed in by a caller.

    Accepts a writable C-contiguous buffer (bytearray, memoryview, numpy
    array, mmap), a CPU torch tensor, a DLPack tensor in host memory
    (``__dlpack__``), a :class:`Buffer`, or an int address with ``length``. The keepalive pins the memory: a buffer export, so a
    bytearray cannot be resized while it is registered."""
    if isinstance(obj, Buffer):
        return obj.address, obj.length, obj
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(v, int) for v in obj):
        obj, length = obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        if length is None:
            raise RegisterError("an address needs a length: register((address, length))")
        return obj, int(length), None
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if getattr(obj.device, "type", "cpu") != "cpu":
            raise RegisterError(
                f"a {obj.device} tensor cannot be registered here: OrbitTE registers host memory; "
                "copy it to a CPU tensor (pin_memory()) or use the cuda-staging path"
            )
        if not obj.is_contiguous():
            raise RegisterError("the tensor is not contiguous: call .contiguous() first")
        n = obj.numel() * obj.element_size()
        return int(obj.data_ptr()), n if length is None else int(length), obj
    try:
        view = memoryview(obj)
    except TypeError:
        if hasattr(obj, "__dlpack__"):
            return _dlpack_address(obj, length)
        raise TypeError(
            f"cannot register a {type(obj).__name__}: pass a writable buffer (bytearray, numpy array, "
            "memoryview), a DLPack tensor in host memory, a CPU torch tensor, an orbitte.Buffer or "
            "(address, length)"
        ) from None
    if view.readonly:
        raise RegisterError(
            f"the {type(obj).__name__} is read-only: peers and READs write registered memory; pass a bytearray or a writable array"
        )
    if not view.c_contiguous:
        raise RegisterError("the buffer is not C-contiguous: pass a contiguous array (numpy.ascontiguousarray)")
    n = view.nbytes
    if n == 0:
        raise RegisterError("the buffer is empty: register at least one byte")
    pin = (ctypes.c_char * n).from_buffer(view)
    return ctypes.addressof(pin), n if length is None else int(length), _Kept((obj, view, pin))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# DLPack device types whose memory this process can address: CPU, CUDA host
# (pinned) and ROCm host.
_DL_HOST_DEVICES = {1: "cpu", 3: "cuda_host", 11: "rocm_host"}


def _dlpack_address(obj: Any, length: Optional[int]) -> tuple[int, int, Any]:
    """``(address, length, keepalive)`` of a DLPack tensor in host memory;
    the keepalive is the capsule, which owns the producer's reference."""
    if hasattr(obj, "__dlpack_device__"):
        kind, _ = obj.__dlpack_device__()
        if int(kind) not in _DL_HOST_DEVICES:
            raise RegisterError(
                f"a DLPack tensor on device type {int(kind)} cannot be registered here: OrbitTE registers "
                "host memory; copy it to host memory or use the cuda-staging path"
            )
    try:
        capsule = obj.__dlpack__()
    except BufferError as e:  # numpy: a read-only array has no DLPack export
        raise RegisterError(
            f"the {type(obj).__name__} cannot be exported writable ({e}): peers and READs write "
            "registered memory; pass a writable tensor"
        ) from None
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    try:
        managed = get(capsule, b"dltensor")
    except ValueError:
        raise RegisterError("the object's __dlpack__ gave no unconsumed 'dltensor' capsule") from None
    t = _DLTensor.from_address(managed)  # DLManagedTensor starts with its DLTensor
    if t.device.device_type not in _DL_HOST_DEVICES:
        raise RegisterError(f"a DLPack tensor on device type {t.device.device_type} is not host memory")
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    if t.strides:
        expect = itemsize
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] * itemsize != expect:
                raise RegisterError("the DLPack tensor is not contiguous: make it contiguous first")
            expect *= shape[i]
    n = itemsize
    for d in shape:
        n *= d
    if n == 0:
        raise RegisterError("the DLPack tensor is empty: register at least one byte")
    return (t.data or 0) + t.byte_offset, n if length is None else int(length), _Kept((obj, capsule))


class Buffer:
    """Host memory the engine allocated: page-aligned, zeroed, memfd-backed,
    so a same-host peer can map it (the local path). Supports the buffer
    protocol through :attr:`view` (a memoryview) and :meth:`numpy`."""

    def __init__(self, length: int):
        self._alloc = _Allocation(int(length))
        self._array = (ctypes.c_char * self._alloc.length).from_address(self._alloc.address)

    @property
    def address(self) -> int:
        return self._alloc.address

    @property
    def length(self) -> int:
        return self._alloc.length

    def __len__(self) -> int:
        return self._alloc.length

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the whole buffer (valid while this
        object lives)."""
        return memoryview(self._array).cast("B")

    def numpy(self):
        """The buffer as a numpy uint8 array sharing the memory."""
        import numpy as np

        return np.frombuffer(self._array, dtype=np.uint8)

    def __repr__(self) -> str:
        return f"<orbitte.Buffer {self.length} bytes at {self.address:#x}>"


def write(local: Registration, remote: RemoteRange, length: Optional[int] = None, *,
          local_offset: int = 0, remote_offset: int = 0, label: int = 0) -> Request:
    """A WRITE of ``length`` bytes (default: the rest of the local
    registration from ``local_offset``) from ``local`` at ``local_offset``
    into ``remote`` at ``remote_offset``."""
    return Request("write", local, remote, length, local_offset, remote_offset, label)


def read(local: Registration, remote: RemoteRange, length: Optional[int] = None, *,
         local_offset: int = 0, remote_offset: int = 0, label: int = 0) -> Request:
    """A READ of ``length`` bytes (default: the rest of the local
    registration from ``local_offset``) from ``remote`` at ``remote_offset``
    into ``local`` at ``local_offset``."""
    return Request("read", local, remote, length, local_offset, remote_offset, label)


class Batch(list):
    """The handles of one submitted batch, in request order."""

    def wait(self, timeout: float = 30.0, *, check: bool = True) -> list[Outcome]:
        """Every outcome, then drain of every request. With ``check`` (the
        default), raises :class:`TransferError` (``.outcomes``) unless every
        byte of every request arrived."""
        outcomes = [h.wait(timeout) for h in self]
        for h in self:
            h.wait_drain(timeout)
        if check and not all(o.ok for o in outcomes):
            bad = next(o for o in outcomes if not o.ok)
            err = TransferError(
                f"{sum(not o.ok for o in outcomes)} of {len(outcomes)} request(s) did not complete; first: {bad!r}"
            )
            err.outcomes = outcomes
            raise err
        return outcomes

    def poll(self) -> list[Optional[Outcome]]:
        return [h.poll() for h in self]


def _peer(peer: Any) -> Peer:
    if not isinstance(peer, Peer):
        raise TypeError(
            f"a batch is submitted for a Peer, not a {type(peer).__name__}: "
            "peer = engine.connect(address) and build the requests from peer.ranges"
        )
    return peer


class OpenEngineWarning(UserWarning):
    """An engine listens where other hosts reach it and admits every peer
    (no cluster secret, no listener token): they can read and write what
    it registered. The message names the fix."""


def _warn_if_open(native: Any) -> None:
    text = native.open_listener()
    if text:
        warnings.warn(text, OpenEngineWarning, stacklevel=3)


class Engine:
    """An OrbitTE engine: a source owner that serves its registrations to
    peers and opens peers.

    ``Engine(listen="127.0.0.1:0")`` serves right away; ``rdma=True``
    registers memory with Host Direct on every usable NIC (``devices``
    filters them by name; a registration error is never a silent switch to
    another path); ``path`` is "auto" (local > rdma > tcp), "tcp", "local"
    or "rdma"; ``rails`` is the connections per peer; ``metadata`` None
    (peer-to-peer: peers are named "host:port") or an etcd URL
    ("etcd://HOST:PORT[/PREFIX]": the engine stores its record there after
    ``listen`` and peers may be named by source id).

    Who gets in: ``cluster_secret_file`` (default: the file
    ``$ORBITTE_SECRET_FILE`` names) holds the cluster secret every engine
    of the cluster shares; peers without it are refused. With
    ``listener_token=True`` the engine draws a random token
    (:attr:`token`) and admits only peers that connect with it
    (``connect(address, token=...)``): hand it to them with the address,
    over a channel you trust. An engine with neither admits every peer
    that reaches its port, and :meth:`listen` on an address other hosts
    reach warns so (:class:`OpenEngineWarning`)."""

    def __init__(self, source_id: Optional[str] = None, *, listen: Optional[str] = None,
                 rdma: bool = False, devices: Sequence[str] = (), path: str = "auto",
                 rails: int = 1, request_timeout: float = 10.0, handshake_timeout: float = 5.0,
                 metadata: Optional[str] = None, cluster_secret_file: Optional[str] = None,
                 listener_token: bool = False):
        self._native = _NativeEngine(
            source_id or default_source_id(),
            rdma=bool(rdma),
            devices=list(devices),
            path=path,
            rails=int(rails),
            request_timeout=float(request_timeout),
            handshake_timeout=float(handshake_timeout),
            metadata=metadata,
            cluster_secret_file=None if cluster_secret_file is None else os.fspath(cluster_secret_file),
            listener_token=bool(listener_token),
        )
        self._host = "127.0.0.1"
        if listen is not None:
            self.listen(listen)

    @property
    def source_id(self) -> str:
        return self._native.source_id

    @property
    def epoch(self) -> int:
        return self._native.epoch

    @property
    def port(self) -> Optional[int]:
        return self._native.port()

    @property
    def token(self) -> Optional[str]:
        """The listener token peers must connect with (64 hexadecimal
        digits), or None without ``listener_token=True``."""
        return self._native.token

    @property
    def address(self) -> str:
        """``host:port`` peers connect to (after :meth:`listen`)."""
        port = self.port
        if port is None:
            raise ConfigError("the engine does not listen: call listen() first")
        return f"{self._host}:{port}"

    def listen(self, addr: str = "127.0.0.1:0") -> int:
        """Serves this engine's registrations on ``addr`` (port 0: any);
        returns the port."""
        host = addr.rsplit(":", 1)[0].strip("[]")
        port = self._native.listen(addr)
        self._host = host if host not in ("0.0.0.0", "::", "") else socket.gethostname()
        _warn_if_open(self._native)
        return port

    def alloc(self, length: int) -> Buffer:
        """Memfd host memory that same-host peers can map (the local path)."""
        return Buffer(length)

    def register(self, memory: Any, length: Optional[int] = None, *, remote: bool = True) -> Registration:
        """Registers memory (see :func:`buffer_address` for what is
        accepted). ``remote=True`` publishes it to peers for their READs and
        WRITEs; ``remote=False`` keeps it local-only (a source or sink of
        this engine's requests). The memory's owner is kept alive until
        :meth:`unregister` and drain."""
        if isinstance(memory, Buffer):
            return self._native.register_allocation(memory._alloc, memory, remote=remote)
        address, n, keep = buffer_address(memory, length)
        return self._native.register(address, n, keep, remote=remote, kept=isinstance(keep, _Kept))

    def register_device(self, address: int, length: int, keepalive: Any = None, *,
                        remote: bool = False) -> Registration:
        """Registers CUDA device memory (``cudaMalloc``, a CUDA tensor's
        ``data_ptr()``) on the cuda-staging path: its transfers are staged
        through pinned host memory (``Registration.staged``). With
        ``remote=True`` it is published and peers READ and WRITE it over tcp
        (this engine copies each request's bytes between the device and host
        bounce buffers, synchronized, before it answers; rdma and same-host
        mapping cannot reach it); otherwise it is local-only. Refused with the
        reason when libcuda is absent, there is no device, or the driver does
        not call it device memory. ``keepalive`` (the tensor) is kept until
        :meth:`unregister` and drain."""
        return self._native.register_device(int(address), int(length), keepalive, remote=bool(remote))

    def unregister(self, registration: Union[Registration, int]) -> None:
        """Removes a registration (or the one that starts at an address);
        refused with :class:`UnregisterError` while requests on it are
        undrained."""
        self._native.unregister(registration)

    def registrations(self) -> list[tuple[int, int]]:
        """Every registration of this engine: ``(address, length)``."""
        return self._native.registrations()

    def connect(self, addr: str, token: Optional[str] = None) -> Peer:
        """Opens the engine at ``addr`` ("host:port", or a source id with
        etcd metadata): handshake with epochs, its publications, the path
        chosen by the policy. ``token``: that engine's :attr:`token`, when it
        listens with one (kept for every later session to it). Always a
        fresh handshake: a dead target raises :class:`ConnectError`."""
        return self._native.connect(addr, token)

    def submit(self, peer: Peer, requests: Iterable[Request], *,
               notify: Optional[bytes] = None) -> Batch:
        """Submits a batch for ``peer`` without waiting; all requests are
        admitted or none (:class:`SubmitError` names the first bad one;
        :class:`PeerRestartedError` when the peer restarted since its
        ranges were published). With ``notify`` (at most 1 MiB; 4 KiB to a
        peer reached only over rdma) the peer receives those bytes once,
        after every byte of the batch is placed, and only if every request
        completes; each outcome's ``notification`` says what became of it
        ("sent": queued by the peer; "refused": the peer keeps no more
        unread notifications from this engine and must read them)."""
        return Batch(self._native.submit(_peer(peer), list(requests),
                                         None if notify is None else bytes(notify)))

    def transfer(self, peer: Peer, requests: Iterable[Request], *,
                 notify: Optional[bytes] = None) -> None:
        """Submits and waits for every outcome and drain (GIL released);
        raises :class:`TransferError` (``.outcomes``) unless all complete
        and the notification, if any, was queued by the peer."""
        self._native.transfer(_peer(peer), list(requests), None if notify is None else bytes(notify))

    def metrics(self) -> dict[str, Any]:
        """What the engine counted since it was built, as plain data (the
        shape docs/json.md describes): per path and peer, requests, bytes
        and outcomes by op with latency histograms, rails up and down;
        engine-wide, rail recoveries, notifications, listener refusals and
        evictions, registration budgets used."""
        return _json.loads(self._native.metrics_json())

    def notifications(self) -> list[Notification]:
        """Every notification received so far, oldest first (never blocks)."""
        return self._native.notifications()

    def wait_notification(self, timeout: float = 30.0) -> Optional[Notification]:
        """The oldest notification, waiting up to ``timeout`` seconds (GIL
        released); None when none came."""
        return self._native.wait_notification(float(timeout))

    def close(self, timeout: float = 5.0) -> None:
        """Stops serving, fences, waits for drain, releases native objects."""
        self._native.close(timeout)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<orbitte.Engine {self.source_id} epoch={self.epoch} port={self.port}>"
