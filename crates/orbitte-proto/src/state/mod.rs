//! The engine's state below the line: sans-IO, as [`Core`](crate::core::Core) is.
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
//!    the requests to [`Core::submit`](crate::core::Core::submit), then
//!    [`EngineState::track_notification`] if it carries one; or, as the
//!    driver does, [`EngineState::validate`] it and take the requests the
//!    returned `Admission` builds into the core with `Core::insert`, a
//!    piece at a time);
//! 2. `core.poll_work` and post each rail's run; feed completions and rail
//!    events to `core.handle_event`, deadlines to `core.handle_timeout`;
//! 3. [`EngineState::collect_outcomes`], hand each
//!    [`EngineState::poll_transmit`] to a transport and report it with
//!    [`EngineState::notification_sent`]; flushes with `core.poll_flush`.
//!
//! Tests drive it with a scripted transport on virtual time
//! (`state/tests.rs`, and the fault fuzz in `state/fuzz.rs`).

mod admit;
mod drive;
mod engine;
#[cfg(test)]
mod fuzz;
mod ledger;
mod notifications;
mod notify;
mod outcomes;
mod peers;
mod register;
mod tables;
#[cfg(test)]
mod tests;

pub use admit::Admission;
pub use engine::EngineState;
pub use ledger::Ledger;
pub use notifications::{Notifications, Transmit};
pub use outcomes::Outcomes;
pub use peers::Adoption;
pub use register::{Reservation, retained};
pub use tables::{
    PeerState, RESTARTED_KEPT, Restarted, Tables, Tracked, check_epoch, published_remote,
};

use std::sync::Arc;
use std::time::Instant;

use orbitte_topology::DeviceMask;
use orbitte_wire::{self as wire, Epoch, SourceId};

use crate::TransferRequest;
use crate::error::{RegisterRefusal, UnregisterRefusal};
use crate::outcome::{RequestId, SubmitError};
use crate::registration::{Access, Charges, MemoryPath, RegEntry, Registration, Resources};
use crate::{PeerId, RailId, RailSpec, RangeId, RegistrationId};

impl<R: Resources> EngineState<R> {
    /// [`admit`](Self::admit)s a batch and submits it to the core at `now`.
    // The driver admits and submits apart (it arms notifications between);
    // tests submit in one step.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn submit(
        &mut self,
        now: Instant,
        batch: &[TransferRequest],
        mask: DeviceMask,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let reqs = self.admit(batch, mask)?;
        self.core.submit(now, reqs)
    }

    /// Publishes host memory for the tcp and local paths only: no memory
    /// region on any NIC, nothing charged, under the access `token` the
    /// driver drew. Refused while fenced.
    pub fn register_unpinned(
        &mut self,
        memory: R::Memory,
        access: Access,
        token: wire::AccessToken,
    ) -> Result<Registration, RegisterRefusal> {
        if let Some(reason) = self.core.fenced().cloned() {
            return Err(RegisterRefusal::Fenced { reason });
        }
        let len = R::len(&memory);
        let id = self.insert_registration(RegEntry::published(
            memory,
            access,
            Vec::new(),
            Charges::default(),
            Vec::new(),
            token,
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
    pub fn insert_registration(&mut self, entry: RegEntry<R>) -> RegistrationId {
        let id = self.fresh_registration_id();
        self.tables.regs.insert(id.0, entry);
        id
    }

    /// Takes a registration out of the table, releasing its charges from
    /// the ledger; the caller closes its copies (and charges back what a
    /// failed close retains). Refused while requests on it are undrained.
    pub fn take_registration(
        &mut self,
        registration: RegistrationId,
    ) -> Result<RegEntry<R>, UnregisterRefusal> {
        let Some(entry) = self.tables.regs.get(&registration.0) else {
            return Err(UnregisterRefusal::Unknown(registration));
        };
        let requests = entry.undrained();
        if requests > 0 {
            return Err(UnregisterRefusal::Undrained {
                id: registration,
                requests,
            });
        }
        let entry = self
            .tables
            .regs
            .remove(&registration.0)
            .ok_or(UnregisterRefusal::Unknown(registration))?;
        self.ledger.release(entry.charge);
        Ok(entry)
    }

    /// Records a newly admitted peer with the ranges it published.
    // The driver's sessions record peers through their own admission
    // (reconnect, replacement); tests open them here.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn open_peer(
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
    pub fn add_rail(&mut self, spec: RailSpec) -> RailId {
        let peer = spec.peer;
        let rail = self.core.add_rail(spec);
        if let Some(p) = self.tables.peers.get_mut(&peer.0) {
            p.rails.push(rail);
        }
        rail
    }

    /// Why new admission is refused, if it is.
    pub fn fenced(&self) -> Option<&Arc<str>> {
        self.core.fenced()
    }

    /// Refuses new admission from now on, with the reason.
    pub fn fence(&mut self, reason: impl Into<Arc<str>>) {
        self.core.fence(reason.into());
    }

    /// Keeps the evidence of a cleanup that failed and fences admission
    /// with its [`fence_reason`](Resources::fence_reason).
    pub fn record_unquiesced(&mut self, u: R::Unquiesced) {
        tracing::error!(error = %u, "unquiesced: fencing new admission");
        self.fence(R::fence_reason(&u));
        self.unquiesced.push(u);
    }

    /// Closes a rail for good: no new work, its queued work is flushed by
    /// the next pump. Returns whether work was in flight on it; then the
    /// rail waits in the reap list until [`take_reapable`](Self::take_reapable)
    /// hands it back drained (when `reap_when_drained`).
    pub fn close_rail(&mut self, rail: RailId, now: Instant, reap_when_drained: bool) -> bool {
        let busy = self.core.close_rail(rail, now);
        self.unanswered_on(rail, "the rail was closed");
        if busy && reap_when_drained && !self.reap.contains(&rail) {
            self.reap.push(rail);
        }
        busy
    }

    /// Moves the closed rails that have no work in flight any more into
    /// `into`, for the driver to destroy.
    pub fn take_reapable(&mut self, into: &mut Vec<RailId>) {
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
