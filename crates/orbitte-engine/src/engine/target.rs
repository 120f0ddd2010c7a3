//! Who posts to a rail ([`Target`]: the rdma rail's cell, another path's
//! transport) and the rail's post lock (see `post`).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::transport::rdma::{RailCell, lock_cell};
use crate::transport::{PostContext, PostError, RailId, Transport, TransportEvent, WorkItem};

/// Who posts to a rail.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Rdma(Arc<Mutex<RailCell>>),
    Other(Arc<dyn Transport>),
    /// The rail has no transport (cannot happen while the tables are
    /// consistent): its posts fail.
    Missing,
}

impl Target {
    /// Posts a run of `rail`; events of items executed while posting go
    /// into `done`.
    pub(crate) fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        match self {
            Self::Rdma(cell) => lock_cell(cell).post(rail, items, ctx),
            Self::Other(t) => t.post_inline(rail, items, ctx, done),
            Self::Missing => Err(PostError {
                rail,
                posted: 0,
                reason: "no transport".into(),
            }),
        }
    }
}

/// Takes a rail's post lock (a poisoned one as is: it guards no data).
pub(crate) fn lock_lane(lane: &Mutex<()>) -> MutexGuard<'_, ()> {
    lane.lock().unwrap_or_else(|e| e.into_inner())
}
