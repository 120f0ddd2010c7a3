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

use crate::transport::RegistrationId;

/// Who may touch a registered range. A remotely accessible range allows
/// peers at least one of READ and WRITE (there is no "remote with
/// neither").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only this engine's requests use it (one MR per context); never
    /// published.
    LocalOnly,
    /// Published; peers may READ it (two MRs per context).
    RemoteRead,
    /// Published; peers may WRITE it (two MRs per context).
    RemoteWrite,
    /// Published; peers may READ and WRITE it (two MRs per context).
    RemoteReadWrite,
}

impl Access {
    /// Peers may read and write (the same as [`Access::RemoteReadWrite`]).
    pub const REMOTE_READ_WRITE: Self = Self::RemoteReadWrite;

    /// Whether the range is published to peers.
    pub fn is_remote(self) -> bool {
        self != Self::LocalOnly
    }

    /// Whether peers may READ it.
    pub fn remote_read(self) -> bool {
        matches!(self, Self::RemoteRead | Self::RemoteReadWrite)
    }

    /// Whether peers may WRITE it.
    pub fn remote_write(self) -> bool {
        matches!(self, Self::RemoteWrite | Self::RemoteReadWrite)
    }

    /// MR copies per context.
    pub fn copies_per_context(self) -> u64 {
        if self.is_remote() { 2 } else { 1 }
    }

    pub(crate) fn remote_verbs(self) -> Option<verbs::Access> {
        if !self.is_remote() {
            return None;
        }
        let mut bits = verbs::Access::LOCAL_WRITE.bits();
        if self.remote_read() {
            bits |= verbs::Access::REMOTE_READ.bits();
        }
        if self.remote_write() {
            bits |= verbs::Access::REMOTE_WRITE.bits();
        }
        Some(verbs::Access::from_bits(bits))
    }

    pub(crate) fn wire_flags(self) -> wire::AccessFlags {
        let mut f = wire::AccessFlags::LOCAL_WRITE;
        if self.remote_read() {
            f = f | wire::AccessFlags::REMOTE_READ;
        }
        if self.remote_write() {
            f = f | wire::AccessFlags::REMOTE_WRITE;
        }
        f
    }
}

/// Aggregate registration limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Most MRs over all contexts and ranges.
    pub max_mrs: u64,
    /// Most registered bytes over all copies.
    pub max_bytes: u64,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            max_mrs: 1 << 16,
            max_bytes: 1 << 40,
        }
    }
}

/// What is charged against the budgets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charges {
    /// MRs.
    pub mrs: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A registered range, as the caller holds it. Plain data: the engine owns
/// the MRs and the memory; requests pin both until they drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Engine-assigned id (also the published range id).
    pub id: RegistrationId,
    /// Bytes.
    pub len: u64,
    /// Access it was registered with.
    pub access: Access,
    /// MR copies made (contexts × copies per context).
    pub copies: u64,
    /// The path that serves it.
    pub path: MemoryPath,
}

/// How a registration is served (see [`TransferEngine::register`](crate::TransferEngine::register)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryPath {
    /// Host Direct: MRs on every usable NIC context, so rdma (and tcp and
    /// local) serve it.
    HostDirect,
    /// Host memory the caller asked to keep off RDMA
    /// ([`EngineBuilder::host_memory_without_rdma`](crate::EngineBuilder::host_memory_without_rdma)):
    /// no MR, served by tcp and local only.
    HostWithoutRdma,
    /// CUDA device memory: the GPU's copy engines move it through pinned
    /// host bounce buffers (the engine's staging lanes on that device),
    /// and the bounce buffers go over the peer's path. Never published:
    /// GPU memory is only the local side of a request.
    CudaStaging,
}

impl std::fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::HostDirect => "host direct (rdma, tcp, local)",
            Self::HostWithoutRdma => "host memory without rdma (tcp, local)",
            Self::CudaStaging => "cuda-staging (gpu memory through pinned bounce buffers)",
        })
    }
}

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

/// Lifecycle of a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RegState {
    Published,
    Retired,
}

/// One context's MRs of a range.
#[derive(Debug)]
pub(crate) struct NicCopies {
    pub(crate) nic: u32,
    pub(crate) local: MemoryRegion,
    pub(crate) remote: Option<MemoryRegion>,
}

/// The pin every in-flight request holds: keeps the memory mapped while
/// the request is undrained (the MRs keep it too).
#[derive(Debug)]
pub(crate) struct RegPin {
    #[allow(dead_code)] // held for its Drop: the buffer-ownership rule
    pub(crate) memory: Arc<HostMemory>,
}

#[derive(Debug)]
pub(crate) struct RegEntry {
    pub(crate) memory: Arc<HostMemory>,
    pub(crate) access: Access,
    pub(crate) state: RegState,
    pub(crate) copies: Vec<NicCopies>,
    /// Index by NIC ID: position in `copies`.
    pub(crate) by_nic: Vec<Option<usize>>,
    pub(crate) pin: Arc<RegPin>,
    pub(crate) charge: Charges,
    pub(crate) token: wire::AccessToken,
    /// (NIC ID, affinity class) best first; class 0 is the best
    /// (PCIe distance, NUMA distance) pair, equal pairs share a class.
    pub(crate) nic_order: Vec<(u32, u32)>,
}

impl RegEntry {
    /// A published entry for `memory` with its MR `copies` (none for a
    /// tcp/local-only range), charged `charge`, with a fresh access token.
    pub(crate) fn published(
        memory: Arc<HostMemory>,
        access: Access,
        copies: Vec<NicCopies>,
        charge: Charges,
        nic_order: Vec<(u32, u32)>,
    ) -> Self {
        let max_nic = copies.iter().map(|c| c.nic as usize + 1).max().unwrap_or(0);
        let mut by_nic = vec![None; max_nic];
        for (i, c) in copies.iter().enumerate() {
            by_nic[c.nic as usize] = Some(i);
        }
        Self {
            pin: Arc::new(RegPin {
                memory: memory.clone(),
            }),
            memory,
            access,
            state: RegState::Published,
            copies,
            by_nic,
            charge,
            token: fresh_token(),
            nic_order,
        }
    }

    /// Affinity class of a NIC for this memory (unknown NICs rank last).
    pub(crate) fn affinity_class(&self, nic: u32) -> u32 {
        self.nic_order
            .iter()
            .find(|(n, _)| *n == nic)
            .map_or(u32::MAX, |(_, c)| *c)
    }
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

/// Groups NICs ranked best first into affinity classes: NICs with the same
/// PCIe distance and NUMA distance share a class.
pub(crate) fn affinity_classes(ranked: &[orbitte_topology::NicAffinity]) -> Vec<(u32, u32)> {
    let mut class = 0;
    let mut out = Vec::with_capacity(ranked.len());
    for (i, a) in ranked.iter().enumerate() {
        if i > 0 && (a.pcie, a.numa_distance) != (ranked[i - 1].pcie, ranked[i - 1].numa_distance) {
            class += 1;
        }
        out.push((a.nic.0, class));
    }
    out
}

#[cfg(test)]
mod tests {
    use orbitte_topology::{NicAffinity, NicId, PcieDistance};

    use super::*;

    fn aff(nic: u32, numa: Option<u32>) -> NicAffinity {
        NicAffinity {
            nic: NicId(nic),
            name: format!("n{nic}"),
            pcie: PcieDistance::Unknown,
            numa_distance: numa,
        }
    }

    #[test]
    fn nics_with_equal_distances_share_an_affinity_class() {
        let ranked = [
            aff(2, Some(10)),
            aff(3, Some(10)),
            aff(0, Some(20)),
            aff(1, None),
        ];
        assert_eq!(affinity_classes(&ranked), [(2, 0), (3, 0), (0, 1), (1, 2)]);
        let unknown = [aff(0, None), aff(1, None)];
        assert_eq!(
            affinity_classes(&unknown),
            [(0, 0), (1, 0)],
            "unknown location: every NIC is allowed"
        );
    }
}

impl RegEntry {
    /// Requests still holding this range.
    pub(crate) fn undrained(&self) -> usize {
        Arc::strong_count(&self.pin) - 1
    }

    pub(crate) fn copies_on(&self, nic: u32) -> Option<&NicCopies> {
        self.by_nic
            .get(nic as usize)
            .copied()
            .flatten()
            .map(|i| &self.copies[i])
    }

    /// The descriptor peers receive (remote ranges only).
    pub(crate) fn descriptor(
        &self,
        id: RegistrationId,
        nics: &[(u32, u16, verbs::Gid)],
    ) -> Option<wire::RangeDescriptor> {
        if self.access == Access::LocalOnly || self.state != RegState::Published {
            return None;
        }
        let rkeys = self
            .copies
            .iter()
            .filter_map(|c| {
                let remote = c.remote.as_ref()?;
                let (_, lid, gid) = nics.iter().find(|(n, _, _)| *n == c.nic)?;
                Some(wire::NicRkey {
                    nic_id: wire::NicId(u16::try_from(c.nic).ok()?),
                    rkey: remote.rkey(),
                    lid: *lid,
                    gid: wire::Gid(gid.0),
                })
            })
            .collect();
        Some(wire::RangeDescriptor {
            range_id: wire::RangeId(id.0),
            address: self.memory.as_ptr() as u64,
            length: self.memory.len() as u64,
            access: self.access.wire_flags(),
            token: self.token,
            rkeys,
            local: None,
        })
    }
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
