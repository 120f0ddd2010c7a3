//! The native memory region: an `ibv_mr`, its keys and its deregistration.

use std::ptr::NonNull;
use std::sync::Arc;

use orbitte_verbs_sys::Verbs;
use orbitte_verbs_sys::bindings as b;

use super::os::rc_check;
use crate::backend::{Destroy, MrOps};
use crate::error::NativeError;

#[derive(Debug)]
pub(super) struct NativeMr {
    pub(super) verbs: Arc<Verbs>,
    pub(super) mr: NonNull<b::ibv_mr>,
}

// SAFETY: an MR is only read (keys) and deregistered once; verbs are
// thread safe.
unsafe impl Send for NativeMr {}
// SAFETY: as for Send.
unsafe impl Sync for NativeMr {}

impl Destroy for NativeMr {
    fn destroy(&self) -> Result<(), NativeError> {
        // SAFETY: called once; the handle layer keeps the buffer alive
        // until this succeeds (and forever if it fails).
        let rc = unsafe { (self.verbs.ibv_dereg_mr)(self.mr.as_ptr()) };
        rc_check("ibv_dereg_mr", rc)
    }
}

impl MrOps for NativeMr {
    fn lkey(&self) -> u32 {
        // SAFETY: a live MR; lkey is a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: a live MR; rkey is a plain field.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}
