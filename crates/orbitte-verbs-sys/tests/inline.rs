//! The inline verbs dispatch through the provider's `ops` table exactly as
//! C's do: proven with a fake provider (a context whose ops are test
//! functions), no hardware needed.

use core::ffi::c_int;
use core::ptr::{addr_of_mut, null_mut};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use orbitte_verbs_sys::bindings::*;
use orbitte_verbs_sys::{
    ibv_poll_cq, ibv_post_recv, ibv_post_send, ibv_req_notify_cq, verbs_get_ctx,
};

/// wr_id of the last request the fake post_send saw, and the chain length.
static SENT_WR_ID: AtomicU64 = AtomicU64::new(0);
static SENT_CHAIN: AtomicU64 = AtomicU64::new(0);
static NOTIFY_SOLICITED: AtomicI32 = AtomicI32::new(-1);

/// Accepts a chain of send requests, except one whose wr_id is 13: that
/// one is refused with ENOMEM and reported through `bad_wr`, as providers do.
unsafe extern "C" fn fake_post_send(
    _qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let mut n = 0;
    while !wr.is_null() {
        // SAFETY: the test passes valid chains.
        let r = unsafe { &*wr };
        if r.wr_id == 13 {
            // SAFETY: `bad_wr` is the caller's valid out-pointer.
            unsafe { *bad_wr = wr };
            return libc::ENOMEM;
        }
        SENT_WR_ID.store(r.wr_id, Ordering::SeqCst);
        n += 1;
        wr = r.next;
    }
    SENT_CHAIN.store(n, Ordering::SeqCst);
    0
}

unsafe extern "C" fn fake_post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    _bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the test passes a valid request.
    i32::try_from(unsafe { (*wr).wr_id }).unwrap_or(-1)
}

/// Reaps two completions (wr_id 100 and 101, the second a retry error)
/// whatever the CQ holds, or fewer when asked for fewer.
unsafe extern "C" fn fake_poll_cq(_cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let n = num_entries.min(2);
    for i in 0..n {
        // SAFETY: the caller provides room for `num_entries` completions.
        let slot = unsafe { &mut *wc.add(i as usize) };
        slot.wr_id = 100 + i as u64;
        slot.status = if i == 0 {
            IBV_WC_SUCCESS
        } else {
            IBV_WC_RETRY_EXC_ERR
        };
        slot.opcode = IBV_WC_RDMA_WRITE;
    }
    n
}

unsafe extern "C" fn fake_req_notify_cq(_cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    NOTIFY_SOLICITED.store(solicited_only, Ordering::SeqCst);
    0
}

fn fake_context() -> Box<ibv_context> {
    let mut ctx = Box::<ibv_context>::default();
    ctx.ops.post_send = Some(fake_post_send);
    ctx.ops.post_recv = Some(fake_post_recv);
    ctx.ops.poll_cq = Some(fake_poll_cq);
    ctx.ops.req_notify_cq = Some(fake_req_notify_cq);
    ctx
}

#[test]
fn post_send_dispatches_through_ops_and_reports_bad_wr() {
    let mut ctx = fake_context();
    let mut qp = ibv_qp {
        context: &mut *ctx,
        ..Default::default()
    };
    let mut second = ibv_send_wr {
        wr_id: 8,
        ..Default::default()
    };
    let mut first = ibv_send_wr {
        wr_id: 7,
        next: &mut second,
        ..Default::default()
    };
    let mut bad: *mut ibv_send_wr = null_mut();
    // SAFETY: qp, its context and the chain are valid for the call.
    let rc = unsafe { ibv_post_send(&mut qp, &mut first, &mut bad) };
    assert_eq!(rc, 0);
    assert_eq!(SENT_CHAIN.load(Ordering::SeqCst), 2);
    assert_eq!(SENT_WR_ID.load(Ordering::SeqCst), 8);
    assert!(bad.is_null());

    let mut refused = ibv_send_wr {
        wr_id: 13,
        ..Default::default()
    };
    // SAFETY: as above.
    let rc = unsafe { ibv_post_send(&mut qp, &mut refused, &mut bad) };
    assert_eq!(rc, libc::ENOMEM);
    assert_eq!(bad, addr_of_mut!(refused));
}

#[test]
fn post_recv_dispatches_through_ops() {
    let mut ctx = fake_context();
    let mut qp = ibv_qp {
        context: &mut *ctx,
        ..Default::default()
    };
    let mut wr = ibv_recv_wr {
        wr_id: 42,
        ..Default::default()
    };
    let mut bad = null_mut();
    // SAFETY: qp, its context and the request are valid for the call.
    assert_eq!(unsafe { ibv_post_recv(&mut qp, &mut wr, &mut bad) }, 42);
}

#[test]
fn poll_cq_dispatches_through_ops_and_fills_completions() {
    let mut ctx = fake_context();
    let mut cq = ibv_cq {
        context: &mut *ctx,
        ..Default::default()
    };
    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: cq and its context are valid; `wc` has room for 4.
    let n = unsafe { ibv_poll_cq(&mut cq, 4, wc.as_mut_ptr()) };
    assert_eq!(n, 2);
    assert_eq!((wc[0].wr_id, wc[0].status), (100, IBV_WC_SUCCESS));
    assert_eq!((wc[1].wr_id, wc[1].status), (101, IBV_WC_RETRY_EXC_ERR));
    assert_eq!(wc[2].wr_id, 0, "only reaped entries are written");
    // SAFETY: as above, room for 1.
    assert_eq!(unsafe { ibv_poll_cq(&mut cq, 1, wc.as_mut_ptr()) }, 1);
}

#[test]
fn req_notify_cq_dispatches_through_ops() {
    let mut ctx = fake_context();
    let mut cq = ibv_cq {
        context: &mut *ctx,
        ..Default::default()
    };
    // SAFETY: cq and its context are valid.
    assert_eq!(unsafe { ibv_req_notify_cq(&mut cq, 1) }, 0);
    assert_eq!(NOTIFY_SOLICITED.load(Ordering::SeqCst), 1);
}

#[test]
fn a_missing_op_is_an_error_not_a_null_call() {
    let mut ctx = Box::<ibv_context>::default();
    let mut qp = ibv_qp {
        context: &mut *ctx,
        ..Default::default()
    };
    let mut cq = ibv_cq {
        context: &mut *ctx,
        ..Default::default()
    };
    let mut wr = ibv_send_wr::default();
    let mut bad = null_mut();
    let mut wc = [ibv_wc::default(); 1];
    // SAFETY: all pointers are valid; the ops are NULL on purpose.
    unsafe {
        assert_eq!(ibv_post_send(&mut qp, &mut wr, &mut bad), libc::EOPNOTSUPP);
        assert_eq!(ibv_poll_cq(&mut cq, 1, wc.as_mut_ptr()), -libc::EOPNOTSUPP);
        assert_eq!(ibv_req_notify_cq(&mut cq, 0), libc::EOPNOTSUPP);
    }
}

#[test]
fn verbs_get_ctx_finds_the_extended_context_only_with_the_marker() {
    let mut vctx = Box::<verbs_context>::default();
    vctx.sz = size_of::<verbs_context>();
    vctx.context.abi_compat = usize::MAX as *mut core::ffi::c_void;
    let outer: *mut verbs_context = &mut *vctx;
    // SAFETY: the context is the last member of a live verbs_context.
    assert_eq!(unsafe { verbs_get_ctx(&mut vctx.context) }, outer);
    vctx.context.abi_compat = null_mut();
    // SAFETY: as above; without the marker it must not step outside.
    assert!(unsafe { verbs_get_ctx(&mut vctx.context) }.is_null());
}
