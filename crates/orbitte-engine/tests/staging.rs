//! The cuda-staging path through the engine, without a GPU: each test
//! builds orbitte-cuda's stub driver (`orbitte_cuda::testing`,
//! `testing/stub_libcuda.c`: a fake GPU whose "device memory" the process
//! cannot touch and whose copies really move bytes) with `cc`, then re-runs this test
//! binary as a child process with the stub first on LD_LIBRARY_PATH and one
//! `#[ignore]`d `child_*` entry selected. The child registers GPU memory
//! with `engine.register`, submits WRITEs and READs on it with the same
//! `Request` builders as host memory between two engines on the sim fabric
//! (rdma rails), and asserts bytes and `Outcome` fields; the parent
//! requires that exactly one test passed in the child, so any panic fails
//! it.
//!
//! Without `cc` the tests print `skipped: ...`, except under CI=true.
//! `real_driver_round_trip_or_skip` runs in this process: without a driver
//! it checks the "skipped: no CUDA driver (libcuda.so.1 not found)" answer;
//! with one (a GPU machine) it runs the round trip on device 0.
#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use orbitte_cuda::testing::{StubHarness, StubKind};
use orbitte_cuda::{CudaBuffer, CudaDevice};
use orbitte_engine::staging::{
    COMPUTE_PROBE_CAVEAT, LoopbackTarget, StagingConfig, StagingSetupError, cuda_rows,
    evaluate_cuda_staging,
};
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{
    Access, Budgets, CapabilityMatrix, Check, DrainStatus, EngineBuilder, MemoryPath, Op, PathKind,
    PeerId, RangeId, RegisterError, RemoteEffect, RemoteRange, Request, RequestError, Status,
    SubmitError, TransferEngine, UnregisterError,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::WcStatus;
use orbitte_verbs::sim::{Delivery, SimDescription, SimFabric, WrMatch};

const NO_DRIVER: &str = "no CUDA driver (libcuda.so.1 not found)";

/// Children of this binary are selected by `ORBITTE_STAGING_CHILD`.
const STUB: StubHarness = StubHarness::new("ORBITTE_STAGING_CHILD", "staging");

// ---- two engines on the sim fabric ------------------------------------------

const CHUNK: usize = 16 << 10;
const SLICE: u32 = 4096;

struct Pair {
    fabric: SimFabric,
    a: TransferEngine,
    b: TransferEngine,
    /// B's remotely accessible range.
    dst: Arc<HostMemory>,
    peer: PeerId,
    range: RemoteRange,
    /// A 4 KiB range of B that peers may only READ.
    read_only: RemoteRange,
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A's staging lanes: `depth` lanes of [`CHUNK`] bytes.
fn lanes(depth: usize) -> StagingConfig {
    StagingConfig {
        chunk: CHUNK,
        depth,
        ..StagingConfig::default()
    }
}

/// Engines A and B, `nics` RoCE NICs each, A opened B; B publishes
/// `remote_len` bytes (pattern seed 2) for remote READ and WRITE; A stages
/// GPU memory on `depth` lanes.
fn pair(nics: usize, signal_interval: u32, remote_len: usize, depth: usize) -> Pair {
    pair_timed(
        nics,
        signal_interval,
        remote_len,
        Duration::from_secs(5),
        lanes(depth),
    )
}

/// [`pair`] with A's request timeout and staging lanes.
fn pair_timed(
    nics: usize,
    signal_interval: u32,
    remote_len: usize,
    request_timeout: Duration,
    staging: StagingConfig,
) -> Pair {
    let fabric = common::fabric(nics, Delivery::Background, 7);
    let engine = |h: &str| {
        let names = common::names(h, nics);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        EngineBuilder::new(format!("staging-{h}"))
            .provider(fabric.provider_for(&refs))
            .slice_size(SLICE)
            .request_timeout(request_timeout)
            .drain_timeout(Duration::from_millis(200))
            .handshake_timeout(Duration::from_secs(5))
            .max_in_flight(16)
            .signal_interval(signal_interval)
            .budgets(Budgets::default())
            .cuda_staging(staging)
            .build()
            .expect("build engine")
    };
    let a = engine("a");
    let b = engine("b");
    let dst = HostMemory::alloc(remote_len).unwrap();
    dst.write_at(0, &pattern(remote_len, 2)).unwrap();
    let rb = b
        .register_host(dst.clone(), Access::REMOTE_READ_WRITE)
        .expect("register B's range");
    let ro = b
        .register_host(HostMemory::alloc(4096).unwrap(), Access::RemoteRead)
        .expect("register B's read-only range");
    let (peer, _) = common::connect(&a, &b);
    let published = |id: u64| {
        *peer
            .ranges
            .iter()
            .find(|r| r.range == RangeId(id))
            .expect("B's range is published")
    };
    Pair {
        fabric,
        peer: peer.id,
        range: published(rb.id.0),
        read_only: published(ro.id.0),
        a,
        b,
        dst,
    }
}

use common::{gpu_get as get, gpu_put as put, run};

/// Submits one request that must be refused; returns why.
fn refused(e: &TransferEngine, r: Request) -> RequestError {
    match e.submit(&[r]) {
        Err(SubmitError::Invalid { error, .. }) => error,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---- scenarios (run in a child on the fake GPU, or on a real one) -----------

/// WRITE GPU -> B and READ B -> GPU, 100 000 bytes in 7 chunks (the last
/// partial), over 2 rails, checked byte for byte; then two staged WRITEs in
/// one batch (two lanes at once); unregistering the GPU memory releases
/// the bounce registrations.
fn round_trip_scenario() {
    const LEN: usize = 100_000;
    let p = pair(2, 4, 300_000, 2);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 2 * LEN).unwrap();
    let src = pattern(LEN, 1);
    put(&dev, &gpu, 0, &src);
    let before = p.a.charges();
    assert_eq!(
        p.a.cuda_staging(0),
        None,
        "no lanes before a CUDA registration"
    );
    let reg = p.a.register(&gpu, Access::LocalOnly).unwrap();
    assert_eq!(reg.path, MemoryPath::CudaStaging);
    assert_eq!(reg.len, 2 * LEN as u64);
    let status = p.a.cuda_staging(0).expect("lanes made at registration");
    assert_eq!(status.bounce_registrations.len(), 4, "two per lane");
    let charged = p.a.charges();
    assert!(
        charged.bytes >= before.bytes + 4 * CHUNK as u64,
        "bounce buffers are charged like any Host Direct range: {before:?} -> {charged:?}"
    );

    let id =
        p.a.submit(&[Request::write(&reg, 0..LEN as u64)
            .to(&p.range, 1000)
            .label(9)])
            .unwrap()[0];
    let w = p.a.wait(id, Duration::from_secs(30)).unwrap();
    assert_eq!(w.request, id);
    assert_eq!(w.status, Status::Complete, "{w:?}");
    assert_eq!(w.label, 9);
    assert_eq!(w.completed_prefix, LEN as u64);
    assert_eq!((w.slices, w.completed_slices), (7, 7), "slices are chunks");
    assert_eq!(w.failure, None);
    assert_eq!(w.remote_effect, RemoteEffect::Complete);
    assert_eq!(w.drain, DrainStatus::Drained);
    assert_eq!(p.a.drain_status(id), DrainStatus::Drained);
    assert!(w.uncertain.is_empty(), "{w:?}");
    assert_eq!(p.a.poll(id), None, "the outcome was taken");
    let remote = p.dst.to_vec(0, 300_000).unwrap();
    assert_eq!(remote[1000..1000 + LEN], src[..], "GPU bytes arrived at B");
    assert_eq!(
        remote[..1000],
        pattern(300_000, 2)[..1000],
        "bytes before untouched"
    );
    assert_eq!(remote[1000 + LEN..], pattern(300_000, 2)[1000 + LEN..]);

    let r = run(
        &p.a,
        Request::read(&reg, LEN as u64..2 * LEN as u64).from(&p.range, 1000),
    );
    assert!(r.is_complete(), "{r:?}");
    assert_eq!(r.completed_prefix, LEN as u64);
    assert_eq!(r.remote_effect, RemoteEffect::None);
    assert_eq!(r.drain, DrainStatus::Drained);
    assert_eq!(
        get(&dev, &gpu, LEN, LEN),
        src,
        "B's bytes landed in GPU memory"
    );

    // Two staged requests at once, one per lane, by address too.
    let ids =
        p.a.submit(&[
            Request::write(&reg, 0..50_000).to(&p.range, 150_000),
            Request::write(&reg, 50_000..100_000).to_address(p.peer, p.range.address + 200_000),
        ])
        .unwrap();
    for o in p.a.wait_all(&ids, Duration::from_secs(30)).unwrap() {
        assert!(o.is_complete(), "{o:?}");
    }
    assert_eq!(p.dst.to_vec(150_000, LEN).unwrap(), src);
    assert_eq!(p.a.outstanding_slices(), 0);
    let status = p.a.cuda_staging(0).unwrap();
    let lanes = status.lanes;
    assert_eq!((lanes.idle, lanes.busy, lanes.fenced_network), (2, 0, 0));
    assert_eq!(status.is_drained(), Ok(true));

    // The staged requests count on cuda-staging, the chunks they ran on
    // the path of their rails (rdma), both under B's source id.
    let m = p.a.metrics();
    let b = p.b.source_id();
    let row = |path: &str| {
        m.peers
            .iter()
            .find(|r| r.path == path && r.peer == b)
            .unwrap_or_else(|| panic!("no {path} row for {b}: {m:#?}"))
    };
    let staged = row("cuda-staging");
    let (read, write) = (&staged.ops[0], &staged.ops[1]);
    assert_eq!((write.requests, write.bytes), (3, 2 * LEN as u64), "{m:#?}");
    assert_eq!((read.requests, read.bytes), (1, LEN as u64), "{m:#?}");
    assert_eq!((write.outcomes.complete, write.latency.count), (3, 3));
    let rdma = row("rdma");
    assert_eq!(rdma.ops[1].bytes, 2 * LEN as u64, "chunks: {m:#?}");
    assert_eq!(rdma.ops[0].bytes, LEN as u64, "chunks: {m:#?}");
    assert!(rdma.ops[1].requests >= 7 + 2 * 4, "one per chunk: {m:#?}");
    assert_eq!(m.registration.bytes_used, p.a.charges().bytes);
    p.a.unregister(reg.id).unwrap();
    assert_eq!(
        p.a.cuda_staging(0),
        None,
        "the last CUDA registration stops the lanes"
    );
    assert_eq!(p.a.charges(), before, "bounce buffers unregistered");
    drop((p.fabric, p.b));
}

#[test]
fn staged_write_and_read_move_gpu_bytes_between_two_engines() {
    STUB.run_child("child_round_trip", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of staged_write_and_read_move_gpu_bytes_between_two_engines"]
fn child_round_trip() {
    if STUB.is_child("child_round_trip") {
        round_trip_scenario();
    }
}

/// 4 chunks of 4 slices, one rail, one lane, every slice signalled; the
/// 6th send work request (chunk 1, slice 1) moves its bytes and then
/// completes in error.
fn failing_pair(len: usize) -> (Pair, CudaDevice, Arc<CudaBuffer>) {
    let p = pair(1, 1, len, 1);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, len).unwrap();
    p.fabric
        .faults()
        .fail_send(WrMatch::nth(6), WcStatus::RemoteOperation, true);
    (p, dev, gpu)
}

#[test]
fn a_chunk_write_failing_mid_transfer_gives_the_completed_prefix() {
    STUB.run_child("child_write_failure", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_chunk_write_failing_mid_transfer_gives_the_completed_prefix"]
fn child_write_failure() {
    if !STUB.is_child("child_write_failure") {
        return;
    }
    const LEN: usize = 4 * CHUNK;
    let (p, dev, gpu) = failing_pair(LEN);
    let src = pattern(LEN, 5);
    put(&dev, &gpu, 0, &src);
    let reg = p.a.register(gpu, Access::LocalOnly).unwrap();
    let before = p.dst.to_vec(0, LEN).unwrap();
    let o = run(&p.a, Request::write(&reg, 0..LEN as u64).to(&p.range, 0));
    println!("{o:?}");
    assert_eq!(o.status, Status::Failed);
    // Chunk 0 whole, then chunk 1's slice 0: known done end to end.
    assert_eq!(o.completed_prefix, CHUNK as u64 + u64::from(SLICE));
    assert_eq!(o.completed_slices, 1, "one whole chunk");
    let info = o.failure.clone().expect("failure information");
    let chunk = info.chunk.expect("the failed chunk");
    assert_eq!(
        (chunk.index, chunk.offset, chunk.drained, chunk.status),
        (1, CHUNK as u64, true, Some(Status::Failed))
    );
    assert!(chunk.request.is_some(), "{info:?}");
    assert_eq!(
        (info.slice, info.nic, info.path),
        (1, Some(orbitte_topology::NicId(0)), PathKind::Rdma)
    );
    assert!(info.rail.is_some(), "a network failure names its rail");
    assert!(
        matches!(info.status, SliceFailure::Completion { .. }),
        "{info:?}"
    );
    assert_eq!(
        info.offset,
        CHUNK as u64 + u64::from(SLICE),
        "request-relative"
    );
    let RemoteEffect::Possible { bytes } = o.remote_effect.clone() else {
        panic!("{o:?}")
    };
    assert!(bytes.contains(&(o.completed_prefix)), "{bytes:?}");
    assert_eq!(o.uncertain, bytes);
    assert_eq!(o.drain, DrainStatus::Drained, "the error flushed the rest");
    let after = p.dst.to_vec(0, LEN).unwrap();
    let prefix = o.completed_prefix as usize;
    assert_eq!(
        after[..prefix],
        src[..prefix],
        "the completed prefix arrived"
    );
    assert_eq!(
        after[prefix..prefix + SLICE as usize],
        src[prefix..prefix + SLICE as usize],
        "the failed WRITE did change remote bytes (uncertain)"
    );
    for i in prefix..LEN {
        if !o.uncertain.contains(&(i as u64)) {
            assert_eq!(
                after[i], before[i],
                "byte {i} outside the uncertain range changed"
            );
        }
    }
    // The lane went back to the pool.
    assert_eq!(p.a.cuda_staging(0).unwrap().lanes.idle, 1);
}

#[test]
fn a_chunk_read_failing_mid_transfer_leaves_gpu_bytes_past_the_prefix() {
    STUB.run_child("child_read_failure", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_chunk_read_failing_mid_transfer_leaves_gpu_bytes_past_the_prefix"]
fn child_read_failure() {
    if !STUB.is_child("child_read_failure") {
        return;
    }
    const LEN: usize = 4 * CHUNK;
    let (p, dev, gpu) = failing_pair(LEN);
    gpu.fill(0, LEN, 0xee).unwrap();
    let reg = p.a.register(&gpu, Access::LocalOnly).unwrap();
    let o = run(
        &p.a,
        Request::read(&reg, 0..LEN as u64)
            .from(&p.range, 0)
            .label(3),
    );
    println!("{o:?}");
    assert_eq!(o.status, Status::Failed);
    assert_eq!(o.label, 3);
    assert_eq!(
        o.completed_prefix, CHUNK as u64,
        "only chunk 0 landed in GPU memory"
    );
    assert_eq!(o.completed_slices, 1);
    assert!(
        matches!(
            o.failure.as_ref().and_then(|f| f.chunk),
            Some(c) if c.index == 1 && c.request.is_some()
        ),
        "{o:?}"
    );
    assert_eq!(o.remote_effect, RemoteEffect::None);
    assert!(
        o.uncertain.is_empty(),
        "copies drained: nothing past the prefix"
    );
    assert_eq!(o.drain, DrainStatus::Drained);
    let back = get(&dev, &gpu, 0, LEN);
    assert_eq!(back[..CHUNK], pattern(LEN, 2)[..CHUNK]);
    assert!(
        back[CHUNK..].iter().all(|&b| b == 0xee),
        "GPU bytes past the prefix unchanged"
    );
}

#[test]
fn a_chunk_request_that_does_not_drain_fences_its_lane_until_it_drains() {
    STUB.run_child("child_stalled_chunk", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_chunk_request_that_does_not_drain_fences_its_lane_until_it_drains"]
fn child_stalled_chunk() {
    if !STUB.is_child("child_stalled_chunk") {
        return;
    }
    const LEN: usize = 4 * CHUNK;
    // A's requests time out after 300 ms; 200 ms later the engine flushes
    // the rail holding the stalled slice, which drains the request. A
    // failed chunk's request is given 20 ms to drain before the lane is
    // fenced.
    let p = pair_timed(
        1,
        1,
        LEN,
        Duration::from_millis(300),
        StagingConfig {
            chunk_wait: Duration::from_secs(10),
            drain_wait: Duration::from_millis(20),
            ..lanes(1)
        },
    );
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, LEN).unwrap();
    let src = pattern(LEN, 9);
    put(&dev, &gpu, 0, &src);
    // The 6th send work request (chunk 1, slice 1) never completes.
    p.fabric.faults().stall_send(WrMatch::nth(6));
    let reg = p.a.register(gpu, Access::LocalOnly).unwrap();
    let id =
        p.a.submit(&[Request::write(&reg, 0..LEN as u64).to(&p.range, 0)])
            .unwrap()[0];
    let o = p.a.wait(id, Duration::from_secs(30)).unwrap();
    println!("{o:?}");
    assert_eq!(o.status, Status::TimedOut);
    assert_eq!(o.completed_prefix, CHUNK as u64 + u64::from(SLICE));
    let chunk = o.failure.as_ref().and_then(|f| f.chunk).expect("chunk");
    assert_eq!(
        (chunk.index, chunk.status, chunk.drained),
        (1, Some(Status::TimedOut), false),
        "{o:?}"
    );
    let request = chunk.request.expect("the chunk's request");
    assert!(
        matches!(o.drain, DrainStatus::Pending { .. }),
        "the stalled slice still holds the bounce buffer: {o:?}"
    );
    assert!(matches!(o.remote_effect, RemoteEffect::Possible { .. }));
    assert_eq!(
        p.dst.to_vec(0, o.completed_prefix as usize).unwrap(),
        src[..o.completed_prefix as usize]
    );
    // Fenced now (unless the engine already flushed it), never unquiesced;
    // the engine's drain timeout flushes the rail, and the lane returns.
    let lanes = p.a.cuda_staging(0).unwrap().lanes;
    assert_eq!(lanes.unquiesced, 0);
    assert_eq!(lanes.fenced_network + lanes.idle + lanes.busy, 1);
    p.a.wait_drain(id, Duration::from_secs(10)).unwrap();
    assert_eq!(p.a.drain_status(request), DrainStatus::Drained);
    assert_eq!(p.a.drain_status(id), DrainStatus::Drained);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.a.cuda_staging(0).unwrap().lanes.idle != 1 {
        assert!(std::time::Instant::now() < deadline, "the lane came back");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(p.a.cuda_staging(0).unwrap().is_drained(), Ok(true));
}

#[test]
fn cancelling_a_staged_request_stops_its_lane_and_drains_later() {
    STUB.run_child("child_cancel", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of cancelling_a_staged_request_stops_its_lane_and_drains_later"]
fn child_cancel() {
    if !STUB.is_child("child_cancel") {
        return;
    }
    const LEN: usize = 4 * CHUNK;
    let p = pair_timed(
        1,
        1,
        LEN,
        Duration::from_secs(5),
        StagingConfig {
            drain_wait: Duration::from_millis(20),
            ..lanes(1)
        },
    );
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, LEN).unwrap();
    let src = pattern(LEN, 4);
    put(&dev, &gpu, 0, &src);
    let reg = p.a.register(&gpu, Access::LocalOnly).unwrap();
    // A request cancelled before a lane takes it never moves a byte: the
    // one lane runs the first request of the batch (milliseconds of copies
    // and 16 WRITEs) while the second, queued, is cancelled.
    let before = p.dst.to_vec(0, LEN).unwrap();
    let ids =
        p.a.submit(&[
            Request::write(&reg, 0..LEN as u64).to(&p.range, 0),
            Request::write(&reg, 0..LEN as u64).to(&p.range, 0),
        ])
        .unwrap();
    assert!(p.a.cancel(ids[1]));
    let queued = p.a.wait(ids[1], Duration::from_secs(30)).unwrap();
    assert_eq!(
        (
            queued.status,
            queued.completed_prefix,
            queued.remote_effect.clone(),
            queued.drain
        ),
        (
            Status::Cancelled,
            0,
            RemoteEffect::None,
            DrainStatus::Drained
        ),
        "{queued:?}"
    );
    assert!(
        p.a.wait(ids[0], Duration::from_secs(30))
            .unwrap()
            .is_complete()
    );
    assert_eq!(
        p.dst.to_vec(0, LEN).unwrap(),
        src,
        "the first request moved the bytes"
    );
    p.dst.write_at(0, &before).unwrap();
    // Chunk 1's slice 1 never completes: the request runs until cancelled.
    p.fabric.faults().stall_send(WrMatch::nth(6));
    let id =
        p.a.submit(&[Request::write(&reg, 0..LEN as u64).to(&p.range, 0)])
            .unwrap()[0];
    assert_eq!(p.a.poll(id), None, "submit returns before the request ends");
    assert!(matches!(p.a.drain_status(id), DrainStatus::Pending { .. }));
    std::thread::sleep(Duration::from_millis(300));
    assert!(p.a.cancel(id), "the request had no outcome yet");
    let o = p.a.wait(id, Duration::from_secs(10)).unwrap();
    println!("{o:?}");
    assert_eq!(o.status, Status::Cancelled);
    assert!(!p.a.cancel(id), "the outcome was made");
    assert_eq!(o.completed_prefix, CHUNK as u64 + u64::from(SLICE));
    assert!(
        matches!(o.remote_effect, RemoteEffect::Possible { .. }),
        "{o:?}"
    );
    assert_eq!(
        p.dst.to_vec(0, o.completed_prefix as usize).unwrap(),
        src[..o.completed_prefix as usize]
    );
    // Logical: the stalled slice still holds a bounce buffer until the
    // engine's drain timeout flushes its rail.
    p.a.wait_drain(id, Duration::from_secs(10)).unwrap();
    assert_eq!(p.a.drain_status(id), DrainStatus::Drained);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.a.cuda_staging(0).unwrap().lanes.idle != 1 {
        assert!(std::time::Instant::now() < deadline, "the lane came back");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_device_copy_that_does_not_drain_fences_the_pipeline() {
    STUB.run_child(
        "child_copy_fault",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_FAIL_SYNC_AFTER", "3")],
    );
}

#[test]
#[ignore = "runs as a child of a_device_copy_that_does_not_drain_fences_the_pipeline"]
fn child_copy_fault() {
    if !STUB.is_child("child_copy_fault") {
        return;
    }
    // Every cuStreamSynchronize after the third fails (sticky).
    const LEN: usize = 4 * CHUNK;
    let p = pair(1, 4, LEN, 1);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, LEN).unwrap();
    gpu.fill(0, LEN, 0x5a).unwrap(); // cuCtxSynchronize: not counted
    let reg = p.a.register(gpu, Access::LocalOnly).unwrap();
    let before = p.dst.to_vec(0, LEN).unwrap();
    let id =
        p.a.submit(&[Request::write(&reg, 0..LEN as u64).to(&p.range, 0)])
            .unwrap()[0];
    let o = p.a.wait(id, Duration::from_secs(30)).unwrap();
    println!("{o:?}");
    assert_eq!(o.status, Status::Failed);
    // Chunks 0..3 were synchronized and written; chunk 3's wait failed.
    assert_eq!(o.completed_prefix, 3 * CHUNK as u64);
    let info = o.failure.clone().expect("failure information");
    assert!(
        matches!(info.status, SliceFailure::DeviceCopy(_)),
        "the CUDA error, typed: {info:?}"
    );
    assert_eq!((info.rail, info.path), (None, PathKind::CudaStaging));
    assert_eq!(
        info.chunk.map(|c| (c.index, c.request, c.drained)),
        Some((3, None, false))
    );
    assert_eq!(
        o.drain,
        DrainStatus::Pending { slices: 1 },
        "the copies did not drain: never claimed drained"
    );
    assert_eq!(
        o.remote_effect,
        RemoteEffect::Possible {
            bytes: o.completed_prefix..o.completed_prefix
        }
    );
    let after = p.dst.to_vec(0, LEN).unwrap();
    assert!(after[..3 * CHUNK].iter().all(|&b| b == 0x5a));
    assert_eq!(after[3 * CHUNK..], before[3 * CHUNK..]);
    // The lane is unquiesced for good: retained, never reused.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.a.cuda_staging(0).unwrap().lanes.unquiesced != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lane is unquiesced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = p.a.cuda_staging(0).unwrap();
    assert_eq!((status.lanes.idle, status.lanes.unquiesced), (0, 1));
    let again = refused(&p.a, Request::write(&reg, 0..1).to(&p.range, 0));
    assert!(
        matches!(again, RequestError::StagingFenced { device: 0, .. }),
        "{again}"
    );
    println!("{again}");
    assert!(
        status.fenced.iter().any(|f| f.contains("unquiesced")),
        "{status:?}"
    );
    assert!(p.a.wait_drain(id, Duration::from_millis(50)).is_err());
    assert_eq!(status.is_drained(), Ok(false));
    assert_eq!(status.bounce_registrations.len(), 2, "still registered");
    assert!(
        matches!(
            p.a.unregister(reg.id),
            Err(UnregisterError::Undrained { requests: 1, .. })
        ),
        "GPU memory a copy may still touch stays registered"
    );
}

#[test]
fn bad_input_is_typed_errors_and_remote_gpu_memory_is_staged() {
    STUB.run_child("child_bad_input", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of bad_input_is_typed_errors_and_remote_gpu_memory_is_staged"]
fn child_bad_input() {
    if !STUB.is_child("child_bad_input") {
        return;
    }
    let dev = CudaDevice::open(0).unwrap();
    let p0 = pair(1, 4, 4096, 0);
    let e =
        p0.a.register(CudaBuffer::alloc(&dev, 4096).unwrap(), Access::LocalOnly)
            .unwrap_err();
    assert!(
        matches!(
            &e,
            RegisterError::Staging { device: 0, source } if matches!(**source, StagingSetupError::Zero { depth: 0, .. })
        ),
        "{e}"
    );
    assert_eq!(p0.a.cuda_staging(0), None);
    let p = pair(1, 4, 4096, 1);
    let gpu = CudaBuffer::alloc(&dev, 8192).unwrap();
    // Remote access is published and staged through host memory by the
    // tcp target (no MR: nothing is charged), never registered with NICs.
    let remote =
        p.a.register(gpu.clone(), Access::REMOTE_READ_WRITE)
            .unwrap();
    assert_eq!(remote.path, MemoryPath::CudaStaging);
    assert_eq!(remote.copies, 0);
    let desc = p.a.segment_publication();
    let desc = desc
        .ranges
        .iter()
        .find(|r| r.range_id.0 == remote.id.0)
        .expect("published");
    assert!(desc.rkeys.is_empty() && desc.local.is_none(), "{desc:?}");
    p.a.unregister(remote.id).unwrap();
    let reg = p.a.register(gpu, Access::LocalOnly).unwrap();
    let (range, peer) = (p.range, p.peer);
    assert_eq!(
        refused(&p.a, Request::write(&reg, 0..0).to(&range, 0)),
        RequestError::ZeroLength
    );
    let e = refused(&p.a, Request::write(&reg, 8000..9000).to(&range, 0));
    assert_eq!(
        e,
        RequestError::OutOfRange {
            side: "gpu",
            offset: 8000,
            len: 1000,
            size: 8192
        }
    );
    assert!(e.to_string().contains("8192"), "{e}");
    assert!(matches!(
        refused(&p.a, Request::read(&reg, 0..1000).from(&range, 4000)),
        RequestError::OutOfRange {
            side: "remote",
            size: 4096,
            ..
        }
    ));
    assert!(matches!(
        refused(&p.a, Request::write(&reg, 0..2).to(&range, u64::MAX)),
        RequestError::Overflow { .. }
    ));
    let elsewhere = RemoteRange {
        peer: PeerId(99),
        ..range
    };
    assert_eq!(
        refused(&p.a, Request::write(&reg, 0..1).to(&elsewhere, 0)),
        RequestError::UnknownPeer(PeerId(99))
    );
    let unpublished = RemoteRange {
        range: RangeId(12345),
        ..range
    };
    assert!(matches!(
        refused(&p.a, Request::write(&reg, 0..1).to(&unpublished, 0)),
        RequestError::UnpublishedRemote {
            range: RangeId(12345),
            ..
        }
    ));
    assert!(matches!(
        refused(&p.a, Request::write(&reg, 0..1).to_address(peer, 0x10)),
        RequestError::UnknownAddress { address: 0x10, .. }
    ));
    assert!(matches!(
        refused(&p.a, Request::write(&reg, 0..1).to(&p.read_only, 0)),
        RequestError::WrongAccess {
            side: "remote",
            op: Op::Write
        }
    ));
    // A notifying batch does not carry staged requests.
    let e =
        p.a.submit_with_notification(
            &[Request::write(&reg, 0..1).to(&range, 0)],
            orbitte_engine::Notification::new(b"done".to_vec()),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            SubmitError::Notification(orbitte_engine::NotificationError::Staged { index: 0 })
        ),
        "{e}"
    );
    assert!(p.a.unregister(reg.id).is_ok());
    assert!(matches!(
        refused(&p.a, Request::write(&reg, 0..1).to(&range, 0)),
        RequestError::UnpublishedLocal(_)
    ));
    // orbitte-cuda's own bad input: typed errors naming device and numbers.
    let e = CudaDevice::open(7).unwrap_err();
    assert!(
        e.to_string().contains("CUDA device 7 does not exist"),
        "{e}"
    );
    let e = CudaBuffer::alloc(&dev, 1 << 40).unwrap_err();
    assert!(e.to_string().contains(&(1u64 << 40).to_string()), "{e}");
    // A fenced engine refuses the request: nothing was posted, so it is an
    // error, not an outcome, and no lane is held.
    let reg =
        p.a.register(CudaBuffer::alloc(&dev, 4096).unwrap(), Access::LocalOnly)
            .unwrap();
    assert_eq!(
        p.a.cuda_staging(0).unwrap().lanes.idle,
        1,
        "refusals hold no lane"
    );
    let _ = p.a.shutdown(Duration::from_secs(1));
    let e =
        p.a.submit(&[Request::read(&reg, 0..4096).from(&p.read_only, 0)])
            .unwrap_err();
    assert!(matches!(e, SubmitError::Fenced { .. }), "{e}");
}

#[test]
fn a_registration_error_never_switches_bounce_buffers_to_another_path() {
    STUB.run_child("child_no_rdma", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_registration_error_never_switches_bounce_buffers_to_another_path"]
fn child_no_rdma() {
    if !STUB.is_child("child_no_rdma") {
        return;
    }
    // An engine without any RDMA NIC: Host Direct registration of the
    // bounce buffers fails, so the CUDA registration fails.
    let fabric = SimFabric::new(SimDescription::new(vec![]), 1);
    let e = EngineBuilder::new("staging-no-nic")
        .provider(fabric.provider_for(&[]))
        .cuda_staging(lanes(2))
        .build()
        .unwrap();
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 4096).unwrap();
    let err = e.register(&gpu, Access::LocalOnly).unwrap_err();
    println!("{err}");
    assert!(
        matches!(
            &err,
            RegisterError::Staging { source, .. } if matches!(
                **source,
                StagingSetupError::Register {
                    lane: 0,
                    slot: 0,
                    source: RegisterError::NoUsableNic { .. },
                    ..
                }
            )
        ),
        "{err}"
    );
    assert_eq!(e.charges(), Default::default(), "nothing left registered");
    assert_eq!(e.cuda_staging(0), None);
    // Host memory without RDMA is an explicit, separate choice, said once
    // in the builder; it covers the bounce buffers too.
    let e = EngineBuilder::new("staging-no-nic-tcp")
        .provider(fabric.provider_for(&[]))
        .host_memory_without_rdma()
        .cuda_staging(lanes(2))
        .build()
        .unwrap();
    let reg = e.register(&gpu, Access::LocalOnly).unwrap();
    assert_eq!(reg.path, MemoryPath::CudaStaging);
    assert_eq!(e.cuda_staging(0).unwrap().bounce_registrations.len(), 4);
    assert_eq!(e.charges(), Default::default(), "no MR, nothing charged");
    let host = e
        .register(HostMemory::alloc(4096).unwrap(), Access::LocalOnly)
        .unwrap();
    assert_eq!(
        host.path,
        MemoryPath::HostWithoutRdma,
        "host rules unchanged"
    );
}

#[test]
fn the_capability_rows_round_trip_through_the_engine_on_the_fake_gpu() {
    STUB.run_child("child_capability", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of the_capability_rows_round_trip_through_the_engine_on_the_fake_gpu"]
fn child_capability() {
    if STUB.is_child("child_capability") {
        capability_scenario();
    }
}

/// The CUDA rows with the engine round trip on device 0 (fake or real).
fn capability_scenario() {
    let p = pair(1, 4, 1 << 20, 1);
    let target = LoopbackTarget {
        peer: p.peer,
        range: p.range.range,
        offset: 4096,
    };
    let cap = evaluate_cuda_staging(&p.a, 0, Some(target));
    println!("{cap:#?}");
    let row = cap.row(PathKind::CudaStaging).unwrap();
    for c in [&row.build, &row.discovery, &row.completion, &row.drain] {
        assert_eq!(*c, Check::Pass, "{row:?}");
    }
    assert!(
        row.notes.iter().any(|n| n.contains("through the engine")),
        "{:?}",
        row.notes
    );
    not_implemented_rows_and_caveat(&cap);
    let mut m = CapabilityMatrix::baseline();
    cap.contribute_to(&mut m);
    assert!(m.row(PathKind::CudaStaging).unwrap().completion.is_pass());
    // A target that cannot take the round trip fails completion, with the
    // reason, and drain is not evaluated.
    let bad = LoopbackTarget {
        range: p.read_only.range,
        ..target
    };
    let cap = evaluate_cuda_staging(&p.a, 0, Some(bad));
    let row = cap.row(PathKind::CudaStaging).unwrap();
    assert!(
        matches!(&row.completion, Check::Fail { reason, .. } if reason.contains("refused")),
        "{row:?}"
    );
    assert!(matches!(row.drain, Check::Skipped { .. }), "{row:?}");
    // Without a loopback peer range the completion check is not claimed.
    let cap = cuda_rows(0);
    let row = cap.row(PathKind::CudaStaging).unwrap();
    assert!(row.discovery.is_pass());
    assert!(
        matches!(&row.completion, Check::Skipped { why } if why.contains("loopback")),
        "{row:?}"
    );
}

fn not_implemented_rows_and_caveat(cap: &orbitte_engine::staging::CudaCapability) {
    for path in [PathKind::GpudirectRdma, PathKind::CudaIpc, PathKind::Nvlink] {
        let row = cap.row(path).unwrap_or_else(|| panic!("{path} row"));
        for c in [&row.build, &row.discovery, &row.completion, &row.drain] {
            assert_eq!(*c, Check::NotImplemented, "{row:?}");
        }
    }
    for row in &cap.rows {
        assert!(
            row.notes.iter().any(|n| n == COMPUTE_PROBE_CAVEAT),
            "{row:?}"
        );
    }
    assert_eq!(cap.rows.len(), 4);
}

#[test]
fn a_driver_without_devices_is_skipped_in_the_rows() {
    STUB.run_child("child_no_device", "no-device", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_driver_without_devices_is_skipped_in_the_rows"]
fn child_no_device() {
    if !STUB.is_child("child_no_device") {
        return;
    }
    let p = pair(1, 4, 1 << 20, 1);
    let target = LoopbackTarget {
        peer: p.peer,
        range: p.range.range,
        offset: 0,
    };
    let cap = evaluate_cuda_staging(&p.a, 0, Some(target));
    let row = cap.row(PathKind::CudaStaging).unwrap();
    assert!(row.build.is_pass());
    assert!(
        matches!(&row.discovery, Check::Skipped { why } if why.starts_with("no CUDA device")),
        "{row:?}"
    );
    assert!(matches!(row.completion, Check::Skipped { .. }));
    not_implemented_rows_and_caveat(&cap);
    assert!(
        matches!(
            CudaDevice::open(0),
            Err(orbitte_cuda::DeviceError::NoDevice { .. })
        ),
        "the stub's cuInit says no device"
    );
}

/// In this process: without a driver every CUDA answer is "skipped: no CUDA
/// driver (libcuda.so.1 not found)", never a panic; with one (a GPU
/// machine, `scripts/gpu-check.sh`), the round trip runs on device 0.
/// `ORBITTE_REQUIRE_GPU=1` makes a missing driver a failure.
#[test]
fn real_driver_round_trip_or_skip() {
    match orbitte_cuda::driver() {
        Err(e) if e.reason() == NO_DRIVER => {
            let cap = cuda_rows(0);
            let row = cap.row(PathKind::CudaStaging).unwrap();
            assert!(row.build.is_pass());
            assert_eq!(
                row.discovery,
                Check::Skipped {
                    why: NO_DRIVER.to_owned()
                }
            );
            assert!(matches!(row.completion, Check::Skipped { .. }));
            not_implemented_rows_and_caveat(&cap);
            let e = CudaDevice::open(0).unwrap_err();
            assert!(e.to_string().starts_with(NO_DRIVER), "{e}");
            assert!(
                std::env::var("ORBITTE_REQUIRE_GPU").as_deref() != Ok("1"),
                "ORBITTE_REQUIRE_GPU=1 but {e}"
            );
            println!("skipped: {NO_DRIVER}");
        }
        Err(e) => panic!("a CUDA driver is present but unusable: {e}"),
        Ok(_) => match orbitte_cuda::devices() {
            Ok(list) if !list.is_empty() => {
                println!("running on {list:?}");
                round_trip_scenario();
                capability_scenario();
            }
            other => {
                assert!(
                    std::env::var("ORBITTE_REQUIRE_GPU").as_deref() != Ok("1"),
                    "ORBITTE_REQUIRE_GPU=1 but {other:?}"
                );
                println!("skipped: no CUDA device ({other:?})");
            }
        },
    }
}
