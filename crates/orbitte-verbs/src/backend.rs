//! The object-safe traits each provider implements behind the handles.
//!
//! Crate-private: the public surface is [`crate::Provider`] plus the
//! handles, which own the backend objects and enforce teardown order. A
//! backend object never destroys itself on drop; the handle layer calls
//! `destroy` exactly once and retains the object if that fails.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use orbitte_memory::DmaBuffer;

use crate::error::{
    AllocPdError, AsyncEventError, CreateCqError, CreateQpError, ModifyError, NativeError,
    PollError, PostError, QueryError, RegisterError, WaitError,
};
use crate::types::{
    Access, AsyncEvent, DeviceAttr, GidEntry, InitAttrs, PortAttr, QpCaps, QpState, RtrAttrs,
    RtsAttrs,
};
use crate::wr::{Completion, RecvWr, SendWr};

/// Explicit destruction, called once by the handle layer.
pub(crate) trait Destroy: Send + Sync + Debug + 'static {
    /// Destroys the native object. On error the object is still alive and
    /// the caller retains it.
    fn destroy(&self) -> Result<(), NativeError>;
}

pub(crate) trait ContextOps: Destroy {
    fn query_device(&self) -> Result<DeviceAttr, QueryError>;
    fn query_port(&self, port: u8) -> Result<PortAttr, QueryError>;
    fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, QueryError>;
    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, AllocPdError>;
    fn create_cq(&self, depth: u32) -> Result<Box<dyn CqOps>, CreateCqError>;
    fn next_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>, AsyncEventError>;
}

pub(crate) trait PdOps: Destroy {
    fn register(
        &self,
        buf: &Arc<dyn DmaBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, RegisterError>;
    fn create_qp(
        &self,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        caps: &QpCaps,
    ) -> Result<Box<dyn QpOps>, CreateQpError>;
}

pub(crate) trait MrOps: Destroy {
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
}

pub(crate) trait CqOps: Destroy {
    fn as_any(&self) -> &dyn Any;
    fn poll(&self, out: &mut [Completion]) -> Result<usize, PollError>;
    fn wait(&self, timeout: Duration) -> Result<bool, WaitError>;
}

/// A requested state change.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transition {
    Init(InitAttrs),
    Rtr(RtrAttrs),
    Rts(RtsAttrs),
    Error,
}

impl Transition {
    pub(crate) fn target(&self) -> QpState {
        match self {
            Self::Init(_) => QpState::Init,
            Self::Rtr(_) => QpState::Rtr,
            Self::Rts(_) => QpState::Rts,
            Self::Error => QpState::Error,
        }
    }
}

pub(crate) trait QpOps: Destroy {
    fn qp_num(&self) -> u32;
    fn modify(&self, t: &Transition) -> Result<(), ModifyError>;
    fn state(&self) -> Result<QpState, QueryError>;
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError>;
}
