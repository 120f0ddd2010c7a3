//! The native side of `orbitte.nixl`, NIXL's agent API over the engine:
//! what must not cost Python work per descriptor.
//!
//! - [`PreparedList`]: a descriptor list resolved once, when
//!   `prep_xfer_dlist` is called: each local descriptor to (registration,
//!   offset, length), each remote one to (published range, offset,
//!   length) of the peer it names. Descriptors come in as packed
//!   little-endian u64 triples (address, length, device id).
//! - [`Xfer`]: a transfer request built from two prepared lists and two
//!   index sequences (`make_prepped_xfer`) or from two whole lists
//!   (`initialize_xfer`): the engine requests are made here, once, with
//!   runs of descriptors adjacent on both sides merged into one request;
//!   `post` submits them in one call with the notification attached (on
//!   the local path, whose copies run while they are posted, a transfer
//!   of 1 MiB or more is posted by a thread of its own, so `post` returns
//!   at once), and `state` takes the outcomes that arrived (one hold of
//!   the engine's lock per run) and reports NIXL's "DONE", "PROC" or
//!   "ERR".
//! - NIXL's exception classes (`nixlNotFoundError`, ...), all under
//!   `orbitte.nixl.nixlError`, itself an `orbitte.Error`.
//!
//! Index sequences come as packed little-endian integers of 4 or 8 bytes
//! (what `numpy.ndarray.tobytes()` gives: no per-item Python work) or as
//! a Python sequence of ints, converted once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orbitte::{
    DrainStatus, MAX_NOTIFICATION_LEN, NotificationError, NotificationStatus, Op, PathKind,
    Posting, RegistrationId, RemoteRange, RemoteTarget, Request, RequestId, SubmitError,
    SubmitOptions, WaitError,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::NativeEngine;
use crate::handles::Peer;
use crate::node::{Local, Node, lock, secs};
use crate::outcome::PyOutcome;

/// NIXL's exception classes (the names NIXL's Python bindings raise).
#[allow(non_camel_case_types)]
mod kinds {
    use pyo3::create_exception;

    create_exception!(
        orbitte.nixl,
        nixlError,
        crate::errors::Error,
        "Base class of the NIXL agent API's errors (orbitte.nixl)."
    );
    create_exception!(
        orbitte.nixl,
        nixlInvalidParamError,
        nixlError,
        "An argument was refused: wrong descriptor width, unknown memory type or operation, index out of range, released handle."
    );
    create_exception!(
        orbitte.nixl,
        nixlNotFoundError,
        nixlError,
        "A name or range is unknown: an agent not added, memory not registered here or by the remote agent."
    );
    create_exception!(
        orbitte.nixl,
        nixlNotSupportedError,
        nixlError,
        "What NIXL offers and this build does not (storage backends, GPU-side device API, telemetry)."
    );
    create_exception!(
        orbitte.nixl,
        nixlBackendError,
        nixlError,
        "The engine failed underneath (registration refused, peer unreachable)."
    );
    create_exception!(
        orbitte.nixl,
        nixlMismatchError,
        nixlError,
        "Metadata that does not match the agent it came from (name, epoch, format version)."
    );
    create_exception!(
        orbitte.nixl,
        nixlNotAllowedError,
        nixlError,
        "A call the handle's state does not allow."
    );
    create_exception!(
        orbitte.nixl,
        nixlNotPostedError,
        nixlError,
        "The transfer handle was never posted."
    );
    create_exception!(
        orbitte.nixl,
        nixlRepostActiveError,
        nixlError,
        "The transfer handle is still in flight: wait for DONE or ERR before posting it again."
    );
    create_exception!(
        orbitte.nixl,
        nixlCancelledError,
        nixlError,
        "The transfer was cancelled."
    );
    create_exception!(
        orbitte.nixl,
        nixlRemoteDisconnectError,
        nixlError,
        "The remote agent went away."
    );
    create_exception!(
        orbitte.nixl,
        nixlNoTelemetryError,
        nixlError,
        "No telemetry: this build does not capture it."
    );
    create_exception!(
        orbitte.nixl,
        nixlUnknownError,
        nixlError,
        "An error without a better class."
    );
}

use kinds::{
    nixlInvalidParamError as InvalidParam, nixlNotFoundError as NotFound,
    nixlNotPostedError as NotPosted, nixlRemoteDisconnectError as RemoteDisconnect,
    nixlRepostActiveError as RepostActive,
};

/// Adds the native NIXL classes and exceptions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PreparedList>()?;
    m.add_class::<Xfer>()?;
    macro_rules! add {
        ($($name:ident),*) => {
            $(m.add(stringify!($name), py.get_type::<kinds::$name>())?;)*
        };
    }
    add!(
        nixlError,
        nixlInvalidParamError,
        nixlNotFoundError,
        nixlNotSupportedError,
        nixlBackendError,
        nixlMismatchError,
        nixlNotAllowedError,
        nixlNotPostedError,
        nixlRepostActiveError,
        nixlCancelledError,
        nixlRemoteDisconnectError,
        nixlNoTelemetryError,
        nixlUnknownError
    );
    Ok(())
}

/// One descriptor as it came in: (address, length, device id).
type Desc = (u64, u64, u64);

/// Packed little-endian u64 triples as descriptors.
fn descs(packed: &[u8]) -> PyResult<Vec<Desc>> {
    if !packed.len().is_multiple_of(24) {
        return Err(InvalidParam::new_err(format!(
            "{} bytes are not whole (address, length, device) u64 triples",
            packed.len()
        )));
    }
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    Ok(packed
        .chunks_exact(24)
        .map(|c| (word(&c[..8]), word(&c[8..16]), word(&c[16..])))
        .collect())
}

/// A local descriptor, resolved.
#[derive(Debug, Clone, Copy)]
struct LocalEntry {
    reg: RegistrationId,
    offset: u64,
    len: u64,
}

/// A remote descriptor, resolved against the peer's publications: the
/// range by its index in the list's range table (entries stay small, so a
/// transfer by random indices touches little memory).
#[derive(Debug, Clone, Copy)]
struct RemoteEntry {
    range: u32,
    offset: u64,
    len: u64,
}

#[derive(Debug)]
enum Side {
    Local(Vec<LocalEntry>),
    Remote {
        /// Keeps the session the ranges were published on.
        peer: Py<Peer>,
        agent: String,
        /// The peer's published ranges, by address.
        ranges: Vec<RemoteRange>,
        entries: Vec<RemoteEntry>,
    },
}

/// A descriptor list resolved once (`prep_xfer_dlist`): local
/// descriptors to registrations of this engine, remote ones to the
/// ranges a peer published. Transfers by index read it, never the
/// descriptors again.
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct PreparedList {
    owner: Arc<Local>,
    side: Side,
    released: AtomicBool,
    /// Request buffers of dropped transfers made from this (local) list,
    /// reused by the next ones: memory already mapped, no page faults.
    spare: Spare,
}

/// Spare request buffers (at most [`SPARE_BUFFERS`]).
type Spare = Arc<Mutex<Vec<Vec<Request>>>>;
const SPARE_BUFFERS: usize = 4;

/// An empty request buffer for `count` requests, a spare one if any.
fn buffer(spare: &Spare, count: usize) -> Vec<Request> {
    let mut v = lock(spare).pop().unwrap_or_default();
    v.reserve(count);
    v
}

impl PreparedList {
    fn len(&self) -> usize {
        match &self.side {
            Side::Local(e) => e.len(),
            Side::Remote { entries, .. } => entries.len(),
        }
    }

    fn check_live(&self, what: &str) -> PyResult<()> {
        if self.released.load(Ordering::Acquire) {
            return Err(InvalidParam::new_err(format!(
                "the {what} prepared list was released (release_dlist_handle): prepare it again with prep_xfer_dlist"
            )));
        }
        Ok(())
    }
}

fn zero_length(index: usize, addr: u64) -> PyErr {
    InvalidParam::new_err(format!(
        "descriptor #{index} at {addr:#x} has length 0: every descriptor must cover at least one byte"
    ))
}

#[pymethods]
impl PreparedList {
    /// Resolves local descriptors (packed u64 triples) against the
    /// engine's registrations.
    #[staticmethod]
    fn local(py: Python<'_>, engine: &NativeEngine, packed: &[u8]) -> PyResult<Self> {
        let list = descs(packed)?;
        let owner = engine.local().clone();
        let entries = py.detach(|| {
            let regs = owner.regs();
            list.iter()
                .enumerate()
                .map(|(i, &(addr, len, _))| {
                    if len == 0 {
                        return Err(zero_length(i, addr));
                    }
                    let (r, offset) = regs
                        .resolve(addr, len)
                        .map_err(|m| NotFound::new_err(format!("local descriptor #{i}: {m}")))?;
                    Ok(LocalEntry {
                        reg: r.id,
                        offset,
                        len,
                    })
                })
                .collect::<PyResult<Vec<_>>>()
        })?;
        Ok(Self {
            owner,
            side: Side::Local(entries),
            released: AtomicBool::new(false),
            spare: Spare::default(),
        })
    }

    /// Resolves descriptors of the remote agent `agent` (packed u64
    /// triples of its addresses) against the ranges `peer` published.
    #[staticmethod]
    fn remote(
        py: Python<'_>,
        engine: &NativeEngine,
        peer: Bound<'_, Peer>,
        agent: String,
        packed: &[u8],
    ) -> PyResult<Self> {
        let list = descs(packed)?;
        let mut ranges = peer.get().peer.ranges().to_vec();
        ranges.sort_unstable_by_key(|r| r.address);
        let entries = py.detach(|| {
            list.iter()
                .enumerate()
                .map(|(i, &(addr, len, _))| {
                    if len == 0 {
                        return Err(zero_length(i, addr));
                    }
                    let at = ranges.partition_point(|r| r.address <= addr);
                    let hit = at.checked_sub(1).filter(|&k| {
                        let r = &ranges[k];
                        addr - r.address < r.len && len <= r.len - (addr - r.address)
                    });
                    let (k, range) = hit.and_then(|k| Some((u32::try_from(k).ok()?, ranges[k]))).ok_or_else(|| {
                        NotFound::new_err(format!(
                            "remote descriptor #{i} {addr:#x}+{len} is not inside memory agent {agent:?} registered ({} range(s) published): register it there and add its metadata again",
                            ranges.len()
                        ))
                    })?;
                    Ok(RemoteEntry {
                        range: k,
                        offset: addr - range.address,
                        len,
                    })
                })
                .collect::<PyResult<Vec<_>>>()
        })?;
        Ok(Self {
            owner: engine.local().clone(),
            side: Side::Remote {
                peer: peer.unbind(),
                agent,
                ranges,
                entries,
            },
            released: AtomicBool::new(false),
            spare: Spare::default(),
        })
    }

    /// The remote agent's name, or None for a local list.
    #[getter]
    fn agent(&self) -> Option<&str> {
        match &self.side {
            Side::Local(_) => None,
            Side::Remote { agent, .. } => Some(agent),
        }
    }

    /// The peer handle a remote list was resolved against.
    #[getter]
    fn peer(&self, py: Python<'_>) -> Option<Py<Peer>> {
        match &self.side {
            Side::Local(_) => None,
            Side::Remote { peer, .. } => Some(peer.clone_ref(py)),
        }
    }

    #[getter]
    fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Marks the list released: transfers made from it later are refused
    /// (transfers made before keep their resolved requests).
    fn release(&self) {
        self.released.store(true, Ordering::Release);
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    fn __repr__(&self) -> String {
        match &self.side {
            Side::Local(e) => format!("<orbitte PreparedList local, {} descriptors>", e.len()),
            Side::Remote { agent, entries, .. } => format!(
                "<orbitte PreparedList of agent {agent:?}, {} descriptors>",
                entries.len()
            ),
        }
    }
}

/// An index sequence: packed little-endian ints of `width` bytes, or a
/// Python sequence of ints.
fn indices(obj: &Bound<'_, PyAny>, width: usize, side: &str) -> PyResult<Vec<i64>> {
    let Ok(b) = obj.cast::<PyBytes>() else {
        return obj.extract::<Vec<i64>>().map_err(|_| {
            InvalidParam::new_err(format!(
                "{side} indices must be a sequence of ints or an integer numpy array"
            ))
        });
    };
    let raw = b.as_bytes();
    if !matches!(width, 4 | 8) || !raw.len().is_multiple_of(width) {
        return Err(InvalidParam::new_err(format!(
            "{side} indices: {} bytes are not whole {width}-byte integers",
            raw.len()
        )));
    }
    Ok(raw
        .chunks_exact(width)
        .map(|c| {
            if width == 4 {
                let mut w = [0u8; 4];
                w.copy_from_slice(c);
                i64::from(i32::from_le_bytes(w))
            } else {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                i64::from_le_bytes(w)
            }
        })
        .collect())
}

fn pick<T: Copy>(entries: &[T], index: i64, at: usize, side: &str) -> PyResult<T> {
    usize::try_from(index)
        .ok()
        .and_then(|i| entries.get(i).copied())
        .ok_or_else(|| {
            InvalidParam::new_err(format!(
                "{side} index out of range at position {at}: {index} (the prepared list has {} descriptors)",
                entries.len()
            ))
        })
}

/// The engine requests of a transfer: descriptor `local[i]` with
/// `remote[i]` for each position, a run adjacent on both sides (same
/// registration and range, each descriptor starting where the last one
/// ended) merged into one request labelled with its first position.
fn plan(
    op: Op,
    ranges: &[RemoteRange],
    mut out: Vec<Request>,
    pairs: impl Iterator<Item = PyResult<(usize, LocalEntry, RemoteEntry)>>,
) -> PyResult<Vec<Request>> {
    let mut last: Option<(LocalEntry, RemoteEntry)> = None;
    for pair in pairs {
        let (at, l, r) = pair?;
        if l.len != r.len {
            return Err(InvalidParam::new_err(format!(
                "length mismatch at position {at}: local descriptor of {} bytes, remote of {}",
                l.len, r.len
            )));
        }
        if let (Some((pl, pr)), Some(req)) = (last, out.last_mut())
            && pl.reg == l.reg
            && pl.offset + pl.len == l.offset
            && pr.range == r.range
            && pr.offset + pr.len == r.offset
        {
            req.len += l.len;
            last = Some((l, r));
            continue;
        }
        out.push(Request {
            op,
            local: l.reg,
            local_offset: l.offset,
            len: l.len,
            remote: RemoteTarget::Range {
                range: ranges[r.range as usize],
                offset: r.offset,
            },
            label: at as u64,
        });
        last = Some((l, r));
    }
    Ok(out)
}

/// Where a transfer request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Ready,
    Posted,
    Done,
    Failed,
    Released,
}

#[derive(Debug)]
struct Run {
    phase: Phase,
    ids: Vec<RequestId>,
    /// Outcomes taken so far (a prefix of `ids`).
    taken: usize,
    /// Requests complete but not drained yet.
    undrained: Vec<RequestId>,
    /// Whether the posted batch carried a notification.
    notified: bool,
    /// A notification that could not ride the batch (it moves CUDA memory
    /// through host staging): once every request is done, it is sent on
    /// this one-byte READ of the remote agent's notification anchor.
    carry: Option<(Vec<u8>, Request)>,
    why: Option<String>,
    /// When the last post began, how long submitting took, and when its
    /// end (DONE or ERR) was seen: the transfer's telemetry.
    posted_at: Option<(Instant, SystemTime)>,
    post_took: Duration,
    ended_at: Option<Instant>,
}

impl Run {
    fn ready() -> Self {
        Self {
            phase: Phase::Ready,
            ids: Vec::new(),
            taken: 0,
            undrained: Vec::new(),
            notified: false,
            carry: None,
            why: None,
            posted_at: None,
            post_took: Duration::ZERO,
            ended_at: None,
        }
    }

    fn end(&mut self, phase: Phase) {
        self.phase = phase;
        self.ended_at.get_or_insert_with(Instant::now);
    }
}

/// A transfer request (`make_prepped_xfer`, `initialize_xfer`): its
/// engine requests built once; `post` submits them, `state` says
/// "DONE" (every byte placed and drained, and the notification sent if
/// one was attached), "PROC" or "ERR" (`error` says why).
#[pyclass(module = "orbitte._orbitte", frozen)]
#[derive(Debug)]
pub(crate) struct Xfer {
    core: Arc<Core>,
}

impl std::ops::Deref for Xfer {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

/// The transfers of an engine whose notification waits to be carried
/// after them (they move CUDA memory, see `Run::carry`): one thread per
/// engine, started with the first, moves each on as its requests end, so
/// the notification goes once every byte moved whether or not the caller
/// polls `check_xfer_state` (NIXL's progress thread does the same for its
/// backends). The thread ends with the engine.
#[derive(Debug, Default)]
pub(crate) struct Carriers {
    pending: Mutex<Vec<Weak<Core>>>,
    wake: Condvar,
    started: AtomicBool,
    /// The engine is gone: the thread ends.
    closed: AtomicBool,
}

/// How often the carrier thread looks at the transfers it watches.
const CARRIER_TICK: Duration = Duration::from_millis(1);

impl Carriers {
    /// Ends the thread (the engine is dropped).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _guard = lock(&self.pending);
        self.wake.notify_all();
    }

    /// Watches `core`, posted with a notification to carry.
    fn watch(self: &Arc<Self>, core: &Arc<Core>) {
        lock(&self.pending).push(Arc::downgrade(core));
        self.wake.notify_one();
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let carriers = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("orbitte-nixl-notify".into())
            .spawn(move || Self::run(&carriers));
        if spawned.is_err() {
            // The transfers still move on when their state is asked.
            self.started.store(false, Ordering::Release);
        }
    }

    fn run(carriers: &Weak<Self>) {
        loop {
            let Some(c) = carriers.upgrade() else {
                return;
            };
            let watched = {
                let mut pending = lock(&c.pending);
                // Woken by a new transfer, or by the engine's end.
                while pending.is_empty() && !c.closed.load(Ordering::Acquire) {
                    pending = c.wake.wait(pending).unwrap_or_else(PoisonError::into_inner);
                }
                if c.closed.load(Ordering::Acquire) {
                    return;
                }
                std::mem::take(&mut *pending)
            };
            let mut still = Vec::new();
            for w in watched {
                let Some(core) = w.upgrade() else { continue };
                let mut run = lock(&core.run);
                if run.phase == Phase::Posted && run.carry.is_some() {
                    core.advance(&mut run);
                }
                if run.phase == Phase::Posted && run.carry.is_some() {
                    still.push(w);
                }
            }
            if !still.is_empty() {
                lock(&c.pending).extend(still);
                std::thread::sleep(CARRIER_TICK);
            }
        }
    }
}

/// Transfers on the local path of at least this many bytes leave every
/// copy to the rails' workers ([`Posting::Queued`]): `transfer` returns
/// once they are posted. Smaller ones are copied by the posting call
/// itself while the rail is idle, which is faster than a hand-off.
const QUEUED_BYTES: u64 = 1 << 20;

/// What a transfer request holds.
#[derive(Debug)]
pub(crate) struct Core {
    node: Arc<Node>,
    requests: Vec<Request>,
    descriptors: usize,
    /// What telemetry's `descCount` says: the descriptors after merging,
    /// as NIXL counts them (prepared transfers merge, `initialize_xfer`
    /// does not).
    counted: usize,
    /// Bytes of all requests.
    bytes: u64,
    agent: String,
    notif: Option<Vec<u8>>,
    run: Mutex<Run>,
    /// How it is posted (see [`QUEUED_BYTES`]).
    posting: Posting,
    /// Where `requests` goes back to when this is dropped.
    spare: Spare,
}

impl Drop for Core {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.requests);
        v.clear();
        let mut spare = lock(&self.spare);
        if spare.len() < SPARE_BUFFERS {
            spare.push(v);
        }
    }
}

fn op_of(op: &str) -> PyResult<Op> {
    match op {
        "WRITE" => Ok(Op::Write),
        "READ" => Ok(Op::Read),
        other => Err(InvalidParam::new_err(format!(
            "operation {other:?}: use \"WRITE\" or \"READ\""
        ))),
    }
}

/// The two sides of a transfer, a local list and a remote list of the
/// same engine: their entries, the remote range table and agent.
type Sides<'a> = (
    &'a [LocalEntry],
    &'a [RemoteEntry],
    &'a [RemoteRange],
    &'a str,
);

fn sides<'a>(local: &'a PreparedList, remote: &'a PreparedList) -> PyResult<Sides<'a>> {
    local.check_live("local")?;
    remote.check_live("remote")?;
    let (
        Side::Local(l),
        Side::Remote {
            entries,
            agent,
            ranges,
            ..
        },
    ) = (&local.side, &remote.side)
    else {
        return Err(InvalidParam::new_err(
            "invalid sides: the local handle must come from prep_xfer_dlist(\"NIXL_INIT_AGENT\", ...) and the remote one from prep_xfer_dlist(remote_agent_name, ...)",
        ));
    };
    if !Arc::ptr_eq(&local.owner, &remote.owner) {
        return Err(InvalidParam::new_err(
            "the two prepared lists belong to different agents: prepare both on the agent that initiates the transfer",
        ));
    }
    Ok((l, entries, ranges, agent))
}

fn non_empty(requests: &[Request]) -> PyResult<()> {
    if requests.is_empty() {
        return Err(InvalidParam::new_err(
            "empty transfer: give at least one descriptor",
        ));
    }
    Ok(())
}

impl Xfer {
    fn new(
        (local, remote): (&PreparedList, &PreparedList),
        agent: &str,
        requests: Vec<Request>,
        (descriptors, merged): (usize, bool),
        notif: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        non_empty(&requests)?;
        let counted = if merged { requests.len() } else { descriptors };
        let bytes = requests.iter().map(|r| r.len).sum();
        let local_path = match &remote.side {
            Side::Remote { peer, .. } => peer.get().peer.path == PathKind::Local,
            Side::Local(_) => false,
        };
        Ok(Self {
            core: Arc::new(Core {
                spare: local.spare.clone(),
                node: local.owner.node.clone(),
                bytes,
                requests,
                descriptors,
                counted,
                agent: agent.to_owned(),
                notif: notif.filter(|n| !n.is_empty()),
                run: Mutex::new(Run::ready()),
                posting: if local_path && bytes >= QUEUED_BYTES {
                    Posting::Queued
                } else {
                    Posting::Inline
                },
            }),
        })
    }

    fn state_name(phase: Phase) -> &'static str {
        match phase {
            Phase::Done => "DONE",
            Phase::Failed => "ERR",
            _ => "PROC",
        }
    }

    fn released() -> PyErr {
        InvalidParam::new_err(
            "the transfer handle was released (release_xfer_handle): make a new one",
        )
    }
}

impl Core {
    fn submit(&self, notif: &Option<Vec<u8>>) -> Result<Vec<RequestId>, SubmitError> {
        let mut options = SubmitOptions::new().posting(self.posting);
        if let Some(n) = notif {
            options = options.notification(orbitte::Notification::new(n.clone()));
        }
        self.node.engine.submit_with(&self.requests, options)
    }

    /// Takes the outcomes that arrived, in order, and settles the phase.
    fn advance(&self, run: &mut Run) {
        let engine = &self.node.engine;
        let mut outcomes = Vec::new();
        while run.phase == Phase::Posted && run.taken < run.ids.len() {
            match engine.wait_ready(&run.ids[run.taken..], Duration::ZERO, &mut outcomes) {
                Ok(n) => run.taken += n,
                Err(WaitError::TimedOut(_)) => break,
                Err(e) => {
                    run.end(Phase::Failed);
                    run.why = Some(e.to_string());
                }
            }
        }
        for o in &outcomes {
            if !o.is_complete() {
                if run.why.is_none() {
                    run.why = Some(format!(
                        "request at position {}: {}",
                        o.label,
                        PyOutcome::from(o).summary()
                    ));
                }
                run.phase = Phase::Failed;
            } else if run.notified && !matches!(o.notification, NotificationStatus::Sent) {
                run.why.get_or_insert_with(|| {
                    let o = PyOutcome::from(o);
                    format!(
                        "every byte moved, but the notification was {}: {}",
                        o.notification.replace('_', " "),
                        o.notification_why.unwrap_or_default()
                    )
                });
                run.phase = Phase::Failed;
            }
            if o.drain != DrainStatus::Drained {
                run.undrained.push(o.request);
            }
        }
        if run.phase == Phase::Failed {
            run.end(Phase::Failed);
            self.abandon(run);
            return;
        }
        if run.taken == run.ids.len() {
            run.undrained
                .retain(|id| engine.drain_status(*id) != DrainStatus::Drained);
            if !run.undrained.is_empty() {
                return;
            }
            let Some((msg, carrier)) = run.carry.take() else {
                run.end(Phase::Done);
                return;
            };
            let note = SubmitOptions::new().notification(orbitte::Notification::new(msg));
            match engine.submit_with(&[carrier], note) {
                Ok(ids) => {
                    run.ids.extend(ids);
                    run.notified = true;
                    self.advance(run);
                }
                Err(e) => {
                    run.end(Phase::Failed);
                    run.why = Some(format!(
                        "every byte moved, but the notification could not be sent: {e}"
                    ));
                }
            }
        }
    }

    /// Cancels what is still outstanding and takes its outcomes, so the
    /// engine keeps nothing of this transfer.
    fn abandon(&self, run: &mut Run) {
        let engine = &self.node.engine;
        let open = &run.ids[run.taken..];
        for &id in open {
            engine.cancel(id);
        }
        for &id in open {
            let _ = engine.wait(id, Duration::from_secs(5));
        }
        // A cancelled request may still be copying its buffers (the local
        // path's worker finishes a copy it began): wait for that too.
        run.undrained.extend_from_slice(open);
        run.taken = run.ids.len();
        for &id in &run.undrained {
            let _ = engine.wait_drain(id, Duration::from_secs(5));
        }
        run.undrained.clear();
    }
}

#[pymethods]
impl Xfer {
    /// A transfer of `local[local_indices[i]]` with
    /// `remote[remote_indices[i]]` for each i; index sequences are packed
    /// ints of `width` bytes or sequences of ints.
    #[staticmethod]
    #[pyo3(signature = (op, local, local_indices, remote, remote_indices, width=8, notif=None))]
    #[allow(clippy::too_many_arguments)]
    fn prepped(
        py: Python<'_>,
        op: &str,
        local: &PreparedList,
        local_indices: &Bound<'_, PyAny>,
        remote: &PreparedList,
        remote_indices: &Bound<'_, PyAny>,
        width: usize,
        notif: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let op = op_of(op)?;
        let (l, r, ranges, agent) = sides(local, remote)?;
        let (li, ri) = (
            indices(local_indices, width, "local")?,
            indices(remote_indices, width, "remote")?,
        );
        if li.len() != ri.len() {
            return Err(InvalidParam::new_err(format!(
                "different number of indices for local ({}) and remote ({})",
                li.len(),
                ri.len()
            )));
        }
        let requests = py.detach(|| {
            plan(
                op,
                ranges,
                buffer(&local.spare, li.len()),
                li.iter().zip(&ri).enumerate().map(|(at, (&a, &b))| {
                    Ok((at, pick(l, a, at, "local")?, pick(r, b, at, "remote")?))
                }),
            )
        })?;
        Self::new((local, remote), agent, requests, (li.len(), true), notif)
    }

    /// A transfer of every descriptor of `local` with the one at the same
    /// position of `remote` (`initialize_xfer`).
    #[staticmethod]
    #[pyo3(signature = (op, local, remote, notif=None))]
    fn whole(
        py: Python<'_>,
        op: &str,
        local: &PreparedList,
        remote: &PreparedList,
        notif: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let op = op_of(op)?;
        let (l, r, ranges, agent) = sides(local, remote)?;
        if l.len() != r.len() {
            return Err(InvalidParam::new_err(format!(
                "different number of descriptors for local ({}) and remote ({})",
                l.len(),
                r.len()
            )));
        }
        let requests = py.detach(|| {
            plan(
                op,
                ranges,
                buffer(&local.spare, l.len()),
                l.iter()
                    .zip(r)
                    .enumerate()
                    .map(|(at, (&a, &b))| Ok((at, a, b))),
            )
        })?;
        Self::new((local, remote), agent, requests, (l.len(), false), notif)
    }

    /// Submits every request in one call, with the notification (this
    /// call's `notif`, else the one given at creation; empty: none); a
    /// large transfer on the local path leaves its copies to the rails'
    /// workers (see [`QUEUED_BYTES`]). Returns the state right after
    /// ("DONE" if it finished meanwhile). Refused while a previous post is
    /// in flight; a remote agent that is gone (its connection lost, or it
    /// restarted) raises `nixlRemoteDisconnectError`, as NIXL does, and
    /// the state is "ERR".
    ///
    /// `carrier`, a one-byte READ of the remote agent's notification
    /// anchor, carries the notification after the transfer when the
    /// transfer moves CUDA memory (staged through host memory, where a
    /// notification cannot ride the batch itself).
    #[pyo3(signature = (notif=None, carrier=None))]
    fn post(
        &self,
        py: Python<'_>,
        notif: Option<Vec<u8>>,
        carrier: Option<PyRef<'_, crate::handles::Request>>,
    ) -> PyResult<&'static str> {
        let carrier = carrier.map(|c| c.request);
        let notif = match notif {
            Some(n) if !n.is_empty() => Some(n),
            _ => self.notif.clone(),
        };
        if notif
            .as_ref()
            .is_some_and(|n| n.len() > MAX_NOTIFICATION_LEN)
        {
            return Err(InvalidParam::new_err(format!(
                "the notification has {} bytes; at most {MAX_NOTIFICATION_LEN} travel with a transfer",
                notif.as_ref().map_or(0, Vec::len)
            )));
        }
        py.detach(|| {
            let mut run = lock(&self.run);
            match run.phase {
                Phase::Released => return Err(Self::released()),
                Phase::Posted => {
                    self.advance(&mut run);
                    if run.phase == Phase::Posted {
                        return Err(RepostActive::new_err(
                            "the transfer is still in flight: wait for check_xfer_state to say DONE or ERR before posting it again",
                        ));
                    }
                }
                _ => {}
            }
            let started = (Instant::now(), SystemTime::now());
            let mut notif = notif;
            let mut carry = None;
            let submitted = match (self.submit(&notif), carrier) {
                (Err(SubmitError::Notification(NotificationError::Staged { .. })), Some(c)) => {
                    carry = notif.take().map(|n| (n, c));
                    self.submit(&None)
                }
                (r, _) => r,
            };
            *run = Run {
                phase: Phase::Posted,
                notified: notif.is_some(),
                carry,
                posted_at: Some(started),
                post_took: started.0.elapsed(),
                ..Run::ready()
            };
            match submitted {
                Ok(ids) => {
                    run.ids = ids;
                    self.advance(&mut run);
                    if run.phase == Phase::Posted && run.carry.is_some() {
                        self.node.carriers.watch(&self.core);
                    }
                    Ok(Self::state_name(run.phase))
                }
                Err(e) if e.peer_gone() => {
                    run.end(Phase::Failed);
                    let why = format!("agent {:?}: {e}", self.agent);
                    run.why = Some(why.clone());
                    Err(RemoteDisconnect::new_err(why))
                }
                Err(e @ SubmitError::Notification(_)) => {
                    run.phase = Phase::Ready;
                    Err(InvalidParam::new_err(e.to_string()))
                }
                Err(e) => {
                    run.phase = Phase::Ready;
                    Err(NotFound::new_err(format!("agent {:?}: {e}", self.agent)))
                }
            }
        })
    }

    /// "DONE", "PROC" or "ERR". Never waits on the network.
    fn state(&self, py: Python<'_>) -> PyResult<&'static str> {
        py.detach(|| {
            let mut run = lock(&self.run);
            match run.phase {
                Phase::Released => Err(Self::released()),
                Phase::Ready => Err(NotPosted::new_err(
                    "the transfer handle was never posted: call transfer(handle) first",
                )),
                Phase::Posted => {
                    self.advance(&mut run);
                    if run.phase == Phase::Posted {
                        // A caller polling in a loop leaves the core to the
                        // threads that finish the transfer.
                        std::thread::yield_now();
                    }
                    Ok(Self::state_name(run.phase))
                }
                p => Ok(Self::state_name(p)),
            }
        })
    }

    /// Releases the handle; one still in flight is cancelled first (its
    /// outcomes taken and its buffers drained). Later use is refused.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut run = lock(&self.run);
            if run.phase == Phase::Released {
                return Err(Self::released());
            }
            if run.phase == Phase::Posted {
                self.advance(&mut run);
                if run.phase == Phase::Posted {
                    self.abandon(&mut run);
                }
            }
            run.phase = Phase::Released;
            Ok(())
        })
    }

    /// The last post's telemetry, NIXL's fields: (start time in µs since
    /// the Unix epoch, µs the submit call took, µs from the start until
    /// DONE or ERR was seen (until now while in flight), bytes,
    /// descriptors after merging, as NIXL counts them). None before the
    /// first post.
    fn telemetry(&self) -> Option<(u64, u64, u64, u64, usize)> {
        let run = lock(&self.run);
        let (at, wall) = run.posted_at?;
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let start = wall.duration_since(UNIX_EPOCH).map_or(0, us);
        let took = run.ended_at.map_or_else(|| at.elapsed(), |end| end - at);
        Some((start, us(run.post_took), us(took), self.bytes, self.counted))
    }

    /// Why the last post ended in "ERR" (None otherwise).
    #[getter]
    fn error(&self) -> Option<String> {
        lock(&self.run).why.clone()
    }

    /// The remote agent's name.
    #[getter]
    fn agent(&self) -> &str {
        &self.agent
    }

    /// Whether it was made with a notification (`notif_msg`).
    #[getter]
    fn notifies(&self) -> bool {
        self.notif.is_some()
    }

    /// Descriptors in the transfer.
    #[getter]
    fn descriptors(&self) -> usize {
        self.descriptors
    }

    /// Engine requests it is submitted as (adjacent descriptors merged).
    #[getter]
    fn requests(&self) -> usize {
        self.requests.len()
    }

    /// Submits the same requests and waits for them and their drain, again
    /// and again for `seconds`, in a Rust loop with the GIL released: the
    /// engine's own rate for this batch, measured in the same process.
    /// Returns (batches done, seconds taken).
    fn repeat(&self, py: Python<'_>, seconds: f64) -> PyResult<(u64, f64)> {
        let span = secs(seconds, "seconds")?;
        py.detach(|| {
            let start = Instant::now();
            let mut done = 0u64;
            while start.elapsed() < span {
                let ids = self
                    .node
                    .engine
                    .submit(&self.requests)
                    .map_err(|e| NotFound::new_err(e.to_string()))?;
                self.node
                    .settle(&ids)
                    .map_err(|f| Python::attach(|py| f.into_py(py)))?;
                done += 1;
            }
            Ok((done, start.elapsed().as_secs_f64()))
        })
    }

    fn __repr__(&self) -> String {
        let phase = lock(&self.run).phase;
        format!(
            "<orbitte Xfer to {:?}: {} descriptors as {} requests, {:?}>",
            self.agent,
            self.descriptors,
            self.requests.len(),
            phase
        )
    }
}
