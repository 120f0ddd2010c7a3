//! OrbitTE: a transfer engine that moves bytes between registered memory on
//! different hosts with one-sided READ and WRITE requests over RDMA, TCP or
//! shared memory.
//!
//! This facade is the crate applications depend on. The engine API
//! ([`TransferEngine`], [`EngineBuilder`], [`TransferRequest`],
//! [`Outcome`], the capability matrix, ...) is re-exported at the top
//! level; the memory, topology, verbs, wire and CUDA crates are re-exported
//! as modules, with the types most programs need also at the top level
//! ([`HostMemory`], [`RdmaConfig`], [`DeviceMask`], [`Topology`]).
//!
//! The Quick Start source example (`examples/quickstart.rs`, walked through
//! in `docs/quickstart.md`) builds two engines, registers memory, connects
//! them, writes, reads back and prints the outcome:
//!
//! ```sh
//! cargo run -p orbitte --example quickstart
//! ```
//!
//! Every request ends with an [`Outcome`]: its completed prefix, failure
//! information, the remote effect of a WRITE and the local drain status. A
//! timeout or a cancel is logical: wait for drain
//! ([`TransferEngine::wait_drain`]) before reusing the local buffer.
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
