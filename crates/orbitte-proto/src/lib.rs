//! OrbitTE's sans-IO transfer core.
//!
//! Requests go in, work items come out; completions and time go in,
//! outcomes come out. Nothing here reads a clock, starts a thread or
//! touches a socket or a device: time is an argument (`now: Instant`),
//! and the engine's driver (`orbitte-engine`) owns threads, clock and
//! I/O and calls these types' methods. `cargo xtask tidy` keeps the
//! crate that way.
//!
//! - [`core::Core`]: slices, rails, in-flight bounds, selective
//!   signaling, timeouts, drain and the outcome of every request.
//! - [`state::EngineState`]: the core with the registration and peer
//!   tables, the budget ledger and the rules of admission, Host Direct
//!   registration, peer adoption by epoch, notifications and reaping;
//!   the driver's memory and regions behind [`registration::Resources`].
//! - the vocabulary every layer shares: paths and operations
//!   ([`PathKind`], [`Op`]), ids, [`TransferRequest`], [`WorkItem`] and
//!   [`TransportEvent`] (what the core hands a transport and hears back),
//!   [`outcome`]s and their errors, [`notification`] status and tracking.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod core;
pub mod error;
mod ids;
pub mod notification;
pub mod outcome;
pub mod registration;
mod request;
pub mod state;
#[cfg(test)]
mod test_rng;
mod work;

/// The state's tables keyed by ids (registrations, peers, ranges, rails,
/// requests), looked up on every batch: foldhash, seeded per process,
/// instead of SipHash.
pub type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use ids::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId, SliceToken};
pub use outcome::{DeviceError, SliceFailure, SliceStatus};
pub use request::TransferRequest;
pub use work::{PostError, RailSpec, TransportEvent, WorkItem};
