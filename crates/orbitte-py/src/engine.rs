//! `NativeEngine`: one OrbitTE engine for Python.
//!
//! The engine serves its registrations to peers (a session listener: tcp,
//! and local to same-host peers) and opens peers by session id
//! ("host:port"), lazily and once per session id. Local memory is named by
//! address ([`crate::memory`]), remote memory by the target's address
//! ([`crate::remote`]). Every call that can block, waiting on the network,
//! a timeout or one of the engine's locks, releases the GIL.

use std::collections::HashMap;
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use orbitte::session::PathPreference;
use orbitte::{
    DrainStatus, EngineBuilder, PathKind, RdmaConfig, ReceivedNotification, RegistrationId,
    RequestId, WaitError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::directory::Directory;
use crate::errors;
use crate::memory::{Allocation, LocalTable, wrap_raw};
use crate::node::{
    ERR_ADDRESS_NOT_REGISTERED, ERR_INVALID_ARGUMENT, ERR_METADATA, ERR_SOCKET_FAIL, Failure, Node,
    coded, lock, secs,
};
use crate::outcome::PyOutcome;
use crate::remote::RemotePeer;

/// One OrbitTE engine (source owner) with the tcp and local paths attached.
#[pyclass(module = "orbitte._orbitte", frozen)]
pub(crate) struct NativeEngine {
    node: Arc<Node>,
}

#[pymethods]
impl NativeEngine {
    /// `source_id`: unique name of this engine; `rdma`: register memory with
    /// Host Direct (MRs on every usable NIC, no silent fallback);
    /// `devices`: RDMA device whitelist; `path`: "auto" (local > rdma >
    /// tcp), "tcp", "local" or "rdma"; `rails`: connections per peer.
    #[new]
    #[pyo3(signature = (source_id, rdma=false, devices=Vec::new(), path="auto", rails=1, request_timeout=10.0, handshake_timeout=5.0, metadata=None))]
    fn new(
        py: Python<'_>,
        source_id: String,
        rdma: bool,
        devices: Vec<String>,
        path: &str,
        rails: usize,
        request_timeout: f64,
        handshake_timeout: f64,
        metadata: Option<&str>,
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
        let directory = match metadata {
            None | Some("p2p") => Directory::P2p,
            Some(url) => {
                let url = url.to_owned();
                py.detach(move || Directory::etcd(&url))
                    .map_err(|m| coded(errors::ConfigError::new_err(m), ERR_METADATA))?
            }
        };
        let cfg = RdmaConfig {
            whitelist: devices,
            ..RdmaConfig::default()
        };
        let engine = py
            .detach(|| {
                let b = EngineBuilder::new(source_id)
                    .rdma(cfg)
                    .request_timeout(request_timeout)
                    .drain_timeout(drain_timeout)
                    .handshake_timeout(handshake_timeout);
                if rdma {
                    b.build()
                } else {
                    b.host_memory_without_rdma().build()
                }
            })
            .map_err(|e| errors::ConfigError::new_err(e.to_string()))?;
        Ok(Self {
            node: Arc::new(Node {
                host_id: engine.host_id().to_owned(),
                engine,
                prefer,
                rails: rails.max(1),
                wait_timeout: request_timeout + drain_timeout + Duration::from_secs(5),
                drain_timeout,
                locals: RwLock::new(LocalTable::default()),
                directory,
                peers: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// This engine's source id.
    #[getter]
    fn source_id(&self) -> String {
        self.node.engine.source_id().to_owned()
    }

    /// This engine's authoritative epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.node.engine.epoch().value()
    }

    /// RDMA devices the provider lists (before any is initialized).
    fn rdma_devices(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| self.node.engine.topology().listed)
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
        let node = self.node.clone();
        py.detach(move || {
            let bound = node.engine.listen(at).map_err(|e| e.to_string())?;
            node.publish()?;
            Ok::<u16, String>(bound.port())
        })
        .map_err(|m| coded(errors::ConfigError::new_err(m), ERR_SOCKET_FAIL))
    }

    /// The port the engine serves on, or None before `listen`.
    fn port(&self) -> Option<u16> {
        self.node.engine.listen_addr().map(|a| a.port())
    }

    /// Registers caller memory `address..address+length`; `keepalive` is
    /// kept until the registration is removed and drained. `kept`: the
    /// keepalive is a buffer export that keeps the range mapped (copied
    /// with memcpy); otherwise copies go through the kernel, so a range the
    /// caller unmaps fails its transfers instead of faulting. Returns the
    /// registration id and the path that serves it ("host_direct": rdma,
    /// tcp and local; "host_without_rdma": tcp and local).
    #[pyo3(signature = (address, length, keepalive, remote=true, kept=false))]
    fn register(
        &self,
        py: Python<'_>,
        address: u64,
        length: u64,
        keepalive: Py<PyAny>,
        remote: bool,
        kept: bool,
    ) -> PyResult<(u64, &'static str)> {
        let memory = wrap_raw(address, length, keepalive, kept).map_err(|e| {
            coded(
                errors::RegisterError::new_err(e.to_string()),
                ERR_INVALID_ARGUMENT,
            )
        })?;
        let node = self.node.clone();
        py.detach(move || node.register(address, memory, remote))
    }

    /// Registers an [`Allocation`] (memfd memory: same-host peers can map
    /// it, so the local path applies). Returns the registration id and the
    /// path that serves it.
    #[pyo3(signature = (allocation, remote=true))]
    fn register_allocation(
        &self,
        py: Python<'_>,
        allocation: &Allocation,
        remote: bool,
    ) -> PyResult<(u64, &'static str)> {
        let memory = allocation.memory.clone();
        let start = memory.as_ptr() as u64;
        let node = self.node.clone();
        py.detach(move || node.register(start, memory, remote))
    }

    /// Removes the registration that starts at `address`. Refused while
    /// requests on it are undrained.
    fn unregister(&self, py: Python<'_>, address: u64) -> PyResult<()> {
        let node = self.node.clone();
        py.detach(move || {
            let mut locals = node.locals.write().unwrap_or_else(PoisonError::into_inner);
            let Some(r) = locals.starting_at(address) else {
                return Err(coded(
                    errors::UnregisterError::new_err(format!(
                        "no registration starts at {address:#x}: pass the address given to register"
                    )),
                    ERR_ADDRESS_NOT_REGISTERED,
                ));
            };
            let id: RegistrationId = r.id;
            node.engine.unregister(id).map_err(|e| {
                coded(
                    errors::UnregisterError::new_err(e.to_string()),
                    ERR_INVALID_ARGUMENT,
                )
            })?;
            locals.remove(address);
            Ok(())
        })
    }

    /// Copies `data` into registered local memory at `address`. The range
    /// must lie inside one registration; memory unmapped since it was
    /// registered raises an `Error` that names it (no crash).
    fn write_local(&self, py: Python<'_>, address: u64, data: Vec<u8>) -> PyResult<()> {
        let (memory, offset) = local_memory(&self.node, address, data.len() as u64)?;
        py.detach(|| memory.write_at(offset, &data))
            .map_err(|e| coded(errors::Error::new_err(e.to_string()), ERR_INVALID_ARGUMENT))
    }

    /// Copies `length` bytes of registered local memory at `address` out
    /// (errors as for `write_local`).
    fn read_local<'py>(
        &self,
        py: Python<'py>,
        address: u64,
        length: usize,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let (memory, offset) = local_memory(&self.node, address, length as u64)?;
        let bytes = py
            .detach(|| memory.to_vec(offset, length))
            .map_err(|e| coded(errors::Error::new_err(e.to_string()), ERR_INVALID_ARGUMENT))?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Every local registration: (address, length).
    fn registrations(&self, py: Python<'_>) -> Vec<(u64, u64)> {
        py.detach(|| {
            self.node
                .locals
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .ranges()
        })
    }

    /// Opens the peer at `session` ("host:port") now, with a handshake
    /// (also when it is open already: a dead target is an error, not a
    /// cached handle), and describes it.
    fn connect<'py>(&self, py: Python<'py>, session: &str) -> PyResult<Bound<'py, PyDict>> {
        let node = self.node.clone();
        let s = session.to_owned();
        let p = py
            .detach(move || node.reconnect(&s))
            .map_err(|f| f.into_py(py))?;
        peer_dict(py, session, &p)
    }

    /// Forgets the cached peer of `session` (the next use opens it again).
    fn disconnect(&self, session: &str) {
        let slot = lock(&self.node.peers).remove(session);
        drop(slot);
    }

    /// Submits a batch to `session` without waiting: each op is
    /// `(write, local_address, remote_address, length, label)`. All are
    /// admitted or none. With `notify`, the peer receives those bytes once,
    /// after every byte of the batch is placed (and only if every request
    /// completes). With `epoch` (the peer handle's), the batch is refused
    /// with PeerRestartedError once the peer runs a newer epoch. Returns
    /// the request ids.
    #[pyo3(signature = (session, ops, notify=None, epoch=None))]
    fn submit(
        &self,
        py: Python<'_>,
        session: &str,
        ops: Vec<(bool, u64, u64, u64, u64)>,
        notify: Option<Vec<u8>>,
        epoch: Option<u64>,
    ) -> PyResult<Vec<u64>> {
        let node = self.node.clone();
        let s = session.to_owned();
        let epoch = handle_epoch(epoch).map_err(|f| f.into_py(py))?;
        py.detach(move || node.submit(&s, epoch, &ops, notify.as_deref()))
            .map(|(_, ids)| ids.into_iter().map(|i| i.0).collect())
            .map_err(|f| f.into_py(py))
    }

    /// Submits and waits for every outcome and for drain (GIL released).
    /// Raises TransferError (with `outcomes`) unless every byte arrived.
    #[pyo3(signature = (session, ops, notify=None, epoch=None))]
    fn transfer(
        &self,
        py: Python<'_>,
        session: &str,
        ops: Vec<(bool, u64, u64, u64, u64)>,
        notify: Option<Vec<u8>>,
        epoch: Option<u64>,
    ) -> PyResult<()> {
        let node = self.node.clone();
        let s = session.to_owned();
        let epoch = handle_epoch(epoch).map_err(|f| f.into_py(py))?;
        py.detach(move || node.transfer(&s, epoch, &ops, notify.as_deref()))
            .map_err(|f| f.into_py(py))
    }

    /// Same as `transfer` for one direction, with the addresses and lengths
    /// as three sequences (Mooncake's batch calls).
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
        let (locals, remotes, lengths) = (u64s(locals)?, u64s(remotes)?, u64s(lengths)?);
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
        self.transfer(py, session, ops, notify, None)
    }

    /// Repeats one batch (as `transfer_batch`) for `seconds` in a Rust
    /// loop with the GIL released: the engine's own rate for the blocks a
    /// Python loop moves, measured in the same process. Returns
    /// (batches done, seconds taken).
    fn repeat_batch(
        &self,
        py: Python<'_>,
        session: &str,
        write: bool,
        locals: Vec<u64>,
        remotes: Vec<u64>,
        lengths: Vec<u64>,
        seconds: f64,
    ) -> PyResult<(u64, f64)> {
        let span = secs(seconds, "seconds")?;
        let ops: Vec<_> = locals
            .into_iter()
            .zip(remotes)
            .zip(lengths)
            .map(|((l, r), n)| (write, l, r, n, 0))
            .collect();
        let node = self.node.clone();
        let s = session.to_owned();
        py.detach(move || {
            let start = std::time::Instant::now();
            let mut done = 0u64;
            while start.elapsed() < span {
                node.transfer(&s, None, &ops, None)?;
                done += 1;
            }
            Ok((done, start.elapsed().as_secs_f64()))
        })
        .map_err(|f: Failure| f.into_py(py))
    }

    /// Every notification received so far, oldest first (never blocks):
    /// `(source_id, epoch, path, payload)` each.
    fn notifications(&self, py: Python<'_>) -> Vec<Received> {
        py.detach(|| self.node.engine.notifications())
            .into_iter()
            .map(received)
            .collect()
    }

    /// The oldest notification, waiting up to `timeout` seconds for one
    /// (GIL released); None when none came.
    fn wait_notification(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Received>> {
        let t = secs(timeout, "timeout")?;
        let node = self.node.clone();
        Ok(py
            .detach(move || node.engine.wait_notification(t))
            .map(received))
    }

    /// The outcome of request `id` if it has one (taken: a second call
    /// returns None).
    fn poll(&self, py: Python<'_>, id: u64) -> Option<PyOutcome> {
        py.detach(|| self.node.engine.poll(RequestId(id)))
            .as_ref()
            .map(PyOutcome::from)
    }

    /// Waits up to `timeout` seconds for the outcome of request `id`.
    fn wait(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<PyOutcome> {
        let t = secs(timeout, "timeout")?;
        let node = self.node.clone();
        match py.detach(move || node.engine.wait(RequestId(id), t)) {
            Ok(o) => Ok(PyOutcome::from(&o)),
            Err(e @ WaitError::TimedOut(_)) => Err(errors::WaitTimeout::new_err(e.to_string())),
            Err(e) => Err(errors::Error::new_err(e.to_string())),
        }
    }

    /// Waits up to `timeout` seconds until request `id` is drained (its
    /// local bytes are the caller's again).
    fn wait_drain(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        let node = self.node.clone();
        py.detach(move || node.engine.wait_drain(RequestId(id), t))
            .map_err(|e| errors::DrainTimeout::new_err(e.to_string()))
    }

    /// ("drained", 0) or ("pending", outstanding slices).
    fn drain_status(&self, py: Python<'_>, id: u64) -> (&'static str, u32) {
        match py.detach(|| self.node.engine.drain_status(RequestId(id))) {
            DrainStatus::Drained => ("drained", 0),
            DrainStatus::Pending { slices } => ("pending", slices),
        }
    }

    /// Logical cancel: the outcome says "cancelled"; DMA may still run
    /// until drained. False if the request already had its outcome.
    fn cancel(&self, py: Python<'_>, id: u64) -> bool {
        py.detach(|| self.node.engine.cancel(RequestId(id)))
    }

    /// Stops serving, fences the engine, waits for drain and destroys
    /// native objects.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        let node = self.node.clone();
        py.detach(move || {
            lock(&node.peers).clear();
            node.engine.shutdown(t).map_err(|u| u.to_string())
        })
        .map_err(errors::Error::new_err)
    }
}

/// A received notification for Python: (source_id, epoch, path, payload).
type Received = (String, u64, &'static str, Vec<u8>);

fn received(n: ReceivedNotification) -> Received {
    (n.source_id, n.epoch.value(), n.path.name(), n.payload)
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

/// The registered memory holding `address..address+len`, and the offset
/// of `address` in it (a miss is `Error` with Mooncake's -3).
fn local_memory(
    node: &Node,
    address: u64,
    len: u64,
) -> PyResult<(Arc<orbitte::HostMemory>, usize)> {
    let locals = node.locals.read().unwrap_or_else(PoisonError::into_inner);
    let miss = |m: crate::memory::LocalMiss| {
        coded(
            errors::Error::new_err(m.to_string()),
            ERR_ADDRESS_NOT_REGISTERED,
        )
    };
    let (range, offset) = locals.resolve(address, len).map_err(miss)?;
    // Lossless: the offset is below the registration's length, a usize.
    Ok((range.memory.clone(), offset as usize))
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

/// A peer handle's epoch as Python passes it (`None`: not bound to one).
fn handle_epoch(epoch: Option<u64>) -> Result<Option<orbitte::Epoch>, Failure> {
    epoch
        .map(|e| {
            orbitte::Epoch::new(e)
                .map_err(|err| Failure::Argument(format!("peer epoch {e}: {err}")))
        })
        .transpose()
}
