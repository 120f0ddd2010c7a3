//! The native protection domain: registers memory regions and creates
//! queue pairs.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use orbitte_memory::DmaBuffer;
use orbitte_verbs_sys::Verbs;
use orbitte_verbs_sys::bindings as b;

use super::cq::NativeCq;
use super::mr::NativeMr;
use super::os::{errno, rc_check};
use super::qp::{NativeQp, Scratch};
use crate::backend::{CqOps, Destroy, MrOps, PdOps, QpOps};
use crate::error::{CreateQpError, NativeError, RegisterError};
use crate::types::{Access, DeviceIdentity, QpCaps};

#[derive(Debug)]
pub(super) struct NativePd {
    pub(super) verbs: Arc<Verbs>,
    pub(super) pd: NonNull<b::ibv_pd>,
    pub(super) identity: DeviceIdentity,
}

// SAFETY: a PD is used only through thread-safe verbs; the handle layer
// keeps it (and its context) alive while used.
unsafe impl Send for NativePd {}
// SAFETY: as for Send.
unsafe impl Sync for NativePd {}

impl Destroy for NativePd {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once, after its MRs and QPs were destroyed.
        let rc = unsafe { (self.verbs.ibv_dealloc_pd)(self.pd.as_ptr()) };
        rc_check("ibv_dealloc_pd", rc)
    }
}

impl PdOps for NativePd {
    fn register(
        &self,
        buf: &Arc<dyn DmaBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, RegisterError> {
        // The handle layer checked `offset + len <= buf.len()`.
        let addr = buf.as_ptr().wrapping_add(offset).cast();
        // SAFETY: a live PD; the range lies inside `buf`, which the memory
        // region handle keeps alive (and retains if dereg fails), so it
        // stays mapped until the MR is deregistered.
        let raw = unsafe {
            self.verbs
                .reg_mr(self.pd.as_ptr(), addr, len, access.bits())
        };
        let Some(mr) = NonNull::new(raw) else {
            return Err(RegisterError::Native {
                device: self.identity.clone(),
                len,
                source: NativeError::new("ibv_reg_mr", errno()),
            });
        };
        Ok(Box::new(NativeMr {
            verbs: self.verbs.clone(),
            mr,
        }))
    }

    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        caps: &QpCaps,
    ) -> Result<Box<dyn QpOps>, CreateQpError> {
        let cq_of = |cq: &dyn CqOps| cq.as_any().downcast_ref::<NativeCq>().map(|c| c.cq);
        let (Some(scq), Some(rcq)) = (cq_of(send_cq), cq_of(recv_cq)) else {
            return Err(CreateQpError::ForeignCq {
                cq_device: "sim".into(),
                pd_device: self.identity.name.clone(),
            });
        };
        let mut init = b::ibv_qp_init_attr {
            send_cq: scq.as_ptr(),
            recv_cq: rcq.as_ptr(),
            cap: b::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: caps.max_recv_sge,
                max_inline_data: 0,
            },
            qp_type: b::IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: a live PD and CQs of the same context (checked by the
        // handle layer, which also keeps them alive longer than the QP).
        let raw = unsafe { (self.verbs.ibv_create_qp)(self.pd.as_ptr(), &mut init) };
        let Some(qp) = NonNull::new(raw) else {
            return Err(CreateQpError::Native {
                device: self.identity.clone(),
                source: NativeError::new("ibv_create_qp", errno()),
            });
        };
        // SAFETY: a live QP; qp_num is a plain field.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Box::new(NativeQp {
            verbs: self.verbs.clone(),
            qp,
            qpn,
            caps: *caps,
            port: std::sync::atomic::AtomicU8::new(1),
            scratch: Mutex::new(Scratch::default()),
        }))
    }
}
