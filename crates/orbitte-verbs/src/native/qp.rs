//! The native RC queue pair: state transitions and posting.

use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};

use orbitte_verbs_sys::bindings as b;
use orbitte_verbs_sys::{self as sys, Verbs};

use super::os::{rc_check, rc_errno};
use crate::backend::{Destroy, QpOps, Transition};
use crate::error::{ModifyError, NativeError, PostError, PostErrorKind, QueryError};
use crate::types::{DeviceIdentity, QpCaps, QpState, Route};
use crate::wr::{RecvWr, SendOp, SendWr, Sge};

// `Sge` is handed to the NIC as `ibv_sge` without copying.
const _: () = {
    assert!(size_of::<Sge>() == size_of::<b::ibv_sge>());
    assert!(align_of::<Sge>() == align_of::<b::ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(b::ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, length) == std::mem::offset_of!(b::ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(b::ibv_sge, lkey));
};

/// Reused arrays of native work requests (no allocation per post once
/// grown).
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) send: Vec<b::ibv_send_wr>,
    pub(super) recv: Vec<b::ibv_recv_wr>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("send_cap", &self.send.capacity())
            .finish()
    }
}

#[derive(Debug)]
pub(super) struct NativeQp {
    pub(super) verbs: Arc<Verbs>,
    pub(super) qp: NonNull<b::ibv_qp>,
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
    /// Port from INIT, needed again for the RTR address vector.
    pub(super) port: std::sync::atomic::AtomicU8,
    /// Serializes posting (the public API already posts through `&mut`).
    pub(super) scratch: Mutex<Scratch>,
}

// SAFETY: posting is serialized by `scratch`; the raw WR arrays inside it
// point only at caller slices during a post call; other verbs are thread
// safe; destroy happens once with no other user.
unsafe impl Send for NativeQp {}
// SAFETY: as for Send.
unsafe impl Sync for NativeQp {}

impl Destroy for NativeQp {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once; async events of the QP were acknowledged
        // when read.
        let rc = unsafe { (self.verbs.ibv_destroy_qp)(self.qp.as_ptr()) };
        rc_check("ibv_destroy_qp", rc)
    }
}

impl NativeQp {
    fn post_error(&self, index: usize, rc: i32, call: &'static str, depth: u32) -> PostError {
        let errno = rc_errno(rc);
        let kind = if errno == libc::ENOMEM {
            PostErrorKind::QueueFull { depth }
        } else {
            PostErrorKind::Native(NativeError::new(call, errno))
        };
        PostError {
            qpn: self.qpn,
            index,
            kind,
        }
    }

    /// Links the native work requests in `list` into one chain (each
    /// `next` points at the following entry; the last keeps its null) and
    /// hands its head and the bad-request out pointer to `post` (the verbs
    /// call `call`); a refusal names the position of the request the
    /// provider stopped at (the first when it named none), `depth` being
    /// the queue's depth for a full queue.
    fn post_chain<T>(
        &self,
        list: &mut Vec<T>,
        next: impl Fn(&mut T) -> &mut *mut T,
        call: &'static str,
        depth: u32,
        post: impl FnOnce(*mut T, &mut *mut T) -> i32,
    ) -> Result<(), PostError> {
        let base = list.as_mut_ptr();
        for i in 1..list.len() {
            *next(&mut list[i - 1]) = base.wrapping_add(i);
        }
        let mut bad = ptr::null_mut();
        let rc = post(base, &mut bad);
        if rc == 0 {
            return Ok(());
        }
        let index = if bad.is_null() {
            0
        } else {
            (bad as usize - base as usize) / size_of::<T>()
        };
        Err(self.post_error(index, rc, call, depth))
    }

    /// Posts with `post` the longest prefix of `wrs` whose SGE lists fit
    /// `max_sge` (when not empty), then refuses the first work request that
    /// does not fit: verbs would fail the whole chain at that entry anyway.
    fn post_fitting<W>(
        &self,
        wrs: &[W],
        sges: impl Fn(&W) -> usize,
        max_sge: u32,
        post: impl FnOnce(&[W]) -> Result<(), PostError>,
    ) -> Result<(), PostError> {
        let bad = wrs.iter().position(|w| sges(w) > max_sge as usize);
        let ok = &wrs[..bad.unwrap_or(wrs.len())];
        if !ok.is_empty() {
            post(ok)?;
        }
        match bad {
            Some(index) => Err(PostError {
                qpn: self.qpn,
                index,
                kind: PostErrorKind::TooManySges {
                    sges: sges(&wrs[index]),
                    max: max_sge,
                },
            }),
            None => Ok(()),
        }
    }
}

impl QpOps for NativeQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, t: &Transition) -> Result<(), ModifyError> {
        use std::sync::atomic::Ordering;
        let mut a = b::ibv_qp_attr::default();
        let mask = match *t {
            Transition::Init(i) => {
                a.qp_state = b::IBV_QPS_INIT;
                a.pkey_index = i.pkey_index;
                a.port_num = i.port;
                a.qp_access_flags = i.access.bits();
                self.port.store(i.port, Ordering::Relaxed);
                b::IBV_QP_STATE | b::IBV_QP_PKEY_INDEX | b::IBV_QP_PORT | b::IBV_QP_ACCESS_FLAGS
            }
            Transition::Rtr(r) => {
                a.qp_state = b::IBV_QPS_RTR;
                a.path_mtu = r.path_mtu.as_raw();
                a.dest_qp_num = r.remote.qpn;
                a.rq_psn = r.remote.psn & 0x00ff_ffff;
                a.max_dest_rd_atomic = r.max_dest_rd_atomic;
                a.min_rnr_timer = r.min_rnr_timer;
                a.ah_attr.port_num = self.port.load(Ordering::Relaxed);
                match r.remote.route {
                    Route::Lid(lid) => a.ah_attr.dlid = lid,
                    Route::Gid(gid) => {
                        a.ah_attr.is_global = 1;
                        a.ah_attr.grh.dgid.raw = gid.0;
                        a.ah_attr.grh.sgid_index = r.sgid_index;
                        a.ah_attr.grh.hop_limit = r.hop_limit;
                    }
                }
                b::IBV_QP_STATE
                    | b::IBV_QP_AV
                    | b::IBV_QP_PATH_MTU
                    | b::IBV_QP_DEST_QPN
                    | b::IBV_QP_RQ_PSN
                    | b::IBV_QP_MAX_DEST_RD_ATOMIC
                    | b::IBV_QP_MIN_RNR_TIMER
            }
            Transition::Rts(s) => {
                a.qp_state = b::IBV_QPS_RTS;
                a.sq_psn = s.sq_psn & 0x00ff_ffff;
                a.timeout = s.timeout;
                a.retry_cnt = s.retry_cnt;
                a.rnr_retry = s.rnr_retry;
                a.max_rd_atomic = s.max_rd_atomic;
                b::IBV_QP_STATE
                    | b::IBV_QP_SQ_PSN
                    | b::IBV_QP_TIMEOUT
                    | b::IBV_QP_RETRY_CNT
                    | b::IBV_QP_RNR_RETRY
                    | b::IBV_QP_MAX_QP_RD_ATOMIC
            }
            Transition::Error => {
                a.qp_state = b::IBV_QPS_ERR;
                b::IBV_QP_STATE
            }
        };
        // SAFETY: a live QP and a fully initialized attr for this mask.
        let rc = unsafe { (self.verbs.ibv_modify_qp)(self.qp.as_ptr(), &mut a, mask as i32) };
        if rc != 0 {
            return Err(ModifyError::Native {
                qpn: self.qpn,
                to: t.target(),
                source: NativeError::new("ibv_modify_qp", rc_errno(rc)),
            });
        }
        Ok(())
    }

    fn state(&self) -> Result<QpState, QueryError> {
        let mut a = b::ibv_qp_attr::default();
        let mut init = b::ibv_qp_init_attr::default();
        // SAFETY: a live QP; writable attr structs.
        let rc = unsafe {
            (self.verbs.ibv_query_qp)(self.qp.as_ptr(), &mut a, b::IBV_QP_STATE as i32, &mut init)
        };
        if rc != 0 {
            // SAFETY: a live QP; context and device pointers are set by
            // libibverbs for its lifetime.
            let name = unsafe { super::c_field(&(*(*(*self.qp.as_ptr()).context).device).name) };
            return Err(QueryError::Native {
                device: DeviceIdentity {
                    provider: crate::ProviderKind::Native,
                    name,
                    guid: 0,
                },
                source: NativeError::new("ibv_query_qp", rc_errno(rc)),
            });
        }
        Ok(QpState::from_raw(a.qp_state))
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let max = self.caps.max_send_sge;
        self.post_fitting(
            wrs,
            |w| w.sges.len(),
            max,
            |ok| {
                let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                let list = &mut scratch.send;
                list.clear();
                for w in ok {
                    let mut n = b::ibv_send_wr {
                        wr_id: w.wr_id,
                        // The NIC only reads the SGEs; `Sge` is layout-identical
                        // to `ibv_sge` (asserted above).
                        sg_list: w.sges.as_ptr().cast_mut().cast(),
                        num_sge: w.sges.len() as i32,
                        send_flags: if w.signaled { b::IBV_SEND_SIGNALED } else { 0 },
                        ..Default::default()
                    };
                    match w.op {
                        SendOp::Write { remote, imm } => {
                            n.opcode = if imm.is_some() {
                                b::IBV_WR_RDMA_WRITE_WITH_IMM
                            } else {
                                b::IBV_WR_RDMA_WRITE
                            };
                            n.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
                            n.wr.rdma = b::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                                remote_addr: remote.addr,
                                rkey: remote.rkey,
                            };
                        }
                        SendOp::Read { remote } => {
                            n.opcode = b::IBV_WR_RDMA_READ;
                            n.wr.rdma = b::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                                remote_addr: remote.addr,
                                rkey: remote.rkey,
                            };
                        }
                        SendOp::Send { imm } => {
                            n.opcode = if imm.is_some() {
                                b::IBV_WR_SEND_WITH_IMM
                            } else {
                                b::IBV_WR_SEND
                            };
                            n.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
                        }
                    }
                    list.push(n);
                }
                let depth = self.caps.max_send_wr;
                self.post_chain(
                    list,
                    |w| &mut w.next,
                    "ibv_post_send",
                    depth,
                    |head, bad| {
                        // SAFETY: a live QP (in any state: the device reports a
                        // bad state as an error code); a valid chain whose SGE
                        // lists borrow `wrs`, alive for the call; posting is
                        // serialized by the lock.
                        unsafe { sys::ibv_post_send(self.qp.as_ptr(), head, bad) }
                    },
                )
            },
        )
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let max = self.caps.max_recv_sge;
        self.post_fitting(
            wrs,
            |w| w.sges.len(),
            max,
            |ok| {
                let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
                let list = &mut scratch.recv;
                list.clear();
                for w in ok {
                    list.push(b::ibv_recv_wr {
                        wr_id: w.wr_id,
                        next: ptr::null_mut(),
                        sg_list: w.sges.as_ptr().cast_mut().cast(),
                        num_sge: w.sges.len() as i32,
                    });
                }
                let depth = self.caps.max_recv_wr;
                self.post_chain(
                    list,
                    |w| &mut w.next,
                    "ibv_post_recv",
                    depth,
                    |head, bad| {
                        // SAFETY: as in post_send, for the receive chain.
                        unsafe { sys::ibv_post_recv(self.qp.as_ptr(), head, bad) }
                    },
                )
            },
        )
    }
}
