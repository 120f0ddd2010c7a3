//! The engine's handles as Python classes, each over its Rust type:
//! [`Registration`] (`orbitte::Registration`), [`Peer`] (`orbitte::Peer`),
//! [`RemoteRange`] (`orbitte::RemoteRange`), [`Request`]
//! (`orbitte::Request`), [`Handle`] (`orbitte::RequestId`, ending in an
//! `Outcome`) and [`Notification`] (`orbitte::ReceivedNotification`).
//!
//! A request names local memory by its registration and an offset, and
//! remote memory by a range the peer published and an offset, as Rust's
//! `Request::write(&reg, bytes).to(&range, offset)` does; the range carries
//! the peer's epoch, so a request made from a handle of an older
//! incarnation is refused at submit (`PeerRestartedError`).

use std::sync::{Arc, Mutex};

use orbitte::{DrainStatus, Op, ReceivedNotification, RemoteTarget, RequestId};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors;
use crate::node::{Failure, Local, Node, lock, secs};
use crate::outcome::PyOutcome;

/// A local registration: `address`, `length`, the `path` that serves it
/// (`staged` and `device` for CUDA device memory); the engine holds the
/// memory (and `keepalive`, its owner) until it is unregistered and
/// drained.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Registration {
    pub(crate) reg: orbitte::Registration,
    /// The first byte's address in this process (a device address for
    /// CUDA memory).
    pub(crate) address: u64,
    /// The CUDA device holding the memory (device memory only).
    device: Option<usize>,
    keepalive: Py<PyAny>,
    engine: Arc<Local>,
}

impl Registration {
    pub(crate) fn new(
        reg: orbitte::Registration,
        address: u64,
        keepalive: Py<PyAny>,
        engine: Arc<Local>,
    ) -> Self {
        Self {
            reg,
            address,
            device: None,
            keepalive,
            engine,
        }
    }

    /// The registration of memory on CUDA device `device`.
    pub(crate) fn on_device(self, device: usize) -> Self {
        Self {
            device: Some(device),
            ..self
        }
    }

    /// Whether `self` was registered with the engine behind `local`.
    pub(crate) fn belongs_to(&self, local: &Arc<Local>) -> bool {
        Arc::ptr_eq(&self.engine, local)
    }
}

#[pymethods]
impl Registration {
    #[getter]
    fn address(&self) -> u64 {
        self.address
    }

    #[getter]
    fn length(&self) -> u64 {
        self.reg.len
    }

    /// The engine's registration id (also the range id peers see).
    #[getter]
    fn id(&self) -> u64 {
        self.reg.id.0
    }

    /// "host_direct" (rdma, tcp and local serve it), "host_without_rdma"
    /// (tcp and local) or "cuda_staging" (CUDA device memory, staged
    /// through host bounce buffers).
    #[getter]
    fn path(&self) -> &'static str {
        match self.reg.path {
            orbitte::MemoryPath::HostDirect => "host_direct",
            orbitte::MemoryPath::HostWithoutRdma => "host_without_rdma",
            orbitte::MemoryPath::CudaStaging => "cuda_staging",
            _ => "other",
        }
    }

    /// Whether its transfers are staged through host memory (CUDA device
    /// memory on the cuda-staging path; no GPU memory goes to a NIC).
    #[getter]
    fn staged(&self) -> bool {
        self.reg.path == orbitte::MemoryPath::CudaStaging
    }

    /// The CUDA device holding the memory, or None for host memory.
    #[getter]
    pub(crate) fn device(&self) -> Option<usize> {
        self.device
    }

    /// How the memory is served, in words.
    #[getter]
    fn report(&self) -> String {
        match self.device {
            Some(device) => format!(
                "{} bytes of CUDA device memory on device {device} at {:#x}, {}{}",
                self.reg.len,
                self.address,
                crate::gpu::STAGED,
                if self.remote() {
                    format!(", {}", crate::gpu::SERVED)
                } else {
                    String::new()
                }
            ),
            None => format!(
                "{} bytes of host memory at {:#x}, path {}",
                self.reg.len,
                self.address,
                self.path()
            ),
        }
    }

    /// Whether peers may READ and WRITE it (registered with `remote=True`).
    #[getter]
    fn remote(&self) -> bool {
        self.reg.access.is_remote()
    }

    /// The object that owns the memory (None for an `(address, length)`).
    #[getter]
    fn keepalive(&self, py: Python<'_>) -> Py<PyAny> {
        self.keepalive.clone_ref(py)
    }

    /// Removes the registration (refused while requests on it are
    /// undrained).
    fn unregister(&self, py: Python<'_>) -> PyResult<()> {
        let (engine, address) = (self.engine.clone(), self.address);
        py.detach(move || engine.unregister(address))
            .map_err(crate::node::UnregisterFailure::into_py)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| self.belongs_to(&o.get().engine) && o.get().reg.id == self.reg.id)
    }

    fn __hash__(&self) -> u64 {
        self.reg.id.0 ^ self.address.rotate_left(17)
    }

    fn __repr__(&self) -> String {
        format!(
            "<orbitte.Registration {} bytes at {:#x} id={} path={}>",
            self.reg.len,
            self.address,
            self.reg.id.0,
            self.path()
        )
    }
}

/// An opened peer: where it is (`session`), who it is (`source_id`,
/// `epoch`), the `path` its requests take, the paths given up on the way
/// with the reason (`fell_back`), and the ranges it published.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) peer: orbitte::Peer,
    session: String,
    /// The published ranges by address.
    ranges: Vec<orbitte::RemoteRange>,
}

impl Peer {
    pub(crate) fn new(peer: orbitte::Peer, session: String) -> Self {
        let mut ranges = peer.ranges().to_vec();
        ranges.sort_unstable_by_key(|r| r.address);
        Self {
            peer,
            session,
            ranges,
        }
    }
}

#[pymethods]
impl Peer {
    /// The session id it was opened by ("host:port", or a name in etcd).
    #[getter]
    fn session(&self) -> &str {
        &self.session
    }

    #[getter]
    fn source_id(&self) -> &str {
        self.peer.source_id()
    }

    /// The incarnation this handle was opened on.
    #[getter]
    fn epoch(&self) -> u64 {
        self.peer.epoch().value()
    }

    /// "tcp", "local" or "rdma".
    #[getter]
    fn path(&self) -> &'static str {
        self.peer.path.name()
    }

    /// Each path that applied but could not be used: (path, reason).
    #[getter]
    fn fell_back(&self) -> Vec<(&'static str, String)> {
        self.peer
            .fell_back
            .iter()
            .map(|(k, why)| (k.name(), why.clone()))
            .collect()
    }

    /// The ranges it published when it was opened, by address.
    #[getter]
    fn ranges(slf: &Bound<'_, Self>) -> Vec<RemoteRange> {
        (0..slf.get().ranges.len())
            .map(|i| RemoteRange::of(slf, i))
            .collect()
    }

    /// The `index`-th published range, by address order.
    #[pyo3(signature = (index=0))]
    fn range(slf: &Bound<'_, Self>, index: usize) -> PyResult<RemoteRange> {
        let p = slf.get();
        if index >= p.ranges.len() {
            return Err(errors::SubmitError::new_err(format!(
                "peer {} published {} range(s); there is no range {index}: pick one of peer.ranges",
                p.peer.source_id(),
                p.ranges.len()
            )));
        }
        Ok(RemoteRange::of(slf, index))
    }

    fn __repr__(&self) -> String {
        format!(
            "<orbitte.Peer {} at {} epoch={} path={} ranges={}>",
            self.peer.source_id(),
            self.session,
            self.epoch(),
            self.path(),
            self.ranges.len()
        )
    }
}

/// One range a peer published: its `address` in the peer and its
/// `length`, for the incarnation (`epoch`) of its `peer`.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct RemoteRange {
    pub(crate) range: orbitte::RemoteRange,
    peer: Py<Peer>,
}

impl RemoteRange {
    fn of(peer: &Bound<'_, Peer>, index: usize) -> Self {
        Self {
            range: peer.get().ranges[index],
            peer: peer.clone().unbind(),
        }
    }

    /// The source id of the peer that published it.
    pub(crate) fn source_id(&self) -> &str {
        self.peer.get().peer.source_id()
    }
}

#[pymethods]
impl RemoteRange {
    /// The peer handle it came from.
    #[getter]
    fn peer(&self, py: Python<'_>) -> Py<Peer> {
        self.peer.clone_ref(py)
    }

    #[getter]
    fn address(&self) -> u64 {
        self.range.address
    }

    #[getter]
    fn length(&self) -> u64 {
        self.range.len
    }

    /// The peer's epoch it was published in.
    #[getter]
    fn epoch(&self) -> u64 {
        self.range.epoch.value()
    }

    /// Its id within the peer's epoch.
    #[getter]
    fn id(&self) -> u64 {
        self.range.range.0
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().range == self.range)
    }

    fn __hash__(&self) -> u64 {
        self.range.address ^ self.range.epoch.value().rotate_left(32) ^ self.range.range.0
    }

    fn __repr__(&self) -> String {
        format!(
            "<orbitte.RemoteRange {} bytes at {:#x} of {} epoch={}>",
            self.range.len,
            self.range.address,
            self.source_id(),
            self.epoch()
        )
    }
}

/// One READ or WRITE: `length` bytes of `local` at `local_offset`, to or
/// from `remote` at `remote_offset`; built with `orbitte.write` or
/// `orbitte.read`.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) request: orbitte::Request,
    pub(crate) local: Py<Registration>,
    pub(crate) remote: Py<RemoteRange>,
}

/// A non-negative count of bytes, or the refusal that names it.
fn bytes(value: i64, what: &str) -> PyResult<u64> {
    u64::try_from(value).map_err(|_| {
        errors::SubmitError::new_err(format!(
            "{what} {value} is negative: offsets and lengths count bytes from 0"
        ))
    })
}

#[pymethods]
impl Request {
    /// `op` is "write" (local to remote) or "read" (remote to local);
    /// `length` None: the rest of `local` from `local_offset`.
    #[new]
    #[pyo3(signature = (op, local, remote, length=None, local_offset=0, remote_offset=0, label=0))]
    fn new(
        op: &str,
        local: &Bound<'_, Registration>,
        remote: &Bound<'_, RemoteRange>,
        length: Option<i64>,
        local_offset: i64,
        remote_offset: i64,
        label: u64,
    ) -> PyResult<Self> {
        let op = match op {
            "write" => Op::Write,
            "read" => Op::Read,
            other => {
                return Err(errors::SubmitError::new_err(format!(
                    "op {other:?}: use \"write\" or \"read\""
                )));
            }
        };
        let local_offset = bytes(local_offset, "local_offset")?;
        let remote_offset = bytes(remote_offset, "remote_offset")?;
        let len = match length {
            Some(n) => bytes(n, "length")?,
            None => local.get().reg.len.saturating_sub(local_offset),
        };
        Ok(Self {
            request: orbitte::Request {
                op,
                local: local.get().reg.id,
                local_offset,
                len,
                remote: RemoteTarget::Range {
                    range: remote.get().range,
                    offset: remote_offset,
                },
                label,
            },
            local: local.clone().unbind(),
            remote: remote.clone().unbind(),
        })
    }

    /// "write" or "read".
    #[getter]
    fn op(&self) -> &'static str {
        match self.request.op {
            Op::Write => "write",
            Op::Read => "read",
        }
    }

    #[getter]
    fn local(&self, py: Python<'_>) -> Py<Registration> {
        self.local.clone_ref(py)
    }

    #[getter]
    fn remote(&self, py: Python<'_>) -> Py<RemoteRange> {
        self.remote.clone_ref(py)
    }

    #[getter]
    fn length(&self) -> u64 {
        self.request.len
    }

    #[getter]
    fn local_offset(&self) -> u64 {
        self.request.local_offset
    }

    #[getter]
    pub(crate) fn remote_offset(&self) -> u64 {
        match self.request.remote {
            RemoteTarget::Range { offset, .. } | RemoteTarget::Ids { offset, .. } => offset,
            RemoteTarget::Address { .. } => 0,
        }
    }

    #[getter]
    fn label(&self) -> u64 {
        self.request.label
    }

    fn __repr__(&self) -> String {
        format!(
            "<orbitte.Request {} {} bytes local+{} remote+{} label={}>",
            self.op(),
            self.request.len,
            self.request.local_offset,
            self.remote_offset(),
            self.request.label
        )
    }
}

/// One submitted request. `poll()` and `wait()` give its `Outcome` (once
/// from the engine; then the same object from the handle);
/// `wait_drain()` waits until its local bytes are the caller's again.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Handle {
    node: Arc<Node>,
    id: RequestId,
    outcome: Mutex<Option<Py<PyOutcome>>>,
}

impl Handle {
    pub(crate) fn new(node: Arc<Node>, id: RequestId) -> Self {
        Self {
            node,
            id,
            outcome: Mutex::new(None),
        }
    }

    fn keep(&self, py: Python<'_>, o: &orbitte::Outcome) -> PyResult<Py<PyOutcome>> {
        let mut g = lock(&self.outcome);
        if let Some(kept) = &*g {
            return Ok(kept.clone_ref(py));
        }
        let o = Py::new(py, PyOutcome::from(o))?;
        *g = Some(o.clone_ref(py));
        Ok(o)
    }

    fn kept(&self, py: Python<'_>) -> Option<Py<PyOutcome>> {
        lock(&self.outcome).as_ref().map(|o| o.clone_ref(py))
    }
}

#[pymethods]
impl Handle {
    /// The engine's request id.
    #[getter]
    fn request(&self) -> u64 {
        self.id.0
    }

    /// The outcome if the request has one, else None (never blocks).
    fn poll(&self, py: Python<'_>) -> PyResult<Option<Py<PyOutcome>>> {
        if let Some(o) = self.kept(py) {
            return Ok(Some(o));
        }
        match py.detach(|| self.node.engine.poll(self.id)) {
            Some(o) => self.keep(py, &o).map(Some),
            None => Ok(None),
        }
    }

    /// The outcome; raises `WaitTimeout` if none within `timeout` seconds
    /// (the request goes on: wait again or cancel).
    #[pyo3(signature = (timeout=30.0))]
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Py<PyOutcome>> {
        if let Some(o) = self.kept(py) {
            return Ok(o);
        }
        let t = secs(timeout, "timeout")?;
        let o = py
            .detach(|| self.node.engine.wait(self.id, t))
            .map_err(|e| Failure::Wait(e).into_py(py))?;
        self.keep(py, &o)
    }

    /// Raises `DrainTimeout` if the request's local bytes are still in use
    /// by the transport after `timeout` seconds.
    #[pyo3(signature = (timeout=30.0))]
    fn wait_drain(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        py.detach(|| self.node.engine.wait_drain(self.id, t))
            .map_err(|e| errors::DrainTimeout::new_err(e.to_string()))
    }

    /// Whether the local bytes are the caller's again.
    #[getter]
    fn drained(&self, py: Python<'_>) -> bool {
        py.detach(|| self.node.engine.drain_status(self.id)) == DrainStatus::Drained
    }

    /// Logical cancel: the outcome says "cancelled"; DMA may still run
    /// until drained. False if the request already had its outcome.
    fn cancel(&self, py: Python<'_>) -> bool {
        py.detach(|| self.node.engine.cancel(self.id))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.kept(py) {
            Some(o) => format!(
                "<orbitte.Handle request={} {}>",
                self.id.0,
                o.get().summary()
            ),
            None => format!("<orbitte.Handle request={} pending>", self.id.0),
        }
    }
}

/// A notification a peer's batch carried: delivered once, after every
/// byte of that batch was placed in this engine's memory.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Notification {
    n: ReceivedNotification,
}

impl From<ReceivedNotification> for Notification {
    fn from(n: ReceivedNotification) -> Self {
        Self { n }
    }
}

#[pymethods]
impl Notification {
    /// The sender's source id.
    #[getter]
    fn source_id(&self) -> &str {
        &self.n.source_id
    }

    /// The sender's epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.n.epoch.value()
    }

    /// The path it came over.
    #[getter]
    fn path(&self) -> &'static str {
        self.n.path.name()
    }

    /// The bytes.
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.n.payload)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Self>().is_ok_and(|o| o.get().n == self.n)
    }

    fn __repr__(&self) -> String {
        format!(
            "<orbitte.Notification from {} epoch={} over {}: {} bytes>",
            self.n.source_id,
            self.n.epoch.value(),
            self.n.path.name(),
            self.n.payload.len()
        )
    }
}
