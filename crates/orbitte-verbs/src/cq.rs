//! Completion queue: typed completions, polling and blocking waits.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::CqOps;
use crate::context::{Context, unreachable_ops};
use crate::error::{ObjectKind, PollError, Unquiesced, WaitError};
use crate::retain::Node;
use crate::wr::Completion;

/// A completion queue. Cheap to clone; QPs hold a clone.
///
/// # Waiting for completions
/// [`poll`](Self::poll) never blocks. [`wait`](Self::wait) blocks until the
/// queue *may* hold a completion or the timeout passes; then poll. The
/// native provider arms a completion channel (`ibv_req_notify_cq`), polls
/// once to close the race, and sleeps in `poll(2)` on the channel fd; the
/// sim waits on a condition variable that delivery signals. Spurious
/// wakeups are possible: always poll after `wait` returns `true`.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    /// Declared first: destroyed before the context is released.
    node: Node<dyn CqOps>,
    context: Context,
    depth: u32,
}

static CQ_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl CompletionQueue {
    pub(crate) fn new(context: Context, ops: Box<dyn CqOps>, depth: u32) -> Self {
        let seq = CQ_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let node = Node::new(
            ops,
            Box::new(context.clone()),
            ObjectKind::CompletionQueue,
            format!("cq#{seq}"),
            context.identity().clone(),
        );
        Self {
            inner: Arc::new(CqInner {
                node,
                context,
                depth,
            }),
        }
    }

    pub(crate) fn ops(&self) -> &dyn CqOps {
        self.inner.node.ops().unwrap_or_else(|| unreachable_ops())
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// Depth asked for at creation.
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Moves up to `out.len()` completions into `out`, oldest first, and
    /// returns how many. Never blocks, never allocates. Polling is what
    /// frees send-queue slots.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize, PollError> {
        self.ops().poll(out)
    }

    /// Blocks until the queue may hold a completion (`true`) or `timeout`
    /// passes (`false`). See the type docs.
    pub fn wait(&self, timeout: Duration) -> Result<bool, WaitError> {
        self.ops().wait(timeout)
    }

    /// Destroys now. Fails with [`Unquiesced`] if QPs (or clones) still
    /// hold it, or if the native destroy fails (then retained).
    pub fn close(self) -> Result<(), Unquiesced> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.node.close(),
            Err(arc) => Err(arc.node.in_use(Arc::strong_count(&arc) - 1)),
        }
    }
}
