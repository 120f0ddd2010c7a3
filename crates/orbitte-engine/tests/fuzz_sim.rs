//! Seeded fault injection over many random schedules, on the sim fabric
//! through the whole engine (verbs, pollers, timers). Faults hit both
//! peers: on the initiator, stalled work requests, error completions (with
//! and without remote effect), posts refused part-way through a batch, port
//! pauses, QP fatal errors and cancels; on the target, port pauses and QP
//! fatal errors; on either, failed registrations; the target restarts with
//! a newer epoch and the initiator reconnects; and teardown may meet a
//! destroy that fails (`Unquiesced`) on either side. Each schedule checks
//! the contract's invariants:
//! - bytes outside the completed prefix changed only where the outcome's
//!   uncertain range ("possible") allows; `Complete` means every byte;
//! - the uncertain range is no wider than the slices posted: it runs from
//!   the completed prefix to the end of the furthest slice the fabric
//!   accepted for the request (read from the fabric's record of posts), and
//!   a WRITE's remote effect is `None` exactly when nothing was posted;
//! - the failure slice agrees with the completed prefix (at or after it,
//!   its offset is its slice's) and with the fabric (a refused or never
//!   posted slice is not in the record, any other failed slice is);
//! - drain: while the fabric still holds a work request on a request's
//!   bytes, the request is not `Drained` (its outcome said `Pending`, and so
//!   does `drain_status`), for `Cancelled` and `TimedOut` requests too;
//!   every wait ends (an outcome by the request timeout, drain after the
//!   drain timeout's flush);
//! - a failed registration changes nothing (charges, publication, the
//!   fabric's MRs); charges balance (zero after unregistering everything)
//!   and nothing leaks (the memory is freed once the engine lets go), or,
//!   after a failed destroy, exactly the one copy stays retained and
//!   charged, admission is fenced and the memory stays mapped.
//!
//! Seeds: 1000 by default, `ORBITTE_FUZZ_SEEDS=N` for more (the core's
//! virtual-time fuzz in `src/core/tests.rs` reads the same variable).
#![forbid(unsafe_code)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use orbitte_engine::transport::SliceFailure;
use orbitte_engine::{
    Access, Charges, DrainStatus, Op, Outcome, RangeId, RegisterError, RemoteEffect, RequestId,
    Status, TransferEngine, TransferRequest, UnregisterError,
};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{Delivery, SentWr, SimFabric, WrMatch};
use orbitte_verbs::{ObjectKind, SendOp, WcStatus};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn seeds() -> u64 {
    if let Some(n) = std::env::var("ORBITTE_FUZZ_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return n;
    }
    1000
}

const SIZE: usize = 64 * 1024;
const SLICE: usize = 4096;
const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;

#[test]
fn fuzz_sim_fault_schedules_keep_the_contract() {
    let n = seeds();
    let started = Instant::now();
    let mut seen = BTreeMap::new();
    for seed in 0..n {
        for tag in one(seed) {
            *seen.entry(tag).or_insert(0u32) += 1;
        }
    }
    println!("{n} seeds in {:.1?}: {seen:?}", started.elapsed());
    // The schedules must reach every ending, every kind of fault and the
    // drain cases, or the fuzz proves little.
    if n >= 200 {
        for tag in [
            "Complete",
            "Failed",
            "TimedOut",
            "Cancelled",
            "PostFailed",
            "held at outcome",
            "target fault",
            "registration failed",
            "reconnected",
            "unquiesced initiator",
            "unquiesced target",
        ] {
            assert!(seen.contains_key(tag), "no {tag:?} in {n} seeds: {seen:?}");
        }
    }
}

/// One request of the schedule, with where its bytes are.
struct Sent {
    id: RequestId,
    req: TransferRequest,
    /// Index into the schedule's remote buffers.
    remote: usize,
}

/// A remote buffer and its bytes before any request.
struct Remote {
    mem: Arc<HostMemory>,
    before: Vec<u8>,
}

/// What the fabric recorded for one request: the request-relative ends of
/// the slices it accepted, and their offsets.
fn posted_slices(record: &[SentWr], base: u64, r: &TransferRequest) -> Vec<(u64, u64)> {
    let start = base + r.local_offset;
    record
        .iter()
        .filter(|w| matches!(w.op, SendOp::Write { .. } | SendOp::Read { .. }))
        .filter(|w| w.touches(start, r.len))
        .flat_map(|w| w.sges.iter())
        .map(|s| {
            let off = s.addr() - start;
            (off, off + u64::from(s.length()))
        })
        .collect()
}

/// Whether the fabric still holds a work request on the request's bytes.
fn nic_holds(fabric: &SimFabric, base: u64, r: &TransferRequest) -> usize {
    fabric
        .outstanding_sends()
        .iter()
        .filter(|w| w.touches(base + r.local_offset, r.len))
        .count()
}

/// The drain rule at one moment: while the fabric holds a work request on
/// the request's bytes, neither the outcome nor the engine says drained.
/// The engine is asked first: the fabric never takes a buffer back once it
/// let go, so "drained, yet held" read in this order is a violation.
fn check_drain_now(
    seed: u64,
    fabric: &SimFabric,
    a: &TransferEngine,
    base: u64,
    s: &Sent,
    o: Option<&Outcome>,
) -> bool {
    let status = a.drain_status(s.id);
    let held = nic_holds(fabric, base, &s.req);
    if held > 0 {
        assert_ne!(
            status,
            DrainStatus::Drained,
            "seed {seed}: drained while the fabric holds {held} work requests on it"
        );
        if let Some(o) = o {
            match o.drain {
                DrainStatus::Pending { slices } => assert!(
                    held <= slices as usize,
                    "seed {seed}: the fabric holds {held} > {slices} pending slices ({o:?})"
                ),
                DrainStatus::Drained => {
                    panic!("seed {seed}: outcome says drained, the fabric holds {held} ({o:?})")
                }
            }
        }
    }
    held > 0
}

/// The outcome fields against each other and against what the fabric
/// accepted for the request.
fn check_outcome(seed: u64, o: &Outcome, r: &TransferRequest, posted: &[(u64, u64)]) {
    let slices = r.len.div_ceil(SLICE as u64) as u32;
    assert_eq!(
        (o.label, o.op, o.len, o.slices),
        (r.label, r.op, r.len, slices),
        "seed {seed}"
    );
    assert_eq!(
        o.completed_prefix,
        (u64::from(o.completed_slices) * SLICE as u64).min(r.len),
        "seed {seed}: prefix and slices agree ({o:?})"
    );
    let hull = posted.iter().map(|p| p.1).max().unwrap_or(0);
    if o.status == Status::Complete {
        assert_eq!(o.completed_slices, slices, "seed {seed}");
        assert_eq!(o.failure, None, "seed {seed}");
        assert!(o.uncertain.is_empty(), "seed {seed}: {o:?}");
        let effect = if r.op == Op::Write {
            RemoteEffect::Complete
        } else {
            RemoteEffect::None
        };
        assert_eq!(o.remote_effect, effect, "seed {seed}");
        return;
    }
    assert!(o.completed_slices < slices, "seed {seed}: {o:?}");
    // Tight: exactly the posted hull beyond the prefix, nothing wider.
    assert_eq!(
        o.uncertain,
        o.completed_prefix..hull.max(o.completed_prefix),
        "seed {seed}: uncertain is the hull of the posted slices past the prefix \
         (posted {posted:?}, {o:?})"
    );
    let effect = match (r.op, posted.is_empty()) {
        (Op::Read, _) | (Op::Write, true) => RemoteEffect::None,
        (Op::Write, false) => RemoteEffect::Possible {
            bytes: o.uncertain.clone(),
        },
    };
    assert_eq!(o.remote_effect, effect, "seed {seed}: {o:?}");
    if o.status == Status::Failed {
        assert!(o.failure.is_some(), "seed {seed}: {o:?}");
    }
    if let Some(f) = &o.failure {
        assert!(
            f.slice >= o.completed_slices && f.slice < slices,
            "seed {seed}: failure slice {} against prefix {} of {slices} ({o:?})",
            f.slice,
            o.completed_slices
        );
        let offset = u64::from(f.slice) * SLICE as u64;
        assert_eq!(f.offset, offset, "seed {seed}: {o:?}");
        let was_posted = posted.iter().any(|p| p.0 == offset);
        match f.status {
            SliceFailure::PostFailed(_) | SliceFailure::RailDown(_) => assert!(
                !was_posted,
                "seed {seed}: a slice never posted is in the fabric's record ({o:?})"
            ),
            SliceFailure::Completion { .. } | SliceFailure::Flushed => assert!(
                was_posted,
                "seed {seed}: a failed slice the fabric never accepted ({o:?}, posted {posted:?})"
            ),
            ref other => {
                panic!("seed {seed}: a cuda-staging status {other:?} on host memory ({o:?})")
            }
        }
    }
}

/// A registration on `e` that the fabric refuses on `device` changes
/// nothing: not the charges, not the publication, and no memory region of
/// the fabric covers its bytes afterwards. (The fabric's MR count is not
/// compared: rail recovery registers and releases rails' own buffers in
/// the background.)
fn failed_registration_changes_nothing(
    seed: u64,
    fabric: &SimFabric,
    e: &TransferEngine,
    host: &str,
    nics: usize,
    device: &str,
) {
    let (charges, published) = (e.charges(), e.segment_publication());
    let mem = region(SLICE, 3);
    let start = mem.as_ptr() as u64;
    let end = start + mem.len() as u64;
    fabric
        .faults()
        .fail_registration(Some(device), 1, ENOMEM)
        .unwrap();
    let err = e
        .register_host(mem.clone(), Access::REMOTE_READ_WRITE)
        .unwrap_err();
    assert!(
        matches!(&err, RegisterError::Native { device: d, .. } if d.name == device),
        "seed {seed}: {err:?}"
    );
    assert_eq!(e.charges(), charges, "seed {seed}");
    assert_eq!(e.segment_publication(), published, "seed {seed}");
    let covering: Vec<(String, u64, usize)> = names(host, nics)
        .into_iter()
        .flat_map(|d| {
            fabric
                .mr_ranges(&d)
                .into_iter()
                .filter(|&(addr, len)| addr < end && addr + len as u64 > start)
                .map(move |(addr, len)| (d.clone(), addr, len))
        })
        .collect();
    assert!(
        covering.is_empty(),
        "seed {seed}: copies released: {covering:?}"
    );
}

/// Runs one schedule; returns a tag for each outcome's status and for each
/// fault and case it reached.
fn one(seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    let mut tags = Vec::new();
    let nics = 1 + rng.below(2) as usize;
    let fabric = fabric(nics, Delivery::Manual, seed);
    fabric.record_sends(true);
    let a = builder(&fabric, "a", nics)
        .request_timeout(Duration::from_millis(25))
        .drain_timeout(Duration::from_millis(10))
        .max_in_flight(1 + rng.below(8) as u32)
        .signal_interval(1 + rng.below(4) as u32)
        .build()
        .unwrap();
    let mut b_epoch = 10;
    let mut b = builder(&fabric, "b", nics).epoch(b_epoch).build().unwrap();
    // Two halves: the first batch uses the first, a batch after a
    // reconnect the second, so no local byte has two writers.
    let local = region(2 * SIZE, 1);
    let base = orbitte_memory::DmaBuffer::as_ptr(&*local) as u64;
    let mut remotes = vec![Remote {
        mem: region(2 * SIZE, 2),
        before: Vec::new(),
    }];
    remotes[0].before = remotes[0].mem.to_vec(0, 2 * SIZE).unwrap();
    let weak_local = Arc::downgrade(&local);
    let ra = register(&a, &local, Access::LocalOnly);
    let mut rb = register(&b, &remotes[0].mem, Access::REMOTE_READ_WRITE);
    let (mut pb, _) = connect(&a, &b);
    let local_before = local.to_vec(0, 2 * SIZE).unwrap();

    // Faults for the initiator's work requests to come.
    let faults = fabric.faults();
    for _ in 0..rng.below(3) {
        let nth = 1 + rng.below(12) as u32;
        match rng.below(10) {
            0 => faults.stall_send(WrMatch::nth(nth)),
            1..=5 => {
                let status = [
                    WcStatus::RemoteAccess,
                    WcStatus::RetryExceeded,
                    WcStatus::RemoteOperation,
                ][rng.below(3) as usize];
                faults.fail_send(WrMatch::nth(nth), status, rng.below(2) == 0);
            }
            // post_send refused part-way through a batch (EINVAL, or ENOMEM:
            // a full queue).
            6 => faults.fail_post(WrMatch::nth(nth), [22, 12][rng.below(2) as usize]),
            _ => {}
        }
    }
    let mut sent = Vec::new();
    let batch = make_batch(&mut rng, ra.id, pb.id, RangeId(rb.id.0), 0, 0);
    let ids = a.submit(&batch).unwrap();
    sent.extend(
        ids.into_iter()
            .zip(batch)
            .map(|(id, req)| Sent { id, req, remote: 0 }),
    );
    let mut outcomes: BTreeMap<RequestId, Outcome> = BTreeMap::new();
    let mut reconnected = false;
    // A random schedule: steps, port pauses and QP fatal errors on either
    // peer, cancels, failed registrations, one restart of the target.
    for _ in 0..rng.below(40) {
        let dev = |host: &str, rng: &mut Rng| format!("{host}{}", rng.below(nics as u64));
        match rng.below(34) {
            0 => faults.port_down(&dev("a", &mut rng), 1).unwrap(),
            1 => {
                if let Some((nic, q)) = rail_of(&a) {
                    let _ = faults.qp_fatal(&format!("a{nic}"), q);
                }
            }
            2 => {
                let s = &sent[rng.below(sent.len() as u64) as usize];
                if a.cancel(s.id) {
                    // The outcome is made at once; the fabric has not moved.
                    let o = a.poll(s.id).expect("a cancel makes the outcome at once");
                    if check_drain_now(seed, &fabric, &a, base, s, Some(&o)) {
                        tags.push("held at outcome".to_owned());
                    }
                    outcomes.insert(s.id, o);
                }
            }
            3 => std::thread::sleep(Duration::from_millis(1)),
            4 => faults.port_up(&dev("a", &mut rng), 1).unwrap(),
            5 => {
                faults.port_down(&dev("b", &mut rng), 1).unwrap();
                tags.push("target fault".to_owned());
            }
            6 => faults.port_up(&dev("b", &mut rng), 1).unwrap(),
            7 => {
                if let Some((nic, q)) = rail_of(&b)
                    && faults.qp_fatal(&format!("b{nic}"), q).is_ok()
                {
                    tags.push("target fault".to_owned());
                }
            }
            8 => {
                let (e, host) = if rng.below(2) == 0 {
                    (&a, "a")
                } else {
                    (&b, "b")
                };
                let d = dev(host, &mut rng);
                failed_registration_changes_nothing(seed, &fabric, e, host, nics, &d);
                tags.push("registration failed".to_owned());
            }
            9 if !reconnected => {
                // The target restarts with a newer epoch; the initiator
                // reconnects (ports up first, so rails can be made) and
                // sends a second batch into the new incarnation.
                reconnected = true;
                for h in ["a", "b"] {
                    for n in names(h, nics) {
                        faults.port_up(&n, 1).unwrap();
                    }
                }
                drop(b);
                b_epoch += 1;
                b = builder(&fabric, "b", nics).epoch(b_epoch).build().unwrap();
                let mem = region(2 * SIZE, 4);
                let before = mem.to_vec(0, 2 * SIZE).unwrap();
                rb = register(&b, &mem, Access::REMOTE_READ_WRITE);
                remotes.push(Remote { mem, before });
                let (p, _) = connect(&a, &b);
                assert_eq!(p.epoch.value(), b_epoch, "seed {seed}");
                assert_ne!(p.id, pb.id, "seed {seed}: the newer epoch is a new peer");
                pb = p;
                let batch = make_batch(&mut rng, ra.id, pb.id, RangeId(rb.id.0), SIZE as u64, 1);
                let ids = a.submit(&batch).unwrap();
                sent.extend(ids.into_iter().zip(batch).map(|(id, req)| Sent {
                    id,
                    req,
                    remote: 1,
                }));
                tags.push("reconnected".to_owned());
            }
            _ => {
                fabric.step();
            }
        }
    }
    for s in &sent {
        if outcomes.contains_key(&s.id) {
            continue;
        }
        // Taken before the fabric moves again, so a request that timed out
        // on a stalled work request is seen while the fabric holds it.
        let o = match a.poll(s.id) {
            Some(o) => o,
            None => drive_wait(&fabric, &a, s.id),
        };
        if check_drain_now(seed, &fabric, &a, base, s, Some(&o)) {
            tags.push("held at outcome".to_owned());
        }
        outcomes.insert(s.id, o);
    }
    // Drain, checking the rule at every step until the fabric lets go.
    let deadline = Instant::now() + Duration::from_secs(10);
    for s in &sent {
        while a.drain_status(s.id) != DrainStatus::Drained {
            check_drain_now(seed, &fabric, &a, base, s, None);
            fabric.drive();
            assert!(
                Instant::now() < deadline,
                "seed {seed}: {} never drained",
                s.id
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(nic_holds(&fabric, base, &s.req), 0, "seed {seed}: drained");
    }
    assert_eq!(a.outstanding_slices(), 0, "seed {seed}");
    let record = fabric.take_sends();
    let local_after = local.to_vec(0, 2 * SIZE).unwrap();
    let remote_after: Vec<Vec<u8>> = remotes
        .iter()
        .map(|r| r.mem.to_vec(0, 2 * SIZE).unwrap())
        .collect();
    for s in &sent {
        let (r, o) = (&s.req, &outcomes[&s.id]);
        check_outcome(seed, o, r, &posted_slices(&record, base, r));
        let (l, rm, n) = (
            r.local_offset as usize,
            r.remote_offset as usize,
            r.len as usize,
        );
        let remote = &remotes[s.remote];
        match r.op {
            Op::Write => check_bytes(
                o,
                &local_before[l..l + n],
                &remote.before[rm..rm + n],
                &remote_after[s.remote][rm..rm + n],
            ),
            Op::Read => check_bytes(
                o,
                &remote.before[rm..rm + n],
                &local_before[l..l + n],
                &local_after[l..l + n],
            ),
        }
        tags.push(format!("{:?}", o.status));
        if o.failure
            .as_ref()
            .is_some_and(|f| matches!(f.status, SliceFailure::PostFailed(_)))
        {
            tags.push("PostFailed".to_owned());
        }
    }
    // Teardown: clean, or a destroy that fails on one side.
    let teardown = rng.below(6);
    if teardown < 2 {
        let (e, reg, host, copies) = if teardown == 0 {
            (&a, ra.id, "a", 1)
        } else {
            (&b, rb.id, "b", 2)
        };
        let d = format!("{host}{}", rng.below(nics as u64));
        let retained = Charges {
            mrs: 1,
            bytes: 2 * SIZE as u64,
        };
        unquiesced_teardown(seed, &fabric, nics, e, reg, &d, copies, retained);
        if teardown == 1 {
            tags.push("unquiesced target".to_owned());
        } else {
            tags.push("unquiesced initiator".to_owned());
            drop(local);
            assert!(
                a.shutdown(Duration::from_millis(200))
                    .is_err_and(|u| !u.failures.is_empty()),
                "seed {seed}: the retained MR keeps its PD"
            );
            drop(a);
            assert!(
                weak_local.upgrade().is_some(),
                "seed {seed}: the retained MR keeps the memory mapped"
            );
            return tags;
        }
    }
    // Charges balance; nothing leaks.
    a.unregister(ra.id)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert_eq!(a.charges(), Charges::default(), "seed {seed}");
    assert!(a.fenced().is_none(), "seed {seed}");
    drop(local);
    a.shutdown(Duration::from_millis(200))
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    drop(a);
    assert!(
        weak_local.upgrade().is_none(),
        "seed {seed}: the engine let go of the memory"
    );
    tags
}

/// NIC ID and QP number of the first rail of `e`'s first peer.
fn rail_of(e: &TransferEngine) -> Option<(u32, u32)> {
    let rail = e.peers().first()?.rails.first()?.clone();
    Some((rail.nic?.0, rail.qpn?))
}

/// Up to four disjoint requests into the buffers' halves starting at
/// `local_base` (local) and into the remote range: WRITEs go to the
/// remote's first half, READs come from its second half, so no byte has two
/// writers.
fn make_batch(
    rng: &mut Rng,
    registration: orbitte_engine::RegistrationId,
    peer: orbitte_engine::PeerId,
    range: RangeId,
    local_base: u64,
    batch: u64,
) -> Vec<TransferRequest> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for i in 0..1 + rng.below(4) {
        let len = 1 + rng.below(5 * SLICE as u64);
        if at + len > SIZE as u64 {
            break;
        }
        let op = if rng.below(2) == 0 {
            Op::Write
        } else {
            Op::Read
        };
        let remote_offset = if op == Op::Write {
            at
        } else {
            SIZE as u64 + at
        };
        out.push(TransferRequest {
            op,
            registration,
            local_offset: local_base + at,
            peer,
            range,
            remote_offset,
            len,
            label: batch * 100 + i,
            epoch: None,
        });
        at += len + rng.below(300);
    }
    out
}

/// Unregisters `reg` on `e` while the fabric refuses the next MR destroy
/// on `device`: `Unquiesced` naming that device, exactly `retained` kept
/// charged and held by the fabric, admission fenced.
fn unquiesced_teardown(
    seed: u64,
    fabric: &SimFabric,
    nics: usize,
    e: &TransferEngine,
    reg: orbitte_engine::RegistrationId,
    device: &str,
    copies_per_context: usize,
    retained: Charges,
) {
    let host = &device[..1];
    let mrs = || -> Vec<usize> {
        names(host, nics)
            .iter()
            .map(|d| fabric.counts_on(d).unwrap().mrs)
            .collect()
    };
    let before = mrs();
    fabric
        .faults()
        .fail_destroy(device, ObjectKind::MemoryRegion, EBUSY)
        .unwrap();
    let err = e.unregister(reg).unwrap_err();
    let UnregisterError::Unquiesced(u) = err else {
        panic!("seed {seed}: {err:?}")
    };
    assert_eq!(u.failures.len(), 1, "seed {seed}: {u}");
    assert_eq!(u.failures[0].device.name, device, "seed {seed}: {u}");
    assert_eq!(u.retained, retained, "seed {seed}");
    assert_eq!(
        e.charges(),
        retained,
        "seed {seed}: only the retained copy stays charged"
    );
    // Of the registration's copies the fabric keeps exactly the retained
    // one.
    let want: Vec<usize> = names(host, nics)
        .iter()
        .zip(&before)
        .map(|(d, &n)| n - copies_per_context + usize::from(d == device))
        .collect();
    assert_eq!(
        mrs(),
        want,
        "seed {seed}: MRs per device (retained on {device})"
    );
    let fence = e.fenced().expect("fenced");
    assert!(fence.contains("unquiesced"), "seed {seed}: {fence}");
    assert!(
        matches!(
            e.register_host(region(8, 1), Access::LocalOnly),
            Err(RegisterError::Fenced { .. })
        ),
        "seed {seed}: admission fenced"
    );
}
