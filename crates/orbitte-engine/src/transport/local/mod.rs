//! The local path: same-host peers in different processes move bytes
//! through shared memory, never through a socket.
//!
//! The target's local server listens on an abstract unix socket named
//! after its source id and epoch ([`socket_name`]). A same-host initiator
//! connects, runs the normal session handshake over it (epochs and the
//! cluster secret apply exactly as on tcp; without a secret only a process
//! of the target's uid may map), and receives one `segment-publication`
//! frame per mappable range with the range's memfd attached
//! (`SCM_RIGHTS`). A handout gives at most the range's access: a range
//! published without remote write has its memfd sealed against every new
//! writable mapping and write first, then goes out as a read-only reopen
//! (the server's `handout_fd`), so no holder of the fd can write it, grow
//! it or shrink it. Ranges without remote read are never handed out (a
//! mapping always allows reading); they go over tcp.
//!
//! The initiator maps each range once and executes work items with
//! `memcpy` ([`LocalTransport`]): up to [`INLINE_BYTES`] of a post to an
//! idle rail on the thread that posts them (the engine posts holding the
//! rail's post lock, not its state lock), so a small batch costs no
//! hand-off to another thread and no wakeup; the rest, and everything
//! posted while a copy worker holds the rail's items, on the transport's
//! copy workers ([`copiers`]: at most `SessionConfig::io_threads` threads
//! for every rail, each rail served by one at a time, in posting order),
//! so a large batch does not hold the rail for the whole copy and a
//! worker copies at the same time.

mod copiers;
mod fdpass;
mod liveness;
mod server;

pub(crate) use server::LocalServer;

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use orbitte_memory::HostMemory;
use orbitte_wire::{
    AccessFlags, Epoch, Frame, FrameHeader, HEADER_LEN, LocalMechanism, RangeId, SourceId, Status,
};

use crate::session::{PeerIdentity, SessionConfig, SessionError, SharedPeerTable, handshake};
use crate::transport::{
    CleanupError, EventSink, NotifyError, Op, PathKind, PeerId, PostContext, PostError, RailId,
    RegistrationId, SliceFailure, SliceStatus, Transport, TransportEvent, WorkItem,
    close_rails_now,
};
use copiers::Copiers;
use liveness::TargetSession;

/// The abstract unix socket name of a source owner's local server.
pub fn socket_name(source: &SourceId, epoch: Epoch) -> String {
    let mut h = DefaultHasher::new();
    source.as_str().hash(&mut h);
    format!("orbitte-local/{:016x}/{}", h.finish(), epoch.value())
}

/// Why attaching the local path to a peer failed (the caller falls back to
/// another path and says so).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// The peer's local server is not reachable (another host or network
    /// namespace, or it runs without the local path).
    #[error("local server of {source} (epoch {epoch}) unreachable: {error}")]
    Unreachable {
        /// Peer.
        source: SourceId,
        /// Its epoch.
        epoch: Epoch,
        /// The connect error.
        #[source]
        error: std::io::Error,
    },
    /// The local session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The server is not the peer we expected.
    #[error(
        "local server answered as {found} epoch {found_epoch}, expected {expected} epoch {expected_epoch}"
    )]
    WrongPeer {
        /// Expected source.
        expected: SourceId,
        /// Expected epoch.
        expected_epoch: Epoch,
        /// Found source.
        found: SourceId,
        /// Found epoch.
        found_epoch: Epoch,
    },
    /// Mapping a handed-out range failed.
    #[error("cannot map range {range} of the peer: {error}")]
    Map {
        /// The range.
        range: u64,
        /// Why.
        error: String,
    },
}

/// One range of a peer mapped here.
#[derive(Debug, Clone)]
struct Mapped {
    /// The session of the target that serves it: copies check it is up.
    target: Arc<TargetSession>,
    memory: Arc<HostMemory>,
    /// Where the range starts in the mapping.
    base: u64,
    length: u64,
}

#[derive(Debug)]
struct Job {
    item: WorkItem,
    local: Arc<HostMemory>,
    remote: Option<Mapped>,
}

#[derive(Debug, Default)]
struct RailQueue {
    jobs: std::collections::VecDeque<Job>,
    /// Encoded `notification` frames for the peer's session.
    notes: std::collections::VecDeque<Arc<[u8]>>,
    /// Whether a copy worker is copying jobs it took from `jobs` (set when it
    /// takes them, cleared once it reported them).
    busy: bool,
    closed: bool,
    /// The rail waits in the copy workers' run queue or a worker holds
    /// it ([`copiers`]): set while jobs, notes or a close wait.
    scheduled: bool,
}

/// Schedules `r` on the copy workers for what was just queued under `q`,
/// unless it is scheduled already (a worker that holds it looks at its
/// queue again before it lets go).
fn wake_worker(
    rail: RailId,
    r: &Arc<LocalRail>,
    mut q: std::sync::MutexGuard<'_, RailQueue>,
    copiers: &Arc<Copiers<Scheduled>>,
) {
    if q.scheduled {
        return;
    }
    q.scheduled = true;
    drop(q);
    copiers.schedule(Scheduled(rail, r.clone()));
}

#[derive(Debug)]
struct LocalRail {
    peer: PeerId,
    queue: Mutex<RailQueue>,
    /// The peer's mapping session, kept open to carry notifications.
    channel: Option<Arc<Mutex<UnixStream>>>,
    /// Whether the rail reported that its peer exited (once, by whichever
    /// of a copy worker and the posting thread saw it first).
    exit_reported: AtomicBool,
}

/// The initiator side of the local path: a [`Transport`] whose rails copy
/// between local memory and peer ranges mapped here.
pub struct LocalTransport {
    sink: Arc<dyn EventSink>,
    rails: RwLock<crate::Map<RailId, Arc<LocalRail>>>,
    maps: RwLock<crate::Map<PeerId, crate::Map<RangeId, Mapped>>>,
    sources: RwLock<HashMap<PeerId, SourceId>>,
    /// Each mapped peer's mapping session, kept open for notifications.
    channels: RwLock<HashMap<PeerId, Arc<Mutex<UnixStream>>>>,
    copiers: Arc<Copiers<Scheduled>>,
}

impl std::fmt::Debug for LocalTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransport")
            .field("rails", &self.rails.read().map(|r| r.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

/// What attaching a peer over the local path gave.
#[derive(Debug, Clone)]
pub struct LocalAttach {
    /// Ranges mapped (readable; writable ones say so in `writable`).
    pub ranges: Vec<RangeId>,
    /// Of those, the ones mapped writable.
    pub writable: Vec<RangeId>,
}

impl LocalTransport {
    /// A local transport reporting to `sink`, whose rails' queued copies
    /// run on at most `copy_workers` threads (at least one; the engine
    /// gives it `SessionConfig::io_threads`).
    pub fn new(sink: Arc<dyn EventSink>, copy_workers: usize) -> Arc<Self> {
        Arc::new(Self {
            copiers: Copiers::new(copy_workers, sink.clone()),
            sink,
            rails: RwLock::new(crate::Map::default()),
            maps: RwLock::new(crate::Map::default()),
            sources: RwLock::new(HashMap::new()),
            channels: RwLock::new(HashMap::new()),
        })
    }

    /// Maps the peer's ranges ([`map_peer`](Self::map_peer)) and starts
    /// `rails` for it ([`start_rails`](Self::start_rails)).
    pub fn attach(
        self: &Arc<Self>,
        cfg: &SessionConfig,
        peers: &SharedPeerTable,
        peer: PeerId,
        identity: &PeerIdentity,
        rails: &[RailId],
    ) -> Result<LocalAttach, LocalError> {
        let out = self.map_peer(cfg, peers, peer, identity)?;
        self.start_rails(peer, rails)?;
        Ok(out)
    }

    /// Connects to `identity`'s local server (the normal handshake, then
    /// one memfd per mappable range) and maps every range it hands out for
    /// `peer`, replacing earlier mappings of `peer`.
    pub fn map_peer(
        &self,
        cfg: &SessionConfig,
        peers: &SharedPeerTable,
        peer: PeerId,
        identity: &PeerIdentity,
    ) -> Result<LocalAttach, LocalError> {
        let (s, received) = fetch(cfg, peers, identity)?;
        // Copies check the session is still up (see `liveness`).
        let target = Arc::new(TargetSession::watch(&s));
        let mut mapped = crate::Map::default();
        let mut out = LocalAttach {
            ranges: Vec::new(),
            writable: Vec::new(),
        };
        for (desc, fd) in received {
            let Some(hint) = &desc.local else { continue };
            if hint.mechanism != LocalMechanism::MEMFD || hint.host_id != cfg.host_id {
                continue;
            }
            let writable = desc.access.contains(AccessFlags::REMOTE_WRITE);
            let len = hint
                .file_offset
                .checked_add(desc.length)
                .and_then(|l| usize::try_from(l).ok());
            let Some(len) = len else {
                return Err(LocalError::Map {
                    range: desc.range_id.0,
                    error: "range end overflows".into(),
                });
            };
            let memory =
                HostMemory::map_shared(fd, len, writable).map_err(|e| LocalError::Map {
                    range: desc.range_id.0,
                    error: e.to_string(),
                })?;
            out.ranges.push(desc.range_id);
            if writable {
                out.writable.push(desc.range_id);
            }
            mapped.insert(
                desc.range_id,
                Mapped {
                    target: target.clone(),
                    memory,
                    base: hint.file_offset,
                    length: desc.length,
                },
            );
        }
        {
            // A newer incarnation of the same source replaces the old one's
            // mappings (they would otherwise keep its memory alive here).
            let mut sources = self.sources.write().unwrap_or_else(|p| p.into_inner());
            let mut maps = self.maps.write().unwrap_or_else(|p| p.into_inner());
            let stale: Vec<PeerId> = sources
                .iter()
                .filter(|(p, s)| **p != peer && **s == identity.source_id)
                .map(|(p, _)| *p)
                .collect();
            let mut channels = self.channels.write().unwrap_or_else(|p| p.into_inner());
            for p in stale {
                sources.remove(&p);
                maps.remove(&p);
                channels.remove(&p);
            }
            sources.insert(peer, identity.source_id.clone());
            maps.insert(peer, mapped);
            // The session stays open: notifications to the peer go on it.
            if let Err(e) = s.set_write_timeout(Some(cfg.io_timeout)) {
                tracing::warn!(error = %e, "local session without a write timeout");
            }
            // Each notification's answer is awaited within this.
            if let Err(e) = s.set_read_timeout(Some(cfg.io_timeout)) {
                tracing::warn!(error = %e, "local session without a read timeout");
            }
            channels.insert(peer, Arc::new(Mutex::new(s)));
        }
        Ok(out)
    }

    /// Starts `rails` for a peer mapped with [`map_peer`](Self::map_peer):
    /// what is queued on each (copies too large to make on the posting
    /// thread, notifications, its close) runs on the copy workers.
    pub fn start_rails(&self, peer: PeerId, rails: &[RailId]) -> Result<(), LocalError> {
        for &rail in rails {
            let r = Arc::new(LocalRail {
                peer,
                queue: Mutex::new(RailQueue::default()),
                exit_reported: AtomicBool::new(false),
                channel: self
                    .channels
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&peer)
                    .cloned(),
            });
            self.rails
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(rail, r);
            // A copy worker takes it with the first work queued for it.
        }
        Ok(())
    }

    /// Drops the mappings of `peer` (after its epoch changed or it left).
    /// Rails of the peer fail new work with `unknown-range`.
    pub fn detach(&self, peer: PeerId) {
        self.maps
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer);
        self.channels
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&peer);
    }

    /// Whether `range` of `peer` is mapped.
    pub fn is_mapped(&self, peer: PeerId, range: RangeId) -> bool {
        self.maps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .is_some_and(|m| m.contains_key(&range))
    }
}

/// Most bytes of one post to an idle rail that the posting thread copies
/// itself (the rest go to the copy workers). The rail's post lock is
/// held while it copies (not the engine's state lock), so this bounds how
/// long one post keeps the next post to the same rail, and a flush of it,
/// waiting: a batch of 16 slices of 64 KiB is 1 MiB, about 40 to 100 µs
/// of memcpy.
pub const INLINE_BYTES: u64 = 1 << 20;

/// The memory that a post's items name, looked up again only when an item
/// names another registration or range than the one before it (a post's
/// items mostly name one of each).
struct Lookups<'a> {
    ctx: &'a dyn PostContext,
    /// The ranges of the rail's peer mapped here.
    maps: Option<&'a crate::Map<RangeId, Mapped>>,
    local: Option<(RegistrationId, Option<&'a Arc<HostMemory>>)>,
    remote: Option<(RangeId, Option<&'a Mapped>)>,
}

impl<'a> Lookups<'a> {
    fn local(&mut self, registration: RegistrationId) -> Option<&'a Arc<HostMemory>> {
        match self.local {
            Some((r, memory)) if r == registration => memory,
            _ => {
                let memory = self.ctx.memory(registration);
                self.local = Some((registration, memory));
                memory
            }
        }
    }

    fn remote(&mut self, item: &WorkItem) -> Option<&'a Mapped> {
        let range = RangeId(item.range.0);
        match self.remote {
            Some((r, mapped)) if r == range => mapped,
            _ => {
                let mapped = self.maps.and_then(|m| m.get(&range));
                self.remote = Some((range, mapped));
                mapped
            }
        }
    }
}

/// Connects to `identity`'s local server, runs the handshake and receives
/// every range it hands out with its fd; the session stays open (returned)
/// for notifications.
fn fetch(
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    identity: &PeerIdentity,
) -> Result<(UnixStream, Vec<(orbitte_wire::RangeDescriptor, OwnedFd)>), LocalError> {
    let name = socket_name(&identity.source_id, identity.epoch);
    let unreachable = |error| LocalError::Unreachable {
        source: identity.source_id.clone(),
        epoch: identity.epoch,
        error,
    };
    let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(unreachable)?;
    let mut s = UnixStream::connect_addr(&addr).map_err(unreachable)?;
    let key = cfg.source_key(identity.source_id.as_str());
    let hs = handshake::connect_keyed(
        &mut s,
        cfg,
        peers,
        None,
        orbitte_wire::SessionPurpose::DATA,
        key.as_ref(),
    )?;
    let close = |peers: &SharedPeerTable| {
        peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .session_closed(hs.session);
    };
    if hs.peer.source_id != identity.source_id || hs.peer.epoch != identity.epoch {
        close(peers);
        return Err(LocalError::WrongPeer {
            expected: identity.source_id.clone(),
            expected_epoch: identity.epoch,
            found: hs.peer.source_id,
            found_epoch: hs.peer.epoch,
        });
    }
    let received = receive_ranges(&mut s, cfg, identity.epoch);
    close(peers);
    Ok((s, received?))
}

/// The ranges `identity`'s local server hands out, each with the fd it
/// sends: what a same-host peer gets to map (tests probe what the fd
/// allows).
#[cfg(any(test, feature = "testing"))]
pub fn fetch_handout(
    cfg: &SessionConfig,
    peers: &SharedPeerTable,
    identity: &PeerIdentity,
) -> Result<Vec<(orbitte_wire::RangeDescriptor, OwnedFd)>, LocalError> {
    fetch(cfg, peers, identity).map(|(_, ranges)| ranges)
}

/// Most ranges one local session may hand out (each holds an fd here).
const MAX_LOCAL_RANGES: usize = 4096;

/// Reads publication frames (each with its fd) until the server's goodbye.
fn receive_ranges(
    s: &mut UnixStream,
    cfg: &SessionConfig,
    epoch: Epoch,
) -> Result<Vec<(orbitte_wire::RangeDescriptor, OwnedFd)>, SessionError> {
    s.set_read_timeout(Some(cfg.frame_timeout))?;
    let mut out = Vec::new();
    let mut body = Vec::new();
    loop {
        let mut header = [0u8; HEADER_LEN];
        let (n, fd) = fdpass::recv_with_fd(s, &mut header)?;
        if n == 0 {
            return Err(SessionError::Closed {
                during: "receiving local mappings",
            });
        }
        s.read_exact(&mut header[n..])?;
        let h = FrameHeader::decode(&header)?;
        body.clear();
        body.resize(h.fixed_len(), 0);
        s.read_exact(&mut body)?;
        match orbitte_wire::decode_body(&h, &body)? {
            Frame::SegmentPublication(p) => {
                if p.epoch != epoch {
                    return Err(SessionError::Protocol(format!(
                        "local publication names epoch {}, the session's is {epoch}",
                        p.epoch
                    )));
                }
                let fd = fd.ok_or_else(|| {
                    SessionError::Protocol("local publication without an fd".into())
                })?;
                let Some(desc) = p.ranges.into_iter().next() else {
                    continue;
                };
                if out.len() >= MAX_LOCAL_RANGES {
                    return Err(SessionError::Limit(format!(
                        "local server handed out more than {MAX_LOCAL_RANGES} ranges"
                    )));
                }
                out.push((desc, fd));
            }
            Frame::Goodbye(_) => return Ok(out),
            Frame::Error(e) => {
                return Err(SessionError::Refused {
                    code: e.code,
                    message: e.message.to_string(),
                });
            }
            other => {
                return Err(SessionError::Protocol(format!(
                    "unexpected {} on the local socket",
                    other.frame_type()
                )));
            }
        }
    }
}

/// A worker's buffers, reused from rail to rail: swapped with a rail's
/// (empty) queues, so no batch allocates once they are grown.
#[derive(Default)]
struct Buffers {
    batch: std::collections::VecDeque<Job>,
    notes: std::collections::VecDeque<Arc<[u8]>>,
    statuses: Vec<SliceStatus>,
    events: Vec<TransportEvent>,
}

/// A rail in the copy workers' run queue.
struct Scheduled(RailId, Arc<LocalRail>);

impl copiers::Serve for Scheduled {
    type Ctx = Arc<dyn EventSink>;
    type Scratch = Buffers;

    fn serve(&self, sink: &Arc<dyn EventSink>, b: &mut Buffers) -> bool {
        serve(self.0, &self.1, &**sink, b)
    }

    fn fail(&self, sink: &Arc<dyn EventSink>, reason: &Arc<str>) {
        fail_rail(self.0, &self.1, reason, &**sink);
    }
}

/// Copies and reports everything queued on `rail` now, then sends its
/// notifications; whether the rail stays scheduled (more was queued, or
/// it closed and its end is to be reported).
fn serve(rail: RailId, r: &LocalRail, sink: &dyn EventSink, b: &mut Buffers) -> bool {
    {
        let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.jobs.is_empty() && q.notes.is_empty() {
            q.scheduled = false;
            let closed = q.closed;
            drop(q);
            if closed {
                // Nothing is outstanding: the engine stops using the rail.
                b.events.push(TransportEvent::RailDown {
                    rail,
                    reason: "local rail closed".into(),
                });
                sink.deliver(&mut b.events);
                b.events.clear();
            }
            return false;
        }
        std::mem::swap(&mut q.jobs, &mut b.batch);
        std::mem::swap(&mut q.notes, &mut b.notes);
        q.busy = !b.batch.is_empty();
    }
    // A copy into (or from) the mapping of a process that died reached no
    // one: checked after the batch, so nothing copied while the peer died
    // is reported as done.
    let mut alive = Alive::default();
    b.statuses.extend(
        b.batch
            .iter()
            .map(|job| execute(&job.item, &job.local, job.remote.as_ref())),
    );
    for (job, status) in b.batch.drain(..).zip(b.statuses.drain(..)) {
        let status = alive.confirm(job.remote.as_ref(), status);
        b.events.push(TransportEvent::Completed {
            rail,
            token: job.item.token,
            status,
            released: true,
        });
    }
    if alive.saw_exit && !r.exit_reported.swap(true, Ordering::Relaxed) {
        b.events.insert(0, rail_down_exited(rail));
    }
    if !b.events.is_empty() {
        sink.deliver(&mut b.events);
        b.events.clear();
    }
    // Notifications are sent only after every copy of their batch was
    // reported: the bytes are in the shared mapping already. Each answer is
    // read before the next goes; a session that fails takes the rail down
    // (the notifications waiting for an answer are then unconfirmed).
    for note in b.notes.drain(..) {
        let event = match send_note(r.channel.as_deref(), &note) {
            Ok(answer) => TransportEvent::NotificationAnswered { rail, answer },
            Err(why) => {
                tracing::warn!(rail = rail.0, %why, "local notification session failed");
                TransportEvent::RailDown {
                    rail,
                    reason: why.into(),
                }
            }
        };
        b.events.push(event);
        sink.deliver(&mut b.events);
        b.events.clear();
    }
    let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
    q.busy = false;
    let more = !q.jobs.is_empty() || !q.notes.is_empty() || q.closed;
    q.scheduled = more;
    more
}

/// Fails everything queued on `rail`, which no worker can serve.
fn fail_rail(rail: RailId, r: &LocalRail, reason: &Arc<str>, sink: &dyn EventSink) {
    tracing::warn!(rail = rail.0, %reason, "local rail down");
    let jobs = {
        let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.scheduled = false;
        q.closed = true;
        q.notes.clear();
        std::mem::take(&mut q.jobs)
    };
    let mut events = vec![TransportEvent::RailDown {
        rail,
        reason: reason.clone(),
    }];
    events.extend(jobs.into_iter().map(|j| TransportEvent::Completed {
        rail,
        token: j.item.token,
        status: SliceStatus::Failed(SliceFailure::RailDown(reason.clone())),
        released: true,
    }));
    sink.deliver(&mut events);
}

/// Writes one encoded `notification` frame on the peer's mapping session
/// and reads the target's answer (within the session's read timeout).
fn send_note(
    channel: Option<&Mutex<UnixStream>>,
    frame: &[u8],
) -> Result<orbitte_wire::NotificationAnswer, String> {
    let Some(channel) = channel else {
        return Err("the peer's local session is closed".into());
    };
    let mut s = channel.lock().unwrap_or_else(|p| p.into_inner());
    std::io::Write::write_all(&mut *s, frame)
        .map_err(|e| format!("sending a notification on the local session failed: {e}"))?;
    let wait = s.read_timeout().ok().flatten();
    let answer = crate::session::io::FrameReader::with_limit(orbitte_wire::MAX_SMALL_BODY_LEN)
        .read(
            &mut *s,
            wait,
            wait.unwrap_or(std::time::Duration::from_secs(10)),
        );
    match answer {
        Ok(Frame::NotificationAnswer(a)) => Ok(a),
        Ok(Frame::Error(e)) => Err(format!(
            "the peer refused the local session: {} ({})",
            e.code, e.message
        )),
        Ok(other) => Err(format!(
            "the peer answered a notification with {}",
            other.frame_type()
        )),
        Err(e) => Err(format!(
            "no answer to a notification on the local session: {e}"
        )),
    }
}

const PEER_EXITED: &str = "the peer process exited or stopped serving: its mapping reaches no one";

fn peer_exited() -> SliceStatus {
    SliceStatus::Failed(SliceFailure::RailDown(PEER_EXITED.into()))
}

fn rail_down_exited(rail: RailId) -> TransportEvent {
    TransportEvent::RailDown {
        rail,
        reason: PEER_EXITED.into(),
    }
}

/// The liveness of the targets of one batch, checked once per target
/// after the batch's copies: the target's hang-up stays reported once it
/// happened, so a target that died before or during a copy is seen then,
/// and that copy is not reported done. (Copying into the mapping of a
/// dead target reaches no one and harms no one.)
#[derive(Default)]
struct Alive {
    last: Option<(Arc<TargetSession>, bool)>,
    saw_exit: bool,
}

impl Alive {
    /// The status of a copy into or from `remote`, given once the batch's
    /// copies are done: a success counts only if the target is still up.
    fn confirm(&mut self, remote: Option<&Mapped>, status: SliceStatus) -> SliceStatus {
        let (SliceStatus::Success, Some(remote)) = (&status, remote) else {
            return status;
        };
        let alive = match &self.last {
            Some((t, alive)) if Arc::ptr_eq(t, &remote.target) => *alive,
            _ => {
                let alive = !remote.target.is_gone();
                self.saw_exit |= !alive;
                self.last = Some((remote.target.clone(), alive));
                alive
            }
        };
        if alive { status } else { peer_exited() }
    }
}

fn failed(status: Status) -> SliceStatus {
    SliceStatus::Failed(SliceFailure::Completion {
        status: status.name().unwrap_or("error").into(),
        code: u32::from(status.0),
    })
}

fn execute(it: &WorkItem, local: &HostMemory, remote: Option<&Mapped>) -> SliceStatus {
    let Some(remote) = remote else {
        return failed(Status::UNKNOWN_RANGE);
    };
    let len = it.len as usize;
    match it.remote_offset.checked_add(u64::from(it.len)) {
        Some(end) if end <= remote.length => {}
        _ => return failed(Status::OUT_OF_BOUNDS),
    }
    let (Ok(roff), Ok(loff)) = (
        usize::try_from(remote.base + it.remote_offset),
        usize::try_from(it.local_offset),
    ) else {
        return failed(Status::OUT_OF_BOUNDS);
    };
    let r = match it.op {
        Op::Read => local.copy_from(loff, &remote.memory, roff, len),
        Op::Write => remote.memory.copy_from(roff, local, loff, len),
    };
    match r {
        Ok(()) => SliceStatus::Success,
        Err(orbitte_memory::MemoryError::ReadOnly) => failed(Status::ACCESS_DENIED),
        Err(orbitte_memory::MemoryError::OutOfBounds { .. }) => failed(Status::OUT_OF_BOUNDS),
        // Caller memory unmapped while registered: the error names the
        // range and what the caller must keep.
        Err(e @ orbitte_memory::MemoryError::Unmapped { .. }) => {
            SliceStatus::Failed(SliceFailure::Completion {
                status: e.to_string().into(),
                code: u32::from(Status::INTERNAL.0),
            })
        }
        Err(_) => failed(Status::INTERNAL),
    }
}

impl LocalTransport {
    /// Queues `items` on `rail` for the copy workers (see [`Transport::post`]).
    pub fn post_items(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        self.post_split(rail, items, ctx, 0, &mut Vec::new())
    }

    /// Copies the items at the front of `items`, up to [`INLINE_BYTES`],
    /// here if no copy worker holds `rail`'s items, and puts their events
    /// into `done`; queues the rest for the copy workers (see
    /// [`Transport::post_inline`]).
    pub fn post_inline_items(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        self.post_split(rail, items, ctx, INLINE_BYTES, done)
    }

    /// Copies the front of `items`, at most `inline` bytes, on this thread
    /// (events into `done`) if no copy worker holds the rail's items, and
    /// queues the rest for the copy workers, before copying, so that one
    /// copies at the same time.
    fn post_split(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        inline: u64,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        let Some(r) = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
            .cloned()
        else {
            return Err(PostError {
                rail,
                posted: 0,
                reason: "unknown local rail".into(),
            });
        };
        let maps = self.maps.read().unwrap_or_else(|p| p.into_inner());
        let mut look = Lookups {
            ctx,
            maps: maps.get(&r.peer),
            local: None,
            remote: None,
        };
        // Items after one whose registration is gone are not posted.
        let accepted = items
            .iter()
            .position(|it| look.local(it.registration).is_none())
            .unwrap_or(items.len());
        let (items, refused) = items.split_at(accepted);
        let (here, queued) = {
            let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.closed {
                return Err(PostError {
                    rail,
                    posted: 0,
                    reason: "local rail closed".into(),
                });
            }
            // Only an idle rail copies here: items never pass the ones its
            // copy worker holds, and a post that follows this one while a
            // worker copies queues behind it instead of copying on
            // the posting thread.
            let mut budget = if q.busy || !q.jobs.is_empty() {
                0
            } else {
                inline
            };
            let here = items
                .iter()
                .take_while(|it| {
                    let fits = u64::from(it.len) <= budget;
                    if fits {
                        budget -= u64::from(it.len);
                    }
                    fits
                })
                .count();
            let (here, queued) = items.split_at(here);
            for item in queued {
                if let Some(local) = look.local(item.registration) {
                    q.jobs.push_back(Job {
                        item: *item,
                        local: local.clone(),
                        remote: look.remote(item).cloned(),
                    });
                }
            }
            (here, queued)
        };
        if !queued.is_empty() {
            let q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
            wake_worker(rail, &r, q, &self.copiers);
        }
        if !here.is_empty() {
            let mut alive = Alive::default();
            let first = done.len();
            for it in here {
                let status = match look.local(it.registration) {
                    Some(local) => execute(it, local, look.remote(it)),
                    None => failed(Status::INTERNAL),
                };
                done.push(TransportEvent::Completed {
                    rail,
                    token: it.token,
                    status,
                    released: true,
                });
            }
            for (it, ev) in here.iter().zip(&mut done[first..]) {
                if let TransportEvent::Completed { status, .. } = ev {
                    let s = std::mem::replace(status, SliceStatus::Success);
                    *status = alive.confirm(look.remote(it), s);
                }
            }
            if alive.saw_exit && !r.exit_reported.swap(true, Ordering::Relaxed) {
                done.insert(first, rail_down_exited(rail));
            }
        }
        match refused.first() {
            None => Ok(()),
            Some(_) => Err(PostError {
                rail,
                posted: accepted,
                reason: "local registration is gone".into(),
            }),
        }
    }
    /// Queues an encoded `notification` frame on `rail` (see
    /// [`Transport::notify`]); the rail's worker writes it on the peer's
    /// mapping session.
    pub fn notify_rail(&self, rail: RailId, frame: &Arc<[u8]>) -> Result<(), NotifyError> {
        let refuse = |reason: &str| NotifyError {
            rail,
            reason: reason.into(),
        };
        let r = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rail)
            .cloned();
        let Some(r) = r else {
            return Err(refuse("unknown local rail"));
        };
        if r.channel.is_none() {
            return Err(refuse("the peer's local session is closed"));
        }
        let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.closed {
            return Err(refuse("local rail closed"));
        }
        q.notes.push_back(frame.clone());
        wake_worker(rail, &r, q, &self.copiers);
        Ok(())
    }

    /// Closes every rail of `peer` and reports them down to the engine at
    /// once; returns them.
    pub fn close_peer(&self, peer: PeerId) -> Vec<RailId> {
        let rails: Vec<RailId> = self
            .rails
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, r)| r.peer == peer)
            .map(|(id, _)| *id)
            .collect();
        close_rails_now(&*self.sink, rails, "peer switched path", |r| self.close(r))
    }

    /// Stops `rail` after the items already queued.
    pub fn close(&self, rail: RailId) {
        if let Some(r) = self
            .rails
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&rail)
        {
            let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.closed = true;
            wake_worker(rail, &r, q, &self.copiers);
        }
    }
}

impl Drop for LocalTransport {
    fn drop(&mut self) {
        let copiers = self.copiers.clone();
        for (rail, r) in self
            .rails
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let mut q = r.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.closed = true;
            wake_worker(rail, &r, q, &copiers);
        }
    }
}

impl Transport for Arc<LocalTransport> {
    fn path(&self) -> PathKind {
        PathKind::Local
    }

    fn post(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
    ) -> Result<(), PostError> {
        self.post_items(rail, items, ctx)
    }

    fn post_inline(
        &self,
        rail: RailId,
        items: &[WorkItem],
        ctx: &dyn PostContext,
        done: &mut Vec<TransportEvent>,
    ) -> Result<(), PostError> {
        self.post_inline_items(rail, items, ctx, done)
    }

    fn flush(&self, _rail: RailId) -> Result<(), CleanupError> {
        // Queued copies finish on their own (memcpy cannot hang).
        Ok(())
    }

    fn close_rail(&self, rail: RailId) -> Result<(), CleanupError> {
        self.close(rail);
        Ok(())
    }

    fn notify(&self, rail: RailId, frame: &Arc<[u8]>) -> Result<(), NotifyError> {
        self.notify_rail(rail, frame)
    }
}

#[cfg(test)]
mod tests;
