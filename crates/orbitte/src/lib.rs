//! OrbitTE: a transfer engine that moves bytes between registered memory on
//! different hosts with one-sided READ and WRITE requests over RDMA, TCP or
//! shared memory.
//!
//! This facade is the crate applications depend on. The entry path:
//!
//! 1. [`EngineBuilder`]`::new(source_id)`, with
//!    [`listen`](EngineBuilder::listen) on an engine peers connect to, then
//!    [`build`](EngineBuilder::build);
//! 2. [`TransferEngine::register`] of a [`HostMemory`] with an [`Access`];
//! 3. [`TransferEngine::connect`] to a peer's address: a [`Peer`] with its
//!    path, rails and published [`RemoteRange`]s;
//! 4. [`Request::write`] / [`Request::read`] from those handles,
//!    [`TransferEngine::submit`], then [`TransferEngine::wait`] for the
//!    [`Outcome`] and [`TransferEngine::wait_drain`] before reusing a
//!    buffer.
//!
//! The Quick Start example (`examples/quickstart.rs`, walked through in
//! `docs/quickstart.md`) does exactly that with two engines on loopback;
//! `examples/handoff.rs` hands a KV cache from a prefill process to a decode
//! process with a notification:
//!
//! ```sh
//! cargo run -p orbitte --example quickstart
//! ```
//!
//! Every request ends with an [`Outcome`]: its completed prefix, failure
//! information, the remote effect of a WRITE and the local drain status. A
//! timeout or a cancel is logical: wait for drain before reusing the local
//! buffer.
//!
//! ```
//! use std::time::Duration;
//! use orbitte::{Access, EngineBuilder, HostMemory, Request};
//!
//! let decode = EngineBuilder::new("decode")
//!     .listen("127.0.0.1:0".parse()?)
//!     .host_memory_without_rdma() // this example runs on hosts without RDMA
//!     .build()?;
//! let prefill = EngineBuilder::new("prefill").host_memory_without_rdma().build()?;
//!
//! let dst = HostMemory::alloc(1 << 16)?;
//! decode.register(&dst, Access::RemoteReadWrite)?;
//! let src = HostMemory::alloc(1 << 16)?;
//! src.fill(0, 1 << 16, 0xab)?;
//! let local = prefill.register(&src, Access::LocalOnly)?;
//!
//! let peer = prefill.connect(decode.listen_addr().unwrap())?;
//! let ids = prefill.submit(&[Request::write(&local, 0..1 << 16).to(&peer.ranges()[0], 0)])?;
//! assert!(prefill.wait(ids[0], Duration::from_secs(5))?.is_complete());
//! prefill.wait_drain(ids[0], Duration::from_secs(5))?; // the buffer is ours again
//! assert_eq!(dst.to_vec(0, 4)?, [0xab; 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The facade names that path and little else: the builder and its inputs,
//! memory and registration, peers and requests, outcomes, notifications,
//! errors and the capability matrix. The layers under it are used from
//! their own crates: `orbitte_engine` (transports, sessions, metadata,
//! control links, cuda-staging evaluation, the positional
//! `TransferRequest`), `orbitte_wire` (frames, error codes),
//! `orbitte_verbs` (providers, the simulated fabric), `orbitte_topology`
//! (discovery, configuration overrides), `orbitte_memory` and
//! `orbitte_cuda`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Builder and engine.
pub use orbitte_engine::{
    ConnectOptions, ContextStatus, EngineBuilder, EngineTopology, PathPreference, PeerInfo,
    RailInfo, TransferEngine,
};
// The builder's inputs, and what the engine reports about its listener and
// its cuda-staging lanes.
pub use orbitte_engine::metadata::MetadataMode;
pub use orbitte_engine::staging::{StagingConfig, StagingStatus};
pub use orbitte_engine::{Budgets, DeviceMask, MemoryLocation, RdmaConfig, RecoveryPolicy};
pub use orbitte_engine::{ListenerStats, SessionConfig};
// What `TransferEngine::metrics()` returns, and its Prometheus text form.
pub use orbitte_engine::MetricsSnapshot;
pub use orbitte_engine::metrics;
pub use orbitte_engine::secret;
pub use orbitte_engine::secret::{SECRET_FILE_ENV, SecretFileError, new_listener_token};
pub use orbitte_wire::auth::{ClusterSecret, ListenerToken};

// Memory and registration.
pub use orbitte_engine::{Access, Charges, Memory, MemoryPath, Registration};
pub use orbitte_memory::HostMemory;

// Peer and request.
pub use orbitte_engine::{
    Epoch, LocalRead, LocalWrite, Op, PathKind, Peer, PeerId, PeerRef, Posting, RailId, RangeId,
    RegistrationId, RemoteRange, RemoteTarget, Request, RequestId, SubmitOptions,
};

// Outcome.
pub use orbitte_engine::{
    ChunkFailure, DrainStatus, FailureInfo, Outcome, RailRefusal, RemoteEffect, SliceFailure,
    Status,
};

// Notification.
pub use orbitte_engine::{
    MAX_NOTIFICATION_LEN, Notification, NotificationError, NotificationStats, NotificationStatus,
    ReceivedNotification,
};

// Errors.
pub use orbitte_engine::{
    BuildError, ConnectError, DrainTimeout, InactivePort, ListenError, NicsUnavailable, NoRdmaRail,
    RegisterError, RequestError, SubmitError, Unquiesced, UnregisterError, WaitError,
};

// Capability.
pub use orbitte_engine::{CapabilityMatrix, Check, PathRow};
