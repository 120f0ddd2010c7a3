//! The engine's I/O threads: a fixed pool of event loops ([`IoPool`]),
//! each a `mio::Poll` (epoll) with a [`Waker`] and a command channel.
//!
//! What waits on a loop is a [`Watched`]: a descriptor to watch for
//! readiness ([`Watched::interest`]: readable by default, or writable, or
//! both) and an optional deadline. A loop owns what it watches; when
//! the descriptor becomes ready (or hangs up, or fails) the loop takes
//! it off epoll and calls [`Watched::ready`], when its deadline passes
//! [`Watched::expired`], and when another thread pokes it
//! ([`IoPool::poke`]: work was queued for it) [`Watched::poked`]; each
//! answers whether to keep waiting (and until when) or that it is done
//! (closed, or handed to a thread that serves it). A call that stops
//! before it drained its descriptor (to give the loop's other descriptors
//! their turn) is called again on the loop's next round: mio registers
//! edge-triggered, and the loop re-arms a descriptor after each call
//! (`EPOLL_CTL_MOD`, which reports readiness that is already there), so
//! what is watched sees level-triggered readiness for one `epoll_ctl` a
//! call. A descriptor stays on epoll while it is called, and comes off
//! when it sleeps, is done or is forgotten. Deadlines are kept in a heap per loop and checked against `now`
//! after every wake-up; they are rounded up to [`GRAIN`], so that many
//! watched descriptors share a wake-up. A loop runs only when something it
//! watches is ready or due: with nothing due it parks in `epoll_wait`
//! with no timeout.
//!
//! The pool's size is fixed when it is made (`SessionConfig::io_threads`)
//! and does not depend on how many descriptors wait on it: a thousand idle
//! sessions wait on the same few threads as one. What is watched goes to
//! the loop that carries the least ([`IoPool::key`]): each watched
//! descriptor weighs [`Watched::weight`] (a listener nothing, a connection
//! one), and a loop's load is the weight of what it holds, kept live as it
//! takes and keeps entries, so a handshake being called while it hands
//! over its session does not count against its loop.
//!
//! Why epoll through mio and not io_uring: mio is small, well kept and
//! safe to call (the engine forbids `unsafe`), and epoll works on every
//! kernel the engine supports and in containers whose seccomp profile
//! turns io_uring off; the loops only wait for readiness, so io_uring's
//! batching of the data moves themselves would buy nothing here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

/// How long a local copy worker waits with no rail to serve before it
/// ends. Long enough that a peer pausing between batches finds one still
/// running (a fan-in target's peers wait their turn for hundreds of
/// milliseconds), so a busy peer never pays a thread start per batch;
/// short enough that idle peers hold no thread.
pub const PARK_AFTER: Duration = Duration::from_secs(2);

/// Deadlines are rounded up to a multiple of this (counted from the loop's
/// start), so that the checks of many watched descriptors share one
/// wake-up of their loop.
pub(crate) const GRAIN: Duration = Duration::from_millis(25);

/// How long a loop pauses after `epoll_wait` failed before it waits again.
const PAUSE: Duration = Duration::from_millis(50);

/// The waker's token; watched descriptors take the others.
const WAKER: Token = Token(usize::MAX);

/// What a loop does with a [`Watched`] after calling it.
pub(crate) enum Next {
    /// Watch it again, until this deadline (`None`: readiness only).
    Wait(Box<dyn Watched>, Option<Instant>),
    /// Forget it: it closed, or a thread serves it now.
    Done,
}

/// Something an I/O loop watches: a descriptor to become ready, and a
/// deadline. The loop owns it while it waits; a call that answers
/// [`Next::Done`] may have handed the descriptor elsewhere (the loop takes
/// it off epoll then, before it looks at anything else).
pub(crate) trait Watched: Send {
    /// The descriptor watched (it stays open while the loop holds the
    /// `Watched`: the `Watched` owns it).
    fn fd(&self) -> RawFd;
    /// What readiness to wait for, asked each time it is watched again.
    fn interest(&self) -> Interest {
        Interest::READABLE
    }
    /// Whether it waits for its deadline only, its descriptor not watched
    /// meanwhile (asked each time it is watched again; by default not).
    fn sleeps(&self) -> bool {
        false
    }
    /// The descriptor is ready as [`Watched::interest`] asked, hung up or
    /// failed.
    fn ready(self: Box<Self>, now: Instant) -> Next;
    /// The deadline it gave has passed (`now` is at or after it).
    fn expired(self: Box<Self>, now: Instant) -> Next;
    /// Another thread poked it ([`IoPool::poke`]); by default the same as
    /// [`Watched::ready`], which must then cope with a descriptor that is
    /// not ready (a non-blocking call answers `WouldBlock`).
    fn poked(self: Box<Self>, now: Instant) -> Next {
        self.ready(now)
    }
    /// Its loop could not watch it (epoll refused the descriptor) or
    /// stops; it is dropped after this.
    fn abandoned(self: Box<Self>, why: &str);
    /// How much it weighs in its loop's load (asked each time it is
    /// watched again): a connection one (the default), a listening socket
    /// nothing, since what it accepts is watched on its own.
    fn weight(&self) -> usize {
        1
    }
}

/// A watched descriptor's place: its loop and its key there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WatchKey {
    lp: usize,
    key: u64,
}

enum Command {
    /// Watch it under this key; the last field is the weight its key
    /// reserved.
    Watch(u64, Box<dyn Watched>, Option<Instant>, usize),
    /// Drop the watched descriptor of this key (if it is still watched),
    /// then answer.
    Forget(u64, Sender<()>),
    /// Call [`Watched::poked`] on this key's watched descriptor (if it is
    /// still watched).
    Poke(u64),
    Stop,
}

struct LoopHandle {
    commands: Sender<Command>,
    waker: Waker,
    thread: ThreadId,
    load: Arc<Load>,
}

/// What a loop carries, as [`IoPool::key`] weighs it.
#[derive(Debug, Default)]
struct Load {
    /// The weight reserved by keys handed out for this loop whose watch it
    /// has not taken yet.
    reserved: AtomicUsize,
    /// The weight of the entries it holds now (written by its thread only,
    /// as it takes and keeps them).
    held: AtomicUsize,
}

impl Load {
    fn weight(&self) -> usize {
        self.reserved.load(Ordering::Relaxed) + self.held.load(Ordering::Relaxed)
    }
}

/// A fixed set of I/O threads, each an event loop.
pub(crate) struct IoPool {
    loops: Vec<LoopHandle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_loop: AtomicUsize,
    next_key: AtomicU64,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoPool")
            .field("threads", &self.loops.len())
            .finish_non_exhaustive()
    }
}

impl IoPool {
    /// Starts `threads` loops (at least one), their threads named
    /// `orbitte-io-{name}-{i}`.
    pub(crate) fn new(threads: usize, name: &str) -> std::io::Result<Arc<Self>> {
        let mut loops = Vec::with_capacity(threads.max(1));
        let mut handles = Vec::with_capacity(threads.max(1));
        for i in 0..threads.max(1) {
            let poll = Poll::new()?;
            let waker = Waker::new(poll.registry(), WAKER)?;
            let (tx, rx) = crossbeam_channel::unbounded();
            let load = Arc::new(Load::default());
            let theirs = load.clone();
            let handle = std::thread::Builder::new()
                .name(format!("orbitte-io-{name}-{i}"))
                .spawn(move || run(poll, &rx, theirs))?;
            loops.push(LoopHandle {
                commands: tx,
                waker,
                thread: handle.thread().id(),
                load,
            });
            handles.push(handle);
        }
        Ok(Arc::new(Self {
            loops,
            threads: Mutex::new(handles),
            next_loop: AtomicUsize::new(0),
            next_key: AtomicU64::new(0),
        }))
    }

    /// Hands `w` to the loop that carries the least, to watch until
    /// `deadline` (see [`IoPool::key`]).
    /// When its loop is gone (the pool stops), `w` is abandoned at once.
    pub(crate) fn watch(&self, w: Box<dyn Watched>, deadline: Option<Instant>) -> WatchKey {
        let weight = w.weight();
        let key = self.place(weight);
        self.send_watch(key, w, deadline, weight);
        key
    }

    /// A key on the loop that carries the least (the weight of what it
    /// holds and of what was handed to it and not taken yet; ties go
    /// round-robin), for [`IoPool::watch_as`] with a `Watched` of weight
    /// one: a `Watched` that other threads poke can keep its key where
    /// they find it before it is watched. Weighing the loops, not taking
    /// them in turn, keeps long-lived connections spread when short-lived
    /// watches come between them (a handshake, then the session it admits,
    /// would otherwise land every session on the same loop).
    pub(crate) fn key(&self) -> WatchKey {
        self.place(1)
    }

    /// A key on the least loaded loop, reserving `weight` there.
    fn place(&self, weight: usize) -> WatchKey {
        let n = self.loops.len();
        let first = self.next_loop.fetch_add(1, Ordering::Relaxed) % n;
        let lp = (0..n)
            .map(|i| (first + i) % n)
            .min_by_key(|&l| self.loops[l].load.weight())
            .unwrap_or(first);
        self.loops[lp]
            .load
            .reserved
            .fetch_add(weight, Ordering::Relaxed);
        WatchKey {
            lp,
            key: self.next_key.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Hands `w` to the loop of `key` (from [`IoPool::key`], used once) to
    /// watch until `deadline`. A poke sent before this is lost: whoever
    /// watches it pokes it once after, if work may have been queued
    /// meanwhile. When its loop is gone (the pool stops), `w` is abandoned
    /// at once.
    pub(crate) fn watch_as(&self, key: WatchKey, w: Box<dyn Watched>, deadline: Option<Instant>) {
        self.send_watch(key, w, deadline, 1);
    }

    fn send_watch(
        &self,
        key: WatchKey,
        w: Box<dyn Watched>,
        deadline: Option<Instant>,
        reserved: usize,
    ) {
        let handle = &self.loops[key.lp];
        match handle
            .commands
            .send(Command::Watch(key.key, w, deadline, reserved))
        {
            Ok(()) => {
                if let Err(e) = handle.waker.wake() {
                    tracing::warn!(error = %e, "cannot wake an i/o loop");
                }
            }
            Err(crossbeam_channel::SendError(Command::Watch(_, w, _, _))) => {
                w.abandoned("the engine's i/o threads stopped");
            }
            Err(_) => {}
        }
    }

    /// Has the loop of `key` call [`Watched::poked`] on what it watches
    /// under `key` (if it still does) on its next round. A poke of a key
    /// that is being called now is answered after that call.
    pub(crate) fn poke(&self, key: WatchKey) {
        let handle = &self.loops[key.lp];
        if handle.commands.send(Command::Poke(key.key)).is_ok()
            && let Err(e) = handle.waker.wake()
        {
            tracing::warn!(error = %e, "cannot wake an i/o loop");
        }
    }

    /// Drops what `key` watches (if its loop still has it) and returns once
    /// it is dropped, so its descriptor is closed by then (called from one
    /// of the pool's own threads it does not wait).
    pub(crate) fn forget(&self, key: WatchKey) {
        let handle = &self.loops[key.lp];
        let (tx, rx) = crossbeam_channel::bounded(1);
        if handle.commands.send(Command::Forget(key.key, tx)).is_err() {
            return;
        }
        let _ = handle.waker.wake();
        if std::thread::current().id() != handle.thread {
            // Disconnected: the loop stopped and dropped it.
            let _ = rx.recv();
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        for l in &self.loops {
            let _ = l.commands.send(Command::Stop);
            let _ = l.waker.wake();
        }
        let me = std::thread::current().id();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            // The last owner may be a loop's own watched descriptor.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

/// An engine's I/O pool, started on first use and shared by its listener
/// and its tcp rails.
#[derive(Debug, Clone)]
pub(crate) struct IoThreads {
    threads: usize,
    pool: Arc<Mutex<Option<Arc<IoPool>>>>,
}

impl IoThreads {
    /// A pool of `threads` loops, not started yet.
    pub(crate) fn new(threads: usize) -> Self {
        Self {
            threads,
            pool: Arc::new(Mutex::new(None)),
        }
    }

    /// The pool, started now if it was not yet.
    pub(crate) fn pool(&self) -> std::io::Result<Arc<IoPool>> {
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let p = IoPool::new(self.threads, "net")?;
        *slot = Some(p.clone());
        Ok(p)
    }
}

/// One watched descriptor on its loop.
struct Entry {
    watched: Box<dyn Watched>,
    deadline: Option<Instant>,
    /// The descriptor it is on epoll with (`None` while it sleeps).
    registered: Option<RawFd>,
    /// What it counts in the loop's load.
    weight: usize,
}

/// One loop's state.
struct Loop {
    poll: Poll,
    start: Instant,
    entries: HashMap<u64, Entry>,
    /// (deadline, key); an entry whose deadline changed since leaves a
    /// stale element behind, skipped when it comes up.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The last deadline pushed for each key still in the heap: an entry
    /// watched again and again until the same deadline (a busy connection
    /// called on every readiness) adds one element, not one per call.
    armed: HashMap<u64, Instant>,
    /// Its load, shared with the pool: the weight of `entries`.
    load: Arc<Load>,
}

fn run(poll: Poll, commands: &Receiver<Command>, load: Arc<Load>) {
    let mut lp = Loop {
        poll,
        start: Instant::now(),
        entries: HashMap::new(),
        deadlines: BinaryHeap::new(),
        armed: HashMap::new(),
        load,
    };
    let mut events = Events::with_capacity(256);
    loop {
        let timeout = lp
            .deadlines
            .peek()
            .map(|Reverse((at, _))| at.saturating_duration_since(Instant::now()));
        if let Err(e) = lp.poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!(error = %e, "an i/o loop cannot wait for its descriptors");
                std::thread::sleep(PAUSE);
            }
            continue;
        }
        let now = Instant::now();
        for event in &events {
            if event.token() == WAKER {
                continue;
            }
            let key = event.token().0 as u64;
            if let Some(e) = lp.take(key) {
                let next = e.watched.ready(now);
                lp.keep(key, next, e.registered);
            }
        }
        loop {
            match commands.try_recv() {
                Ok(Command::Watch(key, w, deadline, reserved)) => {
                    let _ =
                        lp.load
                            .reserved
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                                Some(r.saturating_sub(reserved))
                            });
                    lp.keep(key, Next::Wait(w, deadline), None);
                }
                Ok(Command::Forget(key, done)) => {
                    if let Some(e) = lp.take(key) {
                        lp.unregister(e.registered);
                    }
                    let _ = done.send(());
                }
                Ok(Command::Poke(key)) => {
                    if let Some(e) = lp.take(key) {
                        let next = e.watched.poked(Instant::now());
                        lp.keep(key, next, e.registered);
                    }
                }
                Ok(Command::Stop) | Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    for (_, e) in lp.entries.drain() {
                        e.watched.abandoned("the engine's i/o threads stop");
                    }
                    return;
                }
                Err(crossbeam_channel::TryRecvError::Empty) => break,
            }
        }
        let now = Instant::now();
        while let Some(&Reverse((at, key))) = lp.deadlines.peek() {
            if at > now {
                break;
            }
            lp.deadlines.pop();
            if lp.armed.get(&key) == Some(&at) {
                lp.armed.remove(&key);
            }
            if lp.entries.get(&key).and_then(|e| e.deadline) != Some(at) {
                continue;
            }
            if let Some(e) = lp.take(key) {
                let next = e.watched.expired(now);
                lp.keep(key, next, e.registered);
            }
        }
    }
}

impl Loop {
    /// Takes `key`'s entry out of the table; its descriptor stays on epoll
    /// (as `registered` says) until [`Loop::keep`] or [`Loop::unregister`]
    /// decides.
    fn take(&mut self, key: u64) -> Option<Entry> {
        let e = self.entries.remove(&key)?;
        self.weigh(e.weight, 0);
        Some(e)
    }

    /// Replaces `out` of the loop's load by `added` (only its own thread
    /// writes it).
    fn weigh(&self, out: usize, added: usize) {
        let held = self.load.held.load(Ordering::Relaxed);
        self.load
            .held
            .store(held.saturating_sub(out) + added, Ordering::Relaxed);
    }

    /// Takes a descriptor off epoll. Failing means it is not on epoll any
    /// more (closed, and epoll forgot it), so there is nothing to undo.
    fn unregister(&self, registered: Option<RawFd>) {
        if let Some(fd) = registered {
            let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        }
    }

    /// Watches `next`'s descriptor again under `key`, or forgets it;
    /// `was` is how it was on epoll before the call that answered `next`.
    fn keep(&mut self, key: u64, next: Next, was: Option<RawFd>) {
        let Next::Wait(watched, deadline) = next else {
            self.unregister(was);
            self.armed.remove(&key);
            return;
        };
        let want = if watched.sleeps() && deadline.is_some() {
            None
        } else {
            Some((watched.fd(), watched.interest()))
        };
        let token = Token(usize::try_from(key).unwrap_or(usize::MAX - 1));
        let registry = self.poll.registry();
        let armed = match (was, want) {
            (_, None) => {
                self.unregister(was);
                Ok(())
            }
            // The same descriptor: re-armed, which also reports readiness
            // left from the call (the part it did not drain).
            (Some(old), Some((fd, interest))) if old == fd => registry
                .reregister(&mut SourceFd(&fd), token, interest)
                // Closed and opened again under the same number: the
                // registration went with the old one.
                .or_else(|_| registry.register(&mut SourceFd(&fd), token, interest)),
            (_, Some((fd, interest))) => {
                self.unregister(was);
                registry.register(&mut SourceFd(&fd), token, interest)
            }
        };
        if let Err(e) = armed {
            watched.abandoned(&format!("cannot watch the socket: {e}"));
            self.armed.remove(&key);
            return;
        }
        let deadline = deadline.map(|d| self.rounded(d));
        if let Some(at) = deadline
            && self.armed.insert(key, at) != Some(at)
        {
            self.deadlines.push(Reverse((at, key)));
        }
        let weight = watched.weight();
        self.weigh(0, weight);
        let old = self.entries.insert(
            key,
            Entry {
                watched,
                deadline,
                registered: want.map(|(fd, _)| fd),
                weight,
            },
        );
        if let Some(old) = old {
            self.weigh(old.weight, 0);
        }
    }

    /// `at` rounded up to the loop's next multiple of [`GRAIN`].
    fn rounded(&self, at: Instant) -> Instant {
        let since = at.saturating_duration_since(self.start).as_nanos();
        let grain = GRAIN.as_nanos();
        let up = since.div_ceil(grain) * grain;
        self.start + Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// Reports each call on a channel and asks to be watched again (until
    /// `again` runs out).
    struct Probe {
        sock: UnixStream,
        calls: Sender<&'static str>,
        again: u32,
        deadline: Option<Duration>,
        interest: Interest,
        /// How many bytes a call reads at most.
        take: usize,
        /// Where it goes when done, its socket open (handed to a thread
        /// that serves it); dropped when `None`.
        handed: Option<Sender<Box<Self>>>,
        /// What it weighs on its loop.
        weight: usize,
        /// Called by its first readiness, which then answers done (a
        /// handshake admitting its session).
        admits: Option<Box<dyn FnOnce() + Send>>,
    }

    impl Probe {
        fn next(mut self: Box<Self>, now: Instant) -> Next {
            if self.again == 0 {
                if let Some(to) = self.handed.take() {
                    let _ = to.send(self);
                }
                return Next::Done;
            }
            self.again -= 1;
            let at = self.deadline.map(|d| now + d);
            Next::Wait(self, at)
        }
    }

    impl Watched for Probe {
        fn fd(&self) -> RawFd {
            self.sock.as_raw_fd()
        }
        fn interest(&self) -> Interest {
            self.interest
        }
        fn ready(mut self: Box<Self>, now: Instant) -> Next {
            if let Some(admit) = self.admits.take() {
                admit();
                return Next::Done;
            }
            let mut b = [0u8; 16];
            let n = self.take.min(b.len());
            let _ = std::io::Read::read(&mut &self.sock, &mut b[..n]);
            let _ = self.calls.send("ready");
            self.next(now)
        }
        fn expired(self: Box<Self>, now: Instant) -> Next {
            let _ = self.calls.send("expired");
            self.next(now)
        }
        fn abandoned(self: Box<Self>, _why: &str) {
            let _ = self.calls.send("abandoned");
        }
        fn weight(&self) -> usize {
            self.weight
        }
    }

    fn probe(
        again: u32,
        deadline: Option<Duration>,
    ) -> (Box<Probe>, UnixStream, Receiver<&'static str>) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        (
            Box::new(Probe {
                sock: a,
                calls: tx,
                again,
                deadline,
                interest: Interest::READABLE,
                take: 16,
                handed: None,
                weight: 1,
                admits: None,
            }),
            b,
            rx,
        )
    }

    const BOUND: Duration = Duration::from_secs(20);

    #[test]
    fn a_readable_descriptor_is_handed_back_and_watched_again() {
        let pool = IoPool::new(2, "test").unwrap();
        let (p, mut peer, calls) = probe(1, None);
        pool.watch(p, None);
        peer.write_all(b"x").unwrap();
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
        peer.write_all(b"y").unwrap();
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
        // Done after the second call (and dropped, so the write may fail):
        // a third write calls nothing.
        let _ = peer.write_all(b"z");
        drop(pool);
        assert!(calls.try_recv().is_err());
    }

    /// A call that leaves bytes unread is called again with no new
    /// readiness: the loop re-arms the descriptor after every call.
    #[test]
    fn a_descriptor_left_readable_is_called_again() {
        let pool = IoPool::new(1, "test").unwrap();
        let (mut p, mut peer, calls) = probe(2, None);
        p.take = 1;
        pool.watch(p, None);
        peer.write_all(b"abc").unwrap();
        for _ in 0..3 {
            assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
        }
    }

    /// A descriptor handed away by a call that answers done is off its
    /// loop's epoll at once: watched again on the same loop, it is
    /// watched, not refused as registered already.
    #[test]
    fn a_descriptor_handed_away_can_be_watched_again_on_its_loop() {
        let pool = IoPool::new(1, "test").unwrap();
        let (mut p, mut peer, calls) = probe(0, None);
        let (tx, handed) = crossbeam_channel::unbounded();
        p.handed = Some(tx);
        pool.watch(p, None);
        peer.write_all(b"x").unwrap();
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
        let p = handed.recv_timeout(BOUND).unwrap();
        pool.watch(p, None);
        peer.write_all(b"y").unwrap();
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
    }

    #[test]
    fn a_poke_calls_it_without_readiness_and_a_writable_socket_is_ready() {
        let pool = IoPool::new(2, "test").unwrap();
        let (p, _peer, calls) = probe(1, None);
        let key = pool.key();
        pool.watch_as(key, p, None);
        assert!(
            calls.recv_timeout(Duration::from_millis(100)).is_err(),
            "nothing to read"
        );
        pool.poke(key);
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
        // An empty socket's send buffer has room: writable at once.
        let (mut p, _peer, calls) = probe(0, None);
        p.interest = Interest::WRITABLE;
        pool.watch(p, None);
        assert_eq!(calls.recv_timeout(BOUND), Ok("ready"));
    }

    /// A descriptor watched again and again until the same deadline (a
    /// busy connection) leaves one element in the loop's heap, and a new
    /// deadline one more.
    #[test]
    fn watching_again_until_the_same_deadline_adds_no_heap_element() {
        let mut lp = Loop {
            poll: Poll::new().unwrap(),
            start: Instant::now(),
            entries: HashMap::new(),
            deadlines: BinaryHeap::new(),
            armed: HashMap::new(),
            load: Arc::default(),
        };
        let (p, _peer, _calls) = probe(0, None);
        let at = Instant::now() + Duration::from_secs(60);
        lp.keep(7, Next::Wait(p, Some(at)), None);
        for _ in 0..1000 {
            let e = lp.take(7).unwrap();
            lp.keep(7, Next::Wait(e.watched, Some(at)), e.registered);
        }
        assert_eq!(lp.deadlines.len(), 1);
        let e = lp.take(7).unwrap();
        lp.keep(
            7,
            Next::Wait(e.watched, Some(at + Duration::from_secs(1))),
            e.registered,
        );
        assert_eq!(lp.deadlines.len(), 2);
    }

    /// Long-lived watches with short-lived ones between them (a handshake,
    /// then the session it admits) spread over the loops: taking the loops
    /// in turn would put every long-lived one on the same loop.
    #[test]
    fn long_lived_watches_spread_over_the_loops_between_short_ones() {
        let pool = IoPool::new(2, "test").unwrap();
        let mut kept = Vec::new();
        let mut on = [0usize; 2];
        for _ in 0..10 {
            let (p, peer, _calls) = probe(1, None);
            let at = pool.watch(p, None);
            on[at.lp] += 1;
            kept.push(peer);
            let (short, _peer, calls) = probe(0, None);
            let at = pool.watch(short, Some(Instant::now()));
            assert_eq!(calls.recv_timeout(BOUND), Ok("expired"));
            // Its loop has counted it out once its round ended.
            let t0 = Instant::now();
            while pool.loops[at.lp].load.weight() != on[at.lp] && t0.elapsed() < BOUND {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(on, [5, 5], "long-lived watches per loop");
    }

    /// Sessions admitted by handshakes spread over the loops even when a
    /// listener sits on one of them: the listener weighs nothing, and the
    /// handshake being called does not count against its loop while it
    /// places its session.
    #[test]
    fn sessions_admitted_from_a_loop_spread_past_a_listener() {
        let pool = IoPool::new(2, "test").unwrap();
        let (mut listener, _lpeer, _lcalls) = probe(u32::MAX, None);
        listener.weight = 0;
        pool.watch(listener, None);
        let (placed, sessions) = crossbeam_channel::unbounded();
        let mut peers = Vec::new();
        let mut on = [0usize; 2];
        for _ in 0..10 {
            let (mut hs, mut peer, _calls) = probe(0, None);
            let (session, speer, _scalls) = probe(u32::MAX, None);
            let (theirs, placed) = (pool.clone(), placed.clone());
            hs.admits = Some(Box::new(move || {
                let _ = placed.send(theirs.watch(session, None));
            }));
            pool.watch(hs, None);
            peer.write_all(b"x").unwrap();
            let at: WatchKey = sessions.recv_timeout(BOUND).unwrap();
            on[at.lp] += 1;
            peers.push(speer);
        }
        assert_eq!(on, [5, 5], "sessions per loop");
    }

    #[test]
    fn a_deadline_expires_without_readiness() {
        let pool = IoPool::new(1, "test").unwrap();
        let (p, _peer, calls) = probe(0, None);
        pool.watch(p, Some(Instant::now()));
        assert_eq!(calls.recv_timeout(BOUND), Ok("expired"));
    }

    #[test]
    fn forgetting_drops_it_before_returning_and_stopping_abandons_the_rest() {
        let pool = IoPool::new(1, "test").unwrap();
        let (p, mut peer, calls) = probe(5, None);
        let key = pool.watch(p, None);
        pool.forget(key);
        // Dropped: its socket is closed, so the peer's write fails.
        assert!(peer.write_all(b"x").is_err());
        assert!(calls.try_recv().is_err(), "forgotten, not abandoned");
        let (p, _peer, calls) = probe(5, None);
        pool.watch(p, None);
        drop(pool);
        assert_eq!(calls.recv_timeout(BOUND), Ok("abandoned"));
    }
}
