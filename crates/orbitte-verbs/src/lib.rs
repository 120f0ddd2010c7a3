//! Safe RDMA verbs over a provider trait: `native` (libibverbs, loaded at
//! run time) and `sim` (a software fabric in this process).
//!
//! # Shape
//! A [`Provider`] lists and opens devices. Everything below is one set of
//! handle types whatever the provider:
//! [`Context`] → [`ProtectionDomain`] → [`MemoryRegion`], [`QueuePair`];
//! [`Context`] → [`CompletionQueue`]. Each handle owns an `Arc` of its
//! inner value and each inner value holds its parents, so teardown runs
//! QP, CQ, MR, PD, context with no extra code, in whatever order handles
//! are dropped.
//!
//! # Cleanup
//! Dropping a handle destroys the object when the last holder goes; drop
//! never panics. `close(self)` does the same now and reports failure as
//! [`Unquiesced`]: when a native destroy fails (EBUSY and friends) the
//! native object, its parents and its memory are *retained* (never freed,
//! listed by [`retained`]), because the NIC may still use them.
//!
//! # Thread safety
//! Every handle is `Send + Sync` (asserted at compile time below).
//! `Context`, `ProtectionDomain`, `MemoryRegion` and `CompletionQueue` are
//! cheap clones usable from any thread; polling a CQ from two threads is
//! allowed (each completion goes to one caller). A [`QueuePair`] has one
//! owner and posting borrows it mutably, so one thread posts at a time.
//!
//! # The buffer-lifetime rule
//! A work request's buffers may be read or written by the device until its
//! completion (or a later signaled completion on the same QP) has been
//! polled. Reuse or read the bytes only after that. Memory itself cannot
//! be freed early: the memory region keeps its `Arc<dyn DmaBuffer>`.
//!
//! # Misuse the types reject
//! A closed handle is gone (`close` consumes it):
//! ```compile_fail
//! fn use_after_close(mr: orbitte_verbs::MemoryRegion) {
//!     let _ = mr.close();
//!     let _ = mr.lkey();
//! }
//! ```
//! Sends are posted only on a QP typed `Rts` (see [`qp_state`]), and only
//! by its one owner, through `&mut`:
//! ```compile_fail
//! fn post_through_shared_ref(qp: &orbitte_verbs::QueuePair) {
//!     let _ = qp.post_send(&[]);
//! }
//! ```
//! A QP moved to the error state may still post (the work flushes), but it
//! is no longer a ready QP: it cannot stand in for one, nor go back to RTS
//! (see [`qp_state`]):
//! ```compile_fail
//! fn errored_is_not_ready(qp: orbitte_verbs::QueuePair) -> orbitte_verbs::QueuePair {
//!     qp.into_error().unwrap()
//! }
//! ```
//! A QP cannot be cloned (one owner):
//! ```compile_fail
//! fn clone_qp(qp: &orbitte_verbs::QueuePair) -> orbitte_verbs::QueuePair {
//!     qp.clone()
//! }
//! ```
//! For contrast, what does compile:
//! ```no_run
//! fn ok(qp: &mut orbitte_verbs::QueuePair, init: &mut orbitte_verbs::QueuePair<orbitte_verbs::qp_state::Init>) {
//!     let _ = qp.post_send(&[]);
//!     let _ = qp.post_recv(&[]);
//!     let _ = init.post_recv(&[]);
//! }
//! fn drain(qp: orbitte_verbs::QueuePair, marker: orbitte_verbs::SendWr<'_>) {
//!     let mut qp = qp.into_error().unwrap();
//!     let _ = qp.post_send(&[marker]); // completes with WrFlush
//!     let _ = qp.post_recv(&[]);
//! }
//! fn close_then_nothing(mr: orbitte_verbs::MemoryRegion) {
//!     let _ = mr.lkey();
//!     let _ = mr.close();
//! }
//! ```
//!
//! See `docs/verbs.md` for the differences between the sim and hardware.
#![warn(missing_docs)]
// `Unquiesced` carries the evidence docs/contract.md asks for (device identity,
// native error, cleanup tried); it is returned only by `close`, a cold path,
// so its size does not matter.
#![allow(clippy::result_large_err)]

mod backend;
mod context;
mod cq;
mod error;
mod mr;
pub mod native;
mod pd;
mod provider;
mod qp;
mod retain;
pub mod sim;
mod types;
mod wr;

pub use context::Context;
pub use cq::CompletionQueue;
pub use error::{
    AllocPdError, AsyncEventError, CleanupEvidence, CreateCqError, CreateQpError, DeviceListError,
    ModifyError, NativeError, ObjectKind, OpenError, PollError, PostError, PostErrorKind,
    QueryError, RegisterError, Unquiesced, UnquiescedCause, WaitError,
};
pub use mr::{MemoryRegion, OutOfRegion};
pub use orbitte_memory::DmaBuffer;
pub use pd::ProtectionDomain;
pub use provider::Provider;
pub use qp::{QueuePair, TransitionError, qp_state};
pub use retain::{RetainedObject, retained};
pub use types::{
    Access, AsyncEvent, DeviceAttr, DeviceDiagnostics, DeviceIdentity, DeviceInfo, Gid, GidEntry,
    GidType, InitAttrs, LinkLayer, Mtu, NodeAccess, PortAttr, PortDiagnostics, PortState,
    ProviderKind, QpCaps, QpState, RemoteEndpoint, Route, RtrAttrs, RtsAttrs, Speed, UverbsNode,
    Width,
};
pub use wr::{Completion, RecvWr, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

/// Compile-time Send/Sync promises of the handles.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Context>();
    send_sync::<ProtectionDomain>();
    send_sync::<MemoryRegion>();
    send_sync::<CompletionQueue>();
    send_sync::<QueuePair<qp_state::Reset>>();
    send_sync::<QueuePair<qp_state::Rts>>();
    send_sync::<QueuePair<qp_state::Errored>>();
    send_sync::<std::sync::Arc<dyn Provider>>();
    send_sync::<sim::SimFabric>();
    send_sync::<Unquiesced>();
};
