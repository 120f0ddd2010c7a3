//! Turning the pipeline's result into a staged request's [`Outcome`].

use orbitte_cuda::{StagingError, StagingFailure};

use super::pools::Job;
use crate::notify::NotificationStatus;
use crate::outcome::{
    ChunkFailure, DrainStatus, FailureInfo, Outcome, RemoteEffect, RequestId, Status, SubmitError,
};
use crate::transport::{DeviceError, Op, PathKind, SliceFailure};

/// Per-request state of the chunk handler.
#[derive(Debug, Default)]
pub(super) struct Net {
    pub(super) undrained: Vec<RequestId>,
}

/// Why a chunk's network part failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ChunkError {
    #[error("chunk request ended {:?}", outcome.status)]
    Network {
        outcome: Box<Outcome>,
        drained: bool,
    },
    #[error("chunk request refused: {0}")]
    Refused(SubmitError),
    #[error("cancelled")]
    Cancelled,
    #[error("{0}")]
    Internal(String),
}

/// How a staged request ended: its outcome (drain filled in when it is
/// published) and what still holds its memory.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) outcome: Outcome,
    /// The lane's copies drained (false: unquiesced for good).
    pub(crate) copies_drained: bool,
    /// Chunk requests that had not drained.
    pub(crate) network: Vec<RequestId>,
}

/// The outcome of a request that ran completely.
fn complete(job: &Job, chunk: u64) -> Outcome {
    let req = &job.req;
    let chunks = u32::try_from(req.len.div_ceil(chunk)).unwrap_or(u32::MAX);
    Outcome {
        request: job.id,
        label: req.label,
        op: req.op,
        len: req.len,
        status: Status::Complete,
        completed_prefix: req.len,
        completed_slices: chunks,
        slices: chunks,
        failure: None,
        uncertain: req.len..req.len,
        remote_effect: match req.op {
            Op::Write => RemoteEffect::Complete,
            Op::Read => RemoteEffect::None,
        },
        drain: DrainStatus::Drained,
        notification: NotificationStatus::NotRequested,
    }
}

/// A request that never ran: nothing posted, nothing moved.
fn nothing_done(job: &Job, chunk: usize, status: Status, failure: Option<FailureInfo>) -> Finished {
    let mut o = complete(job, chunk as u64);
    o.status = status;
    o.completed_prefix = 0;
    o.completed_slices = 0;
    o.failure = failure.map(Box::new);
    o.uncertain = 0..0;
    o.remote_effect = RemoteEffect::None;
    Finished {
        outcome: o,
        copies_drained: true,
        network: Vec::new(),
    }
}

/// The outcome of a request cancelled before a lane took it.
pub(super) fn cancelled_before_start(job: &Job, chunk: usize) -> Finished {
    nothing_done(job, chunk, Status::Cancelled, None)
}

/// The outcome of a request no lane could run (every lane unquiesced, or
/// the lanes stopped).
pub(super) fn unrun(job: &Job, why: &str) -> Finished {
    let failure = FailureInfo {
        slice: 0,
        offset: 0,
        rail: None,
        path: PathKind::CudaStaging,
        nic: None,
        status: SliceFailure::Internal(why.into()),
        chunk: Some(ChunkFailure {
            index: 0,
            offset: 0,
            request: None,
            status: None,
            drained: true,
        }),
    };
    nothing_done(job, 1, Status::Failed, Some(failure))
}

/// A failure of the lane itself (no rail).
fn lane_failure(index: u32, offset: u64, status: SliceFailure, drained: bool) -> FailureInfo {
    FailureInfo {
        slice: 0,
        offset,
        rail: None,
        path: PathKind::CudaStaging,
        nic: None,
        status,
        chunk: Some(ChunkFailure {
            index,
            offset,
            request: None,
            status: None,
            drained,
        }),
    }
}

/// Builds the outcome of a staged request from the pipeline's result.
pub(super) fn outcome(
    job: &Job,
    chunk: usize,
    result: Result<orbitte_cuda::StagingReport, StagingError<ChunkError>>,
    net: Net,
) -> Finished {
    let req = &job.req;
    let chunk = chunk as u64;
    let mut o = complete(job, chunk);
    let chunks = o.slices;
    let e = match result {
        // A chunk that did not drain fails its handler, so an Ok has every
        // chunk request drained; never claim a drain that was not seen.
        Ok(_) => {
            return Finished {
                outcome: o,
                copies_drained: true,
                network: net.undrained,
            };
        }
        Err(e) => e,
    };
    let copies_drained = e.drained;
    let landed = e.completed as u64;
    let index_of = |offset: u64| u32::try_from(offset / chunk).unwrap_or(u32::MAX);
    // A device copy stopped the request: nothing of its chunk was posted.
    let copy_stop = |status| {
        let f = lane_failure(index_of(landed), landed, status, copies_drained);
        (landed, landed, false, Status::Failed, Some(f))
    };
    // For a WRITE: (prefix, end of uncertain bytes, anything posted for
    // the failed chunk); for a READ the destination is the GPU.
    let (prefix, uncertain_end, posted, status, failure) = match e.failure {
        StagingFailure::Handler { offset, source } => {
            let offset = offset as u64;
            let index = index_of(offset);
            match source {
                ChunkError::Network { outcome, drained } => {
                    let (prefix, end) = match req.op {
                        Op::Write => (
                            offset + outcome.completed_prefix,
                            offset + outcome.uncertain.end.max(outcome.completed_prefix),
                        ),
                        Op::Read => (landed, landed),
                    };
                    let status = match outcome.status {
                        Status::TimedOut => Status::TimedOut,
                        Status::Cancelled
                            if job.cancel.load(std::sync::atomic::Ordering::Acquire) =>
                        {
                            Status::Cancelled
                        }
                        Status::Cancelled => Status::TimedOut,
                        _ => Status::Failed,
                    };
                    let posted = outcome.remote_effect != RemoteEffect::None
                        || outcome.status == Status::Complete;
                    let step = ChunkFailure {
                        index,
                        offset,
                        request: Some(outcome.request),
                        status: Some(outcome.status),
                        drained,
                    };
                    // Request-relative, like every offset here.
                    let f = match outcome.failure {
                        Some(i) => FailureInfo {
                            offset: i.offset + offset,
                            chunk: Some(step),
                            ..*i
                        },
                        None => FailureInfo {
                            slice: 0,
                            offset: offset + outcome.completed_prefix,
                            rail: None,
                            path: PathKind::CudaStaging,
                            nic: None,
                            status: SliceFailure::Ended(outcome.status),
                            chunk: Some(step),
                        },
                    };
                    (prefix, end, posted, status, Some(f))
                }
                ChunkError::Refused(error) => (
                    landed,
                    landed,
                    false,
                    Status::Failed,
                    Some(lane_failure(
                        index,
                        offset,
                        SliceFailure::Refused(Box::new(error)),
                        true,
                    )),
                ),
                ChunkError::Cancelled => (landed, landed, false, Status::Cancelled, None),
                ChunkError::Internal(reason) => {
                    tracing::error!(%reason, "cuda-staging chunk failed");
                    // Unknown whether the chunk was posted: uncertain.
                    let end = match req.op {
                        Op::Write => (offset + chunk).min(req.len),
                        Op::Read => landed,
                    };
                    (
                        landed,
                        end,
                        true,
                        Status::Failed,
                        Some(lane_failure(
                            index,
                            offset,
                            SliceFailure::Internal(reason.into()),
                            copies_drained,
                        )),
                    )
                }
            }
        }
        StagingFailure::Copy(error) => copy_stop(SliceFailure::DeviceCopy(DeviceError::new(error))),
        StagingFailure::Unquiesced(error) => {
            copy_stop(SliceFailure::PipelineUnquiesced(DeviceError::new(error)))
        }
        other => (
            landed,
            (landed + chunk).min(req.len),
            true,
            Status::Failed,
            Some(lane_failure(
                index_of(landed),
                landed,
                SliceFailure::Internal(other.to_string().into()),
                copies_drained,
            )),
        ),
    };
    o.status = status;
    o.completed_prefix = prefix.min(req.len);
    o.completed_slices = if o.completed_prefix == req.len {
        chunks
    } else {
        index_of(o.completed_prefix)
    };
    o.failure = failure.map(Box::new);
    o.uncertain = match req.op {
        // A READ whose copies did not drain may have written GPU bytes
        // past the prefix (an issued copy may still land).
        Op::Read if !copies_drained => o.completed_prefix..req.len,
        _ => o.completed_prefix..uncertain_end.clamp(o.completed_prefix, req.len),
    };
    o.remote_effect = match req.op {
        Op::Read => RemoteEffect::None,
        Op::Write if o.completed_prefix == 0 && !posted => RemoteEffect::None,
        Op::Write => RemoteEffect::Possible {
            bytes: o.uncertain.clone(),
        },
    };
    Finished {
        outcome: o,
        copies_drained,
        network: net.undrained,
    }
}
