//! `NativeEngine`: the engine behind `orbitte.Engine`, speaking the
//! engine's handles ([`crate::handles`]): `register` gives a
//! `Registration`, `connect` a `Peer` with its `RemoteRange`s, `submit`
//! takes `Request`s built from those and gives a `Handle` per request.
//! As with Rust's `TransferEngine::submit`, a batch goes to the peer
//! incarnation its ranges were published by, or is refused: nothing is
//! reopened or retried behind the caller. Every call that can block,
//! waiting on the network, a timeout or one of the engine's locks,
//! releases the GIL.

use std::sync::Arc;

use orbitte::{Notification as Payload, RequestError, SubmitError};
use pyo3::prelude::*;

use crate::errors;
use crate::gpu::device_memory;
use crate::handles::{Handle, Notification, Peer, Registration, RemoteRange, Request};
use crate::memory::{Allocation, wrap_raw};
use crate::node::{Failure, Local, Node, RegisterFailure, Settings, UnregisterFailure, secs};

/// One OrbitTE engine (source owner) with the tcp and local paths attached.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct NativeEngine {
    local: Arc<Local>,
}

impl NativeEngine {
    fn node(&self) -> &Arc<Node> {
        &self.local.node
    }

    /// The engine and its registrations by address (what `orbitte.nixl`'s
    /// prepared lists resolve against).
    pub(crate) fn local(&self) -> &Arc<Local> {
        &self.local
    }

    /// The engine requests of a batch for `peer`, each checked against
    /// its handles: a range of another peer is refused, one of another
    /// incarnation of the same peer with `PeerRestartedError`.
    fn requests(
        &self,
        py: Python<'_>,
        peer: &Peer,
        batch: &[PyRef<'_, Request>],
    ) -> PyResult<Vec<orbitte::Request>> {
        if batch.is_empty() {
            return Err(Failure::Submit(SubmitError::Empty).into_py(py));
        }
        batch
            .iter()
            .enumerate()
            .map(|(index, r)| {
                let local = r.local.get();
                if !local.belongs_to(&self.local) {
                    return Err(errors::SubmitError::new_err(format!(
                        "request #{index}: its local registration {:#x} belongs to another engine: register the memory with this one",
                        local.address
                    )));
                }
                let remote = r.remote.get();
                if remote.range.peer != peer.peer.id() {
                    return Err(foreign_range(py, (index, r.request.label), peer, remote));
                }
                let req = r.request;
                let past = |offset: u64, size: u64| offset.checked_add(req.len).is_none_or(|end| end > size);
                if past(req.local_offset, local.reg.len) {
                    return Err(errors::SubmitError::new_err(format!(
                        "request #{index} (label {}): local offset {} + {} bytes runs past the end of its registration ({} bytes at {:#x}): shorten the request or register a larger buffer",
                        req.label, req.local_offset, req.len, local.reg.len, local.address
                    )));
                }
                if past(r.remote_offset(), remote.range.len) {
                    return Err(errors::SubmitError::new_err(format!(
                        "request #{index} (label {}): remote offset {} + {} bytes runs past the end of the range of {} ({} bytes at {:#x}): shorten the request or pick a larger range",
                        req.label, r.remote_offset(), req.len, remote.source_id(), remote.range.len, remote.range.address
                    )));
                }
                Ok(req)
            })
            .collect()
    }

    fn submit_ids(
        &self,
        py: Python<'_>,
        peer: &Peer,
        batch: &[PyRef<'_, Request>],
        notify: Option<Vec<u8>>,
    ) -> PyResult<Vec<orbitte::RequestId>> {
        let reqs = self.requests(py, peer, batch)?;
        let node = self.node().clone();
        py.detach(move || match notify {
            None => node.engine.submit(&reqs),
            Some(b) => node.engine.submit_with_notification(&reqs, Payload::new(b)),
        })
        .map_err(|e| staged_note(py, Failure::Submit(e).into_py(py), batch))
    }
}

/// `err` with its message saying which request of `batch` has CUDA device
/// memory (staged through host memory), if one has.
fn staged_note(py: Python<'_>, err: PyErr, batch: &[PyRef<'_, Request>]) -> PyErr {
    let staged = batch
        .iter()
        .enumerate()
        .find_map(|(i, r)| r.local.get().device().map(|d| (i, d)));
    if let Some((index, device)) = staged {
        crate::gpu::note_staged(py, &err, index, device);
    }
    err
}

/// The refusal of a request whose range is not of `peer`: another
/// incarnation of the same source (`PeerRestartedError`, naming both
/// epochs) or another peer.
fn foreign_range(
    py: Python<'_>,
    (index, label): (usize, u64),
    peer: &Peer,
    remote: &RemoteRange,
) -> PyErr {
    let (range, source_id) = (&remote.range, remote.source_id());
    let epoch = peer.peer.epoch();
    if source_id == peer.peer.source_id() && range.epoch != epoch {
        let (handle, current) = if range.epoch < epoch {
            (range.epoch, epoch)
        } else {
            (epoch, range.epoch)
        };
        let e = SubmitError::Invalid {
            index,
            label,
            error: RequestError::PeerRestarted {
                peer: range.peer,
                handle,
                current,
            },
        };
        return errors::peer_restarted(py, e.to_string(), handle.value(), current.value());
    }
    errors::SubmitError::new_err(format!(
        "request #{index} (label {label}) names a range of peer {source_id} (epoch {}) and the batch is for peer {} (epoch {}): submit it with the Peer its range came from",
        range.epoch.value(),
        peer.peer.source_id(),
        epoch.value()
    ))
}

#[pymethods]
impl NativeEngine {
    /// `source_id`: unique name of this engine; `rdma`: register memory with
    /// Host Direct (MRs on every usable NIC, no silent fallback);
    /// `devices`: RDMA device whitelist; `path`: "auto" (local > rdma >
    /// tcp), "tcp", "local" or "rdma"; `rails`: connections per peer;
    /// `metadata`: None (peer-to-peer) or an etcd URL.
    #[new]
    #[pyo3(signature = (source_id, rdma=false, devices=Vec::new(), path="auto", rails=1, request_timeout=10.0, handshake_timeout=5.0, metadata=None, cluster_secret_file=None, listener_token=false))]
    fn new(
        py: Python<'_>,
        source_id: String,
        rdma: bool,
        devices: Vec<String>,
        path: &str,
        rails: usize,
        request_timeout: f64,
        handshake_timeout: f64,
        metadata: Option<String>,
        cluster_secret_file: Option<String>,
        listener_token: bool,
    ) -> PyResult<Self> {
        let settings = Settings {
            source_id,
            rdma,
            devices,
            path: path.to_owned(),
            rails,
            request_timeout: secs(request_timeout, "request_timeout")?,
            handshake_timeout: secs(handshake_timeout, "handshake_timeout")?,
            metadata,
            secret_file: cluster_secret_file,
            listener_token,
        };
        let node = py
            .detach(move || Node::build(settings))
            .map_err(|e| errors::ConfigError::new_err(e.to_string()))?;
        Ok(Self {
            local: Arc::new(Local::new(node)),
        })
    }

    /// This engine's source id.
    #[getter]
    fn source_id(&self) -> String {
        self.node().engine.source_id().to_owned()
    }

    /// This engine's authoritative epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.node().engine.epoch().value()
    }

    /// RDMA devices the provider lists (before any is initialized).
    fn rdma_devices(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| self.node().engine.topology().listed)
    }

    /// Serves this engine's registrations on `addr` ("host:port", port 0:
    /// any); returns the port. Same-host peers also get the local path.
    fn listen(&self, py: Python<'_>, addr: &str) -> PyResult<u16> {
        py.detach(|| self.node().listen(addr))
            .map_err(|e| errors::ConfigError::new_err(e.to_string()))
    }

    /// The listener token peers must connect with (64 hexadecimal
    /// digits), or None when the engine was built without one.
    #[getter]
    fn token(&self) -> Option<String> {
        self.node().token.map(|t| t.to_hex())
    }

    /// What the listener exposes when it admits every peer and is
    /// reachable beyond this host (no cluster secret, no token), with the
    /// fix; None otherwise.
    fn open_listener(&self) -> Option<String> {
        self.node().engine.open_listener()
    }

    /// The port the engine serves on, or None before `listen`.
    fn port(&self) -> Option<u16> {
        self.node().engine.listen_addr().map(|a| a.port())
    }

    /// Registers caller memory `address..address+length`; `keepalive` (the
    /// memory's owner) is kept until the registration is removed and
    /// drained. `kept`: the keepalive is a buffer export that keeps the
    /// range mapped (copied with memcpy); otherwise copies go through the
    /// kernel, so a range the caller unmaps fails its transfers instead of
    /// faulting.
    #[pyo3(signature = (address, length, keepalive, remote=true, kept=false))]
    fn register(
        &self,
        py: Python<'_>,
        address: u64,
        length: u64,
        keepalive: Py<PyAny>,
        remote: bool,
        kept: bool,
    ) -> PyResult<Registration> {
        let memory = wrap_raw(address, length, keepalive.clone_ref(py), kept)
            .map_err(|e| RegisterFailure::from(e).into_py())?;
        let local = self.local.clone();
        let reg = py
            .detach(|| local.register(address, memory, remote))
            .map_err(RegisterFailure::into_py)?;
        Ok(Registration::new(reg, address, keepalive, local))
    }

    /// Registers CUDA device memory `address..address+length` (a device
    /// pointer: `cudaMalloc`, a CUDA tensor's `data_ptr()`) on the
    /// cuda-staging path: its transfers are staged through pinned host
    /// memory, never handed to a NIC. With `remote` it is published and
    /// peers READ and WRITE it over tcp (this engine's target copies each
    /// request's bytes through host memory, synchronized, before it
    /// answers); otherwise it is local-only. The driver must say it is device memory inside one
    /// allocation (`cuPointerGetAttribute`); without libcuda, without a
    /// device or for any other address it is refused with the reason.
    /// `keepalive` (the tensor) is kept until the registration is removed
    /// and drained; with None the memory's lifetime is the caller's
    /// promise. Returns a `Registration` with `staged` true, `path`
    /// "cuda_staging" and `device` the driver's device ordinal.
    #[pyo3(signature = (address, length, keepalive=None, remote=false))]
    fn register_device(
        &self,
        py: Python<'_>,
        address: u64,
        length: u64,
        keepalive: Option<Py<PyAny>>,
        remote: bool,
    ) -> PyResult<Registration> {
        let keepalive = keepalive.unwrap_or_else(|| py.None());
        let keep = keepalive.clone_ref(py);
        let local = self.local.clone();
        let (reg, device) = py
            .detach(move || {
                let buffer = device_memory(address, length, keep)?;
                let device = buffer.device().index();
                local
                    .register_device(address, buffer, remote)
                    .map(|r| (r, device))
            })
            .map_err(RegisterFailure::into_py)?;
        Ok(Registration::new(reg, address, keepalive, self.local.clone()).on_device(device))
    }

    /// Registers an [`Allocation`] (memfd memory: same-host peers can map
    /// it, so the local path applies); `keepalive` is its owner.
    #[pyo3(signature = (allocation, keepalive, remote=true))]
    fn register_allocation(
        &self,
        py: Python<'_>,
        allocation: &Allocation,
        keepalive: Py<PyAny>,
        remote: bool,
    ) -> PyResult<Registration> {
        let memory = allocation.memory.clone();
        let start = memory.as_ptr() as u64;
        let local = self.local.clone();
        let reg = py
            .detach(|| local.register(start, memory, remote))
            .map_err(RegisterFailure::into_py)?;
        Ok(Registration::new(reg, start, keepalive, local))
    }

    /// Removes a registration (a `Registration` of this engine, or the
    /// address it starts at). Refused while requests on it are undrained.
    fn unregister(&self, py: Python<'_>, registration: &Bound<'_, PyAny>) -> PyResult<()> {
        let address = match registration.cast::<Registration>() {
            Ok(r) if r.get().belongs_to(&self.local) => r.get().address,
            Ok(r) => {
                return Err(errors::UnregisterError::new_err(format!(
                    "the registration at {:#x} belongs to another engine: unregister it there",
                    r.get().address
                )));
            }
            Err(_) => registration.extract::<u64>().map_err(|_| {
                errors::UnregisterError::new_err(
                    "unregister takes a Registration or the address it starts at",
                )
            })?,
        };
        let local = self.local.clone();
        py.detach(move || local.unregister(address))
            .map_err(UnregisterFailure::into_py)
    }

    /// Every local registration: (address, length).
    fn registrations(&self, py: Python<'_>) -> Vec<(u64, u64)> {
        py.detach(|| self.local.ranges())
    }

    /// Opens the peer named `session` ("host:port", or a source id with
    /// etcd metadata) with a handshake, and returns its handle.
    #[pyo3(signature = (session, token=None))]
    fn connect(&self, py: Python<'_>, session: &str, token: Option<&str>) -> PyResult<Peer> {
        let token = token
            .map(orbitte::ListenerToken::from_hex)
            .transpose()
            .map_err(|e| errors::ConnectError::new_err(format!("cannot open {session}: {e}")))?;
        let node = self.node().clone();
        py.detach(|| node.open(session, token))
            .map(|p| Peer::new(p, session.to_owned()))
            .map_err(|f| f.into_py(py))
    }

    /// Submits a batch for `peer` without waiting; all requests are
    /// admitted or none. With `notify`, the peer receives those bytes
    /// once, after every byte of the batch is placed (and only if every
    /// request completes). Returns a `Handle` per request.
    #[pyo3(signature = (peer, requests, notify=None))]
    fn submit(
        &self,
        py: Python<'_>,
        peer: PyRef<'_, Peer>,
        requests: Vec<PyRef<'_, Request>>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<Vec<Handle>> {
        let ids = self.submit_ids(py, &peer, &requests, notify)?;
        Ok(ids
            .into_iter()
            .map(|id| Handle::new(self.node().clone(), id))
            .collect())
    }

    /// Submits and waits for every outcome and for drain (GIL released).
    /// Raises TransferError (with `outcomes`) unless every byte arrived.
    #[pyo3(signature = (peer, requests, notify=None))]
    fn transfer(
        &self,
        py: Python<'_>,
        peer: PyRef<'_, Peer>,
        requests: Vec<PyRef<'_, Request>>,
        notify: Option<Vec<u8>>,
    ) -> PyResult<()> {
        let ids = self.submit_ids(py, &peer, &requests, notify)?;
        let node = self.node().clone();
        py.detach(move || node.settle(&ids))
            .map_err(|f| staged_note(py, f.into_py(py), &requests))
    }

    /// What the engine counted (`TransferEngine::metrics`), as the JSON
    /// docs/json.md describes; `orbitte.Engine.metrics()` loads it.
    fn metrics_json(&self, py: Python<'_>) -> PyResult<String> {
        let snapshot = py.detach(|| self.node().engine.metrics());
        serde_json::to_string(&snapshot).map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!("cannot encode the metrics: {e}"))
        })
    }

    /// Every notification received so far, oldest first (never blocks).
    fn notifications(&self, py: Python<'_>) -> Vec<Notification> {
        py.detach(|| self.node().engine.notifications())
            .into_iter()
            .map(Notification::from)
            .collect()
    }

    /// The oldest notification, waiting up to `timeout` seconds for one
    /// (GIL released); None when none came.
    fn wait_notification(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Notification>> {
        let t = secs(timeout, "timeout")?;
        Ok(py
            .detach(|| self.node().engine.wait_notification(t))
            .map(Notification::from))
    }

    /// Stops serving, fences the engine, waits for drain and destroys
    /// native objects.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = secs(timeout, "timeout")?;
        py.detach(|| self.node().close(t))
    }
}
