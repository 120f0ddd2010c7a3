//! Baselines measured in the same run, so a figure can be judged: a raw
//! TCP socket over loopback for the tcp path, memcpy for the local path.
//! Each runs with the same block size and thread count for half of
//! `--duration` (at least 0.2 s).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use orbitte::transport::PathKind;

use super::report::Baseline;
use crate::cli::BenchArgs;
use crate::stats::gbps;

pub(crate) fn measure(path: PathKind, args: &BenchArgs, block: u64) -> Option<Baseline> {
    let duration = Duration::from_secs_f64((args.duration / 2.0).max(0.2));
    let block = usize::try_from(block).ok()?;
    let threads = args.threads as usize;
    let window = block * args.batch_size as usize;
    let r = match path {
        PathKind::Tcp => raw_socket(block, threads, duration),
        PathKind::Local => memcpy(block, window, threads, duration),
        _ => return None,
    };
    match r {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::warn!(error = %e, "baseline not measured");
            None
        }
    }
}

/// `threads` TCP connections over 127.0.0.1, each streaming `block`-byte
/// writes that the other end reads and drops: the socket ceiling, with no
/// protocol, no checks and no target memory.
fn raw_socket(block: usize, threads: usize, duration: Duration) -> std::io::Result<Baseline> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> std::io::Result<()> {
        for _ in 0..threads {
            let (stop, bytes) = (&stop, &bytes);
            let tx = TcpStream::connect(addr)?;
            let (rx, _) = listener.accept()?;
            tx.set_nodelay(true)?;
            s.spawn(move || {
                let mut rx = rx;
                let mut buf = vec![0u8; block.max(64 << 10)];
                while let Ok(n) = rx.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
            s.spawn(move || {
                let mut tx = tx;
                let buf = vec![0x5au8; block];
                while !stop.load(Ordering::Relaxed) {
                    if tx.write_all(&buf).is_err() {
                        break;
                    }
                }
            });
        }
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        Ok(())
    })?;
    let elapsed = start.elapsed();
    Ok(Baseline {
        name: "raw tcp socket (loopback, same block size and threads)".into(),
        gbps: gbps(bytes.load(Ordering::Relaxed), elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}

/// `threads` threads copying `block`-byte blocks between two buffers of
/// `window` bytes (the bench's window), the copy the local path does.
fn memcpy(
    block: usize,
    window: usize,
    threads: usize,
    duration: Duration,
) -> std::io::Result<Baseline> {
    let bytes = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let bytes = &bytes;
            s.spawn(move || {
                let src = vec![t as u8; window];
                let mut dst = vec![0u8; window];
                let mut n = 0u64;
                while start.elapsed() < duration {
                    for off in (0..window).step_by(block) {
                        let end = (off + block).min(window);
                        dst[off..end].copy_from_slice(&src[off..end]);
                        n += (end - off) as u64;
                    }
                    std::hint::black_box(&mut dst);
                }
                bytes.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    let elapsed = start.elapsed();
    Ok(Baseline {
        name: "memcpy (same block size, window and threads)".into(),
        gbps: gbps(bytes.load(Ordering::Relaxed), elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}
