//! Turning the pipeline's result into a staged request's outcome.

use orbitte_cuda::{StagingError, StagingFailure};

use super::{CudaStaging, StagedFailure, StagedOutcome, StagedRequest, StagingDrain};
use crate::outcome::{Outcome, RemoteEffect, RequestId, Status, SubmitError};
use crate::transport::Op;

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
    #[error("{0}")]
    Internal(String),
}

impl CudaStaging<'_> {
    /// Builds the outcome of a staged request from the pipeline's result.
    pub(super) fn outcome(
        &self,
        req: &StagedRequest,
        lane: usize,
        result: Result<orbitte_cuda::StagingReport, StagingError<ChunkError>>,
        net: Net,
    ) -> StagedOutcome {
        let chunk = self.chunk as u64;
        let chunks = u32::try_from(req.len.div_ceil(chunk)).unwrap_or(u32::MAX);
        let mut o = StagedOutcome {
            label: req.label,
            op: req.op,
            len: req.len,
            status: Status::Complete,
            completed_prefix: req.len,
            chunk_size: chunk,
            chunks,
            completed_chunks: chunks,
            failure: None,
            uncertain: req.len..req.len,
            remote_effect: match req.op {
                Op::Write => RemoteEffect::Complete,
                Op::Read => RemoteEffect::None,
            },
            drain: StagingDrain::Drained,
            lane,
        };
        let e = match result {
            Ok(_) if net.undrained.is_empty() => return o,
            Ok(_) => {
                // Cannot happen (a chunk that did not drain fails its
                // handler), but never claim a drain that was not seen.
                o.drain = StagingDrain::Pending {
                    copies_drained: true,
                    network: net.undrained,
                };
                return o;
            }
            Err(e) => e,
        };
        let copies_drained = e.drained;
        let landed = e.completed as u64;
        // For a WRITE: (prefix, end of uncertain bytes, anything posted for
        // the failed chunk); for a READ the destination is the GPU.
        let (prefix, uncertain_end, posted, status, failure) = match e.failure {
            StagingFailure::Handler { offset, source } => {
                let offset = offset as u64;
                let index = u32::try_from(offset / chunk).unwrap_or(u32::MAX);
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
                            Status::TimedOut | Status::Cancelled => Status::TimedOut,
                            _ => Status::Failed,
                        };
                        let posted = outcome.remote_effect != RemoteEffect::None
                            || outcome.status == Status::Complete;
                        let f = StagedFailure::Network {
                            chunk: index,
                            offset,
                            request: outcome.request,
                            status: outcome.status,
                            // Request-relative, like every offset here.
                            info: outcome.failure.map(|mut i| {
                                i.offset += offset;
                                i
                            }),
                            drained,
                        };
                        (prefix, end, posted, status, f)
                    }
                    ChunkError::Refused(error) => (
                        landed,
                        landed,
                        false,
                        Status::Failed,
                        StagedFailure::Refused {
                            chunk: index,
                            offset,
                            error,
                        },
                    ),
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
                            StagedFailure::Internal {
                                chunk: index,
                                offset,
                                reason,
                            },
                        )
                    }
                }
            }
            StagingFailure::Copy(error) => (
                landed,
                landed,
                false,
                Status::Failed,
                StagedFailure::Copy { error },
            ),
            StagingFailure::Unquiesced(error) => (
                landed,
                landed,
                false,
                Status::Failed,
                StagedFailure::Unquiesced { error },
            ),
            other => (
                landed,
                (landed + chunk).min(req.len),
                true,
                Status::Failed,
                StagedFailure::Internal {
                    chunk: u32::try_from(landed / chunk).unwrap_or(u32::MAX),
                    offset: landed,
                    reason: other.to_string(),
                },
            ),
        };
        o.status = status;
        o.completed_prefix = prefix.min(req.len);
        o.completed_chunks = if o.completed_prefix == req.len {
            chunks
        } else {
            u32::try_from(o.completed_prefix / chunk).unwrap_or(u32::MAX)
        };
        o.failure = Some(failure);
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
        if !copies_drained || !net.undrained.is_empty() {
            o.drain = StagingDrain::Pending {
                copies_drained,
                network: net.undrained,
            };
        }
        o
    }
}
