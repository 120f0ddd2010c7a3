//! The driver's side of the cuda-staging path: how `register`, `submit`,
//! `cancel`, `wait` and shutdown reach the CUDA registrations and staged
//! requests in the engine's table (`staging::table`) and the device lanes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{State, TransferEngine, TransferRequest};
use crate::error::{RegisterError, UnregisterError};
use crate::outcome::{RequestError, RequestId, SubmitError};
use crate::registration::{Access, MemoryPath, Registration};
use crate::session::{Published, ServedMemory};
use crate::staging::pools::Job;
use crate::staging::table::{CudaEntry, StagedEntry};
use crate::transport::tcp::staged::{DeviceBounces, DeviceRange};
use crate::transport::{PathKind, RegistrationId};
use orbitte_cuda::CudaBuffer;

/// Cancels every staged request without an outcome (the engine stops): no
/// further chunk starts and the chunk requests in flight are cancelled, so
/// the lanes end soon.
pub(crate) fn cancel_all(st: &mut State) {
    let now = std::time::Instant::now();
    let running: Vec<RequestId> = st
        .staged
        .requests
        .values()
        .filter(|e| e.outcome_pending)
        .filter_map(|e| {
            e.cancel.store(true, Ordering::Release);
            e.current
        })
        .collect();
    for chunk in running {
        st.cancel(now, chunk);
    }
    st.pump(now);
}

impl TransferEngine {
    /// `register` for GPU memory: makes the device's lanes if it has none,
    /// then records the buffer (no MR for it). A remotely accessible one
    /// is also published, with no rkeys and no local hint: the tcp target
    /// serves it through host bounce buffers (`transport::tcp::staged`).
    pub(crate) fn register_cuda(
        &self,
        buffer: Arc<CudaBuffer>,
        access: Access,
    ) -> Result<Registration, RegisterError> {
        if let Some(reason) = self.lock().engine.core().fenced().cloned() {
            return Err(RegisterError::Fenced { reason });
        }
        let device = buffer.device().index();
        self.shared.staging.pool_for(self, buffer.device())?;
        let mut st = self.lock();
        let id = st.engine.fresh_registration_id().0;
        let len = buffer.len() as u64;
        let published = access.is_remote().then(|| {
            let bounces = st
                .staged
                .bounces
                .entry(device)
                .or_insert_with(|| DeviceBounces::new(buffer.device().clone()))
                .clone();
            Published {
                memory: ServedMemory::Device(Arc::new(DeviceRange::new(
                    id,
                    buffer.clone(),
                    bounces,
                ))),
                offset: 0,
                length: len,
                access: access.wire_flags(),
                token: crate::registration::fresh_token(),
            }
        });
        st.staged.changed |= published.is_some();
        st.staged.regs.insert(
            id,
            CudaEntry {
                buffer,
                device,
                pin: Arc::new(()),
                published,
            },
        );
        tracing::debug!(
            id,
            len,
            device,
            ?access,
            "cuda-staging registration (staged through host memory)"
        );
        Ok(Registration {
            id: RegistrationId(id),
            len,
            access,
            copies: 0,
            path: MemoryPath::CudaStaging,
        })
    }

    /// `unregister` for GPU memory (`None`: not a CUDA registration).
    /// Refused while a request on it is undrained; the last registration
    /// of a device stops its lanes and unregisters their bounce buffers.
    pub(crate) fn unregister_cuda(
        &self,
        registration: RegistrationId,
    ) -> Option<Result<(), UnregisterError>> {
        let device = {
            let mut st = self.lock();
            let e = st.staged.regs.get(&registration.0)?;
            let requests = Arc::strong_count(&e.pin) - 1;
            if requests > 0 {
                return Some(Err(UnregisterError::Undrained {
                    id: registration,
                    requests,
                }));
            }
            let device = e.device;
            let published = st
                .staged
                .regs
                .remove(&registration.0)
                .and_then(|e| e.published);
            st.staged.changed |= published.is_some();
            let still_used = st.staged.regs.values().any(|e| e.device == device);
            if !still_used {
                st.staged.bounces.remove(&device);
            }
            (!still_used).then_some(device)
        };
        if let Some(device) = device {
            self.shared.staging.close(self, device);
        }
        Some(Ok(()))
    }

    /// The index of the first request of `batch` whose local memory is on
    /// a GPU.
    pub(crate) fn first_staged(&self, batch: &[TransferRequest]) -> Option<usize> {
        let st = self.lock();
        batch.iter().position(|r| st.staged.is_cuda(r.registration))
    }

    /// `submit` for a batch with cuda-staging requests: every request is
    /// checked (staged ones here, host ones by the core) before any is
    /// admitted; then the staged ones are queued on their device's lanes.
    pub(crate) fn submit_with_staged(
        &self,
        batch: &[TransferRequest],
    ) -> Result<Vec<RequestId>, SubmitError> {
        let pools = self.shared.staging.snapshot();
        let mut jobs = Vec::new();
        {
            let st = self.lock();
            if let Some(reason) = st.engine.core().fenced() {
                return Err(SubmitError::Fenced {
                    index: 0,
                    label: batch.first().map_or(0, |r| r.label),
                    reason: reason.clone(),
                });
            }
            for (index, r) in batch.iter().enumerate() {
                let Some(e) = st.staged.regs.get(&r.registration.0) else {
                    continue;
                };
                let bad = |error| SubmitError::Invalid {
                    index,
                    label: r.label,
                    error,
                };
                check(&st, e, r).map_err(bad)?;
                let lanes = pools.get(&e.device).map(|p| p.refusal());
                if let Some(Some(reasons)) = lanes {
                    return Err(bad(RequestError::StagingFenced {
                        device: e.device,
                        reasons: reasons.into(),
                    }));
                }
                jobs.push((index, e.device, e.buffer.clone(), e.pin.clone()));
            }
        }
        // The host requests, admitted all or none by the core.
        let host: Vec<(usize, TransferRequest)> = batch
            .iter()
            .copied()
            .enumerate()
            .filter(|(i, _)| !jobs.iter().any(|j| j.0 == *i))
            .collect();
        let mut ids = vec![RequestId(0); batch.len()];
        if !host.is_empty() {
            let reqs: Vec<TransferRequest> = host.iter().map(|(_, r)| *r).collect();
            let admitted = self
                .submit_inner(&reqs, None, crate::request::Posting::Inline)
                .map_err(|e| match e {
                    SubmitError::Invalid {
                        index,
                        label,
                        error,
                    } => SubmitError::Invalid {
                        index: host.get(index).map_or(index, |h| h.0),
                        label,
                        error,
                    },
                    other => other,
                })?;
            for ((i, _), id) in host.iter().zip(admitted) {
                ids[*i] = id;
            }
        }
        let mut queued = Vec::with_capacity(jobs.len());
        {
            let mut st = self.lock();
            let taken: Vec<RequestId> = st
                .staged
                .requests
                .iter()
                .filter(|(id, e)| {
                    !e.outcome_pending
                        && !e.running
                        && e.copies_drained
                        && e.network.is_empty()
                        && !st.engine.has_outcome(id)
                })
                .map(|(id, _)| *id)
                .collect();
            for id in taken {
                st.staged.requests.remove(&id);
            }
            let now = std::time::Instant::now();
            for (index, device, buffer, pin) in jobs {
                let id = st.staged.next_id();
                let cancel = Arc::new(AtomicBool::new(false));
                st.staged.requests.insert(
                    id,
                    StagedEntry {
                        outcome_pending: true,
                        running: true,
                        copies_drained: true,
                        network: Vec::new(),
                        current: None,
                        cancel: cancel.clone(),
                    },
                );
                ids[index] = id;
                let cell = st.cell_of(
                    &self.shared.metrics,
                    batch[index].peer,
                    PathKind::CudaStaging,
                );
                st.counting.start(id, cell, now);
                queued.push((
                    device,
                    Job {
                        id,
                        req: batch[index],
                        buffer,
                        pin,
                        cancel,
                    },
                ));
            }
        }
        for (device, job) in queued {
            match pools.get(&device) {
                Some(pool) => pool.enqueue(&self.shared, job),
                None => {
                    crate::staging::lanes::fail_unrun(&self.shared, job, "no cuda-staging lanes")
                }
            }
        }
        Ok(ids)
    }

    /// `cancel` for a staged request (`None`: not one): no further chunk
    /// starts and the chunk request in flight is cancelled.
    pub(crate) fn cancel_staged(&self, id: RequestId) -> Option<bool> {
        let mut st = self.lock();
        let e = st.staged.requests.get(&id)?;
        if !e.outcome_pending {
            return Some(false);
        }
        e.cancel.store(true, Ordering::Release);
        if let Some(chunk) = e.current {
            let now = std::time::Instant::now();
            st.cancel(now, chunk);
            st.pump(now);
        }
        Some(true)
    }

    /// The state of the lanes of CUDA device `device` (`None`: the engine
    /// has no lanes there; they are made by the first CUDA registration on
    /// the device).
    pub fn cuda_staging(&self, device: usize) -> Option<crate::staging::StagingStatus> {
        self.shared
            .staging
            .snapshot()
            .get(&device)
            .map(|p| p.status())
    }
}

/// Checks a staged request against its GPU buffer and the peer's
/// published range.
fn check(st: &State, e: &CudaEntry, r: &TransferRequest) -> Result<(), RequestError> {
    if r.len == 0 {
        return Err(RequestError::ZeroLength);
    }
    let end = |offset: u64| {
        offset
            .checked_add(r.len)
            .ok_or(RequestError::Overflow { offset, len: r.len })
    };
    let size = e.buffer.len() as u64;
    if end(r.local_offset)? > size {
        return Err(RequestError::OutOfRange {
            side: "gpu",
            offset: r.local_offset,
            len: r.len,
            size,
        });
    }
    let rend = end(r.remote_offset)?;
    crate::engine::published_remote(st.engine.tables(), r, rend)?;
    Ok(())
}
