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
mod lookup;
pub mod error;
mod nic;
pub mod outcome;
mod peer;
mod rdma;
mod registration;
pub mod transport;
// net (issue 7, helper "net"): sessions and metadata; tcp/local under transport/.
pub mod metadata;
pub mod session;

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
pub use registration::{Access, Budgets, Charges, Registration};
pub use transport::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId};

pub use orbitte_topology::{DeviceMask, RdmaConfig};
