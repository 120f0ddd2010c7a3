//! Cost of the sim fabric's post -> execute -> poll cycle for batches of
//! 4 KiB RDMA WRITEs, against a plain memcpy of the same bytes as the
//! baseline (the floor any copy-based fabric pays).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use orbitte_memory::HostMemory;
use orbitte_verbs::sim::{SimDescription, SimDeviceDesc, SimFabric};
use orbitte_verbs::{
    Access, Completion, InitAttrs, Mtu, QpCaps, Route, RtrAttrs, RtsAttrs, SendWr,
};

const SLICE: usize = 4096;
const BATCH: usize = 32;

fn bench(c: &mut Criterion) {
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("sim0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("sim1", [10, 0, 0, 2]),
        ]),
        1,
    );
    let p = fabric.provider();
    let (ca, cb) = (p.open("sim0").unwrap(), p.open("sim1").unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(1024).unwrap(), cb.create_cq(1024).unwrap());
    let qa = pa.create_qp(&qa_cq, &qa_cq, QpCaps::default()).unwrap();
    let qb = pb.create_qp(&qb_cq, &qb_cq, QpCaps::default()).unwrap();
    let ga = ca.query_gid(1, 1).unwrap().gid;
    let gb = cb.query_gid(1, 1).unwrap().gid;
    let ea = qa.endpoint(Route::Gid(ga), 1, Mtu::Mtu1024);
    let eb = qb.endpoint(Route::Gid(gb), 2, Mtu::Mtu1024);
    let mut qa = qa
        .connect(InitAttrs::new(1), RtrAttrs::new(eb, 1), RtsAttrs::new(1))
        .unwrap();
    let _qb = qb
        .connect(InitAttrs::new(1), RtrAttrs::new(ea, 1), RtsAttrs::new(2))
        .unwrap();
    let src = HostMemory::alloc(SLICE * BATCH).unwrap();
    let dst = HostMemory::alloc(SLICE * BATCH).unwrap();
    let mr_a = pa
        .register(src.clone(), 0..SLICE * BATCH, Access::local_only())
        .unwrap();
    let mr_b = pb
        .register(dst.clone(), 0..SLICE * BATCH, Access::remote_read_write())
        .unwrap();
    let sges: Vec<_> = (0..BATCH)
        .map(|i| [mr_a.sge(i * SLICE, SLICE).unwrap()])
        .collect();
    let wrs: Vec<SendWr<'_>> = (0..BATCH)
        .map(|i| {
            SendWr::write(i as u64, &sges[i], mr_b.remote(i * SLICE).unwrap())
                .signaled(i == BATCH - 1)
        })
        .collect();
    let mut wcs = [Completion::default(); 8];

    let mut g = c.benchmark_group("32x4KiB");
    g.throughput(Throughput::Bytes((SLICE * BATCH) as u64));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("baseline_memcpy", |b| {
        b.iter(|| dst.copy_from(0, &src, 0, SLICE * BATCH).unwrap())
    });
    g.bench_function("sim_write_batch_one_signal", |b| {
        b.iter(|| {
            qa.post_send(black_box(&wrs)).unwrap();
            fabric.drive();
            let n = qa_cq.poll(&mut wcs).unwrap();
            assert_eq!(n, 1);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
