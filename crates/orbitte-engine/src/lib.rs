//! The OrbitTE transfer engine.
//!
//! A [`TransferEngine`] registers host memory on RDMA NICs (Host Direct),
//! publishes remotely accessible ranges to peers as segment descriptors,
//! opens peers over a [`ControlLink`] (handshake with authoritative epochs,
//! RC connection per rail) and runs batches of one-sided READ and WRITE
//! requests, sliced and striped across rails. Every request ends with an
//! [`Outcome`]: completed prefix, failure information, remote effect and
//! drain status. `docs/contract.md` is the contract in prose.
//!
//! # Shape
//! - [`core`]: the sans-IO core (requests in, work items out; completions
//!   and time in, outcomes out), unit-tested with virtual time.
//! - [`transport`]: the seam where paths plug in (rdma here; tcp and local
//!   in the net modules).
//! - the driver ([`TransferEngine`]): one poller thread per NIC context, a
//!   timer thread, and the caller's thread posting.
//! - [`control`]: the control-link seam for peer setup (in-process here,
//!   tcp in the session module); [`capability`]: the capability matrix as
//!   data, rdma evaluated for real.
//!
//! # Example: two engines on the simulated fabric
//! ```
//! use std::time::Duration;
//! use orbitte_engine::{Access, EngineBuilder, InProcessLink, RangeId, TransferRequest};
//! use orbitte_memory::HostMemory;
//! use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
//!
//! let fabric = SimFabric::new(
//!     SimDescription::new(vec![
//!         SimDeviceDesc::roce("a0", [10, 0, 0, 1]),
//!         SimDeviceDesc::roce("b0", [10, 0, 0, 2]),
//!     ])
//!     .with_delivery(Delivery::Background),
//!     7,
//! );
//! let a = EngineBuilder::new("prefill").provider(fabric.provider_for(&["a0"])).build()?;
//! let b = EngineBuilder::new("decode").provider(fabric.provider_for(&["b0"])).build()?;
//!
//! let src = HostMemory::alloc(1 << 20)?;
//! src.fill(0, 1 << 20, 0xab)?;
//! let dst = HostMemory::alloc(1 << 20)?;
//! let local = a.register_host(src, Access::LocalOnly)?;
//! let remote = b.register_host(dst.clone(), Access::REMOTE_READ_WRITE)?;
//!
//! // Open the peer over a control link (in-process here; tcp in production).
//! let (mut la, mut lb) = InProcessLink::pair();
//! let peer = std::thread::scope(|s| {
//!     let accept = s.spawn(|| b.accept_peer(&mut lb));
//!     let peer = a.open_peer(&mut la);
//!     accept.join().unwrap().map(|_| ())?;
//!     peer
//! })?;
//!
//! let req = TransferRequest::write(local.id, 0, peer.id, RangeId(remote.id.0), 0, 1 << 20);
//! let ids = a.submit(&[req])?;
//! let outcome = a.wait(ids[0], Duration::from_secs(5))?;
//! assert!(outcome.is_complete());
//! a.wait_drain(ids[0], Duration::from_secs(5))?; // the buffer is ours again
//! assert_eq!(dst.to_vec(0, 4)?, [0xab; 4]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
pub mod control;
pub mod core;
mod engine;
pub mod error;
mod lookup;
mod nic;
pub mod outcome;
mod peer;
mod rdma;
mod registration;
mod request;
pub mod transport;
// net (issue 7, helper "net"): sessions and metadata; tcp/local under transport/.
pub mod metadata;
pub mod session;
// cuda-staging path (issue 8, helper "staging"): GPU memory through pinned bounce buffers.
pub mod staging;

pub use capability::{CapabilityMatrix, Check, PathRow};
pub use config::EngineBuilder;
pub use control::{ControlLink, InProcessLink};
pub use engine::{PeerInfo, RailInfo, TransferEngine, TransferRequest, TransportId};
pub use error::{
    BuildError, DrainTimeout, LinkError, OpenPeerError, RegisterError, Unquiesced, UnregisterError,
    WaitError,
};
pub use nic::{ContextStatus, EngineTopology};
pub use outcome::{
    DrainStatus, FailureInfo, Outcome, RemoteEffect, RequestError, RequestId, Status, SubmitError,
};
pub use registration::{Access, Budgets, Charges, Memory, MemoryPath, Registration};
pub use request::{LocalRead, LocalWrite, RemoteRange, RemoteTarget, Request};
pub use session::{ConnectError, ConnectOptions, ListenError, PathPreference, Peer};
pub use transport::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId};

pub use orbitte_topology::{DeviceMask, MemoryLocation, RdmaConfig};
