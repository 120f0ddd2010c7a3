//! Protection domain: the scope of memory regions and queue pairs.

use std::ops::Range;
use std::sync::Arc;

use orbitte_memory::DmaBuffer;

use crate::backend::PdOps;
use crate::context::{Context, unreachable_ops};
use crate::cq::CompletionQueue;
use crate::error::{CreateQpError, ObjectKind, RegisterError, Unquiesced};
use crate::mr::MemoryRegion;
use crate::qp::QueuePair;
use crate::qp_state::Reset;
use crate::retain::Node;
use crate::types::{Access, QpCaps};

/// A protection domain. Cheap to clone; MRs and QPs hold a clone.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

#[derive(Debug)]
pub(crate) struct PdInner {
    /// Declared first: destroyed before `context` is released.
    node: Node<dyn PdOps>,
    context: Context,
}

static PD_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ProtectionDomain {
    pub(crate) fn new(context: Context, ops: Box<dyn PdOps>) -> Self {
        let seq = PD_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let node = Node::new(
            ops,
            Box::new(context.clone()),
            ObjectKind::ProtectionDomain,
            format!("pd#{seq}"),
            context.identity().clone(),
        );
        Self {
            inner: Arc::new(PdInner { node, context }),
        }
    }

    pub(crate) fn ops(&self) -> &dyn PdOps {
        self.inner.node.ops().unwrap_or_else(|| unreachable_ops())
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// Whether two handles name the same PD.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Registers `range` of `buffer` with `access`.
    ///
    /// Safe: the memory region keeps `buffer` alive until the region is
    /// destroyed (or forever, if the destroy fails), so the NIC never
    /// touches freed memory. `Access::local_only()` for ranges only this
    /// host's NIC touches; `Access::remote_read_write()` (or a subset) for
    /// ranges peers access with the region's rkey.
    pub fn register(
        &self,
        buffer: Arc<dyn DmaBuffer>,
        range: Range<usize>,
        access: Access,
    ) -> Result<MemoryRegion, RegisterError> {
        let len = buffer.len();
        if range.start >= range.end || range.end > len {
            return Err(RegisterError::OutOfRange {
                start: range.start,
                end: range.end,
                len,
            });
        }
        if !access.is_valid() {
            return Err(RegisterError::InvalidAccess { access });
        }
        let writes = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if access.bits() & writes.bits() != 0 && !buffer.is_writable() {
            return Err(RegisterError::ReadOnlyBuffer { access });
        }
        let ops = self
            .ops()
            .register(&buffer, range.start, range.end - range.start, access)?;
        Ok(MemoryRegion::new(self.clone(), ops, buffer, range, access))
    }

    /// Creates an RC queue pair in the RESET state. Both CQs must belong to
    /// this PD's context. Send completions are selective: only signaled
    /// work requests (and errors) produce them.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<QueuePair<Reset>, CreateQpError> {
        for cq in [send_cq, recv_cq] {
            if !Arc::ptr_eq(&cq.context().inner, &self.context().inner) {
                return Err(CreateQpError::ForeignCq {
                    cq_device: cq.context().identity().name.clone(),
                    pd_device: self.context().identity().name.clone(),
                });
            }
        }
        let ops = self.ops().create_qp(send_cq.ops(), recv_cq.ops(), &caps)?;
        Ok(QueuePair::new(
            self.clone(),
            send_cq.clone(),
            recv_cq.clone(),
            ops,
            caps,
        ))
    }

    /// Registers `range` of `buffer` and leaks the memory region on
    /// purpose: no handle owns it, so it is never deregistered, and the
    /// buffer stays alive for the rest of the process. The device then
    /// refuses to destroy this PD (EBUSY on real verbs and on the sim):
    /// the way tests provoke a native destroy failure on hardware. Returns
    /// the region's lkey.
    #[cfg(feature = "testing")]
    pub fn leak_registration(
        &self,
        buffer: Arc<dyn DmaBuffer>,
        range: Range<usize>,
        access: Access,
    ) -> Result<u32, RegisterError> {
        if range.start >= range.end || range.end > buffer.len() {
            return Err(RegisterError::OutOfRange {
                start: range.start,
                end: range.end,
                len: buffer.len(),
            });
        }
        // Only the native region and the buffer are leaked: the PD handle
        // is not kept, so closing it reaches the device.
        let ops = self
            .ops()
            .register(&buffer, range.start, range.end - range.start, access)?;
        let lkey = ops.lkey();
        std::mem::forget(ops);
        std::mem::forget(buffer);
        Ok(lkey)
    }

    /// Deallocates now. Fails with [`Unquiesced`] if MRs/QPs (or clones)
    /// still hold it, or if the native dealloc fails (then retained).
    pub fn close(self) -> Result<(), Unquiesced> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.node.close(),
            Err(arc) => Err(arc.node.in_use(Arc::strong_count(&arc) - 1)),
        }
    }
}
