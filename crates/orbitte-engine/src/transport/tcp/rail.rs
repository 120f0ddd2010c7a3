//! One tcp rail: one connection to a peer, a writer thread that pipelines
//! requests (up to the in-flight bound) and a reader thread that matches
//! answers, moves READ payloads into local memory and reports completions.
//!
//! Neither thread outlives a quiet spell: the writer ends once nothing has
//! been queued for [`WRITER_IDLE`] (the next post that leaves work for it
//! starts a new one), and the reader, once nothing has been in flight for
//! [`PARK_AFTER`] and no byte came for its poll interval, parks the rail's socket on the
//! transport's I/O pool ([`crate::io_pool`]) and ends; the first byte
//! from the peer (an answer, a publication, its close, or our own
//! shutdown of the socket) starts a new reader. While parked, the loop
//! checks every poll interval whether the rail went down or requests
//! posted since have had no answer for `io_timeout`, and starts the reader
//! to take the rail down. So an idle rail holds no thread.
//!
//! The writer sends everything queued at once: the requests it takes in one
//! go share system calls (READ requests and notifications are gathered into
//! one `send`, a WRITE's header goes out in the `sendmsg` of its payload).
//! While requests are in flight it is woken only once answers bring them
//! down to half the bound, so a long run of requests costs one wakeup and
//! one `send` per half window instead of one per answer. A run of READs
//! posted while nothing is being written skips the writer: the posting
//! thread sends their requests itself, without waiting for the socket, and
//! leaves what the socket did not take to the writer, which sends it before
//! anything else (one thread writes at a time: `State::sending`).
//! The reader receives through a small buffer ([`FrameBuffer`]), so one
//! `recv` brings every answer that waits, and it hands every answer of such
//! a burst to the engine in one delivery, just before it would wait for
//! more (for the next frame, or inside a READ payload), and in a stream
//! that never pauses once the answers cover [`ANSWER_BATCH`] bytes: a
//! completion never waits on the socket, so a request that times out
//! while its rail is stalled counts every slice answered before the
//! stall. A READ's payload goes from the socket straight into the local
//! range, and the next answer's header comes in the same `recvmsg`: one
//! system call per answer in a stream of READ answers. Socket timeouts are
//! set once per connection.
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
//! When the rail goes down (socket error, peer error frame, no answer within
//! `io_timeout` while requests are outstanding, or a flush), the reader
//! shuts the socket, waits for the writer to stop touching local memory,
//! then reports a `RailDown` and every outstanding item as failed with
//! `released: true`: nothing reads or writes their bytes any more.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use orbitte_memory::HostMemory;
use orbitte_wire::{AccessToken, Frame, RangeId, ReadRequest, RequestId, Status, WriteRequest};

use super::payload::{PayloadIo, send_all, send_ready};
use super::socket::{ANSWER_BATCH, size_socket_buffers};
use crate::io_pool::{IoPool, Next, PARK_AFTER, Watched, spawn_with};
use crate::session::SessionConfig;
use crate::session::io::FrameBuffer;
use crate::transport::{
    EventSink, Op, RailId, SliceFailure, SliceStatus, TransportEvent, WorkItem,
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

#[derive(Debug)]
struct State {
    queue: VecDeque<Job>,
    in_flight: VecDeque<Job>,
    /// Encoded `notification` frames to send (no answer comes for them).
    notes: VecDeque<Arc<[u8]>>,
    /// Why the rail is down; `None` while up.
    down: Option<Arc<str>>,
    /// A thread is writing on the socket: the writer, or a poster sending
    /// its READ requests itself. Only the thread that set it writes.
    sending: bool,
    /// Bytes of requests a poster began to send but the socket did not
    /// take without waiting: the writer sends them before anything else.
    /// Empty, it keeps its allocation for the next poster's requests.
    carry: Vec<u8>,
    /// Bytes left to the writer that way, in all.
    carried: u64,
    /// A writer thread runs (or is being started). The writer ends, and
    /// clears it, once the rail is down or nothing was queued for
    /// [`WRITER_IDLE`]; while jobs, carried bytes or notes wait, one runs.
    writer: bool,
    last_progress: Instant,
}

/// How long a writer with nothing to send waits for work before it ends.
const WRITER_IDLE: Duration = PARK_AFTER;

#[derive(Debug)]
pub(crate) struct Rail {
    pub(crate) id: RailId,
    pub(crate) session: orbitte_wire::SessionId,
    stream: TcpStream,
    state: Mutex<State>,
    cv: Condvar,
    max_in_flight: usize,
    zero_copy: bool,
}

impl Rail {
    /// Starts the reader of a rail over an established session (the
    /// writer starts with the first work for it). Its threads park the
    /// idle rail on `pool`; with the pool gone they stay up instead.
    pub(crate) fn start(
        id: RailId,
        session: orbitte_wire::SessionId,
        stream: TcpStream,
        cfg: &SessionConfig,
        sink: Arc<dyn EventSink>,
        on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
        pool: Weak<IoPool>,
    ) -> std::io::Result<Arc<Self>> {
        let rail = Arc::new(Self {
            id,
            session,
            stream: stream.try_clone()?,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: VecDeque::new(),
                notes: VecDeque::new(),
                down: None,
                sending: false,
                carry: Vec::new(),
                carried: 0,
                writer: false,
                last_progress: Instant::now(),
            }),
            cv: Condvar::new(),
            max_in_flight: cfg.max_in_flight_per_connection.max(1) as usize,
            zero_copy: cfg.zero_copy,
        });
        size_socket_buffers(&stream, cfg.socket_buffer);
        // The writer sends on the rail's own handle of the socket.
        stream.set_write_timeout(Some(cfg.io_timeout))?;
        let r = Reader {
            rail: rail.clone(),
            stream,
            frame_timeout: cfg.frame_timeout,
            io_timeout: cfg.io_timeout,
            sink,
            on_segment,
            pool,
        };
        std::thread::Builder::new()
            .name(format!("orbitte-tcp-r{}", id.0))
            .spawn(move || reader(r))?;
        Ok(rail)
    }

    /// Wakes the writer for work just queued (`notify`: whether a running
    /// writer must be woken for it), or, when none runs and jobs, carried
    /// bytes or notes wait, marks one as started: the caller then calls
    /// [`start_writer`](Self::start_writer) after dropping the lock.
    fn wake_writer(&self, st: &mut State, notify: bool) -> bool {
        if st.writer {
            if notify {
                self.cv.notify_all();
            }
            return false;
        }
        if st.down.is_some() || (st.queue.is_empty() && st.carry.is_empty() && st.notes.is_empty())
        {
            return false;
        }
        st.writer = true;
        true
    }

    /// Starts the writer thread [`wake_writer`](Self::wake_writer) asked
    /// for; a rail whose writer cannot start goes down.
    fn start_writer(self: &Arc<Self>) {
        let r = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("orbitte-tcp-w{}", self.id.0))
            .spawn(move || writer(r));
        if let Err(e) = spawned {
            self.state.lock().unwrap_or_else(|p| p.into_inner()).writer = false;
            self.cv.notify_all();
            self.fail(
                &format!("cannot start the rail's writer thread: {e}"),
                false,
            );
        }
    }

    /// Queues jobs; `Err` when the rail is down (nothing queued).
    ///
    /// When nothing is being written and every job queued is a READ, the
    /// calling thread sends the requests itself (a few dozen bytes each, in
    /// one `send`) instead of waking the writer: a batch of READs then
    /// costs no thread switch before its requests are on the wire. It never
    /// waits for the socket: what its buffer does not take at once is left
    /// to the writer. WRITEs, whose payloads may be large, always go
    /// through the writer.
    pub(crate) fn push(self: &Arc<Self>, jobs: impl Iterator<Item = Job>) -> Result<(), Arc<str>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        if st.in_flight.is_empty() && st.queue.is_empty() {
            st.last_progress = Instant::now();
        }
        st.queue.extend(jobs);
        let here = !st.sending
            && st.carry.is_empty()
            && st.notes.is_empty()
            && st.in_flight.len() < self.max_in_flight
            && st.queue.iter().all(|j| j.item.op == Op::Read);
        if !here {
            // Above the low-water mark the reader wakes the writer once
            // answers bring the in-flight count down to it.
            let notify = st.in_flight.len() <= self.low_water();
            if self.wake_writer(&mut st, notify) {
                drop(st);
                self.start_writer();
            }
            return Ok(());
        }
        st.sending = true;
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
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.sending = false;
        match sent {
            Err(e) => {
                drop(st);
                self.fail(&format!("sending a request failed: {e}"), false);
                // The jobs are in flight: the reader reports them failed.
                return Ok(());
            }
            Ok(n) if n < out.len() => {
                out.drain(..n);
                tracing::trace!(
                    rail = self.id.0,
                    bytes = out.len(),
                    "the socket is full: the writer sends the rest of the requests"
                );
                st.carried += out.len() as u64;
                st.carry = out;
                if self.wake_writer(&mut st, true) {
                    drop(st);
                    self.start_writer();
                }
            }
            Ok(_) => {
                out.clear();
                st.carry = out;
                let notify = !st.notes.is_empty()
                    || (!st.queue.is_empty() && st.in_flight.len() <= self.low_water());
                if self.wake_writer(&mut st, notify) {
                    drop(st);
                    self.start_writer();
                }
            }
        }
        Ok(())
    }

    /// In-flight requests at or below which the writer is woken to send
    /// queued ones: half the bound, so that it sends a run of requests per
    /// wakeup (one system call) instead of one per answer, while the other
    /// half keeps the peer busy.
    fn low_water(&self) -> usize {
        self.max_in_flight / 2
    }

    /// Queues an encoded `notification` frame; `Err` when the rail is down.
    pub(crate) fn push_note(self: &Arc<Self>, frame: Arc<[u8]>) -> Result<(), Arc<str>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        st.notes.push_back(frame);
        if self.wake_writer(&mut st, true) {
            drop(st);
            self.start_writer();
        }
        Ok(())
    }

    /// Takes the rail down (idempotent): the reader then reports everything.
    /// A rail that goes down unasked is a warning; one closed or flushed on
    /// request (`deliberate`) is logged at debug.
    pub(crate) fn fail(&self, why: &str, deliberate: bool) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.down.is_none() {
            if deliberate {
                tracing::debug!(rail = self.id.0, reason = why, "tcp rail closed");
            } else {
                tracing::warn!(rail = self.id.0, reason = why, "tcp rail down");
            }
            st.down = Some(why.into());
        }
        drop(st);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.cv.notify_all();
    }

    pub(crate) fn is_down(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .down
            .is_some()
    }
}

fn writer(rail: Arc<Rail>) {
    let stream = &rail.stream;
    let mut io = PayloadIo::new(rail.zero_copy);
    let mut out = Vec::with_capacity(1024);
    let mut jobs = Vec::new();
    let mut sent = false;
    loop {
        {
            let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
            if std::mem::take(&mut sent) {
                st.sending = false;
            }
            loop {
                if st.down.is_some() {
                    st.writer = false;
                    rail.cv.notify_all();
                    return;
                }
                if !st.sending
                    && (!st.carry.is_empty()
                        || !st.notes.is_empty()
                        || (!st.queue.is_empty() && st.in_flight.len() < rail.max_in_flight))
                {
                    break;
                }
                let (g, waited) = rail
                    .cv
                    .wait_timeout(st, WRITER_IDLE)
                    .unwrap_or_else(|p| p.into_inner());
                st = g;
                if waited.timed_out()
                    && !st.sending
                    && st.queue.is_empty()
                    && st.carry.is_empty()
                    && st.notes.is_empty()
                {
                    // Idle: the next work queued starts a writer again.
                    st.writer = false;
                    rail.cv.notify_all();
                    return;
                }
            }
            st.sending = true;
            out.clear();
            out.append(&mut st.carry);
            for note in st.notes.drain(..) {
                out.extend_from_slice(&note);
            }
            while st.in_flight.len() < rail.max_in_flight {
                let Some(job) = st.queue.pop_front() else {
                    break;
                };
                st.in_flight.push_back(job.clone());
                jobs.push(job);
            }
        }
        let r = send_jobs(stream, &mut io, &mut out, &mut jobs);
        jobs.clear();
        sent = true;
        if let Err(e) = r {
            rail.fail(&format!("sending a request failed: {e}"), false);
            let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
            st.writer = false;
            rail.cv.notify_all();
            return;
        }
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

/// Sends the frames in `out` and the requests of `jobs` (a WRITE's header
/// and payload in one `sendmsg`, with the frames gathered before it).
fn send_jobs(
    stream: &TcpStream,
    io: &mut PayloadIo,
    out: &mut Vec<u8>,
    jobs: &mut [Job],
) -> std::io::Result<()> {
    for job in jobs.iter() {
        let it = &job.item;
        request_frame(job)
            .encode(out)
            .map_err(std::io::Error::other)?;
        if it.op == Op::Write {
            io.send(
                stream,
                out,
                &job.local,
                it.local_offset,
                it.len as usize,
                None,
            )?;
            out.clear();
        }
    }
    if !out.is_empty() {
        send_all(stream, out, false, None)?;
    }
    Ok(())
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

/// Completions the reader has not handed to the engine yet, and the
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

/// Receives `len` bytes into `mem` at `offset` straight from the socket,
/// and in the same system calls what follows them into `frames` (up to
/// the next answer's header), from the socket whose receive timeout is the reader's poll
/// interval: it gives up when no byte came for `io_timeout` or the rail
/// went down meanwhile. While completions are `held` it never waits: when
/// no byte is there, it hands them over first (a connection that dies
/// inside this payload keeps the slices answered before it).
fn recv_payload(
    rail: &Rail,
    stream: &TcpStream,
    frames: &mut FrameBuffer,
    mem: &HostMemory,
    (offset, len): (usize, usize),
    io_timeout: Duration,
    held: &mut Held,
) -> Result<(), String> {
    use std::io::ErrorKind;
    use std::os::fd::AsFd;
    let (mut at, end) = (offset, offset + len);
    let mut moved = false;
    let mut last = Instant::now();
    while at < end {
        let holding = !held.events.is_empty();
        match mem.recv_from_then(
            stream.as_fd(),
            at,
            end - at,
            frames.spare(NEXT_ANSWER),
            holding,
        ) {
            Ok(0) => return Err("peer closed the connection inside a payload".into()),
            Ok(n) => {
                let to_mem = n.min(end - at);
                at += to_mem;
                frames.filled(n - to_mem);
                moved = true;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if holding && e.kind() == ErrorKind::WouldBlock => held.hand_over(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if let Some(why) = &rail.state.lock().unwrap_or_else(|p| p.into_inner()).down {
                    return Err(why.to_string());
                }
                if moved {
                    moved = false;
                    last = Instant::now();
                } else if last.elapsed() >= io_timeout {
                    return Err(format!(
                        "no payload byte from the peer within {io_timeout:?}"
                    ));
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// Records the outcome of `job`'s answer and moves every answered job at
/// the front of the in-flight list, in the order sent, into `events`.
fn answer(rail: &Rail, job: &Job, status: SliceStatus, events: &mut Vec<TransportEvent>) {
    let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(j) = st
        .in_flight
        .iter_mut()
        .find(|j| j.item.token == job.item.token && j.answered.is_none())
    {
        j.answered = Some(status);
    }
    while let Some(front) = st.in_flight.front_mut() {
        let Some(status) = front.answered.take() else {
            break;
        };
        let token = front.item.token;
        st.in_flight.pop_front();
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token,
            status,
            released: true,
        });
    }
    // The writer waits for room only while requests are queued; it is
    // woken at the low-water mark (see `Rail::low_water`).
    if !st.queue.is_empty() && st.in_flight.len() <= rail.low_water() {
        rail.cv.notify_all();
    }
}

/// What a rail's reader owns: the socket it receives on, its bounds and
/// where answers go. It moves between the reader threads and the pool
/// (parked).
struct Reader {
    rail: Arc<Rail>,
    stream: TcpStream,
    frame_timeout: Duration,
    io_timeout: Duration,
    sink: Arc<dyn EventSink>,
    on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
    pool: Weak<IoPool>,
}

impl Reader {
    /// The reader's poll interval: how long one receive waits before it
    /// looks at the rail's state (and, parked, how often the loop does).
    fn poll(&self) -> Duration {
        self.io_timeout
            .min(Duration::from_millis(250))
            .max(Duration::from_millis(1))
    }

    /// Whether the rail needs its reader now though nothing arrived: it
    /// went down, or requests have had no answer for `io_timeout`.
    fn due(&self) -> bool {
        let st = self.rail.state.lock().unwrap_or_else(|p| p.into_inner());
        st.down.is_some()
            || (!st.in_flight.is_empty() && st.last_progress.elapsed() >= self.io_timeout)
    }

    /// Starts a reader thread for the parked rail; if none can start, the
    /// rail goes down here.
    fn resume(self) {
        let name = format!("orbitte-tcp-r{}", self.rail.id.0);
        if let Err((r, e)) = spawn_with(name, self, reader) {
            let why = format!("cannot start the rail's reader thread: {e}");
            r.rail.fail(&why, false);
            take_down(&r.rail, why, &mut r.held());
        }
    }

    fn held(&self) -> Held {
        Held {
            sink: self.sink.clone(),
            events: Vec::with_capacity(32),
            bytes: 0,
        }
    }
}

impl Watched for Reader {
    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn ready(self: Box<Self>, _now: Instant) -> Next {
        (*self).resume();
        Next::Done
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        if self.due() {
            (*self).resume();
            return Next::Done;
        }
        let at = now + self.poll();
        Next::Wait(self, Some(at))
    }

    fn abandoned(self: Box<Self>, why: &str) {
        let why = format!("the rail's i/o threads stopped: {why}");
        self.rail.fail(&why, false);
        take_down(&self.rail, why, &mut self.held());
    }
}

/// How one run of a reader thread ended.
enum ReadEnd {
    /// Nothing in flight, nothing buffered, no byte for the poll
    /// interval: the rail can park.
    Quiet,
    /// The rail is down, for this reason.
    Down(String),
}

/// A reader thread: receives until the rail goes down (then reports
/// everything) or is quiet (then parks it on the pool and ends).
fn reader(r: Reader) {
    let mut held = r.held();
    match read_until_quiet(&r, &mut held) {
        ReadEnd::Down(why) => {
            r.rail.fail(&why, false);
            take_down(&r.rail, why, &mut held);
        }
        ReadEnd::Quiet => match r.pool.upgrade() {
            Some(pool) => {
                let at = Instant::now() + r.poll();
                pool.watch(Box::new(r), Some(at));
            }
            // Checked before it parks; gone since: read on here.
            None => reader(r),
        },
    }
}

fn read_until_quiet(r: &Reader, held: &mut Held) -> ReadEnd {
    use std::io::ErrorKind;
    let Reader {
        rail,
        stream,
        frame_timeout,
        io_timeout,
        on_segment,
        ..
    } = r;
    let (frame_timeout, io_timeout) = (*frame_timeout, *io_timeout);
    let mut frames = FrameBuffer::new();
    let poll = r.poll();
    let why: String = 'read: {
        if let Err(e) = stream.set_read_timeout(Some(poll)) {
            break 'read format!("cannot set the receive timeout: {e}");
        }
        loop {
            let frame = match frames.next() {
                Ok(Some(f)) => f,
                Ok(None) => {
                    // Nothing complete is buffered: hand the answers of this
                    // burst over before waiting for more.
                    let got = match frames.fill(stream, !held.events.is_empty()) {
                        Err(e) if e.kind() == ErrorKind::WouldBlock && !held.events.is_empty() => {
                            held.hand_over();
                            frames.fill(stream, false)
                        }
                        r => r,
                    };
                    match got {
                        Ok(0) => break 'read "connection lost: peer closed the connection".into(),
                        Ok(_) => {}
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                        {
                            let st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some(d) = &st.down {
                                break 'read d.to_string();
                            }
                            if !st.in_flight.is_empty() && st.last_progress.elapsed() >= io_timeout
                            {
                                break 'read format!(
                                    "no answer from the peer within {io_timeout:?}"
                                );
                            }
                            if st.in_flight.is_empty()
                                && st.last_progress.elapsed() >= PARK_AFTER
                                && frames.is_empty()
                                && held.events.is_empty()
                                && r.pool.strong_count() > 0
                            {
                                return ReadEnd::Quiet;
                            }
                        }
                        Err(e) => break 'read format!("connection lost: {e}"),
                    }
                    if frames.overdue(frame_timeout) {
                        break 'read format!(
                            "connection lost: the peer did not complete a frame within {frame_timeout:?}"
                        );
                    }
                    continue;
                }
                Err(e) => break 'read format!("connection lost: {e}"),
            };
            if frames.payload_len() != u64::from(frame.payload_len()) {
                break 'read format!(
                    "{} announces {} payload bytes in its header and {} in its body",
                    frame.frame_type(),
                    frames.payload_len(),
                    frame.payload_len()
                );
            }
            let (request_id, status, length, op) = match &frame {
                Frame::ReadResponse(r) => (r.request_id, r.status, r.length, Op::Read),
                Frame::WriteResponse(w) => (w.request_id, w.status, w.length, Op::Write),
                Frame::SegmentPublication(p) => {
                    on_segment(SegmentUpdate::Published(p.clone()));
                    continue;
                }
                Frame::SegmentRetire(r) => {
                    on_segment(SegmentUpdate::Retired(r.clone()));
                    continue;
                }
                Frame::Error(e) => {
                    break 'read format!("peer sent error {}: {}", e.code, e.message);
                }
                Frame::Goodbye(g) => {
                    break 'read format!("peer said goodbye ({}: {})", g.reason, g.message);
                }
                other => break 'read format!("unexpected {} from the peer", other.frame_type()),
            };
            let job = {
                let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
                let Some(job) = st.in_flight.iter().find(|j| {
                    j.answered.is_none() && j.item.token.0 == request_id.0 && j.item.op == op
                }) else {
                    break 'read format!(
                        "answer for request {} ({op:?}) matches no request in flight",
                        request_id.0
                    );
                };
                let job = job.clone();
                st.last_progress = Instant::now();
                job
            };
            let mut st_status = completion(status);
            if op == Op::Read && status.is_ok() {
                if length != job.item.len {
                    let msg = format!(
                        "read answer of {length} bytes for a {}-byte request",
                        job.item.len
                    );
                    answer(
                        rail,
                        &job,
                        SliceStatus::Failed(SliceFailure::Completion {
                            status: msg.clone().into(),
                            code: 0,
                        }),
                        &mut held.events,
                    );
                    break 'read msg;
                }
                let received = usize::try_from(job.item.local_offset)
                    .map_err(|_| "local offset overflows usize".to_owned())
                    .and_then(|offset| {
                        let len = length as usize;
                        let buffered = frames.take_payload(len);
                        let n = buffered.len();
                        job.local
                            .write_at(offset, buffered)
                            .map_err(|e| e.to_string())?;
                        frames.payload_received((len - n) as u64);
                        recv_payload(
                            rail,
                            stream,
                            &mut frames,
                            &job.local,
                            (offset + n, len - n),
                            io_timeout,
                            held,
                        )
                    });
                if let Err(e) = received {
                    let msg = format!("receiving read data failed: {e}");
                    // The reader is the only thread writing local memory: it
                    // stopped, so the bytes are released (possibly partial).
                    answer(
                        rail,
                        &job,
                        SliceStatus::Failed(SliceFailure::RailDown(msg.clone().into())),
                        &mut held.events,
                    );
                    break 'read msg;
                }
            } else if op == Op::Write && status.is_ok() && length != job.item.len {
                st_status = SliceStatus::Failed(SliceFailure::Completion {
                    status: format!(
                        "write answer of {length} bytes for a {}-byte request",
                        job.item.len
                    )
                    .into(),
                    code: 0,
                });
            }
            answer(rail, &job, st_status, &mut held.events);
            held.answered(job.item.len);
        }
    };
    ReadEnd::Down(why)
}

/// Reports a rail that went down: waits until the writer let go of local
/// memory, then hands over a `RailDown` and every outstanding item.
fn take_down(rail: &Rail, why: String, held: &mut Held) {
    // Wait until the writer let go of local memory (the socket is shut, so
    // a blocked send returns at once).
    let (in_flight, queued, reason) = {
        let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.writer {
            let (g, _) = rail
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner());
            st = g;
        }
        let reason = st.down.clone().unwrap_or_else(|| why.clone().into());
        (
            std::mem::take(&mut st.in_flight),
            std::mem::take(&mut st.queue),
            reason,
        )
    };
    let events = &mut held.events;
    events.push(TransportEvent::RailDown {
        rail: rail.id,
        reason: reason.clone(),
    });
    // In the order sent; an answered one keeps its outcome (its bytes
    // arrived), the others failed with the rail.
    for j in in_flight {
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token: j.item.token,
            status: j
                .answered
                .unwrap_or_else(|| SliceStatus::Failed(SliceFailure::RailDown(reason.clone()))),
            released: true,
        });
    }
    for j in queued {
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token: j.item.token,
            status: SliceStatus::Failed(SliceFailure::Flushed),
            released: true,
        });
    }
    held.hand_over();
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

    /// Completions reach the engine before the reader waits, also inside
    /// a payload: a peer answers a READ of 1 MiB and one of 1 KiB whole
    /// and then half of a third answer, and stalls. Both whole answers
    /// are delivered while the rail is up (the 1 MiB one at once, as it
    /// covers `ANSWER_BATCH`), the third fails when the rail gives up.
    #[test]
    fn answers_that_arrived_are_delivered_before_the_reader_waits_in_a_payload() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut peer, _) = l.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut cfg = SessionConfig::new(
            SourceId::new("initiator").unwrap(),
            orbitte_wire::Epoch::new(1).unwrap(),
        );
        cfg.io_timeout = Duration::from_secs(2);
        let (tx, deliveries) = mpsc::channel();
        let rail = Rail::start(
            RailId(0),
            orbitte_wire::SessionId(1),
            ours,
            &cfg,
            Arc::new(Record(tx)),
            Arc::new(|_| {}),
            Weak::new(),
        )
        .unwrap();
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
        let mut cfg = SessionConfig::new(
            SourceId::new("initiator").unwrap(),
            orbitte_wire::Epoch::new(1).unwrap(),
        );
        cfg.max_in_flight_per_connection = 40_000;
        cfg.socket_buffer = Some(MIN_SOCKET_BUFFER);
        let rail = Rail::start(
            RailId(0),
            orbitte_wire::SessionId(1),
            ours,
            &cfg,
            Arc::new(NoSink),
            Arc::new(|_| {}),
            Weak::new(),
        )
        .unwrap();
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
}
