//! tcp outcomes when the network stops mid-transfer: the completed prefix
//! is every slice whose answer arrived (a READ's bytes in local memory, a
//! WRITE's acknowledgement from the target), checked byte by byte, whether
//! the request timeout or the rail's `io_timeout` ends the request, with
//! the net tests' driver and with two `TransferEngine`s.
//!
//! The cut is made by a relay between the initiator and the target that
//! forwards each direction of each connection up to a byte budget and then
//! goes silent with both connections open, as a partitioned network does.
#![forbid(unsafe_code)]

mod net_support;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use net_support::{Initiator, RW, Target, cfg, pattern, request};
use orbitte_engine::outcome::{DrainStatus, Outcome, RemoteEffect, RequestId, Status};
use orbitte_engine::transport::{Op, PathKind, PeerId, RailId, RegistrationId};
use orbitte_memory::HostMemory;
use orbitte_proto::core::CoreConfig;
use orbitte_wire::{HEADER_LEN, READ_RESPONSE_FIXED_LEN, WRITE_REQUEST_FIXED_LEN};

const BOUND: Duration = Duration::from_secs(60);
/// Request timeout of the tests that the request timeout ends: the bytes
/// before the cut move well within it, even on a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The rails' `io_timeout` in those tests: longer, so the request timeout
/// comes first (as with the defaults, 10 s each, where the request's
/// clock starts earlier).
const IO_TIMEOUT: Duration = Duration::from_secs(8);
const MIB: u64 = 1 << 20;
/// A READ answer of one 1 MiB slice on the wire.
const READ_ANSWER: u64 = (HEADER_LEN + READ_RESPONSE_FIXED_LEN) as u64 + MIB;
/// A WRITE request of one 1 MiB slice on the wire.
const WRITE_REQUEST: u64 = (HEADER_LEN + WRITE_REQUEST_FIXED_LEN) as u64 + MIB;

/// Which way bytes flow through the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Initiator to target: requests and WRITE payloads.
    Up,
    /// Target to initiator: answers and READ payloads.
    Down,
}

/// Bytes each direction of each connection (in the order accepted) may
/// still forward; `None`: no limit.
type Budgets = Vec<[Option<u64>; 2]>;

/// A TCP relay to a target that can be cut (see the module docs).
struct Relay {
    addr: SocketAddr,
    budgets: Arc<Mutex<Budgets>>,
    stop: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Relays every connection it accepts to `target`.
    fn start(target: SocketAddr) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let budgets = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (b, s, so) = (budgets.clone(), stop.clone(), sockets.clone());
        let accept = std::thread::spawn(move || {
            let mut pumps = Vec::new();
            for conn in 0.. {
                let Ok((client, _)) = l.accept() else {
                    break;
                };
                if s.load(Ordering::Acquire) {
                    break;
                }
                b.lock().unwrap().push([None, None]);
                let server = TcpStream::connect(target).unwrap();
                for sock in [&client, &server] {
                    sock.set_nodelay(true).unwrap();
                    sock.set_read_timeout(Some(Duration::from_millis(50)))
                        .unwrap();
                    so.lock().unwrap().push(sock.try_clone().unwrap());
                }
                for (dir, from, to) in [
                    (
                        Direction::Up,
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                    ),
                    (
                        Direction::Down,
                        server.try_clone().unwrap(),
                        client.try_clone().unwrap(),
                    ),
                ] {
                    let (b, s) = (b.clone(), s.clone());
                    pumps.push(std::thread::spawn(move || {
                        pump(from, to, conn, dir, &b, &s)
                    }));
                }
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Self {
            addr,
            budgets,
            stop,
            sockets,
            threads: vec![accept],
        }
    }

    /// From now on connection `conn` forwards at most `bytes` more in
    /// direction `dir`, then nothing.
    fn cut(&self, conn: usize, dir: Direction, bytes: u64) {
        self.budgets.lock().unwrap()[conn][dir as usize] = Some(bytes);
    }

    /// [`cut`](Self::cut) for every connection accepted so far.
    fn cut_all(&self, dir: Direction, bytes: u64) {
        for b in self.budgets.lock().unwrap().iter_mut() {
            b[dir as usize] = Some(bytes);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        for s in self.sockets.lock().unwrap().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Forwards `from` to `to` within the budget of (`conn`, `dir`); once it
/// is spent, reads nothing more (the sender's window fills) until `stop`.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    conn: usize,
    dir: Direction,
    budgets: &Mutex<Budgets>,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 1 << 20];
    let mut silent = false;
    while !stop.load(Ordering::Acquire) {
        if silent {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        let allowed = {
            let mut b = budgets.lock().unwrap();
            match &mut b[conn][dir as usize] {
                None => n,
                Some(left) => {
                    let k = (*left).min(n as u64);
                    *left -= k;
                    silent = k < n as u64 || *left == 0;
                    k as usize
                }
            }
        };
        if to.write_all(&buf[..allowed]).is_err() {
            return;
        }
    }
}

/// Slices of 1 MiB on tcp, `request` and `io` as the request timeout and
/// the rails' `io_timeout`.
fn initiator(request: Duration, io: Duration) -> Initiator {
    let mut c = cfg("initiator", 1);
    c.io_timeout = io;
    Initiator::new(
        c,
        CoreConfig {
            slice_size: 64 << 10,
            tcp_slice_size: MIB as u32,
            request_timeout: request,
            drain_timeout: Duration::from_secs(30),
        },
    )
}

/// Submits 16 WRITEs of 4 MiB from `reg` to `range` of peer 1, request
/// `r` at offset `r * 4 MiB` on both sides.
fn write_batch(i: &Initiator, reg: RegistrationId, range: u64, rails: &[RailId]) -> Vec<RequestId> {
    i.driver.submit(
        (0..16u64)
            .map(|r| {
                let at = r * 4 * MIB;
                request(r, Op::Write, reg, at, PeerId(1), range, at, 4 * MIB, rails)
            })
            .collect(),
    )
}

/// A 64 MiB READ over two rails whose answers stop after rail 0 brought 9
/// whole answers (slices 0, 2, .., 16) and rail 1 brought 8 (slices 1, 3,
/// .., 15), each with half of its next one: the prefix is 17 MiB, exactly
/// the bytes that landed in order.
fn read_cut(request_timeout: Duration, io_timeout: Duration) -> Outcome {
    net_support::logs();
    let t = Target::start(cfg("target", 1));
    let remote = HostMemory::alloc((64 * MIB) as usize).unwrap();
    pattern(&remote, 3);
    let range = t.ranges.publish(remote.clone(), RW).unwrap();
    let relay = Relay::start(t.addr());
    let i = initiator(request_timeout, io_timeout);
    let dst = HostMemory::alloc((64 * MIB) as usize).unwrap();
    let reg = i.driver.register(dst.clone());
    let (rails, _) = i.connect_tcp(PeerId(1), relay.addr, 2).unwrap();
    let half = (HEADER_LEN + READ_RESPONSE_FIXED_LEN) as u64 + MIB / 2;
    relay.cut(0, Direction::Down, 9 * READ_ANSWER + half);
    relay.cut(1, Direction::Down, 8 * READ_ANSWER + half);
    let id = i.driver.submit(vec![request(
        1,
        Op::Read,
        reg,
        0,
        PeerId(1),
        range.0,
        0,
        64 * MIB,
        &rails,
    )])[0];
    let o = i.driver.wait(id, BOUND);
    assert_eq!(o.slices, 64, "{o:?}");
    assert_eq!(o.completed_slices, 17, "{o:?}");
    assert_eq!(o.completed_prefix, 17 * MIB, "{o:?}");
    assert_eq!(o.uncertain.start, 17 * MIB, "{o:?}");
    assert_eq!(o.remote_effect, RemoteEffect::None);
    assert!(
        dst.to_vec(0, (17 * MIB) as usize).unwrap()
            == remote.to_vec(0, (17 * MIB) as usize).unwrap(),
        "the completed prefix holds the remote bytes"
    );
    // Slices 19 and on never arrived: their bytes are untouched.
    assert!(
        dst.to_vec((19 * MIB) as usize, (45 * MIB) as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0),
        "bytes past what arrived were written"
    );
    assert_eq!(i.driver.wait_drain(id, BOUND), DrainStatus::Drained);
    drop(relay);
    o
}

#[test]
fn a_read_cut_mid_way_that_times_out_counts_every_answer_that_arrived() {
    let o = read_cut(TIMEOUT, IO_TIMEOUT);
    assert_eq!(o.status, Status::TimedOut, "{o:?}");
}

#[test]
fn a_read_cut_mid_way_whose_rails_give_up_counts_every_answer_that_arrived() {
    let o = read_cut(Duration::from_secs(40), Duration::from_secs(1));
    assert_eq!(o.status, Status::Failed, "{o:?}");
    let f = o.failure.expect("a failed request names its failure");
    assert_eq!(f.path, PathKind::Tcp);
    assert!(f.offset >= 17 * MIB, "{f}");
}

/// A batch of 16 WRITEs of 4 MiB over two rails (slices 0 and 2 of each
/// request on rail 0, 1 and 3 on rail 1) whose payloads stop reaching the
/// target after 5 whole slices and half of the sixth on each rail, while
/// its answers still come back: requests 0 and 1 complete, request 2 has
/// a prefix of 2 MiB, the others none, and the target holds each prefix.
#[test]
fn a_write_batch_cut_mid_way_reports_each_requests_acknowledged_prefix() {
    net_support::logs();
    let t = Target::start(cfg("target", 1));
    let remote = HostMemory::alloc((64 * MIB) as usize).unwrap();
    let range = t.ranges.publish(remote.clone(), RW).unwrap();
    let relay = Relay::start(t.addr());
    let i = initiator(TIMEOUT, IO_TIMEOUT);
    let src = HostMemory::alloc((64 * MIB) as usize).unwrap();
    pattern(&src, 4);
    let reg = i.driver.register(src.clone());
    let (rails, _) = i.connect_tcp(PeerId(1), relay.addr, 2).unwrap();
    let half = (HEADER_LEN + WRITE_REQUEST_FIXED_LEN) as u64 + MIB / 2;
    relay.cut(0, Direction::Up, 5 * WRITE_REQUEST + half);
    relay.cut(1, Direction::Up, 5 * WRITE_REQUEST + half);
    let ids = write_batch(&i, reg, range.0, &rails);
    for (r, id) in ids.iter().enumerate() {
        let o = i.driver.wait(*id, BOUND);
        let want = match r {
            0 | 1 => 4 * MIB,
            2 => 2 * MIB,
            _ => 0,
        };
        assert_eq!(o.completed_prefix, want, "request {r}: {o:?}");
        assert_eq!(o.completed_slices as u64, want / MIB, "request {r}: {o:?}");
        if want == 4 * MIB {
            assert_eq!(o.status, Status::Complete, "request {r}: {o:?}");
            assert_eq!(o.remote_effect, RemoteEffect::Complete, "request {r}");
        } else {
            assert_eq!(o.status, Status::TimedOut, "request {r}: {o:?}");
            // Sent but not acknowledged: the bytes past the prefix may or
            // may not have landed.
            match &o.remote_effect {
                RemoteEffect::Possible { bytes } => {
                    assert_eq!(bytes.start, want, "request {r}: {o:?}")
                }
                other => panic!("request {r}: remote effect {other:?}"),
            }
        }
        let at = (r as u64 * 4 * MIB) as usize;
        assert!(
            remote.to_vec(at, want as usize).unwrap() == src.to_vec(at, want as usize).unwrap(),
            "request {r}: the target holds its acknowledged prefix"
        );
    }
    drop(relay);
}

/// A target that always has the next WRITE waiting (it sleeps before
/// each request, so the initiator's payloads queue up behind it) answers
/// each slice as it applies it, not when the stream pauses: request 0's
/// outcome arrives while request 15 still has slices in flight.
#[test]
fn a_busy_target_acknowledges_writes_while_the_stream_goes_on() {
    net_support::logs();
    let mut tc = cfg("target", 1);
    tc.serve_delay = Duration::from_millis(20);
    let t = Target::start(tc);
    let remote = HostMemory::alloc((64 * MIB) as usize).unwrap();
    let range = t.ranges.publish(remote.clone(), RW).unwrap();
    let mut c = cfg("initiator", 1);
    // Every slice of the batch in flight at once.
    c.max_in_flight_per_connection = 64;
    let i = Initiator::new(
        c,
        CoreConfig {
            slice_size: 64 << 10,
            tcp_slice_size: MIB as u32,
            request_timeout: BOUND,
            drain_timeout: BOUND,
        },
    );
    let src = HostMemory::alloc((64 * MIB) as usize).unwrap();
    pattern(&src, 5);
    let reg = i.driver.register(src.clone());
    let (rails, _) = i.connect_tcp(PeerId(1), t.addr(), 1).unwrap();
    let ids = write_batch(&i, reg, range.0, &rails);
    let first = i.driver.wait(ids[0], BOUND);
    assert_eq!(first.status, Status::Complete, "{first:?}");
    assert!(
        matches!(i.driver.drain_status(ids[15]), DrainStatus::Pending { .. }),
        "request 0 was acknowledged only when the whole batch was"
    );
    for id in &ids[1..] {
        let o = i.driver.wait(*id, BOUND);
        assert_eq!(o.status, Status::Complete, "{o:?}");
    }
    assert!(
        remote.to_vec(0, (64 * MIB) as usize).unwrap()
            == src.to_vec(0, (64 * MIB) as usize).unwrap()
    );
}

/// The same through the engine's own driver: two `TransferEngine`s on
/// tcp, a 64 MiB READ whose answers stop after 8 whole ones and half of
/// the ninth on each rail; the request timeout reports the 16 MiB that
/// landed in order.
#[test]
fn a_transfer_engine_read_cut_mid_way_counts_every_answer_that_arrived() {
    use orbitte_engine::{Access, ConnectOptions, TransferRequest};
    net_support::logs();
    let (target, client) = net_support::engines_without_rdma("cut-target", "cut-client", |b| {
        b.request_timeout(TIMEOUT)
            .session_settings(|c| c.io_timeout = IO_TIMEOUT)
    });
    let remote = HostMemory::alloc((64 * MIB) as usize).unwrap();
    pattern(&remote, 8);
    let range = target.register(&remote, Access::RemoteReadWrite).unwrap();
    let dst = HostMemory::alloc((64 * MIB) as usize).unwrap();
    let d = client.register(&dst, Access::LocalOnly).unwrap();
    let relay = Relay::start(target.listen_addr().expect("the target listens"));
    let peer = client
        .connect_with(
            relay.addr,
            ConnectOptions::new().path(PathKind::Tcp).rails(2),
        )
        .unwrap();
    assert_eq!((peer.path, peer.rails.len()), (PathKind::Tcp, 2));
    let half = (HEADER_LEN + READ_RESPONSE_FIXED_LEN) as u64 + MIB / 2;
    relay.cut_all(Direction::Down, 8 * READ_ANSWER + half);
    let range_id = orbitte_engine::RangeId(range.id.0);
    let ids = client
        .submit(&[TransferRequest::read(
            d.id,
            0,
            peer.info.id,
            range_id,
            0,
            64 * MIB,
        )])
        .unwrap();
    let o = client.wait(ids[0], BOUND).unwrap();
    assert_eq!(o.status, Status::TimedOut, "{o:?}");
    assert_eq!(o.completed_prefix, 16 * MIB, "{o:?}");
    assert_eq!(o.completed_slices, 16, "{o:?}");
    assert_eq!(o.uncertain.start, 16 * MIB, "{o:?}");
    assert!(
        dst.to_vec(0, (16 * MIB) as usize).unwrap()
            == remote.to_vec(0, (16 * MIB) as usize).unwrap(),
        "the completed prefix holds the remote bytes"
    );
    client
        .wait_drain(ids[0], BOUND)
        .expect("drained once the rails give up");
    drop(relay);
}
