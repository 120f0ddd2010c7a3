//! The rules of registration: budgets, ids, publication, retire and the
//! charges that failed releases keep.
//!
//! Making and closing memory regions is the driver's I/O. A Host Direct
//! registration runs in three steps:
//! [`EngineState::reserve_host_direct`] (refused while fenced or over
//! budget; the full charge is taken at once, so concurrent registrations
//! see it), the driver registers the copies on every context outside the
//! state, then [`EngineState::publish_host_direct`] when all succeeded or
//! [`EngineState::abandon_host_direct`] when one failed.

use orbitte_wire as wire;

use super::EngineState;
use crate::RegistrationId;
use crate::error::{RegisterRefusal, UnregisterRefusal};
use crate::registration::{
    Access, Charges, MemoryPath, NicCopies, RegEntry, RegState, Registration, Resources,
};

/// A Host Direct registration admitted and charged, whose memory regions
/// the driver is making.
#[derive(Debug)]
#[must_use = "publish or abandon the reservation, or its charge stays in the ledger"]
pub struct Reservation {
    /// The id the registration will have.
    pub id: RegistrationId,
    /// What it charged: every copy, the full range each.
    pub charge: Charges,
    len: u64,
    access: Access,
}

/// What cleanup failures retain: `failures` copies of `len` bytes each.
pub fn retained(failures: usize, len: u64) -> Charges {
    let mrs = failures as u64;
    Charges {
        mrs,
        bytes: mrs.saturating_mul(len),
    }
}

impl<R: Resources> EngineState<R> {
    /// Admits a Host Direct registration of `len` bytes with `access` on
    /// `contexts` NIC contexts: one copy per context for a local-only range,
    /// two for a remotely accessible one, each charged for the full range.
    /// Refused while fenced, or when a budget cannot hold every copy.
    pub fn reserve_host_direct(
        &mut self,
        len: u64,
        access: Access,
        contexts: usize,
    ) -> Result<Reservation, RegisterRefusal> {
        if let Some(reason) = self.fenced().cloned() {
            return Err(RegisterRefusal::Fenced { reason });
        }
        let copies = access.copies_per_context() * contexts as u64;
        let charge = Charges {
            mrs: copies,
            bytes: copies.saturating_mul(len),
        };
        self.ledger.check(charge)?;
        self.ledger.charge(charge);
        Ok(Reservation {
            id: self.fresh_registration_id(),
            charge,
            len,
            access,
        })
    }

    /// Publishes a reserved registration with the copies the driver made
    /// (every context's), its memory ranked `nic_order` by affinity, under
    /// the access `token` the driver drew.
    pub fn publish_host_direct(
        &mut self,
        r: Reservation,
        memory: R::Memory,
        copies: Vec<NicCopies<R>>,
        nic_order: Vec<(u32, u32)>,
        token: wire::AccessToken,
    ) -> Registration {
        let n = copies.len() as u64 * r.access.copies_per_context();
        let entry = RegEntry::published(memory, r.access, copies, r.charge, nic_order, token);
        self.tables.regs.insert(r.id.0, entry);
        Registration {
            id: r.id,
            len: r.len,
            access: r.access,
            copies: n,
            path: MemoryPath::HostDirect,
        }
    }

    /// Gives up a reserved registration whose copies could not all be made:
    /// its charge is released, except for the `failed_closes` copies the
    /// driver could not release (verbs retains them); returns what those
    /// keep charged.
    pub fn abandon_host_direct(&mut self, r: Reservation, failed_closes: usize) -> Charges {
        self.ledger.release(r.charge);
        self.retain(failed_closes, r.len)
    }

    /// Charges `failures` copies of `len` bytes that a failed release left
    /// retained; returns the charge.
    pub fn retain(&mut self, failures: usize, len: u64) -> Charges {
        let kept = retained(failures, len);
        self.ledger.charge(kept);
        kept
    }

    /// A fresh registration id (ids are never reused).
    pub fn fresh_registration_id(&mut self) -> RegistrationId {
        let id = self.next_reg;
        self.next_reg += 1;
        RegistrationId(id)
    }

    /// Unpublishes a registration: new requests on it are refused from now
    /// on. Returns its remote-access regions for the driver to close, then
    /// [`retired_closed`](Self::retired_closed).
    pub fn retire_registration(
        &mut self,
        registration: RegistrationId,
    ) -> Result<Vec<R::Region>, UnregisterRefusal> {
        let entry = self
            .tables
            .regs
            .get_mut(&registration.0)
            .ok_or(UnregisterRefusal::Unknown(registration))?;
        entry.state = RegState::Retired;
        Ok(entry
            .copies
            .iter_mut()
            .filter_map(|c| c.remote.take())
            .collect())
    }

    /// `closed` of a retired registration's remote-access regions were
    /// released: their charge goes back to the budgets (those that failed
    /// stay charged to the entry).
    pub fn retired_closed(&mut self, registration: RegistrationId, closed: usize) {
        let Some(entry) = self.tables.regs.get_mut(&registration.0) else {
            return;
        };
        let released = retained(closed, R::len(&entry.memory));
        entry.charge.mrs = entry.charge.mrs.saturating_sub(released.mrs);
        entry.charge.bytes = entry.charge.bytes.saturating_sub(released.bytes);
        self.ledger.release(released);
    }

    /// Takes every registration out of the table (shutdown), releasing
    /// their charges; the driver closes their copies and
    /// [`retain`](Self::retain)s what fails.
    pub fn take_all_registrations(&mut self) -> Vec<RegEntry<R>> {
        let entries: Vec<RegEntry<R>> = self.tables.regs.drain().map(|(_, e)| e).collect();
        for e in &entries {
            self.ledger.release(e.charge);
        }
        entries
    }
}
