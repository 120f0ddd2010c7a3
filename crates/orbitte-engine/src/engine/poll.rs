//! The poller thread of a NIC context: completions and async events in.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use orbitte_verbs::{self as verbs, Completion};

use super::Shared;
use crate::transport::TransportEvent;
use crate::transport::rdma;

pub(super) fn poll_loop(
    shared: &Shared,
    nic: u32,
    cq: verbs::CompletionQueue,
    ctx: verbs::Context,
) {
    let mut buf = [Completion::default(); 64];
    let mut events = Vec::with_capacity(256);
    let device = ctx.identity().name.clone();
    let poll = |buf: &mut [Completion]| match cq.poll(buf) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(device, error = %e, "polling the completion queue failed");
            0
        }
    };
    while !shared.stop.load(Ordering::Acquire) {
        // Poll first; arm and wait only when the queue is empty, so a busy
        // queue costs no notification (a syscall on some providers) per
        // batch.
        let mut n = poll(&mut buf);
        if n == 0 {
            let _ = cq.wait(Duration::from_millis(2));
            n = poll(&mut buf);
        }
        let mut asyncs = Vec::new();
        while let Ok(Some(ev)) = ctx.next_async_event(Duration::ZERO) {
            asyncs.push(ev);
        }
        if n == 0 && asyncs.is_empty() {
            continue;
        }
        let mut st = shared.lock();
        for c in &buf[..n] {
            match st.qpn_rail.get(&(nic, c.qp_num)) {
                Some(&rail) if crate::notify::rdma::is_notification_wr(c.wr_id) => {
                    crate::notify::rdma::on_completion(
                        &mut st,
                        &shared.inbox,
                        rail,
                        c,
                        &mut events,
                    );
                }
                Some(&rail) => {
                    if rdma::completion_events(rail, c, &mut events) {
                        st.rdma.mark_failed(rail);
                    }
                }
                None => tracing::debug!(
                    device,
                    qpn = c.qp_num,
                    "completion for an unknown qp ignored"
                ),
            }
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
