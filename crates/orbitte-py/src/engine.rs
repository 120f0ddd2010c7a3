//! `NativeEngine`: one OrbitTE engine for Python.
//!
//! The engine serves its registrations to peers (a session listener: tcp,
//! and local to same-host peers) and opens peers by session id
//! ("host:port"), lazily and once per session id. Local memory is named by
//! address ([`crate::memory`]), remote memory by the target's address
//! ([`crate::remote`]). Every call that can block releases the GIL.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use orbitte::session::PathPreference;
use orbitte::{
    Access, ConnectError, ConnectOptions, DrainStatus, EngineBuilder, Outcome, PathKind,
    RdmaConfig, RegistrationId, RequestId, SubmitError, TransferEngine, TransferRequest, WaitError,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;
use crate::memory::{Allocation, LocalMiss, LocalRange, LocalTable, wrap_raw};
use crate::outcome::PyOutcome;
use crate::remote::{RemoteMiss, RemotePeer, ranges_of};

/// Mooncake's return codes (its `error.h`), carried as the `code`
/// attribute of the exceptions so the Mooncake layer returns the same ints.
const ERR_INVALID_ARGUMENT: i32 = -1;
const ERR_ADDRESS_NOT_REGISTERED: i32 = -3;
const ERR_DEVICE_NOT_FOUND: i32 = -6;
const ERR_ADDRESS_OVERLAPPED: i32 = -7;
const ERR_SOCKET_FAIL: i32 = -102;
const ERR_REJECT_HANDSHAKE: i32 = -104;
const ERR_TRANSFER_FAILED: i32 = -1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the engine serves and how it opens peers.
struct Inner {
    engine: TransferEngine,
    /// Register with Host Direct (MRs on every usable NIC) rather than for
    /// the tcp and local paths only.
    host_direct: bool,
    prefer: PathPreference,
    rails: usize,
    /// Longer than the request timeout: every request has an outcome by then.
    wait_timeout: Duration,
    drain_timeout: Duration,
    locals: RwLock<LocalTable>,
    /// One slot per session id; a slot's lock is held while it connects,
    /// so a session connects once however many threads ask.
    peers: Mutex<HashMap<String, PeerSlot>>,
}

/// The cached peer of one session id (None until opened, or after it was
/// forgotten).
type PeerSlot = Arc<Mutex<Option<Arc<RemotePeer>>>>;

/// Why a transfer did not complete, before it became a Python exception.
#[derive(Debug)]
enum Failure {
    Argument(String),
    Local(LocalMiss),
    Remote(RemoteMiss),
    Connect { code: i32, message: String },
    Submit(SubmitError),
    Incomplete(Vec<Outcome>),
}

impl Failure {
    fn into_py(self, py: Python<'_>) -> PyErr {
        let (err, code, outcomes) = match self {
            Self::Argument(m) => (errors::SubmitError::new_err(m), ERR_INVALID_ARGUMENT, None),
            Self::Local(m) => (
                errors::SubmitError::new_err(m.to_string()),
                ERR_ADDRESS_NOT_REGISTERED,
                None,
            ),
            Self::Remote(m) => (
                errors::SubmitError::new_err(m.to_string()),
                ERR_ADDRESS_NOT_REGISTERED,
                None,
            ),
            Self::Connect { code, message } => (errors::ConnectError::new_err(message), code, None),
            Self::Submit(e) => (
                errors::SubmitError::new_err(e.to_string()),
                ERR_INVALID_ARGUMENT,
                None,
            ),
            Self::Incomplete(outcomes) => {
                let failed: Vec<PyOutcome> = outcomes.iter().map(PyOutcome::from).collect();
                let first = failed
                    .iter()
                    .find(|o| !o.is_complete())
                    .map(PyOutcome::summary)
                    .unwrap_or_default();
                let n = failed.iter().filter(|o| !o.is_complete()).count();
                let msg = format!(
                    "{n} of {} request(s) did not complete; first: {first}",
                    failed.len()
                );
                (
                    errors::TransferError::new_err(msg),
                    ERR_TRANSFER_FAILED,
                    Some(failed),
                )
            }
        };
        let v = err.value(py);
        let _ = v.setattr("code", code);
        if let Some(o) = outcomes {
            let _ = v.setattr("outcomes", o);
        }
        err
    }
}

fn resolve_addr(session: &str) -> Result<SocketAddr, Failure> {
    let bad = |why: String| Failure::Connect {
        code: ERR_INVALID_ARGUMENT,
        message: format!(
            "session id {session:?}: {why}; write it as \"host:port\" (port from the target's get_rpc_port())"
        ),
    };
    let mut addrs = session.to_socket_addrs().map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("resolves to no address".into()))
}

impl Inner {
    /// The peer behind `session`, opened on first use and cached.
    fn peer(&self, session: &str) -> Result<Arc<RemotePeer>, Failure> {
        let slot = lock(&self.peers)
            .entry(session.to_owned())
            .or_default()
            .clone();
        let mut g = lock(&slot);
        if let Some(p) = &*g {
            return Ok(p.clone());
        }
        let p = Arc::new(self.open(session)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Forgets the cached peer of `session` if it is still `stale`, so the
    /// next use opens it again (a restarted target, a dead session).
    fn forget(&self, session: &str, stale: &Arc<RemotePeer>) {
        let slot = lock(&self.peers).get(session).cloned();
        if let Some(slot) = slot {
            let mut g = lock(&slot);
            if g.as_ref().is_some_and(|p| Arc::ptr_eq(p, stale)) {
                *g = None;
            }
        }
    }

    fn open(&self, session: &str) -> Result<RemotePeer, Failure> {
        let addr = resolve_addr(session)?;
        let options = ConnectOptions {
            prefer: self.prefer,
            rails: self.rails,
        };
        let net = self
            .engine
            .connect_with(addr, options)
            .map_err(|e| Failure::Connect {
                code: match e {
                    ConnectError::Session(_) => ERR_SOCKET_FAIL,
                    _ => ERR_REJECT_HANDSHAKE,
                },
                message: format!("cannot open {session}: {e}"),
            })?;
        // Each range with its address in its owner (p2p metadata).
        let ranges = ranges_of(net.ranges());
        Ok(RemotePeer {
            id: net.info.id,
            source_id: net.info.source_id,
            epoch: net.info.epoch,
            path: net.path,
            fell_back: net.fell_back,
            ranges,
        })
    }

    fn requests(
        &self,
        peer: &RemotePeer,
        ops: &[(bool, u64, u64, u64, u64)],
    ) -> Result<Vec<TransferRequest>, Failure> {
        let locals = self.locals.read().unwrap_or_else(PoisonError::into_inner);
        ops.iter()
            .map(|&(write, local, remote, len, label)| {
                if len == 0 {
                    return Err(Failure::Argument(format!(
                        "zero-length request at local {local:#x}: every length must be at least 1"
                    )));
                }
                let (reg, loff): (&LocalRange, u64) =
                    locals.resolve(local, len).map_err(Failure::Local)?;
                let (range, roff) = peer.resolve(remote, len).map_err(Failure::Remote)?;
                let r = if write {
                    TransferRequest::write(reg.id, loff, peer.id, range, roff, len)
                } else {
                    TransferRequest::read(reg.id, loff, peer.id, range, roff, len)
                };
                Ok(r.label(label))
            })
            .collect()
    }

    /// Submits a batch to `session`; resolves addresses against a fresh
    /// publication once when the cached one does not know them.
    fn submit(
        &self,
        session: &str,
        ops: &[(bool, u64, u64, u64, u64)],
    ) -> Result<(Arc<RemotePeer>, Vec<RequestId>), Failure> {
        if ops.is_empty() {
            return Err(Failure::Argument(
                "empty batch: give at least one request".into(),
            ));
        }
        let mut peer = self.peer(session)?;
        let mut refreshed = false;
        loop {
            let stale = |f: &Failure| {
                matches!(f, Failure::Remote(_))
                    || matches!(f, Failure::Submit(SubmitError::Invalid { .. }))
            };
            let attempt = self
                .requests(&peer, ops)
                .and_then(|reqs| self.engine.submit(&reqs).map_err(Failure::Submit));
            match attempt {
                Ok(ids) => return Ok((peer, ids)),
                Err(f) if !refreshed && stale(&f) => {
                    self.forget(session, &peer);
                    peer = self.peer(session)?;
                    refreshed = true;
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

    /// Submits, waits for every outcome and for drain: the call returns when
    /// the local buffers are the caller's again.
    fn transfer(&self, session: &str, ops: &[(bool, u64, u64, u64, u64)]) -> Result<(), Failure> {
        let (peer, ids) = self.submit(session, ops)?;
        let mut outcomes = Vec::with_capacity(ids.len());
        let mut complete = true;
        for id in &ids {
            let o = match self.engine.wait(*id, self.wait_timeout) {
                Ok(o) => o,
                Err(WaitError::TimedOut(_)) => {
                    self.engine.cancel(*id);
                    match self.engine.wait(*id, self.wait_timeout) {
                        Ok(o) => o,
                        Err(e) => return Err(Failure::Argument(e.to_string())),
                    }
                }
                Err(e) => return Err(Failure::Argument(e.to_string())),
            };
            complete &= o.is_complete();
            outcomes.push(o);
        }
        for (id, o) in ids.iter().zip(outcomes.iter_mut()) {
            if o.drain != DrainStatus::Drained {
                let _ = self.engine.wait_drain(*id, self.drain_timeout);
                o.drain = self.engine.drain_status(*id);
            }
        }
        if complete {
            return Ok(());
        }
        self.forget(session, &peer);
        Err(Failure::Incomplete(outcomes))
    }

    fn register(
        &self,
        start: u64,
        memory: Arc<orbitte::HostMemory>,
        remote: bool,
    ) -> PyResult<u64> {
        let len = memory.len() as u64;
        let mut locals = self.locals.write().unwrap_or_else(PoisonError::into_inner);
        if let Some((s, l)) = locals.overlapping(start, len) {
            return Err(coded(
                errors::RegisterError::new_err(format!(
                    "{start:#x}+{len} overlaps the registered range {s:#x}+{l}: unregister it first or register a disjoint buffer"
                )),
                ERR_ADDRESS_OVERLAPPED,
            ));
        }
        let access = if remote {
            Access::REMOTE_READ_WRITE
        } else {
            Access::LocalOnly
        };
        let reg = if self.host_direct {
            self.engine.register_host(memory.clone(), access)
        } else {
            self.engine
                .register_host_without_rdma(memory.clone(), access)
        };
        let reg = reg.map_err(|e| {
            let code = match e {
                orbitte::RegisterError::NoUsableNic { .. } => ERR_DEVICE_NOT_FOUND,
                _ => ERR_INVALID_ARGUMENT,
            };
            coded(errors::RegisterError::new_err(e.to_string()), code)
        })?;
        locals.insert(
            start,
            LocalRange {
                id: reg.id,
                len,
                _memory: memory,
            },
        );
        Ok(reg.id.0)
    }
}

/// Sets the exception's `code` attribute (Mooncake's return code).
fn coded(err: PyErr, code: i32) -> PyErr {
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", code);
    });
    err
}

fn secs(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds, got {s}"
        ))
    })
}

/// One OrbitTE engine (source owner) with the tcp and local paths attached.
#[pyclass(module = "orbitte._orbitte", frozen)]
pub(crate) struct NativeEngine {
    inner: Arc<Inner>,
}

#[pymethods]
impl NativeEngine {
    /// `source_id`: unique name of this engine; `rdma`: register memory with
    /// Host Direct (MRs on every usable NIC, no silent fallback);
    /// `devices`: RDMA device whitelist; `path`: "auto" (local > rdma >
    /// tcp), "tcp", "local" or "rdma"; `rails`: connections per peer.
    #[new]
    #[pyo3(signature = (source_id, rdma=false, devices=Vec::new(), path="auto", rails=1, request_timeout=10.0, handshake_timeout=5.0))]
    fn new(
        py: Python<'_>,
        source_id: String,
        rdma: bool,
        devices: Vec<String>,
        path: &str,
        rails: usize,
        request_timeout: f64,
        handshake_timeout: f64,
    ) -> PyResult<Self> {
        let prefer = match path {
            "auto" => PathPreference::Auto,
            "tcp" => PathPreference::Only(PathKind::Tcp),
            "local" => PathPreference::Only(PathKind::Local),
            "rdma" => PathPreference::Only(PathKind::Rdma),
            other => {
                return Err(errors::ConfigError::new_err(format!(
                    "path {other:?}: use \"auto\", \"tcp\", \"local\" or \"rdma\""
                )));
            }
        };
        let request_timeout = secs(request_timeout, "request_timeout")?;
        let handshake_timeout = secs(handshake_timeout, "handshake_timeout")?;
        let drain_timeout = Duration::from_secs(5);
        let cfg = RdmaConfig {
            whitelist: devices,
            ..RdmaConfig::default()
        };
        let engine = py
            .detach(|| {
                EngineBuilder::new(source_id)
                    .rdma(cfg)
                    .request_timeout(request_timeout)
                    .drain_timeout(drain_timeout)
                    .handshake_timeout(handshake_timeout)
                    .build()
            })
            .map_err(|e| errors::ConfigError::new_err(e.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                host_direct: rdma,
                prefer,
                rails: rails.max(1),
                wait_timeout: request_timeout + drain_timeout + Duration::from_secs(5),
                drain_timeout,
                locals: RwLock::new(LocalTable::default()),
                peers: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// This engine's source id.
    #[getter]
    fn source_id(&self) -> String {
        self.inner.engine.source_id().to_owned()
    }

    /// This engine's authoritative epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.inner.engine.epoch()
    }

    /// RDMA devices the provider lists (before any is initialized).
    fn rdma_devices(&self) -> Vec<String> {
        self.inner.engine.topology().listed
    }

    /// Serves this engine's registrations on `addr` ("host:port", port 0:
    /// any); returns the port. Same-host peers also get the local path.
    fn listen(&self, py: Python<'_>, addr: &str) -> PyResult<u16> {
        let at = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                coded(
                    errors::ConfigError::new_err(format!(
                        "listen address {addr:?} does not resolve: write \"host:port\" (port 0: any)"
                    )),
                    ERR_INVALID_ARGUMENT,
                )
            })?;
        let inner = self.inner.clone();
        py.detach(move || {
            let bound = inner.engine.listen(at).map_err(|e| e.to_string())?;
            Ok::<u16, String>(bound.port())
        })
        .map_err(|m| coded(errors::ConfigError::new_err(m), ERR_SOCKET_FAIL))
    }

    /// The port the engine serves on, or None before `listen`.
    fn port(&self) -> Option<u16> {
        self.inner.engine.listen_addr().map(|a| a.port())
    }

    /// Registers caller memory `address..address+length`; `keepalive` is
    /// kept until the registration is removed and drained. Returns the
    /// registration id.
    #[pyo3(signature = (address, length, keepalive, remote=true))]
    fn register(
        &self,
        py: Python<'_>,
        address: u64,
        length: u64,
        keepalive: Py<PyAny>,
        remote: bool,
    ) -> PyResult<u64> {
        let memory = wrap_raw(address, length, keepalive).map_err(|e| {
            coded(
                errors::RegisterError::new_err(e.to_string()),
                ERR_INVALID_ARGUMENT,
            )
        })?;
        let inner = self.inner.clone();
        py.detach(move || inner.register(address, memory, remote))
    }

    /// Registers an [`Allocation`] (memfd memory: same-host peers can map
    /// it, so the local path applies). Returns the registration id.
    #[pyo3(signature = (allocation, remote=true))]
    fn register_allocation(
        &self,
        py: Python<'_>,
        allocation: &Allocation,
        remote: bool,
    ) -> PyResult<u64> {
        let memory = allocation.memory.clone();
        let start = memory.as_ptr() as u64;
        let inner = self.inner.clone();
        py.detach(move || inner.register(start, memory, remote))
    }

    /// Removes the registration that starts at `address`. Refused while
    /// requests on it are undrained.
    fn unregister(&self, py: Python<'_>, address: u64) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || {
            let mut locals = inner.locals.write().unwrap_or_else(PoisonError::into_inner);
            let Some(r) = locals.starting_at(address) else {
                return Err(coded(
                    errors::UnregisterError::new_err(format!(
                        "no registration starts at {address:#x}: pass the address given to register"
                    )),
                    ERR_ADDRESS_NOT_REGISTERED,
                ));
            };
            let id: RegistrationId = r.id;
            inner.engine.unregister(id).map_err(|e| {
                coded(
                    errors::UnregisterError::new_err(e.to_string()),
                    ERR_INVALID_ARGUMENT,
                )
            })?;
            locals.remove(address);
            Ok(())
        })
    }

    /// Every local registration: (address, length).
    fn registrations(&self) -> Vec<(u64, u64)> {
        self.inner
            .locals
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .ranges()
    }

    /// Opens the peer at `session` ("host:port") now (it is also opened
    /// on first use) and describes it.
    fn connect<'py>(&self, py: Python<'py>, session: &str) -> PyResult<Bound<'py, PyDict>> {
        let inner = self.inner.clone();
        let s = session.to_owned();
        let p = py
            .detach(move || inner.peer(&s))
            .map_err(|f| f.into_py(py))?;
        peer_dict(py, session, &p)
    }

    /// Forgets the cached peer of `session` (the next use opens it again).
    fn disconnect(&self, session: &str) {
        let slot = lock(&self.inner.peers).remove(session);
        drop(slot);
    }

    /// Submits a batch to `session` without waiting: each op is
    /// `(write, local_address, remote_address, length, label)`. All are
    /// admitted or none. Returns the request ids.
    fn submit(
        &self,
        py: Python<'_>,
        session: &str,
        ops: Vec<(bool, u64, u64, u64, u64)>,
    ) -> PyResult<Vec<u64>> {
        let inner = self.inner.clone();
        let s = session.to_owned();
        py.detach(move || inner.submit(&s, &ops))
            .map(|(_, ids)| ids.into_iter().map(|i| i.0).collect())
            .map_err(|f| f.into_py(py))
    }

    /// Submits and waits for every outcome and for drain (GIL released).
    /// Raises TransferError (with `outcomes`) unless every byte arrived.
    fn transfer(
        &self,
        py: Python<'_>,
        session: &str,
        ops: Vec<(bool, u64, u64, u64, u64)>,
    ) -> PyResult<()> {
        let inner = self.inner.clone();
        let s = session.to_owned();
        py.detach(move || inner.transfer(&s, &ops))
            .map_err(|f| f.into_py(py))
    }

    /// Same as `transfer` for one direction, with the addresses and lengths
    /// as three sequences (Mooncake's batch calls).
    fn transfer_batch(
        &self,
        py: Python<'_>,
        session: &str,
        write: bool,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<()> {
        if locals.len() != remotes.len() || locals.len() != lengths.len() {
            return Err(Failure::Argument(format!(
                "buffers, peer addresses and lengths differ in length ({}, {}, {})",
                locals.len(),
                remotes.len(),
                lengths.len()
            ))
            .into_py(py));
        }
        let ops: Vec<_> = locals
            .into_iter()
            .zip(remotes)
            .zip(lengths)
            .enumerate()
            .map(|(i, ((l, r), n))| (write, l, r, n, i as u64))
            .collect();
        self.transfer(py, session, ops)
    }

    /// The outcome of request `id` if it has one (taken: a second call
    /// returns None).
    fn poll(&self, id: u64) -> Option<PyOutcome> {
        self.inner
            .engine
            .poll(RequestId(id))
            .as_ref()
            .map(PyOutcome::from)
    }

    /// Waits up to `timeout` seconds for the outcome of request `id`.
    fn wait(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<PyOutcome> {
        let t = secs(timeout, "timeout")?;
        let inner = self.inner.clone();
        match py.detach(move || inner.engine.wait(RequestId(id), t)) {
            Ok(o) => Ok(PyOutcome::from(&o)),
            Err(e @ WaitError::TimedOut(_)) => Err(errors::WaitTimeout::new_err(e.to_string())),
            Err(e) => Err(errors::Error::new_err(e.to_string())),
        }
    }

    /// Waits up to `timeout` seconds until request `id` is drained (its
    /// local bytes are the caller's again).
    fn wait_drain(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        let inner = self.inner.clone();
        py.detach(move || inner.engine.wait_drain(RequestId(id), t))
            .map_err(|e| errors::DrainTimeout::new_err(e.to_string()))
    }

    /// ("drained", 0) or ("pending", outstanding slices).
    fn drain_status(&self, id: u64) -> (&'static str, u32) {
        match self.inner.engine.drain_status(RequestId(id)) {
            DrainStatus::Drained => ("drained", 0),
            DrainStatus::Pending { slices } => ("pending", slices),
        }
    }

    /// Logical cancel: the outcome says "cancelled"; DMA may still run
    /// until drained. False if the request already had its outcome.
    fn cancel(&self, id: u64) -> bool {
        self.inner.engine.cancel(RequestId(id))
    }

    /// Stops serving, fences the engine, waits for drain and destroys
    /// native objects.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        let inner = self.inner.clone();
        py.detach(move || {
            lock(&inner.peers).clear();
            inner.engine.shutdown(t).map_err(|u| u.to_string())
        })
        .map_err(errors::Error::new_err)
    }
}

fn peer_dict<'py>(py: Python<'py>, session: &str, p: &RemotePeer) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("session", session)?;
    d.set_item("source_id", &p.source_id)?;
    d.set_item("epoch", p.epoch)?;
    d.set_item("path", p.path.name())?;
    let fell: Vec<(&str, String)> = p
        .fell_back
        .iter()
        .map(|(k, why)| (k.name(), why.clone()))
        .collect();
    d.set_item("fell_back", fell)?;
    let ranges: Vec<(u64, u64)> = p.ranges.iter().map(|r| (r.address, r.length)).collect();
    d.set_item("ranges", ranges)?;
    Ok(d)
}
