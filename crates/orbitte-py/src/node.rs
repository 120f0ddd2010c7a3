//! `Node`: the state behind one `NativeEngine`: the engine, the cached
//! peer of every session id (opened on first use, once, however many
//! threads ask), the local ranges by address, and the synchronous transfer
//! (submit, every outcome, drain). No Python here but the exceptions a
//! failure becomes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use orbitte::session::PathPreference;
use orbitte::{
    Access, ConnectError, ConnectOptions, DrainStatus, Epoch, MemoryPath, Notification, Op,
    Outcome, RemoteTarget, Request, RequestError, RequestId, SubmitError, TransferEngine,
    WaitError,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::directory::Directory;
use crate::errors;
use crate::memory::{LocalMiss, LocalRange, LocalTable};
use crate::outcome::PyOutcome;
use crate::remote::{RemotePeer, ranges_of};

/// Mooncake's return codes (its `error.h`), carried as the `code`
/// attribute of the exceptions so the Mooncake layer returns the same ints.
pub(crate) const ERR_INVALID_ARGUMENT: i32 = -1;
pub(crate) const ERR_ADDRESS_NOT_REGISTERED: i32 = -3;
pub(crate) const ERR_DEVICE_NOT_FOUND: i32 = -6;
pub(crate) const ERR_ADDRESS_OVERLAPPED: i32 = -7;
pub(crate) const ERR_SOCKET_FAIL: i32 = -102;
pub(crate) const ERR_REJECT_HANDSHAKE: i32 = -104;
pub(crate) const ERR_METADATA: i32 = -200;
pub(crate) const ERR_TRANSFER_FAILED: i32 = -1;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the engine serves and how it opens peers.
pub(crate) struct Node {
    /// Built with `host_memory_without_rdma` unless the caller asked for
    /// rdma: `register` is then served by tcp and local only.
    pub(crate) engine: TransferEngine,
    pub(crate) prefer: PathPreference,
    pub(crate) rails: usize,
    /// Longer than the request timeout: every request has an outcome by then.
    pub(crate) wait_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) locals: RwLock<LocalTable>,
    /// Peer-to-peer or etcd: how a session id becomes an address.
    pub(crate) directory: Directory,
    /// This host's id (the local path compares it), for etcd records.
    pub(crate) host_id: String,
    /// One slot per session id; a slot's lock is held while it connects,
    /// so a session connects once however many threads ask.
    pub(crate) peers: Mutex<HashMap<String, PeerSlot>>,
}

/// The cached peer of one session id (None until opened, or after it was
/// forgotten).
type PeerSlot = Arc<Mutex<Option<Arc<RemotePeer>>>>;

/// Why a transfer did not complete, before it became a Python exception.
#[derive(Debug)]
pub(crate) enum Failure {
    Argument(String),
    Local(LocalMiss),
    Connect { code: i32, message: String },
    Submit(SubmitError),
    Incomplete(Vec<Outcome>),
}

impl Failure {
    pub(crate) fn into_py(self, py: Python<'_>) -> PyErr {
        let (err, code, outcomes) = match self {
            Self::Argument(m) => (errors::SubmitError::new_err(m), ERR_INVALID_ARGUMENT, None),
            Self::Local(m) => (
                errors::SubmitError::new_err(m.to_string()),
                ERR_ADDRESS_NOT_REGISTERED,
                None,
            ),
            Self::Connect { code, message } => (errors::ConnectError::new_err(message), code, None),
            Self::Submit(
                e @ SubmitError::Invalid {
                    error:
                        RequestError::PeerRestarted {
                            handle, current, ..
                        },
                    ..
                },
            ) => {
                let err = errors::PeerRestartedError::new_err(e.to_string());
                let v = err.value(py);
                let _ = v.setattr("handle_epoch", handle.value());
                let _ = v.setattr("current_epoch", current.value());
                (err, ERR_ADDRESS_NOT_REGISTERED, None)
            }
            Self::Submit(e) => {
                let code = if remote_miss(&e) {
                    ERR_ADDRESS_NOT_REGISTERED
                } else {
                    ERR_INVALID_ARGUMENT
                };
                (errors::SubmitError::new_err(e.to_string()), code, None)
            }
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

impl Node {
    /// The peer behind `session`, opened on first use and cached.
    pub(crate) fn peer(&self, session: &str) -> Result<Arc<RemotePeer>, Failure> {
        let slot = self.slot(session);
        let mut g = lock(&slot);
        if let Some(p) = &*g {
            return Ok(p.clone());
        }
        let p = Arc::new(self.open(session)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// The cache slot of `session`.
    fn slot(&self, session: &str) -> PeerSlot {
        lock(&self.peers)
            .entry(session.to_owned())
            .or_default()
            .clone()
    }

    /// Opens the peer behind `session` now, with a handshake, whether or
    /// not one is cached, and caches the result (a dead target is an
    /// error here, not a cached handle).
    pub(crate) fn reconnect(&self, session: &str) -> Result<Arc<RemotePeer>, Failure> {
        let slot = self.slot(session);
        let mut g = lock(&slot);
        *g = None;
        let p = Arc::new(self.open(session)?);
        *g = Some(p.clone());
        Ok(p)
    }

    /// Forgets the cached peer of `session` if it is still `stale`, so the
    /// next use opens it again (a restarted target, a dead session).
    pub(crate) fn forget(&self, session: &str, stale: &Arc<RemotePeer>) {
        let slot = lock(&self.peers).get(session).cloned();
        if let Some(slot) = slot {
            let mut g = lock(&slot);
            if g.as_ref().is_some_and(|p| Arc::ptr_eq(p, stale)) {
                *g = None;
            }
        }
    }

    pub(crate) fn open(&self, session: &str) -> Result<RemotePeer, Failure> {
        let addr = self
            .directory
            .address_of(session)
            .map_err(|message| Failure::Connect {
                code: ERR_INVALID_ARGUMENT,
                message,
            })?;
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
            epoch: net.info.epoch.value(),
            path: net.path,
            fell_back: net.fell_back,
            ranges,
        })
    }

    /// The batch as engine requests: each local address resolved to its
    /// registration here, each remote one left to the engine, which
    /// resolves it against the peer's publications at submit.
    /// With `epoch` (the handle's), the engine refuses the batch once the
    /// peer runs another incarnation.
    pub(crate) fn requests(
        &self,
        peer: &RemotePeer,
        epoch: Option<Epoch>,
        ops: &[(bool, u64, u64, u64, u64)],
    ) -> Result<Vec<Request>, Failure> {
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
                Ok(Request {
                    op: if write { Op::Write } else { Op::Read },
                    local: reg.id,
                    local_offset: loff,
                    len,
                    remote: RemoteTarget::Address {
                        peer: peer.id,
                        epoch,
                        address: remote,
                    },
                    label,
                })
            })
            .collect()
    }

    /// Submits a batch to `session`; when the peer's publications known
    /// here do not hold a remote address (the target registered it after
    /// the session opened), opens the session again once and retries. With
    /// `epoch` (a handle's), a batch for a peer that restarted since is
    /// refused (`PeerRestarted`), before and after the reopen alike.
    pub(crate) fn submit(
        &self,
        session: &str,
        epoch: Option<Epoch>,
        ops: &[(bool, u64, u64, u64, u64)],
        notify: Option<&[u8]>,
    ) -> Result<(Arc<RemotePeer>, Vec<RequestId>), Failure> {
        if ops.is_empty() {
            return Err(Failure::Argument(
                "empty batch: give at least one request".into(),
            ));
        }
        let mut peer = self.peer(session)?;
        let mut refreshed = false;
        loop {
            let stale = |f: &Failure| matches!(f, Failure::Submit(e) if remote_miss(e));
            let attempt = self.requests(&peer, epoch, ops).and_then(|reqs| {
                match notify {
                    None => self.engine.submit(&reqs),
                    Some(b) => self
                        .engine
                        .submit_with_notification(&reqs, Notification::new(b)),
                }
                .map_err(Failure::Submit)
            });
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
    pub(crate) fn transfer(
        &self,
        session: &str,
        epoch: Option<Epoch>,
        ops: &[(bool, u64, u64, u64, u64)],
        notify: Option<&[u8]>,
    ) -> Result<(), Failure> {
        let (peer, ids) = self.submit(session, epoch, ops, notify)?;
        let mut outcomes = Vec::with_capacity(ids.len());
        // Every outcome already arrived is taken in one hold of the
        // engine's lock; a request that outlives the wait is cancelled and
        // its (then prompt) outcome taken alone.
        let mut rest = &ids[..];
        while let Some((&first, after)) = rest.split_first() {
            match self
                .engine
                .wait_ready(rest, self.wait_timeout, &mut outcomes)
            {
                Ok(taken) => rest = &rest[taken..],
                Err(WaitError::TimedOut(_)) => {
                    self.engine.cancel(first);
                    match self.engine.wait(first, self.wait_timeout) {
                        Ok(o) => outcomes.push(o),
                        Err(e) => return Err(Failure::Argument(e.to_string())),
                    }
                    rest = after;
                }
                Err(e) => return Err(Failure::Argument(e.to_string())),
            }
        }
        let complete = outcomes.iter().all(|o| o.is_complete());
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

    pub(crate) fn register(
        &self,
        start: u64,
        memory: Arc<orbitte::HostMemory>,
        remote: bool,
    ) -> PyResult<(u64, &'static str)> {
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
        let reg = self.engine.register(memory.clone(), access).map_err(|e| {
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
                memory,
            },
        );
        drop(locals);
        // The record's publications are informative (peers read them from
        // the session): a failed refresh is not a failed registration.
        let _ = self.publish();
        let path = match reg.path {
            MemoryPath::HostDirect => "host_direct",
            MemoryPath::HostWithoutRdma => "host_without_rdma",
            _ => "other",
        };
        Ok((reg.id.0, path))
    }

    /// Stores this engine's record in etcd (nothing for p2p or before
    /// `listen`).
    pub(crate) fn publish(&self) -> Result<(), String> {
        match self.engine.listen_addr() {
            Some(at) => self.directory.publish(&self.engine, at, &self.host_id),
            None => Ok(()),
        }
    }
}

/// Sets the exception's `code` attribute (Mooncake's return code).
pub(crate) fn coded(err: PyErr, code: i32) -> PyErr {
    Python::attach(|py| {
        let _ = err.value(py).setattr("code", code);
    });
    err
}

pub(crate) fn secs(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds, got {s}"
        ))
    })
}
