//! Admission: a batch checked against the tables and each request's
//! rails chosen, all or nothing.
//!
//! [`EngineState::validate`] checks every request of a batch, everything
//! [`Core::check`](crate::core::Core::check) would check included
//! (lengths, slice count, rails up, the fence), deciding once per run of
//! requests that name the same registration, peer, range and operation.
//! The [`Admission`] it returns then builds the core's requests one at a
//! time, so a driver can take a large batch in and post it a piece at a
//! time without building all of it first.

use std::sync::Arc;

use orbitte_topology::{DeviceMask, NicId};

use super::{EngineState, published_remote};
use crate::TransferRequest;
use crate::core::{Core, CoreRequest, RailList};
use crate::outcome::{RailRefusal, RequestError, SubmitError};
use crate::registration::RegState;
use crate::registration::Resources;
use crate::{PathKind, PeerId, RailId, RangeId, RegistrationId};

/// A validated batch: every request passed, none is in the core yet.
/// Iterating yields each request for the core, rails chosen and rotated,
/// in the batch's order.
#[derive(Debug)]
pub struct Admission<'b> {
    batch: &'b [TransferRequest],
    /// Runs of requests decided together, in order; each ends (exclusive)
    /// at its `end`.
    runs: Vec<Run>,
    /// The next request to build, and the run it is in.
    next: usize,
    run: usize,
    /// The rotation of the next request that has several rails.
    rotor: usize,
}

/// Requests up to `end` that share one decision.
#[derive(Debug)]
struct Run {
    end: usize,
    admitted: Admitted,
}

impl Iterator for Admission<'_> {
    type Item = CoreRequest;

    fn next(&mut self) -> Option<CoreRequest> {
        let r = self.batch.get(self.next)?;
        while self.runs[self.run].end <= self.next {
            self.run += 1;
        }
        let a = &self.runs[self.run].admitted;
        let mut rails = a.rails.clone();
        let k = rails.len();
        if k > 1 {
            rails.rotate_left(self.rotor % k);
            self.rotor = self.rotor.wrapping_add(1);
        }
        self.next += 1;
        Some(CoreRequest {
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
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.batch.len() - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Admission<'_> {}

impl<R: Resources> EngineState<R> {
    /// Validates a batch and chooses each request's rails: all admitted or
    /// none (the error names the first bad request). Nothing is submitted:
    /// the caller hands the result to [`Core::submit`](crate::core::Core::submit)
    /// (or calls [`submit`](Self::submit)).
    pub fn admit(
        &mut self,
        batch: &[TransferRequest],
        mask: DeviceMask,
    ) -> Result<Vec<CoreRequest>, SubmitError> {
        Ok(self.validate(batch, mask)?.collect())
    }

    /// Validates a batch as [`admit`](Self::admit) does, and returns what
    /// builds its requests for the core. The rotation among each request's
    /// rails is taken now, for the whole batch.
    pub fn validate<'b>(
        &mut self,
        batch: &'b [TransferRequest],
        mask: DeviceMask,
    ) -> Result<Admission<'b>, SubmitError> {
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
        // Requests of a batch usually name the same registration, peer,
        // range and operation: what depends on those alone (lookups, access,
        // rail choice) is decided once per run of them, the offsets and
        // lengths once per request.
        let mut runs: Vec<Run> = Vec::new();
        let mut rotating = 0usize;
        for (index, r) in batch.iter().enumerate() {
            let bad = |error| SubmitError::Invalid {
                index,
                label: r.label,
                error,
            };
            let (lend, rend) =
                Core::extent_ends(r.local_offset, r.remote_offset, r.len).map_err(bad)?;
            let a = match runs.last_mut() {
                Some(run) if run.admitted.serves(r) => {
                    // The checks `choose` makes on the offsets.
                    let a = &run.admitted;
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
                    run.end = index + 1;
                    &run.admitted
                }
                _ => {
                    let admitted = self.choose(r, lend, rend, mask).map_err(bad)?;
                    runs.push(Run {
                        end: index + 1,
                        admitted,
                    });
                    &runs[runs.len() - 1].admitted
                }
            };
            // More slices than the core counts.
            if r.len > a.max_len {
                return Err(bad(RequestError::Overflow {
                    offset: r.local_offset,
                    len: r.len,
                }));
            }
            if a.rails.len() > 1 {
                rotating += 1;
            }
        }
        let rotor = self.rotor;
        self.rotor = self.rotor.wrapping_add(rotating);
        Ok(Admission {
            batch,
            runs,
            next: 0,
            run: 0,
            rotor,
        })
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
        let local_size = R::len(&reg.memory);
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
                if desc.rkeys.is_empty() {
                    why.push(RailRefusal::TcpOnly {
                        rail,
                        range: r.range,
                    });
                    continue;
                }
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
            max_len: self.core.max_request_len(&rails),
            registration: r.registration,
            peer: r.peer,
            range: r.range,
            op: r.op,
            epoch: r.epoch,
            local_size,
            remote_size: desc.length,
            rails,
            pin: reg.pin.clone(),
        })
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

/// What [`EngineState::validate`] decided for a run of requests with the same
/// registration, peer, range and operation.
#[derive(Debug)]
struct Admitted {
    registration: RegistrationId,
    peer: PeerId,
    range: RangeId,
    op: crate::Op,
    /// The peer's epoch the requests were made for, checked once.
    epoch: Option<orbitte_wire::Epoch>,
    /// Bytes of the local registration.
    local_size: u64,
    /// Bytes of the remote range.
    remote_size: u64,
    /// Invariant: not empty.
    rails: RailList,
    /// The longest request the core can slice for these rails.
    max_len: u64,
    pin: Arc<dyn std::any::Any + Send + Sync>,
}

impl Admitted {
    /// Whether `r` names the same registration, peer (and epoch), range
    /// and operation.
    fn serves(&self, r: &TransferRequest) -> bool {
        self.registration == r.registration
            && self.peer == r.peer
            && self.epoch == r.epoch
            && self.range == r.range
            && self.op == r.op
    }
}
