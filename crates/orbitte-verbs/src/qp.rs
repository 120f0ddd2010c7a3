//! RC queue pair with its state in the type.
//!
//! A QP is created in RESET and moved explicitly INIT -> RTR -> RTS; each
//! transition consumes the handle and returns one typed for the new state,
//! so posting sends on a QP that never reached RTS does not compile:
//!
//! ```compile_fail
//! fn post_before_rts(qp: &mut orbitte_verbs::QueuePair<orbitte_verbs::qp_state::Init>) {
//!     let _ = qp.post_send(&[]);
//! }
//! ```
//!
//! Receives may be posted from INIT on (so they are ready before the peer
//! sends), but not in RESET:
//!
//! ```compile_fail
//! fn recv_in_reset(qp: &mut orbitte_verbs::QueuePair<orbitte_verbs::qp_state::Reset>) {
//!     let _ = qp.post_recv(&[]);
//! }
//! ```
//!
//! A QP in the error state accepts work and flushes it: posting succeeds
//! and each request completes with
//! [`WcStatus::WrFlush`](crate::WcStatus::WrFlush), in order after the
//! work outstanding before it, and never executes (the kernel's
//! `ib_drain_sq` relies on this). That holds for a QP moved there on
//! purpose (`QueuePair<Errored>` may post sends and receives) and for one
//! the device moved there on its own (a failed work request, a fatal
//! event) while it is still typed `Rts`. [`QueuePair::state`] asks the
//! provider. An errored QP never becomes ready again:
//!
//! ```compile_fail
//! fn back_to_rts(qp: orbitte_verbs::QueuePair, attrs: orbitte_verbs::RtsAttrs) {
//!     let qp = qp.into_error().unwrap();
//!     let _ = qp.rts(attrs);
//! }
//! ```

use std::fmt;
use std::marker::PhantomData;

use crate::backend::{QpOps, Transition};
use crate::context::unreachable_ops;
use crate::cq::CompletionQueue;
use crate::error::{ModifyError, ObjectKind, PostError, QueryError, Unquiesced};
use crate::pd::ProtectionDomain;
use crate::retain::Node;
use crate::types::{InitAttrs, Mtu, QpCaps, QpState, RemoteEndpoint, Route, RtrAttrs, RtsAttrs};
use crate::wr::{RecvWr, SendWr};

/// Type-level queue pair states.
pub mod qp_state {
    mod sealed {
        pub trait Sealed {}
    }

    /// A state a [`QueuePair`](crate::QueuePair) can be typed with.
    pub trait State: sealed::Sealed + Send + Sync + std::fmt::Debug + 'static {
        /// The runtime state this marker stands for.
        const STATE: crate::QpState;
    }

    /// States in which receives may be posted (in `Errored` they flush).
    pub trait Receivable: State {}

    /// States in which sends may be posted (in `Errored` they flush).
    pub trait Sendable: State {}

    macro_rules! marker {
        ($(#[$doc:meta] $name:ident => $state:ident),* $(,)?) => {$(
            #[$doc]
            #[derive(Debug)]
            pub enum $name {}
            impl sealed::Sealed for $name {}
            impl State for $name {
                const STATE: crate::QpState = crate::QpState::$state;
            }
        )*};
    }

    marker! {
        /// Created, not initialized.
        Reset => Reset,
        /// Initialized (port, access): receives may be posted.
        Init => Init,
        /// Ready to receive: connected to a remote endpoint.
        Rtr => Rtr,
        /// Ready to send: work requests may be posted.
        Rts => Rts,
        /// Moved to the error state on purpose: outstanding work flushes.
        Errored => Error,
    }

    impl Receivable for Init {}
    impl Receivable for Rtr {}
    impl Receivable for Rts {}
    impl Receivable for Errored {}

    impl Sendable for Rts {}
    impl Sendable for Errored {}
}

use qp_state::{Errored, Init, Receivable, Reset, Rtr, Rts, Sendable, State};

/// An RC queue pair, typed by its state. Not `Clone`: one owner posts
/// (posting borrows it mutably); it may be moved between threads.
///
/// Holds its PD and both CQs, so it is destroyed before any of them.
pub struct QueuePair<S: State = Rts> {
    /// Boxed so transitions and errors that hand the QP back move 8 bytes.
    inner: Box<QpInner>,
    _state: PhantomData<fn() -> S>,
}

#[derive(Debug)]
struct QpInner {
    /// Declared first: destroyed before PD and CQs are released.
    node: Node<dyn QpOps>,
    pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    qpn: u32,
    caps: QpCaps,
    span: tracing::Span,
}

impl<S: State> fmt::Debug for QueuePair<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.inner.qpn)
            .field("typed_state", &S::STATE)
            .field("device", &self.inner.node.device.name)
            .finish()
    }
}

/// A failed transition: the QP is handed back in its old state.
pub struct TransitionError<S: State> {
    /// The queue pair, unchanged.
    pub qp: QueuePair<S>,
    /// Why the transition failed.
    pub error: ModifyError,
}

impl<S: State> fmt::Debug for TransitionError<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionError")
            .field("qp", &self.qp)
            .field("error", &self.error)
            .finish()
    }
}

impl<S: State> fmt::Display for TransitionError<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<S: State> std::error::Error for TransitionError<S> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<S: State> From<TransitionError<S>> for ModifyError {
    fn from(e: TransitionError<S>) -> Self {
        e.error
    }
}

impl QueuePair<Reset> {
    pub(crate) fn new(
        pd: ProtectionDomain,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        ops: Box<dyn QpOps>,
        caps: QpCaps,
    ) -> Self {
        let qpn = ops.qp_num();
        let device = pd.context().identity().clone();
        let span = tracing::debug_span!("qp", qpn, device = %device.name);
        let node = Node::new(
            ops,
            Box::new((pd.clone(), send_cq.clone(), recv_cq.clone())),
            ObjectKind::QueuePair,
            format!("qpn {qpn}"),
            device,
        );
        Self {
            inner: Box::new(QpInner {
                node,
                pd,
                send_cq,
                recv_cq,
                qpn,
                caps,
                span,
            }),
            _state: PhantomData,
        }
    }

    /// RESET -> INIT: bind to a port and set the remote access this QP
    /// serves as a responder.
    pub fn init(self, attrs: InitAttrs) -> Result<QueuePair<Init>, TransitionError<Reset>> {
        self.transition(Transition::Init(attrs))
    }

    /// RESET -> INIT -> RTR -> RTS in one call, once the endpoints have
    /// been exchanged (a QP number is known from creation, so the local
    /// endpoint can be sent before any transition). On failure the QP is
    /// destroyed and the error says which step failed.
    pub fn connect(
        self,
        init: InitAttrs,
        rtr: RtrAttrs,
        rts: RtsAttrs,
    ) -> Result<QueuePair<Rts>, ModifyError> {
        Ok(self.init(init)?.rtr(rtr)?.rts(rts)?)
    }
}

impl QueuePair<Init> {
    /// INIT -> RTR: connect to the remote endpoint.
    pub fn rtr(self, attrs: RtrAttrs) -> Result<QueuePair<Rtr>, TransitionError<Init>> {
        self.transition(Transition::Rtr(attrs))
    }
}

impl QueuePair<Rtr> {
    /// RTR -> RTS: start sending from `attrs.sq_psn`.
    pub fn rts(self, attrs: RtsAttrs) -> Result<QueuePair<Rts>, TransitionError<Rtr>> {
        self.transition(Transition::Rts(attrs))
    }
}

impl<S: Sendable> QueuePair<S> {
    /// Posts send work requests with one doorbell. Returns when they are
    /// queued, not done: each signaled request (and every failed one)
    /// yields a completion on the send CQ, in posting order.
    ///
    /// On a QP in the error state (`Errored`, or moved there by the
    /// device) every request completes with `WrFlush`, signaled or not,
    /// after the completions of the work posted before it, and never
    /// executes: a signaled request posted after
    /// [`into_error`](Self::into_error) is how a send queue is drained.
    ///
    /// The buffer-lifetime rule: the bytes an SGE names may be read or
    /// written by the device until that request's completion (or a later
    /// signaled one's) has been polled; reuse them only after that. The
    /// memory itself stays mapped because the MR holds it.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let r = self.ops().post_send(wrs);
        if let Err(e) = &r {
            let _g = self.inner.span.enter();
            tracing::debug!(error = %e, "post_send failed");
        }
        r
    }
}

impl<S: Receivable> QueuePair<S> {
    /// Posts receive work requests with one doorbell. On a QP in the
    /// error state they complete with `WrFlush` (rxe: only once the QP is
    /// moved to error again; see docs/verbs.md, "Sim versus rxe").
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.ops().post_recv(wrs)
    }
}

impl<S: State> QueuePair<S> {
    fn ops(&self) -> &dyn QpOps {
        self.inner.node.ops().unwrap_or_else(|| unreachable_ops())
    }

    fn transition<T: State>(self, t: Transition) -> Result<QueuePair<T>, TransitionError<S>> {
        let _g = self.inner.span.clone().entered();
        match self.ops().modify(&t) {
            Ok(()) => {
                tracing::debug!(to = ?t.target(), "qp transition");
                Ok(QueuePair {
                    inner: self.inner,
                    _state: PhantomData,
                })
            }
            Err(error) => {
                tracing::debug!(to = ?t.target(), %error, "qp transition failed");
                Err(TransitionError { qp: self, error })
            }
        }
    }

    /// Moves the QP to the error state from any state: every outstanding
    /// work request completes with `WrFlush`, which is how a QP is drained
    /// before it is destroyed.
    pub fn into_error(self) -> Result<QueuePair<Errored>, TransitionError<S>> {
        self.transition(Transition::Error)
    }

    /// Queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    /// Capacities it was created with.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The state the provider reports now (the device may have moved the QP
    /// to the error state since the last transition).
    pub fn state(&self) -> Result<QpState, QueryError> {
        self.ops().state()
    }

    /// This QP's endpoint, to send to the peer.
    pub fn endpoint(&self, route: Route, psn: u32, mtu: Mtu) -> RemoteEndpoint {
        RemoteEndpoint {
            qpn: self.inner.qpn,
            psn: psn & 0x00ff_ffff,
            route,
            mtu,
        }
    }

    /// The PD.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The send CQ.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.inner.send_cq
    }

    /// The receive CQ.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.inner.recv_cq
    }

    /// Destroys now. On a native failure the QP, its PD, CQs and their
    /// context are retained and [`Unquiesced`] says so. A QP may be
    /// destroyed with work outstanding (the device stops it); the
    /// buffer-lifetime rule still holds because MRs keep their memory.
    pub fn close(self) -> Result<(), Unquiesced> {
        let mut inner = self.inner;
        inner.node.close()
    }
}
