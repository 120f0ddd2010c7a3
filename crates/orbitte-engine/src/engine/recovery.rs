//! The rail recovery thread and the engine's side of re-establishing an
//! rdma rail: the core's view of the rails fed to the recovery state, due
//! attempts made over the peer's rdma control session, the answer to a
//! peer's request to re-establish one, and the new queue pair installed
//! (the rules are in `crate::recovery`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use orbitte_verbs::QueuePair;
use orbitte_verbs::qp_state::Rts;
use orbitte_wire::{self as wire, Frame};

use super::{Owner, Shared, State, TransferEngine};
use crate::control::ControlLink;
use crate::recovery::AfterFailure;
use crate::transport::rdma::RailQp;
use crate::transport::rdma::qp::{connect_qp, make_qp, min_mtu, to_verbs_mtu, to_wire_mtu};
use crate::transport::{PeerId, RailId, Transport, TransportEvent};

/// Why an attempt did not re-establish the rail.
enum Attempt {
    /// It could not start yet (not counted).
    NotYet(String),
    /// It failed (counted).
    Failed(String),
}

/// The driver thread: watches every tracked rail and makes due attempts.
pub(crate) fn recovery_loop(shared: &Arc<Shared>) {
    let mut st = shared.lock();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        observe(&mut st, now);
        let due = if st.engine.core().fenced().is_some() {
            Vec::new()
        } else {
            st.recovery.due(now)
        };
        if !due.is_empty() {
            drop(st);
            let engine = TransferEngine::view(shared.clone());
            for (rail, attempt) in due {
                engine.attempt_recovery(rail, attempt);
            }
            drop(engine);
            st = shared.lock();
            continue;
        }
        let wait = st
            .recovery
            .next_timeout()
            .map_or(Duration::from_millis(50), |t| {
                t.saturating_duration_since(now)
            })
            .clamp(Duration::from_millis(1), Duration::from_millis(50));
        drop(st);
        shared.sleep(wait);
        st = shared.lock();
    }
}

/// Feeds the core's view of every tracked rail to the recovery state.
fn observe(st: &mut State, now: Instant) {
    for rail in st.recovery.rails() {
        if st.engine.core().rail_is_closed(rail) {
            st.recovery.untrack(rail);
            continue;
        }
        let up = st.engine.core().rail_is_up(rail);
        if st.recovery.observe(rail, up, now) {
            tracing::info!(rail = rail.0, "rail recovered: its port is active again");
        }
    }
}

/// Installs `qp` as the rail's queue pair: the old one is destroyed (a
/// failed destroy is `Unquiesced` and the rail stays down), the rail's
/// notification slots are prepared on the new one, and the core takes the
/// rail back. The core must hold no work on the rail.
fn install_qp(
    st: &mut State,
    rail: RailId,
    mut qp: QueuePair<Rts>,
    now: Instant,
) -> Result<(), String> {
    if st.engine.core().rail_is_closed(rail) {
        return Err("the rail was closed meanwhile".into());
    }
    if st.engine.core().rail_in_flight(rail) > 0 {
        return Err("the old queue pair still holds work".into());
    }
    let Some((nic, old_qpn)) = st.rdma.rail(rail).map(|r| (r.nic, r.qpn())) else {
        return Err("not an rdma rail".into());
    };
    if let Err(u) = st.rdma.destroy(rail) {
        st.record_rail_unquiesced(format!("replacing the queue pair of rail {}", rail.0), *u);
        return Err("destroying the old queue pair failed (unquiesced)".into());
    }
    if let Some(q) = old_qpn {
        st.qpn_rail.remove(&(nic, q));
    }
    let pd = st.nic(nic).map(|n| n.pd.clone());
    let notify = match pd.map(|pd| crate::transport::rdma::slots::RailNotify::prepare(&pd, &mut qp))
    {
        Some(Ok(n)) => Some(n),
        Some(Err(e)) => {
            tracing::warn!(nic, error = %e, "rail carries no notifications");
            None
        }
        None => None,
    };
    let qpn = qp.qp_num();
    if let Some(mut r) = st.rdma.rail_mut(rail) {
        r.qp = RailQp::Rts(qp);
        r.failed = false;
        r.notify = notify;
    }
    st.qpn_rail.insert((nic, qpn), rail);
    st.engine.restore_rail(rail);
    st.pump(now);
    Ok(())
}

impl State {
    /// The prepared context of NIC ID `nic`.
    pub(crate) fn nic(&self, nic: u32) -> Option<&crate::nic::NicCtx> {
        self.init.as_ref()?.nics.iter().find(|n| n.id.0 == nic)
    }

    /// The rdma rails of `peer`.
    pub(crate) fn rdma_rails_of(&self, peer: PeerId) -> Vec<RailId> {
        self.engine
            .tables()
            .peers
            .get(&peer.0)
            .map(|p| {
                p.rails
                    .iter()
                    .copied()
                    .filter(|r| matches!(self.owner.get(r.0 as usize), Some(Owner::Rdma)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl TransferEngine {
    /// This engine holds `peer`'s rdma control session from now on: it
    /// re-establishes the peer's rdma rails when they go down.
    pub(crate) fn recover_rails_of(&self, peer: PeerId) {
        let now = Instant::now();
        let mut st = self.lock();
        for rail in st.rdma_rails_of(peer) {
            st.recovery.set_recoverable(rail, true, now);
        }
    }

    /// Makes one attempt and reports it to the recovery state.
    fn attempt_recovery(&self, rail: RailId, attempt: u32) {
        let span = tracing::info_span!("rail_recovery", rail = rail.0, attempt);
        let _g = span.enter();
        let res = self.reestablish(rail);
        let now = Instant::now();
        let mut st = self.lock();
        match res {
            Ok(qpn) => {
                tracing::info!(
                    rail = rail.0,
                    attempt,
                    qpn,
                    "rail recovered on a new queue pair"
                );
            }
            Err(Attempt::NotYet(why)) => {
                st.recovery.deferred(rail, now);
                tracing::debug!(rail = rail.0, attempt, reason = %why, "rail recovery waits");
            }
            Err(Attempt::Failed(why)) => match st.recovery.failed(rail, now) {
                Some(AfterFailure::Retry { at, .. }) => tracing::warn!(
                    rail = rail.0,
                    attempt,
                    error = %why,
                    retry_in_ms = at.saturating_duration_since(now).as_millis() as u64,
                    "rail recovery attempt failed"
                ),
                Some(AfterFailure::CoolDown { until }) => tracing::warn!(
                    rail = rail.0,
                    attempt,
                    error = %why,
                    cooldown_ms = until.saturating_duration_since(now).as_millis() as u64,
                    "rail recovery attempt failed; cooling down"
                ),
                None => {}
            },
        }
    }

    /// One attempt: a new queue pair on the rail's NIC, connected over the
    /// peer's rdma control session, reported recovered on success.
    /// Returns the new queue pair number.
    fn reestablish(&self, rail: RailId) -> Result<u32, Attempt> {
        let failed = |e: &dyn std::fmt::Display| Attempt::Failed(e.to_string());
        let (peer, half, connect_id, remote_nic, session) = {
            let mut st = self.lock();
            let Some(peer) = st.engine.core().rail_spec(rail).map(|s| s.peer) else {
                return Err(Attempt::Failed("unknown rail".into()));
            };
            if st.engine.core().rail_is_up(rail) {
                // The port came back with the queue pair intact.
                return Err(Attempt::NotYet("the rail is up again".into()));
            }
            if st.engine.core().rail_in_flight(rail) > 0 {
                return Err(Attempt::NotYet(
                    "the old queue pair still holds work".into(),
                ));
            }
            let Some((nic, remote_nic)) = st.rdma.rail(rail).map(|r| (r.nic, r.remote_nic)) else {
                return Err(Attempt::Failed("not an rdma rail".into()));
            };
            let Some(n) = st.nic(nic) else {
                return Err(Attempt::Failed(format!("NIC ID {nic} has no context")));
            };
            if !n.port_active() {
                return Err(Attempt::Failed(format!(
                    "port {} of {} (NIC ID {nic}) is not active",
                    n.port, n.identity.name
                )));
            }
            let psn = (crate::registration::fresh_token().0 as u32) & 0xff_ffff;
            let half = make_qp(n, self.qp_caps(), psn).map_err(|e| failed(&e))?;
            // The peer replaces its end of the rail from now on: the old
            // queue pair never carries work again (a port coming back
            // does not bring it up).
            st.rdma.mark_failed(rail);
            let connect_id = wire::ConnectId(st.next_connect);
            st.next_connect += 1;
            let session = st
                .engine
                .tables()
                .peers
                .get(&peer.0)
                .and_then(|p| p.sessions.last().copied());
            (peer, half, connect_id, remote_nic, session)
        };
        let request = Frame::ConnectRequest(wire::ConnectRequest {
            connect_id,
            rails: vec![wire::RailRequest {
                target_nic: wire::NicId(remote_nic),
                endpoint: half.endpoint,
            }],
        });
        let answer = {
            let mut links = self.net().links.lock().unwrap_or_else(|p| p.into_inner());
            let Some(link) = links.get_mut(&peer) else {
                return Err(Attempt::Failed(
                    "no rdma control session to the peer".into(),
                ));
            };
            link.send(&request).map_err(|e| failed(&e))?;
            link.recv(self.shared.settings.handshake_timeout)
                .map_err(|e| failed(&e))?
        };
        let remote = match answer {
            Frame::ConnectAccept(a) if a.connect_id == connect_id && a.rails.len() == 1 => {
                a.rails[0]
            }
            Frame::ConnectReject(r) => {
                return Err(Attempt::Failed(format!(
                    "the peer refused: {} (code {})",
                    r.message.as_str(),
                    r.code.0
                )));
            }
            other => {
                return Err(Attempt::Failed(format!(
                    "the peer answered {} instead of connect-accept",
                    other.frame_type()
                )));
            }
        };
        let now = Instant::now();
        let mut st = self.lock();
        let nic = half.nic;
        let Some(n) = st.nic(nic) else {
            return Err(Attempt::Failed(format!("NIC ID {nic} has no context")));
        };
        let qp = connect_qp(n, half, &remote).map_err(|e| failed(&e))?;
        let qpn = qp.qp_num();
        install_qp(&mut st, rail, qp, now).map_err(Attempt::Failed)?;
        // Under the same lock as the core taking the rail back, so that
        // `peers()` never shows it up and not yet recovered.
        st.recovery.recovered(rail);
        drop(st);
        if let Some(s) = session {
            let _ = self.shared.peer_table().record_rc_connection(s, connect_id);
        }
        Ok(qpn)
    }

    /// Answers a `connect-request` that arrives on an open rdma control
    /// session: the peer re-establishes one rail. The rail on that NIC
    /// pair gets a new queue pair connected to the peer's; a rail that
    /// still holds work is moved to the error state first and the request
    /// is refused (the peer retries after its backoff).
    pub(crate) fn answer_rail_request(
        &self,
        peer: PeerId,
        session: wire::SessionId,
        request: &wire::ConnectRequest,
    ) -> Frame {
        let connect_id = request.connect_id;
        let reject = |code: wire::ErrorCode, message: String| {
            tracing::warn!(peer = peer.0, %message, "rail re-establishment refused");
            Frame::ConnectReject(wire::ConnectReject {
                connect_id,
                code,
                message: wire::Message::truncating(message),
            })
        };
        let [rr] = request.rails.as_slice() else {
            return reject(
                wire::ErrorCode::UNEXPECTED_FRAME,
                "a connect-request on an open rdma control session re-establishes one rail".into(),
            );
        };
        let now = Instant::now();
        let mut st = self.lock();
        if let Some(reason) = st.engine.core().fenced() {
            return reject(
                wire::ErrorCode::SHUTTING_DOWN,
                format!("the engine is fenced: {reason}"),
            );
        }
        let target = u32::from(rr.target_nic.0);
        let theirs = rr.endpoint.nic_id.0;
        let rail = st.rdma_rails_of(peer).into_iter().find(|r| {
            !st.engine.core().rail_is_closed(*r)
                && st
                    .rdma
                    .rail(*r)
                    .is_some_and(|q| q.nic == target && q.remote_nic == theirs)
        });
        let Some(rail) = rail else {
            return reject(
                wire::ErrorCode::UNKNOWN_NIC,
                format!("no rail from NIC ID {theirs} to NIC ID {target} here"),
            );
        };
        if st.engine.core().rail_in_flight(rail) > 0 {
            if let Err(e) = st.rdma.flush(rail) {
                tracing::warn!(error = %e, "moving a rail's queue pair to error failed");
            }
            st.rdma.mark_failed(rail);
            let mut events = vec![TransportEvent::RailDown {
                rail,
                reason: "the peer is re-establishing the rail".into(),
            }];
            st.handle_events(now, &mut events);
            return reject(
                wire::ErrorCode::RESOURCE_EXHAUSTED,
                format!("rail {} still holds work; retry", rail.0),
            );
        }
        let Some(n) = st.nic(target) else {
            return reject(
                wire::ErrorCode::UNKNOWN_NIC,
                format!("NIC ID {target} has no context"),
            );
        };
        let psn = (crate::registration::fresh_token().0 as u32) & 0xff_ffff;
        let made = make_qp(n, self.qp_caps(), psn).and_then(|half| {
            let mut ep = half.endpoint;
            ep.mtu = to_wire_mtu(min_mtu(n.mtu, to_verbs_mtu(rr.endpoint.mtu)));
            connect_qp(n, half, &rr.endpoint).map(|qp| (qp, ep))
        });
        let (qp, ep) = match made {
            Ok(x) => x,
            Err(e) => return reject(wire::ErrorCode::NO_USABLE_RAIL, e.to_string()),
        };
        let qpn = qp.qp_num();
        if let Err(why) = install_qp(&mut st, rail, qp, now) {
            return reject(wire::ErrorCode::INTERNAL, why);
        }
        st.recovery.replaced(rail);
        drop(st);
        let _ = self
            .shared
            .peer_table()
            .record_rc_connection(session, connect_id);
        tracing::info!(
            peer = peer.0,
            rail = rail.0,
            qpn,
            "rail re-established by the peer"
        );
        Frame::ConnectAccept(wire::ConnectAccept {
            connect_id,
            rails: vec![ep],
        })
    }
}
