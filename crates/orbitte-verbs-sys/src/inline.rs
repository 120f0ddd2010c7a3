//! The `static inline` verbs of `<infiniband/verbs.h>` that jump through
//! the provider's `ops` table, written again in Rust exactly as the C does
//! (rdma-core 44.0). They have no exported symbol, so a run-time loaded
//! library cannot provide them.
//!
//! One difference from C: where C would call a NULL op and crash, these
//! return an error code (`EOPNOTSUPP`, or `-EOPNOTSUPP` from
//! [`ibv_poll_cq`]).

use core::ffi::c_int;

use crate::bindings::{
    ibv_context, ibv_cq, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc, verbs_context,
};

/// `ibv_post_send`: posts a chain of send work requests (one doorbell).
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request
/// that was not posted.
///
/// # Safety
///
/// `qp` must point to a live `ibv_qp` created by libibverbs (or a struct
/// with the same layout whose `context` and `ops` are valid); `wr` must
/// point to a valid chain of `ibv_send_wr` whose scatter lists stay valid
/// for the call; `bad_wr` must be valid for a write. The caller serializes
/// posting on one QP as the provider requires.
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` and its `context` are valid; the
    // op is the provider's, called with the arguments C passes it.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(post_send) => post_send(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_recv`: posts a chain of receive work requests.
///
/// Returns 0, or an errno value with `*bad_wr` set.
///
/// # Safety
///
/// As [`ibv_post_send`], for `ibv_recv_wr` chains.
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees `qp` and its `context` are valid.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(post_recv) => post_recv(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_poll_cq`: reaps up to `num_entries` completions into `wc`.
///
/// Returns the number reaped (0 when the CQ is empty) or a negative value
/// on failure.
///
/// # Safety
///
/// `cq` must point to a live `ibv_cq` (with a valid `context`), and `wc`
/// must be valid for writing `num_entries` `ibv_wc` values. The caller
/// serializes polling on one CQ.
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller guarantees `cq`, its `context` and `wc` are valid.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(poll_cq) => poll_cq(cq, num_entries, wc),
            None => -libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_req_notify_cq`: arms the CQ so the next completion (only a
/// solicited one when `solicited_only` is non-zero) raises an event on its
/// completion channel.
///
/// Returns 0 or an errno value.
///
/// # Safety
///
/// `cq` must point to a live `ibv_cq` with a valid `context`.
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller guarantees `cq` and its `context` are valid.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(req_notify_cq) => req_notify_cq(cq, solicited_only),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `verbs_get_ctx`: the extended `verbs_context` around `ctx`, or NULL when
/// the provider only filled the legacy `ibv_context` (its `abi_compat` is
/// not the "extended" marker `UINTPTR_MAX`).
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` returned by `ibv_open_device`
/// (libibverbs allocates it as the last member of a `verbs_context`
/// whenever `abi_compat` carries the marker).
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: the caller guarantees `ctx` is valid for reads.
    let abi_compat = unsafe { (*ctx).abi_compat };
    if abi_compat as usize != usize::MAX {
        return core::ptr::null_mut();
    }
    let offset = core::mem::offset_of!(verbs_context, context);
    // SAFETY: with the marker set, `ctx` is the `context` member of a
    // `verbs_context`, so stepping back by its offset stays inside that
    // allocation (C's `container_of`).
    unsafe { ctx.byte_sub(offset).cast::<verbs_context>() }
}

/// Whether the extended context `vctx` provides the op at byte offset
/// `op_offset`: `verbs_get_ctx_op`'s size test. The op's own NULL test is
/// the caller's.
///
/// # Safety
///
/// `vctx` must be NULL or returned by [`verbs_get_ctx`] for a live context.
pub(crate) unsafe fn verbs_context_has(vctx: *mut verbs_context, op_offset: usize) -> bool {
    if vctx.is_null() {
        return false;
    }
    // SAFETY: the caller guarantees a non-null `vctx` is a live
    // `verbs_context`; `sz` sits just before `context`, so it is in the part
    // every provider allocates.
    let sz = unsafe { (*vctx).sz };
    sz >= size_of::<verbs_context>() - op_offset
}
