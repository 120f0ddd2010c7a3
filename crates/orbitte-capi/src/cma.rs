//! Same-host copies of caller memory: `process_vm_writev` and
//! `process_vm_readv` straight between this process and a peer's (the
//! kernel's cross-memory attach, "cma", as UCX names its transport).
//!
//! Memory a caller registers stays in the caller's process, which a peer
//! cannot map; on one host the kernel can still copy between the two
//! processes in one pass. An engine created with `ORBITTE_ENGINE_CMA`
//! publishes its host identity (boot id and pid namespace), its pid and
//! its uid in the connection info. A peer that finds the same host and
//! uid, a kernel that allows it (`/proc/sys/kernel/yama/ptrace_scope`
//! absent or 0), and proves the pid by reading the peer's anchor nonce
//! both ways (over the session, which needs the listener token, and by
//! `process_vm_readv`), copies WRITE and READ of host memory itself.
//! Descriptors are checked against the ranges the peer published and
//! whose public data was loaded, exactly as for the engine's paths.
//!
//! Like UCX's cma, this relies on the kernel's permission (same uid,
//! ptrace allowed): a process allowed to do this may touch any memory of
//! the peer, not only its registered ranges. The bounds check keeps this
//! library to the registered ranges; it cannot keep another program of the
//! same uid out. Without the flag, peers are served over the engine's
//! paths.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use orbitte::{Op, RequestId};

use crate::handle::lock;
use crate::status::{
    Failure, ORBITTE_ERR_BACKEND, ORBITTE_ERR_INVALID_PARAM, ORBITTE_ERR_REMOTE_DISCONNECT,
};

/// The most iovecs the kernel takes on each side of one call (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A transfer copied in pieces is split into pieces of at most this many
/// bytes: the most a checking call copies.
const PIECE_BYTES: u64 = 4 << 20;

/// The most worker threads an engine starts for its copies.
const MAX_WORKERS: usize = 4;

/// Where this process runs, as peers compare it: the kernel's boot id
/// (one per boot of one host) and this process's pid namespace (the pid
/// peers are told means the same process to them).
pub(crate) fn host_id() -> Result<String, String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map_err(|e| format!("cannot read /proc/sys/kernel/random/boot_id: {e}"))?;
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map_err(|e| format!("cannot read /proc/self/ns/pid: {e}"))?;
    Ok(format!("{}/{}", boot.trim(), ns.display()))
}

/// This process's id and real user id.
pub(crate) fn pid_uid() -> (u32, u32) {
    // SAFETY: getpid and getuid have no preconditions and cannot fail.
    let (pid, uid) = unsafe { (libc::getpid(), libc::getuid()) };
    (pid.unsigned_abs(), uid)
}

/// Why the kernel would refuse copies into another process of the same
/// uid (Yama's `ptrace_scope` above 0), or `None` when it allows them.
pub(crate) fn kernel_refuses() -> Option<String> {
    match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => Some(format!(
            "cannot read /proc/sys/kernel/yama/ptrace_scope: {e}"
        )),
        Ok(s) if s.trim() == "0" => None,
        Ok(s) => Some(format!(
            "/proc/sys/kernel/yama/ptrace_scope is {} (0 lets processes of one uid copy between each other)",
            s.trim()
        )),
    }
}

/// 32 random bytes from the kernel.
pub(crate) fn nonce() -> io::Result<[u8; 32]> {
    let mut b = [0u8; 32];
    let mut at = 0;
    while at < b.len() {
        // SAFETY: the pointer and length name the unfilled rest of `b`.
        let n = unsafe { libc::getrandom(b[at..].as_mut_ptr().cast(), b.len() - at, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            at += n.unsigned_abs();
        }
    }
    Ok(b)
}

/// A same-host peer's process, held by a pidfd so that a reused pid is
/// never mistaken for it.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) pid: i32,
    pidfd: OwnedFd,
}

impl Target {
    /// Opens `pid`.
    pub(crate) fn open(pid: u32) -> Result<Self, String> {
        let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} is out of range"))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(format!(
                "cannot open process {pid}: {}",
                io::Error::last_os_error()
            ));
        }
        let fd = i32::try_from(fd).map_err(|_| format!("pidfd_open returned {fd}"))?;
        // SAFETY: `fd` is a new descriptor this call owns alone.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { pid, pidfd })
    }

    /// Whether the process has exited (its pid may then name another).
    pub(crate) fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; a zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0
    }
}

/// One contiguous run: `len` bytes at `local` here and `remote` there.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub(crate) local: u64,
    pub(crate) remote: u64,
    pub(crate) len: u64,
}

/// Why a copy stopped.
#[derive(Debug)]
pub(crate) struct CopyError {
    pub(crate) code: i32,
    pub(crate) why: String,
}

fn gone(t: &Target) -> CopyError {
    CopyError {
        code: ORBITTE_ERR_REMOTE_DISCONNECT,
        why: format!("the same-host peer (pid {}) exited", t.pid),
    }
}

/// Copies `segs` between this process and `t`: WRITE sends local bytes to
/// the peer, READ brings the peer's bytes here. Up to `IOV_MAX` runs a
/// call; a short count continues where the kernel stopped. Returns the
/// system calls made.
pub(crate) fn copy(t: &Target, op: Op, segs: &[Seg]) -> Result<u64, CopyError> {
    if t.exited() {
        return Err(gone(t));
    }
    let mut calls = 0u64;
    let (mut i, mut off) = (0usize, 0u64);
    let mut local: Vec<libc::iovec> = Vec::with_capacity(IOV_MAX.min(segs.len()));
    let mut remote: Vec<libc::iovec> = Vec::with_capacity(IOV_MAX.min(segs.len()));
    while i < segs.len() {
        local.clear();
        remote.clear();
        for (k, s) in segs[i..].iter().take(IOV_MAX).enumerate() {
            let skip = if k == 0 { off } else { 0 };
            let len = (s.len - skip) as usize;
            local.push(libc::iovec {
                iov_base: (s.local + skip) as usize as *mut libc::c_void,
                iov_len: len,
            });
            remote.push(libc::iovec {
                iov_base: (s.remote + skip) as usize as *mut libc::c_void,
                iov_len: len,
            });
        }
        let call = match op {
            Op::Write => libc::process_vm_writev,
            Op::Read => libc::process_vm_readv,
        };
        // SAFETY: the kernel reads and writes the named memory with its
        // fault-handling user-copy routines: an inaccessible page is EFAULT
        // or a short count, never a signal. The local iovecs name memory
        // the caller registered with this engine (checked when the transfer
        // was prepared), which the caller keeps mapped and which no Rust
        // reference aliases (the registration's contract); the remote ones
        // name the peer's published ranges. Both arrays outlive the call.
        let n = unsafe {
            call(
                t.pid,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        calls += 1;
        if n <= 0 {
            let e = io::Error::last_os_error();
            let errno = if n == 0 {
                libc::EFAULT
            } else {
                e.raw_os_error().unwrap_or(0)
            };
            let at = segs[i];
            return Err(match errno {
                libc::EINTR => continue,
                libc::ESRCH => gone(t),
                libc::EPERM if t.exited() => gone(t),
                libc::EPERM => CopyError {
                    code: ORBITTE_ERR_REMOTE_DISCONNECT,
                    why: format!(
                        "the kernel no longer lets this process copy into pid {}: {e}",
                        t.pid
                    ),
                },
                libc::EFAULT => CopyError {
                    code: ORBITTE_ERR_INVALID_PARAM,
                    why: format!(
                        "local {:#x} or remote {:#x} (+{}) is not mapped: the memory was freed while registered",
                        at.local + off,
                        at.remote + off,
                        at.len - off
                    ),
                },
                _ => CopyError {
                    code: ORBITTE_ERR_BACKEND,
                    why: format!("copying with pid {}: {e}", t.pid),
                },
            });
        }
        let mut moved = n.unsigned_abs() as u64;
        while moved > 0 && i < segs.len() {
            let rest = segs[i].len - off;
            if moved >= rest {
                moved -= rest;
                i += 1;
                off = 0;
            } else {
                off += moved;
                moved = 0;
            }
        }
    }
    Ok(calls)
}

/// Splits `segs` into at most `n` pieces of about equal bytes.
pub(crate) fn split(segs: &[Seg], n: usize) -> Vec<Vec<Seg>> {
    let total: u64 = segs.iter().map(|s| s.len).sum();
    let n = n.max(1) as u64;
    let per = total.div_ceil(n).max(1);
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut cur_len = 0u64;
    for s in segs {
        let mut s = *s;
        while s.len > 0 {
            let take = s.len.min(per - cur_len);
            cur.push(Seg { len: take, ..s });
            cur_len += take;
            s.local += take;
            s.remote += take;
            s.len -= take;
            if cur_len == per {
                out.push(std::mem::take(&mut cur));
                cur_len = 0;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// How many pieces a transfer of `bytes` is copied in: pieces of at most
/// `PIECE_BYTES`, so that a checking call that copies one stays short.
pub(crate) fn pieces(bytes: u64) -> usize {
    usize::try_from(bytes.div_ceil(PIECE_BYTES).max(1)).unwrap_or(usize::MAX)
}

/// What a queued copy came to.
#[derive(Debug)]
pub(crate) enum RunState {
    Running,
    /// Copied; the ids of the request carrying the notification (if any).
    Copied(Vec<RequestId>),
    Failed(CopyError),
}

/// Copies one piece.
pub(crate) type CopyPiece = Box<dyn Fn(&[Seg]) -> Result<(), CopyError> + Send + Sync>;
/// Ends a run after its last piece, with the first error.
pub(crate) type Finish = Box<dyn FnOnce(Option<CopyError>) -> RunState + Send>;

/// A copy in pieces, shared by the posting call, the engine's workers and
/// the calls that check or wait on the transfer: each claims the next
/// piece and copies it, so a piece is copied once, by whoever claimed it.
pub(crate) struct Run {
    pieces: Vec<Vec<Seg>>,
    /// The next piece to claim (past the end: every piece was claimed).
    next: AtomicUsize,
    /// Pieces not ended yet; the one that ends the last runs `finish`.
    left: AtomicUsize,
    /// Set at the first error: the pieces claimed after it are not copied.
    failed: AtomicBool,
    copy: CopyPiece,
    finish: Mutex<Option<Finish>>,
    error: Mutex<Option<CopyError>>,
    pub(crate) state: Mutex<RunState>,
    done: Condvar,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("pieces", &self.pieces.len())
            .field("next", &self.next)
            .field("left", &self.left)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Run {
    pub(crate) fn new(pieces: Vec<Vec<Seg>>, copy: CopyPiece, finish: Finish) -> Arc<Self> {
        Arc::new(Self {
            left: AtomicUsize::new(pieces.len()),
            pieces,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            copy,
            finish: Mutex::new(Some(finish)),
            error: Mutex::new(None),
            state: Mutex::new(RunState::Running),
            done: Condvar::new(),
        })
    }

    /// How many pieces the run has.
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether pieces wait to be claimed.
    pub(crate) fn unclaimed(&self) -> bool {
        self.next.load(Ordering::Acquire) < self.pieces.len()
    }

    /// Claims the next piece and copies it (after an error, ends it
    /// uncopied). Returns its bytes, or `None` when every piece was
    /// claimed.
    pub(crate) fn step(&self) -> Option<u64> {
        if !self.unclaimed() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::AcqRel);
        let piece = self.pieces.get(i)?;
        let r = if self.failed.load(Ordering::Acquire) {
            Ok(())
        } else {
            (self.copy)(piece)
        };
        self.piece_done(r);
        Some(piece.iter().map(|s| s.len).sum())
    }

    /// Fails the run: the pieces claimed from now on are not copied.
    pub(crate) fn fail(&self, e: CopyError) {
        self.failed.store(true, Ordering::Release);
        lock(&self.error).get_or_insert(e);
    }

    /// Leaves the pieces not claimed yet uncopied; the run fails.
    pub(crate) fn cancel(&self) {
        self.fail(CopyError {
            code: ORBITTE_ERR_BACKEND,
            why: "the transfer was released while it was copied".to_owned(),
        });
    }

    fn piece_done(&self, r: Result<(), CopyError>) {
        if let Err(e) = r {
            self.fail(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let err = lock(&self.error).take();
            let state = match lock(&self.finish).take() {
                Some(finish) => finish(err),
                None => RunState::Failed(err.unwrap_or(CopyError {
                    code: ORBITTE_ERR_BACKEND,
                    why: "the copy ended twice".to_owned(),
                })),
            };
            *lock(&self.state) = state;
            self.done.notify_all();
        }
    }

    /// Copies the pieces no one claimed, then waits until every piece
    /// ended.
    pub(crate) fn wait(&self) {
        while self.step().is_some() {}
        let mut s = lock(&self.state);
        while matches!(*s, RunState::Running) {
            s = self
                .done
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The copy workers of an engine, started on first use; they end when the
/// engine is dropped and the queue is empty.
#[derive(Debug, Default)]
pub(crate) struct Workers {
    tx: Mutex<Option<crossbeam_channel::Sender<Job>>>,
}

impl Workers {
    /// How many worker threads copy: one fewer than the cores (the
    /// thread that posts and checks copies too), at least one.
    pub(crate) fn count() -> usize {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .saturating_sub(1)
            .clamp(1, MAX_WORKERS)
    }

    pub(crate) fn run(&self, job: Job) -> Result<(), Failure> {
        let mut tx = lock(&self.tx);
        if tx.is_none() {
            let (s, r) = crossbeam_channel::unbounded::<Job>();
            for k in 0..Self::count() {
                let r = r.clone();
                std::thread::Builder::new()
                    .name(format!("orbitte-cma-{k}"))
                    .spawn(move || {
                        for job in r {
                            job();
                        }
                    })
                    .map_err(|e| {
                        Failure::new(
                            ORBITTE_ERR_BACKEND,
                            format!("cannot start a copy worker thread: {e}"),
                        )
                    })?;
            }
            *tx = Some(s);
        }
        tx.as_ref()
            .and_then(|s| s.send(job).ok())
            .ok_or_else(|| Failure::new(ORBITTE_ERR_BACKEND, "the copy workers are gone"))
    }
}

/// What the engine counted of its same-host copies.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) write_bytes: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) transfers: AtomicU64,
}

impl Counters {
    pub(crate) fn count(&self, op: Op, bytes: u64, calls: u64) {
        match op {
            Op::Write => &self.write_bytes,
            Op::Read => &self.read_bytes,
        }
        .fetch_add(bytes, Ordering::Relaxed);
        self.calls.fetch_add(calls, Ordering::Relaxed);
    }

    /// The counters in the Prometheus text format.
    pub(crate) fn to_prometheus(&self) -> String {
        let w = self.write_bytes.load(Ordering::Relaxed);
        let r = self.read_bytes.load(Ordering::Relaxed);
        format!(
            "# HELP orbitte_capi_cma_bytes_total Bytes copied with same-host peers by process_vm_writev and process_vm_readv.\n\
             # TYPE orbitte_capi_cma_bytes_total counter\n\
             orbitte_capi_cma_bytes_total{{op=\"write\"}} {w}\n\
             orbitte_capi_cma_bytes_total{{op=\"read\"}} {r}\n\
             # HELP orbitte_capi_cma_transfers_total Transfers copied with same-host peers.\n\
             # TYPE orbitte_capi_cma_transfers_total counter\n\
             orbitte_capi_cma_transfers_total {}\n\
             # HELP orbitte_capi_cma_calls_total System calls the same-host copies made.\n\
             # TYPE orbitte_capi_cma_calls_total counter\n\
             orbitte_capi_cma_calls_total {}\n",
            self.transfers.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(n: usize, len: u64) -> Vec<Seg> {
        (0..n as u64)
            .map(|i| Seg {
                local: 1000 * i,
                remote: 5000 * i,
                len,
            })
            .collect()
    }

    #[test]
    fn split_keeps_every_byte_in_order() {
        let s = segs(3, 10);
        let p = split(&s, 4);
        assert_eq!(p.len(), 4);
        let flat: Vec<(u64, u64)> = p.iter().flatten().map(|s| (s.local, s.len)).collect();
        let total: u64 = flat.iter().map(|f| f.1).sum();
        assert_eq!(total, 30);
        assert_eq!(flat[0], (0, 8));
        assert_eq!(flat[1], (8, 2));
        assert_eq!(flat[2], (1000, 6));
    }

    /// Copies per piece.
    type Copies = Arc<Vec<AtomicU64>>;
    /// What the finish saw each time it ran: the copies made by then.
    type Finishes = Arc<Mutex<Vec<u64>>>;

    /// A run of `n` one-byte pieces whose copies count per piece, and
    /// whose finish records how many copies were made when it ran.
    fn counting_run(n: usize, fail_at: Option<u64>) -> (Arc<Run>, Copies, Finishes) {
        let copies: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let finished = Arc::new(Mutex::new(Vec::new()));
        let pieces = segs(n, 1).into_iter().map(|s| vec![s]).collect();
        let c = copies.clone();
        let copy: CopyPiece = Box::new(move |p: &[Seg]| {
            let i = p[0].local / 1000;
            c[i as usize].fetch_add(1, Ordering::SeqCst);
            std::thread::yield_now();
            match fail_at {
                Some(f) if f == i => Err(CopyError {
                    code: ORBITTE_ERR_INVALID_PARAM,
                    why: format!("piece {i}"),
                }),
                _ => Ok(()),
            }
        });
        let (c, f) = (copies.clone(), finished.clone());
        let finish: Finish = Box::new(move |err| {
            let copied: u64 = c.iter().map(|a| a.load(Ordering::SeqCst)).sum();
            lock(&f).push(copied);
            match err {
                Some(e) => RunState::Failed(e),
                None => RunState::Copied(Vec::new()),
            }
        });
        (Run::new(pieces, copy, finish), copies, finished)
    }

    #[test]
    fn helpers_and_a_polling_thread_copy_each_piece_once_then_finish_once() {
        for _ in 0..20 {
            let (run, copies, finished) = counting_run(200, None);
            let helpers: Vec<_> = (0..3)
                .map(|_| {
                    let r = run.clone();
                    std::thread::spawn(move || while r.step().is_some() {})
                })
                .collect();
            // The polling thread: one piece per check, as the check does.
            while run.unclaimed() {
                run.step();
            }
            run.wait();
            for h in helpers {
                h.join().unwrap();
            }
            assert!(copies.iter().all(|c| c.load(Ordering::SeqCst) == 1));
            // Finished once, after every piece was copied.
            assert_eq!(*lock(&finished), vec![200]);
            assert!(matches!(*lock(&run.state), RunState::Copied(_)));
        }
    }

    #[test]
    fn a_failed_piece_fails_the_run_and_the_rest_are_not_copied() {
        let (run, copies, finished) = counting_run(10, Some(3));
        run.wait();
        assert!(matches!(&*lock(&run.state), RunState::Failed(e) if e.why == "piece 3"));
        let copied: Vec<u64> = copies.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        assert_eq!(copied, [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(lock(&finished).len(), 1);
    }

    #[test]
    fn copy_moves_bytes_within_this_process_in_batches() {
        // More runs than one call takes, to this very process.
        let n = IOV_MAX + 7;
        let src: Vec<u8> = (0..n * 16).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; n * 16];
        let segs: Vec<Seg> = (0..n)
            .map(|i| Seg {
                local: src.as_ptr() as u64 + (i * 16) as u64,
                remote: dst.as_mut_ptr() as u64 + ((n - 1 - i) * 16) as u64,
                len: 16,
            })
            .collect();
        let t = Target::open(pid_uid().0).unwrap();
        let calls = copy(&t, Op::Write, &segs).unwrap();
        assert_eq!(calls, 2);
        for i in 0..n {
            assert_eq!(dst[(n - 1 - i) * 16..][..16], src[i * 16..][..16]);
        }
    }

    #[test]
    fn an_unmapped_remote_address_is_an_invalid_param() {
        let src = [1u8; 16];
        let t = Target::open(pid_uid().0).unwrap();
        let e = copy(
            &t,
            Op::Write,
            &[Seg {
                local: src.as_ptr() as u64,
                remote: 8,
                len: 16,
            }],
        )
        .unwrap_err();
        assert_eq!(e.code, ORBITTE_ERR_INVALID_PARAM);
    }
}
