//! Memory region: registered memory with its keys.

use std::ops::Range;
use std::sync::Arc;

use orbitte_memory::DmaBuffer;

use crate::backend::MrOps;
use crate::context::unreachable_ops;
use crate::error::{ObjectKind, Unquiesced};
use crate::pd::ProtectionDomain;
use crate::retain::Node;
use crate::types::Access;
use crate::wr::{RemoteAddr, Sge};

/// A registered memory region. Cheap to clone.
///
/// Keeps its buffer alive (and its PD), so the memory outlives the
/// registration and every work request that names the region's keys.
#[derive(Debug, Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

#[derive(Debug)]
pub(crate) struct MrInner {
    /// Declared first: deregistered before the buffer and PD are released.
    node: Node<dyn MrOps>,
    pd: ProtectionDomain,
    buffer: Arc<dyn DmaBuffer>,
    range: Range<usize>,
    access: Access,
    lkey: u32,
    rkey: u32,
}

/// Asking for an SGE or remote address outside the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range at offset {offset} of {len} bytes is outside the {size}-byte memory region")]
pub struct OutOfRegion {
    /// Offset asked for (relative to the region start).
    pub offset: usize,
    /// Length asked for.
    pub len: usize,
    /// Region size.
    pub size: usize,
}

impl MemoryRegion {
    pub(crate) fn new(
        pd: ProtectionDomain,
        ops: Box<dyn MrOps>,
        buffer: Arc<dyn DmaBuffer>,
        range: Range<usize>,
        access: Access,
    ) -> Self {
        let (lkey, rkey) = (ops.lkey(), ops.rkey());
        let mut node = Node::new(
            ops,
            Box::new((pd.clone(), buffer.clone())),
            ObjectKind::MemoryRegion,
            format!("lkey {lkey:#x}"),
            pd.context().identity().clone(),
        );
        node.bytes = range.len();
        Self {
            inner: Arc::new(MrInner {
                node,
                pd,
                buffer,
                range,
                access,
                lkey,
                rkey,
            }),
        }
    }

    #[allow(dead_code)]
    pub(crate) fn ops(&self) -> &dyn MrOps {
        self.inner.node.ops().unwrap_or_else(|| unreachable_ops())
    }

    /// Local key (for SGEs).
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    /// Remote key (for peers' RDMA READ/WRITE; useful only with remote
    /// access flags).
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    /// Virtual address of the first registered byte (what SGEs and peers
    /// use as the address).
    pub fn addr(&self) -> u64 {
        self.inner.buffer.as_ptr() as u64 + self.inner.range.start as u64
    }

    /// Registered length in bytes.
    pub fn len(&self) -> usize {
        self.inner.range.len()
    }

    /// Always false: empty registrations are refused.
    pub fn is_empty(&self) -> bool {
        self.inner.range.is_empty()
    }

    /// Access flags it was registered with.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The registered buffer.
    pub fn buffer(&self) -> &Arc<dyn DmaBuffer> {
        &self.inner.buffer
    }

    /// The registered range of the buffer.
    pub fn range(&self) -> Range<usize> {
        self.inner.range.clone()
    }

    /// The PD it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRegion> {
        let size = self.len();
        match offset.checked_add(len) {
            Some(end) if end <= size && u32::try_from(len).is_ok() => Ok(()),
            _ => Err(OutOfRegion { offset, len, size }),
        }
    }

    /// An SGE for `len` bytes at `offset` inside the region (lengths above
    /// `u32::MAX` are refused).
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge, OutOfRegion> {
        self.check(offset, len)?;
        Ok(Sge::new(
            self.addr() + offset as u64,
            len as u32,
            self.lkey(),
        ))
    }

    /// The remote address of `offset` inside the region, for a peer.
    pub fn remote(&self, offset: usize) -> Result<RemoteAddr, OutOfRegion> {
        self.check(offset, 0)?;
        Ok(RemoteAddr {
            addr: self.addr() + offset as u64,
            rkey: self.rkey(),
        })
    }

    /// Deregisters now. Fails with [`Unquiesced`] if clones still hold the
    /// region, or if the native deregistration fails (then the region, its
    /// PD and its buffer are retained).
    pub fn close(self) -> Result<(), Unquiesced> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.node.close(),
            Err(arc) => Err(arc.node.in_use(Arc::strong_count(&arc) - 1)),
        }
    }
}
