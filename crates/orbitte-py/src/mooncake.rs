//! `MooncakeEngine`: the native side of `orbitte.mooncake.TransferEngine`,
//! which names memory the way Mooncake's callers do and answers with
//! Mooncake's return codes. It owns what only that API needs:
//!
//! - the address model: a local pointer is resolved to (registration,
//!   offset) here, a remote pointer (the target's absolute address) by the
//!   engine against the peer's publications at submit;
//! - the session cache: a session id is opened on first use, once however
//!   many threads ask, and cached; a session whose transfer failed is
//!   forgotten, so its next use opens it again (a restarted target is then
//!   a new epoch);
//! - the reopen: a remote address the cached publications do not hold (the
//!   target registered it after the session opened) makes the session
//!   open again once and the batch resolve again;
//! - Mooncake's error codes (its `error.h`): every exception raised here
//!   carries one as its `code` attribute, and the class exports them
//!   (`MooncakeEngine.ERR_*`) for the Python adapter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use orbitte::{Notification as Payload, Op, RemoteTarget, RequestError, RequestId, SubmitError};
use pyo3::prelude::*;

use crate::errors;
use crate::gpu::{Recognised, recognise};
use crate::handles::{Handle, Notification, Peer};
use crate::memory::{Allocation, LocalMiss, RangeMemory};
use crate::node::{
    BuildFailure, Failure, ListenFailure, Local, Node, Refusal, RegisterFailure, Settings,
    UnregisterFailure, lock, secs,
};

/// Sets the exception's `code` attribute (Mooncake's return code).
fn coded(err: PyErr, code: i32) -> PyErr {
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", code);
    });
    err
}

/// Whether a refusal is about the peer's side: an address or range it
/// does not (or no longer) publish, or the peer itself gone.
fn remote_miss(e: &SubmitError) -> bool {
    matches!(
        e,
        SubmitError::Invalid {
            error: RequestError::UnknownAddress { .. }
                | RequestError::AddressAfterRestart { .. }
                | RequestError::PastEnd { .. }
                | RequestError::CrossesRanges { .. }
                | RequestError::UnpublishedRemote { .. }
                | RequestError::UnknownPeer(_)
                | RequestError::NoRail { .. },
            ..
        }
    )
}

/// Whether the batch was refused because the peer restarted since the
/// session was opened (the next use opens it again).
fn restarted(e: &SubmitError) -> bool {
    matches!(
        e,
        SubmitError::Invalid {
            error: RequestError::PeerRestarted { .. },
            ..
        }
    )
}

fn failure_code(f: &Failure) -> i32 {
    match f {
        Failure::Local(_) => MooncakeEngine::ERR_ADDRESS_NOT_REGISTERED,
        Failure::Connect { refusal, .. } => match refusal {
            Refusal::Address => MooncakeEngine::ERR_INVALID_ARGUMENT,
            Refusal::Unreachable => MooncakeEngine::ERR_SOCKET_FAIL,
            Refusal::Rejected => MooncakeEngine::ERR_REJECT_HANDSHAKE,
        },
        Failure::Submit(e) if remote_miss(e) || restarted(e) => {
            MooncakeEngine::ERR_ADDRESS_NOT_REGISTERED
        }
        Failure::Notification(o)
            if o.iter()
                .any(|o| matches!(o.notification, orbitte::NotificationStatus::Refused { .. })) =>
        {
            MooncakeEngine::ERR_TOO_MANY_REQUESTS
        }
        Failure::Argument(_)
        | Failure::Submit(_)
        | Failure::Incomplete(_)
        | Failure::Notification(_)
        | Failure::Wait(_) => MooncakeEngine::ERR_INVALID_ARGUMENT,
    }
}

fn raise(py: Python<'_>, f: Failure) -> PyErr {
    let code = failure_code(&f);
    coded(f.into_py(py), code)
}

fn register_failed(f: RegisterFailure) -> PyErr {
    let code = match &f {
        RegisterFailure::Overlap { .. } => MooncakeEngine::ERR_ADDRESS_OVERLAPPED,
        RegisterFailure::Engine(orbitte::RegisterError::NoUsableNic { .. }) => {
            MooncakeEngine::ERR_DEVICE_NOT_FOUND
        }
        RegisterFailure::Memory(_)
        | RegisterFailure::Device(_)
        | RegisterFailure::Unrecognised(_)
        | RegisterFailure::Engine(_) => MooncakeEngine::ERR_INVALID_ARGUMENT,
    };
    coded(f.into_py(), code)
}

fn unregister_failed(f: UnregisterFailure) -> PyErr {
    let code = match &f {
        UnregisterFailure::NotRegistered(_) => MooncakeEngine::ERR_ADDRESS_NOT_REGISTERED,
        UnregisterFailure::Engine(_) => MooncakeEngine::ERR_INVALID_ARGUMENT,
    };
    coded(f.into_py(), code)
}

/// The cached peer of one session id (None until opened, or after it was
/// forgotten); its lock is held while it connects, so a session connects
/// once however many threads ask.
type PeerSlot = Arc<Mutex<Option<Arc<orbitte::Peer>>>>;

/// One batch in Mooncake's terms: each op is (write, local address,
/// remote address, length, label).
type Op5 = (bool, u64, u64, u64, u64);

/// The engine behind one `orbitte.mooncake.TransferEngine`.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct MooncakeEngine {
    local: Arc<Local>,
    peers: Mutex<HashMap<String, PeerSlot>>,
}

impl MooncakeEngine {
    fn node(&self) -> &Arc<Node> {
        &self.local.node
    }

    fn slot(&self, session: &str) -> PeerSlot {
        lock(&self.peers)
            .entry(session.to_owned())
            .or_default()
            .clone()
    }

    /// The peer behind `session`, opened on first use and cached.
    fn peer(&self, session: &str) -> Result<Arc<orbitte::Peer>, Failure> {
        let slot = self.slot(session);
        let mut g = lock(&slot);
        if let Some(p) = &*g {
            return Ok(p.clone());
        }
        let p = Arc::new(self.node().open(session, None)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Opens `session` now, with a handshake, whether or not one is
    /// cached, and caches the result (a dead target is an error here).
    fn reconnect(&self, session: &str) -> Result<Arc<orbitte::Peer>, Failure> {
        let slot = self.slot(session);
        let mut g = lock(&slot);
        *g = None;
        let p = Arc::new(self.node().open(session, None)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Forgets the cached peer of `session` if it is still `stale`, so the
    /// next use opens it again.
    fn forget(&self, session: &str, stale: &Arc<orbitte::Peer>) {
        let slot = lock(&self.peers).get(session).cloned();
        if let Some(slot) = slot {
            let mut g = lock(&slot);
            if g.as_ref().is_some_and(|p| Arc::ptr_eq(p, stale)) {
                *g = None;
            }
        }
    }

    /// The batch as engine requests: each local address resolved to its
    /// registration here, each remote one left to the engine, which
    /// resolves it against the peer's publications at submit (whichever
    /// incarnation is open then).
    fn requests(
        &self,
        peer: &orbitte::Peer,
        ops: &[Op5],
    ) -> Result<Vec<orbitte::Request>, Failure> {
        let regs = self.local.regs();
        ops.iter()
            .map(|&(write, local, remote, len, label)| {
                if len == 0 {
                    return Err(Failure::Argument(format!(
                        "zero-length request at local {local:#x}: every length must be at least 1"
                    )));
                }
                let (reg, local_offset) = regs.resolve(local, len).map_err(Failure::Local)?;
                Ok(orbitte::Request {
                    op: if write { Op::Write } else { Op::Read },
                    local: reg.id,
                    local_offset,
                    len,
                    remote: RemoteTarget::Address {
                        peer: peer.id(),
                        epoch: None,
                        address: remote,
                    },
                    label,
                })
            })
            .collect()
    }

    /// Submits a batch to `session`; when the peer's publications known
    /// here do not hold a remote address, opens the session again once and
    /// retries. A refused batch forgets the session.
    fn submit(
        &self,
        session: &str,
        ops: &[Op5],
        notify: Option<&[u8]>,
    ) -> Result<(Arc<orbitte::Peer>, Vec<RequestId>), Failure> {
        if ops.is_empty() {
            return Err(Failure::Argument(
                "empty batch: give at least one request".into(),
            ));
        }
        let mut peer = self.peer(session)?;
        let mut reopened = false;
        loop {
            let attempt = self.requests(&peer, ops).and_then(|reqs| {
                match notify {
                    None => self.node().engine.submit(&reqs),
                    Some(b) => self
                        .node()
                        .engine
                        .submit_with_notification(&reqs, Payload::new(b)),
                }
                .map_err(Failure::Submit)
            });
            match attempt {
                Ok(ids) => return Ok((peer, ids)),
                Err(Failure::Submit(e)) if !reopened && remote_miss(&e) => {
                    self.forget(session, &peer);
                    peer = self.peer(session)?;
                    reopened = true;
                }
                Err(f) => {
                    if matches!(f, Failure::Submit(_)) {
                        self.forget(session, &peer);
                    }
                    return Err(f);
                }
            }
        }
    }

    /// Submits, waits for every outcome and for drain; a batch that did
    /// not complete forgets the session.
    fn transfer(&self, session: &str, ops: &[Op5], notify: Option<&[u8]>) -> Result<(), Failure> {
        let (peer, ids) = self.submit(session, ops, notify)?;
        self.node().settle(&ids).inspect_err(|f| {
            // A refused notification says nothing about the session.
            if !matches!(f, Failure::Notification(_)) {
                self.forget(session, &peer);
            }
        })
    }
}

/// A sequence of ints, or their packed little-endian u64 bytes (what
/// `numpy.ndarray.tobytes()` gives for dtype `<u8`: no per-item work).
fn u64s(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    if let Ok(b) = obj.cast::<pyo3::types::PyBytes>() {
        let raw = b.as_bytes();
        if raw.len() % 8 != 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{} bytes are not a whole number of u64s",
                raw.len()
            )));
        }
        return Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect());
    }
    obj.extract()
}

/// One direction's batch from Mooncake's three sequences (addresses,
/// peer addresses, lengths); each op's label is its index.
fn batch(
    py: Python<'_>,
    write: bool,
    locals: &Bound<'_, PyAny>,
    remotes: &Bound<'_, PyAny>,
    lengths: &Bound<'_, PyAny>,
) -> PyResult<Vec<Op5>> {
    let (locals, remotes, lengths) = (u64s(locals)?, u64s(remotes)?, u64s(lengths)?);
    if locals.len() != remotes.len() || locals.len() != lengths.len() {
        return Err(raise(
            py,
            Failure::Argument(format!(
                "buffers, peer addresses and lengths differ in length ({}, {}, {})",
                locals.len(),
                remotes.len(),
                lengths.len()
            )),
        ));
    }
    Ok(locals
        .into_iter()
        .zip(remotes)
        .zip(lengths)
        .enumerate()
        .map(|(i, ((l, r), n))| (write, l, r, n, i as u64))
        .collect())
}

#[pymethods]
impl MooncakeEngine {
    #[classattr]
    const ERR_INVALID_ARGUMENT: i32 = -1;
    /// A notification the target refused: it holds as many unread
    /// notifications from this engine as it keeps (its application must
    /// read them with `get_notifies`); every byte moved.
    #[classattr]
    const ERR_TOO_MANY_REQUESTS: i32 = -2;
    #[classattr]
    const ERR_ADDRESS_NOT_REGISTERED: i32 = -3;
    #[classattr]
    const ERR_DEVICE_NOT_FOUND: i32 = -6;
    #[classattr]
    const ERR_ADDRESS_OVERLAPPED: i32 = -7;
    #[classattr]
    const ERR_SOCKET_FAIL: i32 = -102;
    #[classattr]
    const ERR_REJECT_HANDSHAKE: i32 = -104;
    #[classattr]
    const ERR_METADATA: i32 = -200;

    /// `metadata`: None (peer-to-peer) or an etcd URL; `rdma`: register
    /// with Host Direct, refused (ERR_DEVICE_NOT_FOUND) on a host that
    /// lists no RDMA device.
    #[new]
    #[pyo3(signature = (source_id, metadata=None, rdma=false, devices=Vec::new(), path="auto", request_timeout=10.0, cluster_secret_file=None))]
    fn new(
        py: Python<'_>,
        source_id: String,
        metadata: Option<String>,
        rdma: bool,
        devices: Vec<String>,
        path: &str,
        request_timeout: f64,
        cluster_secret_file: Option<String>,
    ) -> PyResult<Self> {
        let secret_file = cluster_secret_file;
        let invalid = |e: PyErr| coded(e, Self::ERR_INVALID_ARGUMENT);
        let settings = Settings {
            source_id,
            rdma,
            devices,
            path: path.to_owned(),
            rails: 1,
            request_timeout: secs(request_timeout, "request_timeout").map_err(invalid)?,
            handshake_timeout: std::time::Duration::from_secs(5),
            metadata,
            secret_file,
            listener_token: false,
        };
        let node = py.detach(move || Node::build(settings)).map_err(|e| {
            let code = match e {
                BuildFailure::Metadata(_) => Self::ERR_METADATA,
                BuildFailure::Path(_) | BuildFailure::Engine(_) => Self::ERR_INVALID_ARGUMENT,
            };
            coded(errors::ConfigError::new_err(e.to_string()), code)
        })?;
        if rdma && py.detach(|| node.engine.topology().listed.is_empty()) {
            return Err(coded(
                errors::ConfigError::new_err(
                    "protocol 'rdma': this host lists no RDMA device; use protocol 'tcp' or install rdma-core and load the RDMA drivers (orbitte.doctor() says more)",
                ),
                Self::ERR_DEVICE_NOT_FOUND,
            ));
        }
        Ok(Self {
            local: Arc::new(Local::new(node)),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// RDMA devices the provider lists (before any is initialized).
    fn rdma_devices(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| self.node().engine.topology().listed)
    }

    /// Serves this engine's registrations on `addr` ("host:port", port 0:
    /// any); returns the port.
    fn listen(&self, py: Python<'_>, addr: &str) -> PyResult<u16> {
        py.detach(|| self.node().listen(addr)).map_err(|e| {
            let code = match e {
                ListenFailure::Address(_) => Self::ERR_INVALID_ARGUMENT,
                ListenFailure::Socket(_) => Self::ERR_SOCKET_FAIL,
            };
            coded(errors::ConfigError::new_err(e.to_string()), code)
        })
    }

    /// What the listener exposes when it admits every peer and is
    /// reachable beyond this host (no cluster secret), with the fix; None
    /// otherwise.
    fn open_listener(&self) -> Option<String> {
        self.node().engine.open_listener()
    }

    /// The port the engine serves on, or None before `listen`.
    fn port(&self) -> Option<u16> {
        self.node().engine.listen_addr().map(|a| a.port())
    }

    /// Registers `length` bytes at `address`, which must stay allocated
    /// until `unregister` (as with Mooncake). Host memory mapped
    /// read-write here is registered as host memory (copies of it go
    /// through the kernel, so memory unmapped before then fails its
    /// transfers) and published when `remote`; otherwise a CUDA device
    /// pointer is registered on the cuda-staging path (its transfers are
    /// staged through host memory) and, when `remote`, published: peers
    /// READ and WRITE it over tcp, this engine's target copying through
    /// host memory.
    /// Anything else is refused with both reasons. Returns None for host
    /// memory, the report of the staged registration for device memory.
    #[pyo3(signature = (address, length, remote=true))]
    fn register(
        &self,
        py: Python<'_>,
        address: u64,
        length: u64,
        remote: bool,
    ) -> PyResult<Option<String>> {
        let memory = recognise(py, address, length)
            .map_err(|e| register_failed(RegisterFailure::from(e)))?;
        match memory {
            Recognised::Host(memory) => py
                .detach(|| self.local.register(address, memory, remote))
                .map(|_| None),
            Recognised::Device(buffer) => {
                let report = crate::gpu::describe(&buffer, remote);
                py.detach(|| self.local.register_device(address, buffer, remote))
                    .map(|_| Some(report))
            }
        }
        .map_err(register_failed)
    }

    /// Registers an [`Allocation`] (memfd memory: same-host peers can map
    /// it, so the local path applies).
    #[pyo3(signature = (allocation, remote=true))]
    fn register_allocation(
        &self,
        py: Python<'_>,
        allocation: &Allocation,
        remote: bool,
    ) -> PyResult<()> {
        let memory = allocation.memory.clone();
        let start = memory.as_ptr() as u64;
        py.detach(|| self.local.register(start, memory, remote))
            .map(drop)
            .map_err(register_failed)
    }

    /// Every local registration: (address, length).
    fn registrations(&self, py: Python<'_>) -> Vec<(u64, u64)> {
        py.detach(|| self.local.ranges())
    }

    /// Removes the registration that starts at `address`. Refused while
    /// requests on it are undrained.
    fn unregister(&self, py: Python<'_>, address: u64) -> PyResult<()> {
        py.detach(|| self.local.unregister(address))
            .map_err(unregister_failed)
    }

    /// Copies `data` into registered local memory at `address`. The range
    /// must lie inside one registration; memory unmapped since it was
    /// registered raises an `Error` that names it (no crash).
    fn write_local(&self, py: Python<'_>, address: u64, data: Vec<u8>) -> PyResult<()> {
        let (memory, offset) = self.local_memory(address, data.len() as u64)?;
        py.detach(|| memory.write_at(offset, &data)).map_err(|e| {
            coded(
                errors::Error::new_err(e.to_string()),
                Self::ERR_INVALID_ARGUMENT,
            )
        })
    }

    /// Copies `length` bytes of registered local memory at `address` out
    /// (errors as for `write_local`).
    fn read_local<'py>(
        &self,
        py: Python<'py>,
        address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let (memory, offset) = self.local_memory(address, length as u64)?;
        let bytes = py.detach(|| memory.to_vec(offset, length)).map_err(|e| {
            coded(
                errors::Error::new_err(e.to_string()),
                Self::ERR_INVALID_ARGUMENT,
            )
        })?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Opens the peer at `session` now, with a handshake (also when it is
    /// cached: a dead target is an error, not a cached handle), caches it
    /// and returns its handle.
    fn connect(&self, py: Python<'_>, session: &str) -> PyResult<Peer> {
        py.detach(|| self.reconnect(session))
            .map(|p| Peer::new((*p).clone(), session.to_owned()))
            .map_err(|f| raise(py, f))
    }

    /// Submits one direction's batch to `session`, waits for every outcome
    /// and for drain (GIL released). With `notify`, the peer receives those
    /// bytes once, after every byte is placed. Raises TransferError (with
    /// `outcomes`) unless every byte arrived.
    #[pyo3(signature = (session, write, locals, remotes, lengths, notify=None))]
    fn transfer_batch(
        &self,
        py: Python<'_>,
        session: &str,
        write: bool,
        locals: &Bound<'_, PyAny>,
        remotes: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let ops = batch(py, write, locals, remotes, lengths)?;
        py.detach(|| self.transfer(session, &ops, notify.as_deref()))
            .map_err(|f| raise(py, f))
    }

    /// Submits one direction's batch to `session` without waiting; returns
    /// a `Handle` per request.
    fn submit_batch(
        &self,
        py: Python<'_>,
        session: &str,
        write: bool,
        locals: &Bound<'_, PyAny>,
        remotes: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Handle>> {
        let ops = batch(py, write, locals, remotes, lengths)?;
        let (_, ids) = py
            .detach(|| self.submit(session, &ops, None))
            .map_err(|f| raise(py, f))?;
        Ok(ids
            .into_iter()
            .map(|id| Handle::new(self.node().clone(), id))
            .collect())
    }

    /// Repeats one batch (as `transfer_batch`) for `seconds` in a Rust
    /// loop with the GIL released: the engine's own rate for the blocks a
    /// Python loop moves, measured in the same process. Returns (batches
    /// done, seconds taken).
    fn repeat_batch(
        &self,
        py: Python<'_>,
        session: &str,
        write: bool,
        locals: &Bound<'_, PyAny>,
        remotes: &Bound<'_, PyAny>,
        lengths: &Bound<'_, PyAny>,
        seconds: f64,
    ) -> PyResult<(u64, f64)> {
        let span = secs(seconds, "seconds").map_err(|e| coded(e, Self::ERR_INVALID_ARGUMENT))?;
        let ops = batch(py, write, locals, remotes, lengths)?;
        py.detach(|| {
            let start = std::time::Instant::now();
            let mut done = 0u64;
            while start.elapsed() < span {
                self.transfer(session, &ops, None)?;
                done += 1;
            }
            Ok((done, start.elapsed().as_secs_f64()))
        })
        .map_err(|f| raise(py, f))
    }

    /// Every notification received so far, oldest first (never blocks).
    fn notifications(&self, py: Python<'_>) -> Vec<Notification> {
        py.detach(|| self.node().engine.notifications())
            .into_iter()
            .map(Notification::from)
            .collect()
    }

    /// Forgets every session, stops serving, fences the engine, waits for
    /// drain.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        py.detach(|| {
            lock(&self.peers).clear();
            self.node().close(t)
        })
    }
}

impl MooncakeEngine {
    /// The registered memory holding `address..address+len`, and the
    /// offset of `address` in it.
    fn local_memory(&self, address: u64, len: u64) -> PyResult<(Arc<orbitte::HostMemory>, usize)> {
        let regs = self.local.regs();
        let miss = |m: LocalMiss| {
            coded(
                errors::Error::new_err(m.to_string()),
                Self::ERR_ADDRESS_NOT_REGISTERED,
            )
        };
        let (range, offset) = regs.resolve(address, len).map_err(miss)?;
        match &range.memory {
            // Lossless: the offset is below the registration's length, a usize.
            RangeMemory::Host(memory) => Ok((memory.clone(), offset as usize)),
            RangeMemory::Device(buffer) => Err(coded(
                errors::Error::new_err(format!(
                    "local address {address:#x} is in CUDA device memory (device {}), which is {}: copy it with CUDA (cudaMemcpy, a tensor's copy_) instead",
                    buffer.device().index(),
                    crate::gpu::STAGED
                )),
                Self::ERR_INVALID_ARGUMENT,
            )),
        }
    }
}
