//! GPU memory a peer READs and WRITEs: a CUDA registration with remote
//! access is published and served by the tcp target through host bounce
//! buffers. Like `staging.rs`, each test builds orbitte-cuda's stub driver
//! and re-runs this binary as a child on the fake GPU (device memory the
//! process cannot touch; copies held until waited for), with one
//! `#[ignore]`d `child_*` entry selected. The target's device bytes are
//! put and checked through the stub's own copies.
#![forbid(unsafe_code)]

mod common;

use std::time::Duration;

use orbitte_cuda::testing::{StubHarness, StubKind};
use orbitte_cuda::{CudaBuffer, CudaDevice};
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{
    Access, EngineBuilder, MemoryPath, Outcome, PathKind, RailRefusal, RemoteEffect, RemoteRange,
    Request, RequestError, Status, SubmitError, TransferEngine,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};

const STUB: StubHarness = StubHarness::new("ORBITTE_STAGING_TARGET_CHILD", "staging_target");

/// The target's bounce buffer (`transport::tcp::staged::BOUNCE_BYTES`):
/// longer requests move in pieces of this size.
const BOUNCE: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

use common::{CapturedLog, gpu_get as get, gpu_put as put, run};

/// A target `T` listening on loopback (host memory off rdma) and a client
/// `C` on the same sim fabric, with `slice` bytes per tcp slice.
fn engines(slice: u32) -> (TransferEngine, TransferEngine) {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("t0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("c0", [10, 2, 0, 1]),
        ])
        .with_delivery(Delivery::Background),
        3,
    );
    let build = |name: &str, nic: &str| {
        EngineBuilder::new(name)
            .provider(fabric.provider_for(&[nic]))
            .host_memory_without_rdma()
            .slice_size(slice)
            .request_timeout(Duration::from_secs(10))
            .listen("127.0.0.1:0".parse().unwrap())
            .build()
            .unwrap()
    };
    (build("target", "t0"), build("client", "c0"))
}

/// The range `id` as `peer` published it.
fn range(peer: &orbitte_engine::Peer, id: u64) -> RemoteRange {
    *peer
        .info
        .ranges
        .iter()
        .find(|r| r.range.0 == id)
        .expect("the GPU range is published")
}

// ---- a peer WRITEs into remote GPU memory and READs it back ---------------

#[test]
fn a_peer_writes_and_reads_remote_gpu_memory_over_tcp() {
    STUB.run_child("child_round_trip", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_peer_writes_and_reads_remote_gpu_memory_over_tcp"]
fn child_round_trip() {
    if !STUB.is_child("child_round_trip") {
        return;
    }
    // 4 MiB slices: one request frame of 3 MiB + 17 bytes, longer than the
    // target's bounce buffer, moves in four pieces.
    let (t, c) = engines(4 << 20);
    let len = 3 * BOUNCE + 17;
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, len + 4096).unwrap();
    put(&dev, &gpu, 0, &vec![0xEE; len + 4096]);
    let reg = t.register(&gpu, Access::REMOTE_READ_WRITE).unwrap();
    assert_eq!(reg.path, MemoryPath::CudaStaging);
    assert_eq!(reg.access, Access::RemoteReadWrite);
    let peer = c.connect(t.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.path, PathKind::Tcp, "{:?}", peer.fell_back);
    let remote = range(&peer, reg.id.0);
    assert_eq!(remote.len, (len + 4096) as u64);
    assert_eq!(
        remote.address,
        gpu.device_ptr(),
        "published at its device address"
    );

    let src = HostMemory::alloc(len).unwrap();
    let bytes = pattern(len, 1);
    src.write_at(0, &bytes).unwrap();
    let src_reg = c.register(src.clone(), Access::LocalOnly).unwrap();
    let o = run(&c, Request::write(&src_reg, 0..len as u64).to(&remote, 100));
    assert!(o.is_complete(), "{o:?}");
    assert_eq!(o.remote_effect, RemoteEffect::Complete);
    // Acknowledged means on the device: the target's GPU bytes, read
    // through the stub's copies, are the written ones, and nothing around
    // them changed.
    assert!(get(&dev, &gpu, 100, len) == bytes, "GPU bytes differ");
    assert_eq!(get(&dev, &gpu, 0, 100), vec![0xEE; 100]);
    assert_eq!(get(&dev, &gpu, 100 + len, 64), vec![0xEE; 64]);

    // READ it back whole (four pieces), and a small slice at an odd offset.
    let dst = HostMemory::alloc(len).unwrap();
    let dst_reg = c.register(dst.clone(), Access::LocalOnly).unwrap();
    let o = run(
        &c,
        Request::read(&dst_reg, 0..len as u64).from(&remote, 100),
    );
    assert!(o.is_complete(), "{o:?}");
    assert!(dst.to_vec(0, len).unwrap() == bytes, "READ bytes differ");
    let other = pattern(4096, 9);
    put(&dev, &gpu, len, &other);
    let o = run(
        &c,
        Request::read(&dst_reg, 7..4007).from(&remote, len as u64 + 3),
    );
    assert!(o.is_complete(), "{o:?}");
    assert_eq!(dst.to_vec(7, 4000).unwrap(), other[3..4003].to_vec());

    // Unregistered, the range is gone from the target's publication.
    drop(c.unregister(src_reg.id));
    t.unregister(reg.id).unwrap();
    assert!(
        !t.segment_publication()
            .ranges
            .iter()
            .any(|r| r.range_id.0 == reg.id.0)
    );
}

// ---- a device copy that fails on the target -------------------------------

#[test]
fn a_failed_device_copy_on_the_target_fails_the_request() {
    // Every stream wait fails, from the first.
    STUB.run_child(
        "child_copy_fails",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_FAIL_SYNC_AFTER", "0")],
    );
}

#[test]
#[ignore = "runs as a child of a_failed_device_copy_on_the_target_fails_the_request"]
fn child_copy_fails() {
    if !STUB.is_child("child_copy_fails") {
        return;
    }
    let log = CapturedLog::install();
    let (t, c) = engines(64 << 10);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 1 << 16).unwrap();
    let reg = t.register(&gpu, Access::REMOTE_READ_WRITE).unwrap();
    let peer = c.connect(t.listen_addr().unwrap()).unwrap();
    let remote = range(&peer, reg.id.0);
    let host = HostMemory::alloc(8192).unwrap();
    host.write_at(0, &pattern(8192, 3)).unwrap();
    let local = c.register(host.clone(), Access::LocalOnly).unwrap();

    let status_of = |o: &Outcome| match &o.failure.as_ref().expect("failure information").status {
        SliceFailure::Completion { status, .. } => status.to_string(),
        other => panic!("a target's status, not {other:?}"),
    };
    let o = run(&c, Request::write(&local, 0..4096).to(&remote, 0));
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(!o.is_complete());
    assert_eq!(o.completed_prefix, 0);
    assert_ne!(o.remote_effect, RemoteEffect::Complete);
    assert!(status_of(&o).contains("internal"), "{o:?}");

    let o = run(&c, Request::read(&local, 4096..8192).from(&remote, 0));
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(status_of(&o).contains("internal"), "{o:?}");
    assert_eq!(
        host.to_vec(4096, 4096).unwrap(),
        pattern(8192, 3)[4096..].to_vec(),
        "a failed READ delivered no bytes"
    );
    let text = log.text();
    for op in ["WRITE", "READ"] {
        let line =
            format!("cuda-staging: served {op} on GPU memory (staged through host memory) failed");
        assert!(text.contains(&line), "the target says why: {text}");
    }
    assert!(text.contains("cuStreamSynchronize"), "{text}");
}

// ---- a device copy that fails after the first piece ----------------------

/// A target serving 2 MiB + 17 bytes of GPU memory (three bounce pieces)
/// and a client connected to it over tcp with 4 MiB slices, so one request
/// covers the range in one frame: the engines and the published range.
fn three_pieces() -> (TransferEngine, TransferEngine, RemoteRange) {
    let (t, c) = engines(4 << 20);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 2 * BOUNCE + 17).unwrap();
    let reg = t.register(&gpu, Access::REMOTE_READ_WRITE).unwrap();
    let peer = c.connect(t.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.path, PathKind::Tcp, "{:?}", peer.fell_back);
    let remote = range(&peer, reg.id.0);
    (t, c, remote)
}

/// Whether the outcome failed with the target's `internal` status.
fn answered_internal(o: &Outcome) -> bool {
    o.status == Status::Failed
        && matches!(
            &o.failure.as_ref().map(|f| &f.status),
            Some(SliceFailure::Completion { status, .. }) if status.contains("internal")
        )
}

#[test]
fn a_write_whose_later_piece_fails_is_answered_internal_and_its_rest_dropped() {
    // The first stream wait (the WRITE's first piece) succeeds, every later
    // one fails.
    STUB.run_child(
        "child_later_write_piece_fails",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_FAIL_SYNC_AFTER", "1")],
    );
}

#[test]
#[ignore = "runs as a child of a_write_whose_later_piece_fails_is_answered_internal_and_its_rest_dropped"]
fn child_later_write_piece_fails() {
    if !STUB.is_child("child_later_write_piece_fails") {
        return;
    }
    let log = CapturedLog::install();
    let (_t, c, remote) = three_pieces();
    let len = remote.len as usize;
    let host = HostMemory::alloc(len).unwrap();
    host.write_at(0, &pattern(len, 4)).unwrap();
    let local = c.register(host.clone(), Access::LocalOnly).unwrap();

    // The second piece's copy fails.
    let o = run(&c, Request::write(&local, 0..len as u64).to(&remote, 0));
    assert!(answered_internal(&o), "{o:?}");
    assert_eq!(o.completed_prefix, 0, "{o:?}");
    assert_ne!(o.remote_effect, RemoteEffect::Complete, "{o:?}");
    // The rest of the payload was read and dropped, not taken for frames:
    // the session still serves, and its next request gets the target's
    // answer (the device still fails: internal again), not a dead rail.
    let o = run(&c, Request::read(&local, 0..4096).from(&remote, 0));
    assert!(answered_internal(&o), "the same session answered: {o:?}");
    assert_eq!(
        host.to_vec(0, 4096).unwrap(),
        pattern(len, 4)[..4096].to_vec()
    );
    let text = log.text();
    assert!(
        text.contains(
            "cuda-staging: served WRITE on GPU memory (staged through host memory) failed"
        ),
        "the target says why: {text}"
    );
    assert!(
        !text.contains("malformed"),
        "no payload byte read as a frame: {text}"
    );
}

#[test]
fn a_read_whose_later_piece_fails_closes_the_session_and_fails_the_request() {
    // The first stream wait (the READ's first piece, copied before the
    // answer's header) succeeds, every later one fails.
    STUB.run_child(
        "child_later_read_piece_fails",
        "fake-gpu",
        StubKind::Complete,
        &[("ORBITTE_STUB_FAIL_SYNC_AFTER", "1")],
    );
}

#[test]
#[ignore = "runs as a child of a_read_whose_later_piece_fails_closes_the_session_and_fails_the_request"]
fn child_later_read_piece_fails() {
    if !STUB.is_child("child_later_read_piece_fails") {
        return;
    }
    let log = CapturedLog::install();
    let (_t, c, remote) = three_pieces();
    let len = remote.len as usize;
    let host = HostMemory::alloc(len).unwrap();
    let local = c.register(host.clone(), Access::LocalOnly).unwrap();

    // The answer's header said OK and its first piece went; the second
    // piece's copy fails, so the target closes the session and the READ
    // fails instead of completing with bytes it never had.
    let o = run(&c, Request::read(&local, 0..len as u64).from(&remote, 0));
    assert_eq!(o.status, Status::Failed, "{o:?}");
    assert!(!o.is_complete(), "{o:?}");
    assert_eq!(o.completed_prefix, 0, "{o:?}");
    assert!(
        !answered_internal(&o),
        "the answer's header said OK, its session died: {o:?}"
    );
    // The target logs the closed session's reason as it closes it, which
    // the initiator may see first.
    let closed = "failed after its header was sent";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !log.text().contains(closed) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = log.text();
    assert!(
        text.contains(
            "cuda-staging: served READ on GPU memory (staged through host memory) failed"
        ),
        "the target says why: {text}"
    );
    assert!(
        text.contains(closed),
        "the target says why it closed the session: {text}"
    );
}

// ---- a same-host peer cannot map the device range -------------------------

#[test]
fn a_same_host_peer_reaches_gpu_memory_over_tcp_not_by_mapping() {
    STUB.run_child("child_local_peer", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of a_same_host_peer_reaches_gpu_memory_over_tcp_not_by_mapping"]
fn child_local_peer() {
    if !STUB.is_child("child_local_peer") {
        return;
    }
    let (t, c) = engines(64 << 10);
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 8192).unwrap();
    let reg = t.register(&gpu, Access::REMOTE_READ_WRITE).unwrap();
    // A mappable host range beside it: the local path applies, and the GPU
    // range is what keeps it from being used.
    let host = HostMemory::alloc(4096).unwrap();
    t.register(host, Access::REMOTE_READ_WRITE).unwrap();
    let publication = t.segment_publication();
    let desc = publication
        .ranges
        .iter()
        .find(|r| r.range_id.0 == reg.id.0)
        .expect("published");
    assert!(desc.local.is_none(), "no mapping hint for GPU memory");
    assert!(desc.rkeys.is_empty(), "no rkeys for GPU memory");
    let peer = c.connect(t.listen_addr().unwrap()).unwrap();
    assert_eq!(peer.path, PathKind::Tcp);
    let (path, why) = peer.fell_back.first().expect("local fell back");
    assert_eq!(*path, PathKind::Local);
    assert!(
        why.contains(&format!("range {} is not mappable", reg.id.0)),
        "{why}"
    );
    let remote = range(&peer, reg.id.0);
    let src = HostMemory::alloc(8192).unwrap();
    let bytes = pattern(8192, 5);
    src.write_at(0, &bytes).unwrap();
    let local = c.register(src, Access::LocalOnly).unwrap();
    let o = run(&c, Request::write(&local, 0..8192).to(&remote, 0));
    assert!(o.is_complete(), "{o:?}");
    assert_eq!(get(&dev, &gpu, 0, 8192), bytes);
}

// ---- an rdma peer cannot address it ---------------------------------------

#[test]
fn an_rdma_peer_is_told_the_gpu_range_is_served_over_tcp_only() {
    STUB.run_child("child_rdma_peer", "fake-gpu", StubKind::Complete, &[]);
}

#[test]
#[ignore = "runs as a child of an_rdma_peer_is_told_the_gpu_range_is_served_over_tcp_only"]
fn child_rdma_peer() {
    if !STUB.is_child("child_rdma_peer") {
        return;
    }
    let fabric = common::fabric(1, Delivery::Background, 11);
    let a = common::builder(&fabric, "a", 1).build().unwrap();
    let b = common::builder(&fabric, "b", 1).build().unwrap();
    let dev = CudaDevice::open(0).unwrap();
    let gpu = CudaBuffer::alloc(&dev, 8192).unwrap();
    let reg = b.register(&gpu, Access::REMOTE_READ_WRITE).unwrap();
    let (peer, _) = common::connect(&a, &b);
    let remote = *peer
        .ranges
        .iter()
        .find(|r| r.range.0 == reg.id.0)
        .expect("published to the rdma peer");
    let src = common::region(4096, 1);
    let local = common::register(&a, &src, Access::LocalOnly);
    let e = match a.submit(&[Request::write(&local, 0..4096).to(&remote, 0)]) {
        Err(SubmitError::Invalid { error, .. }) => error,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let RequestError::NoRail { why, .. } = &e else {
        panic!("{e}");
    };
    assert!(
        why.iter()
            .all(|w| matches!(w, RailRefusal::TcpOnly { range, .. } if range.0 == reg.id.0)),
        "{e}"
    );
    let text = e.to_string();
    assert!(text.contains("served over tcp only"), "{text}");
    assert!(
        text.contains(&format!("remote range {}", reg.id.0)),
        "{text}"
    );
}
