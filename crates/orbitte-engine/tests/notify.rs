//! Notifications on the rdma (sim), tcp and local paths: the target gets a
//! batch's notification once, only after every byte of the batch is in its
//! memory, tagged with the sender's source id and epoch; a batch that does
//! not complete sends none and its outcomes say so; a notification larger
//! than 1 MiB (4 KiB to a peer reached over rdma only) is refused at
//! submit; one the target cannot keep (its sender's share of the inbox is
//! full) is reported `Refused` to the sender, never lost silently. The
//! initiator never polls for it to go out: the targets below wait for the
//! notification before the initiator looks at any outcome.
#![forbid(unsafe_code)]

mod common;
mod net_support;

use std::sync::Arc;
use std::time::Duration;

use orbitte_engine::{
    Access, ConnectOptions, EngineBuilder, InboxLimits, MAX_NOTIFICATION_LEN, Notification,
    NotificationError, NotificationStatus, Outcome, PathKind, Posting, RDMA_MAX_NOTIFICATION_LEN,
    Registration, RemoteRange, Request, Status, SubmitError, SubmitOptions, TransferEngine,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SimDescription, SimFabric};

use common::{builder, connect, fabric, pattern, region, register};

const BOUND: Duration = Duration::from_secs(30);
/// How long a target waits to be sure that no notification comes.
const QUIET: Duration = Duration::from_millis(300);
const MB: u64 = 1 << 20;

/// `n` WRITEs of `each` bytes: src[k*each..] -> remote[k*each..].
fn writes(src: &Registration, remote: &RemoteRange, n: u64, each: u64) -> Vec<Request> {
    (0..n)
        .map(|k| {
            Request::write(src, k * each..(k + 1) * each)
                .to(remote, k * each)
                .label(k)
        })
        .collect()
}

fn all_sent(outcomes: &[Outcome]) {
    for o in outcomes {
        assert_eq!(o.status, Status::Complete, "{o:?}");
        assert_eq!(o.notification, NotificationStatus::Sent, "{o:?}");
    }
}

/// Notifications a flooded target keeps from one sender in these tests.
const KEPT: usize = 16;
/// Notifications a flood sends.
const FLOOD: usize = 40;

fn refused(o: &Outcome) -> &str {
    match &o.notification {
        NotificationStatus::Refused { why } => why,
        other => panic!("expected Refused, got {other:?} in {o:?}"),
    }
}

/// Sends [`FLOOD`] one-WRITE notifying batches from `initiator` to a
/// `target` that keeps [`KEPT`] and reads none until the end: each is
/// reported `Sent` or `Refused` (naming the bound and the fix), the
/// refusals and the arrivals add up to what was sent, and once the target
/// reads, a notification is taken again.
fn flood_is_reported(initiator: &TransferEngine, target: &TransferEngine, batch: &[Request]) {
    let (mut sent, mut refusals) = (0, 0);
    for i in 0..FLOOD {
        let ids = initiator
            .submit_with_notification(batch, Notification::new(format!("n{i}")))
            .unwrap();
        let outcomes = initiator.wait_all(&ids, BOUND).unwrap();
        let o = &outcomes[0];
        assert_eq!(o.status, Status::Complete, "{o:?}");
        match &o.notification {
            NotificationStatus::Sent => sent += 1,
            _ => {
                let why = refused(o);
                assert!(
                    why.contains(&format!("{KEPT} unread notifications"))
                        && why.contains("must read its notifications"),
                    "{why}"
                );
                refusals += 1;
            }
        }
    }
    assert_eq!((sent, refusals), (KEPT, FLOOD - KEPT));
    let stats = target.notification_stats();
    assert_eq!(
        (stats.queued, stats.refused_full as usize),
        (KEPT, refusals)
    );
    let got: Vec<Vec<u8>> = target
        .notifications()
        .into_iter()
        .map(|n| n.payload)
        .collect();
    let first: Vec<Vec<u8>> = (0..KEPT).map(|i| format!("n{i}").into_bytes()).collect();
    assert_eq!(got, first, "the first ones were kept, in order");
    assert_eq!(got.len() + refusals, FLOOD, "arrived + refused == sent");
    let ids = initiator
        .submit_with_notification(batch, Notification::new(b"after".to_vec()))
        .unwrap();
    all_sent(&initiator.wait_all(&ids, BOUND).unwrap());
    assert_eq!(
        target.wait_notification(BOUND).map(|n| n.payload),
        Some(b"after".to_vec())
    );
}

fn limited() -> InboxLimits {
    InboxLimits {
        per_peer: KEPT,
        per_peer_bytes: 3 * MB,
        ..InboxLimits::default()
    }
}

fn not_sent(o: &Outcome) -> &str {
    match &o.notification {
        NotificationStatus::NotSent { why } => why,
        other => panic!("expected NotSent, got {other:?} in {o:?}"),
    }
}

// ---- rdma, on the simulated fabric ----

/// The notification `target` receives for `initiator`'s batch `ids`; if
/// none comes within [`BOUND`], the panic says how the batch ended (a
/// batch that did not complete withholds it).
fn arrived(
    target: &TransferEngine,
    initiator: &TransferEngine,
    ids: &[orbitte_engine::RequestId],
) -> orbitte_engine::ReceivedNotification {
    target.wait_notification(BOUND).unwrap_or_else(|| {
        let ended: Vec<_> = ids
            .iter()
            .map(|id| initiator.poll(*id).map(|o| (o.status, o.notification)))
            .collect();
        panic!("no notification within {BOUND:?}; the batch's outcomes: {ended:?}")
    })
}

/// `builder` with a request timeout as long as the waits: these batches
/// must complete, however loaded the machine (the 500 ms of `builder` is
/// for tests that time requests out on purpose).
fn patient(fabric: &SimFabric, host: &str, nics: usize) -> EngineBuilder {
    builder(fabric, host, nics).request_timeout(BOUND)
}

#[test]
fn rdma_notification_arrives_once_after_every_byte_and_tagged_with_the_sender() {
    let fabric = fabric(2, Delivery::Background, 11);
    let a = patient(&fabric, "a", 2).build().unwrap();
    let b = patient(&fabric, "b", 2).build().unwrap();
    let len = 4 * MB as usize;
    let src = region(len, 3);
    let dst = HostMemory::alloc(len).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    let dreg = register(&b, &dst, Access::RemoteReadWrite);
    // For the way back: b writes into `back` on a.
    let back = HostMemory::alloc(8192).unwrap();
    let breg = register(&a, &back, Access::RemoteReadWrite);
    let bsrc = register(&b, &dst, Access::LocalOnly);
    let (pa, pb) = connect(&a, &b);
    assert!(pa.rails.len() >= 2, "striped over both rails: {pa:?}");
    let remote = pa
        .ranges
        .iter()
        .find(|r| r.range == orbitte_engine::RangeId(dreg.id.0))
        .copied()
        .unwrap();

    // Many slices (4 KiB each) over two queue pairs, four requests.
    let ids = a
        .submit_with_notification(
            &writes(&sreg, &remote, 4, MB),
            Notification::new(b"kv ready"),
        )
        .unwrap();
    // The target waits; the initiator does nothing.
    let n = arrived(&b, &a, &ids);
    assert_eq!(
        dst.to_vec(0, len).unwrap(),
        src.to_vec(0, len).unwrap(),
        "every byte is in place when the notification is read"
    );
    assert_eq!(n.payload, b"kv ready");
    assert_eq!((n.source_id.as_str(), n.epoch), ("engine-a", a.epoch()));
    assert_eq!(n.path, PathKind::Rdma);
    all_sent(&a.wait_all(&ids, BOUND).unwrap());
    // Once.
    std::thread::sleep(QUIET);
    assert!(b.notifications().is_empty());
    assert_eq!(b.notification_stats().received, 1);
    let (ma, mb) = (a.metrics(), b.metrics());
    assert_eq!((ma.notifications.sent, ma.notifications.not_sent), (1, 0));
    assert_eq!((mb.notifications.received, mb.notifications.sent), (1, 0));

    // The largest notification rdma carries, and one more batch: still
    // once each.
    let big: Vec<u8> = (0..RDMA_MAX_NOTIFICATION_LEN)
        .map(|i| (i % 251) as u8)
        .collect();
    let ids = a
        .submit_with_notification(
            &writes(&sreg, &remote, 1, 8192),
            Notification::new(big.clone()),
        )
        .unwrap();
    let n = arrived(&b, &a, &ids);
    assert_eq!(n.payload, big);
    all_sent(&a.wait_all(&ids, BOUND).unwrap());
    // A batch without a notification says so and sends none.
    let ids = a.submit(&writes(&sreg, &remote, 1, 8192)).unwrap();
    let o = a.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.notification, NotificationStatus::NotRequested);
    assert_eq!(b.wait_notification(QUIET), None);
    // Both directions: the target's rails carry notifications back.
    let remote_a = pb
        .ranges
        .iter()
        .find(|r| r.range == orbitte_engine::RangeId(breg.id.0))
        .copied()
        .expect("a published it");
    let ids = b
        .submit_with_notification(
            &writes(&bsrc, &remote_a, 1, 8192),
            Notification::new(b"back"),
        )
        .unwrap();
    let n = arrived(&a, &b, &ids);
    assert_eq!(
        (n.source_id.as_str(), n.payload.as_slice()),
        ("engine-b", &b"back"[..])
    );
    assert_eq!(back.to_vec(0, 8192).unwrap(), dst.to_vec(0, 8192).unwrap());
    all_sent(&b.wait_all(&ids, BOUND).unwrap());
}

#[test]
fn rdma_notification_is_one_send_behind_the_batch_writes_on_a_rail_the_dispatch_mask_allows() {
    let fabric = fabric(2, Delivery::Background, 13);
    // Only NIC ID 1 may carry a's work.
    let a = patient(&fabric, "a", 2)
        .dispatch_mask(orbitte_engine::DeviceMask(0b10))
        .build()
        .unwrap();
    let b = patient(&fabric, "b", 2).build().unwrap();
    let src = region(64 << 10, 4);
    let dst = HostMemory::alloc(64 << 10).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    register(&b, &dst, Access::RemoteReadWrite);
    let (pa, _) = connect(&a, &b);
    assert_eq!(pa.rails.len(), 2, "{pa:?}");
    fabric.record_sends(true);
    let ids = a
        .submit_with_notification(
            &writes(&sreg, &pa.ranges[0], 2, 32 << 10),
            Notification::new(b"m"),
        )
        .unwrap();
    assert_eq!(arrived(&b, &a, &ids).payload, b"m");
    all_sent(&a.wait_all(&ids, BOUND).unwrap());
    let ours: Vec<_> = fabric
        .take_sends()
        .into_iter()
        .filter(|s| s.device.starts_with('a'))
        .collect();
    assert!(ours.iter().all(|s| s.device == "a1"), "{ours:?}");
    let sends: Vec<_> = ours
        .iter()
        .filter(|s| matches!(s.op, orbitte_verbs::SendOp::Send { .. }))
        .collect();
    assert_eq!(sends.len(), 1, "one SEND: {ours:?}");
    let last = ours.last().unwrap();
    assert!(
        matches!(last.op, orbitte_verbs::SendOp::Send { .. }),
        "{ours:?}"
    );
    assert_eq!(
        ours.iter()
            .filter(|s| s.qpn == last.qpn && matches!(s.op, orbitte_verbs::SendOp::Write { .. }))
            .count(),
        16,
        "the batch's 16 WRITE slices went before it on the same queue pair: {ours:?}"
    );
}

#[test]
fn rdma_batch_that_times_out_or_is_cancelled_sends_no_notification() {
    // Manual delivery: nothing moves until the test drives the fabric.
    let fabric = fabric(1, Delivery::Manual, 5);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let src = region(64 << 10, 1);
    let dst = HostMemory::alloc(64 << 10).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    register(&b, &dst, Access::RemoteReadWrite);
    let (pa, _) = connect(&a, &b);
    let remote = pa.ranges[0];

    // One request cancelled, the other completes: nothing is sent.
    let ids = a
        .submit_with_notification(
            &writes(&sreg, &remote, 2, 16 << 10),
            Notification::new(b"x"),
        )
        .unwrap();
    assert!(a.cancel(ids[1]));
    // The cancelled outcome is held until the batch resolves.
    assert_eq!(a.poll(ids[1]), None);
    let first = common::drive_wait(&fabric, &a, ids[0]);
    assert_eq!(first.status, Status::Complete);
    assert!(not_sent(&first).contains("Cancelled"), "{first:?}");
    let second = a.poll(ids[1]).expect("released with the batch");
    assert_eq!(second.status, Status::Cancelled);
    assert_eq!(second.notification, first.notification);
    common::drive_drain(&fabric, &a, ids[1]);
    for _ in 0..50 {
        fabric.drive();
    }
    assert_eq!(b.wait_notification(Duration::from_millis(50)), None);

    // Every request times out (the fabric is not driven): nothing is sent.
    let ids = a
        .submit_with_notification(
            &writes(&sreg, &remote, 2, 16 << 10),
            Notification::new(b"y"),
        )
        .unwrap();
    let outcomes = a.wait_all(&ids, BOUND).unwrap();
    for o in &outcomes {
        assert_eq!(o.status, Status::TimedOut, "{o:?}");
        assert!(not_sent(o).contains("TimedOut"), "{o:?}");
    }
    for id in &ids {
        common::drive_drain(&fabric, &a, *id);
    }
    for _ in 0..50 {
        fabric.drive();
    }
    assert_eq!(b.wait_notification(Duration::from_millis(50)), None);
    assert_eq!(b.notification_stats().received, 0);
}

#[test]
fn an_rdma_flood_to_a_target_that_does_not_read_is_refused_and_reported() {
    let fabric = fabric(1, Delivery::Background, 21);
    let a = patient(&fabric, "a", 1).build().unwrap();
    let b = patient(&fabric, "b", 1)
        .notification_inbox(limited())
        .build()
        .unwrap();
    let src = region(4096, 1);
    let dst = HostMemory::alloc(4096).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    register(&b, &dst, Access::RemoteReadWrite);
    let (pa, _) = connect(&a, &b);
    flood_is_reported(&a, &b, &writes(&sreg, &pa.ranges[0], 1, 4096));
}

#[test]
fn an_rdma_notification_over_4_kib_is_refused_at_submit_naming_the_path() {
    let fabric = fabric(1, Delivery::Background, 9);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let src = region(8192, 1);
    let dst = HostMemory::alloc(8192).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    register(&b, &dst, Access::RemoteReadWrite);
    let (pa, _) = connect(&a, &b);
    let batch = writes(&sreg, &pa.ranges[0], 1, 8192);
    let err = a
        .submit_with_notification(
            &batch,
            Notification::new(vec![0; RDMA_MAX_NOTIFICATION_LEN + 1]),
        )
        .unwrap_err();
    assert_eq!(
        err,
        SubmitError::Notification(NotificationError::TooLargeForPath {
            len: RDMA_MAX_NOTIFICATION_LEN + 1,
            max: RDMA_MAX_NOTIFICATION_LEN,
            path: PathKind::Rdma,
        })
    );
    assert!(
        err.to_string().contains("4096 bytes the rdma path carries"),
        "{err}"
    );
    assert_eq!(a.outstanding_slices(), 0, "nothing was posted");
    // The largest the path carries goes.
    let ids = a
        .submit_with_notification(
            &batch,
            Notification::new(vec![7; RDMA_MAX_NOTIFICATION_LEN]),
        )
        .unwrap();
    all_sent(&a.wait_all(&ids, BOUND).unwrap());
    assert_eq!(
        b.wait_notification(BOUND).map(|n| n.payload),
        Some(vec![7; RDMA_MAX_NOTIFICATION_LEN])
    );
}

#[test]
fn an_rdma_notification_over_1_mib_is_refused_at_submit_and_nothing_is_posted() {
    let fabric = fabric(1, Delivery::Background, 9);
    let a = builder(&fabric, "a", 1).build().unwrap();
    let b = builder(&fabric, "b", 1).build().unwrap();
    let src = region(8192, 1);
    let dst = HostMemory::alloc(8192).unwrap();
    let sreg = register(&a, &src, Access::LocalOnly);
    register(&b, &dst, Access::RemoteReadWrite);
    let (pa, _) = connect(&a, &b);
    let batch = writes(&sreg, &pa.ranges[0], 1, 8192);
    let err = a
        .submit_with_notification(&batch, Notification::new(vec![0; MAX_NOTIFICATION_LEN + 1]))
        .unwrap_err();
    assert_eq!(
        err,
        SubmitError::Notification(NotificationError::TooLarge {
            len: MAX_NOTIFICATION_LEN + 1,
            max: MAX_NOTIFICATION_LEN
        })
    );
    assert_eq!(a.outstanding_slices(), 0, "nothing was posted");
    assert_eq!(dst.to_vec(0, 8192).unwrap(), vec![0; 8192]);
    assert_eq!(b.wait_notification(QUIET), None);
}

// ---- tcp and local: two engines on loopback ----

fn net_engine(name: &str) -> TransferEngine {
    net_engine_with(name, InboxLimits::default())
}

fn net_engine_with(name: &str, limits: InboxLimits) -> TransferEngine {
    let fabric = SimFabric::new(SimDescription::new(vec![]), 1);
    EngineBuilder::new(name)
        .provider(fabric.provider_for(&[]))
        .host_memory_without_rdma()
        .slice_size(256 << 10)
        .notification_inbox(limits)
        .listen("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap()
}

struct Net {
    target: TransferEngine,
    dst: Arc<HostMemory>,
    initiator: TransferEngine,
    src: Arc<HostMemory>,
    sreg: Registration,
    remote: RemoteRange,
}

fn net(path: PathKind, len: usize) -> Net {
    net_with(path, len, InboxLimits::default())
}

/// [`net`] with a target that keeps `limits` of each sender's
/// notifications.
fn net_with(path: PathKind, len: usize, limits: InboxLimits) -> Net {
    let target = net_engine_with(&format!("{path}-target"), limits);
    let dst = HostMemory::alloc(len).unwrap();
    let dreg = target
        .register(dst.clone(), Access::RemoteReadWrite)
        .unwrap();
    let initiator = net_engine(&format!("{path}-initiator"));
    let src = HostMemory::alloc(len).unwrap();
    src.write_at(0, &pattern(len, 7)).unwrap();
    let sreg = initiator.register(src.clone(), Access::LocalOnly).unwrap();
    let addr = target.listen_addr().expect("listening");
    let peer = initiator
        .connect_with(addr, ConnectOptions::new().path(path).rails(2))
        .unwrap();
    assert_eq!(peer.path, path, "{peer:?}");
    let remote = peer
        .ranges()
        .iter()
        .find(|r| r.range == orbitte_engine::RangeId(dreg.id.0))
        .copied()
        .unwrap();
    Net {
        target,
        dst,
        initiator,
        src,
        sreg,
        remote,
    }
}

fn delivered_once_after_every_byte(path: PathKind) {
    let len = 16 * MB as usize;
    let n = net(path, len);
    let ids = n
        .initiator
        .submit_with_notification(
            &writes(&n.sreg, &n.remote, 8, 2 * MB),
            Notification::new(format!("{path} batch done")),
        )
        .unwrap();
    let got = arrived(&n.target, &n.initiator, &ids);
    assert_eq!(
        n.dst.to_vec(0, len).unwrap(),
        n.src.to_vec(0, len).unwrap(),
        "every byte is in place when the notification is read"
    );
    assert_eq!(got.payload, format!("{path} batch done").as_bytes());
    assert_eq!(got.source_id, format!("{path}-initiator"));
    assert_eq!(got.epoch, n.initiator.epoch());
    assert_eq!(got.path, path);
    all_sent(&n.initiator.wait_all(&ids, BOUND).unwrap());
    std::thread::sleep(QUIET);
    assert!(n.target.notifications().is_empty(), "delivered once");

    // A second sender is told apart from the first.
    let other = net_engine(&format!("{path}-other"));
    let osrc = HostMemory::alloc(4096).unwrap();
    osrc.fill(0, 4096, 0xee).unwrap();
    let oreg = other.register(osrc, Access::LocalOnly).unwrap();
    let peer = other
        .connect_with(
            n.target.listen_addr().unwrap(),
            ConnectOptions::new().path(path),
        )
        .unwrap();
    let remote = peer
        .ranges()
        .iter()
        .find(|r| r.range == n.remote.range)
        .copied()
        .unwrap();
    let ids = other
        .submit_with_notification(
            &[Request::write(&oreg, 0..4096).to(&remote, 0)],
            Notification::new(b"other"),
        )
        .unwrap();
    let got = n.target.wait_notification(BOUND).expect("second sender");
    assert_eq!(
        (got.source_id.as_str(), got.epoch, got.payload.as_slice()),
        (
            format!("{path}-other").as_str(),
            other.epoch(),
            &b"other"[..]
        )
    );
    assert_eq!(n.dst.to_vec(0, 4096).unwrap(), vec![0xee; 4096]);
    all_sent(&other.wait_all(&ids, BOUND).unwrap());
    assert_eq!(n.target.notification_stats().received, 2);
}

/// Cancels the last request of a large batch right after submitting it,
/// until a cancel wins: that batch must send nothing. (A batch whose
/// cancel came too late completed: its notification arrives.)
fn cancelled_batch_sends_nothing(path: PathKind) {
    let len = 32 * MB as usize;
    let n = net(path, len);
    for attempt in 0..20 {
        let ids = n
            .initiator
            .submit_with_notification(
                &writes(&n.sreg, &n.remote, 16, 2 * MB),
                Notification::new(vec![attempt as u8]),
            )
            .unwrap();
        let last = *ids.last().unwrap();
        let won = n.initiator.cancel(last);
        let outcomes = n.initiator.wait_all(&ids, BOUND).unwrap();
        for id in &ids {
            n.initiator.wait_drain(*id, BOUND).unwrap();
        }
        if won {
            for o in &outcomes {
                assert!(not_sent(o).contains("Cancelled"), "{o:?}");
            }
            assert_eq!(n.target.wait_notification(QUIET), None);
            assert!(n.target.notifications().is_empty());
            return;
        }
        all_sent(&outcomes);
        let got = n.target.wait_notification(BOUND).expect("completed batch");
        assert_eq!(got.payload, [attempt as u8]);
    }
    panic!("no cancel won in 20 attempts of a 32 MiB batch");
}

/// A batch submitted with `Posting::Queued` (every copy left to the
/// rails' workers): thousands of small WRITEs, then READs back, each
/// byte in place, the notification after the last byte.
fn queued_batches_move_every_byte(path: PathKind) {
    let each = 4096u64;
    let n_req = 4096u64;
    let len = (each * n_req) as usize;
    let n = net(path, len);
    let queued = || SubmitOptions::new().posting(Posting::Queued);
    let ids = n
        .initiator
        .submit_with(
            &writes(&n.sreg, &n.remote, n_req, each),
            queued().notification(Notification::new(b"queued")),
        )
        .unwrap();
    let got = arrived(&n.target, &n.initiator, &ids);
    assert_eq!(got.payload, b"queued");
    assert_eq!(
        n.dst.to_vec(0, len).unwrap(),
        n.src.to_vec(0, len).unwrap(),
        "every byte is in place when the notification is read"
    );
    all_sent(&n.initiator.wait_all(&ids, BOUND).unwrap());
    n.src.fill(0, len, 0).unwrap();
    let reads: Vec<Request> = (0..n_req)
        .map(|k| Request::read(&n.sreg, k * each..(k + 1) * each).from(&n.remote, k * each))
        .collect();
    let ids = n.initiator.submit_with(&reads, queued()).unwrap();
    for o in n.initiator.wait_all(&ids, BOUND).unwrap() {
        assert_eq!(o.status, Status::Complete, "{o:?}");
    }
    assert_eq!(n.src.to_vec(0, len).unwrap(), pattern(len, 7));
}

fn flood(path: PathKind) {
    let n = net_with(path, 4096, limited());
    flood_is_reported(
        &n.initiator,
        &n.target,
        &writes(&n.sreg, &n.remote, 1, 4096),
    );
}

/// 1 MiB notifications arrive whole; the one that would pass the
/// sender's byte budget on the target is refused, naming it.
fn one_mib_arrives_whole_and_the_byte_budget_holds(path: PathKind) {
    let n = net_with(path, 4096, limited());
    let batch = writes(&n.sreg, &n.remote, 1, 4096);
    for k in 0..3u8 {
        let note = pattern(MAX_NOTIFICATION_LEN, k);
        let ids = n
            .initiator
            .submit_with_notification(&batch, Notification::new(note))
            .unwrap();
        all_sent(&n.initiator.wait_all(&ids, BOUND).unwrap());
    }
    let ids = n
        .initiator
        .submit_with_notification(&batch, Notification::new(vec![1; MAX_NOTIFICATION_LEN]))
        .unwrap();
    let outcomes = n.initiator.wait_all(&ids, BOUND).unwrap();
    let why = refused(&outcomes[0]);
    assert!(
        why.contains(&format!("budget of {} bytes", 3 * MB)),
        "{why}"
    );
    let got = n.target.notifications();
    assert_eq!(got.len(), 3);
    for (k, g) in got.iter().enumerate() {
        assert_eq!(g.payload, pattern(MAX_NOTIFICATION_LEN, k as u8), "#{k}");
        assert_eq!(g.path, path);
    }
    assert_eq!(n.target.notification_stats().queued_bytes, 0);
}

#[test]
fn tcp_flood_to_a_target_that_does_not_read_is_refused_and_reported() {
    flood(PathKind::Tcp);
}

#[test]
fn local_flood_to_a_target_that_does_not_read_is_refused_and_reported() {
    flood(PathKind::Local);
}

#[test]
fn tcp_notification_of_1_mib_arrives_whole_within_the_byte_budget() {
    one_mib_arrives_whole_and_the_byte_budget_holds(PathKind::Tcp);
}

#[test]
fn local_notification_of_1_mib_arrives_whole_within_the_byte_budget() {
    one_mib_arrives_whole_and_the_byte_budget_holds(PathKind::Local);
}

#[test]
fn local_queued_batches_move_every_byte() {
    queued_batches_move_every_byte(PathKind::Local);
}

#[test]
fn tcp_queued_batches_move_every_byte() {
    queued_batches_move_every_byte(PathKind::Tcp);
}

#[test]
fn tcp_notification_arrives_once_after_every_byte_and_tagged_with_the_sender() {
    delivered_once_after_every_byte(PathKind::Tcp);
}

#[test]
fn local_notification_arrives_once_after_every_byte_and_tagged_with_the_sender() {
    delivered_once_after_every_byte(PathKind::Local);
}

#[test]
fn tcp_batch_that_does_not_complete_sends_no_notification() {
    cancelled_batch_sends_nothing(PathKind::Tcp);
}

#[test]
fn local_batch_that_does_not_complete_sends_no_notification() {
    cancelled_batch_sends_nothing(PathKind::Local);
}

#[test]
fn tcp_notification_too_large_is_refused_at_submit() {
    let n = net(PathKind::Tcp, 4096);
    let err = n
        .initiator
        .submit_with_notification(
            &writes(&n.sreg, &n.remote, 1, 4096),
            Notification::new(vec![1; MAX_NOTIFICATION_LEN + 1]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            SubmitError::Notification(NotificationError::TooLarge { len, .. }) if len == MAX_NOTIFICATION_LEN + 1
        ),
        "{err}"
    );
    assert_eq!(
        n.dst.to_vec(0, 4096).unwrap(),
        vec![0; 4096],
        "nothing was posted"
    );
    assert_eq!(n.target.wait_notification(QUIET), None);
}

#[test]
fn a_tcp_peer_is_tagged_by_its_session_and_a_malformed_notification_ends_the_session() {
    use orbitte_wire::{ErrorCode, Frame, HEADER_LEN, Notification as WireNotification};
    let target = net_engine("raw-target");
    let addr = target.listen_addr().unwrap();
    let (mut s, _) = net_support::raw::handshake(addr, "raw-sender", 4, None);
    net_support::raw::send(
        &mut s,
        &Frame::Notification(WireNotification {
            notification_id: 1,
            payload: b"ok".to_vec(),
        }),
    );
    let got = target.wait_notification(BOUND).expect("queued");
    assert_eq!(
        (
            got.source_id.as_str(),
            got.epoch.value(),
            got.path,
            got.payload.as_slice()
        ),
        ("raw-sender", 4, PathKind::Tcp, &b"ok"[..])
    );
    // The payload's length field claims one byte more than the body has.
    let mut bad = Frame::Notification(WireNotification {
        notification_id: 2,
        payload: b"bad".to_vec(),
    })
    .to_bytes()
    .unwrap();
    bad[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&4u32.to_be_bytes());
    std::io::Write::write_all(&mut s, &bad).unwrap();
    let frames = net_support::raw::read_until_closed(&mut s);
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Error(e) if e.code == ErrorCode::MALFORMED_FRAME)),
        "{frames:?}"
    );
    assert!(target.notifications().is_empty());
    assert_eq!(target.notification_stats().received, 1);
}
