"""Type stubs of the native module orbitte._orbitte (see orbitte/__init__.py
for the public API built on it)."""

from typing import Any, Optional

PROTOCOL_VERSION: int

class Error(Exception):
    #: Mooncake's return code, on errors the Mooncake adapter raises.
    code: int

class ConfigError(Error): ...
class RegisterError(Error): ...
class UnregisterError(Error): ...
class ConnectError(Error): ...
class SubmitError(Error): ...

class PeerRestartedError(SubmitError):
    handle_epoch: int
    current_epoch: int

class TransferError(Error):
    outcomes: list[Outcome]

class WaitTimeout(Error): ...
class DrainTimeout(Error): ...

class Outcome:
    request: int
    label: int
    op: str
    length: int
    status: str
    completed_prefix: int
    completed_slices: int
    slices: int
    failure: Optional[str]
    failure_slice: Optional[int]
    failure_offset: Optional[int]
    failure_path: Optional[str]
    failure_nic: Optional[int]
    uncertain: tuple[int, int]
    remote_effect: str
    remote_effect_bytes: Optional[tuple[int, int]]
    drain: str
    drain_pending_slices: int
    notification: str
    notification_why: Optional[str]
    @property
    def ok(self) -> bool: ...
    def to_dict(self) -> dict[str, Any]: ...

class Allocation:
    def __init__(self, length: int) -> None: ...
    @property
    def address(self) -> int: ...
    @property
    def length(self) -> int: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def read(self, offset: int, length: int) -> bytes: ...
    def __len__(self) -> int: ...

class Registration:
    address: int
    length: int
    id: int
    path: str
    remote: bool
    keepalive: Any
    def unregister(self) -> None: ...

class RemoteRange:
    peer: Peer
    address: int
    length: int
    epoch: int
    id: int

class Peer:
    session: str
    source_id: str
    epoch: int
    path: str
    fell_back: list[tuple[str, str]]
    ranges: list[RemoteRange]
    def range(self, index: int = 0) -> RemoteRange: ...

class Request:
    op: str
    local: Registration
    remote: RemoteRange
    length: int
    local_offset: int
    remote_offset: int
    label: int
    def __init__(
        self,
        op: str,
        local: Registration,
        remote: RemoteRange,
        length: Optional[int] = None,
        local_offset: int = 0,
        remote_offset: int = 0,
        label: int = 0,
    ) -> None: ...

class Handle:
    request: int
    drained: bool
    def poll(self) -> Optional[Outcome]: ...
    def wait(self, timeout: float = 30.0) -> Outcome: ...
    def wait_drain(self, timeout: float = 30.0) -> None: ...
    def cancel(self) -> bool: ...

class Notification:
    source_id: str
    epoch: int
    path: str
    payload: bytes

class NativeEngine:
    def __init__(
        self,
        source_id: str,
        rdma: bool = False,
        devices: list[str] = ...,
        path: str = "auto",
        rails: int = 1,
        request_timeout: float = 10.0,
        handshake_timeout: float = 5.0,
        metadata: Optional[str] = None,
    ) -> None: ...
    @property
    def source_id(self) -> str: ...
    @property
    def epoch(self) -> int: ...
    def rdma_devices(self) -> list[str]: ...
    def listen(self, addr: str) -> int: ...
    def port(self) -> Optional[int]: ...
    def register(
        self, address: int, length: int, keepalive: Any, remote: bool = True, kept: bool = False
    ) -> Registration: ...
    def register_allocation(
        self, allocation: Allocation, keepalive: Any, remote: bool = True
    ) -> Registration: ...
    def unregister(self, registration: Registration | int) -> None: ...
    def registrations(self) -> list[tuple[int, int]]: ...
    def connect(self, session: str) -> Peer: ...
    def submit(self, peer: Peer, requests: list[Request],
               notify: Optional[bytes] = None) -> list[Handle]: ...
    def transfer(self, peer: Peer, requests: list[Request],
                 notify: Optional[bytes] = None) -> None: ...
    def metrics_json(self) -> str: ...
    def notifications(self) -> list[Notification]: ...
    def wait_notification(self, timeout: float) -> Optional[Notification]: ...
    def close(self, timeout: float = 5.0) -> None: ...

Addresses = list[int] | bytes

class MooncakeEngine:
    ERR_INVALID_ARGUMENT: int
    ERR_ADDRESS_NOT_REGISTERED: int
    ERR_DEVICE_NOT_FOUND: int
    ERR_ADDRESS_OVERLAPPED: int
    ERR_SOCKET_FAIL: int
    ERR_REJECT_HANDSHAKE: int
    ERR_METADATA: int
    def __init__(
        self,
        source_id: str,
        metadata: Optional[str] = None,
        rdma: bool = False,
        devices: list[str] = ...,
        path: str = "auto",
        request_timeout: float = 10.0,
    ) -> None: ...
    def rdma_devices(self) -> list[str]: ...
    def listen(self, addr: str) -> int: ...
    def port(self) -> Optional[int]: ...
    def register(self, address: int, length: int, remote: bool = True) -> None: ...
    def register_allocation(self, allocation: Allocation, remote: bool = True) -> None: ...
    def unregister(self, address: int) -> None: ...
    def write_local(self, address: int, data: bytes) -> None: ...
    def read_local(self, address: int, length: int) -> bytes: ...
    def connect(self, session: str) -> Peer: ...
    def transfer_batch(
        self, session: str, write: bool, locals: Addresses, remotes: Addresses,
        lengths: Addresses, notify: Optional[bytes] = None,
    ) -> None: ...
    def submit_batch(
        self, session: str, write: bool, locals: Addresses, remotes: Addresses, lengths: Addresses,
    ) -> list[Handle]: ...
    def repeat_batch(
        self, session: str, write: bool, locals: Addresses, remotes: Addresses, lengths: Addresses,
        seconds: float,
    ) -> tuple[int, float]: ...
    def notifications(self) -> list[Notification]: ...
    def close(self, timeout: float = 5.0) -> None: ...

def capabilities() -> list[dict[str, Any]]: ...
