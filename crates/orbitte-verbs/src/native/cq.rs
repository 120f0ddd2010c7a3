//! The native completion queue with its completion channel: polling,
//! arming and waiting.

use std::any::Any;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitte_verbs_sys::bindings as b;
use orbitte_verbs_sys::{self as sys, Verbs};

use super::os::{rc_check, rc_errno, wait_readable};
use crate::backend::{CqOps, Destroy};
use crate::error::{NativeError, PollError, WaitError};
use crate::wr::{Completion, WcOpcode, WcStatus};

#[derive(Debug)]
pub(super) struct NativeCq {
    pub(super) verbs: Arc<Verbs>,
    pub(super) cq: NonNull<b::ibv_cq>,
    pub(super) channel: NonNull<b::ibv_comp_channel>,
    pub(super) fd: RawFd,
    /// A completion `wait` polled while closing the arm/arrive race; the
    /// next `poll` returns it first. The lock also serializes polling.
    pub(super) stash: Mutex<Option<Completion>>,
}

// SAFETY: polling and arming are serialized by `stash`; destroy happens
// once with no other user (ownership).
unsafe impl Send for NativeCq {}
// SAFETY: as for Send.
unsafe impl Sync for NativeCq {}

fn completion(wc: &b::ibv_wc) -> Completion {
    let status = WcStatus::from_raw(wc.status);
    let ok = status.is_success();
    // The immediate belongs to the receiver: only receive completions
    // define it. A requester's completion of a SEND or WRITE with
    // immediate may carry IBV_WC_WITH_IMM with an undefined value (mlx5,
    // rxe), so it is never reported there.
    let receive = matches!(wc.opcode, b::IBV_WC_RECV | b::IBV_WC_RECV_RDMA_WITH_IMM);
    let imm = (ok && receive && wc.wc_flags & b::IBV_WC_WITH_IMM != 0)
        // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
        .then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
    Completion {
        wr_id: wc.wr_id,
        status,
        opcode: ok.then(|| WcOpcode::from_raw(wc.opcode)),
        byte_len: if ok { wc.byte_len } else { 0 },
        imm,
        qp_num: wc.qp_num,
        vendor_err: wc.vendor_err,
    }
}

impl NativeCq {
    fn poll_raw(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        const CHUNK: usize = 16;
        let mut wcs = [b::ibv_wc::default(); CHUNK];
        let mut n = 0;
        while n < out.len() {
            let want = (out.len() - n).min(CHUNK);
            // SAFETY: a live CQ; `wcs` has room for `want` entries; polling
            // is serialized by the caller holding `stash`.
            let rc = unsafe { sys::ibv_poll_cq(self.cq.as_ptr(), want as i32, wcs.as_mut_ptr()) };
            if rc < 0 {
                return Err(PollError::Native(NativeError::new(
                    "ibv_poll_cq",
                    rc_errno(rc),
                )));
            }
            let got = rc as usize;
            for (o, wc) in out[n..].iter_mut().zip(&wcs[..got]) {
                *o = completion(wc);
            }
            n += got;
            if got < want {
                break;
            }
        }
        Ok(n)
    }
}

impl Destroy for NativeCq {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once, after every QP using the CQ was destroyed;
        // every channel event was acknowledged in `wait`.
        let rc = unsafe { (self.verbs.ibv_destroy_cq)(self.cq.as_ptr()) };
        rc_check("ibv_destroy_cq", rc)?;
        // SAFETY: the channel's only CQ is gone.
        let rc = unsafe { (self.verbs.ibv_destroy_comp_channel)(self.channel.as_ptr()) };
        rc_check("ibv_destroy_comp_channel", rc)
    }
}

impl CqOps for NativeCq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn poll(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        let mut stash = self.stash.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        if !out.is_empty()
            && let Some(c) = stash.take()
        {
            out[0] = c;
            n = 1;
        }
        Ok(n + self.poll_raw(&mut out[n..])?)
    }

    fn wait(&self, timeout: Duration) -> Result<bool, WaitError> {
        {
            let mut stash = self.stash.lock().unwrap_or_else(|e| e.into_inner());
            if stash.is_some() {
                return Ok(true);
            }
            // SAFETY: a live CQ with a completion channel.
            let rc = unsafe { sys::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
            if rc != 0 {
                return Err(WaitError::Native(NativeError::new(
                    "ibv_req_notify_cq",
                    rc_errno(rc),
                )));
            }
            // A completion that arrived before arming raises no event.
            let mut one = [Completion::default()];
            let got = self
                .poll_raw(&mut one)
                .map_err(|PollError::Native(e)| WaitError::Native(e))?;
            if got == 1 {
                *stash = Some(one[0]);
                return Ok(true);
            }
        }
        let ready = wait_readable(self.fd, timeout)
            .map_err(|e| WaitError::Native(NativeError::new("poll(comp_channel)", e)))?;
        if ready {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: a live, non-blocking channel; out pointers valid.
            let rc =
                unsafe { (self.verbs.ibv_get_cq_event)(self.channel.as_ptr(), &mut cq, &mut ctx) };
            if rc == 0 && !cq.is_null() {
                // SAFETY: acknowledges the one event just read on this CQ.
                unsafe { (self.verbs.ibv_ack_cq_events)(cq, 1) };
            }
        }
        Ok(ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(opcode: u32, status: u32, flags: u32) -> b::ibv_wc {
        let mut wc = b::ibv_wc {
            wr_id: 7,
            status,
            opcode,
            wc_flags: flags,
            byte_len: 16,
            qp_num: 3,
            ..Default::default()
        };
        wc.__bindgen_anon_1.imm_data = 0xdead_beef_u32.to_be();
        wc
    }

    /// The immediate is reported only for receive opcodes: a requester's
    /// completion with IBV_WC_WITH_IMM (mlx5, rxe) has an undefined value.
    #[test]
    fn immediate_only_in_receive_completions() {
        let with = b::IBV_WC_WITH_IMM;
        for (opcode, want) in [
            (b::IBV_WC_RECV, Some(0xdead_beef)),
            (b::IBV_WC_RECV_RDMA_WITH_IMM, Some(0xdead_beef)),
            (b::IBV_WC_SEND, None),
            (b::IBV_WC_RDMA_WRITE, None),
            (b::IBV_WC_RDMA_READ, None),
        ] {
            let c = completion(&wc(opcode, b::IBV_WC_SUCCESS, with));
            assert_eq!(c.imm, want, "opcode {opcode}");
            assert_eq!(c.opcode, Some(WcOpcode::from_raw(opcode)));
            assert_eq!((c.wr_id, c.byte_len, c.qp_num), (7, 16, 3));
        }
        // No flag: no immediate, even on a receive.
        assert_eq!(
            completion(&wc(b::IBV_WC_RECV, b::IBV_WC_SUCCESS, 0)).imm,
            None
        );
        // Error completions define nothing but the basics.
        let c = completion(&wc(b::IBV_WC_RECV, b::IBV_WC_WR_FLUSH_ERR, with));
        assert_eq!(
            (c.status, c.opcode, c.byte_len, c.imm),
            (WcStatus::WrFlush, None, 0, None)
        );
    }
}
