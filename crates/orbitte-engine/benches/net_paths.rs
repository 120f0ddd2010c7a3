//! Loopback throughput of the tcp and local paths, each next to its
//! baseline measured in the same run:
//! - tcp path (WRITE and READ through the engine core, 4 connections,
//!   pipelined) next to raw TCP sockets streaming the same bytes over the
//!   same number of connections;
//! - local path (WRITE through the peer's memfd mapping) next to a plain
//!   memcpy between two buffers.
//!
//! Blocks of 64 KiB and 1 MiB (one request per block, sliced at the block
//! size). Run: `cargo bench -p orbitte-engine --bench net_paths`; the
//! ratios are recorded in docs/paths.md.
#![forbid(unsafe_code)]

#[path = "../tests/net_support/mod.rs"]
mod net_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use net_support::{Initiator, RW, Target, cfg, pattern, request};
use orbitte_engine::outcome::Status;
use orbitte_engine::transport::{Op, PathKind, PeerId, RailId, RegistrationId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;

const TOTAL: usize = 64 << 20;
const CONNS: usize = 4;
const BLOCKS: [(usize, &str); 2] = [(64 << 10, "64KiB"), (1 << 20, "1MiB")];

/// Raw sockets: `CONNS` pairs; each round every sender streams its
/// `TOTAL / CONNS`-byte share of a `TOTAL`-byte buffer in `block` writes,
/// its receiver reads them into its share of another `TOTAL`-byte buffer
/// (the same memory footprint as the paths) and acks one byte.
struct RawPairs {
    senders: Vec<TcpStream>,
}

impl RawPairs {
    fn new(block: usize) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut senders = Vec::new();
        for _ in 0..CONNS {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            let (mut r, _) = l.accept().unwrap();
            std::thread::spawn(move || {
                let per = TOTAL / CONNS;
                let mut buf = vec![0u8; per];
                loop {
                    let mut got = 0;
                    while got < per {
                        let want = block.min(per - got);
                        if r.read_exact(&mut buf[got..got + want]).is_err() {
                            return;
                        }
                        got += want;
                    }
                    if r.write_all(&[1]).is_err() {
                        return;
                    }
                }
            });
            senders.push(s);
        }
        Self { senders }
    }

    fn round(&mut self, block: usize, data: &[u8]) {
        std::thread::scope(|sc| {
            for (k, s) in self.senders.iter_mut().enumerate() {
                sc.spawn(move || {
                    let per = TOTAL / CONNS;
                    let mine = &data[k * per..(k + 1) * per];
                    let mut sent = 0;
                    while sent < per {
                        let n = block.min(per - sent);
                        s.write_all(&mine[sent..sent + n]).unwrap();
                        sent += n;
                    }
                    let mut ack = [0u8; 1];
                    s.read_exact(&mut ack).unwrap();
                });
            }
        });
    }
}

struct TcpSetup {
    _target: Target,
    i: Initiator,
    rails: Vec<RailId>,
    reg: RegistrationId,
    range: u64,
}

/// `NET_BENCH_ZERO_COPY=0` measures the scratch-buffer path instead of
/// sendfile/splice.
fn session_cfg(source: &str) -> orbitte_engine::session::SessionConfig {
    let mut c = cfg(source, 1);
    c.zero_copy = std::env::var("NET_BENCH_ZERO_COPY").as_deref() != Ok("0");
    c
}

fn tcp_setup(block: usize) -> TcpSetup {
    let t = Target::start(session_cfg("bench-target"));
    let remote = HostMemory::alloc(TOTAL).unwrap();
    let range = t.ranges.publish(remote, RW).unwrap().0;
    let core = CoreConfig {
        slice_size: block as u32,
        tcp_slice_size: 0,
        request_timeout: Duration::from_secs(60),
        drain_timeout: Duration::from_secs(10),
    };
    let i = Initiator::new(session_cfg("bench-initiator"), core);
    let local = HostMemory::alloc(TOTAL).unwrap();
    pattern(&local, 1);
    let reg = i.driver.register(local);
    let (rails, _) = i.connect_tcp(PeerId(1), t.addr(), CONNS).unwrap();
    TcpSetup {
        _target: t,
        i,
        rails,
        reg,
        range,
    }
}

fn run_batch(
    i: &Initiator,
    op: Op,
    reg: RegistrationId,
    range: u64,
    rails: &[RailId],
    block: usize,
) {
    let reqs = (0..TOTAL / block)
        .map(|n| {
            let off = (n * block) as u64;
            // Each request on one rail (round robin), like separate blocks.
            let rail = [rails[n % rails.len()]];
            request(
                n as u64,
                op,
                reg,
                off,
                PeerId(1),
                range,
                off,
                block as u64,
                &rail,
            )
        })
        .collect();
    for id in i.driver.submit(reqs) {
        let o = i.driver.wait(id, Duration::from_secs(120));
        assert_eq!(o.status, Status::Complete, "{o:?}");
    }
}

fn tcp(c: &mut Criterion) {
    let mut g = c.benchmark_group("tcp_loopback");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(TOTAL as u64));
    let data = vec![7u8; TOTAL];
    for (block, name) in BLOCKS {
        let mut raw = RawPairs::new(block);
        g.bench_function(BenchmarkId::new("raw_socket_baseline", name), |b| {
            b.iter(|| raw.round(block, &data))
        });
        let s = tcp_setup(block);
        g.bench_function(BenchmarkId::new("tcp_path_write", name), |b| {
            b.iter(|| run_batch(&s.i, Op::Write, s.reg, s.range, &s.rails, block))
        });
        g.bench_function(BenchmarkId::new("tcp_path_read", name), |b| {
            b.iter(|| run_batch(&s.i, Op::Read, s.reg, s.range, &s.rails, block))
        });
    }
    g.finish();
}

fn local(c: &mut Criterion) {
    let mut g = c.benchmark_group("local_same_host");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(TOTAL as u64));
    let src = HostMemory::alloc(TOTAL).unwrap();
    pattern(&src, 3);
    let dst = HostMemory::alloc(TOTAL).unwrap();
    for (block, name) in BLOCKS {
        g.bench_function(BenchmarkId::new("memcpy_baseline", name), |b| {
            b.iter(|| {
                for n in 0..TOTAL / block {
                    dst.copy_from(n * block, &src, n * block, block).unwrap();
                }
            })
        });
        let t = Target::start(cfg("bench-local-target", 1));
        let remote = HostMemory::alloc(TOTAL).unwrap();
        let range = t.ranges.publish(remote, RW).unwrap().0;
        let core = CoreConfig {
            slice_size: block as u32,
            tcp_slice_size: 0,
            request_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(10),
        };
        let i = Initiator::new(cfg("bench-local-initiator", 1), core);
        let reg = i.driver.register(Arc::clone(&src));
        let (_, link) = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap();
        let rails = i.driver.add_rails(PathKind::Local, PeerId(1), 2, 256);
        i.local
            .attach(&i.cfg, &i.peers, PeerId(1), &link.handshake.peer, &rails)
            .unwrap();
        g.bench_function(BenchmarkId::new("local_path_write", name), |b| {
            b.iter(|| run_batch(&i, Op::Write, reg, range, &rails, block))
        });
    }
    g.finish();
}

criterion_group!(benches, tcp, local);
criterion_main!(benches);
