"""A drop-in for ``mooncake.engine.TransferEngine``.

Change only the import::

    from orbitte.mooncake import TransferEngine   # was: from mooncake.engine import TransferEngine

Same method names, argument order and return codes (0 on success, a
negative Mooncake error code on failure); pointers and lengths are plain
ints (lists or numpy arrays for the batch calls); the remote pointer is the
target's absolute virtual address; a session id is ``"host:port"`` with the
port from the target's ``get_rpc_port()``, connected on first use and
cached. What a failed call's int does not tell, :meth:`TransferEngine.last_error`
does: the message, and each request's full OrbitTE outcome (completed
prefix, failure, remote effect, drain).

What only this API needs is this adapter's, with its native side
``orbitte._orbitte.MooncakeEngine``: memory named by address on both sides,
the session cache (a failed session is opened again on its next use; a
remote address registered after the session opened makes it reopen once),
and Mooncake's error codes (``MooncakeEngine.ERR_*``, carried as the
``code`` of the errors it raises). :class:`orbitte.Engine` has none of them.
"""

from __future__ import annotations

import bisect
import enum
import json
import itertools
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from . import Buffer, Error, _warn_if_open
from ._orbitte import MooncakeEngine as _Native

__all__ = ["LastError", "RdmaFallbackWarning", "TransferEngine", "TransferNotify", "TransferOpcode"]

_count = itertools.count()
_log = logging.getLogger("orbitte.mooncake")


class RdmaFallbackWarning(UserWarning):
    """``initialize`` was asked for protocol "rdma" on a host with no RDMA
    device and carries on over tcp, as Mooncake does; the message names the
    reason. ``ORBITTE_STRICT_RDMA=1`` makes it refuse instead (-6)."""


def _env_true(name: str) -> bool:
    """Whether the environment variable ``name`` is set to 1, true, yes or on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class TransferOpcode(enum.IntEnum):
    """Mooncake's opcodes."""

    READ = 0
    WRITE = 1
    Read = 0
    Write = 1


@dataclass
class TransferNotify:
    """Mooncake's notification object (name, msg): passed to
    ``transfer_sync``/``batch_transfer_sync``, the target reads it with
    ``get_notifies()`` once every byte of the batch is in its memory."""

    name: str = ""
    msg: str = ""

    def _encode(self) -> bytes:
        return json.dumps({"name": self.name, "msg": self.msg}).encode()

    @classmethod
    def _decode(cls, source_id: str, payload: bytes) -> "TransferNotify":
        try:
            d = json.loads(payload)
            return cls(str(d["name"]), str(d["msg"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            return cls(source_id, payload.decode("utf-8", "replace"))


# What this build supports (Mooncake's module attributes). SUPPORT_CUDA stays
# False: device pointers register and peers READ and WRITE them, but staged
# through host memory over tcp, not Mooncake's CUDA contract (GPUDirect RDMA on
# the rdma protocol, device-side copies, NVLink transport).
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False


@dataclass
class LastError:
    """Why the calling thread's last failed call failed."""

    call: str
    code: int
    message: str
    #: One ``orbitte.Outcome`` per request when the batch ran (completed
    #: prefix, failure, remote effect, drain); empty when it was refused
    #: before anything was posted.
    outcomes: list = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.call} returned {self.code}: {self.message}"


def _ints(values: Any) -> list:
    """A list of ints from a list, tuple or numpy array."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    return values if isinstance(values, list) else [int(v) for v in values]


def _packed(values: Any) -> Any:
    """A batch argument for the native side: a list as it is, a numpy array
    as packed u64 bytes (read there without touching each item)."""
    if isinstance(values, list):
        return values
    if hasattr(values, "astype") and hasattr(values, "tobytes"):
        if getattr(values, "ndim", 1) != 1:
            raise ValueError("a batch argument must be a one-dimensional array")
        if values.dtype.kind not in "iu":
            raise TypeError(f"a batch argument must hold integers, not {values.dtype}")
        if values.dtype.kind == "i" and len(values) and values.min() < 0:
            raise ValueError("addresses and lengths cannot be negative")
        return values.astype("<u8", copy=False).tobytes()
    return [int(v) for v in values]


class TransferEngine:
    """Mooncake's ``TransferEngine`` over OrbitTE."""

    def __init__(self) -> None:
        self._native: Optional[_Native] = None
        self._hostname = ""
        self._tls = threading.local()
        self._managed: dict[int, Buffer] = {}
        self._batches: dict[int, list] = {}
        # Registrations of CUDA device memory: address -> (length, report).
        self._staged: dict[int, tuple[int, str]] = {}
        # Batch id -> the staging note of its failure message.
        self._batch_notes: dict[int, str] = {}
        self._lock = threading.Lock()

    # -- errors ---------------------------------------------------------
    def _fail(self, call: str, err: BaseException, note: Optional[str] = None) -> int:
        code = getattr(err, "code", None)
        if not isinstance(code, int) or code >= 0:
            code = _Native.ERR_INVALID_ARGUMENT
        outcomes = list(getattr(err, "outcomes", None) or [])
        message = str(err) if not note else f"{err}; {note}"
        self._tls.error = LastError(call, code, message, outcomes)
        return code

    def _staging_note(self, buffers: Any) -> Optional[str]:
        """Says which local buffers of a batch are CUDA device memory (their
        transfers are staged through host memory), or None."""
        with self._lock:
            if not self._staged:
                return None
            staged = sorted(self._staged.items())
        starts = [a for a, _ in staged]
        try:
            addrs = [int(buffers)] if isinstance(buffers, int) else _ints(buffers)
        except (TypeError, ValueError, OverflowError):
            return None
        for a in addrs:
            i = bisect.bisect_right(starts, int(a)) - 1
            if i >= 0 and int(a) < starts[i] + staged[i][1][0]:
                return f"local buffer {int(a):#x} is {staged[i][1][1]}"
        return None

    def last_error(self) -> Optional[LastError]:
        """The calling thread's last failure (None after a success)."""
        return getattr(self._tls, "error", None)

    def _engine(self) -> _Native:
        if self._native is None:
            raise Error("the engine is not initialized: call initialize() first")
        return self._native

    # -- setup ----------------------------------------------------------
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str,
                   device_name: str) -> int:
        """``local_hostname`` is "host" or "host:port" (no port: any free
        one, see get_rpc_port); ``metadata_server`` "P2PHANDSHAKE" (peers
        exchange descriptors at connect); ``protocol`` "tcp" or "rdma"
        ("rdma" runs as "tcp" under ``MC_FORCE_TCP=1``, and on a host that
        lists no RDMA device carries on over tcp with an
        :class:`RdmaFallbackWarning`, or returns -6 under
        ``ORBITTE_STRICT_RDMA=1``); ``device_name`` a comma-separated RDMA
        device filter ("" for all).
        With an etcd metadata server ("etcd://HOST:PORT" or "HOST:PORT") the
        engine stores its record under ``local_hostname``, and peers' session
        ids are their ``local_hostname``."""
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "")

    def initialize_ext(self, local_hostname: str, metadata_server: str, protocol: str,
                       device_name: str, metadata_type: str) -> int:
        call = "initialize"
        try:
            if self._native is not None:
                raise Error("already initialized: use one TransferEngine per initialize()")
            meta = (metadata_server or "").strip()
            p2p = meta.upper() in ("P2PHANDSHAKE", "P2P") or (metadata_type or "").lower() == "p2p"
            if not p2p and (metadata_type or "etcd").lower() != "etcd":
                err = Error(
                    f"metadata type {metadata_type!r}: this package supports P2PHANDSHAKE and etcd "
                    "(metadata_server 'etcd://HOST:PORT' or 'HOST:PORT')"
                )
                err.code = _Native.ERR_METADATA
                raise err
            proto = (protocol or "tcp").strip().lower()
            if proto not in ("tcp", "rdma"):
                raise Error(f"protocol {protocol!r}: use 'tcp' or 'rdma'")
            if proto == "rdma" and _env_true("MC_FORCE_TCP"):
                _log.info("MC_FORCE_TCP is set: protocol 'rdma' runs as 'tcp'")
                proto = "tcp"
            devices = [d.strip() for d in (device_name or "").split(",") if d.strip()]
            host, _, port = local_hostname.rpartition(":") if ":" in local_hostname else (local_hostname, "", "0")
            # No host: every interface only with a cluster secret; an open
            # engine stays on this host unless the caller names an address.
            host = host.strip("[]") or ("0.0.0.0" if os.environ.get("ORBITTE_SECRET_FILE") else "127.0.0.1")
            # With etcd, peers name this engine by its local_hostname (its
            # record's key), as Mooncake's segment names; with p2p by address.
            source_id = local_hostname if not p2p else f"{local_hostname}-{os.getpid()}-{next(_count)}"
            settings = dict(
                metadata=None if p2p else meta,
                devices=devices,
                path=os.environ.get("ORBITTE_PATH", "auto"),
                request_timeout=float(os.environ.get("ORBITTE_REQUEST_TIMEOUT")
                                      or os.environ.get("MC_TRANSFER_TIMEOUT") or "10"),
            )
            try:
                native = _Native(source_id, rdma=proto == "rdma", **settings)
            except Error as e:
                # Mooncake carries on over tcp on a host without an RDMA
                # device; ORBITTE_STRICT_RDMA=1 keeps the refusal.
                if getattr(e, "code", None) != _Native.ERR_DEVICE_NOT_FOUND or _env_true("ORBITTE_STRICT_RDMA"):
                    raise
                warnings.warn(
                    f"protocol 'rdma' carries on over tcp: {e} "
                    "(set ORBITTE_STRICT_RDMA=1 to have initialize refuse with -6 instead)",
                    RdmaFallbackWarning,
                    stacklevel=3,
                )
                native = _Native(source_id, rdma=False, **settings)
            try:
                native.listen(f"{host}:{int(port or 0)}")
            except Error:
                native.listen(f"0.0.0.0:{int(port or 0)}")
            # P2PHANDSHAKE peers name this engine by its address alone: only
            # the cluster secret (ORBITTE_SECRET_FILE) closes it.
            _warn_if_open(native)
            self._native = native
            self._hostname = host
            self._tls.error = None
            return 0
        except (Error, TypeError, ValueError, OverflowError) as e:
            return self._fail(call, e)

    def get_rpc_port(self) -> int:
        """The port peers reach this engine on: their session id for it is
        ``f"{local_hostname}:{get_rpc_port()}"``."""
        port = self._engine().port()
        return int(port or 0)

    def get_local_topology(self, device_name: str = "") -> str:
        return ",".join(self._engine().rdma_devices())

    # -- memory ---------------------------------------------------------
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers ``capacity`` bytes at ``buffer_addr``. The memory must
        stay allocated until unregister_memory (as with Mooncake).
        ``location`` (Mooncake's "cpu:0", "cuda:0" or "*") is accepted and
        not needed: where the memory is comes from the process's mappings
        and the CUDA driver, as below.

        Host memory (mapped readable and writable in this process) is
        published to peers. Otherwise, when libcuda is present and says the
        address is CUDA device memory (a GPU KV-cache tensor's
        ``data_ptr()``), it is registered on the cuda-staging path: its
        transfers are staged through host memory (never GPUDirect), it is
        published like host memory (a peer READs and WRITEs it over tcp,
        this engine copying through host bounce buffers), and
        :meth:`describe_memory` says so. Anything else is refused (-1) with
        both reasons in :meth:`last_error`."""
        try:
            report = self._engine().register(int(buffer_addr), int(capacity), remote=True)
            if report is not None:
                with self._lock:
                    self._staged[int(buffer_addr)] = (int(capacity), report)
                _log.info("register_memory(%#x, %d): %s", int(buffer_addr), int(capacity), report)
            self._tls.error = None
            return 0
        except (Error, TypeError, ValueError, OverflowError) as e:
            return self._fail("register_memory", e)

    def describe_memory(self, buffer_addr: int) -> str:
        """How the registration starting at ``buffer_addr`` is served, in
        words (not in Mooncake's API): "host memory", or for CUDA device
        memory the device and "staged through host memory (cuda-staging
        path)"; "" when nothing is registered there."""
        with self._lock:
            staged = self._staged.get(int(buffer_addr))
        if staged is not None:
            return staged[1]
        ranges = self._engine().registrations()
        return "host memory" if any(a == int(buffer_addr) for a, _ in ranges) else ""

    def unregister_memory(self, buffer_addr: int) -> int:
        try:
            self._engine().unregister(int(buffer_addr))
            with self._lock:
                self._staged.pop(int(buffer_addr), None)
            self._tls.error = None
            return 0
        except (Error, TypeError, ValueError, OverflowError) as e:
            return self._fail("unregister_memory", e)

    def batch_register_memory(self, buffer_addresses: Sequence[int], capacities: Sequence[int]) -> int:
        try:
            addrs, caps = _ints(buffer_addresses), _ints(capacities)
            if len(addrs) != len(caps):
                raise ValueError(f"{len(addrs)} addresses but {len(caps)} capacities")
        except (TypeError, ValueError, OverflowError) as e:
            return self._fail("batch_register_memory", e)
        for a, c in zip(addrs, caps):
            rc = self.register_memory(a, c)
            if rc != 0:
                return rc
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        try:
            addrs = _ints(buffer_addresses)
        except (TypeError, ValueError, OverflowError) as e:
            return self._fail("batch_unregister_memory", e)
        rc_all = 0
        for a in addrs:
            rc = self.unregister_memory(a)
            rc_all = rc_all or rc
        return rc_all

    def allocate_managed_buffer(self, length: int) -> int:
        """Allocates and registers ``length`` bytes of memfd memory (a
        same-host peer can map it: the local path); returns its address, 0
        on failure."""
        try:
            buf = Buffer(int(length))
            self._engine().register_allocation(buf._alloc, remote=True)
        except (Error, TypeError, ValueError, OverflowError) as e:
            self._fail("allocate_managed_buffer", e)
            return 0
        with self._lock:
            self._managed[buf.address] = buf
        return buf.address

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        with self._lock:
            buf = self._managed.get(int(buffer_addr))
        if buf is None:
            err = Error(f"{int(buffer_addr):#x} is not a managed buffer of this engine")
            err.code = _Native.ERR_ADDRESS_NOT_REGISTERED
            return self._fail("free_managed_buffer", err)
        rc = self.unregister_memory(buf.address)
        if rc == 0:
            with self._lock:
                self._managed.pop(buf.address, None)
        return rc

    def write_bytes_to_buffer(self, dest_address: int, src_ptr: bytes, length: int) -> int:
        """Copies ``length`` bytes of ``src_ptr`` into registered memory
        (memory unmapped since it was registered is an error, not a crash)."""
        try:
            data = bytes(src_ptr)
            if length < 0 or length > len(data):
                raise ValueError(f"length {length} is outside the {len(data)} bytes given")
            self._engine().write_local(int(dest_address), data[:length])
            return 0
        except (Error, TypeError, ValueError, OverflowError) as e:
            return self._fail("write_bytes_to_buffer", e)

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """Copies ``length`` bytes of registered memory out (b"" on error)."""
        try:
            return self._engine().read_local(int(source_address), int(length))
        except (Error, TypeError, ValueError, OverflowError) as e:
            self._fail("read_bytes_from_buffer", e)
            return b""

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the first range the peer ``segment_name``
        ("host:port") published, or 0."""
        try:
            ranges = self._engine().connect(str(segment_name)).ranges
            return ranges[0].address if ranges else 0
        except (Error, TypeError, ValueError) as e:
            self._fail("get_first_buffer_address", e)
            return 0

    # -- transfers ------------------------------------------------------
    def _batch(self, call: str, target_hostname: str, write: bool, buffers: Any,
               peer_buffer_addresses: Any, lengths: Any, notify: Optional[TransferNotify] = None) -> int:
        try:
            self._engine().transfer_batch(target_hostname, write, _packed(buffers),
                                          _packed(peer_buffer_addresses), _packed(lengths),
                                          None if notify is None else notify._encode())
            self._tls.error = None
            return 0
        except (Error, TypeError, ValueError, OverflowError) as e:
            return self._fail(call, e, self._staging_note(buffers))

    def transfer_sync_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                            length: int, transport_hint: str = "") -> int:
        return self._batch("transfer_sync_write", target_hostname, True, [buffer],
                           [peer_buffer_address], [length])

    def transfer_sync_read(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                           length: int, transport_hint: str = "") -> int:
        return self._batch("transfer_sync_read", target_hostname, False, [buffer],
                           [peer_buffer_address], [length])

    def transfer_sync(self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
                      opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                      transport_hint: str = "") -> int:
        return self._batch("transfer_sync", target_hostname, int(opcode) == TransferOpcode.WRITE,
                           [buffer], [peer_buffer_address], [length], notify)

    def batch_transfer_sync_write(self, target_hostname: str, buffers: Any, peer_buffer_addresses: Any,
                                  lengths: Any, transport_hint: str = "") -> int:
        return self._batch("batch_transfer_sync_write", target_hostname, True, buffers,
                           peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname: str, buffers: Any, peer_buffer_addresses: Any,
                                 lengths: Any, transport_hint: str = "") -> int:
        return self._batch("batch_transfer_sync_read", target_hostname, False, buffers,
                           peer_buffer_addresses, lengths)

    def batch_transfer_sync(self, target_hostname: str, buffers: Any, peer_buffer_addresses: Any,
                            lengths: Any, opcode: TransferOpcode, notify: Optional[TransferNotify] = None,
                            transport_hint: str = "") -> int:
        return self._batch("batch_transfer_sync", target_hostname, int(opcode) == TransferOpcode.WRITE,
                           buffers, peer_buffer_addresses, lengths, notify)

    def get_notifies(self) -> list:
        """Notifications received so far (each once, after every byte of
        its batch was placed here), as TransferNotify(name, msg)."""
        return [TransferNotify._decode(n.source_id, n.payload) for n in self._engine().notifications()]

    def send_probe(self, peer_server_name: str) -> int:
        """0 when the peer ``host:port`` answers a handshake, else a
        negative code."""
        try:
            self._engine().connect(str(peer_server_name))
            return 0
        except (Error, TypeError, ValueError) as e:
            return self._fail("send_probe", e)

    # -- asynchronous batches -------------------------------------------
    def _submit(self, call: str, target_hostname: str, write: bool, buffers: Any,
                peer_buffer_addresses: Any, lengths: Any) -> int:
        try:
            handles = self._engine().submit_batch(target_hostname, write, _packed(buffers),
                                                  _packed(peer_buffer_addresses), _packed(lengths))
        except (Error, TypeError, ValueError, OverflowError) as e:
            self._fail(call, e, self._staging_note(buffers))
            return 0
        batch_id = next(_count) + 1
        note = self._staging_note(buffers)
        with self._lock:
            self._batches[batch_id] = handles
            if note:
                self._batch_notes[batch_id] = note
        return batch_id

    def batch_transfer_async_write(self, target_hostname: str, buffers: Any, peer_buffer_addresses: Any,
                                   lengths: Any, transport_hint: str = "") -> int:
        """Submits; returns a batch id (0 on failure)."""
        return self._submit("batch_transfer_async_write", target_hostname, True, buffers,
                            peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname: str, buffers: Any, peer_buffer_addresses: Any,
                                  lengths: Any, transport_hint: str = "") -> int:
        return self._submit("batch_transfer_async_read", target_hostname, False, buffers,
                            peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname: str, buffer: int, peer_buffer_address: int,
                              length: int, transport_hint: str = "") -> int:
        return self._submit("transfer_submit_write", target_hostname, True, [buffer],
                            [peer_buffer_address], [length])

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits for the batches; 0 if every request completed, -1 if not."""
        rc = 0
        for b in _ints(batch_ids):
            with self._lock:
                handles = self._batches.pop(b, None)
                note = self._batch_notes.pop(b, None)
            if handles is None:
                err = Error(f"unknown batch id {b}: pass an id that batch_transfer_async_* returned, once")
                return self._fail("get_batch_transfer_status", err)
            outcomes = []
            for h in handles:
                try:
                    o = h.wait(60.0)
                    h.wait_drain(60.0)
                except Error as e:
                    return self._fail("get_batch_transfer_status", e)
                outcomes.append(o)
            if not all(o.ok for o in outcomes):
                message = f"batch {b}: a request did not complete"
                self._tls.error = LastError("get_batch_transfer_status", -1,
                                            f"{message}; {note}" if note else message, outcomes)
                rc = -1
        return rc

    def transfer_check_status(self, batch_id: int) -> int:
        """1 done, 0 in progress, -1 failed, -2 timed out (Mooncake's)."""
        with self._lock:
            handles = self._batches.get(int(batch_id))
        if handles is None:
            return -1
        results = [h.poll() for h in handles]
        if any(o is None for o in results):
            return 0
        with self._lock:
            self._batches.pop(int(batch_id), None)
            note = self._batch_notes.pop(int(batch_id), None)
        if all(o.ok for o in results):
            return 1
        message = "a request did not complete"
        self._tls.error = LastError("transfer_check_status", -1,
                                    f"{message}; {note}" if note else message, results)
        return -2 if any(o.status == "timed_out" for o in results) else -1

    def close(self) -> None:
        """Stops serving and releases the engine (not in Mooncake's API)."""
        if self._native is not None:
            self._native.close()
