//! Transfers: a batch of READs or WRITEs with one peer, prepared once
//! (NIXL's `prepXfer`), posted with an optional notification that the
//! peer receives after the bytes (`postXfer`), checked without waiting
//! (`checkXfer`) and released (`releaseReqH`).

use std::sync::Arc;
use std::time::Duration;

use orbitte::{
    DrainStatus, MAX_NOTIFICATION_LEN, Notification, NotificationError, NotificationStatus, Op,
    Outcome, PathKind, Posting, RemoteEffect, RemoteTarget, Request, RequestId, Status,
    SubmitError, SubmitOptions, WaitError,
};

use crate::args::{self, put};
use crate::cma::{self, Run, RunState, Seg};
use crate::handle::{
    self, Engine, Kept, PeerEntry, lock, orbitte_engine, orbitte_peer, orbitte_xfer,
};
use crate::memory::{ORBITTE_REG_REMOTE, holding, loaded_host, ranges_for};
use crate::status::{
    Failure, ORBITTE_ERR_BACKEND, ORBITTE_ERR_NOT_FOUND, ORBITTE_ERR_NOT_POSTED,
    ORBITTE_ERR_REMOTE_DISCONNECT, ORBITTE_ERR_REPOST_ACTIVE, ORBITTE_IN_PROGRESS, ORBITTE_OK,
    c_name, guard,
};

/// READ: remote bytes into local memory.
pub const ORBITTE_OP_READ: i32 = 0;
/// WRITE: local bytes into remote memory.
pub const ORBITTE_OP_WRITE: i32 = 1;

/// The most bytes a notification carries (over rdma-only peers, 4096).
pub const ORBITTE_MAX_NOTIF_LEN: usize = 1 << 20;
const _: () = assert!(ORBITTE_MAX_NOTIF_LEN == MAX_NOTIFICATION_LEN);

/// `orbitte_xfer_status.failed_status`: the request completed.
pub const ORBITTE_REQ_COMPLETE: i32 = 0;
/// A slice of the request failed.
pub const ORBITTE_REQ_FAILED: i32 = 1;
/// The request timeout passed first.
pub const ORBITTE_REQ_TIMED_OUT: i32 = 2;
/// The request was cancelled (the transfer was released in flight).
pub const ORBITTE_REQ_CANCELLED: i32 = 3;

/// `orbitte_xfer_status.remote_effect`: no remote byte changed.
pub const ORBITTE_EFFECT_NONE: i32 = 0;
/// Remote bytes past the completed prefix may have changed.
pub const ORBITTE_EFFECT_POSSIBLE: i32 = 1;
/// Every byte was written.
pub const ORBITTE_EFFECT_COMPLETE: i32 = 2;

/// `orbitte_xfer_status.notification`: the post carried none.
pub const ORBITTE_NOTIF_NONE: i32 = 0;
/// Not sent yet: requests are still moving.
pub const ORBITTE_NOTIF_PENDING: i32 = 1;
/// Handed to the peer's path after every byte arrived.
pub const ORBITTE_NOTIF_SENT: i32 = 2;
/// Not sent, and it never will be (a request did not complete).
pub const ORBITTE_NOTIF_NOT_SENT: i32 = 3;
/// The peer refused it (its unread notifications are at a bound): the
/// peer's application must read its notifications; the transfer fails.
pub const ORBITTE_NOTIF_REFUSED: i32 = 4;
/// Sent, but the rail went down before the peer said whether it kept it.
pub const ORBITTE_NOTIF_UNCONFIRMED: i32 = 5;

/// Transfers on the local path of at least this many bytes are posted
/// for the rails' workers to copy, so `orbitte_xfer_post` returns at once;
/// smaller ones are copied by the posting call while the rail is idle.
const QUEUED_BYTES: u64 = 1 << 20;

/// Same-host copies of at least this many bytes are split into pieces
/// that the posting call, the engine's copy workers and the checking calls
/// claim in turn; smaller ones are copied whole by the posting call.
const CMA_QUEUED_BYTES: u64 = 1 << 20;

/// The most bytes the posting call copies of a transfer split into
/// pieces (the workers copy beside it); the rest is left to the workers
/// and to the checks. It bounds the time `orbitte_xfer_post` takes (a few
/// milliseconds) whatever the transfer's size.
const CMA_POST_BYTES: u64 = 32 << 20;

/// How long releasing a transfer in flight waits for its cancelled
/// requests and their drain.
const ABANDON_WAIT: Duration = Duration::from_secs(5);

/// One descriptor of a transfer: `len` bytes at `local_addr` (in memory
/// this engine registered) and at `remote_addr` (in memory the peer
/// published).
#[repr(C)]
#[derive(Debug, Clone, Copy)]

pub struct orbitte_desc {
    /// Address in this process.
    pub local_addr: u64,
    /// Address in the peer's process.
    pub remote_addr: u64,
    /// Bytes (at least 1).
    pub len: u64,
}

/// What `orbitte_xfer_check` reports of the last post.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]

pub struct orbitte_xfer_status {
    /// `ORBITTE_OK` (every byte placed and drained, the notification sent
    /// if one was attached), `ORBITTE_IN_PROGRESS`, or the failure's code.
    pub state: i32,
    /// `ORBITTE_NOTIF_*`.
    pub notification: i32,
    /// Engine requests the transfer is made of (runs of descriptors
    /// adjacent on both sides are merged into one).
    pub requests: u64,
    /// Requests whose outcome arrived.
    pub outcomes: u64,
    /// Bytes of the transfer.
    pub bytes: u64,
    /// Bytes known done: the completed prefixes of the outcomes arrived.
    pub completed_bytes: u64,
    /// The index of the first descriptor of the first request that did
    /// not complete (`UINT64_MAX` when none failed).
    pub failed_desc: u64,
    /// That request's completed prefix: its leading bytes known done.
    pub failed_prefix: u64,
    /// That request's end (`ORBITTE_REQ_*`).
    pub failed_status: i32,
    /// For a WRITE, what it may have done remotely (`ORBITTE_EFFECT_*`).
    pub remote_effect: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Ready,
    Posted,
    Done,
    Failed,
}

/// A transfer and its last post.
#[derive(Debug)]
pub(crate) struct Xfer {
    peer: orbitte_peer,
    requests: Vec<Request>,
    bytes: u64,
    posting: Posting,
    phase: Phase,
    ids: Vec<RequestId>,
    /// Outcomes taken so far (a prefix of `ids`).
    taken: usize,
    /// Complete requests whose local buffers are not drained yet.
    undrained: Vec<RequestId>,
    notified: bool,
    status: orbitte_xfer_status,
    /// Why it failed (the code is `status.state`).
    why: Option<String>,
    /// Same-host copies serve it (else the engine's requests).
    cma: Option<Arc<CmaPlan>>,
    /// The workers' copy of the last post, while it runs.
    run: Option<Arc<Run>>,
    /// The engine's count of unloads when the same-host plan was checked.
    checked_at: u64,
}

impl Drop for Xfer {
    fn drop(&mut self) {
        // The workers leave the pieces no one claimed yet.
        if let Some(run) = &self.run {
            run.cancel();
        }
    }
}

/// A transfer the kernel copies between this process and a same-host peer.
#[derive(Debug)]
struct CmaPlan {
    target: Arc<cma::Target>,
    op: Op,
    segs: Vec<Seg>,
}

/// The same-host plan of `descs` with `p`, when its process is open to
/// same-host copies, every local descriptor lies in registered host
/// memory and every remote one in host memory whose public data was
/// loaded; `plan` checked both against the registrations and ranges.
fn cma_plan(
    e: &Engine,
    handle: orbitte_peer,
    p: &PeerEntry,
    op: Op,
    descs: &[orbitte_desc],
) -> Option<CmaPlan> {
    let target = p.cma.as_ref().ok()?.clone();
    let regs = lock(&e.regs);
    let mut segs: Vec<Seg> = Vec::with_capacity(descs.len());
    for d in descs {
        let (reg, _) = regs.resolve(d.local_addr, d.len)?;
        if !matches!(reg.memory, Kept::Host(_)) || !loaded_host(e, handle, d.remote_addr, d.len) {
            return None;
        }
        match segs.last_mut() {
            Some(s) if s.local + s.len == d.local_addr && s.remote + s.len == d.remote_addr => {
                s.len += d.len;
            }
            _ => segs.push(Seg {
                local: d.local_addr,
                remote: d.remote_addr,
                len: d.len,
            }),
        }
    }
    Some(CmaPlan { target, op, segs })
}

/// Submits the one-byte READ of `p`'s anchor that carries `notif` to it,
/// after a same-host copy: the peer receives the notification through its
/// engine, once, after the bytes.
fn carry(e: &Engine, p: &PeerEntry, notif: &[u8]) -> Result<Vec<RequestId>, cma::CopyError> {
    let carrier = crate::notify::carrier(e, p);
    let options = SubmitOptions::new().notification(Notification::new(notif.to_vec()));
    e.engine
        .submit_with(&[carrier], options)
        .map_err(|err| cma::CopyError {
            code: if err.peer_gone() {
                ORBITTE_ERR_REMOTE_DISCONNECT
            } else {
                ORBITTE_ERR_BACKEND
            },
            why: format!("cannot send the notification to {:?}: {err}", p.source_id),
        })
}

fn op_of(op: i32) -> Result<Op, Failure> {
    match op {
        ORBITTE_OP_READ => Ok(Op::Read),
        ORBITTE_OP_WRITE => Ok(Op::Write),
        other => Err(Failure::invalid(format!(
            "operation {other}: use {} or {}",
            c_name!(ORBITTE_OP_READ),
            c_name!(ORBITTE_OP_WRITE)
        ))),
    }
}

/// The engine requests of `descs`: each resolved against this engine's
/// registrations and the ranges `peer` publishes, a run adjacent on both
/// sides merged into one request labelled with its first descriptor.
fn plan(
    e: &Engine,
    handle: orbitte_peer,
    op: Op,
    descs: &[orbitte_desc],
) -> Result<Vec<Request>, Failure> {
    let ranges = ranges_for(e, handle, descs.iter().map(|d| (d.remote_addr, d.len)))?;
    let peer = e.peer(handle)?;
    let regs = lock(&e.regs);
    let mut out: Vec<Request> = Vec::with_capacity(descs.len());
    let mut last_end: Option<(u64, u64)> = None;
    for (i, d) in descs.iter().enumerate() {
        if d.len == 0 {
            return Err(Failure::invalid(format!(
                "descriptor #{i} has length 0: every descriptor covers at least one byte"
            )));
        }
        let (reg, offset) = regs.resolve(d.local_addr, d.len).ok_or_else(|| {
            Failure::new(
                ORBITTE_ERR_NOT_FOUND,
                format!(
                    "descriptor #{i}: local {:#x}+{} is not inside memory this engine registered: register it first",
                    d.local_addr, d.len
                ),
            )
        })?;
        let range = holding(&ranges, d.remote_addr, d.len).ok_or_else(|| {
                Failure::new(
                    ORBITTE_ERR_NOT_FOUND,
                    format!(
                        "descriptor #{i}: remote {:#x}+{} is not inside memory {:?} published ({} range(s)): register it there with {}",
                        d.remote_addr,
                        d.len,
                        peer.source_id,
                        ranges.len(),
                        c_name!(ORBITTE_REG_REMOTE)
                    ),
                )
            })?;
        let remote_offset = d.remote_addr - range.address;
        if let (Some((lend, rend)), Some(req)) = (last_end, out.last_mut())
            && req.local == reg.id
            && lend == d.local_addr
            && rend == d.remote_addr
            && matches!(req.remote, RemoteTarget::Range { range: r, .. } if r == range)
        {
            req.len += d.len;
        } else {
            out.push(Request {
                op,
                local: reg.id,
                local_offset: offset,
                len: d.len,
                remote: RemoteTarget::Range {
                    range,
                    offset: remote_offset,
                },
                label: i as u64,
            });
        }
        last_end = Some((d.local_addr + d.len, d.remote_addr + d.len));
    }
    Ok(out)
}

/// Prepares a transfer of `count` descriptors at `descs` with `peer`
/// (NIXL's `prepXfer`): `op` is `ORBITTE_OP_READ` or `ORBITTE_OP_WRITE`.
/// Every local address must lie in one registration of this engine,
/// every remote one in one range the peer published. On success `*out`
/// is the transfer, ready to post (and post again once it ended).
///
/// # Safety
/// `descs` points at `count` readable `orbitte_desc`; `out` at a writable
/// `orbitte_xfer`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_xfer_prepare(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
    op: i32,
    descs: *const orbitte_desc,
    count: usize,
    out: *mut orbitte_xfer,
) -> i32 {
    guard("orbitte_xfer_prepare", || {
        let e = handle::engine(engine)?;
        e.peer(peer)?;
        let op = op_of(op)?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller's contract for `descs` and `count`.
        let descs = unsafe { args::bytes(descs, count, "descs") }?;
        if descs.is_empty() {
            return Err(Failure::invalid(
                "`count` is 0: give at least one descriptor",
            ));
        }
        let requests = plan(&e, peer, op, descs)?;
        // After the plan: a reopen may have changed the peer's path.
        let p = e.peer(peer)?;
        let checked_at = e.unloads.load(std::sync::atomic::Ordering::Relaxed);
        let cma = cma_plan(&e, peer, &p, op, descs).map(Arc::new);
        let bytes = descs.iter().map(|d| d.len).sum();
        let xfer = Xfer {
            peer,
            bytes,
            posting: if p.path == PathKind::Local && bytes >= QUEUED_BYTES {
                Posting::Queued
            } else {
                Posting::Inline
            },
            status: orbitte_xfer_status {
                state: ORBITTE_ERR_NOT_POSTED,
                requests: requests.len() as u64,
                bytes,
                failed_desc: u64::MAX,
                ..Default::default()
            },
            requests,
            phase: Phase::Ready,
            ids: Vec::new(),
            taken: 0,
            undrained: Vec::new(),
            notified: false,
            why: None,
            cma,
            run: None,
            checked_at,
        };
        let h = e.mint();
        lock(&e.xfers).insert(h, Arc::new(std::sync::Mutex::new(xfer)));
        // SAFETY: the caller's contract for `out` (null checked).
        unsafe { put(out, h, "out") }?;
        Ok(ORBITTE_OK)
    })
}

fn effect(e: &RemoteEffect) -> i32 {
    match e {
        RemoteEffect::None => ORBITTE_EFFECT_NONE,
        RemoteEffect::Possible { .. } => ORBITTE_EFFECT_POSSIBLE,
        RemoteEffect::Complete => ORBITTE_EFFECT_COMPLETE,
    }
}

fn req_status(s: Status) -> i32 {
    match s {
        Status::Complete => ORBITTE_REQ_COMPLETE,
        Status::Failed => ORBITTE_REQ_FAILED,
        Status::TimedOut => ORBITTE_REQ_TIMED_OUT,
        Status::Cancelled => ORBITTE_REQ_CANCELLED,
    }
}

impl Xfer {
    /// Marks the transfer failed; the first failure's code and reason stay.
    fn fail(&mut self, code: i32, why: String) {
        if self.phase != Phase::Failed {
            self.phase = Phase::Failed;
            self.status.state = code;
            self.why = Some(why);
        }
    }

    fn record(&mut self, o: &Outcome) {
        self.status.outcomes += 1;
        if self.cma.is_none() {
            // A same-host copy's outcome is its notification's carrier.
            self.status.completed_bytes += o.completed_prefix;
        }
        if !o.is_complete() && self.status.failed_desc == u64::MAX {
            self.status.failed_desc = o.label;
            self.status.failed_prefix = o.completed_prefix;
            self.status.failed_status = req_status(o.status);
            self.status.remote_effect = effect(&o.remote_effect);
            let cause = o
                .failure
                .as_ref()
                .map_or_else(|| format!("{:?}", o.status), |f| f.to_string());
            // A lost connection (the peer exited, its session broke) is the
            // peer's disconnect; anything else the engine's failure.
            let code = if o
                .failure
                .as_deref()
                .is_some_and(|f| f.status.connection_lost())
            {
                ORBITTE_ERR_REMOTE_DISCONNECT
            } else {
                ORBITTE_ERR_BACKEND
            };
            self.fail(
                code,
                format!(
                    "the request starting at descriptor #{} ended {:?} after {} of {} bytes: {cause}",
                    o.label, o.status, o.completed_prefix, o.len
                ),
            );
        }
        if self.notified {
            self.status.notification = match &o.notification {
                NotificationStatus::Sent => ORBITTE_NOTIF_SENT,
                NotificationStatus::NotSent { why } => {
                    self.fail(
                        ORBITTE_ERR_BACKEND,
                        format!("the notification was not sent: {why}"),
                    );
                    ORBITTE_NOTIF_NOT_SENT
                }
                NotificationStatus::Refused { why } => {
                    self.fail(
                        ORBITTE_ERR_BACKEND,
                        format!("the peer refused the notification: {why}"),
                    );
                    ORBITTE_NOTIF_REFUSED
                }
                NotificationStatus::Unconfirmed { why } => {
                    self.fail(
                        ORBITTE_ERR_REMOTE_DISCONNECT,
                        format!("the notification may not have arrived: {why}"),
                    );
                    ORBITTE_NOTIF_UNCONFIRMED
                }
                NotificationStatus::NotRequested => ORBITTE_NOTIF_PENDING,
            };
        }
        if o.drain != DrainStatus::Drained {
            self.undrained.push(o.request);
        }
    }

    /// Takes the end of the workers' copy, when it ended (or waits for it
    /// with `wait`): the carrier of the notification becomes the request
    /// to follow, or the copy's failure the transfer's.
    fn settle_run(&mut self, wait: bool) {
        let Some(run) = &self.run else {
            return;
        };
        if wait {
            run.wait();
        }
        let state = std::mem::replace(&mut *lock(&run.state), RunState::Running);
        match state {
            RunState::Running => return,
            RunState::Copied(ids) => {
                self.status.completed_bytes = self.bytes;
                self.ids = ids;
            }
            RunState::Failed(err) => self.fail(err.code, err.why),
        }
        self.run = None;
    }

    /// Takes the outcomes that arrived, in order, without waiting, and
    /// settles the phase.
    fn advance(&mut self, e: &Engine) {
        self.settle_run(false);
        if self.run.is_some() {
            return;
        }
        let mut outcomes = Vec::new();
        while self.phase == Phase::Posted && self.taken < self.ids.len() {
            match e
                .engine
                .wait_ready(&self.ids[self.taken..], Duration::ZERO, &mut outcomes)
            {
                Ok(n) => self.taken += n,
                Err(WaitError::TimedOut(_)) => break,
                Err(err) => self.fail(ORBITTE_ERR_BACKEND, err.to_string()),
            }
        }
        for o in &outcomes {
            self.record(o);
        }
        if self.phase == Phase::Failed {
            self.abandon(e);
            return;
        }
        if self.taken == self.ids.len() {
            self.undrained
                .retain(|id| e.engine.drain_status(*id) != DrainStatus::Drained);
            if self.undrained.is_empty() {
                self.phase = Phase::Done;
                self.status.state = ORBITTE_OK;
            }
        }
    }

    /// Cancels what is still outstanding and takes its outcomes and drain,
    /// so the engine keeps nothing of this transfer.
    fn abandon(&mut self, e: &Engine) {
        // Pieces not claimed yet are not copied; a copy under way cannot
        // be stopped: it ends soon, then its carrier is cancelled with the
        // rest.
        if let Some(run) = &self.run {
            run.cancel();
        }
        self.settle_run(true);
        let open = self.ids[self.taken..].to_vec();
        for &id in &open {
            e.engine.cancel(id);
        }
        for &id in &open {
            // Counted like the others: a request may have completed (or
            // moved a prefix) before the cancel reached it.
            if let Ok(o) = e.engine.wait(id, ABANDON_WAIT) {
                self.record(&o);
            }
        }
        self.undrained.extend_from_slice(&open);
        self.taken = self.ids.len();
        for &id in &self.undrained {
            let _ = e.engine.wait_drain(id, ABANDON_WAIT);
        }
        self.undrained.clear();
    }

    fn post(&mut self, e: &Arc<Engine>, notif: &[u8]) -> Result<i32, Failure> {
        if self.phase == Phase::Posted {
            self.advance(e);
            if self.phase == Phase::Posted {
                return Err(Failure::new(
                    ORBITTE_ERR_REPOST_ACTIVE,
                    "the transfer is still in flight: wait until orbitte_xfer_check says it ended",
                ));
            }
        }
        if notif.len() > MAX_NOTIFICATION_LEN {
            return Err(Failure::invalid(format!(
                "the notification has {} bytes; at most {MAX_NOTIFICATION_LEN} travel with a transfer",
                notif.len()
            )));
        }
        let p = e.peer(self.peer).map_err(|_| {
            Failure::new(
                ORBITTE_ERR_REMOTE_DISCONNECT,
                "the transfer's peer was disconnected: connect again and prepare a new transfer",
            )
        })?;
        self.phase = Phase::Posted;
        self.ids.clear();
        self.taken = 0;
        self.undrained.clear();
        self.notified = !notif.is_empty();
        self.why = None;
        self.status = orbitte_xfer_status {
            state: ORBITTE_IN_PROGRESS,
            notification: if self.notified {
                ORBITTE_NOTIF_PENDING
            } else {
                ORBITTE_NOTIF_NONE
            },
            requests: self.status.requests,
            bytes: self.bytes,
            failed_desc: u64::MAX,
            ..Default::default()
        };
        let unloads = e.unloads.load(std::sync::atomic::Ordering::Relaxed);
        if self.checked_at != unloads {
            // Remote memory was unloaded since: copy only what is still
            // loaded, else take the engine's paths (the peer checks them).
            self.checked_at = unloads;
            if let Some(plan) = &self.cma
                && !plan
                    .segs
                    .iter()
                    .all(|s| loaded_host(e, self.peer, s.remote, s.len))
            {
                self.cma = None;
            }
        }
        if let Some(plan) = self.cma.clone() {
            self.post_cma(e, &p, &plan, notif);
            return self.result();
        }
        let mut options = SubmitOptions::new().posting(self.posting);
        if !notif.is_empty() {
            options = options.notification(Notification::new(notif.to_vec()));
        }
        let submitted = e.engine.submit_with(&self.requests, options);
        match submitted {
            Ok(ids) => {
                self.ids = ids;
                self.advance(e);
                self.result()
            }
            Err(err) if err.peer_gone() => {
                self.fail(
                    ORBITTE_ERR_REMOTE_DISCONNECT,
                    format!("{:?} is gone: {err}", p.source_id),
                );
                self.result()
            }
            Err(err) => {
                self.phase = Phase::Ready;
                let code = match err {
                    SubmitError::Notification(NotificationError::TooLarge { .. }) => {
                        crate::status::ORBITTE_ERR_INVALID_PARAM
                    }
                    SubmitError::Invalid { .. } => ORBITTE_ERR_NOT_FOUND,
                    _ => ORBITTE_ERR_BACKEND,
                };
                Err(Failure::new(code, format!("{:?}: {err}", p.source_id)))
            }
        }
    }

    /// Copies the bytes of a same-host transfer (here when small; when
    /// large, in pieces: here up to `CMA_POST_BYTES`, on the workers, and
    /// in the checks), then sends its notification through the engine.
    fn post_cma(&mut self, e: &Arc<Engine>, p: &PeerEntry, plan: &Arc<CmaPlan>, notif: &[u8]) {
        e.cma
            .transfers
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.bytes < CMA_QUEUED_BYTES {
            let copied = cma::copy(&plan.target, plan.op, &plan.segs).and_then(|calls| {
                e.cma.count(plan.op, self.bytes, calls);
                if notif.is_empty() {
                    Ok(Vec::new())
                } else {
                    carry(e, p, notif)
                }
            });
            match copied {
                Ok(ids) => {
                    self.status.completed_bytes = self.bytes;
                    self.ids = ids;
                    self.advance(e);
                }
                Err(err) => self.fail(err.code, err.why),
            }
            return;
        }
        let pieces = cma::split(&plan.segs, cma::pieces(self.bytes));
        let copy: cma::CopyPiece = {
            let (e, plan) = (e.clone(), plan.clone());
            Box::new(move |piece: &[Seg]| {
                let bytes = piece.iter().map(|s| s.len).sum();
                cma::copy(&plan.target, plan.op, piece).map(|calls| {
                    e.cma.count(plan.op, bytes, calls);
                })
            })
        };
        let finish: cma::Finish = {
            let (e, p) = (e.clone(), p.clone());
            let notif = notif.to_vec();
            Box::new(move |err| match err {
                Some(err) => RunState::Failed(err),
                None if notif.is_empty() => RunState::Copied(Vec::new()),
                None => match carry(&e, &p, &notif) {
                    Ok(ids) => RunState::Copied(ids),
                    Err(err) => RunState::Failed(err),
                },
            })
        };
        let run = Run::new(pieces, copy, finish);
        self.run = Some(run.clone());
        // This call takes the first piece: helpers for the others.
        let helpers = run.len().saturating_sub(1).min(cma::Workers::count());
        for _ in 0..helpers {
            let run2 = run.clone();
            let job = Box::new(move || while run2.step().is_some() {});
            if let Err(f) = e.workers.run(job) {
                // The pieces are still claimed and ended, by this call and
                // the checks; the transfer fails.
                run.fail(cma::CopyError {
                    code: f.code,
                    why: f.message,
                });
                break;
            }
        }
        let mut copied = 0u64;
        while copied < CMA_POST_BYTES {
            match run.step() {
                Some(b) => copied += b,
                None => break,
            }
        }
        self.advance(e);
    }

    /// The code of the current phase (a failure's with its message).
    fn result(&self) -> Result<i32, Failure> {
        match self.phase {
            Phase::Ready => Err(Failure::new(
                ORBITTE_ERR_NOT_POSTED,
                "the transfer was never posted: call orbitte_xfer_post first",
            )),
            Phase::Posted => Ok(ORBITTE_IN_PROGRESS),
            Phase::Done => Ok(ORBITTE_OK),
            Phase::Failed => Err(Failure::new(
                self.status.state,
                self.why
                    .clone()
                    .unwrap_or_else(|| "the transfer failed".to_owned()),
            )),
        }
    }
}

/// Posts a prepared transfer (NIXL's `postXfer`), with the `notif_len`
/// bytes at `notif` as its notification (none when `notif_len` is 0; at
/// most `ORBITTE_MAX_NOTIF_LEN`). The peer receives the notification once,
/// after every byte of the transfer arrived, and never when a request did
/// not complete. Returns `ORBITTE_IN_PROGRESS`, `ORBITTE_OK` when it
/// already ended, or a failure's code. Posting again is allowed once it
/// ended.
///
/// # Safety
/// `notif` points at `notif_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_xfer_post(
    engine: *const orbitte_engine,
    xfer: orbitte_xfer,
    notif: *const u8,
    notif_len: usize,
) -> i32 {
    guard("orbitte_xfer_post", || {
        let e = handle::engine(engine)?;
        let x = e.xfer(xfer)?;
        // SAFETY: the caller's contract for `notif` and `notif_len`.
        let notif = unsafe { args::bytes(notif, notif_len, "notif") }?;
        let mut x = lock(&x);
        x.post(&e, notif)
    })
}

/// Checks a posted transfer without waiting on the network (NIXL's
/// `checkXfer`): `ORBITTE_OK` when every byte was placed, the local
/// buffers drained and the notification (if any) sent;
/// `ORBITTE_IN_PROGRESS` while it moves; a failure's code otherwise
/// (`ORBITTE_ERR_BACKEND` for a request that did not complete,
/// `ORBITTE_ERR_REMOTE_DISCONNECT` for a peer gone), with
/// `orbitte_last_error` saying why. A non-null `status` receives the
/// details.
///
/// # Safety
/// A non-null `status` points at a writable `orbitte_xfer_status`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_xfer_check(
    engine: *const orbitte_engine,
    xfer: orbitte_xfer,
    status: *mut orbitte_xfer_status,
) -> i32 {
    guard("orbitte_xfer_check", || {
        let e = handle::engine(engine)?;
        let x = e.xfer(xfer)?;
        let mut x = lock(&x);
        if x.phase == Phase::Posted {
            if let Some(run) = &x.run {
                // A piece no worker claimed yet is copied here.
                run.step();
            }
            x.advance(&e);
        }
        if !status.is_null() {
            // SAFETY: the caller's contract for a non-null `status`.
            unsafe { put(status, x.status, "status") }?;
        }
        let r = x.result();
        if x.phase == Phase::Posted {
            // A caller polling in a loop leaves the engine's lock to the
            // threads that finish the transfer.
            std::thread::yield_now();
        }
        r
    })
}

/// Releases a transfer (NIXL's `releaseReqH`); one in flight is cancelled
/// first, and its buffers drained. The handle is invalid afterwards.
///
/// # Safety
/// None beyond passing values this API returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_xfer_release(
    engine: *const orbitte_engine,
    xfer: orbitte_xfer,
) -> i32 {
    guard("orbitte_xfer_release", || {
        let e = handle::engine(engine)?;
        let x = lock(&e.xfers)
            .remove(&xfer)
            .ok_or_else(|| Failure::bad_handle("transfer", xfer))?;
        let mut x = lock(&x);
        if x.phase == Phase::Posted {
            x.advance(&e);
            if x.phase == Phase::Posted {
                x.abandon(&e);
            }
        }
        Ok(ORBITTE_OK)
    })
}
