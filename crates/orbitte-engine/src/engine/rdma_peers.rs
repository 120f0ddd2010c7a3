//! Opening a peer over a control link: handshake (version, source id,
//! authoritative epoch), segment publications both ways, and RC connection
//! of one queue pair per rail.
//!
//! ```text
//! initiator (open_peer)                        responder (accept_peer)
//!   <------------------- challenge ----------------
//!   -------------------- hello ------------------->   admit (epoch rules)
//!   <------------------- hello-ack ----------------
//!   admit (epoch rules)
//!   -------------------- segment-publication ----->
//!   <------------------- segment-publication ------
//!   -------------------- connect-request --------->   QPs: INIT, RTR, RTS
//!   <------------------- connect-accept -----------
//!   QPs: RTR, RTS
//! ```
//!
//! Epoch rules are the wire's [`PeerTable`](orbitte_wire::PeerTable): an
//! older epoch is rejected (also from the same address); a newer one
//! replaces the old source, whose rails are flushed and destroyed and whose
//! descriptors and rkeys are dropped (its old [`PeerId`] becomes unknown);
//! an equal one is a reconnect that replaces the rails.

use std::time::Instant;

use orbitte_verbs::{self as verbs, QpCaps};
use orbitte_wire::handshake::Established;
#[cfg(any(test, feature = "testing"))]
use orbitte_wire::handshake::{Initiator, Responder};
use orbitte_wire::{self as wire, Frame};

#[cfg(any(test, feature = "testing"))]
use super::StateGuard;
use super::peer_info::PeerInfo;
use super::peers::peer_info;
use super::{Owner, State, TransferEngine};
use crate::control::ControlLink;
use crate::error::{InactivePort, LinkError, NoRdmaRail, OpenPeerError};
use crate::nic::NicCtx;
use crate::transport::rdma::qp::{connect_qp, make_qp, min_mtu, to_verbs_mtu, to_wire_mtu};
use crate::transport::rdma::{RailQp, RdmaRail};
use crate::transport::{PathKind, PeerId, RailId, RailSpec};

#[cfg(any(test, feature = "testing"))]
fn nonce() -> wire::Nonce {
    let mut n = [0u8; 32];
    for chunk in n.chunks_mut(8) {
        chunk.copy_from_slice(&crate::registration::fresh_token().0.to_le_bytes());
    }
    wire::Nonce(n)
}

impl TransferEngine {
    #[cfg(any(test, feature = "testing"))]
    fn identity(&self) -> wire::Identity {
        wire::Identity::new(
            self.shared.source_id.clone(),
            self.shared.epoch,
            wire::Capabilities::RDMA,
        )
    }

    /// Receives the next frame; a frame from another protocol version is
    /// answered with an `error` frame (unsupported-version) before failing.
    fn recv(&self, link: &mut dyn ControlLink) -> Result<Frame, OpenPeerError> {
        match link.recv(self.shared.settings.handshake_timeout) {
            Ok(f) => Ok(f),
            Err(e) => {
                let code = match &e {
                    LinkError::Version { .. } => Some(wire::ErrorCode::UNSUPPORTED_VERSION),
                    LinkError::Decode(_) | LinkError::DataFrame { .. } => {
                        Some(wire::ErrorCode::MALFORMED_FRAME)
                    }
                    _ => None,
                };
                if let Some(code) = code {
                    let _ = link.send(&Frame::Error(wire::ErrorFrame {
                        code,
                        frame_type: wire::FrameType(0),
                        request_id: wire::RequestId(0),
                        message: wire::Message::truncating(e.to_string()),
                    }));
                }
                // The error goes back to the caller (for the engine's
                // listener: the session's close reason, logged within its
                // budget), so a peer sending bad frames adds no line here.
                tracing::debug!(error = %e, "control link refused a frame");
                Err(e.into())
            }
        }
    }

    fn fenced_peer(&self) -> Result<(), OpenPeerError> {
        match self.lock().engine.core().fenced() {
            Some(r) => Err(OpenPeerError::Fenced(r.clone())),
            None => Ok(()),
        }
    }

    /// Opens a peer as the initiator over `link` (the other engine runs
    /// [`accept_peer`](Self::accept_peer)).
    #[cfg(any(test, feature = "testing"))]
    pub fn open_peer(&self, link: &mut dyn ControlLink) -> Result<PeerInfo, OpenPeerError> {
        self.fenced_peer()?;
        self.ensure_contexts()
            .map_err(|e| OpenPeerError::NoRail(NoRdmaRail::Contexts(e)))?;
        let from = link.peer_addr();
        let mut init = Initiator::new(self.identity(), None, nonce());
        let challenge = self.recv(link)?;
        let hello = init.handle_challenge(challenge)?;
        link.send(&hello)?;
        let ack = self.recv(link)?;
        let session = self.shared.new_session_id();
        let established = {
            let mut table = self.shared.peer_table();
            init.handle_hello_ack(ack, &mut table, session, from)?
        };
        self.open_rdma_rails(link, session, &established)
    }

    /// The initiator's part of the rdma control link after the handshake
    /// (admitted as `session`): publications both ways, then one RC queue
    /// pair per rail.
    pub(crate) fn open_rdma_rails(
        &self,
        link: &mut dyn ControlLink,
        session: wire::SessionId,
        established: &Established,
    ) -> Result<PeerInfo, OpenPeerError> {
        self.ensure_contexts()
            .map_err(|e| OpenPeerError::NoRail(NoRdmaRail::Contexts(e)))?;
        let publication = self.segment_publication();
        link.send(&Frame::SegmentPublication(publication))?;
        let theirs = match self.recv(link)? {
            Frame::SegmentPublication(p) => p,
            other => return Err(self.abandon(session, unexpected("segment-publication", &other))),
        };
        let peer = self
            .adopt(session, established, &theirs)
            .map_err(|e| self.abandon(session, e))?;
        // One QP per prepared NIC whose port is active; target the peer's
        // NICs (from its rkeys) round-robin.
        let (halves, connect_id) = {
            let mut st = self.lock();
            let connect_id = wire::ConnectId(st.next_connect);
            st.next_connect += 1;
            let mut remote_nics: Vec<u16> = theirs
                .ranges
                .iter()
                .flat_map(|r| r.rkeys.iter().map(|k| k.nic_id.0))
                .collect();
            remote_nics.sort_unstable();
            remote_nics.dedup();
            let caps = self.qp_caps();
            let nics: Vec<&NicCtx> = self.ordered_nics(&st);
            let mut halves = Vec::new();
            let mut skipped = Vec::new();
            for (i, n) in nics.iter().enumerate() {
                if !n.port_active() {
                    skipped.push(InactivePort {
                        nic: n.id,
                        device: n.identity.name.clone(),
                        port: n.port,
                    });
                    continue;
                }
                let target = if remote_nics.is_empty() {
                    n.id.0 as u16
                } else {
                    remote_nics[i % remote_nics.len()]
                };
                let psn = (crate::registration::fresh_token().0 as u32) & 0xff_ffff;
                let half = make_qp(n, caps, psn).map_err(|e| self.abandon(session, e))?;
                halves.push((half, target));
            }
            drop(nics);
            drop(st);
            if halves.is_empty() {
                return Err(self.abandon(
                    session,
                    OpenPeerError::NoRail(NoRdmaRail::PortsInactive(skipped)),
                ));
            }
            (halves, connect_id)
        };
        let request = wire::ConnectRequest {
            connect_id,
            rails: halves
                .iter()
                .map(|(h, t)| wire::RailRequest {
                    target_nic: wire::NicId(*t),
                    endpoint: h.endpoint,
                })
                .collect(),
        };
        link.send(&Frame::ConnectRequest(request))?;
        let accept = match self.recv(link)? {
            Frame::ConnectAccept(a)
                if a.connect_id == connect_id && a.rails.len() == halves.len() =>
            {
                a
            }
            Frame::ConnectReject(r) => {
                return Err(self.abandon(
                    session,
                    OpenPeerError::Rejected {
                        code: r.code,
                        message: r.message.as_str().to_owned(),
                    },
                ));
            }
            other => return Err(self.abandon(session, unexpected("connect-accept", &other))),
        };
        let mut st = self.lock();
        let mut made = Vec::new();
        for ((half, _), remote) in halves.into_iter().zip(&accept.rails) {
            let nic = half.nic;
            let Some(n) = st
                .init
                .as_ref()
                .and_then(|i| i.nics.iter().find(|n| n.id.0 == nic))
            else {
                continue;
            };
            let device = n.identity.name.clone();
            let qp = connect_qp(n, half, remote)?;
            made.push((nic, remote.nic_id.0, qp, device));
        }
        self.install_rails(&mut st, peer, session, connect_id, made);
        tracing::info!(
            peer = peer.0,
            source = established.peer.source_id.as_str(),
            "peer opened"
        );
        Ok(peer_info(&st, peer))
    }

    /// Accepts a peer as the responder over `link`.
    #[cfg(any(test, feature = "testing"))]
    pub fn accept_peer(&self, link: &mut dyn ControlLink) -> Result<PeerInfo, OpenPeerError> {
        self.fenced_peer()?;
        self.ensure_contexts()
            .map_err(|e| OpenPeerError::NoRail(NoRdmaRail::Contexts(e)))?;
        let from = link.peer_addr();
        let mut resp = Responder::new(self.identity(), None, nonce());
        link.send(&resp.challenge())?;
        let hello = self.recv(link)?;
        let session = self.shared.new_session_id();
        let handled = {
            let mut table = self.shared.peer_table();
            resp.handle_hello(hello, &mut table, session, from)
                .map(|(ack, est)| (session, ack, est))
        };
        let (session, ack, established) = match handled {
            Ok(x) => x,
            Err(e) => {
                if let Some(frame) = e.error_frame() {
                    let _ = link.send(&Frame::Error(frame));
                }
                // Returned to the caller, as a refused frame is.
                tracing::debug!(error = %e, "peer rejected");
                return Err(e.into());
            }
        };
        link.send(&ack)?;
        self.accept_rdma_rails(link, session, &established)
    }

    /// The responder's part of the rdma control link after the handshake
    /// (admitted as `session`) over a blocking `link`: the steps of
    /// [`RailSetup`] one frame at a time.
    #[cfg(any(test, feature = "testing"))]
    fn accept_rdma_rails(
        &self,
        link: &mut dyn ControlLink,
        session: wire::SessionId,
        established: &Established,
    ) -> Result<PeerInfo, OpenPeerError> {
        let mut setup = RailSetup::new(session, established.clone());
        loop {
            let frame = self.recv(link)?;
            match self.rail_setup_step(&mut setup, frame) {
                Ok(SetupStep::Answer(f)) => link.send(&f)?,
                Ok(SetupStep::Open(peer, f)) => {
                    link.send(&f)?;
                    return Ok(peer);
                }
                Err(failed) => {
                    let SetupFailed { last, error } = *failed;
                    if let Some(f) = last {
                        let _ = link.send(&f);
                    }
                    return Err(error);
                }
            }
        }
    }

    /// One step of the responder's part of an rdma control link: the
    /// peer's `frame` taken, what to answer (never waiting for the
    /// network: the caller sends it, so an I/O loop can drive the setup).
    pub(crate) fn rail_setup_step(
        &self,
        setup: &mut RailSetup,
        frame: Frame,
    ) -> Result<SetupStep, Box<SetupFailed>> {
        let session = setup.session;
        match setup.stage {
            SetupStage::Publication => {
                self.fenced_peer().map_err(SetupFailed::quiet)?;
                if let Err(why) = self.ensure_contexts() {
                    let last = Frame::Error(wire::ErrorFrame {
                        code: wire::ErrorCode::NO_USABLE_RAIL,
                        frame_type: wire::FrameType::HELLO,
                        request_id: wire::RequestId(0),
                        message: wire::Message::truncating(format!("no rdma context here: {why}")),
                    });
                    let error =
                        self.abandon(session, OpenPeerError::NoRail(NoRdmaRail::Contexts(why)));
                    return Err(Box::new(SetupFailed {
                        last: Some(last),
                        error,
                    }));
                }
                let theirs = match frame {
                    Frame::SegmentPublication(p) => p,
                    other => {
                        let e = unexpected("segment-publication", &other);
                        return Err(SetupFailed::quiet(self.abandon(session, e)));
                    }
                };
                let peer = self
                    .adopt(session, &setup.established, &theirs)
                    .map_err(|e| SetupFailed::quiet(self.abandon(session, e)))?;
                setup.stage = SetupStage::Connect(peer);
                Ok(SetupStep::Answer(Frame::SegmentPublication(
                    self.segment_publication(),
                )))
            }
            SetupStage::Connect(peer) => {
                let request = match frame {
                    Frame::ConnectRequest(r) => r,
                    other => {
                        let e = unexpected("connect-request", &other);
                        return Err(SetupFailed::quiet(self.abandon(session, e)));
                    }
                };
                let opened = self.accept_rails(setup, peer, &request)?;
                setup.stage = SetupStage::Open;
                Ok(opened)
            }
            SetupStage::Open => Err(SetupFailed::quiet(OpenPeerError::Unexpected {
                expected: "nothing during the setup (the rails are up)",
                got: frame.frame_type(),
            })),
        }
    }

    /// The rails the peer's connect `request` asks for, made and
    /// installed; the accept to answer with.
    fn accept_rails(
        &self,
        setup: &RailSetup,
        peer: PeerId,
        request: &wire::ConnectRequest,
    ) -> Result<SetupStep, Box<SetupFailed>> {
        let mut st = self.lock();
        let caps = self.qp_caps();
        let mut made = Vec::new();
        let mut endpoints = Vec::new();
        let nics: Vec<&NicCtx> = self.ordered_nics(&st);
        for (i, rr) in request.rails.iter().enumerate() {
            let n = nics
                .iter()
                .find(|n| n.id.0 == u32::from(rr.target_nic.0))
                .or_else(|| nics.get(i % nics.len().max(1)));
            let Some(n) = n else {
                return Err(Box::new(SetupFailed {
                    last: Some(Frame::ConnectReject(wire::ConnectReject {
                        connect_id: request.connect_id,
                        code: wire::ErrorCode::NO_USABLE_RAIL,
                        message: wire::Message::truncating("no prepared nic context"),
                    })),
                    error: OpenPeerError::NoRail(NoRdmaRail::NoContext),
                }));
            };
            let psn = (crate::registration::fresh_token().0 as u32) & 0xff_ffff;
            let half = make_qp(n, caps, psn).map_err(SetupFailed::quiet)?;
            let mut ep = half.endpoint;
            ep.mtu = to_wire_mtu(min_mtu(n.mtu, to_verbs_mtu(rr.endpoint.mtu)));
            let qp = connect_qp(n, half, &rr.endpoint).map_err(SetupFailed::quiet)?;
            endpoints.push(ep);
            made.push((n.id.0, rr.endpoint.nic_id.0, qp, n.identity.name.clone()));
        }
        drop(nics);
        self.install_rails(&mut st, peer, setup.session, request.connect_id, made);
        // At debug: every peer that connects gets here; the engine's
        // listener logs the accepted ones within its budget.
        tracing::debug!(
            peer = peer.0,
            source = setup.established.peer.source_id.as_str(),
            "peer accepted"
        );
        Ok(SetupStep::Open(
            peer_info(&st, peer),
            Frame::ConnectAccept(wire::ConnectAccept {
                connect_id: request.connect_id,
                rails: endpoints,
            }),
        ))
    }

    /// The state, locked, and the session `peer` was admitted with.
    #[cfg(any(test, feature = "testing"))]
    fn locked_session(
        &self,
        peer: PeerId,
    ) -> Result<(StateGuard<'_>, wire::SessionId), OpenPeerError> {
        let st = self.lock();
        let session = st
            .engine
            .peer_session(peer)
            .ok_or(OpenPeerError::UnknownPeer(peer))?;
        Ok((st, session))
    }

    /// Applies a `segment-publication` a peer sent after it was opened (new
    /// ranges; same-id ranges replaced). A publication naming another epoch
    /// than the peer's is refused.
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_publication(
        &self,
        peer: PeerId,
        publication: &wire::SegmentPublication,
    ) -> Result<(), OpenPeerError> {
        let (mut st, session) = self.locked_session(peer)?;
        self.shared
            .peer_table()
            .record_publication(session, publication)?;
        st.engine.apply_publication(peer, publication);
        Ok(())
    }

    /// Applies a `segment-retire` a peer sent: requests naming those ranges
    /// are refused at submit from now on (already posted ones run out).
    #[cfg(any(test, feature = "testing"))]
    pub fn apply_retire(
        &self,
        peer: PeerId,
        retire: &wire::SegmentRetire,
    ) -> Result<(), OpenPeerError> {
        let (mut st, session) = self.locked_session(peer)?;
        self.shared.peer_table().record_retire(session, retire)?;
        st.engine.apply_retire(peer, retire);
        Ok(())
    }

    /// The `segment-retire` frame telling peers that these registrations
    /// are no longer published.
    #[cfg(any(test, feature = "testing"))]
    pub fn segment_retire(
        &self,
        registrations: &[crate::transport::RegistrationId],
    ) -> wire::SegmentRetire {
        wire::SegmentRetire {
            epoch: self.shared.epoch,
            range_ids: registrations.iter().map(|r| wire::RangeId(r.0)).collect(),
        }
    }

    pub(crate) fn qp_caps(&self) -> QpCaps {
        QpCaps {
            // Room for the notification SENDs beside the slices.
            max_send_wr: self.shared.settings.max_in_flight
                + crate::transport::rdma::slots::SEND_SLOTS as u32,
            max_recv_wr: crate::transport::rdma::slots::RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
        }
    }

    fn ordered_nics<'a>(&self, st: &'a State) -> Vec<&'a NicCtx> {
        let Some(init) = st.init.as_ref() else {
            return Vec::new();
        };
        let mut v: Vec<&NicCtx> = Vec::new();
        for id in &st.nic_order {
            if let Some(n) = init.nics.iter().find(|n| n.id.0 == *id) {
                v.push(n);
            }
        }
        v
    }

    /// Records a peer whose session was established outside the engine's
    /// control link (tests: a hello admitted by hand into
    /// [`peer_table`](Self::peer_table) under `session`) with the
    /// publication it sent. See [`adopt_session`](Self::adopt_session).
    #[cfg(any(test, feature = "testing"))]
    pub fn adopt_peer(
        &self,
        session: wire::SessionId,
        established: &Established,
        publication: &wire::SegmentPublication,
    ) -> Result<PeerInfo, OpenPeerError> {
        self.adopt_session(session, established, publication)
    }

    /// Records a peer whose data session admitted it under `session`, with
    /// the publication it sent. Needs no NIC context: the peer has no rdma
    /// rails until its control link makes some. Epoch rules as for
    /// `open_peer`: a replacement invalidates the old incarnation's rails
    /// and descriptors.
    pub(crate) fn adopt_session(
        &self,
        session: wire::SessionId,
        established: &Established,
        publication: &wire::SegmentPublication,
    ) -> Result<PeerInfo, OpenPeerError> {
        self.fenced_peer()?;
        let id = self.adopt(session, established, publication)?;
        Ok(peer_info(&self.lock(), id))
    }

    /// Records the peer (new, reconnect or replacement) and its ranges;
    /// a replaced incarnation's rails are retired.
    fn adopt(
        &self,
        session: wire::SessionId,
        est: &Established,
        publication: &wire::SegmentPublication,
    ) -> Result<PeerId, OpenPeerError> {
        let mut st = self.lock();
        self.shared
            .peer_table()
            .record_publication(session, publication)?;
        let adoption = st.engine.adopt_peer(session, est, publication);
        if !adoption.retire.is_empty() {
            let now = Instant::now();
            for rail in adoption.retire {
                st.retire_rail(rail, now);
            }
            st.pump(now);
        }
        Ok(adoption.peer)
    }

    fn abandon(&self, session: wire::SessionId, e: OpenPeerError) -> OpenPeerError {
        self.shared.peer_table().session_closed(session);
        e
    }

    /// Whether this engine has a usable rdma rail: NIC contexts (prepared
    /// on first use) and at least one with an active port. `Err((has
    /// contexts, why not))`: with contexts but no active port the engine
    /// still advertises RDMA (the path policy reports a fallback).
    pub(crate) fn rdma_usable(&self) -> Result<(), (bool, String)> {
        self.ensure_contexts().map_err(|e| (false, e.to_string()))?;
        let st = self.lock();
        let nics = self.ordered_nics(&st);
        if nics.iter().any(|n| n.port_active()) {
            return Ok(());
        }
        let down: Vec<String> = nics
            .iter()
            .map(|n| {
                format!(
                    "NIC ID {} ({}) port {} not active",
                    n.id.0, n.identity.name, n.port
                )
            })
            .collect();
        Err((true, down.join("; ")))
    }

    /// Closes `peer`'s rdma rails (a net peer switched to another path).
    /// Returns the rails closed.
    pub(crate) fn close_rdma_rails(&self, peer: PeerId) -> Vec<RailId> {
        let mut st = self.lock();
        let now = Instant::now();
        let rails = st.engine.detach_rails(peer, PathKind::Rdma);
        for &rail in &rails {
            st.retire_rail(rail, now);
        }
        if !rails.is_empty() {
            st.pump(now);
        }
        rails
    }

    fn install_rails(
        &self,
        st: &mut State,
        peer: PeerId,
        session: wire::SessionId,
        connect_id: wire::ConnectId,
        made: Vec<(u32, u16, verbs::QueuePair<verbs::qp_state::Rts>, String)>,
    ) {
        let _ = self
            .shared
            .peer_table()
            .record_rc_connection(session, connect_id);
        let now = Instant::now();
        // A reconnect replaces the rails of the same incarnation.
        for rail in st.engine.detach_rails(peer, PathKind::Rdma) {
            st.retire_rail(rail, now);
        }
        for (nic, remote_nic, mut qp, device) in made {
            let qpn = qp.qp_num();
            let notify = st
                .init
                .as_ref()
                .and_then(|i| i.nics.iter().find(|n| n.id.0 == nic))
                .map(|n| crate::transport::rdma::slots::RailNotify::prepare(&n.pd, &mut qp));
            let notify = match notify {
                Some(Ok(n)) => Some(n),
                Some(Err(e)) => {
                    tracing::warn!(nic, error = %e, "rail carries no notifications");
                    None
                }
                None => None,
            };
            let spec = RailSpec {
                path: PathKind::Rdma,
                peer,
                nic: Some(nic),
                remote_nic: Some(u32::from(remote_nic)),
                max_in_flight: self.shared.settings.max_in_flight,
                signal_interval: self.shared.settings.signal_interval,
            };
            let rail = st.add_rail(Owner::Rdma, spec);
            st.rdma.insert(
                rail,
                RdmaRail {
                    nic,
                    remote_nic,
                    qp: RailQp::Rts(qp),
                    device,
                    failed: false,
                    notify,
                },
            );
            st.qpn_rail.insert((nic, qpn), rail);
            // This side re-establishes the rail once it holds the peer's
            // rdma control session (the side that opened the peer).
            st.recovery.track(rail, false, now);
        }
    }
}

/// The responder's part of an rdma control link after the handshake, as
/// far as it went: the peer's publication is answered with ours, then its
/// RC connect request with the accept once the rails are made
/// ([`TransferEngine::rail_setup_step`]).
#[derive(Debug)]
pub(crate) struct RailSetup {
    session: wire::SessionId,
    established: Established,
    stage: SetupStage,
}

impl RailSetup {
    /// The setup of the control link admitted as `session`.
    pub(crate) fn new(session: wire::SessionId, established: Established) -> Self {
        Self {
            session,
            established,
            stage: SetupStage::Publication,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum SetupStage {
    /// Waiting for the peer's publication.
    Publication,
    /// Adopted as this peer; waiting for its connect request.
    Connect(PeerId),
    /// The rails are up.
    Open,
}

/// What a step of [`RailSetup`] answers.
#[derive(Debug)]
pub(crate) enum SetupStep {
    /// Send this; the setup goes on.
    Answer(Frame),
    /// The rails are up: send this (the accept); the link is open.
    Open(PeerInfo, Frame),
}

/// A setup that failed: the frame that tells the peer, if any, and why.
#[derive(Debug)]
pub(crate) struct SetupFailed {
    pub(crate) last: Option<Frame>,
    pub(crate) error: OpenPeerError,
}

impl SetupFailed {
    fn quiet(error: OpenPeerError) -> Box<Self> {
        Box::new(Self { last: None, error })
    }
}

fn unexpected(expected: &'static str, got: &Frame) -> OpenPeerError {
    match got {
        Frame::Error(e) => OpenPeerError::Rejected {
            code: e.code,
            message: e.message.as_str().to_owned(),
        },
        other => OpenPeerError::Unexpected {
            expected,
            got: other.frame_type(),
        },
    }
}
