//! Two engines ("hosts") on one simulated fabric.
#![allow(dead_code)] // each test binary uses a subset

use std::sync::Arc;
use std::time::Duration;

use orbitte_engine::{
    Access, Budgets, EngineBuilder, InProcessLink, PeerInfo, Registration, TransferEngine,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};

/// Fabric with `nics` RoCE NICs per host: host A has `a0..`, host B `b0..`.
pub(crate) fn fabric(nics: usize, delivery: Delivery, seed: u64) -> SimFabric {
    let mut devs = Vec::new();
    for h in ["a", "b"] {
        for i in 0..nics {
            let host = if h == "a" { 1 } else { 2 };
            devs.push(SimDeviceDesc::roce(
                &format!("{h}{i}"),
                [10, host, i as u8, 1],
            ));
        }
    }
    let timing = SimTiming {
        base_latency: Duration::from_micros(1),
        bytes_per_sec: 0,
        jitter: Duration::ZERO,
    };
    SimFabric::new(
        SimDescription::new(devs)
            .with_delivery(delivery)
            .with_timing(timing),
        seed,
    )
}

pub(crate) fn names(host: &str, nics: usize) -> Vec<String> {
    (0..nics).map(|i| format!("{host}{i}")).collect()
}

pub(crate) fn builder(fabric: &SimFabric, host: &str, nics: usize) -> EngineBuilder {
    let n = names(host, nics);
    let refs: Vec<&str> = n.iter().map(String::as_str).collect();
    EngineBuilder::new(format!("engine-{host}"))
        .provider(fabric.provider_for(&refs))
        .slice_size(4096)
        .request_timeout(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .handshake_timeout(Duration::from_secs(5))
        .max_in_flight(16)
        .signal_interval(4)
        .budgets(Budgets::default())
}

/// Opens A -> B (A initiates). Returns (A's view of B, B's view of A).
pub(crate) fn connect(a: &TransferEngine, b: &TransferEngine) -> (PeerInfo, PeerInfo) {
    let (mut la, mut lb) = InProcessLink::pair();
    std::thread::scope(|s| {
        let hb = s.spawn(|| b.accept_peer(&mut lb));
        let pa = a.open_peer(&mut la).expect("open_peer");
        let pb = hb.join().expect("accept thread").expect("accept_peer");
        (pa, pb)
    })
}

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub(crate) fn region(len: usize, seed: u8) -> Arc<HostMemory> {
    let m = HostMemory::alloc(len).unwrap();
    m.write_at(0, &pattern(len, seed)).unwrap();
    m
}

pub(crate) fn register(e: &TransferEngine, m: &Arc<HostMemory>, access: Access) -> Registration {
    e.register_host(m.clone(), access).expect("register_host")
}

/// Drives a manual-delivery fabric until the engine has the outcome.
pub(crate) fn drive_wait(
    fabric: &SimFabric,
    e: &TransferEngine,
    id: orbitte_engine::RequestId,
) -> orbitte_engine::Outcome {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        fabric.drive();
        if let Some(o) = e.poll(id) {
            return o;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no outcome for {id}: a wait did not end"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Drives a manual-delivery fabric until the request is drained.
pub(crate) fn drive_drain(fabric: &SimFabric, e: &TransferEngine, id: orbitte_engine::RequestId) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while e.drain_status(id) != orbitte_engine::DrainStatus::Drained {
        fabric.drive();
        assert!(std::time::Instant::now() < deadline, "{id} never drained");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The contract's byte invariants for one finished request: the completed
/// prefix arrived; outside it, destination bytes changed only inside the
/// outcome's uncertain range; `Complete` means every byte, `None` (WRITE)
/// means no byte.
pub(crate) fn check_bytes(
    o: &orbitte_engine::Outcome,
    src: &[u8],
    dst_before: &[u8],
    dst_after: &[u8],
) {
    use orbitte_engine::RemoteEffect;
    let p = o.completed_prefix as usize;
    assert_eq!(dst_after[..p], src[..p], "completed prefix arrived ({o:?})");
    for i in p..dst_after.len() {
        if !o.uncertain.contains(&(i as u64)) {
            assert_eq!(
                dst_after[i], dst_before[i],
                "byte {i} outside the uncertain range changed ({o:?})"
            );
        }
    }
    match o.remote_effect {
        RemoteEffect::Complete => assert_eq!(dst_after, src),
        RemoteEffect::None if o.op == orbitte_engine::Op::Write => {
            assert_eq!(dst_after, dst_before)
        }
        _ => {}
    }
}

/// Device copies only (no network): puts `bytes` into GPU memory.
pub(crate) fn gpu_put(
    dev: &orbitte_cuda::CudaDevice,
    gpu: &Arc<orbitte_cuda::CudaBuffer>,
    offset: usize,
    bytes: &[u8],
) {
    let mut p = orbitte_cuda::StagingPipeline::new(dev, 1 << 20).unwrap();
    p.upload(gpu, offset, bytes.len(), |c| {
        c.write_from(&bytes[c.offset()..c.offset() + c.len()])
    })
    .unwrap();
}

/// Device copies only (no network): reads GPU memory.
pub(crate) fn gpu_get(
    dev: &orbitte_cuda::CudaDevice,
    gpu: &Arc<orbitte_cuda::CudaBuffer>,
    offset: usize,
    len: usize,
) -> Vec<u8> {
    let mut p = orbitte_cuda::StagingPipeline::new(dev, 1 << 20).unwrap();
    let mut v = vec![0; len];
    p.download(gpu, offset, len, |c| {
        c.read_into(&mut v[c.offset()..c.offset() + c.len()])
    })
    .unwrap();
    v
}

/// Submits one request and waits (up to 30 s) for its outcome.
pub(crate) fn run(e: &TransferEngine, r: orbitte_engine::Request) -> orbitte_engine::Outcome {
    let id = e.submit(&[r]).expect("admitted")[0];
    e.wait(id, Duration::from_secs(30)).expect("outcome")
}

/// The process's log (warnings and up) kept in memory: installed once as
/// the global subscriber, so a test reads what an operator would.
#[derive(Clone, Default)]
pub(crate) struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    /// Installs it as the global subscriber (once per process).
    pub(crate) fn install() -> Self {
        let log = Self::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    }

    /// What was logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
