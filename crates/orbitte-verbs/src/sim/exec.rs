//! Executing posted work: scheduling, connectivity, key checks, copies.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use super::state::{MrRec, PendingSend, QpKey, SendFaultKind, State};
use crate::types::{Access, AsyncEvent, GidType, LinkLayer, PortState, QpState, Route};
use crate::wr::{RemoteAddr, SendOp, Sge, WcOpcode, WcStatus};

/// Work requests the fabric thread executes per hold of the fabric lock:
/// between holds, pollers take the completions already delivered and
/// posters add work, so a long batch is executed, polled and handled side
/// by side instead of one stage after the other.
const STEPS_PER_HOLD: usize = 32;

/// Starts the real-time delivery thread. It holds only a weak reference
/// between rounds, so it ends when the fabric is dropped.
pub(crate) fn spawn_background(weak: Weak<Shared>) {
    let r = std::thread::Builder::new()
        .name("orbitte-sim-fabric".into())
        .spawn(move || {
            // Whether the last look found nothing to run after work ran
            // (the next idle look sleeps instead of polling).
            let mut polled = false;
            loop {
                let Some(shared) = weak.upgrade() else { return };
                // Read before the lock: a post that counted itself after
                // this read ends the watch below at once, and one that
                // counted itself before it is in the send queues once the
                // lock is taken.
                let seen = shared.posts.load(Ordering::SeqCst);
                let mut st = shared.lock();
                // Execute everything due, releasing the lock every
                // `STEPS_PER_HOLD` requests and waking the completion
                // waiters when something was delivered.
                let mut busy = false;
                let now = loop {
                    let now = shared.start.elapsed();
                    let raised = st.events;
                    let mut ran = 0;
                    while ran < STEPS_PER_HOLD && step(&shared, &mut st, Some(now)) {
                        ran += 1;
                    }
                    busy |= ran > 0;
                    st.now = now;
                    // Queues delivered to ring their own bells; event
                    // waiters wake on `cond` when an event was raised.
                    let raised = st.events != raised;
                    if ran < STEPS_PER_HOLD {
                        super::state::ring(&st.take_bells());
                        if raised {
                            shared.cond.notify_all();
                        }
                        break now;
                    }
                    let bells = st.take_bells();
                    drop(st);
                    super::state::ring(&bells);
                    if raised {
                        shared.cond.notify_all();
                    }
                    st = shared.lock();
                };
                if busy {
                    polled = false;
                }
                if !polled && st.next_due().is_none() {
                    // Nothing left to run: watch for a post for a while
                    // before sleeping, as a NIC sees its doorbell at once,
                    // with no thread to wake.
                    polled = true;
                    drop(st);
                    poll_posts(&shared, seen);
                    continue;
                }
                let cap = Duration::from_millis(20);
                let wait = st
                    .next_due()
                    .map_or(cap, |d| d.saturating_sub(now).min(cap));
                let wait = wait.max(Duration::from_micros(50));
                // Posts and faults ring `work`: completion waiters are not
                // woken by new work, nor the fabric by deliveries.
                // A lock-free post that counted itself after this look
                // sees `sleeping` and takes the lock to wake the thread.
                shared.sleeping.store(true, Ordering::SeqCst);
                if shared.rung.load(Ordering::SeqCst) != 0 {
                    shared.sleeping.store(false, Ordering::SeqCst);
                    continue;
                }
                let guard = shared
                    .work
                    .wait_timeout(st, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
                shared.sleeping.store(false, Ordering::SeqCst);
                drop(guard);
            }
        });
    if let Err(e) = r {
        tracing::error!(error = %e, "sim fabric: cannot start the delivery thread; completions will not arrive");
    }
}

/// How long the fabric thread watches for new posts once it ran out of
/// work, before it sleeps until a post wakes it.
const POLL_POSTS: Duration = Duration::from_micros(50);

/// Returns when a post came after the fabric's look that saw `seen`
/// posts, or after `POLL_POSTS`.
fn poll_posts(shared: &Shared, seen: u64) {
    let until = Instant::now() + POLL_POSTS;
    loop {
        for _ in 0..64 {
            if shared.posts.load(Ordering::Acquire) != seen {
                return;
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= until {
            return;
        }
    }
}

/// Executes the earliest due runnable work request (due no later than
/// `until`, if given). Returns whether one ran.
pub(crate) fn step(shared: &Shared, st: &mut State, until: Option<Duration>) -> bool {
    let mut best: Option<(Duration, u64, QpKey)> = None;
    for (&key, qp) in &st.qps {
        let Some(head) = qp.sq.front() else { continue };
        if head.fault == Some(SendFaultKind::Stall) {
            continue;
        }
        if until.is_some_and(|u| head.due > u) {
            continue;
        }
        if best.is_some_and(|(d, s, _)| (d, s) <= (head.due, head.seq)) {
            continue;
        }
        if waits_for_receive(st, key, head) {
            continue;
        }
        best = Some((head.due, head.seq, key));
    }
    let Some((due, _, key)) = best else {
        return false;
    };
    if due > st.now {
        st.now = due;
    }
    let Some(wr) = st.qps.get_mut(&key).and_then(|q| q.sq.pop_front()) else {
        return false;
    };
    execute(shared, st, key, wr);
    true
}

fn needs_receive(op: &SendOp) -> bool {
    matches!(op, SendOp::Send { .. } | SendOp::Write { imm: Some(_), .. })
}

/// A SEND (or WRITE with immediate) on a QP with infinite RNR retry whose
/// reachable peer has no receive posted waits, as hardware keeps retrying.
/// One whose local SGEs do not fit their keys does not wait: the NIC reads
/// them before the first packet leaves, and fails `LocalProtection` at once.
fn waits_for_receive(st: &State, key: QpKey, head: &PendingSend) -> bool {
    if !needs_receive(&head.op) || head.fault.is_some() {
        return false;
    }
    let Some(qp) = st.qps.get(&key) else {
        return false;
    };
    if qp.rts.is_none_or(|r| r.rnr_retry != 7) {
        return false;
    }
    if head
        .sges
        .iter()
        .any(|s| local_mr(st, key.0, qp.pd, s, Access::NONE).is_none())
    {
        return false;
    }
    match resolve(st, key) {
        Ok(t) => st.qps.get(&t).is_some_and(|t| t.rq.is_empty()),
        Err(_) => false,
    }
}

/// The device and port a route from (`device`, `port`, `sgid_index`)
/// reaches in the fabric's description, if any.
pub(crate) fn route_target(
    shared: &Shared,
    device: usize,
    port: u8,
    sgid: u8,
    route: Route,
) -> Option<(usize, u8, Option<GidType>)> {
    let local = shared
        .desc
        .devices
        .get(device)?
        .ports
        .get(usize::from(port).checked_sub(1)?)?;
    for (d, dev) in shared.desc.devices.iter().enumerate() {
        for (p, desc) in dev.ports.iter().enumerate() {
            if desc.network != local.network {
                continue;
            }
            let pnum = (p + 1) as u8;
            match route {
                Route::Lid(lid) => {
                    if local.link_layer != LinkLayer::Ethernet
                        && desc.link_layer != LinkLayer::Ethernet
                        && desc.lid == lid
                        && lid != 0
                    {
                        return Some((d, pnum, None));
                    }
                }
                Route::Gid(g) => {
                    let src = local.gids.get(usize::from(sgid)).filter(|e| e.valid)?;
                    if desc.link_layer != local.link_layer {
                        continue;
                    }
                    if desc
                        .gids
                        .iter()
                        .any(|e| e.valid && e.gid == g && e.gid_type == src.gid_type)
                    {
                        return Some((d, pnum, src.gid_type));
                    }
                }
            }
        }
    }
    None
}

/// The peer QP the QP `key` reaches now, or the status its work fails with
/// (`RetryExceeded`: the peer does not answer).
fn resolve(st: &State, key: QpKey) -> Result<QpKey, WcStatus> {
    let fail = Err(WcStatus::RetryExceeded);
    let Some(qp) = st.qps.get(&key) else {
        return fail;
    };
    let (Some(rtr), Some(rts)) = (qp.rtr, qp.rts) else {
        return fail;
    };
    let port_up = |d: usize, p: u8| {
        st.devs
            .get(d)
            .and_then(|r| r.ports.get(usize::from(p).checked_sub(1)?))
            .is_some_and(|s| *s == PortState::Active)
    };
    if !port_up(key.0, qp.port) {
        return fail;
    }
    let Some((d2, p2)) = qp.reaches else {
        return fail;
    };
    if !port_up(d2, p2) {
        return fail;
    }
    let tkey = (d2, rtr.remote.qpn);
    let Some(t) = st.qps.get(&tkey) else {
        return fail;
    };
    if !matches!(t.state, QpState::Rtr | QpState::Rts) || t.port != p2 {
        return fail;
    }
    let Some(trtr) = t.rtr else { return fail };
    if trtr.remote.qpn != key.1 || (trtr.remote.psn ^ rts.sq_psn) & 0x00ff_ffff != 0 {
        return fail;
    }
    // `t.reaches` is the route from (`d2`, `t.port` = `p2`).
    match t.reaches {
        Some((d, p)) if d == key.0 && p == qp.port => Ok(tkey),
        _ => fail,
    }
}

/// Finds the MR of an SGE on `device` and checks PD, bounds and access.
fn local_mr<'a>(
    st: &'a State,
    device: usize,
    pd: u64,
    sge: &Sge,
    need: Access,
) -> Option<(&'a MrRec, usize)> {
    let mr = st.mrs.get(&(device, sge.lkey()))?;
    if mr.pd != pd || !mr.access.contains(need) {
        return None;
    }
    let off = mr.locate(sge.addr(), u64::from(sge.length()))?;
    Some((mr, off))
}

fn remote_mr(
    st: &State,
    device: usize,
    pd: u64,
    qp_access: Access,
    r: RemoteAddr,
    len: u64,
    need: Access,
) -> Option<(&MrRec, usize)> {
    if !qp_access.contains(need) {
        return None;
    }
    let mr = st.mrs.get(&(device, r.rkey))?;
    if mr.pd != pd || !mr.access.contains(need) {
        return None;
    }
    let off = mr.locate(r.addr, len)?;
    Some((mr, off))
}

fn gather(st: &State, device: usize, sges: &[Sge], out: &mut Vec<u8>) {
    for sge in sges {
        if let Some(mr) = st.mrs.get(&(device, sge.lkey()))
            && let Some(off) = mr.locate(sge.addr(), u64::from(sge.length()))
        {
            let start = out.len();
            out.resize(start + sge.length() as usize, 0);
            mr.read(off, &mut out[start..]);
        }
    }
}

fn scatter(st: &State, device: usize, sges: &[Sge], mut data: &[u8]) {
    for sge in sges {
        if data.is_empty() {
            break;
        }
        if let Some(mr) = st.mrs.get(&(device, sge.lkey())) {
            let n = data.len().min(sge.length() as usize);
            if let Some(off) = mr.locate(sge.addr(), n as u64) {
                mr.write(off, &data[..n]);
            }
            data = &data[n..];
        }
    }
}

fn fail(shared: &Shared, st: &mut State, key: QpKey, wr: &PendingSend, status: WcStatus) {
    st.complete_send(key, wr, status, 0);
    st.qp_to_error(shared, key, None);
}

/// Runs one send work request of QP `key`.
fn execute(shared: &Shared, st: &mut State, key: QpKey, wr: PendingSend) {
    let Some(qp) = st.qps.get(&key) else { return };
    let (pd, _) = (qp.pd, qp.access);
    let total: u64 = wr.sges.iter().map(|s| u64::from(s.length())).sum();
    let byte_len = u32::try_from(total).unwrap_or(u32::MAX);

    if let Some(SendFaultKind::Fail { status, apply_data }) = wr.fault {
        if apply_data {
            // Best effort: move the bytes as a success would, then fail.
            if let Ok(t) = resolve(st, key) {
                let _ = move_data(st, key, t, &wr, total);
            }
        }
        let status = if status.is_success() {
            WcStatus::General
        } else {
            status
        };
        return fail(shared, st, key, &wr, status);
    }

    // Local SGEs first, as the NIC reads the WQE before sending.
    let need_local = if matches!(wr.op, SendOp::Read { .. }) {
        Access::LOCAL_WRITE
    } else {
        Access::NONE
    };
    if wr
        .sges
        .iter()
        .any(|s| local_mr(st, key.0, pd, s, need_local).is_none())
    {
        return fail(shared, st, key, &wr, WcStatus::LocalProtection);
    }
    let t = match resolve(st, key) {
        Ok(t) => t,
        Err(status) => return fail(shared, st, key, &wr, status),
    };
    match move_data(st, key, t, &wr, total) {
        Ok(()) => st.complete_send(key, &wr, WcStatus::Success, byte_len),
        Err(Responder::Access) => {
            st.complete_send(key, &wr, WcStatus::RemoteAccess, 0);
            st.qp_to_error(shared, key, None);
            st.qp_to_error(shared, t, Some(AsyncEvent::QpAccessError { qpn: t.1 }));
        }
        Err(Responder::Rnr) => fail(shared, st, key, &wr, WcStatus::RnrRetryExceeded),
        Err(Responder::RecvProtection(recv)) => {
            st.complete_recv(t, recv, WcStatus::LocalProtection, WcOpcode::Recv, 0, None);
            st.qp_to_error(shared, t, None);
            fail(shared, st, key, &wr, WcStatus::RemoteOperation);
        }
        Err(Responder::RecvLength(recv)) => {
            st.complete_recv(t, recv, WcStatus::LocalLength, WcOpcode::Recv, 0, None);
            st.qp_to_error(shared, t, None);
            fail(shared, st, key, &wr, WcStatus::RemoteInvalidRequest);
        }
    }
}

/// What the responder refused.
enum Responder {
    Access,
    Rnr,
    RecvProtection(u64),
    RecvLength(u64),
}

/// Moves the bytes of `wr` from QP `key` to/from peer `t`, consuming and
/// completing a receive at the peer where the operation needs one.
fn move_data(
    st: &mut State,
    key: QpKey,
    t: QpKey,
    wr: &PendingSend,
    total: u64,
) -> Result<(), Responder> {
    let (tpd, taccess) = match st.qps.get(&t) {
        Some(q) => (q.pd, q.access),
        None => return Err(Responder::Access),
    };
    match wr.op {
        SendOp::Write { remote, imm } => {
            let (dst, dst_off) =
                remote_mr(st, t.0, tpd, taccess, remote, total, Access::REMOTE_WRITE)
                    .ok_or(Responder::Access)?;
            if imm.is_some() && st.qps.get(&t).is_none_or(|q| q.rq.is_empty()) {
                return Err(Responder::Rnr);
            }
            // Each local SGE's bytes go straight to the next bytes of the
            // remote range (the SGEs were checked in `execute`).
            let mut at = dst_off;
            for sge in wr.sges.iter() {
                let len = sge.length() as usize;
                if let Some(mr) = st.mrs.get(&(key.0, sge.lkey()))
                    && let Some(off) = mr.locate(sge.addr(), len as u64)
                {
                    mr.copy_to(off, dst, at, len);
                    at += len;
                }
            }
            if let Some(imm) = imm
                && let Some(recv) = st.qps.get_mut(&t).and_then(|q| q.rq.pop_front())
            {
                let n = u32::try_from(total).unwrap_or(u32::MAX);
                st.complete_recv(
                    t,
                    recv.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    n,
                    Some(imm),
                );
            }
            Ok(())
        }
        SendOp::Read { remote } => {
            let (src, mut at) =
                remote_mr(st, t.0, tpd, taccess, remote, total, Access::REMOTE_READ)
                    .ok_or(Responder::Access)?;
            // The remote range fills the local SGEs in order (the NIC keeps
            // the qp's PD checked in `execute`).
            let mut left = usize::try_from(total).unwrap_or(0);
            for sge in wr.sges.iter() {
                if left == 0 {
                    break;
                }
                if let Some(mr) = st.mrs.get(&(key.0, sge.lkey())) {
                    let n = left.min(sge.length() as usize);
                    if let Some(off) = mr.locate(sge.addr(), n as u64) {
                        src.copy_to(at, mr, off, n);
                    }
                    at += n;
                    left -= n;
                }
            }
            Ok(())
        }
        SendOp::Send { imm } => {
            let Some(recv) = st.qps.get_mut(&t).and_then(|q| q.rq.pop_front()) else {
                return Err(Responder::Rnr);
            };
            if recv
                .sges
                .iter()
                .any(|s| local_mr(st, t.0, tpd, s, Access::LOCAL_WRITE).is_none())
            {
                return Err(Responder::RecvProtection(recv.wr_id));
            }
            let room: u64 = recv.sges.iter().map(|s| u64::from(s.length())).sum();
            if room < total {
                return Err(Responder::RecvLength(recv.wr_id));
            }
            let mut buf = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
            gather(st, key.0, &wr.sges, &mut buf);
            scatter(st, t.0, &recv.sges, &buf);
            let n = u32::try_from(total).unwrap_or(u32::MAX);
            st.complete_recv(t, recv.wr_id, WcStatus::Success, WcOpcode::Recv, n, imm);
            Ok(())
        }
    }
}
