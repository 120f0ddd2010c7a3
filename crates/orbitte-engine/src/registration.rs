//! Host Direct registration: budgets, the MR copies per context, and
//! publication.
//!
//! # The copies
//! A registered range gets, on **every** prepared NIC context (paused ports
//! included, whatever the dispatch mask says):
//! - one *local-access* MR (`LOCAL_WRITE` only). Its lkey is what this
//!   engine's outgoing work requests use, READ destinations and WRITE
//!   sources alike. It grants peers nothing.
//! - for a remotely accessible range, a second *remote-access* MR
//!   (`LOCAL_WRITE` plus `REMOTE_READ` and/or `REMOTE_WRITE`). Its rkey is
//!   the one published to peers; it is never used as an lkey.
//!
//! Keeping the two apart means retiring a range revokes peer access (the
//! remote MR is deregistered) while this engine's own in-flight requests on
//! the range keep their lkeys until they drain.
//!
//! # Budgets
//! Two aggregate limits: the number of MRs and the registered bytes. Both
//! charge the full range for each copy, so a remotely accessible range of
//! `n` bytes on `k` contexts costs `2k` MRs and `2kn` bytes. A registration
//! that does not fit fails with `ResourceExhausted` naming what was asked,
//! what is in use and the limit; nothing published is ever evicted to make
//! room.

use std::sync::Arc;

use orbitte_memory::HostMemory;
use orbitte_verbs::{self as verbs, MemoryRegion};
use orbitte_wire as wire;

pub use orbitte_proto::registration::{Access, Budgets, Charges, MemoryPath, Registration};
pub(crate) use orbitte_proto::registration::{RegState, affinity_classes};

/// The driver's resources in the sans-IO state: memfd-backed host memory,
/// verbs memory regions, and the `Unquiesced` evidence of a cleanup that
/// failed.
#[derive(Debug)]
pub(crate) struct Host;

impl orbitte_proto::registration::Resources for Host {
    type Memory = Arc<HostMemory>;
    type Region = MemoryRegion;
    type Unquiesced = crate::error::Unquiesced;

    fn len(memory: &Arc<HostMemory>) -> u64 {
        memory.len() as u64
    }

    fn address(memory: &Arc<HostMemory>) -> u64 {
        memory.as_ptr() as u64
    }

    fn local_key(region: &MemoryRegion) -> (u64, u32) {
        (region.addr(), region.lkey())
    }

    fn rkey(region: &MemoryRegion) -> u32 {
        region.rkey()
    }

    fn fence_reason(cleanup: &crate::error::Unquiesced) -> String {
        cleanup.fence_reason()
    }
}

/// The sans-IO state over the driver's resources.
pub(crate) type EngineState = orbitte_proto::state::EngineState<Host>;
/// A registration in the state's table.
pub(crate) type RegEntry = orbitte_proto::registration::RegEntry<Host>;
/// One context's MRs of a range.
pub(crate) type NicCopies = orbitte_proto::registration::NicCopies<Host>;

/// Memory to register with [`TransferEngine::register`](crate::TransferEngine::register).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Memory {
    /// Host memory: a memfd-backed [`HostMemory`]
    /// (`HostMemory::alloc`; same-host peers can map it) or the caller's
    /// own memory wrapped by the one `unsafe` constructor,
    /// `HostMemory::from_raw_parts`.
    Host {
        /// The memory.
        memory: Arc<HostMemory>,
        /// Where it lives (NUMA node), for rail affinity; unknown: rails in
        /// NIC ID order.
        location: orbitte_topology::MemoryLocation,
    },
    /// CUDA device memory, served by the cuda-staging path
    /// ([`MemoryPath::CudaStaging`]). It registers only as
    /// [`Access::LocalOnly`]: registering GPU memory with NICs
    /// (`gpudirect-rdma`) is not implemented and is refused, never
    /// replaced by another path.
    Cuda(Arc<orbitte_cuda::CudaBuffer>),
}

impl Memory {
    /// Host memory at a known location (requests on it stripe over rails
    /// in affinity order: PCIe distance, then NUMA distance, then NIC ID).
    pub fn host_at(memory: Arc<HostMemory>, location: orbitte_topology::MemoryLocation) -> Self {
        Self::Host { memory, location }
    }
}

impl From<Arc<HostMemory>> for Memory {
    fn from(memory: Arc<HostMemory>) -> Self {
        Self::Host {
            memory,
            location: orbitte_topology::MemoryLocation::Host { numa_node: None },
        }
    }
}

impl From<&Arc<HostMemory>> for Memory {
    fn from(memory: &Arc<HostMemory>) -> Self {
        Arc::clone(memory).into()
    }
}

impl From<Arc<orbitte_cuda::CudaBuffer>> for Memory {
    fn from(buffer: Arc<orbitte_cuda::CudaBuffer>) -> Self {
        Self::Cuda(buffer)
    }
}

impl From<&Arc<orbitte_cuda::CudaBuffer>> for Memory {
    fn from(buffer: &Arc<orbitte_cuda::CudaBuffer>) -> Self {
        Self::Cuda(Arc::clone(buffer))
    }
}

/// The verbs access of a remotely accessible range's remote-access MR
/// (`None` for a local-only range).
pub(crate) fn remote_verbs(access: Access) -> Option<verbs::Access> {
    if !access.is_remote() {
        return None;
    }
    let mut bits = verbs::Access::LOCAL_WRITE.bits();
    if access.remote_read() {
        bits |= verbs::Access::REMOTE_READ.bits();
    }
    if access.remote_write() {
        bits |= verbs::Access::REMOTE_WRITE.bits();
    }
    Some(verbs::Access::from_bits(bits))
}

/// Deregisters every MR of `copies` and returns the deregistrations that
/// failed (verbs keeps those MRs, their owners and memory, retained).
pub(crate) fn close_copies(copies: Vec<NicCopies>) -> Vec<verbs::Unquiesced> {
    let mut failures = Vec::new();
    for c in copies {
        for mr in std::iter::once(c.local).chain(c.remote) {
            if let Err(u) = mr.close() {
                failures.push(u);
            }
        }
    }
    failures
}

/// A fresh unguessable token for a published range (SipHash keyed by the
/// process's random state, fed with a counter and the time).
pub(crate) fn fresh_token() -> wire::AccessToken {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    wire::AccessToken(h.finish())
}
