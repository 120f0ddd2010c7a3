//! The fabric's state: objects, queues, faults, and the bookkeeping that
//! delivers completions and events.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use orbitte_memory::DmaBuffer;

use super::{Shared, SimDescription, WrMatch};
use crate::error::{ObjectKind, PostErrorKind};
use crate::types::{Access, AsyncEvent, PortState, QpCaps, QpState, RtrAttrs, RtsAttrs};
use crate::wr::{Completion, SendOp, Sge, WcOpcode, WcStatus};

/// Wakes the waiters of the queues whose bells `take_bells` returned.
pub(crate) fn ring(bells: &[Arc<CqRing>]) {
    for b in bells {
        b.bell.notify_all();
    }
}

/// Deterministic generator (splitmix64).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// (device index, QP number).
pub(crate) type QpKey = (usize, u32);

#[derive(Debug)]
pub(crate) struct DevRt {
    pub(crate) ports: Vec<PortState>,
    pub(crate) next_key_index: u32,
    pub(crate) next_qpn: u32,
    pub(crate) mrs: u32,
    pub(crate) qps: u32,
}

#[derive(Debug)]
pub(crate) struct MrRec {
    pub(crate) pd: u64,
    pub(crate) buf: Arc<dyn DmaBuffer>,
    /// Offset of the region in `buf`.
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Virtual address of the region's first byte.
    pub(crate) addr: u64,
    pub(crate) access: Access,
}

impl MrRec {
    /// Offset inside the region of `addr..addr+len`, if it fits.
    pub(crate) fn locate(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.addr)?;
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        usize::try_from(off).ok()
    }

    /// Copies out of the region. `off..off+out.len()` must have been
    /// checked with [`locate`](Self::locate).
    pub(crate) fn read(&self, off: usize, out: &mut [u8]) {
        if off.checked_add(out.len()).is_none_or(|end| end > self.len) {
            return;
        }
        // SAFETY: `off + out.len() <= self.len` (checked above); the region
        // lies inside the live `buf` (checked at registration); DmaBuffer
        // allows raw concurrent access; `out` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.buf.as_ptr().add(self.offset + off),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    /// Copies `len` bytes at `off` of this region to `dst_off` of `dst`
    /// (the two may be the same region, even overlapping), as a NIC moves
    /// bytes: no staging buffer. Both ranges must have been checked with
    /// [`locate`](Self::locate).
    pub(crate) fn copy_to(&self, off: usize, dst: &Self, dst_off: usize, len: usize) {
        if off.checked_add(len).is_none_or(|end| end > self.len)
            || dst_off.checked_add(len).is_none_or(|end| end > dst.len)
        {
            return;
        }
        // SAFETY: both ranges lie inside their registered regions (checked
        // above), which lie inside their live buffers (checked at
        // registration); DmaBuffer allows raw concurrent access; `copy`
        // allows the ranges to overlap.
        unsafe {
            std::ptr::copy(
                self.buf.as_ptr().add(self.offset + off),
                dst.buf.as_ptr().add(dst.offset + dst_off),
                len,
            );
        }
    }

    /// Copies into the region (bounds as for [`read`](Self::read)).
    pub(crate) fn write(&self, off: usize, data: &[u8]) {
        if off.checked_add(data.len()).is_none_or(|end| end > self.len) {
            return;
        }
        // SAFETY: as in `read`: bounds checked against the registered
        // range, which lies inside the live buffer; `data` is a distinct
        // Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buf.as_ptr().add(self.offset + off),
                data.len(),
            );
        }
    }
}

#[derive(Debug)]
pub(crate) struct CqEntry {
    pub(crate) wc: Completion,
    /// The slots of the QP that posted the work, freed when this entry is
    /// polled.
    pub(crate) slots: Arc<Retired>,
    pub(crate) sq_retire: u32,
    pub(crate) rq_retire: u32,
}

/// Work-queue slots of a QP freed by polled completions. A poller adds to
/// them without the fabric lock; a post compares them with what it
/// posted.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    pub(crate) sq: AtomicU32,
    pub(crate) rq: AtomicU32,
}

/// A completion queue's entries, behind their own lock: polling takes
/// only that lock, so a poller never waits for the fabric thread's
/// execution of work (which holds the fabric lock), as on hardware, where
/// the NIC writes entries and the host reads them without a lock between.
/// Lock order: the fabric lock before a ring's.
#[derive(Debug, Default)]
pub(crate) struct CqRing {
    pub(crate) queue: Mutex<CqQueue>,
    /// Whether a poll finds anything (an entry, the overrun, the end),
    /// written under `queue`'s lock and read without it: polling an empty
    /// queue takes no lock.
    pub(crate) filled: AtomicBool,
    /// Where the queue's waiters sleep (with `queue`'s lock): rung after
    /// a delivery to this queue only, so a waiter on another queue sleeps
    /// on.
    pub(crate) bell: Condvar,
}

#[derive(Debug, Default)]
pub(crate) struct CqQueue {
    pub(crate) entries: VecDeque<CqEntry>,
    pub(crate) overflowed: bool,
    /// The queue was destroyed: polls find nothing, waits end.
    pub(crate) destroyed: bool,
}

impl CqRing {
    pub(crate) fn lock(&self) -> MutexGuard<'_, CqQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `filled` true to what `q` (this ring's queue, locked) holds.
    pub(crate) fn refresh(&self, q: &CqQueue) {
        let filled = !q.entries.is_empty() || q.overflowed || q.destroyed;
        self.filled.store(filled, Ordering::Release);
    }
}

#[derive(Debug)]
pub(crate) struct CqRec {
    pub(crate) device: usize,
    pub(crate) depth: u32,
    pub(crate) ring: Arc<CqRing>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendFaultKind {
    Stall,
    Fail {
        status: WcStatus,
        apply_data: bool,
    },
    /// `post_send` refuses the request (and the rest of its batch).
    RefusePost {
        errno: i32,
    },
}

#[derive(Debug)]
pub(crate) struct SendFault {
    pub(crate) m: WrMatch,
    pub(crate) seen: u32,
    pub(crate) kind: SendFaultKind,
}

#[derive(Debug)]
pub(crate) struct CountFault {
    pub(crate) device: Option<usize>,
    pub(crate) nth: u32,
    pub(crate) seen: u32,
    pub(crate) errno: i32,
}

#[derive(Debug, Default)]
pub(crate) struct FaultState {
    pub(crate) sends: Vec<SendFault>,
    pub(crate) regs: Vec<CountFault>,
    pub(crate) opens: Vec<CountFault>,
    pub(crate) destroys: Vec<(usize, ObjectKind, i32)>,
}

impl FaultState {
    /// Counts one event against count faults on `device`; returns the
    /// errno of the first one that fires (and removes it).
    pub(crate) fn count(list: &mut Vec<CountFault>, device: usize) -> Option<i32> {
        let mut fired = None;
        for f in list.iter_mut() {
            if f.device.is_none_or(|d| d == device) {
                f.seen += 1;
                if f.seen == f.nth && fired.is_none() {
                    fired = Some(f.errno);
                }
            }
        }
        list.retain(|f| f.seen < f.nth);
        fired
    }

    pub(crate) fn destroy(&mut self, device: usize, kind: ObjectKind) -> Option<i32> {
        let i = self
            .destroys
            .iter()
            .position(|&(d, k, _)| d == device && k == kind)?;
        Some(self.destroys.remove(i).2)
    }

    pub(crate) fn send(
        &mut self,
        device_name: &str,
        qpn: u32,
        state: QpState,
    ) -> Option<SendFaultKind> {
        if self.sends.is_empty() {
            return None;
        }
        let mut fired = None;
        for f in &mut self.sends {
            if f.m.device.as_deref().is_none_or(|d| d == device_name)
                && f.m.qpn.is_none_or(|q| q == qpn)
                && f.m.state.is_none_or(|s| s == state)
            {
                f.seen += 1;
                if f.seen == f.m.nth && fired.is_none() {
                    fired = Some(f.kind);
                }
            }
        }
        self.sends.retain(|f| f.seen < f.m.nth);
        fired
    }
}

/// A work request's SGE list, inline when it has one entry (the common
/// case: no allocation per posted request).
#[derive(Debug, Clone)]
pub(crate) enum Sges {
    One(Sge),
    Many(Vec<Sge>),
}

impl Sges {
    pub(crate) fn from_slice(sges: &[Sge]) -> Self {
        match sges {
            [one] => Self::One(*one),
            many => Self::Many(many.to_vec()),
        }
    }
}

impl std::ops::Deref for Sges {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            Self::One(one) => std::slice::from_ref(one),
            Self::Many(many) => many,
        }
    }
}

#[derive(Debug)]
pub(crate) struct PendingSend {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) sges: Sges,
    pub(crate) signaled: bool,
    pub(crate) due: Duration,
    pub(crate) seq: u64,
    pub(crate) fault: Option<SendFaultKind>,
}

impl PendingSend {
    /// The fabric's copy of a posted work request.
    pub(crate) fn of(
        wr: &crate::wr::SendWr<'_>,
        due: Duration,
        seq: u64,
        fault: Option<SendFaultKind>,
    ) -> Self {
        Self {
            wr_id: wr.wr_id,
            op: wr.op,
            sges: Sges::from_slice(wr.sges),
            signaled: wr.signaled,
            due,
            seq,
            fault,
        }
    }
}

#[derive(Debug)]
pub(crate) struct PendingRecv {
    pub(crate) wr_id: u64,
    pub(crate) sges: Sges,
}

#[derive(Debug)]
pub(crate) struct QpRec {
    pub(crate) pd: u64,
    pub(crate) send_cq: u64,
    pub(crate) recv_cq: u64,
    pub(crate) caps: QpCaps,
    pub(crate) state: QpState,
    pub(crate) port: u8,
    pub(crate) access: Access,
    pub(crate) rtr: Option<RtrAttrs>,
    /// The device and port the RTR route reaches in the fabric's
    /// description (which never changes, so it is found once, at RTR).
    pub(crate) reaches: Option<(usize, u8)>,
    pub(crate) rts: Option<RtsAttrs>,
    pub(crate) sq: VecDeque<PendingSend>,
    pub(crate) rq: VecDeque<PendingRecv>,
    /// The send queue's posting side, shared with the QP's handle.
    pub(crate) doorbell: Arc<Mutex<Doorbell>>,
    /// Receive WRs ever posted (wrapping); those whose slot a polled
    /// completion has not freed are these less `retired`'s.
    pub(crate) rq_posted: u32,
    pub(crate) retired: Arc<Retired>,
    /// Unsignaled successes since the last send completion.
    pub(crate) unsignaled: u32,
}

/// The posting side of a QP's send queue. A post to a QP in RTS on a fabric
/// with its own delivery thread, no send faults and no recording takes only
/// this lock, not the fabric's: it appends to `rung`, which the fabric
/// moves to the send queue the next time anyone takes the fabric lock
/// ([`Shared::lock`](super::Shared::lock)). So a poster never waits for
/// the fabric's execution, as a NIC's doorbell does not. Lock order: the
/// fabric lock, then this one.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    /// The QP is in RTS (kept by whoever changes its state, under both
    /// locks): posts may take the lock-free path.
    pub(crate) ready: bool,
    /// Send WRs ever posted (wrapping); those whose slot a polled
    /// completion has not freed are these less `retired`'s.
    pub(crate) posted: u32,
    /// Due time of the last posted send WR (a QP executes in order).
    pub(crate) last_due: Duration,
    /// Posted on the lock-free path, not yet in the send queue.
    pub(crate) rung: Vec<PendingSend>,
}

impl Doorbell {
    /// Checks a send work request against the QP's bounds, as
    /// `ibv_post_send` does: its SGE count, and a slot that no polled
    /// completion has yet to free.
    pub(crate) fn check(
        &self,
        wr: &crate::wr::SendWr<'_>,
        caps: &QpCaps,
        retired: &Retired,
    ) -> Result<(), PostErrorKind> {
        if wr.sges.len() > caps.max_send_sge as usize {
            return Err(PostErrorKind::TooManySges {
                sges: wr.sges.len(),
                max: caps.max_send_sge,
            });
        }
        let outstanding = self.posted.wrapping_sub(retired.sq.load(Ordering::Acquire));
        if outstanding >= caps.max_send_wr {
            return Err(PostErrorKind::QueueFull {
                depth: caps.max_send_wr,
            });
        }
        Ok(())
    }

    /// Counts a checked send work request as posted at `now` and returns
    /// when it is due: after the base latency, its transfer time and
    /// `jitter_ns`, and never before the QP's previous request.
    pub(crate) fn accept(
        &mut self,
        wr: &crate::wr::SendWr<'_>,
        now: Duration,
        timing: &super::SimTiming,
        jitter_ns: u64,
    ) -> Duration {
        let xfer = wr
            .byte_len()
            .saturating_mul(1_000_000_000)
            .checked_div(timing.bytes_per_sec)
            .unwrap_or(0);
        let due =
            (now + timing.base_latency + Duration::from_nanos(xfer + jitter_ns)).max(self.last_due);
        self.last_due = due;
        self.posted = self.posted.wrapping_add(1);
        due
    }
}

impl QpRec {
    pub(crate) fn doorbell(&self) -> MutexGuard<'_, Doorbell> {
        self.doorbell.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the QP's state and whether posts may skip the fabric lock.
    pub(crate) fn set_state(&mut self, state: QpState) {
        self.state = state;
        self.doorbell().ready = state == QpState::Rts;
    }

    /// Receive WRs posted and not yet polled.
    pub(crate) fn rq_outstanding(&self) -> u32 {
        self.rq_posted
            .wrapping_sub(self.retired.rq.load(Ordering::Acquire))
    }
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) now: Duration,
    pub(crate) rng: Rng,
    pub(crate) next_id: u64,
    pub(crate) devs: Vec<DevRt>,
    /// Open contexts: id -> (device, pending async events).
    pub(crate) contexts: BTreeMap<u64, (usize, VecDeque<AsyncEvent>)>,
    /// PDs: id -> device.
    pub(crate) pds: BTreeMap<u64, usize>,
    pub(crate) mrs: BTreeMap<(usize, u32), MrRec>,
    pub(crate) cqs: BTreeMap<u64, CqRec>,
    pub(crate) qps: BTreeMap<QpKey, QpRec>,
    pub(crate) faults: FaultState,
    /// Async events raised so far: the fabric thread wakes event waiters
    /// only when it changed.
    pub(crate) events: u64,
    /// Bells of the queues delivered to since they were last rung
    /// ([`take_bells`](Self::take_bells)).
    pub(crate) bells: Vec<Arc<CqRing>>,
    /// Accepted send work requests, oldest first, while recording
    /// ([`SimFabric::record_sends`](super::SimFabric::record_sends)).
    pub(crate) sent: Option<Vec<super::SentWr>>,
}

impl State {
    pub(crate) fn new(desc: &SimDescription, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let devs = desc
            .devices
            .iter()
            .map(|d| DevRt {
                ports: d.ports.iter().map(|p| p.state).collect(),
                next_key_index: 1 + (rng.next() % 0x100) as u32,
                next_qpn: 0x11 + (rng.next() % 0x1000) as u32,
                mrs: 0,
                qps: 0,
            })
            .collect();
        Self {
            now: Duration::ZERO,
            rng,
            next_id: 1,
            devs,
            contexts: BTreeMap::new(),
            pds: BTreeMap::new(),
            mrs: BTreeMap::new(),
            cqs: BTreeMap::new(),
            qps: BTreeMap::new(),
            faults: FaultState::default(),
            events: 0,
            bells: Vec::new(),
            sent: None,
        }
    }

    pub(crate) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The bells of the queues delivered to since the last call, to ring
    /// ([`ring`](ring)) once the fabric lock is released.
    pub(crate) fn take_bells(&mut self) -> Vec<Arc<CqRing>> {
        std::mem::take(&mut self.bells)
    }

    /// Moves the send WRs posted on the lock-free path into their send
    /// queues, in posting order; those of a QP that went to the error state
    /// since are flushed, as a post to it would be.
    pub(crate) fn absorb(&mut self) {
        let mut flushed = Vec::new();
        for (&key, qp) in &mut self.qps {
            let mut db = qp.doorbell.lock().unwrap_or_else(|e| e.into_inner());
            if db.rung.is_empty() {
                continue;
            }
            if qp.state == QpState::Error {
                flushed.extend(db.rung.drain(..).map(|wr| (key, wr)));
            } else {
                qp.sq.extend(db.rung.drain(..));
            }
        }
        for (key, wr) in flushed {
            self.complete_send(key, &wr, WcStatus::WrFlush, 0);
        }
    }

    pub(crate) fn pending(&self) -> usize {
        self.qps.values().map(|q| q.sq.len()).sum()
    }

    pub(crate) fn push_event(&mut self, device: usize, ev: AsyncEvent) {
        self.events += 1;
        for (d, events) in self.contexts.values_mut() {
            if *d == device {
                events.push_back(ev);
            }
        }
    }

    pub(crate) fn set_port(&mut self, device: usize, port: u8, state: PortState, ev: AsyncEvent) {
        if let Some(p) = self.devs[device]
            .ports
            .get_mut(usize::from(port).wrapping_sub(1))
        {
            *p = state;
        }
        self.push_event(device, ev);
    }

    /// Puts a completion on a CQ; an overrun marks the CQ and raises
    /// `CqError` (the completion is lost, as on hardware).
    pub(crate) fn deliver(&mut self, cq: u64, entry: CqEntry) {
        let Some(rec) = self.cqs.get_mut(&cq) else {
            return;
        };
        if !self.bells.iter().any(|b| Arc::ptr_eq(b, &rec.ring)) {
            self.bells.push(rec.ring.clone());
        }
        let mut q = rec.ring.lock();
        if q.entries.len() >= rec.depth as usize {
            let first = !q.overflowed;
            q.overflowed = true;
            rec.ring.refresh(&q);
            drop(q);
            if first {
                let device = rec.device;
                self.push_event(device, AsyncEvent::CqError);
            }
            return;
        }
        q.entries.push_back(entry);
        rec.ring.refresh(&q);
    }

    /// Completes a send WR of QP `key` (success completions only when
    /// signaled; errors always).
    pub(crate) fn complete_send(
        &mut self,
        key: QpKey,
        wr: &PendingSend,
        status: WcStatus,
        byte_len: u32,
    ) {
        let Some(qp) = self.qps.get_mut(&key) else {
            return;
        };
        if status.is_success() && !wr.signaled {
            qp.unsignaled += 1;
            return;
        }
        let retire = 1 + std::mem::take(&mut qp.unsignaled);
        let cq = qp.send_cq;
        let slots = qp.retired.clone();
        let ok = status.is_success();
        let opcode = ok.then_some(match wr.op {
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::Send { .. } => WcOpcode::Send,
        });
        let wc = Completion {
            wr_id: wr.wr_id,
            status,
            opcode,
            byte_len: if ok { byte_len } else { 0 },
            imm: None,
            qp_num: key.1,
            vendor_err: 0,
        };
        self.deliver(
            cq,
            CqEntry {
                wc,
                slots,
                sq_retire: retire,
                rq_retire: 0,
            },
        );
    }

    /// Completes the receive `wr` of QP `key`.
    pub(crate) fn complete_recv(
        &mut self,
        key: QpKey,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        let Some(qp) = self.qps.get(&key) else { return };
        let ok = status.is_success();
        let wc = Completion {
            wr_id,
            status,
            opcode: ok.then_some(opcode),
            byte_len: if ok { byte_len } else { 0 },
            imm: if ok { imm } else { None },
            qp_num: key.1,
            vendor_err: 0,
        };
        let cq = qp.recv_cq;
        let slots = qp.retired.clone();
        self.deliver(
            cq,
            CqEntry {
                wc,
                slots,
                sq_retire: 0,
                rq_retire: 1,
            },
        );
    }

    /// Moves a QP to the error state and flushes all its work, oldest
    /// first, with `WrFlush`; then raises `event` on its device.
    pub(crate) fn qp_to_error(&mut self, _shared: &Shared, key: QpKey, event: Option<AsyncEvent>) {
        let Some(qp) = self.qps.get_mut(&key) else {
            return;
        };
        qp.set_state(QpState::Error);
        let sq = std::mem::take(&mut qp.sq);
        let rq = std::mem::take(&mut qp.rq);
        for wr in &sq {
            self.complete_send(key, wr, WcStatus::WrFlush, 0);
        }
        for wr in rq {
            self.complete_recv(key, wr.wr_id, WcStatus::WrFlush, WcOpcode::Recv, 0, None);
        }
        if let Some(ev) = event {
            self.push_event(key.0, ev);
        }
    }

    /// Earliest due time of runnable-looking work (for the fabric thread).
    pub(crate) fn next_due(&self) -> Option<Duration> {
        self.qps
            .values()
            .filter_map(|q| q.sq.front())
            .map(|w| w.due)
            .min()
    }
}
