//! Who posts to a rail ([`Target`]: the rdma rail's cell, another path's
//! transport) and the rail's post lock (see `post`).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::request::Posting;
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
    /// Posts a run of `rail`; with [`Posting::Inline`], events of items
    /// executed while posting go into `done`.
    pub(crate) fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        posting: Posting,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        match self {
            Self::Rdma(cell) => lock_cell(cell).post(rail, items, ctx),
            Self::Other(t) => match posting {
                Posting::Inline => t.post_inline(rail, items, ctx, done),
                Posting::Queued => t.post(rail, items, ctx),
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{CleanupError, PathKind};

    /// Records which of its posting calls ran.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<&'static str>>);

    impl Transport for Recorder {
        fn path(&self) -> PathKind {
            PathKind::Local
        }
        fn post(&self, _: RailId, _: &[WorkItem], _: &dyn PostContext) -> Result<(), PostError> {
            self.0.lock().unwrap().push("post");
            Ok(())
        }
        fn post_inline(
            &self,
            _: RailId,
            _: &[WorkItem],
            _: &dyn PostContext,
            _: &mut Vec<TransportEvent>,
        ) -> Result<(), PostError> {
            self.0.lock().unwrap().push("post_inline");
            Ok(())
        }
        fn flush(&self, _: RailId) -> Result<(), CleanupError> {
            Ok(())
        }
        fn close_rail(&self, _: RailId) -> Result<(), CleanupError> {
            Ok(())
        }
    }

    #[test]
    fn queued_posting_never_lets_the_transport_execute_on_the_posting_thread() {
        let rec = Arc::new(Recorder::default());
        let target = Target::Other(rec.clone());
        let ctx = crate::engine::snapshot::TablesSnapshot::default();
        let mut done = Vec::new();
        for posting in [Posting::Inline, Posting::Queued] {
            target
                .post(RailId(0), &[], &ctx, posting, &mut done)
                .unwrap();
        }
        assert_eq!(*rec.0.lock().unwrap(), ["post_inline", "post"]);
    }
}
