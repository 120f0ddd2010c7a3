//! Engine overhead per slice, reported as slices per second on one core.
//!
//! - `core/8_rails_64KiB`: the sans-IO core alone: submit one request of
//!   4096 slices of 64 KiB striped over 8 rails (256 in flight per rail,
//!   signal every 16), hand out work items, feed zero-latency completions,
//!   take the outcome. This is the engine's own bookkeeping per slice; the
//!   target is 6.1 M slices/s (8 NICs x 400 Gb/s at 64 KiB).
//! - `sim/raw_verbs` (baseline) and `sim/core_plus_verbs`: the same posting
//!   loop on a zero-latency sim queue pair (64-byte slices so the sim's
//!   copy is negligible), without and with the core in front; the
//!   difference is the core's share of a real posting path.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use orbitte_engine::transport::{
    Op, PathKind, PeerId, RailId, RailSpec, RangeId, RegistrationId, SliceStatus, TransportEvent,
    WorkItem,
};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_proto::core::{Core, CoreConfig, CoreRequest};
use orbitte_verbs::sim::{SimDescription, SimDeviceDesc, SimFabric, SimTiming};
use orbitte_verbs::{
    Access, Completion, InitAttrs, QpCaps, RemoteAddr, RtrAttrs, RtsAttrs, SendOp, SendWr, Sge,
};

const SLICES: u64 = 4096;

fn core(slice: u32, rails: u32, depth: u32, interval: u32) -> (Core, Vec<RailId>) {
    let mut core = Core::new(CoreConfig {
        slice_size: slice,
        tcp_slice_size: 0,
        request_timeout: Duration::from_secs(3600),
        drain_timeout: Duration::from_secs(3600),
    });
    let ids = (0..rails)
        .map(|i| {
            core.add_rail(RailSpec {
                path: PathKind::Rdma,
                peer: PeerId(1),
                nic: Some(i),
                remote_nic: Some(i),
                max_in_flight: depth,
                signal_interval: interval,
            })
        })
        .collect();
    (core, ids)
}

fn request(len: u64, rails: &[RailId]) -> CoreRequest {
    CoreRequest {
        label: 0,
        op: Op::Write,
        registration: RegistrationId(1),
        local_offset: 0,
        peer: PeerId(1),
        range: RangeId(1),
        remote_offset: 0,
        len,
        rails: rails.into(),
        keepalive: None,
    }
}

fn bench_core(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_overhead_per_slice");
    g.throughput(Throughput::Elements(SLICES));
    let (mut core, rails) = core(64 * 1024, 8, 256, 16);
    let mut work: Vec<WorkItem> = Vec::with_capacity(4096);
    let now = Instant::now();
    g.bench_function("core/8_rails_64KiB", |b| {
        b.iter(|| {
            core.submit(now, vec![request(SLICES * 64 * 1024, &rails)])
                .unwrap();
            loop {
                work.clear();
                core.poll_work(&mut work);
                if work.is_empty() {
                    break;
                }
                for w in &work {
                    if w.signaled {
                        core.handle_event(
                            now,
                            TransportEvent::Completed {
                                rail: w.rail,
                                token: w.token,
                                status: SliceStatus::Success,
                                released: true,
                            },
                        );
                    }
                }
            }
            black_box(core.poll_outcome().unwrap());
        })
    });
    g.finish();
}

struct SimPair {
    fabric: SimFabric,
    qp: orbitte_verbs::QueuePair,
    cq: orbitte_verbs::CompletionQueue,
    local: orbitte_verbs::MemoryRegion,
    remote: orbitte_verbs::MemoryRegion,
    _peer: orbitte_verbs::QueuePair,
}

fn sim_pair(depth: u32) -> SimPair {
    let timing = SimTiming {
        base_latency: Duration::ZERO,
        bytes_per_sec: 0,
        jitter: Duration::ZERO,
    };
    let fabric = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("s0", [10, 9, 0, 1])]).with_timing(timing),
        1,
    );
    let ctx = fabric.provider().open("s0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4 * depth).unwrap();
    let a = HostMemory::alloc(1 << 20).unwrap();
    let b = HostMemory::alloc(1 << 20).unwrap();
    let local = pd
        .register(a as Arc<dyn DmaBuffer>, 0..1 << 20, Access::LOCAL_WRITE)
        .unwrap();
    let remote = pd
        .register(
            b as Arc<dyn DmaBuffer>,
            0..1 << 20,
            Access::remote_read_write(),
        )
        .unwrap();
    let caps = QpCaps {
        max_send_wr: depth,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let q1 = pd
        .create_qp(&cq, &cq, caps)
        .unwrap()
        .init(InitAttrs::new(1))
        .unwrap();
    let q2 = pd
        .create_qp(&cq, &cq, caps)
        .unwrap()
        .init(InitAttrs::new(1))
        .unwrap();
    let route = orbitte_verbs::Route::Gid(ctx.query_gid(1, 1).unwrap().gid);
    let mtu = orbitte_verbs::Mtu::Mtu1024;
    let (e1, e2) = (q1.endpoint(route, 1, mtu), q2.endpoint(route, 2, mtu));
    let qp = q1
        .rtr(RtrAttrs::new(e2, 1))
        .unwrap()
        .rts(RtsAttrs::new(1))
        .unwrap();
    let peer = q2
        .rtr(RtrAttrs::new(e1, 1))
        .unwrap()
        .rts(RtsAttrs::new(2))
        .unwrap();
    SimPair {
        fabric,
        qp,
        cq,
        local,
        remote,
        _peer: peer,
    }
}

const SIM_SLICES: u64 = 1024;
const SIM_SLICE: u32 = 64;
const DEPTH: u32 = 128;

fn bench_sim(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_overhead_per_slice");
    g.throughput(Throughput::Elements(SIM_SLICES));
    let mut p = sim_pair(DEPTH);
    let remote = RemoteAddr {
        addr: p.remote.addr(),
        rkey: p.remote.rkey(),
    };
    let mut comps = [Completion::default(); 64];
    let mut sges: Vec<Sge> = Vec::with_capacity(DEPTH as usize);
    g.bench_function("sim/raw_verbs_baseline", |b| {
        b.iter(|| {
            let mut left = SIM_SLICES;
            let mut in_flight = 0u64;
            while left > 0 || in_flight > 0 {
                let n = left.min(u64::from(DEPTH) - in_flight);
                if n > 0 {
                    sges.clear();
                    for i in 0..n {
                        sges.push(Sge::new(
                            p.local.addr() + i * u64::from(SIM_SLICE),
                            SIM_SLICE,
                            p.local.lkey(),
                        ));
                    }
                    let wrs: Vec<SendWr<'_>> = sges
                        .iter()
                        .enumerate()
                        .map(|(i, s)| SendWr {
                            wr_id: i as u64,
                            op: SendOp::Write { remote, imm: None },
                            sges: std::slice::from_ref(s),
                            signaled: i as u64 == n - 1 || i % 16 == 15,
                        })
                        .collect();
                    p.qp.post_send(&wrs).unwrap();
                    left -= n;
                    in_flight += n;
                }
                p.fabric.drive();
                let k = p.cq.poll(&mut comps).unwrap();
                for c in &comps[..k] {
                    // Each signaled completion covers up to 16 requests.
                    let _ = c;
                }
                if k > 0 {
                    in_flight = 0;
                }
            }
        })
    });
    let (mut core, rails) = core(SIM_SLICE, 1, DEPTH, 16);
    let mut work: Vec<WorkItem> = Vec::with_capacity(DEPTH as usize);
    let now = Instant::now();
    g.bench_function("sim/core_plus_verbs", |b| {
        b.iter(|| {
            core.submit(
                now,
                vec![request(SIM_SLICES * u64::from(SIM_SLICE), &rails)],
            )
            .unwrap();
            loop {
                work.clear();
                core.poll_work(&mut work);
                if !work.is_empty() {
                    sges.clear();
                    for w in &work {
                        sges.push(Sge::new(
                            p.local.addr() + w.local_offset % (1 << 19),
                            w.len,
                            p.local.lkey(),
                        ));
                    }
                    let wrs: Vec<SendWr<'_>> = work
                        .iter()
                        .zip(&sges)
                        .map(|(w, s)| SendWr {
                            wr_id: w.token.0,
                            op: SendOp::Write { remote, imm: None },
                            sges: std::slice::from_ref(s),
                            signaled: w.signaled,
                        })
                        .collect();
                    p.qp.post_send(&wrs).unwrap();
                }
                p.fabric.drive();
                let k = p.cq.poll(&mut comps).unwrap();
                for c in &comps[..k] {
                    core.handle_event(
                        now,
                        TransportEvent::Completed {
                            rail: rails[0],
                            token: orbitte_engine::transport::SliceToken(c.wr_id),
                            status: SliceStatus::Success,
                            released: true,
                        },
                    );
                }
                if let Some(o) = core.poll_outcome() {
                    black_box(o);
                    break;
                }
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench_core, bench_sim);
criterion_main!(benches);
