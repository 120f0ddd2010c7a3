//! The measurement loop: `--threads` threads, each submitting batches of
//! `--batch-size` requests of one block size to its own window of the
//! remote range until `--duration` has passed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use orbitte::{Op, Outcome, Status};
use orbitte_engine::TransferRequest;

use super::backend::{Backend, Req, thread_base};
use super::report::Point;
use super::settings::engine_op;
use crate::cli::BenchArgs;
use crate::failure::Failure;
use crate::pattern::target_byte;
use crate::stats::{CpuTicks, Latencies, ThreadCpu, gbps, thread_cpu_time};

/// Byte `i` of block `block` of batch number `seq` of thread `t` (what a
/// WRITE with `--check` sends).
fn write_byte(t: usize, seq: u64, i: u64) -> u8 {
    (i.wrapping_mul(131) ^ seq.wrapping_mul(0x2545_F491) ^ (t as u64) << 5) as u8
}

fn describe(o: &Outcome) -> String {
    let failure = o
        .failure
        .as_ref()
        .map_or_else(|| "no failure information".to_owned(), ToString::to_string);
    format!(
        "request {} ({:?}, {} bytes) ended {:?}: completed prefix {} bytes, {failure}, remote effect {:?}, drain {:?}",
        o.request, o.op, o.len, o.status, o.completed_prefix, o.remote_effect, o.drain
    )
}

/// Runs one batch, recording each outcome's latency in `lat` if given;
/// fails on the first request that did not complete (after the whole
/// batch ended).
fn run_complete(
    backend: &Backend,
    batch: &[TransferRequest],
    got: &mut Vec<Outcome>,
    mut lat: Option<&mut Latencies>,
) -> Result<(), Failure> {
    let mut failed = None;
    backend.run(batch, got, |o, d| {
        if o.status != Status::Complete && failed.is_none() {
            failed = Some(describe(o));
        }
        if let Some(lat) = lat.as_deref_mut() {
            lat.record(d);
        }
    })?;
    match failed {
        Some(e) => Err(Failure::failed(e)),
        None => Ok(()),
    }
}

struct Shared {
    stop: AtomicBool,
    bytes: AtomicU64,
    ops: AtomicU64,
    checked: AtomicU64,
    /// CPU nanoseconds the initiator threads used in their timed loops.
    cpu_ns: AtomicU64,
    /// A thread could not read its CPU time.
    cpu_unknown: AtomicBool,
}

/// Measures one block size.
pub(crate) fn run(
    backend: &Backend,
    args: &BenchArgs,
    block: u64,
    bar: &ProgressBar,
) -> Result<Point, Failure> {
    let threads = args.threads as usize;
    let batch = u64::from(args.batch_size);
    let window = block * batch;
    let shared = Shared {
        stop: AtomicBool::new(false),
        bytes: AtomicU64::new(0),
        ops: AtomicU64::new(0),
        checked: AtomicU64::new(0),
        cpu_ns: AtomicU64::new(0),
        cpu_unknown: AtomicBool::new(false),
    };
    let duration = Duration::from_secs_f64(args.duration);
    let first_error: Mutex<Option<Failure>> = Mutex::new(None);
    let latencies: Mutex<Latencies> = Mutex::new(Latencies::default());
    // One untimed batch per thread: the local windows are faulted in and
    // the sessions are warm before the clock starts.
    for t in 0..threads {
        let batch = backend.transfer_requests(t, &requests(backend, args, t, block), false);
        run_complete(backend, &batch, &mut Vec::new(), None)?;
    }
    let ticks = CpuTicks::now();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (shared, first_error, latencies) = (&shared, &first_error, &latencies);
            s.spawn(move || {
                let mut lat = Latencies::default();
                let cpu = thread_cpu_time();
                let r = thread_loop(
                    backend, args, t, block, window, start, duration, shared, &mut lat,
                );
                match (cpu, thread_cpu_time()) {
                    (Some(before), Some(after)) => {
                        let used = after.saturating_sub(before);
                        shared.cpu_ns.fetch_add(
                            u64::try_from(used.as_nanos()).unwrap_or(u64::MAX),
                            Ordering::Relaxed,
                        );
                    }
                    _ => shared.cpu_unknown.store(true, Ordering::Relaxed),
                }
                if let Err(f) = r {
                    shared.stop.store(true, Ordering::Release);
                    let mut e = first_error.lock().unwrap_or_else(|p| p.into_inner());
                    e.get_or_insert(f);
                }
                latencies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .merge(lat);
            });
        }
        // The progress bar, from this thread.
        while !shared.stop.load(Ordering::Acquire) && start.elapsed() < duration {
            std::thread::sleep(Duration::from_millis(100));
            let e = start.elapsed();
            bar.set_position(e.as_millis() as u64);
            bar.set_message(format!(
                "{:.2} GB/s",
                gbps(shared.bytes.load(Ordering::Relaxed), e)
            ));
        }
    });
    let elapsed = start.elapsed();
    let cpu = CpuTicks::now()
        .zip(ticks)
        .and_then(|(now, then)| now.since(&then));
    if let Some(f) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(f);
    }
    // Every request had its outcome; now nothing may stay outstanding on
    // the local buffers.
    let drain_deadline = Instant::now() + Duration::from_secs(5);
    while backend.outstanding_slices() != 0 && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let outstanding = backend.outstanding_slices();
    if outstanding != 0 {
        return Err(Failure::failed(format!(
            "{outstanding} slice(s) still outstanding 5 s after the last outcome: the local buffers are not drained; rerun with --log debug and report it"
        )));
    }
    let bytes = shared.bytes.load(Ordering::Relaxed);
    let ops = shared.ops.load(Ordering::Relaxed);
    let mut lat = latencies.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(Point {
        block_size: block,
        seconds: elapsed.as_secs_f64(),
        bytes,
        requests: ops,
        gbps: gbps(bytes, elapsed),
        ops_per_s: ops as f64 / elapsed.as_secs_f64().max(1e-9),
        latency: lat.summary(),
        checked_bytes: args.check.then(|| shared.checked.load(Ordering::Relaxed)),
        drained: true,
        rounds_gbps: vec![gbps(bytes, elapsed)],
        cpu,
        initiator_cpu: if shared.cpu_unknown.load(Ordering::Relaxed) {
            None
        } else {
            ThreadCpu::new(
                Duration::from_nanos(shared.cpu_ns.load(Ordering::Relaxed)),
                threads,
                elapsed,
                ops,
            )
        },
        baseline: None,
        limit: None,
    })
}

/// Thread `t`'s batch: `--batch-size` requests of `block` bytes over its
/// window.
fn requests(backend: &Backend, args: &BenchArgs, t: usize, block: u64) -> Vec<Req> {
    let base = thread_base(backend, args, t);
    (0..u64::from(args.batch_size))
        .map(|j| Req {
            op: engine_op(args.op),
            local_offset: j * block,
            remote_offset: base + j * block,
            len: block,
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn thread_loop(
    backend: &Backend,
    args: &BenchArgs,
    t: usize,
    block: u64,
    window: u64,
    start: Instant,
    duration: Duration,
    shared: &Shared,
    lat: &mut Latencies,
) -> Result<(), Failure> {
    let op = engine_op(args.op);
    let base = thread_base(backend, args, t);
    let reqs = requests(backend, args, t, block);
    let batch = backend.transfer_requests(t, &reqs, false);
    let back = if args.check && op == Op::Write {
        let back: Vec<Req> = reqs.iter().map(|r| Req { op: Op::Read, ..*r }).collect();
        backend.transfer_requests(t, &back, true)
    } else {
        Vec::new()
    };
    let mut got = Vec::with_capacity(batch.len());
    let local = backend.local(t);
    let win = usize::try_from(window).map_err(|_| Failure::usage("window too large"))?;
    let mut buf = vec![0u8; if args.check { win } else { 0 }];
    let mut seq = 0u64;
    // At least one batch per thread, however loaded the machine: a point
    // without a sample says nothing.
    while !shared.stop.load(Ordering::Acquire) && (seq == 0 || start.elapsed() < duration) {
        seq += 1;
        if args.check && op == Op::Write {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = write_byte(t, seq, i as u64);
            }
            local
                .write_at(0, &buf)
                .map_err(|e| Failure::failed(e.to_string()))?;
        }
        run_complete(backend, &batch, &mut got, Some(lat))?;
        shared.bytes.fetch_add(window, Ordering::Relaxed);
        shared.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if args.check {
            if op == Op::Write {
                // The remote bytes, read back into scratch memory.
                run_complete(backend, &back, &mut got, None)?;
            }
            verify(backend, t, op, seq, base, &mut buf)?;
            shared.checked.fetch_add(window, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// READ: the local bytes are the target's initial pattern at the remote
/// offsets. WRITE: the remote bytes, which the caller read back into
/// scratch memory, are the bytes sent.
fn verify(
    backend: &Backend,
    t: usize,
    op: Op,
    seq: u64,
    base: u64,
    buf: &mut [u8],
) -> Result<(), Failure> {
    let mem = if op == Op::Write {
        backend.scratch(t)
    } else {
        backend.local(t)
    };
    mem.read_at(0, buf)
        .map_err(|e| Failure::failed(e.to_string()))?;
    for (i, &b) in buf.iter().enumerate() {
        let want = if op == Op::Write {
            write_byte(t, seq, i as u64)
        } else {
            target_byte(base + i as u64)
        };
        if b != want {
            return Err(Failure::failed(format!(
                "data check failed: thread {t}, batch {seq}, byte {i} of the window is {b:#04x}, expected {want:#04x}{}",
                if op == Op::Read {
                    " (a READ check expects the bench pattern, which nobody overwrote: start the target with `orbitte bench --role target`, or give the `orbitte serve` range fill = \"pattern\" in its config)"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(())
}
