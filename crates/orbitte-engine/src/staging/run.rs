//! One staged request on a lane: the pipeline's device copies, one engine
//! request per chunk on the bounce buffers, and the outcome into the
//! engine's outcome table.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use orbitte_cuda::StagedChunk;

use super::StagingConfig;
use super::finish::{ChunkError, Finished, Net};
use super::pools::{Bounce, Job, Lane};
use crate::engine::{Shared, TransferEngine, TransferRequest};
use crate::error::WaitError;
use crate::outcome::{DrainStatus, Outcome, RequestId};
use crate::transport::Op;

/// Runs `job` on `lane` (the lane's thread) and returns how it ended.
pub(super) fn run(
    engine: &TransferEngine,
    config: &StagingConfig,
    lane: &mut Lane,
    job: &Job,
) -> Finished {
    let req = &job.req;
    let span = tracing::debug_span!(
        "cuda_staging",
        op = %req.op,
        lane = lane.index,
        len = req.len,
        label = req.label
    );
    let _entered = span.enter();
    if job.cancel.load(Ordering::Acquire) {
        return super::finish::cancelled_before_start(job, config.chunk);
    }
    let runner = Runner {
        engine,
        config,
        job,
    };
    let mut net = Net::default();
    // Checked at submit: both fit usize (the GPU range lies in an
    // allocation).
    let (offset, len) = (req.local_offset as usize, req.len as usize);
    let Lane {
        pipeline, bounces, ..
    } = lane;
    let result = match req.op {
        Op::Write => pipeline.download(&job.buffer, offset, len, |c| {
            runner.chunk(bounces, c, &mut net)
        }),
        Op::Read => pipeline.upload(&job.buffer, offset, len, |c| {
            runner.chunk(bounces, c, &mut net)
        }),
    };
    let done = super::finish::outcome(job, config.chunk, result, net);
    tracing::debug!(status = ?done.outcome.status, prefix = done.outcome.completed_prefix, "staged request finished");
    done
}

/// Puts a staged request's outcome into the engine's outcome table and
/// records what still holds its memory; wakes the waiters.
pub(super) fn publish(shared: &Shared, id: RequestId, done: Finished) {
    let mut guard = shared.lock();
    let st = &mut *guard;
    st.staged
        .ended(id, done.copies_drained, done.network.clone());
    let mut outcome = done.outcome;
    outcome.drain = st
        .staged
        .drain_status(&st.engine, id)
        .unwrap_or(DrainStatus::Drained);
    st.engine.insert_outcome(id, outcome);
}

struct Runner<'a> {
    engine: &'a TransferEngine,
    config: &'a StagingConfig,
    job: &'a Job,
}

impl Runner<'_> {
    /// One chunk: for a WRITE its bytes are in the bounce buffer (copy
    /// synchronized); for a READ the bounce buffer must hold them on return.
    fn chunk(
        &self,
        bounces: &[Bounce],
        c: &StagedChunk<'_>,
        net: &mut Net,
    ) -> Result<(), ChunkError> {
        if self.job.cancel.load(Ordering::Acquire) {
            return Err(ChunkError::Cancelled);
        }
        let Some(b) = bounces.iter().find(|b| Arc::ptr_eq(&b.pinned, c.buffer())) else {
            return Err(ChunkError::Internal(
                "a staged chunk is in a buffer this lane did not register".into(),
            ));
        };
        let req = &self.job.req;
        let len = c.len() as u64;
        let at = c.buffer_offset() as u64;
        let remote_offset = req.remote_offset + c.offset() as u64;
        // The engine registered the pinned buffer itself: for a WRITE the
        // synchronized device copy is already where the NIC reads; for a
        // READ the NIC writes where the copy to the device reads.
        let tr = match req.op {
            Op::Write => {
                TransferRequest::write(b.registration, at, req.peer, req.range, remote_offset, len)
            }
            Op::Read => {
                TransferRequest::read(b.registration, at, req.peer, req.range, remote_offset, len)
            }
        };
        let o = self.transfer(tr.label(req.label), net)?;
        tracing::trace!(chunk = c.index(), request = %o.request, "chunk moved");
        Ok(())
    }

    /// Submits one chunk request and waits for its outcome and its drain.
    fn transfer(&self, tr: TransferRequest, net: &mut Net) -> Result<Outcome, ChunkError> {
        let engine = self.engine;
        let id = match engine.submit_inner(&[tr], None, crate::request::Posting::Inline) {
            Ok(ids) => match ids.first() {
                Some(id) => *id,
                None => {
                    return Err(ChunkError::Internal(
                        "the engine accepted the chunk request but returned no request id".into(),
                    ));
                }
            },
            Err(e) => return Err(ChunkError::Refused(e)),
        };
        engine.lock().staged.set_current(self.job.id, Some(id));
        if self.job.cancel.load(Ordering::Acquire) {
            engine.cancel(id);
        }
        let o = match engine.wait(id, self.config.chunk_wait) {
            Ok(o) => o,
            Err(WaitError::TimedOut(_)) => {
                engine.cancel(id);
                match engine.wait(id, Duration::from_secs(1)) {
                    Ok(o) => o,
                    Err(e) => return Err(self.lost(id, e, net)),
                }
            }
            Err(e) => return Err(self.lost(id, e, net)),
        };
        let drained = o.drain == DrainStatus::Drained
            || engine.wait_drain(id, self.config.drain_wait).is_ok();
        if !drained {
            net.undrained.push(id);
        }
        engine.lock().staged.set_current(self.job.id, None);
        if o.is_complete() && drained {
            Ok(o)
        } else {
            Err(ChunkError::Network {
                outcome: Box::new(o),
                drained,
            })
        }
    }

    /// A request whose outcome cannot be had: treated as undrained.
    fn lost(&self, id: RequestId, e: WaitError, net: &mut Net) -> ChunkError {
        tracing::warn!(error = %e, "lost a chunk request's outcome");
        if self.engine.wait_drain(id, self.config.drain_wait).is_err() {
            net.undrained.push(id);
        }
        self.engine.lock().staged.set_current(self.job.id, None);
        ChunkError::Internal(e.to_string())
    }
}
