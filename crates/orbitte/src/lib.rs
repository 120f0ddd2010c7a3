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
//! buffer. The memory, topology, verbs, wire and CUDA crates are
//! re-exported as modules, with the types most programs need also at the
//! top level ([`HostMemory`], [`RdmaConfig`], [`DeviceMask`], [`Topology`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use orbitte_engine::*;

/// The engine crate itself (also re-exported at the top level).
pub use orbitte_engine as engine;

/// Host memory that NICs register and same-host peers share.
pub use orbitte_memory as memory;
pub use orbitte_memory::HostMemory;

/// RDMA topology: NIC IDs, inert slots, ports, GIDs, selection, affinity.
pub use orbitte_topology as topology;
pub use orbitte_topology::{NicId, SysfsRoots, Topology, discover};

/// Safe verbs over the provider trait: `native` (libibverbs) and `sim`.
pub use orbitte_verbs as verbs;

/// The wire protocol: frames, handshake, epochs, segment descriptors.
pub use orbitte_wire as wire;

/// CUDA device allocation and synchronized host staging.
pub use orbitte_cuda as cuda;
