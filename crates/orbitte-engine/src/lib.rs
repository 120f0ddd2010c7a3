//! The OrbitTE transfer engine.
//!
//! A [`TransferEngine`] moves bytes between registered memory of engines on
//! the same or different hosts with one-sided READ and WRITE requests over
//! rdma (Host Direct), tcp or shared memory (local). Every request ends
//! with an [`Outcome`]: completed prefix, failure information, remote
//! effect and drain status. `docs/contract.md` is the contract in prose.
//!
//! # Entry path
//! 1. [`EngineBuilder`]: a source id, and [`listen`](EngineBuilder::listen)
//!    for an engine that others connect to (one listener serves tcp data
//!    sessions, same-host mapping and rdma control links).
//! 2. [`TransferEngine::register`]: host memory (or caller memory through
//!    `HostMemory::from_raw_parts`), published with [`Access`], or CUDA
//!    device memory (an `Arc<CudaBuffer>`, local only: [`staging`]); the
//!    [`Registration`] says which [`MemoryPath`] serves it.
//! 3. [`TransferEngine::connect`] (by address) or `connect_by_name` (etcd):
//!    a [`Peer`] with its path, rails, fallbacks and published
//!    [`RemoteRange`]s.
//! 4. [`Request::write`]/[`Request::read`] from those handles, then
//!    [`submit`](TransferEngine::submit), [`poll`](TransferEngine::poll) or
//!    [`wait`](TransferEngine::wait), and
//!    [`wait_drain`](TransferEngine::wait_drain) before reusing a buffer.
//!
//! ```
//! use std::time::Duration;
//! use orbitte_engine::{Access, EngineBuilder, Request};
//! use orbitte_memory::HostMemory;
//!
//! let decode = EngineBuilder::new("decode")
//!     .listen("127.0.0.1:0".parse()?)
//!     .host_memory_without_rdma() // this example runs on hosts without RDMA
//!     .build()?;
//! let prefill = EngineBuilder::new("prefill").host_memory_without_rdma().build()?;
//!
//! let dst = HostMemory::alloc(1 << 20)?;
//! decode.register(&dst, Access::RemoteReadWrite)?;
//! let src = HostMemory::alloc(1 << 20)?;
//! src.fill(0, 1 << 20, 0xab)?;
//! let local = prefill.register(&src, Access::LocalOnly)?;
//!
//! let peer = prefill.connect(decode.listen_addr().unwrap())?;
//! let ids = prefill.submit(&[Request::write(&local, 0..1 << 20).to(&peer.ranges()[0], 0)])?;
//! let outcome = prefill.wait(ids[0], Duration::from_secs(5))?;
//! assert!(outcome.is_complete());
//! prefill.wait_drain(ids[0], Duration::from_secs(5))?; // the buffer is ours again
//! assert_eq!(dst.to_vec(0, 4)?, [0xab; 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Shape
//! - `orbitte_proto`, its own crate: the sans-IO core (requests in, work
//!   items out; completions and time in, outcomes out), `EngineState`
//!   around it (tables, budget ledger, validation, rail choice, fencing)
//!   and the vocabulary every layer shares, tested on virtual time with a
//!   fault fuzz.
//! - `transport`: the seam where paths plug in, and the paths under it
//!   (rdma, tcp, local); public to tests with the `testing` feature.
//! - the driver ([`TransferEngine`], `engine/`): one poller thread per NIC
//!   context, a timer thread, the caller's thread posting; events come in
//!   through a lock-free intake queue, waiters park per request.
//! - `io_pool`: the engine's I/O threads, a fixed pool of event loops
//!   (`SessionConfig::io_threads`) on which every idle connection (tcp
//!   rails and sessions, mapping sessions, rdma control links) and the
//!   listeners wait, so threads do not grow with idle peers.
//! - [`staging`]: the cuda-staging lanes (GPU memory through pinned
//!   bounce buffers), one thread per lane, outcomes into the same table.
//! - `session`: sessions between engines (handshake, the listener, the
//!   path policy); `control`: the control-link seam (in-process links
//!   drive two engines on the simulated fabric in tests); both public to
//!   tests with the `testing` feature;
//!   [`capability`]: the capability matrix as data, rdma evaluated for
//!   real.
//!
//! # Buffer ownership
//! Registered memory is an `Arc<HostMemory>`; the engine's table, every MR
//! and every undrained request hold a clone, so the bytes stay mapped while
//! any request on them is undrained. The caller must not reuse a buffer
//! region for other data until [`TransferEngine::wait_drain`] says the
//! request is drained: a timeout or cancel is logical and DMA may still run.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod capability;
mod config;
// The engine's plumbing (control links, transports, sessions) is public
// only to the integration tests and benches, through the `testing`
// feature; applications use the names re-exported below.
#[cfg(feature = "testing")]
pub mod control;
#[cfg(not(feature = "testing"))]
#[allow(unreachable_pub, dead_code)]
mod control;
mod engine;
pub mod error;
mod io_pool;
pub use io_pool::PARK_AFTER;
mod nic;
pub mod notify;
pub use orbitte_proto::outcome;
mod recovery;
mod registration;
mod request;
pub mod secret;
#[cfg(feature = "testing")]
pub mod transport;
#[cfg(not(feature = "testing"))]
#[allow(unreachable_pub, dead_code)]
mod transport;
// Sessions and metadata; the tcp and local transports live under transport/.
pub mod metadata;
// What the engine counts, as data (`TransferEngine::metrics`).
pub mod metrics;
#[cfg(feature = "testing")]
pub mod session;
#[cfg(not(feature = "testing"))]
#[allow(unreachable_pub, dead_code)]
mod session;
// cuda-staging path: GPU memory through pinned bounce buffers (staging lanes).
pub mod staging;

/// The engine's tables keyed by ids (registrations, peers, ranges, rails,
/// queue pairs, requests), looked up on every batch: foldhash, seeded per
/// process, instead of SipHash.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use capability::{CapabilityMatrix, Check, PathRow};
pub use config::EngineBuilder;
#[cfg(feature = "testing")]
pub use control::{ControlLink, InProcessLink};
pub use engine::{PeerInfo, RailInfo, SubmitOptions, TransferEngine, TransferRequest};
pub use error::{
    BuildError, DrainTimeout, InactivePort, LinkError, NicsUnavailable, NoRdmaRail, OpenPeerError,
    RegisterError, Unquiesced, UnregisterError, WaitError,
};
pub use metrics::MetricsSnapshot;
pub use nic::{ContextStatus, EngineTopology};
pub use notify::{
    INBOX_BYTES_PER_PEER, INBOX_BYTES_TOTAL, INBOX_CAPACITY, InboxLimits, MAX_NOTIFICATION_LEN,
    Notification, NotificationError, NotificationStats, NotificationStatus,
    RDMA_MAX_NOTIFICATION_LEN, ReceivedNotification,
};
pub use outcome::{
    ChunkFailure, DrainStatus, FailureInfo, Outcome, RailRefusal, RemoteEffect, RequestError,
    RequestId, Status, SubmitError,
};
pub use recovery::{RecoveryPolicy, RecoveryState};
pub use registration::{Access, Budgets, Charges, Memory, MemoryPath, Registration};
pub use request::{LocalRead, LocalWrite, PeerRef, Posting, RemoteRange, RemoteTarget, Request};
pub use session::{
    ConnectError, ConnectOptions, ListenError, ListenerStats, PathPreference, Peer, SessionConfig,
    SessionError,
};
/// The smallest socket buffer a session asks for ([`SessionConfig`]).
pub use session::{DEFAULT_IO_THREADS, DEFAULT_UNSENT_LIMIT, MIN_SOCKET_BUFFER};
/// The local path's posting thread copies a post of at most this many
/// bytes itself (no hand-off to the copy workers).
pub use transport::local::INLINE_BYTES;
pub use transport::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId, SliceFailure};

pub use orbitte_topology::{DeviceMask, MemoryLocation, RdmaConfig};
pub use orbitte_wire::Epoch;
