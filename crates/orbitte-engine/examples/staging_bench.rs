//! GB/s of the cuda-staging path *through the engine*, next to the raw
//! pinned `cuMemcpy` of the same device in the same run (the baseline):
//!
//! ```text
//! cargo run --release -p orbitte-engine --example staging_bench [-- MiB [iterations]]
//! ```
//!
//! Two engines in this process talk over the sim fabric (rdma rails, an
//! in-process "network" that copies bytes with memcpy at no set bandwidth),
//! so the figures are GPU copy + staging + engine (slicing, posting,
//! completions) + a memcpy network: an upper bound on what staging adds, not
//! a NIC figure. An engine WRITE/READ between host buffers on the same
//! fabric is printed as the network-only reference.
//!
//! Variants: raw pinned D2H and H2D (one copy each), engine host WRITE and
//! READ, then staged WRITE (GPU → remote) and READ (remote → GPU) at 1, 4
//! and 16 MiB chunks (one lane; GPU memory registered with
//! `engine.register`, requests through `submit` and `wait` like host ones). Median of `iterations` (default 5) after
//! one warm-up; the bytes of one staged round trip are checked. Without a
//! GPU it prints `skipped: ...` and exits 0, or 1 with
//! `ORBITTE_REQUIRE_GPU=1`.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte_cuda::{CopyStream, CudaBuffer, CudaDevice, PinnedBuffer, StagingPipeline};
use orbitte_engine::staging::StagingConfig;
use orbitte_engine::{
    Access, EngineBuilder, InProcessLink, PeerId, RangeId, TransferEngine, TransferRequest,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};

type Error = Box<dyn std::error::Error>;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5).max(1);
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            if std::env::var("ORBITTE_REQUIRE_GPU").as_deref() == Ok("1") {
                eprintln!("staging_bench: ORBITTE_REQUIRE_GPU=1 but the GPU is unusable: {e}");
                std::process::exit(1);
            }
            println!("skipped: {}", e.reason());
            return;
        }
    };
    if let Err(e) = run(&dev, mib << 20, iters) {
        eprintln!("staging_bench failed: {e}");
        std::process::exit(1);
    }
}

struct Bench {
    len: usize,
    iters: usize,
}

impl Bench {
    /// Median GB/s (10^9 bytes/s) of `f` after one warm-up.
    fn gbps(&self, mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
        f()?;
        let mut times = Vec::with_capacity(self.iters);
        for _ in 0..self.iters {
            let t = Instant::now();
            f()?;
            times.push(t.elapsed());
        }
        times.sort();
        Ok(self.len as f64 / times[self.iters / 2].as_secs_f64() / 1e9)
    }
}

fn line(name: &str, gbps: f64, baseline: f64) {
    println!(
        "{name:<58} {gbps:>7.2} GB/s  ({:>5.1}% of raw pinned)",
        100.0 * gbps / baseline
    );
}

/// Engines A and B on the sim fabric, A opened B; B publishes `len` bytes.
struct Net {
    _fabric: SimFabric,
    a: TransferEngine,
    _b: TransferEngine,
    range: RangeId,
    peer: PeerId,
}

/// [`Net`] whose engine A stages GPU memory on one lane of `chunk` bytes.
fn engines(len: usize, chunk: usize) -> Result<Net, Error> {
    let devs = vec![
        SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
        SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
    ];
    let timing = SimTiming {
        base_latency: Duration::ZERO,
        bytes_per_sec: 0,
        jitter: Duration::ZERO,
    };
    let fabric = SimFabric::new(
        SimDescription::new(devs)
            .with_delivery(Delivery::Background)
            .with_timing(timing),
        1,
    );
    let engine = |name: &str, dev: &str| {
        EngineBuilder::new(format!("bench-{name}"))
            .provider(fabric.provider_for(&[dev]))
            .slice_size(1 << 20)
            .max_in_flight(64)
            .signal_interval(8)
            .request_timeout(Duration::from_secs(60))
            .cuda_staging(StagingConfig {
                chunk,
                depth: 1,
                ..StagingConfig::default()
            })
            .build()
    };
    let a = engine("a", "a0")?;
    let b = engine("b", "b0")?;
    let dst = HostMemory::alloc(len)?;
    let rb = b.register_host(dst, Access::REMOTE_READ_WRITE)?;
    let (mut la, mut lb) = InProcessLink::pair();
    let peer = std::thread::scope(|s| {
        let hb = s.spawn(|| b.accept_peer(&mut lb));
        let pa = a.open_peer(&mut la);
        let _ = hb.join();
        pa
    })?;
    Ok(Net {
        _fabric: fabric,
        a,
        _b: b,
        range: RangeId(rb.id.0),
        peer: peer.id,
    })
}

fn run(dev: &CudaDevice, len: usize, iters: usize) -> Result<(), Error> {
    let info = dev.info()?;
    println!(
        "cuda-staging through the engine: device {} ({}, PCI {}), {} MiB per run, median of {iters}",
        info.index,
        info.name,
        info.pci_bus_id,
        len >> 20
    );
    println!("network: sim fabric (in-process memcpy, rdma rails), not a NIC");
    let b = Bench { len, iters };
    let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ 0xa5).collect();
    let gpu: Arc<CudaBuffer> = CudaBuffer::alloc(dev, 2 * len)?;
    let mut fill = StagingPipeline::new(dev, 16 << 20)?;
    fill.upload(&gpu, 0, len, |c| {
        c.write_from(&pattern[c.offset()..c.offset() + c.len()])
    })?;

    // Baseline: one raw pinned copy each way.
    let pinned = PinnedBuffer::alloc(dev, len)?;
    let stream = CopyStream::new(dev)?;
    let d2h = b.gbps(|| Ok(stream.download(&gpu, 0, &pinned, 0, len)?))?;
    let h2d = b.gbps(|| Ok(stream.upload(&pinned, 0, &gpu, len, len)?))?;
    let raw = d2h.min(h2d);
    line("raw pinned cuMemcpy D2H (baseline)", d2h, d2h);
    line("raw pinned cuMemcpy H2D (baseline)", h2d, h2d);

    let net = engines(len, 4 << 20)?;
    let (a, range, peer) = (&net.a, net.range, net.peer);
    // Network-only reference: host memory through the engine.
    let host = HostMemory::alloc(len)?;
    let rh = a.register_host(host, Access::LocalOnly)?;
    let engine_op = |r: TransferRequest| -> Result<(), Error> {
        let id = *a
            .submit(&[r])?
            .first()
            .ok_or("the engine returned no request id")?;
        let o = a.wait(id, Duration::from_secs(120))?;
        if !o.is_complete() {
            return Err(format!("engine request ended {o:?}").into());
        }
        Ok(())
    };
    let w = b.gbps(|| engine_op(TransferRequest::write(rh.id, 0, peer, range, 0, len as u64)))?;
    line(
        "engine WRITE host -> remote (no GPU; network reference)",
        w,
        raw,
    );
    let r = b.gbps(|| engine_op(TransferRequest::read(rh.id, 0, peer, range, 0, len as u64)))?;
    line(
        "engine READ remote -> host (no GPU; network reference)",
        r,
        raw,
    );

    for chunk_mib in [1usize, 4, 16] {
        let net = engines(len, chunk_mib << 20)?;
        let (a, range, peer) = (&net.a, net.range, net.peer);
        let reg = a.register(&gpu, Access::LocalOnly)?;
        let staged = |r: TransferRequest| -> Result<(), Error> {
            let id = *a
                .submit(&[r])?
                .first()
                .ok_or("the engine returned no request id")?;
            let o = a.wait(id, Duration::from_secs(120))?;
            if !o.is_complete() {
                return Err(format!("staged request ended {o:?}").into());
            }
            Ok(())
        };
        let w = b.gbps(|| {
            staged(TransferRequest::write(
                reg.id, 0, peer, range, 0, len as u64,
            ))
        })?;
        line(
            &format!("staged WRITE GPU -> remote, {chunk_mib} MiB chunks"),
            w,
            d2h,
        );
        let r = b.gbps(|| {
            staged(TransferRequest::read(
                reg.id, len as u64, peer, range, 0, len as u64,
            ))
        })?;
        line(
            &format!("staged READ remote -> GPU, {chunk_mib} MiB chunks"),
            r,
            h2d,
        );
    }
    // One checked round trip: GPU[0..len] -> remote -> GPU[len..2len].
    gpu.fill(len, len, 0)?;
    let reg = a.register(&gpu, Access::LocalOnly)?;
    for r in [
        TransferRequest::write(reg.id, 0, peer, range, 0, len as u64),
        TransferRequest::read(reg.id, len as u64, peer, range, 0, len as u64),
    ] {
        let id = *a
            .submit(&[r])?
            .first()
            .ok_or("the engine returned no request id")?;
        let o = a.wait(id, Duration::from_secs(120))?;
        a.wait_drain(id, Duration::from_secs(10))?;
        if !o.is_complete() {
            return Err(format!("checked round trip ended {o:?}").into());
        }
    }
    let mut back = vec![0u8; len];
    fill.download(&gpu, len, len, |c| {
        c.read_into(&mut back[c.offset()..c.offset() + c.len()])
    })?;
    if back != pattern {
        return Err("GPU -> remote -> GPU round trip corrupted data".into());
    }
    println!("round trip GPU -> remote -> GPU through the engine: bytes match");
    Ok(())
}
