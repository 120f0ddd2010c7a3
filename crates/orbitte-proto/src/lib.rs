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
//! - the vocabulary every layer shares: paths and operations
//!   ([`PathKind`], [`Op`]), ids, [`TransferRequest`], [`WorkItem`] and
//!   [`TransportEvent`] (what the core hands a transport and hears back),
//!   [`outcome`]s and their errors, [`notification`] status and tracking.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod core;
mod ids;
pub mod notification;
pub mod outcome;
mod request;
#[cfg(test)]
mod test_rng;
mod work;

pub use ids::{Op, PathKind, PeerId, RailId, RangeId, RegistrationId, SliceToken};
pub use request::TransferRequest;
pub use work::{
    DeviceError, PostError, RailSpec, SliceFailure, SliceStatus, TransportEvent, WorkItem,
};
