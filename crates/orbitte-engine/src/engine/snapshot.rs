//! What posting and the tcp/local target read from the registration and
//! peer tables, copied after every change, so that neither takes the state
//! lock for it.
//!
//! The copy is made under the state lock before the lock is released
//! (`StateGuard`), whenever a table was changed in that hold: a call that
//! registers, retires, unregisters or opens a peer returns only after the
//! copy without (or with) its entry is the current one. A copy holds the
//! memory of its registrations by `Arc`, as the tables do, so a post or a
//! served request that still reads an older copy keeps that memory mapped;
//! the MRs whose keys a post reads stay registered while its request is
//! undrained (`unregister` refuses until then, and `retire` keeps the
//! local-access MRs).

use std::sync::Arc;

use orbitte_memory::HostMemory;
use orbitte_wire::{self as wire, RangeDescriptor};

use crate::registration::{Host, RegEntry, RegState};
use crate::session::Published;
use crate::transport::{PeerId, PostContext, RangeId, RegistrationId};
use orbitte_proto::state::Tables;

/// A copy of what the tables lend to posts ([`PostContext`]) and to the
/// tcp/local target (its published ranges).
#[derive(Debug, Default)]
pub(crate) struct TablesSnapshot {
    regs: crate::Map<u64, RegCopy>,
    /// Published CUDA registrations (served through host memory).
    device: crate::Map<u64, Published>,
    peers: crate::Map<u32, crate::Map<RangeId, RangeDescriptor>>,
}

#[derive(Debug)]
struct RegCopy {
    memory: Arc<HostMemory>,
    /// Address and lkey of the local-access MR, by NIC ID.
    keys: Vec<Option<(u64, u32)>>,
    /// What the tcp/local target serves of it (`None`: not published, or
    /// local only).
    published: Option<Published>,
}

impl TablesSnapshot {
    /// A copy of `tables` and of the published CUDA registrations of
    /// `staged`.
    pub(crate) fn of(tables: &Tables<Host>, staged: &crate::staging::Staged) -> Self {
        let regs = tables
            .regs
            .iter()
            .map(|(id, e)| {
                let mut keys = Vec::new();
                for c in &e.copies {
                    let i = c.nic as usize;
                    if keys.len() <= i {
                        keys.resize(i + 1, None);
                    }
                    keys[i] = Some((c.local.addr(), c.local.lkey()));
                }
                let copy = RegCopy {
                    memory: e.memory.clone(),
                    keys,
                    published: published(e),
                };
                (*id, copy)
            })
            .collect();
        let peers = tables
            .peers
            .iter()
            .map(|(id, p)| (*id, p.ranges.clone()))
            .collect();
        let device = staged
            .regs
            .iter()
            .filter_map(|(id, e)| Some((*id, e.published.clone()?)))
            .collect();
        Self {
            regs,
            device,
            peers,
        }
    }

    /// The range as the tcp/local target serves it, if published.
    pub(crate) fn lookup(&self, range: wire::RangeId) -> Option<Published> {
        match self.regs.get(&range.0) {
            Some(r) => r.published.clone(),
            None => self.device.get(&range.0).cloned(),
        }
    }

    /// Every published, remotely accessible range, by id.
    pub(crate) fn published(&self) -> Vec<(wire::RangeId, Published)> {
        let mut v: Vec<_> = self
            .regs
            .iter()
            .filter_map(|(id, r)| r.published.clone().map(|p| (wire::RangeId(*id), p)))
            .chain(
                self.device
                    .iter()
                    .map(|(id, p)| (wire::RangeId(*id), p.clone())),
            )
            .collect();
        v.sort_by_key(|(id, _)| id.0);
        v
    }
}

impl PostContext for Tables<Host> {
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&registration.0).map(|e| &e.memory)
    }

    fn local_key(&self, registration: RegistrationId, nic: u32) -> Option<(u64, u32)> {
        let c = self.regs.get(&registration.0)?.copies_on(nic)?;
        Some((c.local.addr(), c.local.lkey()))
    }

    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&RangeDescriptor> {
        self.peers.get(&peer.0)?.ranges.get(&range)
    }
}

impl PostContext for TablesSnapshot {
    fn memory(&self, registration: RegistrationId) -> Option<&Arc<HostMemory>> {
        self.regs.get(&registration.0).map(|r| &r.memory)
    }

    fn local_key(&self, registration: RegistrationId, nic: u32) -> Option<(u64, u32)> {
        *self.regs.get(&registration.0)?.keys.get(nic as usize)?
    }

    fn remote_range(&self, peer: PeerId, range: RangeId) -> Option<&RangeDescriptor> {
        self.peers.get(&peer.0)?.get(&range)
    }
}

/// What the tcp/local target serves of a registration: published and
/// remotely accessible ones only, with their access and token.
fn published(e: &RegEntry) -> Option<Published> {
    if e.state != RegState::Published || !e.access.is_remote() {
        return None;
    }
    let access = e.access.wire_flags();
    Some(Published {
        memory: crate::session::publications::ServedMemory::Host(e.memory.clone()),
        offset: 0,
        length: e.memory.len() as u64,
        access,
        token: e.token,
    })
}
