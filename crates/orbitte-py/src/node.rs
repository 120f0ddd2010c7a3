//! `Node`: what both Python APIs share: the engine with its tcp and local
//! paths, the path policy for the peers it opens, how a session id becomes
//! an address ([`Directory`]), and the wait for a batch's outcomes and
//! drain; [`Local`]: a node with its registrations by address. Failures are Rust values here; each API turns them into its
//! exceptions (`orbitte.Engine`: [`Failure::into_py`]; the Mooncake
//! adapter adds its return code, [`crate::mooncake`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use orbitte::{
    Access, ConnectOptions, DrainStatus, EngineBuilder, HostMemory, ListenerToken,
    NotificationStatus, PathKind, PathPreference, RdmaConfig, Registration, RequestError,
    RequestId, SubmitError, TransferEngine, WaitError,
};
use orbitte_cuda::CudaBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::directory::Directory;
use crate::errors;
use crate::gpu::{DeviceMemoryError, UnrecognisedMemory};
use crate::memory::{LocalMiss, LocalRange, LocalTable, RangeMemory, RawMemoryError};
use crate::outcome::PyOutcome;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn secs(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds, got {s}"
        ))
    })
}

/// How an engine is built (the constructor arguments of both APIs).
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) source_id: String,
    pub(crate) rdma: bool,
    pub(crate) devices: Vec<String>,
    pub(crate) path: String,
    pub(crate) rails: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    /// None or "p2p": peer-to-peer; else an etcd URL.
    pub(crate) metadata: Option<String>,
    /// The cluster secret's file (else `ORBITTE_SECRET_FILE`'s).
    pub(crate) secret_file: Option<String>,
    /// Listen with a fresh listener token (published in the metadata).
    pub(crate) listener_token: bool,
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildFailure {
    #[error("path {0:?}: use \"auto\", \"tcp\", \"local\" or \"rdma\"")]
    Path(String),
    /// The metadata server is unsupported or unreachable.
    #[error("{0}")]
    Metadata(String),
    #[error("{0}")]
    Engine(String),
}

/// Why `listen` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListenFailure {
    #[error("listen address {0:?} does not resolve: write \"host:port\" (port 0: any)")]
    Address(String),
    /// The socket could not be bound, or the record not published.
    #[error("{0}")]
    Socket(String),
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterFailure {
    #[error(transparent)]
    Memory(#[from] RawMemoryError),
    /// Not usable as CUDA device memory (`register_device`).
    #[error(transparent)]
    Device(#[from] DeviceMemoryError),
    /// Neither host memory nor device memory (Mooncake's register).
    #[error(transparent)]
    Unrecognised(#[from] UnrecognisedMemory),
    #[error(
        "{start:#x}+{len} overlaps the registered range {other:#x}+{other_len}: unregister it first or register a disjoint buffer"
    )]
    Overlap {
        start: u64,
        len: u64,
        other: u64,
        other_len: u64,
    },
    #[error(transparent)]
    Engine(#[from] orbitte::RegisterError),
}

impl RegisterFailure {
    pub(crate) fn into_py(self) -> PyErr {
        errors::RegisterError::new_err(self.to_string())
    }
}

/// Why a registration could not be removed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnregisterFailure {
    #[error(
        "no registration starts at {0:#x}: pass the Registration (or the address) register gave"
    )]
    NotRegistered(u64),
    #[error(transparent)]
    Engine(#[from] orbitte::UnregisterError),
}

impl UnregisterFailure {
    pub(crate) fn into_py(self) -> PyErr {
        errors::UnregisterError::new_err(self.to_string())
    }
}

/// How opening a peer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The session id names no address.
    Address,
    /// Nothing answered at the address.
    Unreachable,
    /// The peer answered and refused (handshake, epoch, no path).
    Rejected,
}

/// Why a request, a batch or a transfer did not complete, before it
/// became a Python exception.
#[derive(Debug)]
pub(crate) enum Failure {
    Argument(String),
    Local(LocalMiss),
    Connect {
        refusal: Refusal,
        message: String,
    },
    Submit(SubmitError),
    Incomplete(Vec<orbitte::Outcome>),
    /// Every request completed; the batch's notification did not reach the
    /// target's queue (refused, unconfirmed or not sent).
    Notification(Vec<orbitte::Outcome>),
    Wait(WaitError),
}

impl Failure {
    pub(crate) fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            Self::Argument(m) => errors::SubmitError::new_err(m),
            Self::Local(m) => errors::SubmitError::new_err(m.to_string()),
            Self::Connect { message, .. } => errors::ConnectError::new_err(message),
            Self::Submit(
                e @ SubmitError::Invalid {
                    error:
                        RequestError::PeerRestarted {
                            handle, current, ..
                        },
                    ..
                },
            ) => errors::peer_restarted(py, e.to_string(), handle.value(), current.value()),
            Self::Submit(e) => errors::SubmitError::new_err(e.to_string()),
            Self::Incomplete(outcomes) => {
                let all: Vec<PyOutcome> = outcomes.iter().map(PyOutcome::from).collect();
                let failed = all.iter().filter(|o| !o.is_complete()).count();
                let first = all
                    .iter()
                    .find(|o| !o.is_complete())
                    .map(PyOutcome::summary)
                    .unwrap_or_default();
                let err = errors::TransferError::new_err(format!(
                    "{failed} of {} request(s) did not complete; first: {first}",
                    all.len()
                ));
                let _ = err.value(py).setattr("outcomes", all);
                err
            }
            Self::Notification(outcomes) => {
                let all: Vec<PyOutcome> = outcomes.iter().map(PyOutcome::from).collect();
                let (status, why) = all
                    .first()
                    .map(|o| {
                        (
                            o.notification,
                            o.notification_why.clone().unwrap_or_default(),
                        )
                    })
                    .unwrap_or_default();
                let err = errors::TransferError::new_err(format!(
                    "every byte moved, but the notification was {}: {why}",
                    status.replace('_', " ")
                ));
                let _ = err.value(py).setattr("outcomes", all);
                err
            }
            Self::Wait(e @ WaitError::TimedOut(_)) => errors::WaitTimeout::new_err(e.to_string()),
            Self::Wait(e) => errors::Error::new_err(e.to_string()),
        }
    }
}

/// The engine and its registrations by address (one registration per
/// address range: overlapping ones are refused).
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) node: Arc<Node>,
    regs: RwLock<LocalTable>,
}

impl Local {
    pub(crate) fn new(node: Node) -> Self {
        Self {
            node: Arc::new(node),
            regs: RwLock::new(LocalTable::default()),
        }
    }

    /// The registrations, for reading (what holds an address).
    pub(crate) fn regs(&self) -> RwLockReadGuard<'_, LocalTable> {
        self.regs.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every registration: (address, length).
    pub(crate) fn ranges(&self) -> Vec<(u64, u64)> {
        self.regs().ranges()
    }

    /// Registers `memory`, whose first byte is at `start`, published to
    /// peers when `remote`; refused if it overlaps a registration.
    pub(crate) fn register(
        &self,
        start: u64,
        memory: Arc<HostMemory>,
        remote: bool,
    ) -> Result<Registration, RegisterFailure> {
        let len = memory.len() as u64;
        self.insert(start, len, RangeMemory::Host(memory.clone()), || {
            self.node.register(memory, remote)
        })
    }

    /// Registers CUDA device memory whose first byte is at `start` on the
    /// cuda-staging path, published to peers when `remote` (the engine's
    /// tcp target serves it through host memory; local-only otherwise);
    /// refused if it overlaps a registration.
    pub(crate) fn register_device(
        &self,
        start: u64,
        buffer: Arc<CudaBuffer>,
        remote: bool,
    ) -> Result<Registration, RegisterFailure> {
        let len = buffer.len() as u64;
        self.insert(start, len, RangeMemory::Device(buffer.clone()), || {
            self.node.register_device(buffer, remote)
        })
    }

    /// Registers with `register` unless `start..start+len` overlaps a
    /// registration, and keeps `memory` by `start`.
    fn insert(
        &self,
        start: u64,
        len: u64,
        memory: RangeMemory,
        register: impl FnOnce() -> Result<Registration, RegisterFailure>,
    ) -> Result<Registration, RegisterFailure> {
        let mut regs = self.regs.write().unwrap_or_else(PoisonError::into_inner);
        if let Some((other, other_len)) = regs.overlapping(start, len) {
            return Err(RegisterFailure::Overlap {
                start,
                len,
                other,
                other_len,
            });
        }
        let reg = register()?;
        regs.insert(
            start,
            LocalRange {
                id: reg.id,
                len,
                memory,
            },
        );
        Ok(reg)
    }

    /// Removes the registration that starts at `address`.
    pub(crate) fn unregister(&self, address: u64) -> Result<(), UnregisterFailure> {
        let mut regs = self.regs.write().unwrap_or_else(PoisonError::into_inner);
        let id = regs
            .starting_at(address)
            .ok_or(UnregisterFailure::NotRegistered(address))?
            .id;
        self.node.engine.unregister(id)?;
        regs.remove(address);
        Ok(())
    }
}

/// The engine both APIs drive, with what opening a peer needs.
#[derive(Debug)]
pub(crate) struct Node {
    /// Built with `host_memory_without_rdma` unless the caller asked for
    /// rdma: registrations are then served by tcp and local only.
    pub(crate) engine: TransferEngine,
    prefer: PathPreference,
    rails: usize,
    /// Longer than the request timeout: every request has an outcome by then.
    wait_timeout: Duration,
    drain_timeout: Duration,
    /// Peer-to-peer or etcd: how a session id becomes an address.
    directory: Directory,
    /// This host's id (the local path compares it), for etcd records.
    host_id: String,
    /// orbitte.nixl's transfers whose notification waits to be carried.
    pub(crate) carriers: Arc<crate::nixl::Carriers>,
    /// The token the listener requires, when built with one.
    pub(crate) token: Option<ListenerToken>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.carriers.close();
    }
}

impl Node {
    /// Builds the engine (blocking: RDMA discovery, etcd).
    pub(crate) fn build(s: Settings) -> Result<Self, BuildFailure> {
        let prefer = match s.path.as_str() {
            "auto" => PathPreference::Auto,
            "tcp" => PathPreference::Only(PathKind::Tcp),
            "local" => PathPreference::Only(PathKind::Local),
            "rdma" => PathPreference::Only(PathKind::Rdma),
            other => return Err(BuildFailure::Path(other.to_owned())),
        };
        let directory = match s.metadata.as_deref() {
            None | Some("p2p") => Directory::P2p,
            Some(url) => Directory::etcd(url).map_err(BuildFailure::Metadata)?,
        };
        let drain_timeout = Duration::from_secs(5);
        let token =
            if s.listener_token {
                Some(orbitte::new_listener_token().map_err(|e| {
                    BuildFailure::Engine(format!("cannot draw a listener token: {e}"))
                })?)
            } else {
                None
            };
        let mut b = EngineBuilder::new(s.source_id)
            .rdma(RdmaConfig {
                whitelist: s.devices,
                ..RdmaConfig::default()
            })
            .request_timeout(s.request_timeout)
            .drain_timeout(drain_timeout)
            .handshake_timeout(s.handshake_timeout);
        if let Some(file) = s.secret_file {
            b = b.cluster_secret_file(file);
        }
        if let Some(t) = token {
            b = b.listener_token(t);
        }
        let engine = if s.rdma {
            b.build()
        } else {
            b.host_memory_without_rdma().build()
        }
        .map_err(|e| BuildFailure::Engine(e.to_string()))?;
        Ok(Self {
            host_id: engine.host_id().to_owned(),
            engine,
            prefer,
            rails: s.rails.max(1),
            wait_timeout: s.request_timeout + drain_timeout + Duration::from_secs(5),
            drain_timeout,
            directory,
            carriers: Arc::default(),
            token,
        })
    }

    /// Serves the engine's registrations on `addr`; returns the port.
    pub(crate) fn listen(&self, addr: &str) -> Result<u16, ListenFailure> {
        let at = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ListenFailure::Address(addr.to_owned()))?;
        let bound = self
            .engine
            .listen(at)
            .map_err(|e| ListenFailure::Socket(e.to_string()))?;
        self.publish().map_err(ListenFailure::Socket)?;
        Ok(bound.port())
    }

    /// Registers `memory`, published to peers when `remote`.
    pub(crate) fn register(
        &self,
        memory: Arc<HostMemory>,
        remote: bool,
    ) -> Result<Registration, RegisterFailure> {
        let reg = self.engine.register(memory, access(remote))?;
        // The record's publications are informative (peers read them from
        // the session): a failed refresh is not a failed registration.
        let _ = self.publish();
        Ok(reg)
    }

    /// Registers CUDA device memory on the cuda-staging path, published to
    /// peers (served over tcp through host memory) when `remote`.
    pub(crate) fn register_device(
        &self,
        buffer: Arc<CudaBuffer>,
        remote: bool,
    ) -> Result<Registration, RegisterFailure> {
        let reg = self.engine.register(buffer, access(remote))?;
        if remote {
            let _ = self.publish();
        }
        Ok(reg)
    }

    /// Opens the peer named `session` now, with a handshake, proving the
    /// key of its listener `token` when given.
    pub(crate) fn open(
        &self,
        session: &str,
        token: Option<ListenerToken>,
    ) -> Result<orbitte::Peer, Failure> {
        let (addr, recorded): (SocketAddr, _) =
            self.directory
                .address_of(session)
                .map_err(|message| Failure::Connect {
                    refusal: Refusal::Address,
                    message,
                })?;
        let token = match (token, recorded) {
            (Some(t), _) => Some(t),
            (None, Some(hex)) => {
                Some(ListenerToken::from_hex(&hex).map_err(|e| Failure::Connect {
                    refusal: Refusal::Address,
                    message: format!("etcd's record of {session:?}: {e}"),
                })?)
            }
            (None, None) => None,
        };
        let options = ConnectOptions {
            prefer: self.prefer,
            rails: self.rails,
            token,
        };
        self.engine
            .connect_with(addr, options)
            .map_err(|e| Failure::Connect {
                refusal: match e {
                    orbitte::ConnectError::Session(_) => Refusal::Unreachable,
                    _ => Refusal::Rejected,
                },
                message: format!("cannot open {session}: {e}"),
            })
    }

    /// Waits for the outcome of every request of a submitted batch, then
    /// for its drain: when this returns, the local buffers are the
    /// caller's again. `Incomplete` unless every byte arrived.
    pub(crate) fn settle(&self, ids: &[RequestId]) -> Result<(), Failure> {
        // The outcomes that arrived are taken in one hold of the engine's
        // lock; the thread then waits for the last request still without
        // one (a rail completes in posting order: about one wake per rail).
        // A request that outlives the wait is cancelled and its (then
        // prompt) outcome taken alone.
        let mut got: Vec<Option<orbitte::Outcome>> = Vec::with_capacity(ids.len());
        got.resize_with(ids.len(), || None);
        while let Some(last) = self.engine.take_ready(ids, &mut got) {
            let id = ids[last];
            let outcome = match self.engine.wait(id, self.wait_timeout) {
                Ok(o) => o,
                Err(WaitError::TimedOut(_)) => {
                    self.engine.cancel(id);
                    self.engine
                        .wait(id, self.wait_timeout)
                        .map_err(Failure::Wait)?
                }
                Err(e) => return Err(Failure::Wait(e)),
            };
            got[last] = Some(outcome);
        }
        let mut outcomes: Vec<_> = got.into_iter().flatten().collect();
        let complete = outcomes.iter().all(|o| o.is_complete());
        for (id, o) in ids.iter().zip(outcomes.iter_mut()) {
            if o.drain != DrainStatus::Drained {
                let _ = self.engine.wait_drain(*id, self.drain_timeout);
                o.drain = self.engine.drain_status(*id);
            }
        }
        let delivered = outcomes.iter().all(|o| {
            matches!(
                o.notification,
                NotificationStatus::NotRequested | NotificationStatus::Sent
            )
        });
        match (complete, delivered) {
            (true, true) => Ok(()),
            (true, false) => Err(Failure::Notification(outcomes)),
            (false, _) => Err(Failure::Incomplete(outcomes)),
        }
    }

    /// Stores this engine's record in etcd (nothing for p2p or before
    /// `listen`).
    pub(crate) fn publish(&self) -> Result<(), String> {
        match self.engine.listen_addr() {
            Some(at) => self.directory.publish(
                &self.engine,
                at,
                &self.host_id,
                self.token.map(|t| t.to_hex()),
            ),
            None => Ok(()),
        }
    }

    /// Stops serving, fences the engine, waits for drain.
    pub(crate) fn close(&self, timeout: Duration) -> PyResult<()> {
        self.engine
            .shutdown(timeout)
            .map_err(|u| errors::Error::new_err(u.to_string()))
    }
}

/// Peers may READ and WRITE a range registered `remote`; otherwise it is
/// local-only.
fn access(remote: bool) -> Access {
    if remote {
        Access::REMOTE_READ_WRITE
    } else {
        Access::LocalOnly
    }
}
