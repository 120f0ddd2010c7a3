//! The poller thread of a NIC context: completions and async events in.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orbitte_verbs::{self as verbs, Completion};

use super::{Shared, State};
use crate::transport::TransportEvent;
use crate::transport::rdma;

/// Polls a context's completion queue and turns what it returns into
/// events; returns how many completions it took. Called with the state
/// lock held (by the poller thread, or by a thread waiting for a request
/// on this queue): every poll of a queue happens under the lock, so its
/// completions reach the core in the order the queue gave them.
pub(super) fn poll_cq(
    st: &mut State,
    shared: &Shared,
    nic: u32,
    cq: &verbs::CompletionQueue,
    buf: &mut [Completion],
    events: &mut Vec<TransportEvent>,
) -> usize {
    let n = match cq.poll(buf) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(nic, error = %e, "polling the completion queue failed");
            0
        }
    };
    for c in &buf[..n] {
        match st.qpn_rail.get(&(nic, c.qp_num)) {
            Some(&rail) if rdma::slots::is_notification_wr(c.wr_id) => {
                let engine = &st.engine;
                let sender = || {
                    engine
                        .core()
                        .rail_spec(rail)
                        .and_then(|s| engine.tables().peers.get(&s.peer.0))
                        .map(|p| (p.source_id.as_str().to_owned(), p.epoch))
                };
                rdma::notify::on_completion(&mut st.rdma, sender, &shared.inbox, rail, c, events);
            }
            Some(&rail) => {
                if rdma::completion_events(rail, c, events) {
                    st.rdma.mark_failed(rail);
                }
            }
            None => tracing::debug!(nic, qpn = c.qp_num, "completion for an unknown qp ignored"),
        }
    }
    n
}

pub(super) fn poll_loop(
    shared: &Shared,
    nic: u32,
    cq: verbs::CompletionQueue,
    ctx: verbs::Context,
    waiters: &AtomicUsize,
) {
    let mut buf = [Completion::default(); 64];
    let mut events = Vec::with_capacity(256);
    let device = ctx.identity().name.clone();
    // Whether the last poll filled the buffer (more may be queued).
    let mut more = false;
    while !shared.stop.load(Ordering::Acquire) {
        let polling = waiters.load(Ordering::Acquire) == 0;
        if !polling {
            // A waiting thread polls the queue itself (`wait`); taking its
            // completions here would leave it asleep in its wait on the
            // queue. Look at async events meanwhile.
            shared.sleep(Duration::from_millis(1));
        } else if !more {
            // Arm and wait only when the queue was empty, so a busy queue
            // costs no notification (a syscall on some providers).
            let _ = cq.wait(Duration::from_millis(2));
        }
        let mut asyncs = Vec::new();
        let take_asyncs = |asyncs: &mut Vec<verbs::AsyncEvent>| {
            while let Ok(Some(ev)) = ctx.next_async_event(Duration::ZERO) {
                asyncs.push(ev);
            }
        };
        if !polling {
            take_asyncs(&mut asyncs);
            if asyncs.is_empty() {
                more = false;
                continue;
            }
        }
        let mut st = shared.lock();
        // Looked at again under the lock: a waiter that came meanwhile
        // polls for itself.
        let n = if waiters.load(Ordering::Acquire) == 0 {
            poll_cq(&mut st, shared, nic, &cq, &mut buf, &mut events)
        } else {
            0
        };
        if polling {
            // After the poll: an event raised before the completions just
            // taken (a QP's fatal error before its flushes) comes with
            // them, so the rail is down by the time their outcome is seen.
            take_asyncs(&mut asyncs);
        }
        more = n == buf.len();
        if n == 0 && asyncs.is_empty() {
            continue;
        }
        for ev in asyncs {
            tracing::debug!(device, ?ev, "async event");
            match ev {
                verbs::AsyncEvent::PortError { port } => {
                    for rail in st.rdma.rails_on(nic) {
                        let reason = format!(
                            "port {port} of {device} (NIC ID {nic}) is down or paused; wait for port recovery"
                        );
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                verbs::AsyncEvent::PortActive { .. } => {
                    let now = Instant::now();
                    for rail in st.rdma.rails_on(nic) {
                        if st.rdma.is_rts(rail) {
                            events.push(TransportEvent::RailUp { rail });
                            if st.recovery.observe(rail, true, now) {
                                tracing::info!(
                                    rail = rail.0,
                                    "rail recovered: its port is active again"
                                );
                            }
                        } else {
                            // A new queue pair can be connected now.
                            st.recovery.retry_now(rail, now);
                        }
                    }
                }
                verbs::AsyncEvent::QpFatal { qpn }
                | verbs::AsyncEvent::QpAccessError { qpn }
                | verbs::AsyncEvent::QpRequestError { qpn } => {
                    if let Some(&rail) = st.qpn_rail.get(&(nic, qpn)) {
                        st.rdma.mark_failed(rail);
                        let reason = format!("qp {qpn} on {device} hit {ev:?}");
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                verbs::AsyncEvent::DeviceFatal => {
                    for rail in st.rdma.rails_on(nic) {
                        let reason = format!("device {device} is fatal");
                        events.push(TransportEvent::RailDown {
                            rail,
                            reason: reason.into(),
                        });
                    }
                }
                _ => {}
            }
        }
        st.handle_events(Instant::now(), &mut events);
        drop(st);
    }
}
