//! Baselines measured in the same run and the same way the path moves
//! bytes, so that a figure can be judged:
//!
//! - local: memcpy with the path's own copy (`HostMemory::copy_from`),
//!   block by block over the batch's window, one thread per initiator
//!   thread, between the path's own memory where the bench can reach it
//!   (loopback: the thread's local window and its part of the target's
//!   range) and otherwise between two memfd-backed windows of its own;
//!   where the path copies part of a batch on a second thread (its rail's
//!   worker, beyond what the posting thread copies), so does the
//!   baseline, at the same time;
//! - tcp: raw socket pairs doing the path's exchange over as many
//!   connections as the path has rails (WRITE: a header and the payload one
//!   way, a small ack back per request; READ: a small request, a header and
//!   the payload back), each thread's batch split evenly over its
//!   connections, one part in flight per connection, a thread per
//!   connection; a thread's batch ends when every part of it is answered
//!   (the connections meet there), as the path's batch does;
//! - tcp: the loopback limit, the best of a few raw settings (two streams
//!   of 1 MiB writes, with the kernel's autotuned and with 4 MiB socket
//!   buffers), with no protocol at all;
//! - rdma with `--sim`: raw verbs on the same simulated fabric
//!   ([`super::sim_verbs`]).
//!
//! Every buffer is written before the clock starts (no page faults and no
//! zero pages inside the measurement) and each exchange does one untimed
//! batch first. Each baseline runs for half of `--duration` (at least
//! 0.2 s).

use std::io::{IoSlice, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use orbitte::{HostMemory, Op, PathKind};

use super::timed::{Sample, Shape, timed, until_stopped};
use crate::stats::gbps;

/// Bytes of a request in the raw exchange: the size of the path's READ
/// and WRITE request frames without payload (12-byte frame header, ids,
/// token, offset, length).
const HEADER: usize = 48;
/// Bytes of an ack (WRITE) or answer header (READ) in the raw exchange:
/// the size of the path's response frames without payload.
const ACK: usize = 42;
/// Write size of the loopback limit's streams.
const LIMIT_WRITE: usize = 1 << 20;
/// Socket buffer size of the loopback limit's second setting.
const LIMIT_BUFFER: usize = 4 << 20;
/// Streams of the loopback limit.
const LIMIT_STREAMS: usize = 2;

/// What a baseline measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// memcpy over the batch's window (local), in the direction of the
    /// operation.
    Memcpy(Op),
    /// The tcp path's exchange on raw sockets.
    SameExchange(Op),
    /// The best raw loopback setting (tcp).
    LoopbackLimit,
    /// Raw verbs on the simulated fabric (rdma with `--sim`).
    SimVerbs(Op),
}

/// The baselines of `path` for `op` (`sim`: rdma on the simulated
/// fabric): the first is the one the path is judged against, a second
/// (tcp) is the loopback limit.
pub(crate) fn kinds(path: PathKind, op: Op, sim: bool) -> Vec<Kind> {
    match path {
        PathKind::Local => vec![Kind::Memcpy(op)],
        PathKind::Tcp => vec![Kind::SameExchange(op), Kind::LoopbackLimit],
        PathKind::Rdma if sim => vec![Kind::SimVerbs(op)],
        _ => Vec::new(),
    }
}

/// Baselines run for half of `--duration`, at least 0.2 s.
pub(crate) fn duration(seconds: f64) -> Duration {
    Duration::from_secs_f64((seconds / 2.0).max(0.2))
}

/// A thread's share of the path's own memory: its local window and, at
/// `remote_base`, its window of the target's range, which the local path
/// copies between (the same pages: the path maps the target's memory).
#[derive(Clone)]
pub(crate) struct PathWindows {
    pub(crate) local: std::sync::Arc<HostMemory>,
    pub(crate) remote: std::sync::Arc<HostMemory>,
    pub(crate) remote_base: usize,
}

/// Bytes of memory `kinds` allocate for themselves at `shape`: two
/// windows per thread, none for a memcpy that copies the path's own pages
/// (`own`, one per thread).
pub(crate) fn bytes_needed(kinds: &[Kind], shape: Shape, own: &[PathWindows]) -> u64 {
    let windows = 2 * (shape.block * shape.batch * shape.threads) as u64;
    let allocates = |k: &Kind| !matches!(k, Kind::Memcpy(_)) || own.len() < shape.threads;
    if kinds.iter().any(allocates) {
        windows
    } else {
        0
    }
}

/// Measures a baseline; `own`: the path's memory per thread, where the
/// bench can reach it (memcpy then copies between those pages instead of
/// windows of its own).
pub(crate) fn measure(kind: Kind, shape: Shape, own: &[PathWindows]) -> std::io::Result<Sample> {
    match kind {
        Kind::Memcpy(op) => memcpy(op, shape, own),
        Kind::SameExchange(op) => same_exchange(op, shape),
        Kind::LoopbackLimit => loopback_limit(shape.duration),
        Kind::SimVerbs(op) => super::sim_verbs::measure(op, shape),
    }
}

/// A buffer of `len` bytes, every page written.
fn faulted(len: usize) -> Vec<u8> {
    vec![0x5a; len]
}

/// Bytes of each batch that the local path copies on the thread that
/// posts it when its rail is idle: whole blocks up to
/// [`INLINE_BYTES`](orbitte_engine::INLINE_BYTES), or that
/// much of a block larger than it (cut into slices). The rest of the batch
/// goes to the path's copy workers, one of which copies at the same time. (The
/// path counts slices, not blocks: for a block that is not a multiple of
/// the slice size it may copy up to one slice more here.)
fn inline_bytes(block: usize, batch: usize) -> usize {
    let inline = usize::try_from(orbitte_engine::INLINE_BYTES).unwrap_or(usize::MAX);
    let window = block.saturating_mul(batch);
    if window <= inline {
        window
    } else if block <= inline {
        inline / block * block
    } else {
        inline
    }
}

/// Where one thread's copies read and write: `src` from `src_base` on,
/// `dst` from `dst_base` on.
#[derive(Clone, Copy)]
struct Span<'a> {
    src: &'a HostMemory,
    src_base: usize,
    dst: &'a HostMemory,
    dst_base: usize,
}

/// Copies the bytes at `range` of the span's source to the same place of
/// its destination in `block`-byte blocks (the last one may be shorter)
/// with the local path's copy.
fn copy_blocks(span: Span<'_>, range: std::ops::Range<usize>, block: usize) -> std::io::Result<()> {
    let mut off = range.start;
    while off < range.end {
        let n = block.min(range.end - off);
        span.dst
            .copy_from(span.dst_base + off, span.src, span.src_base + off, n)
            .map_err(std::io::Error::other)?;
        off += n;
    }
    Ok(())
}

/// One thread per initiator thread, copying `block`-byte blocks over a
/// window of `block x batch` bytes with the local path's copy: between
/// the path's own memory (`own`, one per thread: WRITE from the local
/// window to the target's range, READ the other way) when there is one
/// for every thread, else between two memfd-backed windows of its own.
/// Split as the path splits a batch: a batch larger than the path copies
/// on its posting thread ([`inline_bytes`]) has its rest copied by a
/// second thread at the same time, and the next batch starts when both
/// are done.
///
/// At 64 KiB x 16 the two windows fill a core's L2, and a memcpy's rate
/// there depends on where their pages lie in physical memory (windows
/// allocated side by side differ by a sixth and keep their rate): only
/// the path's own pages give the path's ceiling.
fn memcpy(op: Op, shape: Shape, own: &[PathWindows]) -> std::io::Result<Sample> {
    let window = shape.block * shape.batch;
    let split = inline_bytes(shape.block, shape.batch);
    let own = own.get(..shape.threads);
    let fresh = match own {
        Some(_) => Vec::new(),
        None => (0..shape.threads)
            .map(|_| -> std::io::Result<_> { Ok((alloc(window)?, alloc(window)?)) })
            .collect::<std::io::Result<Vec<_>>>()?,
    };
    let span = |t: usize| -> Span<'_> {
        match own {
            Some(own) => {
                let w = &own[t];
                let (local, remote) = ((&*w.local, 0), (&*w.remote, w.remote_base));
                let ((src, src_base), (dst, dst_base)) = match op {
                    Op::Write => (local, remote),
                    Op::Read => (remote, local),
                };
                Span {
                    src,
                    src_base,
                    dst,
                    dst_base,
                }
            }
            None => Span {
                src: &fresh[t].0,
                src_base: 0,
                dst: &fresh[t].1,
                dst_base: 0,
            },
        }
    };
    let (bytes, elapsed) = timed(shape.threads, shape.duration, |t, stop, ready| {
        let span = span(t);
        if split >= window {
            return until_stopped(stop, ready, || {
                copy_blocks(span, 0..window, shape.block)?;
                Ok(window as u64)
            });
        }
        split_copies(span, shape.block, split, window, stop, ready)
    })?;
    let how = if split >= window {
        format!("{} thread(s)", shape.threads)
    } else {
        format!(
            "{} thread(s), each batch's first {} KiB on one and the other {} KiB on a second at the same time, as the local path splits a batch",
            shape.threads,
            split >> 10,
            (window - split) >> 10
        )
    };
    let memory = if own.is_some() {
        "between the path's own local window and the target's range"
    } else {
        "between two windows of its own, pre-faulted"
    };
    Ok(Sample {
        name: format!(
            "memcpy ({how}, {} KiB blocks over a {} KiB window, {memory})",
            shape.block >> 10,
            window >> 10
        ),
        gbps: gbps(bytes, elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}

/// Copies batches of `window` bytes until `stop`: this thread copies the
/// first `split` bytes of each while a second thread copies the rest,
/// and the next batch starts when both are done. Calls `ready` after the
/// first batch and returns the bytes of the batches after it.
fn split_copies(
    span: Span<'_>,
    block: usize,
    split: usize,
    window: usize,
    stop: &AtomicBool,
    ready: &dyn Fn(),
) -> std::io::Result<u64> {
    let start = Barrier::new(2);
    let end = Barrier::new(2);
    let done = AtomicBool::new(false);
    let failed = std::sync::Mutex::new(None);
    std::thread::scope(|s| {
        s.spawn(|| {
            loop {
                start.wait();
                if done.load(Ordering::Acquire) {
                    return;
                }
                if let Err(e) = copy_blocks(span, split..window, block) {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
                end.wait();
            }
        });
        let batch = || -> std::io::Result<u64> {
            start.wait();
            let mine = copy_blocks(span, 0..split, block);
            end.wait();
            let theirs = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
            mine?;
            theirs.map_or(Ok(()), Err)?;
            Ok(window as u64)
        };
        let result = until_stopped(stop, ready, batch);
        done.store(true, Ordering::Release);
        start.wait();
        result
    })
}

/// A memfd-backed window with every page written (the path's kind of
/// memory).
fn alloc(len: usize) -> std::io::Result<std::sync::Arc<HostMemory>> {
    let m = HostMemory::alloc(len).map_err(std::io::Error::other)?;
    m.fill(0, len, 0x5a).map_err(std::io::Error::other)?;
    Ok(m)
}

/// `n` connected pairs over 127.0.0.1 with Nagle off (as the tcp path's
/// sessions).
fn pairs(n: usize) -> std::io::Result<Vec<(TcpStream, TcpStream)>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    (0..n)
        .map(|_| {
            let c = TcpStream::connect(addr)?;
            let (s, _) = listener.accept()?;
            c.set_nodelay(true)?;
            s.set_nodelay(true)?;
            Ok((c, s))
        })
        .collect()
}

/// Writes all of `bufs` (header and payload in one call where the kernel
/// takes them).
fn write_all_vectored(s: &mut TcpStream, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        let n = s.write_vectored(bufs)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// The target side of one connection: answers requests until the
/// initiator closes it.
fn serve_exchange(op: Op, mut s: TcpStream, memory: &mut [u8]) -> std::io::Result<()> {
    let mut header = [0u8; HEADER];
    let ack = [1u8; ACK];
    loop {
        match s.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let field = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[i..i + 8]);
            u64::from_le_bytes(b) as usize
        };
        let (off, len) = (field(0), field(8));
        let Some(range) = memory.get_mut(off..off.saturating_add(len)) else {
            return Err(std::io::Error::other("raw exchange: offset out of range"));
        };
        match op {
            Op::Write => {
                s.read_exact(range)?;
                s.write_all(&ack)?;
            }
            Op::Read => {
                write_all_vectored(&mut s, &mut [IoSlice::new(&ack), IoSlice::new(range)])?;
            }
        }
    }
}

/// One batch of the exchange from the initiator side: `batch` requests of
/// `block` bytes on `window`, all sent, then all answers read.
fn exchange_batch(
    op: Op,
    s: &mut TcpStream,
    window: &mut [u8],
    block: usize,
    headers: &[u8],
) -> std::io::Result<u64> {
    let batch = headers.len() / HEADER;
    let mut ack = [0u8; ACK];
    match op {
        Op::Write => {
            for j in 0..batch {
                let h = &headers[j * HEADER..(j + 1) * HEADER];
                let p = &window[j * block..(j + 1) * block];
                write_all_vectored(s, &mut [IoSlice::new(h), IoSlice::new(p)])?;
            }
            for _ in 0..batch {
                s.read_exact(&mut ack)?;
            }
        }
        Op::Read => {
            s.write_all(headers)?;
            for j in 0..batch {
                s.read_exact(&mut ack)?;
                s.read_exact(&mut window[j * block..(j + 1) * block])?;
            }
        }
    }
    Ok((batch * block) as u64)
}

/// The tcp path's exchange on raw sockets over as many connections as the
/// path's rails, each thread's batch split evenly over its connections,
/// one part in flight per connection; a thread's batch ends when all its
/// parts are answered.
fn same_exchange(op: Op, shape: Shape) -> std::io::Result<Sample> {
    let conns = shape.connections.max(shape.threads).max(1);
    let batch = (shape.batch * shape.threads / conns).max(1);
    let window = shape.block * batch;
    let pairs = pairs(conns)?;
    let mut headers = vec![0u8; HEADER * batch];
    for j in 0..batch {
        let h = &mut headers[j * HEADER..(j + 1) * HEADER];
        h[..8].copy_from_slice(&((j * shape.block) as u64).to_le_bytes());
        h[8..16].copy_from_slice(&(shape.block as u64).to_le_bytes());
    }
    let (initiators, targets): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    let initiators: Vec<_> = initiators.into_iter().map(std::sync::Mutex::new).collect();
    let per_thread = (conns / shape.threads.max(1)).max(1);
    let ends: Vec<BatchEnd> = (0..conns.div_ceil(per_thread))
        .map(|_| BatchEnd::new(per_thread))
        .collect();
    let (bytes, elapsed) = std::thread::scope(|s| {
        for t in targets {
            s.spawn(move || {
                let mut memory = faulted(window);
                if let Err(e) = serve_exchange(op, t, &mut memory) {
                    tracing::debug!(error = %e, "raw exchange target");
                }
            });
        }
        timed(conns, shape.duration, |t, stop, ready| {
            let mut conn = initiators[t]
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?;
            let mut window = faulted(window);
            let end = &ends[t / per_thread];
            let r = exchange_batches(stop, ready, end, || {
                exchange_batch(op, &mut conn, &mut window, shape.block, &headers)
            });
            // The target side ends when its connection closes.
            let _ = conn.shutdown(std::net::Shutdown::Both);
            r
        })
    })?;
    Ok(Sample {
        name: format!(
            "raw tcp, the path's {} exchange ({} connection(s), {} of {} KiB in flight on each)",
            match op {
                Op::Read => "READ",
                Op::Write => "WRITE",
            },
            conns,
            batch,
            shape.block >> 10
        ),
        gbps: gbps(bytes, elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}

/// The best of the raw loopback settings, each for half of `duration`.
fn loopback_limit(duration: Duration) -> std::io::Result<Sample> {
    let half = duration / 2;
    let mut best: Option<Sample> = None;
    for (buffer, sendfile) in [
        (None, false),
        (Some(LIMIT_BUFFER), false),
        (Some(LIMIT_BUFFER), true),
    ] {
        let s = stream(LIMIT_STREAMS, buffer, sendfile, half)?;
        if best.as_ref().is_none_or(|b| s.gbps > b.gbps) {
            best = Some(s);
        }
    }
    let mut best = best.ok_or_else(|| std::io::Error::other("no setting measured"))?;
    best.seconds = duration.as_secs_f64();
    Ok(best)
}

/// `streams` connections, each streaming 1 MiB writes that the other end
/// reads and drops; `buffer`: the socket buffer size asked for (else the
/// kernel's autotuning); `sendfile`: each write is a `sendfile(2)` from a
/// memfd (as the tcp path sends registered memory: on loopback the pages
/// go by reference, so the receiver's copy is the only one) instead of a
/// `write(2)` from a buffer.
fn stream(
    streams: usize,
    buffer: Option<usize>,
    sendfile: bool,
    duration: Duration,
) -> std::io::Result<Sample> {
    let pairs = pairs(streams)?;
    let mut granted = None;
    if let Some(size) = buffer {
        for (c, s) in &pairs {
            rustix::net::sockopt::set_socket_send_buffer_size(c, size)?;
            rustix::net::sockopt::set_socket_recv_buffer_size(s, size)?;
        }
        granted = Some(rustix::net::sockopt::socket_recv_buffer_size(&pairs[0].1)?);
    }
    let (senders, receivers): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
    let (bytes, elapsed) = std::thread::scope(|s| {
        for mut r in receivers {
            s.spawn(move || {
                let mut buf = faulted(LIMIT_WRITE);
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
        let senders: Vec<_> = senders.into_iter().map(std::sync::Mutex::new).collect();
        timed(streams, duration, |t, stop, ready| {
            let mut tx = senders[t]
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?;
            let buf = faulted(LIMIT_WRITE);
            let file = alloc(LIMIT_WRITE)?;
            file.write_at(0, &buf).map_err(std::io::Error::other)?;
            let send = |tx: &mut TcpStream| -> std::io::Result<()> {
                let Some(fd) = file.memfd().filter(|_| sendfile) else {
                    return tx.write_all(&buf);
                };
                let mut off = 0u64;
                while off < LIMIT_WRITE as u64 {
                    let left = LIMIT_WRITE - off as usize;
                    match rustix::fs::sendfile(&*tx, fd, Some(&mut off), left) {
                        Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            };
            let r = until_stopped(stop, ready, || {
                send(&mut tx)?;
                Ok(LIMIT_WRITE as u64)
            });
            let _ = tx.shutdown(std::net::Shutdown::Both);
            r
        })
    })?;
    Ok(Sample {
        name: format!(
            "loopback limit: raw tcp, {streams} streams of 1 MiB {}, {}",
            if sendfile {
                "sendfile from a memfd"
            } else {
                "writes"
            },
            match granted {
                Some(g) => format!("{} KiB socket buffers", g >> 10),
                None => "autotuned socket buffers".to_owned(),
            }
        ),
        gbps: gbps(bytes, elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of one batch wait for each other, every part gets the same
    /// stop answer for the same batch, and a failed part frees the rest.
    #[test]
    fn the_parts_of_a_batch_end_together_and_stop_together() {
        let end = BatchEnd::new(3);
        let stop = AtomicBool::new(false);
        let batches = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for part in 0..3u64 {
                let (end, stop, batches) = (&end, &stop, &batches);
                s.spawn(move || {
                    let mut n = 0u64;
                    loop {
                        n += 1;
                        if part == 0 && n == 50 {
                            stop.store(true, Ordering::Relaxed);
                        }
                        // A part that runs ahead would count more batches.
                        std::thread::sleep(Duration::from_micros(100 * part));
                        if end.meet(stop) {
                            break;
                        }
                    }
                    batches.lock().unwrap().push(n);
                });
            }
        });
        let batches = batches.into_inner().unwrap();
        assert_eq!(batches.len(), 3);
        assert!(
            batches.iter().all(|&n| n == batches[0]),
            "every part ran as many batches: {batches:?}"
        );
        assert_eq!(batches[0], 50, "they stop after the batch that saw stop");

        let end = BatchEnd::new(2);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiting = s.spawn(|| end.meet(&stop));
            std::thread::sleep(Duration::from_millis(20));
            end.abandon();
            assert!(
                waiting.join().unwrap(),
                "an abandoned meeting stops its parts"
            );
        });
    }

    fn shape() -> Shape {
        Shape {
            block: 4096,
            batch: 4,
            threads: 2,
            connections: 4,
            duration: Duration::from_millis(50),
        }
    }

    #[test]
    fn each_baseline_moves_bytes() {
        for kind in [
            Kind::Memcpy(Op::Write),
            Kind::Memcpy(Op::Read),
            Kind::SameExchange(Op::Write),
            Kind::SameExchange(Op::Read),
            Kind::LoopbackLimit,
            Kind::SimVerbs(Op::Write),
            Kind::SimVerbs(Op::Read),
        ] {
            let s = measure(kind, shape(), &[]).unwrap();
            assert!(s.gbps > 0.0, "{kind:?}: {s:?}");
            assert!(s.seconds > 0.0, "{kind:?}: {s:?}");
        }
    }

    #[test]
    fn memcpy_splits_a_batch_where_the_local_path_does() {
        let inline = usize::try_from(orbitte_engine::INLINE_BYTES).unwrap();
        // A batch the posting thread copies whole.
        assert_eq!(inline_bytes(64 << 10, 16), 16 * (64 << 10));
        assert_eq!(inline_bytes(4096, 4), 4 * 4096);
        // Whole blocks up to the limit; slices of a larger block.
        assert_eq!(inline_bytes(128 << 10, 16), inline);
        assert_eq!(inline_bytes(3 << 18, 4), inline / (3 << 18) * (3 << 18));
        assert_eq!(inline_bytes(4 * inline, 2), inline);

        let one = measure(Kind::Memcpy(Op::Write), shape(), &[]).unwrap();
        assert!(
            one.name.starts_with("memcpy (2 thread(s), 4 KiB"),
            "{one:?}"
        );
        let split = measure(
            Kind::Memcpy(Op::Write),
            Shape {
                block: inline / 2,
                batch: 4,
                threads: 1,
                ..shape()
            },
            &[],
        )
        .unwrap();
        assert!(split.gbps > 0.0, "{split:?}");
        assert!(
            split.name.contains(&format!(
                "first {} KiB on one and the other {} KiB on a second",
                inline >> 10,
                inline >> 10
            )),
            "{split:?}"
        );
    }

    #[test]
    fn split_copies_copy_the_whole_window_once_both_threads_are_done() {
        let (block, window) = (4096, 10 * 4096 + 100);
        let src = HostMemory::alloc(window).unwrap();
        let dst = HostMemory::alloc(window).unwrap();
        let pattern: Vec<u8> = (0..window).map(|i| (i % 251) as u8).collect();
        src.write_at(0, &pattern).unwrap();
        // `stop` already set: one batch, not counted.
        let stop = AtomicBool::new(true);
        let readied = std::cell::Cell::new(0);
        let span = Span {
            src: &src,
            src_base: 0,
            dst: &dst,
            dst_base: 0,
        };
        let bytes = split_copies(span, block, 3 * block, window, &stop, &|| {
            readied.set(readied.get() + 1)
        })
        .unwrap();
        assert_eq!((bytes, readied.get()), (0, 1));
        assert_eq!(dst.to_vec(0, window).unwrap(), pattern);
    }

    #[test]
    fn memcpy_copies_between_the_paths_own_windows_in_the_operations_direction() {
        let shape = Shape {
            threads: 1,
            ..shape()
        };
        let window = shape.block * shape.batch;
        let base = 3 * 4096;
        let local = HostMemory::alloc(window).unwrap();
        let remote = HostMemory::alloc(base + window + 4096).unwrap();
        let own = [PathWindows {
            local: local.clone(),
            remote: remote.clone(),
            remote_base: base,
        }];
        let pattern: Vec<u8> = (0..window).map(|i| (i % 253) as u8).collect();

        // WRITE: the local window lands in the thread's part of the range.
        local.write_at(0, &pattern).unwrap();
        let w = measure(Kind::Memcpy(Op::Write), shape, &own).unwrap();
        assert!(w.name.contains("the path's own"), "{w:?}");
        assert_eq!(remote.to_vec(base, window).unwrap(), pattern);
        assert!(remote.to_vec(0, base).unwrap().iter().all(|b| *b == 0));

        // READ: the range's part lands in the local window.
        let other: Vec<u8> = pattern.iter().map(|b| b ^ 0xff).collect();
        remote.write_at(base, &other).unwrap();
        measure(Kind::Memcpy(Op::Read), shape, &own).unwrap();
        assert_eq!(local.to_vec(0, window).unwrap(), other);

        // Without them (or not one per thread) it copies windows of its own.
        let fresh = measure(
            Kind::Memcpy(Op::Write),
            Shape {
                threads: 2,
                ..shape
            },
            &own,
        )
        .unwrap();
        assert!(fresh.name.contains("windows of its own"), "{fresh:?}");
    }

    #[test]
    fn only_baselines_with_windows_of_their_own_need_memory() {
        let shape = Shape {
            threads: 1,
            ..shape()
        };
        let windows = 2 * (shape.block * shape.batch) as u64;
        let m = HostMemory::alloc(4096).unwrap();
        let own = [PathWindows {
            local: m.clone(),
            remote: m,
            remote_base: 0,
        }];
        let memcpy = [Kind::Memcpy(Op::Write)];
        assert_eq!(bytes_needed(&memcpy, shape, &own), 0);
        assert_eq!(bytes_needed(&memcpy, shape, &[]), windows);
        let two = Shape {
            threads: 2,
            ..shape
        };
        assert_eq!(bytes_needed(&memcpy, two, &own), 2 * windows);
        let tcp = kinds(PathKind::Tcp, Op::Read, false);
        assert_eq!(bytes_needed(&tcp, shape, &own), windows);
    }

    #[test]
    fn tcp_has_the_exchange_and_the_limit_local_has_memcpy() {
        assert_eq!(
            kinds(PathKind::Tcp, Op::Read, false),
            vec![Kind::SameExchange(Op::Read), Kind::LoopbackLimit]
        );
        assert_eq!(
            kinds(PathKind::Local, Op::Write, false),
            vec![Kind::Memcpy(Op::Write)]
        );
        assert_eq!(
            kinds(PathKind::Rdma, Op::Write, true),
            vec![Kind::SimVerbs(Op::Write)]
        );
        // A NIC has no baseline here.
        assert!(kinds(PathKind::Rdma, Op::Write, false).is_empty());
    }
}

/// Where the connections of one initiator thread meet at the end of each
/// batch: the thread's batch ends when every part of it is answered, as
/// the path's does (its caller waits for the whole batch before it
/// submits the next).
struct BatchEnd {
    parties: usize,
    state: std::sync::Mutex<Meeting>,
    met: std::sync::Condvar,
}

#[derive(Default)]
struct Meeting {
    /// Batches ended so far.
    generation: u64,
    /// Parts of the current batch that ended.
    arrived: usize,
    /// Whether the run stops after the batch that ended last (the same
    /// answer for every part).
    stop: bool,
    /// A part failed: nobody waits any more.
    abandoned: bool,
}

impl BatchEnd {
    fn new(parties: usize) -> Self {
        Self {
            parties,
            state: std::sync::Mutex::new(Meeting::default()),
            met: std::sync::Condvar::new(),
        }
    }

    /// Waits until every part of this batch ended; whether to stop (`stop`
    /// as the last part to end saw it).
    fn meet(&self, stop: &AtomicBool) -> bool {
        let mut m = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if m.abandoned {
            return true;
        }
        let generation = m.generation;
        m.arrived += 1;
        if m.arrived == self.parties {
            m.generation += 1;
            m.arrived = 0;
            m.stop = stop.load(Ordering::Relaxed);
            self.met.notify_all();
            return m.stop;
        }
        while m.generation == generation && !m.abandoned {
            m = self.met.wait(m).unwrap_or_else(|p| p.into_inner());
        }
        m.stop || m.abandoned
    }

    /// A part failed: the others stop waiting.
    fn abandon(&self) {
        let mut m = self.state.lock().unwrap_or_else(|p| p.into_inner());
        m.abandoned = true;
        self.met.notify_all();
    }
}

/// [`until_stopped`] for one connection's part of a thread's batches:
/// each batch ends at `end` with the thread's other connections, and they
/// stop together.
fn exchange_batches(
    stop: &AtomicBool,
    ready: &dyn Fn(),
    end: &BatchEnd,
    mut batch: impl FnMut() -> std::io::Result<u64>,
) -> std::io::Result<u64> {
    let r = (|| {
        batch()?;
        end.meet(stop);
        ready();
        let mut n = 0;
        loop {
            n += batch()?;
            if end.meet(stop) {
                return Ok(n);
            }
        }
    })();
    if r.is_err() {
        end.abandon();
    }
    r
}
