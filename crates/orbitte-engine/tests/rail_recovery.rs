//! Rail recovery on the sim fabric: an rdma rail whose queue pair went to
//! the error state, or whose port went down, is re-established in the
//! background over the peer's rdma control session, at the same epoch;
//! requests that failed keep their outcome; other rails carry the traffic
//! meanwhile; a recovery that keeps failing cools down.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use orbitte_engine::{
    Access, ConnectOptions, EngineBuilder, PathKind, Peer, RailInfo, RangeId, RecoveryPolicy,
    RecoveryState, RegistrationId, Status, TransferEngine, TransferRequest,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, WrMatch};

const LEN: usize = 16 * 4096;
/// Bound on waiting for background work; never reached when it works.
const BOUND: Duration = Duration::from_secs(20);

struct Pair {
    fabric: SimFabric,
    target: TransferEngine,
    client: TransferEngine,
    remote: Arc<HostMemory>,
    range: RangeId,
    src: Arc<HostMemory>,
    src_reg: RegistrationId,
    peer: Peer,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = self.client.shutdown(Duration::from_secs(5));
        let _ = self.target.shutdown(Duration::from_secs(5));
    }
}

fn fill(m: &HostMemory, seed: u8) {
    let bytes: Vec<u8> = (0..m.len())
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect();
    m.write_at(0, &bytes).unwrap();
}

/// Two engines with two NICs each; the client opens the target over rdma
/// (it holds the rdma control session, so it re-establishes rails).
fn pair(seed: u64, policy: RecoveryPolicy) -> Pair {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("a0", [10, 1, 0, 1]),
            SimDeviceDesc::roce("a1", [10, 1, 1, 1]),
            SimDeviceDesc::roce("b0", [10, 2, 0, 1]),
            SimDeviceDesc::roce("b1", [10, 2, 1, 1]),
        ])
        .with_delivery(Delivery::Background),
        seed,
    );
    let target = EngineBuilder::new("recovery-target")
        .provider(fabric.provider_for(&["a0", "a1"]))
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let client = EngineBuilder::new("recovery-client")
        .provider(fabric.provider_for(&["b0", "b1"]))
        .slice_size(4096)
        .rail_recovery(policy)
        .session_settings(|cfg| {
            cfg.host_id = orbitte_wire::HostId::new("another-host").unwrap();
        })
        .build()
        .unwrap();
    let remote = HostMemory::alloc(LEN).unwrap();
    fill(&remote, 1);
    let reg = target.register(&remote, Access::REMOTE_READ_WRITE).unwrap();
    let src = HostMemory::alloc(LEN).unwrap();
    fill(&src, 2);
    let src_reg = client.register(&src, Access::LocalOnly).unwrap().id;
    let addr = target.listen_addr().unwrap();
    let peer = client
        .connect_with(addr, ConnectOptions::new().path(PathKind::Rdma))
        .expect("rdma peer");
    assert_eq!(peer.path, PathKind::Rdma);
    assert_eq!(peer.rails.len(), 2, "{peer:?}");
    Pair {
        fabric,
        target,
        client,
        remote,
        range: RangeId(reg.id.0),
        src,
        src_reg,
        peer,
    }
}

fn quick() -> RecoveryPolicy {
    RecoveryPolicy {
        max_attempts: 4,
        first_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        cooldown: Duration::from_secs(3600),
    }
}

impl Pair {
    fn rail(&self, engine: &TransferEngine, index: usize) -> RailInfo {
        let peers = engine.peers();
        assert_eq!(peers.len(), 1, "{peers:?}");
        peers[0].rails[index].clone()
    }

    /// Waits until the client's rail `index` satisfies `ok`.
    fn until(&self, index: usize, what: &str, ok: impl Fn(&RailInfo) -> bool) -> RailInfo {
        let deadline = Instant::now() + BOUND;
        loop {
            let r = self.rail(&self.client, index);
            if ok(&r) {
                return r;
            }
            assert!(Instant::now() < deadline, "rail never {what}: {r:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Writes `len` bytes at `offset` and returns the outcome.
    fn write(&self, offset: u64, len: u64) -> orbitte_engine::Outcome {
        let ids = self
            .client
            .submit(&[TransferRequest::write(
                self.src_reg,
                offset,
                self.peer.id(),
                self.range,
                offset,
                len,
            )])
            .expect("submit");
        self.client.wait(ids[0], BOUND).expect("outcome")
    }

    /// Writes on a fresh region of the target and returns which client
    /// devices carried its slices.
    fn write_counting_devices(&self, offset: u64, len: u64) -> Vec<String> {
        self.fabric.take_sends();
        self.fabric.record_sends(true);
        let o = self.write(offset, len);
        let sends = self.fabric.take_sends();
        self.fabric.record_sends(false);
        assert_eq!(o.status, Status::Complete, "{o:?}");
        let o_len = len as usize;
        let at = offset as usize;
        assert_eq!(
            self.remote.to_vec(at, o_len).unwrap(),
            self.src.to_vec(at, o_len).unwrap()
        );
        let mut devices: Vec<String> = sends.into_iter().map(|s| s.device).collect();
        devices.sort();
        devices.dedup();
        devices
    }
}

#[test]
fn a_fatal_queue_pair_is_replaced_and_a_later_batch_runs_on_every_rail() {
    let p = pair(61, quick());
    let before = p.rail(&p.client, 0);
    let device = before.device.clone().unwrap();
    let old_qpn = before.qpn.unwrap();
    let target_before = p.rail(&p.target, 0);
    assert_eq!(before.recovery, Some(RecoveryState::Up));
    assert_eq!(before.recoveries, 0);

    // A request in flight on that rail when its QP dies fails, and keeps
    // its outcome: its stalled slices are flushed, never replayed.
    p.fabric
        .faults()
        .stall_send(WrMatch::nth(1).on_device(&device));
    let ids = p
        .client
        .submit(&[TransferRequest::write(
            p.src_reg,
            0,
            p.peer.id(),
            p.range,
            0,
            LEN as u64 / 2,
        )])
        .unwrap();
    p.fabric.faults().qp_fatal(&device, old_qpn).unwrap();
    let failed = p.client.wait(ids[0], BOUND).unwrap();
    assert_eq!(failed.status, Status::Failed, "{failed:?}");
    let f = failed.failure.clone().unwrap();
    assert_eq!(f.nic, before.nic, "{f:?}");
    p.client.wait_drain(ids[0], BOUND).unwrap();
    let at_failure = p.remote.to_vec(0, LEN / 2).unwrap();
    assert_ne!(
        at_failure,
        p.src.to_vec(0, LEN / 2).unwrap(),
        "the stalled slices did not land"
    );

    let after = p.until(0, "recovered", |r| r.up && r.recoveries == 1);
    assert_eq!(after.recovery, Some(RecoveryState::Up));
    assert_eq!(after.rail, before.rail, "the same rail, recovered");
    assert_ne!(after.qpn, Some(old_qpn), "on a new queue pair");
    assert_eq!(after.device.as_deref(), Some(device.as_str()));
    assert_eq!(after.remote_nic, before.remote_nic, "same NIC pair");
    let peers = p.client.peers();
    assert_eq!(peers[0].epoch, p.peer.epoch(), "same peer epoch");
    // The target replaced its end of the rail too.
    let t = p.rail(&p.target, 0);
    assert_eq!(t.rail, target_before.rail);
    assert_ne!(t.qpn, target_before.qpn);
    assert_eq!((t.up, t.recoveries), (true, 1), "{t:?}");

    // A later batch completes on both rails.
    let devices = p.write_counting_devices(LEN as u64 / 2, LEN as u64 / 2);
    assert_eq!(devices, vec!["b0".to_owned(), "b1".to_owned()]);
    // The failed request's outcome stands: nothing more for it, and its
    // flushed slices were not written later.
    assert!(p.client.poll(ids[0]).is_none());
    assert_eq!(p.remote.to_vec(0, LEN / 2).unwrap(), at_failure, "replayed");
}

#[test]
fn a_port_flap_recovers_after_the_port_returns_and_not_before() {
    let p = pair(62, quick());
    let r0 = p.rail(&p.client, 0);
    let device = r0.device.clone().unwrap();
    let other = if device == "b0" { "b1" } else { "b0" };
    p.fabric.faults().port_down(&device, 1).unwrap();
    // Attempts are made and fail while the port is down; the rail stays
    // down.
    let down = p.until(0, "retried", |r| {
        matches!(
            r.recovery,
            Some(RecoveryState::Recovering { attempt, .. }) if attempt >= 2
        ) || matches!(r.recovery, Some(RecoveryState::CoolingDown { .. }))
    });
    assert!(!down.up, "{down:?}");
    assert_eq!(down.recoveries, 0);
    let m = p.client.metrics();
    let rdma = m.peers.iter().find(|r| r.path == "rdma").expect("rdma row");
    assert_eq!(
        (rdma.rails_up, rdma.rails_down, m.rail_recoveries),
        (1, 1, 0),
        "{m:#?}"
    );
    // Meanwhile the other rail carries the traffic.
    let devices = p.write_counting_devices(0, LEN as u64 / 2);
    assert_eq!(devices, vec![other.to_owned()]);
    assert!(!p.rail(&p.client, 0).up, "not before the port returns");

    p.fabric.faults().port_up(&device, 1).unwrap();
    let up = p.until(0, "recovered", |r| r.up);
    assert_eq!(up.recoveries, 1, "{up:?}");
    assert_eq!(up.recovery, Some(RecoveryState::Up));
    let m = p.client.metrics();
    let rdma = m.peers.iter().find(|r| r.path == "rdma").expect("rdma row");
    assert_eq!(
        (rdma.rails_up, rdma.rails_down, m.rail_recoveries),
        (2, 0, 1),
        "{m:#?}"
    );
    let devices = p.write_counting_devices(LEN as u64 / 2, LEN as u64 / 2);
    assert_eq!(devices, vec!["b0".to_owned(), "b1".to_owned()]);
}

#[test]
fn a_recovery_that_keeps_failing_cools_down_after_bounded_attempts() {
    let policy = RecoveryPolicy {
        max_attempts: 3,
        ..quick()
    };
    let p = pair(63, policy);
    let r0 = p.rail(&p.client, 0);
    let device = r0.device.clone().unwrap();
    // Kill the QP and keep the port down: every attempt fails.
    p.fabric.faults().port_down(&device, 1).unwrap();
    p.fabric
        .faults()
        .qp_fatal(&device, r0.qpn.unwrap())
        .unwrap();
    let cooling = p.until(0, "cooling down", |r| {
        if let Some(RecoveryState::Recovering { attempt, .. }) = r.recovery {
            assert!(attempt <= 3, "attempts are bounded: {r:?}");
        }
        matches!(r.recovery, Some(RecoveryState::CoolingDown { .. }))
    });
    let Some(RecoveryState::CoolingDown { until, since }) = cooling.recovery else {
        unreachable!()
    };
    assert!(until >= since + Duration::from_secs(3600), "{cooling:?}");
    assert!(!cooling.up);
    // No attempt while cooling down: the state does not change.
    for _ in 0..20 {
        let r = p.rail(&p.client, 0);
        assert_eq!(r.recovery, cooling.recovery, "{r:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The port returning ends the cooldown: a new queue pair.
    p.fabric.faults().port_up(&device, 1).unwrap();
    let up = p.until(0, "recovered", |r| r.up);
    assert_eq!(up.recoveries, 1);
    assert_ne!(up.qpn, r0.qpn);
    let devices = p.write_counting_devices(0, LEN as u64);
    assert_eq!(devices, vec!["b0".to_owned(), "b1".to_owned()]);
}
