//! The C API of OrbitTE: `liborbitte_capi.so` / `liborbitte_capi.a` and
//! the header `include/orbitte.h`, generated from this crate by cbindgen
//! (`cargo xtask capi-header`; `--check` fails when it drifted).
//!
//! The calls, in the order a program makes them (NIXL's backend calls in
//! parentheses; docs/capi.md is the reference):
//!
//! 1. `orbitte_engine_create` (the backend's constructor), with a listen
//!    address and a cluster secret file (or `$ORBITTE_SECRET_FILE`);
//! 2. `orbitte_register` of the caller's memory or `orbitte_alloc` of the
//!    engine's (`registerMem`), `orbitte_deregister` (`deregisterMem`),
//!    `orbitte_public_data` (`getPublicData`);
//! 3. `orbitte_conn_info` (`getConnInfo`) on one engine, `orbitte_connect`
//!    with those bytes on the other (`loadRemoteConnInfo` + `connect`),
//!    `orbitte_load_remote` with the peer's public data (`loadRemoteMD`),
//!    `orbitte_disconnect` (`disconnect`);
//! 4. `orbitte_xfer_prepare` of (local address, remote address, length)
//!    descriptors (`prepXfer`), `orbitte_xfer_post` with an optional
//!    notification (`postXfer`), `orbitte_xfer_check` (`checkXfer`),
//!    `orbitte_xfer_release` (`releaseReqH`);
//! 5. `orbitte_notif_poll` (`getNotifs`) and `orbitte_notify`
//!    (`genNotif`);
//! 6. `orbitte_engine_destroy`.
//!
//! Every call returns an `ORBITTE_*` code (NIXL's numbers where NIXL has
//! the status) and keeps a message for `orbitte_last_error` on the calling
//! thread. No panic crosses the boundary: every entry point runs inside
//! `catch_unwind` (`status.rs`), and a null pointer or a handle that names
//! nothing live is refused with a code. Handles are numbers never reused,
//! so a stale one is refused instead of reaching something made later.
//! Every call may be made from any thread.
//!
//! The engine underneath is the `orbitte` facade's, used through its
//! public API only; the `unsafe` of the C boundary lives in `args.rs`
//! (reading and writing the caller's pointers) and `memory.rs` (wrapping
//! the caller's memory).

// The names are C's (`orbitte_engine`, `orbitte_reg`, ...).
#![allow(non_camel_case_types)]

mod args;
mod cma;
mod engine;
mod handle;
mod memory;
mod notify;
mod status;
mod xfer;

pub use engine::{
    ORBITTE_ENGINE_CMA, ORBITTE_ENGINE_RDMA, ORBITTE_ENGINE_TOKEN, orbitte_conn_info,
    orbitte_connect, orbitte_disconnect, orbitte_engine_create, orbitte_engine_destroy,
    orbitte_metrics, orbitte_peer_cma,
};
pub use handle::{orbitte_engine, orbitte_peer, orbitte_reg, orbitte_xfer};
pub use memory::{
    ORBITTE_REG_REMOTE, orbitte_alloc, orbitte_cuda_devices, orbitte_deregister,
    orbitte_load_remote, orbitte_public_data, orbitte_register, orbitte_register_device,
    orbitte_unload_remote,
};
pub use notify::{orbitte_notif_poll, orbitte_notify};
pub use status::*;
pub use xfer::*;

/// Why the kernel refuses the same-host copies of `ORBITTE_ENGINE_CMA`
/// between processes of one uid here (Yama's `ptrace_scope` above 0), or
/// `None` when it allows them. Rust only (tests and tools ask it).
pub fn same_host_copies_refused() -> Option<String> {
    cma::kernel_refuses()
}
