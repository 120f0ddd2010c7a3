//! Registrations as the sans-IO state keeps them: access, budgets and
//! charges, the public [`Registration`], and the table entry
//! ([`RegEntry`]) with the driver's memory and regions behind the
//! [`Resources`] type parameter: the state reads their lengths,
//! addresses and keys, and never makes or closes one.

use std::fmt;
use std::sync::Arc;

use orbitte_wire as wire;

use crate::RegistrationId;

/// What the driver registers and maps: its memory, the memory regions
/// NICs hold, and the evidence a failed cleanup leaves. The sans-IO state
/// stores them and reads only what these functions give.
pub trait Resources: fmt::Debug + 'static {
    /// Registered memory (kept mapped while any request on it runs).
    type Memory: Clone + fmt::Debug + Send + Sync + 'static;
    /// A memory region on one NIC context.
    type Region: fmt::Debug + Send + Sync + 'static;
    /// A cleanup that failed: what fenced admission.
    type Unquiesced: Clone + fmt::Debug + fmt::Display + Send + Sync + 'static;
    /// Bytes of `memory`.
    fn len(memory: &Self::Memory) -> u64;
    /// Where `memory` starts in this process (published to peers).
    fn address(memory: &Self::Memory) -> u64;
    /// Address and lkey of a region.
    fn local_key(region: &Self::Region) -> (u64, u32);
    /// The rkey of a region.
    fn rkey(region: &Self::Region) -> u32;
    /// What admission is fenced with after `cleanup` failed (what was
    /// being cleaned up and the first failure).
    fn fence_reason(cleanup: &Self::Unquiesced) -> String;
}

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

    /// The access as the wire's segment descriptors carry it.
    pub fn wire_flags(self) -> wire::AccessFlags {
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

/// How a registration is served (the engine's `register` reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryPath {
    /// Host Direct: MRs on every usable NIC context, so rdma (and tcp and
    /// local) serve it.
    HostDirect,
    /// Host memory the caller asked to keep off RDMA
    /// (the engine builder's `host_memory_without_rdma`):
    /// no MR, served by tcp and local only.
    HostWithoutRdma,
    /// CUDA device memory: the GPU's copy engines move it through pinned
    /// host bounce buffers (the engine's staging lanes on that device),
    /// and the bounce buffers go over the peer's path. Never published:
    /// GPU memory is only the local side of a request.
    CudaStaging,
}

impl fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::HostDirect => "host direct (rdma, tcp, local)",
            Self::HostWithoutRdma => "host memory without rdma (tcp, local)",
            Self::CudaStaging => "cuda-staging (gpu memory through pinned bounce buffers)",
        })
    }
}

/// Lifecycle of a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegState {
    /// Peers may reach it (a remotely accessible range).
    Published,
    /// Retired: peers no longer reach it; the engine's own requests may.
    Retired,
}

/// One context's memory regions of a range.
#[derive(Debug)]
pub struct NicCopies<R: Resources> {
    /// The NIC ID of the context.
    pub nic: u32,
    /// The local-access region: its lkey serves this engine's requests.
    pub local: R::Region,
    /// The remote-access region of a remotely accessible range: its rkey
    /// is published.
    pub remote: Option<R::Region>,
}

/// The pin every in-flight request holds: keeps the memory mapped while
/// the request is undrained (the MRs keep it too).
#[derive(Debug)]
pub struct RegPin<R: Resources> {
    #[allow(dead_code)] // held for its Drop: the buffer-ownership rule
    memory: R::Memory,
}

/// A registration in the table: its memory, regions, charge and token.
#[derive(Debug)]
pub struct RegEntry<R: Resources> {
    /// The registered memory.
    pub memory: R::Memory,
    /// Who may touch it.
    pub access: Access,
    /// Published or retired.
    pub state: RegState,
    /// Its regions on each context (none for a tcp/local-only range).
    pub copies: Vec<NicCopies<R>>,
    /// Index by NIC ID: position in `copies`.
    by_nic: Vec<Option<usize>>,
    /// Held by every request on the range until it drains.
    pub pin: Arc<RegPin<R>>,
    /// What it charged.
    pub charge: Charges,
    /// The token peers present with requests on it.
    pub token: wire::AccessToken,
    /// (NIC ID, affinity class) best first; class 0 is the best
    /// (PCIe distance, NUMA distance) pair, equal pairs share a class.
    pub nic_order: Vec<(u32, u32)>,
}

impl<R: Resources> RegEntry<R> {
    /// A published entry for `memory` with its region `copies` (none for
    /// a tcp/local-only range), charged `charge`, with the access `token`
    /// (the driver draws it: fresh and unguessable).
    pub fn published(
        memory: R::Memory,
        access: Access,
        copies: Vec<NicCopies<R>>,
        charge: Charges,
        nic_order: Vec<(u32, u32)>,
        token: wire::AccessToken,
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
            token,
            nic_order,
        }
    }

    /// Affinity class of a NIC for this memory (unknown NICs rank last).
    pub fn affinity_class(&self, nic: u32) -> u32 {
        self.nic_order
            .iter()
            .find(|(n, _)| *n == nic)
            .map_or(u32::MAX, |(_, c)| *c)
    }
}

impl<R: Resources> RegEntry<R> {
    /// Requests still holding this range.
    pub fn undrained(&self) -> usize {
        Arc::strong_count(&self.pin) - 1
    }

    /// Its regions on the context of NIC `nic`.
    pub fn copies_on(&self, nic: u32) -> Option<&NicCopies<R>> {
        self.by_nic
            .get(nic as usize)
            .copied()
            .flatten()
            .map(|i| &self.copies[i])
    }

    /// The descriptor peers receive (remote ranges only).
    pub fn descriptor(
        &self,
        id: RegistrationId,
        nics: &[(u32, u16, wire::Gid)],
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
                    rkey: R::rkey(remote),
                    lid: *lid,
                    gid: *gid,
                })
            })
            .collect();
        Some(wire::RangeDescriptor {
            range_id: wire::RangeId(id.0),
            address: R::address(&self.memory),
            length: R::len(&self.memory),
            access: self.access.wire_flags(),
            token: self.token,
            rkeys,
            local: None,
        })
    }
}

/// Groups NICs ranked best first into affinity classes: NICs with the same
/// PCIe distance and NUMA distance share a class.
pub fn affinity_classes(ranked: &[orbitte_topology::NicAffinity]) -> Vec<(u32, u32)> {
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
