//! The engine's state below the line: sans-IO, as [`Core`] is.
//!
//! [`EngineState`] owns the core, the registration and peer tables, the
//! budget ledger and the outcomes not taken yet, and decides admission: it
//! validates a batch against the tables (registration published, range
//! inside it, peer open, range published with the right access), chooses
//! each request's rails (dispatch mask, rail up, keys on both NICs,
//! affinity class, rotation), refuses everything while fenced (keeping the
//! `Unquiesced` evidence that fenced it), refuses to forget a registration
//! that requests still hold, and keeps closed rails until their work
//! drained (reaping: the driver then destroys their queue pairs). It also
//! holds the rules around the I/O the driver does: Host Direct
//! registration (`register`), peer adoption by epoch (`peers`) and
//! notifications (`notify`). No threads, sockets or clock inside: time is
//! an argument, and `cargo xtask tidy` keeps it that way.
//!
//! The driver (`crate::engine`) wraps it: it owns the threads, the clock,
//! the NIC contexts and the transports, and pumps the core in the order
//! `crate::core` documents:
//!
//! 1. [`EngineState::submit`] a batch (or [`EngineState::admit`] it and hand
//!    the requests to [`Core::submit`], then
//!    [`EngineState::track_notification`] if it carries one);
//! 2. `core.poll_work` and post each rail's run; feed completions and rail
//!    events to `core.handle_event`, deadlines to `core.handle_timeout`;
//! 3. [`EngineState::collect_outcomes`], hand each
//!    [`EngineState::poll_transmit`] to a transport and report it with
//!    [`EngineState::notification_sent`]; flushes with `core.poll_flush`.
//!
//! Tests drive it with a scripted transport on virtual time
//! (`state/tests.rs`, and the fault fuzz in `state/fuzz.rs`).

#[cfg(test)]
mod fuzz;
mod notify;
mod outcomes;
mod peers;
mod register;
mod tables;
#[cfg(test)]
mod tests;

pub(crate) use notify::{Notifications, Transmit};
pub(crate) use outcomes::Outcomes;
pub(crate) use register::retained;
pub(crate) use tables::{PeerState, Tables, published_remote};

use std::sync::Arc;
use std::time::Instant;

use orbitte_memory::HostMemory;
use orbitte_topology::{DeviceMask, NicId};
use orbitte_wire::{self as wire, Epoch, SourceId};

use crate::core::{Core, CoreConfig, CoreRequest, RailList};
use crate::engine::TransferRequest;
use crate::error::{RegisterError, Unquiesced, UnregisterError};
use crate::outcome::{RailRefusal, RequestError, RequestId, SubmitError};
use crate::registration::{
    Access, Budgets, Charges, Ledger, MemoryPath, RegEntry, RegState, Registration,
};
use crate::transport::{PathKind, PeerId, RailId, RailSpec, RangeId, RegistrationId};

/// The tables, the ledger and the core, with the rules of admission.
/// See the module docs for how a driver calls it.
#[derive(Debug)]
pub(crate) struct EngineState {
    pub(crate) core: Core,
    pub(crate) tables: Tables,
    /// Invariant: `ledger.in_use` is the sum of the registrations'
    /// charges plus what cleanup failures retain.
    pub(crate) ledger: Ledger,
    /// The next registration id (ids are never reused).
    next_reg: u64,
    /// The next peer id (ids are never reused).
    next_peer: u32,
    /// Rotates each request's first rail among its allowed rails.
    rotor: usize,
    /// Outcomes made and not taken yet.
    pub(crate) outcomes: Outcomes,
    /// Notifying batches whose outcomes are held until they resolve.
    pub(crate) notifications: Notifications,
    /// Every `Unquiesced` so far; each one fenced admission.
    pub(crate) unquiesced: Vec<Unquiesced>,
    /// Closed rails whose queue pair the driver destroys once their work
    /// in flight drained.
    reap: Vec<RailId>,
}

impl EngineState {
    /// An empty state: no registrations, peers or rails.
    pub(crate) fn new(core: CoreConfig, budgets: Budgets) -> Self {
        Self {
            core: Core::new(core),
            tables: Tables::default(),
            ledger: Ledger {
                budgets,
                in_use: Charges::default(),
            },
            next_reg: 1,
            next_peer: 1,
            rotor: 0,
            outcomes: Outcomes::default(),
            notifications: Notifications::default(),
            unquiesced: Vec::new(),
            reap: Vec::new(),
        }
    }

    /// Validates a batch and chooses each request's rails: all admitted or
    /// none (the error names the first bad request). Nothing is submitted:
    /// the caller hands the result to [`Core::submit`] (or calls
    /// [`submit`](Self::submit)).
    pub(crate) fn admit(
        &mut self,
        batch: &[TransferRequest],
        mask: DeviceMask,
    ) -> Result<Vec<CoreRequest>, SubmitError> {
        let Some(first) = batch.first() else {
            return Err(SubmitError::Empty);
        };
        if let Some(reason) = self.core.fenced() {
            return Err(SubmitError::Fenced {
                index: 0,
                label: first.label,
                reason: reason.clone(),
            });
        }
        let mut reqs = Vec::with_capacity(batch.len());
        // Requests of a batch usually name the same registration, peer,
        // range and operation: what depends on those alone (lookups, access,
        // rail choice) is decided once per run of them, the offsets and
        // lengths once per request.
        let mut last: Option<Admitted> = None;
        for (index, r) in batch.iter().enumerate() {
            let bad = |error| SubmitError::Invalid {
                index,
                label: r.label,
                error,
            };
            if r.len == 0 {
                return Err(bad(RequestError::ZeroLength));
            }
            let (Some(lend), Some(rend)) = (
                r.local_offset.checked_add(r.len),
                r.remote_offset.checked_add(r.len),
            ) else {
                return Err(bad(RequestError::Overflow {
                    offset: r.local_offset.max(r.remote_offset),
                    len: r.len,
                }));
            };
            let a = match last.take() {
                Some(a) if a.serves(r) => {
                    // The checks `choose` makes on the offsets.
                    if lend > a.local_size {
                        return Err(bad(local_out_of_range(r, a.local_size)));
                    }
                    if rend > a.remote_size {
                        return Err(bad(RequestError::OutOfRange {
                            side: "remote",
                            offset: r.remote_offset,
                            len: r.len,
                            size: a.remote_size,
                        }));
                    }
                    a
                }
                _ => self.choose(r, lend, rend, mask).map_err(bad)?,
            };
            let a = last.insert(a);
            let mut rails = a.rails.clone();
            let k = rails.len();
            if k > 1 {
                rails.rotate_left(self.rotor % k);
                self.rotor = self.rotor.wrapping_add(1);
            }
            reqs.push(CoreRequest {
                label: r.label,
                op: r.op,
                registration: r.registration,
                local_offset: r.local_offset,
                peer: r.peer,
                range: r.range,
                remote_offset: r.remote_offset,
                len: r.len,
                rails,
                keepalive: Some(a.pin.clone()),
            });
        }
        Ok(reqs)
    }

    /// What admission decides from a request's registration, peer, range
    /// and operation (`lend`, `rend`: its ends in the local registration and
    /// the remote range): the checks of
    /// the tables, and the allowed rails in their best affinity class.
    fn choose(
        &self,
        r: &TransferRequest,
        lend: u64,
        rend: u64,
        mask: DeviceMask,
    ) -> Result<Admitted, RequestError> {
        let Some(reg) = self
            .tables
            .regs
            .get(&r.registration.0)
            .filter(|e| e.state == RegState::Published)
        else {
            return Err(RequestError::UnpublishedLocal(r.registration));
        };
        let local_size = reg.memory.len() as u64;
        if lend > local_size {
            return Err(local_out_of_range(r, local_size));
        }
        let (peer, desc) = published_remote(&self.tables, r, rend)?;
        let mut why = Vec::new();
        let mut rails = RailList::new();
        for &rail in &peer.rails {
            let spec = self.core.rail_spec(rail);
            let nic = spec.and_then(|s| s.nic);
            if let Some(n) = nic
                && !mask.contains(NicId(n))
            {
                why.push(RailRefusal::OutsideMask {
                    rail,
                    nic: NicId(n),
                    mask,
                });
                continue;
            }
            if !self.core.rail_is_up(rail) {
                why.push(match self.core.rail_down_reason(rail) {
                    Some(reason) => RailRefusal::Down { rail, reason },
                    None => RailRefusal::Unknown { rail },
                });
                continue;
            }
            if let Some(n) = nic
                && spec.is_some_and(|s| s.path == PathKind::Rdma)
            {
                let remote_nic = spec.and_then(|s| s.remote_nic).unwrap_or(u32::MAX);
                if reg.copies_on(n).is_none()
                    || !desc
                        .rkeys
                        .iter()
                        .any(|k| u32::from(k.nic_id.0) == remote_nic)
                {
                    why.push(RailRefusal::NoKeys { rail });
                    continue;
                }
            }
            rails.push(rail);
        }
        if rails.is_empty() {
            if why.is_empty() {
                why.push(RailRefusal::NoRails);
            }
            return Err(RequestError::NoRail { peer: r.peer, why });
        }
        // Affinity allows the rails whose NIC is in the best class for
        // this memory among the usable ones (all of them when the
        // memory's location is unknown); requests rotate among those.
        let class = |rail: &RailId| {
            let nic = self.core.rail_spec(*rail).and_then(|s| s.nic);
            nic.map_or(0, |n| reg.affinity_class(n))
        };
        if let Some(best) = rails.iter().map(class).min() {
            rails.retain(|r| class(r) == best);
        }
        Ok(Admitted {
            registration: r.registration,
            peer: r.peer,
            range: r.range,
            op: r.op,
            local_size,
            remote_size: desc.length,
            rails,
            pin: reg.pin.clone(),
        })
    }

    /// [`admit`](Self::admit)s a batch and submits it to the core at `now`.
    // The driver admits and submits apart (it arms notifications between);
    // tests submit in one step.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn submit(
        &mut self,
        now: Instant,
        batch: &[TransferRequest],
        mask: DeviceMask,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let reqs = self.admit(batch, mask)?;
        self.core.submit(now, reqs)
    }

    /// Publishes host memory for the tcp and local paths only: no memory
    /// region on any NIC, nothing charged. Refused while fenced.
    pub(crate) fn register_unpinned(
        &mut self,
        memory: Arc<HostMemory>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        if let Some(reason) = self.core.fenced().cloned() {
            return Err(RegisterError::Fenced { reason });
        }
        let len = memory.len() as u64;
        let id = self.insert_registration(RegEntry::published(
            memory,
            access,
            Vec::new(),
            Charges::default(),
            Vec::new(),
        ));
        Ok(Registration {
            id,
            len,
            access,
            copies: 0,
            path: MemoryPath::HostWithoutRdma,
        })
    }

    /// Adds a published entry (its charges already in the ledger) under a
    /// fresh id.
    pub(crate) fn insert_registration(&mut self, entry: RegEntry) -> RegistrationId {
        let id = self.fresh_registration_id();
        self.tables.regs.insert(id.0, entry);
        id
    }

    /// Takes a registration out of the table, releasing its charges from
    /// the ledger; the caller closes its copies (and charges back what a
    /// failed close retains). Refused while requests on it are undrained.
    pub(crate) fn take_registration(
        &mut self,
        registration: RegistrationId,
    ) -> Result<RegEntry, UnregisterError> {
        let Some(entry) = self.tables.regs.get(&registration.0) else {
            return Err(UnregisterError::Unknown(registration));
        };
        let requests = entry.undrained();
        if requests > 0 {
            return Err(UnregisterError::Undrained {
                id: registration,
                requests,
            });
        }
        let entry = self
            .tables
            .regs
            .remove(&registration.0)
            .ok_or(UnregisterError::Unknown(registration))?;
        self.ledger.release(entry.charge);
        Ok(entry)
    }

    /// Records a newly admitted peer with the ranges it published.
    // The driver's sessions record peers through their own admission
    // (reconnect, replacement); tests open them here.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn open_peer(
        &mut self,
        source_id: SourceId,
        epoch: Epoch,
        ranges: &[wire::RangeDescriptor],
    ) -> PeerId {
        let id = self.fresh_peer_id();
        self.tables.peers.insert(
            id.0,
            PeerState {
                source_id,
                epoch,
                sessions: Vec::new(),
                ranges: ranges
                    .iter()
                    .map(|r| (RangeId(r.range_id.0), r.clone()))
                    .collect::<crate::Map<_, _>>(),
                rails: Vec::new(),
            },
        );
        id
    }

    /// Adds a rail to the core and to its peer's rails (the driver also
    /// records which transport owns the rail).
    pub(crate) fn add_rail(&mut self, spec: RailSpec) -> RailId {
        let peer = spec.peer;
        let rail = self.core.add_rail(spec);
        if let Some(p) = self.tables.peers.get_mut(&peer.0) {
            p.rails.push(rail);
        }
        rail
    }

    /// Why new admission is refused, if it is.
    pub(crate) fn fenced(&self) -> Option<&Arc<str>> {
        self.core.fenced()
    }

    /// Refuses new admission from now on, with the reason.
    pub(crate) fn fence(&mut self, reason: impl Into<Arc<str>>) {
        self.core.fence(reason.into());
    }

    /// Keeps the evidence of a cleanup that failed and fences admission
    /// with its first failure as the reason.
    pub(crate) fn record_unquiesced(&mut self, u: Unquiesced) {
        tracing::error!(error = %u, "unquiesced: fencing new admission");
        self.fence(format!(
            "unquiesced during {}: {}",
            u.during,
            u.failures
                .first()
                .map(|f| f.to_string())
                .unwrap_or_default()
        ));
        self.unquiesced.push(u);
    }

    /// Closes a rail for good: no new work, its queued work is flushed by
    /// the next pump. Returns whether work was in flight on it; then the
    /// rail waits in the reap list until [`take_reapable`](Self::take_reapable)
    /// hands it back drained (when `reap_when_drained`).
    pub(crate) fn close_rail(
        &mut self,
        rail: RailId,
        now: Instant,
        reap_when_drained: bool,
    ) -> bool {
        let busy = self.core.close_rail(rail, now);
        if busy && reap_when_drained && !self.reap.contains(&rail) {
            self.reap.push(rail);
        }
        busy
    }

    /// Moves the closed rails that have no work in flight any more into
    /// `into`, for the driver to destroy.
    pub(crate) fn take_reapable(&mut self, into: &mut Vec<RailId>) {
        if self.reap.is_empty() {
            return;
        }
        let core = &self.core;
        self.reap.retain(|r| {
            let drained = core.rail_in_flight(*r) == 0;
            if drained {
                into.push(*r);
            }
            !drained
        });
    }
}

fn local_out_of_range(r: &TransferRequest, size: u64) -> RequestError {
    RequestError::OutOfRange {
        side: "local",
        offset: r.local_offset,
        len: r.len,
        size,
    }
}

/// What [`EngineState::admit`] decided for a run of requests with the same
/// registration, peer, range and operation.
struct Admitted {
    registration: RegistrationId,
    peer: PeerId,
    range: RangeId,
    op: crate::transport::Op,
    /// Bytes of the local registration.
    local_size: u64,
    /// Bytes of the remote range.
    remote_size: u64,
    /// Invariant: not empty.
    rails: RailList,
    pin: Arc<dyn std::any::Any + Send + Sync>,
}

impl Admitted {
    /// Whether `r` names the same registration, peer, range and operation.
    fn serves(&self, r: &TransferRequest) -> bool {
        self.registration == r.registration
            && self.peer == r.peer
            && self.range == r.range
            && self.op == r.op
    }
}
