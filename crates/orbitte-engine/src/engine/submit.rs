//! Admission of a batch: validation, rail choice, submission to the core.

use std::time::Instant;

use orbitte_topology::NicId;

use super::{TransferEngine, TransferRequest, published_remote};
use crate::core::CoreRequest;
use crate::outcome::{RailRefusal, RequestError, RequestId, SubmitError};
use crate::registration::RegState;
use crate::transport::RailId;

impl TransferEngine {
    /// Submits a batch of READ/WRITE requests ([`Request`](crate::Request),
    /// or the positional [`TransferRequest`]): all admitted or none (a typed
    /// error names the first bad request; nothing is posted then). Remote
    /// addresses are resolved against the peers' publications now. Returns
    /// at once; every request ends with an [`Outcome`] ([`poll`](Self::poll),
    /// [`wait`](Self::wait)).
    pub fn submit<R: Into<crate::Request> + Copy>(
        &self,
        batch: &[R],
    ) -> Result<Vec<RequestId>, SubmitError> {
        let resolved = self.resolve(batch)?;
        if self.first_staged(&resolved).is_some() {
            return self.submit_with_staged(&resolved);
        }
        self.submit_inner(&resolved, None)
    }

    /// Admits a batch whose remote addresses are resolved
    /// ([`submit`](Self::submit)), tracking its notification if it carries
    /// one.
    pub(crate) fn submit_inner(
        &self,
        batch: &[TransferRequest],
        notification: Option<crate::notify::Armed>,
    ) -> Result<Vec<RequestId>, SubmitError> {
        let span = tracing::trace_span!("submit", requests = batch.len());
        let _g = span.enter();
        let mut guard = self.lock();
        let st = &mut *guard;
        let now = Instant::now();
        let Some(first) = batch.first() else {
            return Err(SubmitError::Empty);
        };
        if let Some(reason) = st.core.fenced() {
            return Err(SubmitError::Fenced {
                index: 0,
                label: first.label,
                reason: reason.clone(),
            });
        }
        let mask = self.shared.settings.dispatch_mask;
        let mut reqs = Vec::with_capacity(batch.len());
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
            let Some(reg) = st
                .tables
                .regs
                .get(&r.registration.0)
                .filter(|e| e.state == RegState::Published)
            else {
                return Err(bad(RequestError::UnpublishedLocal(r.registration)));
            };
            let size = reg.memory.len() as u64;
            if lend > size {
                return Err(bad(RequestError::OutOfRange {
                    side: "local",
                    offset: r.local_offset,
                    len: r.len,
                    size,
                }));
            }
            let (peer, desc) = published_remote(&st.tables, r, rend).map_err(bad)?;
            let mut why = Vec::new();
            let mut rails = Vec::with_capacity(peer.rails.len());
            for &rail in &peer.rails {
                let spec = st.core.rail_spec(rail);
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
                if !st.core.rail_is_up(rail) {
                    why.push(match st.core.rail_down_reason(rail) {
                        Some(reason) => RailRefusal::Down { rail, reason },
                        None => RailRefusal::Unknown { rail },
                    });
                    continue;
                }
                if let Some(n) = nic
                    && spec.is_some_and(|s| s.path == crate::transport::PathKind::Rdma)
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
                return Err(bad(RequestError::NoRail { peer: r.peer, why }));
            }
            // Affinity allows the rails whose NIC is in the best class for
            // this memory among the usable ones (all of them when the
            // memory's location is unknown); rotate among those.
            let class = |rail: &RailId| {
                let nic = st.core.rail_spec(*rail).and_then(|s| s.nic);
                nic.map_or(0, |n| reg.affinity_class(n))
            };
            if let Some(best) = rails.iter().map(class).min() {
                rails.retain(|r| class(r) == best);
            }
            let k = rails.len();
            rails.rotate_left(st.rotor % k);
            st.rotor = st.rotor.wrapping_add(1);
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
                keepalive: Some(reg.pin.clone()),
            });
        }
        let notification = notification.map(|a| a.on_rails(&reqs));
        let ids = st.core.submit(now, reqs)?;
        if let Some(armed) = notification {
            crate::notify::track(st, &ids, armed);
        }
        st.pump(now);
        Ok(ids)
    }
}
