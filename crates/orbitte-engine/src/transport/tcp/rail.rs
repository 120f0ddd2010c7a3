//! One tcp rail: one connection to a peer, served for its whole life on
//! one of the transport's I/O loops ([`crate::io_pool`]): the loop writes
//! the queued requests (up to the in-flight bound), matches the answers,
//! moves READ payloads into local memory and reports completions. A rail
//! has no thread of its own, idle or busy: an engine's threads are the
//! same with one rail or a thousand.
//!
//! Posting threads ([`Rail::push`], [`Rail::push_note`]) queue work under
//! the rail's lock and poke its loop ([`IoPool::poke`]); a flag
//! (`State::poked`) coalesces the pokes, so a burst of posts costs one.
//! A run of READs posted while nothing is being written skips the loop:
//! the posting thread sends their requests itself, without waiting for
//! the socket, and leaves what the socket did not take (`State::carry`)
//! to the loop, which sends it before anything else. One thread writes at
//! a time (`State::writer`): the loop skips its writes while a poster
//! sends, and the poster pokes it afterwards if work is left.
//!
//! The socket is non-blocking and every call on the loop returns at once.
//! The loop sends everything it can in one go: READ requests,
//! notifications and small WRITEs (a payload of up to [`SMALL_WRITE`],
//! copied in behind its header) are gathered into one `send`. To a peer
//! on this host, WRITEs of up to [`GATHER_WRITE`] join them too, each
//! payload sent from its mapping behind its header: up to
//! [`GATHER_WRITES`] of them in one `sendmsg` with the requests around
//! them. A larger WRITE's header goes out in the `sendmsg` of its payload
//! (or before its `sendfile`, for memfd-backed memory with `zero_copy`),
//! alone. What the socket does not take
//! stays with the loop, which then waits for the socket to be writable as
//! well as readable, and goes on where it stopped. It receives through a
//! small buffer ([`FrameBuffer`]), so one `recv` brings every answer that
//! waits. A READ's payload goes from the socket straight into the local
//! range, and the next answer's header comes in the same `recvmsg`: one
//! system call per answer in a stream of READ answers. A READ payload
//! that waits for its rest sets the socket's receive mark
//! ([`receive_mark`]: the rest, at most 256 KiB) before the loop waits,
//! so the loop wakes once a good part of it is queued, not at every
//! segment; the mark goes back to 1 before the loop waits for a frame.
//! Bytes below the mark wake no one, so the rail reads what is queued
//! before it judges the peer silent (`io_timeout`). It hands every
//! answer of a turn to the engine in one delivery before it waits again,
//! and within a turn in a stream that never pauses once the answers cover
//! [`ANSWER_BATCH`] bytes: a completion never waits on the socket, so a
//! request that times out while its rail is stalled counts every slice
//! answered before the stall. A turn moves at most [`TURN_BYTES`]
//! received bytes before the loop serves its other descriptors (the
//! registration is level-triggered: the rail's turn comes again).
//!
//! Answers are matched to requests by request id (docs/protocol.md: a
//! peer may answer in any order; ours serves a connection in order, so the
//! match is usually at the front of the in-flight list). An answer that
//! names no request in flight, or the wrong operation, is a protocol error
//! that takes the rail down. Completions are reported in the order the
//! requests were sent, whatever the order of the answers (an answer that
//! overtook earlier ones is held, its bytes in place, until those are
//! answered): a rail's completions reach the engine in posting order, as
//! on every other path.
//!
//! The loop keeps one deadline for the rail in its heap: while requests
//! (or notifications waiting for their `notification-answer`) are
//! outstanding, `io_timeout` after the last answer (or READ payload
//! byte, or the post onto an idle rail); while none are, `io_timeout`
//! from now, when it looks again (a post whose requests the poster sent
//! itself pokes no one). A frame left incomplete brings it forward to
//! `frame_timeout`.
//!
//! When the rail goes down (socket error, peer error frame, protocol
//! error, no answer within `io_timeout` while requests are outstanding,
//! a flush or close), the loop, the only thread that touches local memory,
//! reports a `RailDown` and every outstanding item as failed with
//! `released: true`: nothing reads or writes their bytes any more (a
//! poster sending READ requests touches no local memory).

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mio::Interest;
use orbitte_memory::{HostMemory, SendPiece};
use orbitte_wire::{AccessToken, Frame, RangeId, ReadRequest, RequestId, Status, WriteRequest};

use super::payload::send_ready;
use super::socket::{ANSWER_BATCH, limit_unsent, receive_mark, size_socket_buffers};
use crate::io_pool::{IoPool, Next, WatchKey, Watched};
use crate::session::SessionConfig;
use crate::session::io::FrameBuffer;
use crate::transport::{
    EventSink, Op, RailId, SliceFailure, SliceStatus, SliceToken, TransportEvent, WorkItem,
};

/// A publication or retire the peer sent on an established rail.
#[derive(Debug, Clone)]
pub(crate) enum SegmentUpdate {
    Published(orbitte_wire::SegmentPublication),
    Retired(orbitte_wire::SegmentRetire),
}

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) item: WorkItem,
    pub(crate) local: Arc<HostMemory>,
    pub(crate) token: AccessToken,
    /// In flight: the outcome of its answer, once the answer (and a READ's
    /// payload) arrived, until the jobs sent before it are answered too.
    pub(crate) answered: Option<SliceStatus>,
}

/// Who writes on the socket now; only that thread writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// Nobody: the next post of READs may send them itself.
    Idle,
    /// A poster sends its READ requests.
    Poster,
    /// The loop sends, or holds bytes the socket did not take yet.
    Loop,
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Job>,
    in_flight: VecDeque<Job>,
    /// Encoded `notification` frames to send.
    notes: VecDeque<Arc<[u8]>>,
    /// Notifications sent and not answered yet: like requests in flight,
    /// their answer is due within `io_timeout`.
    unanswered: usize,
    /// Why the rail is down; `None` while up.
    down: Option<Arc<str>>,
    writer: Writer,
    /// Bytes of requests a poster began to send but the socket did not
    /// take without waiting: the loop sends them before anything else.
    /// Empty, it keeps its allocation for the next poster's requests.
    carry: Vec<u8>,
    /// Bytes left to the loop that way, in all.
    carried: u64,
    /// A poke of the loop is on its way (cleared when its turn begins).
    poked: bool,
    last_progress: Instant,
}

#[derive(Debug)]
pub(crate) struct Rail {
    pub(crate) id: RailId,
    pub(crate) session: orbitte_wire::SessionId,
    /// The posters' handle of the socket (the loop owns the other).
    stream: TcpStream,
    state: Mutex<State>,
    max_in_flight: usize,
    pool: Weak<IoPool>,
    key: WatchKey,
}

/// Received bytes one turn of a rail moves at most before its loop serves
/// its other descriptors.
const TURN_BYTES: usize = 8 << 20;

/// Largest run of requests gathered into one `send`.
const GATHER: usize = 64 << 10;

/// Largest WRITE payload to a peer on this host sent with `sendmsg` from
/// the mapping behind its header, gathered with the requests around it
/// (larger ones go alone, with `sendfile`: at 256 KiB gathering measured
/// a little slower, 3.73 against 3.96 GB/s, at 64 KiB faster, 3.37
/// against 2.84).
const GATHER_WRITE: usize = 64 << 10;

/// Most WRITE payloads gathered into one run of `sendmsg` calls.
const GATHER_WRITES: usize = 16;

/// Most payload bytes gathered into one run of `sendmsg` calls.
const GATHER_WRITE_BYTES: usize = 1 << 20;

/// Largest WRITE payload copied into the request bytes and sent with the
/// requests around it: below this, a `sendfile` and the header's own
/// `send` per request cost more than the copy.
const SMALL_WRITE: usize = 16 << 10;

impl Rail {
    /// Starts a rail over an established session: its socket goes to a
    /// loop of `pool` for the rail's whole life.
    pub(crate) fn start(
        id: RailId,
        session: orbitte_wire::SessionId,
        stream: TcpStream,
        cfg: &SessionConfig,
        sink: Arc<dyn EventSink>,
        on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
        pool: &Arc<IoPool>,
    ) -> std::io::Result<Arc<Self>> {
        size_socket_buffers(&stream, cfg.socket_buffer);
        limit_unsent(&stream, cfg.unsent_limit);
        stream.set_nonblocking(true)?;
        let gathers = super::socket::same_host(&stream);
        let key = pool.key();
        let now = Instant::now();
        let rail = Arc::new(Self {
            id,
            session,
            stream: stream.try_clone()?,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: VecDeque::new(),
                notes: VecDeque::new(),
                unanswered: 0,
                down: None,
                writer: Writer::Idle,
                carry: Vec::new(),
                carried: 0,
                // The poke below, after the loop has it.
                poked: true,
                last_progress: now,
            }),
            max_in_flight: cfg.max_in_flight_per_connection.max(1) as usize,
            pool: Arc::downgrade(pool),
            key,
        });
        let conn = Conn {
            rail: rail.clone(),
            stream,
            frames: FrameBuffer::new(),
            out: Vec::with_capacity(1024),
            out_at: 0,
            payload_out: None,
            behind: VecDeque::new(),
            gathers,
            payload_in: None,
            held: Held {
                sink,
                events: Vec::with_capacity(32),
                bytes: 0,
            },
            on_segment,
            frame_timeout: cfg.frame_timeout,
            io_timeout: cfg.io_timeout,
            zero_copy: cfg.zero_copy,
            blocked: false,
            lowat: 1,
            check_at: now + cfg.io_timeout,
        };
        pool.watch_as(key, Box::new(conn), Some(now + cfg.io_timeout));
        // Posts that came before the loop had it poked no one.
        pool.poke(key);
        Ok(rail)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the loop must be poked for what `st` holds (marking the
    /// poke as sent): something to write that nobody writes, and no poke
    /// on its way. A poster or the loop that writes looks at the queue
    /// again before it lets go.
    fn needs_poke(&self, st: &mut State) -> bool {
        if st.down.is_some() || st.poked || st.writer != Writer::Idle {
            return false;
        }
        let work = !st.carry.is_empty()
            || !st.notes.is_empty()
            || (!st.queue.is_empty() && st.in_flight.len() < self.max_in_flight);
        st.poked = work;
        work
    }

    /// Pokes the rail's loop (a pool that stopped took the rail down).
    fn poke(&self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.poke(self.key);
        }
    }

    /// Queues jobs; `Err` when the rail is down (nothing queued).
    ///
    /// When nothing is being written and every job queued is a READ, the
    /// calling thread sends the requests itself (a few dozen bytes each, in
    /// one `send`) instead of poking the loop: a batch of READs then
    /// costs no thread switch before its requests are on the wire. It never
    /// waits for the socket: what its buffer does not take at once is left
    /// to the loop. WRITEs, whose payloads may be large, always go
    /// through the loop.
    pub(crate) fn push(self: &Arc<Self>, jobs: impl Iterator<Item = Job>) -> Result<(), Arc<str>> {
        let mut st = self.lock();
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        if st.in_flight.is_empty() && st.queue.is_empty() {
            st.last_progress = Instant::now();
        }
        st.queue.extend(jobs);
        let here = st.writer == Writer::Idle
            && st.carry.is_empty()
            && st.notes.is_empty()
            && st.in_flight.len() < self.max_in_flight
            && st.queue.iter().all(|j| j.item.op == Op::Read);
        if !here {
            let poke = self.needs_poke(&mut st);
            drop(st);
            if poke {
                self.poke();
            }
            return Ok(());
        }
        st.writer = Writer::Poster;
        // The carry buffer is empty here; its allocation is reused for the
        // requests, and given back whether or not the socket took them all.
        let mut out = std::mem::take(&mut st.carry);
        let mut encoded = Ok(());
        while st.in_flight.len() < self.max_in_flight {
            let Some(job) = st.queue.pop_front() else {
                break;
            };
            if encoded.is_ok() {
                encoded = request_frame(&job).encode(&mut out);
            }
            st.in_flight.push_back(job);
        }
        drop(st);
        let sent = match encoded {
            Ok(()) => send_ready(&self.stream, &out),
            Err(e) => Err(std::io::Error::other(e)),
        };
        let mut st = self.lock();
        st.writer = Writer::Idle;
        match sent {
            Err(e) => {
                drop(st);
                // The jobs are in flight: the loop reports them failed.
                self.fail(&format!("sending a request failed: {e}"), false);
                return Ok(());
            }
            Ok(n) if n < out.len() => {
                out.drain(..n);
                tracing::trace!(
                    rail = self.id.0,
                    bytes = out.len(),
                    "the socket is full: the loop sends the rest of the requests"
                );
                st.carried += out.len() as u64;
                st.carry = out;
            }
            Ok(_) => {
                out.clear();
                st.carry = out;
            }
        }
        let poke = self.needs_poke(&mut st);
        drop(st);
        if poke {
            self.poke();
        }
        Ok(())
    }

    /// Queues an encoded `notification` frame; `Err` when the rail is down.
    pub(crate) fn push_note(self: &Arc<Self>, frame: Arc<[u8]>) -> Result<(), Arc<str>> {
        let mut st = self.lock();
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        st.notes.push_back(frame);
        let poke = self.needs_poke(&mut st);
        drop(st);
        if poke {
            self.poke();
        }
        Ok(())
    }

    /// Takes the rail down (idempotent): its loop then reports everything.
    /// A rail that goes down unasked is a warning; one closed or flushed on
    /// request (`deliberate`) is logged at debug.
    pub(crate) fn fail(&self, why: &str, deliberate: bool) {
        let mut st = self.lock();
        if st.down.is_none() {
            if deliberate {
                tracing::debug!(rail = self.id.0, reason = why, "tcp rail closed");
            } else {
                tracing::warn!(rail = self.id.0, reason = why, "tcp rail down");
            }
            st.down = Some(why.into());
        }
        let poke = !std::mem::replace(&mut st.poked, true);
        drop(st);
        let _ = self.stream.shutdown(Shutdown::Both);
        if poke {
            self.poke();
        }
    }

    pub(crate) fn is_down(&self) -> bool {
        self.lock().down.is_some()
    }
}

/// The request frame of `job` (without a WRITE's payload).
fn request_frame(job: &Job) -> Frame {
    let it = &job.item;
    match it.op {
        Op::Read => Frame::ReadRequest(ReadRequest {
            request_id: RequestId(it.token.0),
            range_id: RangeId(it.range.0),
            token: job.token,
            offset: it.remote_offset,
            length: it.len,
        }),
        Op::Write => Frame::WriteRequest(WriteRequest {
            request_id: RequestId(it.token.0),
            range_id: RangeId(it.range.0),
            token: job.token,
            offset: it.remote_offset,
            length: it.len,
        }),
    }
}

fn completion(status: Status) -> SliceStatus {
    if status.is_ok() {
        SliceStatus::Success
    } else {
        SliceStatus::Failed(SliceFailure::Completion {
            status: format!("peer answered {status}").into(),
            code: u32::from(status.0),
        })
    }
}

/// What a READ payload's last `recvmsg` may bring of the next frame: the
/// header and fixed part of a READ answer (its payload is received straight
/// into its own destination).
const NEXT_ANSWER: usize = orbitte_wire::HEADER_LEN + orbitte_wire::READ_RESPONSE_FIXED_LEN;

/// Completions the loop has not handed to the engine yet, and the
/// bytes of the slices answered since it last did.
struct Held {
    sink: Arc<dyn EventSink>,
    events: Vec<TransportEvent>,
    bytes: u64,
}

impl Held {
    /// Records that a slice of `len` bytes was answered; hands the
    /// completions over once they cover [`ANSWER_BATCH`] bytes.
    fn answered(&mut self, len: u32) {
        self.bytes += u64::from(len);
        if self.bytes >= ANSWER_BATCH {
            self.hand_over();
        }
    }

    /// Hands every held completion to the engine.
    fn hand_over(&mut self) {
        if !self.events.is_empty() {
            self.sink.deliver(&mut self.events);
            self.events.clear();
        }
        self.bytes = 0;
    }
}

/// A WRITE payload being sent: `mem[at..end]` goes out after the frames
/// buffered before it.
struct PayloadOut {
    mem: Arc<HostMemory>,
    at: usize,
    end: usize,
}

/// A READ payload being received into `mem[at..end]`, for the job of
/// `token` (`len` bytes in all).
struct PayloadIn {
    token: SliceToken,
    mem: Arc<HostMemory>,
    at: usize,
    end: usize,
    len: u32,
}

/// A rail's side on its loop: the socket, what is being sent and
/// received on it, and where answers go.
struct Conn {
    rail: Arc<Rail>,
    stream: TcpStream,
    frames: FrameBuffer,
    /// Frames to send (`out[out_at..]` not sent yet), then
    /// [`Conn::payload_out`] when a WRITE's payload follows them.
    out: Vec<u8>,
    out_at: usize,
    payload_out: Option<PayloadOut>,
    /// To a peer on this host: WRITE payloads of up to [`GATHER_WRITE`]
    /// go with `sendmsg` from the mapping, several with their headers in
    /// one call, each behind its header's end in `out`
    /// (`out[..head_end]`); the first's header end is at or past
    /// `out_at`. Empty while [`Conn::payload_out`] holds one.
    behind: VecDeque<(usize, PayloadOut)>,
    /// Whether the peer is on this host ([`super::socket::same_host`]).
    gathers: bool,
    payload_in: Option<PayloadIn>,
    held: Held,
    on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
    frame_timeout: Duration,
    io_timeout: Duration,
    zero_copy: bool,
    /// The socket refused bytes the loop holds: wait until it is writable.
    blocked: bool,
    /// The socket's `SO_RCVLOWAT` as last set (1: the kernel's default).
    lowat: u32,
    /// When the loop looks at the rail's timeouts next.
    check_at: Instant,
}

/// How a send on the non-blocking socket went.
enum Sent {
    /// Everything held went out.
    All,
    /// The socket is full; the rest waits for it to be writable.
    Blocked,
}

impl Conn {
    /// One turn: writes what waits, reads what arrived, delivers the
    /// completions, and says how to wait next (or takes the rail down).
    fn turn(mut self: Box<Self>, now: Instant, check: bool) -> Next {
        match self.serve(now, check) {
            Ok(()) => {
                self.held.hand_over();
                let at = self.check_at;
                Next::Wait(self, Some(at))
            }
            Err(why) => {
                self.take_down(&why);
                Next::Done
            }
        }
    }

    fn serve(&mut self, now: Instant, check: bool) -> Result<(), String> {
        {
            let mut st = self.rail.lock();
            st.poked = false;
            if let Some(why) = &st.down {
                return Err(why.to_string());
            }
        }
        let mut budget = TURN_BYTES;
        if check {
            if self.lowat > 1 {
                // Payload bytes below the receive mark woke no one: they
                // count as progress before the rail is judged silent.
                self.read(&mut budget)?;
            }
            self.check_timeouts(now)?;
        }
        loop {
            let wrote = self.write()?;
            let read = self.read(&mut budget)?;
            // What arrived goes to the engine before the next writes (a
            // WRITE's payload takes a while to copy into the socket).
            self.held.hand_over();
            if !wrote && !read {
                break;
            }
            if budget == 0 {
                // More may wait in the buffer with nothing left on the
                // socket to make it ready again: the next turn comes by a
                // poke, after the loop's other descriptors.
                let mut st = self.rail.lock();
                if !std::mem::replace(&mut st.poked, true) {
                    drop(st);
                    self.rail.poke();
                }
                break;
            }
        }
        if !self.frames.is_empty() && self.payload_in.is_none() {
            if self.frames.overdue(self.frame_timeout) {
                return Err(format!(
                    "connection lost: the peer did not complete a frame within {:?}",
                    self.frame_timeout
                ));
            }
            self.check_at = self.check_at.min(now + self.frame_timeout);
        }
        Ok(())
    }

    /// Takes the rail down when requests have had no answer for
    /// `io_timeout` or a frame stayed incomplete for `frame_timeout`;
    /// sets when to look again.
    fn check_timeouts(&mut self, now: Instant) -> Result<(), String> {
        if !self.frames.is_empty()
            && self.payload_in.is_none()
            && self.frames.overdue(self.frame_timeout)
        {
            return Err(format!(
                "connection lost: the peer did not complete a frame within {:?}",
                self.frame_timeout
            ));
        }
        let st = self.rail.lock();
        if st.in_flight.is_empty() && st.unanswered == 0 {
            self.check_at = now + self.io_timeout;
            return Ok(());
        }
        let due = st.last_progress + self.io_timeout;
        if now >= due {
            return Err(format!(
                "no answer from the peer within {:?}",
                self.io_timeout
            ));
        }
        self.check_at = due;
        Ok(())
    }

    /// Sends queued work until nothing is left or the socket is full;
    /// whether any byte went out.
    fn write(&mut self) -> Result<bool, String> {
        let mut wrote = false;
        loop {
            if self.out_at == self.out.len() && self.payload_out.is_none() && self.behind.is_empty()
            {
                let rail = self.rail.clone();
                let mut st = rail.lock();
                if st.writer == Writer::Poster {
                    // It pokes the loop when it is done, if work is left.
                    return Ok(wrote);
                }
                self.collect(&mut st)?;
                if self.out.is_empty() && self.payload_out.is_none() && self.behind.is_empty() {
                    st.writer = Writer::Idle;
                    self.blocked = false;
                    return Ok(wrote);
                }
                st.writer = Writer::Loop;
            }
            let progress = |c: &Self| {
                (
                    c.out_at,
                    c.payload_out.as_ref().map(|p| p.at),
                    c.behind.len(),
                    c.behind.front().map(|(_, p)| p.at),
                )
            };
            let before = progress(self);
            let sent = self
                .send()
                .map_err(|e| format!("sending a request failed: {e}"))?;
            wrote |= before != progress(self);
            if let Sent::Blocked = sent {
                self.blocked = true;
                return Ok(wrote);
            }
        }
    }

    /// Takes what waits to be sent into [`Conn::out`]: the carried bytes,
    /// the notifications, then queued requests up to the in-flight bound
    /// (stopping after a WRITE whose payload follows its header; a payload
    /// up to [`SMALL_WRITE`] is copied in behind its header instead).
    fn collect(&mut self, st: &mut State) -> Result<(), String> {
        debug_assert!(self.behind.is_empty(), "collect before the gathered went");
        self.out.clear();
        self.out_at = 0;
        // Payload bytes gathered into `behind` by this call.
        let mut gathered = 0;
        self.out.append(&mut st.carry);
        if !st.notes.is_empty() && st.in_flight.is_empty() && st.unanswered == 0 {
            // Nothing was awaited: the answers' clock starts now.
            st.last_progress = Instant::now();
        }
        for note in st.notes.drain(..) {
            self.out.extend_from_slice(&note);
            st.unanswered += 1;
        }
        while st.in_flight.len() < self.rail.max_in_flight && self.out.len() < GATHER {
            let Some(next) = st.queue.front() else {
                break;
            };
            let len = next.item.len as usize;
            let large = next.item.op == Op::Write && len > SMALL_WRITE;
            let joins = self.gathers
                && len <= GATHER_WRITE
                && self.behind.len() < GATHER_WRITES
                && gathered + len <= GATHER_WRITE_BYTES;
            if large && !self.behind.is_empty() && !joins {
                // Goes alone once the gathered ones went.
                break;
            }
            let Some(job) = st.queue.pop_front() else {
                break;
            };
            request_frame(&job)
                .encode(&mut self.out)
                .map_err(|e| format!("sending a request failed: {e}"))?;
            let write = job.item.op == Op::Write;
            if write {
                let it = &job.item;
                let len = it.len as usize;
                let at = usize::try_from(it.local_offset)
                    .map_err(|_| "sending a request failed: local offset overflows usize")?;
                if len <= SMALL_WRITE {
                    // Copied behind its header: gathered with the requests
                    // around it into one `send`.
                    let from = self.out.len();
                    self.out.resize(from + len, 0);
                    job.local
                        .read_at(at, &mut self.out[from..])
                        .map_err(|e| format!("sending a request failed: {e}"))?;
                    st.in_flight.push_back(job);
                    continue;
                }
                job.local
                    .check(at, len)
                    .map_err(|e| format!("sending a request failed: {e}"))?;
                if joins {
                    // Sent behind its header with the requests around it.
                    gathered += len;
                    self.behind.push_back((
                        self.out.len(),
                        PayloadOut {
                            mem: job.local.clone(),
                            at,
                            end: at + len,
                        },
                    ));
                    st.in_flight.push_back(job);
                    continue;
                }
                self.payload_out = Some(PayloadOut {
                    mem: job.local.clone(),
                    at,
                    end: at + len,
                });
            }
            st.in_flight.push_back(job);
            if write {
                break;
            }
        }
        Ok(())
    }

    /// Sends what [`Conn::out`] and [`Conn::payload_out`] hold, as far as
    /// the socket takes it.
    fn send(&mut self) -> std::io::Result<Sent> {
        use rustix::net::SendFlags;
        if !self.behind.is_empty() {
            return self.send_gathered();
        }
        loop {
            let head = &self.out[self.out_at..];
            let r = match &mut self.payload_out {
                None if head.is_empty() => {
                    self.out.clear();
                    self.out_at = 0;
                    return Ok(Sent::All);
                }
                None => rustix::net::send(self.stream.as_fd(), head, SendFlags::NOSIGNAL)
                    .map_err(std::io::Error::from),
                Some(p) if head.is_empty() && p.at == p.end => {
                    self.payload_out = None;
                    self.out.clear();
                    self.out_at = 0;
                    return Ok(Sent::All);
                }
                // `sendfile` only while payload bytes are left: a header
                // sent with MSG_MORE and nothing after it would wait.
                Some(p) => match p.mem.memfd().filter(|_| self.zero_copy && p.at < p.end) {
                    Some(_) if !head.is_empty() => rustix::net::send(
                        self.stream.as_fd(),
                        head,
                        SendFlags::NOSIGNAL | SendFlags::MORE,
                    )
                    .map_err(std::io::Error::from),
                    Some(fd) => {
                        let mut off = p.at as u64;
                        rustix::fs::sendfile(self.stream.as_fd(), fd, Some(&mut off), p.end - p.at)
                            .map_err(std::io::Error::from)
                    }
                    None => p
                        .mem
                        .send_to(self.stream.as_fd(), head, p.at, p.end - p.at, false),
                },
            };
            match r {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    let from_head = n.min(self.out.len() - self.out_at);
                    self.out_at += from_head;
                    if let Some(p) = &mut self.payload_out {
                        p.at += n - from_head;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Sent::Blocked),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends [`Conn::out`] with the WRITE payloads gathered behind their
    /// headers ([`Conn::behind`]), in `sendmsg` calls from the mappings,
    /// as far as the socket takes them.
    fn send_gathered(&mut self) -> std::io::Result<Sent> {
        loop {
            let mut pieces = [SendPiece::Bytes(&[]); 2 * GATHER_WRITES + 1];
            let mut from = self.out_at;
            for ((head_end, p), two) in self.behind.iter().zip(pieces.chunks_exact_mut(2)) {
                two[0] = SendPiece::Bytes(&self.out[from..*head_end]);
                two[1] = SendPiece::Range(&p.mem, p.at, p.end - p.at);
                from = *head_end;
            }
            pieces[2 * self.behind.len()] = SendPiece::Bytes(&self.out[from..]);
            let mut n = match HostMemory::send_gathered(self.stream.as_fd(), &pieces, true) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Sent::Blocked),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            while let Some((head_end, p)) = self.behind.front_mut() {
                let head = (*head_end - self.out_at).min(n);
                self.out_at += head;
                n -= head;
                let body = (p.end - p.at).min(n);
                p.at += body;
                n -= body;
                if self.out_at < *head_end || p.at < p.end {
                    break;
                }
                self.behind.pop_front();
            }
            self.out_at += n.min(self.out.len() - self.out_at);
            if self.behind.is_empty() && self.out_at == self.out.len() {
                self.out.clear();
                self.out_at = 0;
                return Ok(Sent::All);
            }
        }
    }

    /// Receives and handles what arrived, until the socket has nothing
    /// more or `budget` received bytes are used up; whether anything
    /// arrived.
    fn read(&mut self, budget: &mut usize) -> Result<bool, String> {
        use std::io::ErrorKind;
        let mut moved = false;
        while *budget > 0 {
            if let Some(p) = &mut self.payload_in {
                if p.at < p.end {
                    match p.mem.recv_from_then(
                        self.stream.as_fd(),
                        p.at,
                        p.end - p.at,
                        self.frames.spare(NEXT_ANSWER),
                        true,
                    ) {
                        Ok(0) => {
                            return Err("receiving read data failed: peer closed the \
                                        connection inside a payload"
                                .into());
                        }
                        Ok(n) => {
                            let to_mem = n.min(p.end - p.at);
                            p.at += to_mem;
                            self.frames.filled(n - to_mem);
                            *budget = budget.saturating_sub(n);
                            moved = true;
                            if p.at < p.end {
                                continue;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            if moved {
                                self.rail.lock().last_progress = Instant::now();
                            }
                            let rest = p.end - p.at;
                            self.mark(receive_mark(true, rest));
                            return Ok(moved);
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => return Err(format!("receiving read data failed: {e}")),
                    }
                }
                let (token, len) = (p.token, p.len);
                self.payload_in = None;
                self.answer(token, SliceStatus::Success);
                self.held.answered(len);
                continue;
            }
            match self.frames.next() {
                Ok(Some(frame)) => self.on_frame(frame)?,
                Ok(None) => match self.frames.fill(&self.stream, true) {
                    Ok(0) => return Err("connection lost: peer closed the connection".into()),
                    Ok(n) => {
                        *budget = budget.saturating_sub(n);
                        moved = true;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        // The next frame's first bytes wake the loop.
                        self.mark(1);
                        return Ok(moved);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("connection lost: {e}")),
                },
                Err(e) => return Err(format!("connection lost: {e}")),
            }
        }
        Ok(moved)
    }

    /// Sets the socket's receive mark to `mark` unless it is set already;
    /// set only when the loop is about to wait: a READ payload that waits
    /// for its rest asks to be woken once a good part of it is queued
    /// ([`receive_mark`]), a frame that waits for its header by its first
    /// byte. A refusal costs only the wake-ups the mark would have saved.
    fn mark(&mut self, mark: u32) {
        if mark == self.lowat {
            return;
        }
        match orbitte_memory::set_recv_lowat(self.stream.as_fd(), mark) {
            Ok(()) => self.lowat = mark,
            Err(e) => {
                tracing::debug!(rail = self.rail.id.0, error = %e, mark, "cannot set the receive mark")
            }
        }
    }

    /// Handles one frame from the peer.
    fn on_frame(&mut self, frame: Frame) -> Result<(), String> {
        if self.frames.payload_len() != u64::from(frame.payload_len()) {
            return Err(format!(
                "{} announces {} payload bytes in its header and {} in its body",
                frame.frame_type(),
                self.frames.payload_len(),
                frame.payload_len()
            ));
        }
        let (request_id, status, length, op) = match &frame {
            Frame::ReadResponse(r) => (r.request_id, r.status, r.length, Op::Read),
            Frame::WriteResponse(w) => (w.request_id, w.status, w.length, Op::Write),
            Frame::SegmentPublication(p) => {
                (self.on_segment)(SegmentUpdate::Published(p.clone()));
                return Ok(());
            }
            Frame::SegmentRetire(r) => {
                (self.on_segment)(SegmentUpdate::Retired(r.clone()));
                return Ok(());
            }
            Frame::NotificationAnswer(answer) => {
                {
                    let mut st = self.rail.lock();
                    st.unanswered = st.unanswered.saturating_sub(1);
                    st.last_progress = Instant::now();
                }
                self.held.events.push(TransportEvent::NotificationAnswered {
                    rail: self.rail.id,
                    answer: *answer,
                });
                return Ok(());
            }
            Frame::Error(e) => {
                return Err(format!("peer sent error {}: {}", e.code, e.message));
            }
            Frame::Goodbye(g) => {
                return Err(format!("peer said goodbye ({}: {})", g.reason, g.message));
            }
            other => return Err(format!("unexpected {} from the peer", other.frame_type())),
        };
        let (token, len, local_offset, local) = {
            let mut st = self.rail.lock();
            let Some(job) = st.in_flight.iter().find(|j| {
                j.answered.is_none() && j.item.token.0 == request_id.0 && j.item.op == op
            }) else {
                return Err(format!(
                    "answer for request {} ({op:?}) matches no request in flight",
                    request_id.0
                ));
            };
            let found = (
                job.item.token,
                job.item.len,
                job.item.local_offset,
                job.local.clone(),
            );
            st.last_progress = Instant::now();
            found
        };
        let mut outcome = completion(status);
        if op == Op::Read && status.is_ok() {
            if length != len {
                let msg = format!("read answer of {length} bytes for a {len}-byte request");
                self.answer(
                    token,
                    SliceStatus::Failed(SliceFailure::Completion {
                        status: msg.clone().into(),
                        code: 0,
                    }),
                );
                return Err(msg);
            }
            let offset = usize::try_from(local_offset)
                .map_err(|_| "receiving read data failed: local offset overflows usize")?;
            let n = {
                let buffered = self.frames.take_payload(len as usize);
                local
                    .write_at(offset, buffered)
                    .map_err(|e| format!("receiving read data failed: {e}"))?;
                buffered.len()
            };
            self.frames.payload_received((len as usize - n) as u64);
            // Completed once the rest arrived (at once when nothing is left).
            self.payload_in = Some(PayloadIn {
                token,
                mem: local,
                at: offset + n,
                end: offset + len as usize,
                len,
            });
            return Ok(());
        }
        if op == Op::Write && status.is_ok() && length != len {
            outcome = SliceStatus::Failed(SliceFailure::Completion {
                status: format!("write answer of {length} bytes for a {len}-byte request").into(),
                code: 0,
            });
        }
        self.answer(token, outcome);
        self.held.answered(len);
        Ok(())
    }

    /// Records the outcome of the answer to `token` and moves every
    /// answered job at the front of the in-flight list, in the order sent,
    /// into the held completions.
    fn answer(&mut self, token: SliceToken, status: SliceStatus) {
        let mut st = self.rail.lock();
        if let Some(j) = st
            .in_flight
            .iter_mut()
            .find(|j| j.item.token == token && j.answered.is_none())
        {
            j.answered = Some(status);
            st.last_progress = Instant::now();
        }
        while let Some(front) = st.in_flight.front_mut() {
            let Some(status) = front.answered.take() else {
                break;
            };
            let token = front.item.token;
            st.in_flight.pop_front();
            self.held.events.push(TransportEvent::Completed {
                rail: self.rail.id,
                token,
                status,
                released: true,
            });
        }
    }

    /// Reports the rail down: a `RailDown`, then every outstanding item.
    /// The loop is the only thread that touches local memory, and it
    /// stopped.
    fn take_down(mut self: Box<Self>, why: &str) {
        self.rail.fail(why, false);
        let (in_flight, queued, reason) = {
            let mut st = self.rail.lock();
            let reason = st.down.clone().unwrap_or_else(|| why.into());
            (
                std::mem::take(&mut st.in_flight),
                std::mem::take(&mut st.queue),
                reason,
            )
        };
        let rail = self.rail.id;
        let events = &mut self.held.events;
        events.push(TransportEvent::RailDown {
            rail,
            reason: reason.clone(),
        });
        // In the order sent; an answered one keeps its outcome (its bytes
        // arrived), the others failed with the rail.
        for j in in_flight {
            events.push(TransportEvent::Completed {
                rail,
                token: j.item.token,
                status: j
                    .answered
                    .unwrap_or_else(|| SliceStatus::Failed(SliceFailure::RailDown(reason.clone()))),
                released: true,
            });
        }
        for j in queued {
            events.push(TransportEvent::Completed {
                rail,
                token: j.item.token,
                status: SliceStatus::Failed(SliceFailure::Flushed),
                released: true,
            });
        }
        self.held.hand_over();
    }
}

impl Watched for Conn {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn interest(&self) -> Interest {
        if self.blocked {
            Interest::READABLE.add(Interest::WRITABLE)
        } else {
            Interest::READABLE
        }
    }

    fn ready(self: Box<Self>, now: Instant) -> Next {
        self.turn(now, false)
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        self.turn(now, true)
    }

    fn abandoned(self: Box<Self>, why: &str) {
        self.take_down(&format!("the rail's i/o threads stopped: {why}"));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::mpsc;

    use orbitte_wire::{FrameHeader, HEADER_LEN, SourceId};

    use super::*;
    use crate::session::MIN_SOCKET_BUFFER;
    use crate::transport::{PeerId, RegistrationId, SliceToken};

    struct NoSink;

    impl EventSink for NoSink {
        fn deliver(&self, events: &mut Vec<TransportEvent>) {
            events.clear();
        }
    }

    fn job(token: u64, op: Op, len: u32, local: &Arc<HostMemory>) -> Job {
        Job {
            item: WorkItem {
                token: SliceToken(token),
                rail: RailId(0),
                op,
                registration: RegistrationId(1),
                local_offset: 0,
                peer: PeerId(1),
                range: crate::transport::RangeId(7),
                remote_offset: token * 16,
                len,
                signaled: true,
            },
            local: local.clone(),
            token: AccessToken(99),
            answered: None,
        }
    }

    /// Each delivery, as it came.
    struct Record(mpsc::Sender<Vec<TransportEvent>>);

    impl EventSink for Record {
        fn deliver(&self, events: &mut Vec<TransportEvent>) {
            let _ = self.0.send(std::mem::take(events));
        }
    }

    /// The READ answer to request `token` with `payload`.
    fn read_answer(token: u64, payload: &[u8], out: &mut Vec<u8>) {
        Frame::ReadResponse(orbitte_wire::ReadResponse {
            request_id: RequestId(token),
            range_id: RangeId(7),
            offset: token * 16,
            status: Status::OK,
            length: payload.len() as u32,
        })
        .encode(out)
        .unwrap();
        out.extend_from_slice(payload);
    }

    fn initiator_config() -> SessionConfig {
        SessionConfig::new(
            SourceId::new("initiator").unwrap(),
            orbitte_wire::Epoch::new(1).unwrap(),
        )
    }

    fn start(
        stream: TcpStream,
        cfg: &SessionConfig,
        sink: Arc<dyn EventSink>,
        pool: &Arc<IoPool>,
    ) -> Arc<Rail> {
        Rail::start(
            RailId(0),
            orbitte_wire::SessionId(1),
            stream,
            cfg,
            sink,
            Arc::new(|_| {}),
            pool,
        )
        .unwrap()
    }

    /// A rail with `io_timeout` whose events are recorded, its peer's end
    /// of the connection (reads bounded by 20 s), the events, and the pool
    /// its loop runs on.
    fn recorded_rail(
        io_timeout: Duration,
    ) -> (
        Arc<Rail>,
        TcpStream,
        mpsc::Receiver<Vec<TransportEvent>>,
        Arc<IoPool>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut cfg = initiator_config();
        cfg.io_timeout = io_timeout;
        let (tx, deliveries) = mpsc::channel();
        let pool = IoPool::new(1, "test").unwrap();
        let rail = start(ours, &cfg, Arc::new(Record(tx)), &pool);
        (rail, peer, deliveries, pool)
    }

    /// A notification's answer is awaited like a request's: it is
    /// delivered when it comes, and a peer that takes a notification and
    /// never answers it takes the rail down within `io_timeout` (the
    /// engine then reports the notification unconfirmed).
    #[test]
    fn a_notification_unanswered_within_io_timeout_takes_the_rail_down() {
        let (rail, mut peer, deliveries, _pool) = recorded_rail(Duration::from_millis(500));
        let note = |id| -> Arc<[u8]> {
            Frame::Notification(orbitte_wire::Notification {
                notification_id: id,
                payload: vec![id as u8; 8],
            })
            .to_bytes()
            .unwrap()
            .into()
        };
        // Answered: the answer is delivered, the rail stays up past
        // io_timeout.
        rail.push_note(note(1)).unwrap();
        assert!(
            matches!(next_request(&mut peer).0, Frame::Notification(n) if n.notification_id == 1)
        );
        let answer = orbitte_wire::NotificationAnswer {
            notification_id: 1,
            verdict: orbitte_wire::NotificationVerdict::INBOX_FULL,
            limit: 1024,
        };
        std::io::Write::write_all(
            &mut peer,
            &Frame::NotificationAnswer(answer).to_bytes().unwrap(),
        )
        .unwrap();
        let d = deliveries.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(
            d,
            vec![TransportEvent::NotificationAnswered {
                rail: RailId(0),
                answer
            }]
        );
        std::thread::sleep(Duration::from_millis(1200));
        assert!(!rail.is_down(), "nothing is awaited");
        // Taken and never answered.
        let sent = Instant::now();
        rail.push_note(note(2)).unwrap();
        assert!(
            matches!(next_request(&mut peer).0, Frame::Notification(n) if n.notification_id == 2)
        );
        let d = deliveries.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            matches!(&d[..], [TransportEvent::RailDown { reason, .. }] if reason.contains("no answer")),
            "{d:?}"
        );
        assert!(sent.elapsed() >= Duration::from_millis(500));
        drop(peer);
    }

    /// Completions reach the engine before the reader waits, also inside
    /// a payload: a peer answers a READ of 1 MiB and one of 1 KiB whole
    /// and then half of a third answer, and stalls. Both whole answers
    /// are delivered while the rail is up (the 1 MiB one at once, as it
    /// covers `ANSWER_BATCH`), the third fails when the rail gives up.
    #[test]
    fn answers_that_arrived_are_delivered_before_the_reader_waits_in_a_payload() {
        let (rail, mut peer, deliveries, _pool) = recorded_rail(Duration::from_secs(2));
        let big = ANSWER_BATCH as u32;
        let local = HostMemory::alloc(big as usize + 4096).unwrap();
        let mut jobs = vec![
            job(0, Op::Read, big, &local),
            job(1, Op::Read, 1024, &local),
            job(2, Op::Read, 1024, &local),
        ];
        jobs[1].item.local_offset = u64::from(big);
        jobs[2].item.local_offset = u64::from(big) + 2048;
        rail.push(jobs.into_iter()).unwrap();
        for want in 0..3u64 {
            match next_request(&mut peer).0 {
                Frame::ReadRequest(r) => assert_eq!(r.request_id.0, want),
                other => panic!("request {want}: unexpected {}", other.frame_type()),
            }
        }
        let mut out = Vec::new();
        read_answer(0, &vec![0x11; big as usize], &mut out);
        read_answer(1, &[0x22; 1024], &mut out);
        read_answer(2, &[0x33; 1024], &mut out);
        out.truncate(out.len() - 512);
        std::io::Write::write_all(&mut peer, &out).unwrap();

        let completed = |d: &[TransportEvent]| -> Vec<(u64, SliceStatus)> {
            d.iter()
                .filter_map(|e| match e {
                    TransportEvent::Completed { token, status, .. } => {
                        Some((token.0, status.clone()))
                    }
                    _ => None,
                })
                .collect()
        };
        let mut before = Vec::new();
        let down = loop {
            let d = deliveries
                .recv_timeout(Duration::from_secs(20))
                .expect("the rail reports within its io_timeout");
            if d.iter()
                .any(|e| matches!(e, TransportEvent::RailDown { .. }))
            {
                break d;
            }
            before.push(completed(&d));
        };
        assert_eq!(
            before.concat(),
            vec![(0, SliceStatus::Success), (1, SliceStatus::Success)],
            "whole answers are delivered while the rail is up"
        );
        assert_eq!(
            before[0],
            vec![(0, SliceStatus::Success)],
            "an answer of ANSWER_BATCH bytes is delivered at once"
        );
        let rest = completed(&down);
        assert!(
            matches!(
                rest.as_slice(),
                [(2, SliceStatus::Failed(SliceFailure::RailDown(_)))]
            ),
            "{rest:?}"
        );
        assert_eq!(
            local.to_vec(0, big as usize).unwrap(),
            vec![0x11; big as usize]
        );
        assert_eq!(local.to_vec(big as usize, 1024).unwrap(), vec![0x22; 1024]);
        drop(peer);
    }

    /// A READ payload that comes in pieces below the receive mark wakes no
    /// one, yet each piece is progress: an answer that takes longer than
    /// `io_timeout` in all, its pieces closer together than that, arrives
    /// whole with the rail up, and every byte lands.
    #[test]
    fn a_payload_below_the_receive_mark_is_progress_within_io_timeout() {
        let io_timeout = Duration::from_millis(100);
        let (rail, mut peer, deliveries, _pool) = recorded_rail(io_timeout);
        // Large enough that the mark (256 KiB) lies well above loopback's
        // segment size, where the kernel would wake the loop anyway.
        let len = 1 << 20;
        let local = HostMemory::alloc(len).unwrap();
        rail.push(std::iter::once(job(0, Op::Read, len as u32, &local)))
            .unwrap();
        assert!(matches!(next_request(&mut peer).0, Frame::ReadRequest(_)));
        let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        read_answer(0, &payload, &mut out);
        let started = Instant::now();
        // The header, then 8 KiB every 60 ms, ten times (far below the
        // mark, never a gap of io_timeout), then the rest at once.
        let (first, rest) = out.split_at(NEXT_ANSWER + (8 << 10));
        let (pieces, last) = rest.split_at(10 * (8 << 10));
        let sent = (|| {
            std::io::Write::write_all(&mut peer, first)?;
            for piece in pieces.chunks(8 << 10) {
                std::thread::sleep(Duration::from_millis(60));
                std::io::Write::write_all(&mut peer, piece)?;
            }
            std::io::Write::write_all(&mut peer, last)
        })();
        assert!(
            sent.is_ok() && !rail.is_down(),
            "the rail closed while the payload came ({sent:?})"
        );
        assert!(
            started.elapsed() > 5 * io_timeout,
            "the answer must take longer than io_timeout in all"
        );
        let status = loop {
            let d = deliveries
                .recv_timeout(Duration::from_secs(5))
                .expect("the answer completes");
            assert!(
                !d.iter()
                    .any(|e| matches!(e, TransportEvent::RailDown { .. })),
                "the rail went down while the payload came: {d:?}"
            );
            let done = d.iter().find_map(|e| match e {
                TransportEvent::Completed { token, status, .. } if token.0 == 0 => {
                    Some(status.clone())
                }
                _ => None,
            });
            if let Some(status) = done {
                break status;
            }
        };
        assert_eq!(status, SliceStatus::Success);
        assert!(!rail.is_down());
        assert_eq!(local.to_vec(0, len).unwrap(), payload);
        drop(peer);
    }

    /// Reads one request frame (and a WRITE's payload) from the peer's end.
    fn next_request(peer: &mut TcpStream) -> (Frame, Vec<u8>) {
        let mut head = [0u8; HEADER_LEN];
        peer.read_exact(&mut head).unwrap();
        let h = FrameHeader::decode(&head).unwrap();
        let mut body = vec![0u8; h.fixed_len()];
        peer.read_exact(&mut body).unwrap();
        let frame = orbitte_wire::decode_body(&h, &body).unwrap();
        let mut payload = Vec::new();
        if let Frame::WriteRequest(w) = &frame {
            payload.resize(w.length as usize, 0);
            peer.read_exact(&mut payload).unwrap();
        }
        (frame, payload)
    }

    /// A rail's socket gets `unsent_limit` as its unsent mark; `None`
    /// leaves it unset (0: the kernel's `net.ipv4.tcp_notsent_lowat`).
    #[test]
    fn a_rails_socket_has_the_unsent_limit_as_its_mark() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let pool = IoPool::new(1, "test").unwrap();
        for (limit, want) in [
            (Some(crate::session::DEFAULT_UNSENT_LIMIT), 128 << 10),
            (Some(4096), 4096),
            (None, 0),
        ] {
            let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (_peer, _) = l.accept().unwrap();
            let mut cfg = initiator_config();
            cfg.unsent_limit = limit;
            let rail = start(ours, &cfg, Arc::new(NoSink), &pool);
            let got = orbitte_memory::notsent_lowat(rail.stream.as_fd()).unwrap();
            assert_eq!(got, want, "unsent_limit {limit:?}");
            rail.fail("test over", true);
        }
    }

    /// A post of READs never waits for the socket: with a peer that reads
    /// nothing and the smallest fixed buffers the engine allows
    /// (`MIN_SOCKET_BUFFER`, doubled by the kernel), 30,000 requests
    /// (about 1.4 MiB) do not fit; the post returns anyway and the rest is
    /// carried. The writer sends the carried bytes first, then a WRITE and
    /// more READs queued behind them: the peer reads every request once,
    /// whole and in order.
    #[test]
    fn a_post_of_reads_never_waits_and_what_the_socket_refused_goes_first() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        // Fixed buffers (no autotuning): loopback otherwise takes megabytes
        // that nobody reads.
        size_socket_buffers(&peer, Some(MIN_SOCKET_BUFFER));
        // A request that never comes fails the test instead of hanging it.
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut cfg = initiator_config();
        cfg.max_in_flight_per_connection = 40_000;
        cfg.socket_buffer = Some(MIN_SOCKET_BUFFER);
        let pool = IoPool::new(1, "test").unwrap();
        let rail = start(ours, &cfg, Arc::new(NoSink), &pool);
        let local = HostMemory::alloc(4096).unwrap();
        local.fill(0, 4096, 0xab).unwrap();

        // The post runs on another thread so that a post that waited for
        // the peer would fail the test instead of hanging it.
        let (done, posted) = mpsc::channel();
        let (r, l2) = (rail.clone(), local.clone());
        std::thread::spawn(move || {
            let jobs = (0..30_000).map(|t| job(t, Op::Read, 16, &l2));
            done.send(r.push(jobs)).unwrap();
        });
        posted
            .recv_timeout(Duration::from_secs(20))
            .expect("a post of READs waited for a peer that reads nothing")
            .unwrap();
        let carried = rail.state.lock().unwrap().carried;
        assert!(carried > 0, "the socket took 1.4 MiB of requests at once");

        // Behind the carried bytes: a WRITE and more READs.
        rail.push(std::iter::once(job(30_000, Op::Write, 4096, &local)))
            .unwrap();
        rail.push((30_001..30_101).map(|t| job(t, Op::Read, 16, &local)))
            .unwrap();

        for want in 0..30_101u64 {
            let (frame, payload) = next_request(&mut peer);
            match frame {
                Frame::ReadRequest(r) => {
                    assert_ne!(want, 30_000, "the WRITE was overtaken");
                    assert_eq!(r.request_id.0, want);
                    assert_eq!(r.offset, want * 16);
                    assert_eq!(r.length, 16);
                }
                Frame::WriteRequest(w) => {
                    assert_eq!(want, 30_000, "the WRITE came at {want}");
                    assert_eq!(w.request_id.0, want);
                    assert_eq!(payload, vec![0xab; 4096]);
                }
                other => panic!("request {want}: unexpected {}", other.frame_type()),
            }
        }
        assert!(rail.state.lock().unwrap().carry.is_empty());
        rail.fail("test over", true);
    }

    /// Small WRITE payloads travel copied behind their headers, gathered
    /// with the requests around them; larger ones follow their header from
    /// the memory. Either way the peer reads every request whole, in order,
    /// with its own bytes.
    #[test]
    fn small_and_large_writes_arrive_whole_and_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut cfg = initiator_config();
        cfg.max_in_flight_per_connection = 1000;
        let pool = IoPool::new(1, "test").unwrap();
        let rail = start(ours, &cfg, Arc::new(NoSink), &pool);
        // Up to 64 KiB a WRITE to this host goes gathered, above it alone.
        let sizes = [
            1u32,
            4096,
            16 << 10,
            (16 << 10) + 1,
            64 << 10,
            100,
            (64 << 10) + 1,
            0,
            300 << 10,
            8192,
        ];
        let mut memories = Vec::new();
        let mut jobs = Vec::new();
        for t in 0..200u64 {
            let len = sizes[t as usize % sizes.len()];
            let mem = HostMemory::alloc((len as usize).max(1)).unwrap();
            let bytes: Vec<u8> = (0..len)
                .map(|i| (t as u8).wrapping_mul(31) ^ i as u8)
                .collect();
            mem.write_at(0, &bytes).unwrap();
            let op = if t % 5 == 3 { Op::Read } else { Op::Write };
            jobs.push(job(t, op, len, &mem));
            memories.push((op, bytes));
        }
        // Three posts, so the loop finds some queued behind others.
        let mut it = jobs.into_iter();
        for n in [1, 120, 79] {
            rail.push(it.by_ref().take(n)).unwrap();
        }
        for (want, (op, bytes)) in memories.iter().enumerate() {
            let (frame, payload) = next_request(&mut peer);
            match (frame, op) {
                (Frame::WriteRequest(w), Op::Write) => {
                    assert_eq!(w.request_id.0, want as u64, "out of order");
                    assert_eq!(&payload, bytes, "request {want}: its payload");
                }
                (Frame::ReadRequest(r), Op::Read) => assert_eq!(r.request_id.0, want as u64),
                (other, _) => panic!("request {want}: unexpected {}", other.frame_type()),
            }
        }
        rail.fail("test over", true);
    }
}
