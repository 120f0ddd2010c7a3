//! A target under attack by peers that never authenticate, announce huge
//! frames, or stop reading answers: its budgets hold, its memory follows
//! the bytes it actually received, and authenticated peers keep being
//! served.
#![forbid(unsafe_code)]

mod net_support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use net_support::{RW, Target, cfg, pattern, raw};
use orbitte_memory::HostMemory;
use orbitte_wire::{
    ErrorCode, Frame, FrameHeader, FrameType, GoodbyeReason, MAX_CONTROL_BODY_LEN,
    PROTOCOL_VERSION, RangeId, ReadRequest, RequestId,
};

fn error_code(frames: &[Frame]) -> Option<ErrorCode> {
    frames.iter().find_map(|f| match f {
        Frame::Error(e) => Some(e.code),
        _ => None,
    })
}

/// A TCP connection to `to` from the loopback address `from` (any port):
/// many attacker addresses on one machine.
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    let local = SocketAddr::from((from, 0));
    rustix::net::bind(&fd, &local).unwrap();
    rustix::net::connect(&fd, &to).unwrap();
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn published(t: &Target, seed: u8) -> (Arc<HostMemory>, RangeId) {
    let mem = HostMemory::alloc(1 << 20).unwrap();
    pattern(&mem, seed);
    let id = t.ranges.publish(mem.clone(), RW).unwrap();
    (mem, id)
}

#[test]
fn silent_unauthenticated_connections_never_lock_out_authenticated_peers() {
    net_support::logs();
    let mut c = cfg("target", 1);
    c.max_sessions = 4;
    c.max_unauthenticated = 8;
    c.max_unauthenticated_per_address = 4;
    // The attackers stay for the whole test unless the budget closes them.
    c.handshake_timeout = Duration::from_secs(60);
    c.preauth_timeout = Duration::from_secs(60);
    let t = Target::start(c);
    let (mem, range) = published(&t, 3);
    // One address opens far more than its share: the excess is refused at
    // once with resource-exhausted, before any challenge.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        let mut s = connect_from([127, 0, 0, 2], t.addr());
        match raw::read_frame(&mut s).unwrap() {
            Frame::Challenge(_) => held.push(s),
            Frame::Error(e) => {
                assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e:?}");
                refused += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(held.len(), 4, "per-address budget");
    assert_eq!(refused, 8);
    // Many addresses together take every unauthenticated slot (and more);
    // the oldest are closed for the newcomers.
    for a in 3..13u8 {
        for _ in 0..4 {
            let mut s = connect_from([127, 0, 0, a], t.addr());
            if let Ok(Frame::Challenge(_)) = raw::read_frame(&mut s) {
                held.push(s);
            }
        }
    }
    net_support::eventually("unauthenticated connections within their budget", || {
        t.listener.stats().live <= 8
    });
    // Authenticated peers still get in, up to max_sessions of them, and
    // are served while the attack goes on.
    net_support::legitimate_read(&t, "good-0", 2, range.0, &mem);
    net_support::legitimate_read(&t, "good-1", 2, range.0, &mem);
    drop(held);
}

#[test]
fn a_connection_that_does_not_authenticate_is_closed_within_the_preauth_bound() {
    net_support::logs();
    let mut c = cfg("target", 1);
    c.handshake_timeout = Duration::from_secs(120);
    c.preauth_timeout = Duration::from_millis(300);
    let t = Target::start(c);
    let started = Instant::now();
    let mut s = raw::connect(t.addr());
    let frames = raw::read_until_closed(&mut s);
    assert!(
        matches!(frames.first(), Some(Frame::Challenge(_))),
        "{frames:?}"
    );
    assert_eq!(error_code(&frames), Some(ErrorCode::TIMEOUT), "{frames:?}");
    // Far below the 120 s handshake bound, whatever the machine's load.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn an_engine_closes_an_authenticated_session_idle_past_its_idle_timeout() {
    net_support::logs();
    let engine = orbitte_engine::EngineBuilder::new("idle-target")
        .listen("127.0.0.1:0".parse().unwrap())
        .host_memory_without_rdma()
        .idle_timeout(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let addr = engine.listen_addr().expect("the engine listens");
    let (mut s, _) = raw::handshake(addr, "idler", 1, None);
    let frames = raw::read_until_closed(&mut s);
    assert!(
        frames
            .iter()
            .any(|f| matches!(f, Frame::Goodbye(g) if g.reason == GoodbyeReason::IDLE)),
        "{frames:?}"
    );
}

fn header(frame_type: FrameType, body_len: u32) -> [u8; orbitte_wire::HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        frame_type,
        body_len,
    }
    .encode()
}

#[test]
fn before_authentication_a_header_announcing_a_large_body_is_refused_at_once() {
    net_support::logs();
    let mut c = cfg("target", 1);
    // Long bounds: the refusal must come from the header, not a timeout.
    c.handshake_timeout = Duration::from_secs(60);
    c.preauth_timeout = Duration::from_secs(60);
    c.frame_timeout = Duration::from_secs(60);
    let t = Target::start(c);
    for frame_type in [FrameType::HELLO, FrameType::SEGMENT_PUBLICATION] {
        let mut s = raw::connect(t.addr());
        assert!(matches!(raw::read_frame(&mut s), Ok(Frame::Challenge(_))));
        s.write_all(&header(frame_type, MAX_CONTROL_BODY_LEN))
            .unwrap();
        let frames = raw::read_until_closed(&mut s);
        assert_eq!(
            error_code(&frames),
            Some(ErrorCode::FRAME_TOO_LARGE),
            "{frame_type}: {frames:?}"
        );
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

#[test]
fn announced_lengths_cost_no_memory_before_their_bytes_arrive() {
    net_support::logs();
    const SESSIONS: usize = 48;
    let mut c = cfg("target", 1);
    c.frame_timeout = Duration::from_secs(60);
    c.max_connections_per_source = SESSIONS + 1;
    let t = Target::start(c);
    // Authenticated sessions each announce a 4 MiB publication (the
    // largest legal control frame) and send 16 bytes of it.
    let mut held = Vec::new();
    for _ in 0..SESSIONS {
        let (s, _) = raw::handshake(t.addr(), "announcer", 1, None);
        held.push(s);
    }
    let before = rss_bytes();
    for s in &mut held {
        s.write_all(&header(
            FrameType::SEGMENT_PUBLICATION,
            MAX_CONTROL_BODY_LEN,
        ))
        .unwrap();
        s.write_all(&[0u8; 16]).unwrap();
    }
    // Give every session thread time to take its header (the listener
    // has no counter for it; a generous pause, not a timing assertion).
    std::thread::sleep(Duration::from_secs(2));
    let grown = rss_bytes().saturating_sub(before);
    // Buffering the announced lengths would take 48 × 4 MiB = 192 MiB.
    assert!(
        grown < 48 << 20,
        "resident memory grew by {} MiB for {SESSIONS} announced frames",
        grown >> 20
    );
    drop(held);
}

#[test]
fn a_peer_that_reads_an_answer_slowly_is_closed_within_the_io_bound() {
    net_support::logs();
    let mut c = cfg("target", 1);
    c.io_timeout = Duration::from_secs(1);
    let t = Target::start(c);
    let mem = HostMemory::alloc(16 << 20).unwrap();
    let range = t.ranges.publish(mem, RW).unwrap();
    let (mut s, publication) = raw::handshake(t.addr(), "slow-reader", 1, None);
    let Frame::SegmentPublication(p) = publication else {
        panic!("{publication:?}")
    };
    raw::send(
        &mut s,
        &Frame::ReadRequest(ReadRequest {
            request_id: RequestId(1),
            range_id: range,
            token: p.ranges[0].token,
            offset: 0,
            length: 16 << 20,
        }),
    );
    // Read 32 KiB every 100 ms: some progress well within every io_timeout,
    // but the 16 MiB answer would take almost a minute.
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 32 << 10];
        while !st.load(Ordering::Acquire) {
            if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = loop {
        if let Some(c) = t
            .listener
            .closed_sessions()
            .into_iter()
            .find(|c| c.reason.contains("stalled"))
        {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "the slow reader was not closed: {:?}",
            t.listener.closed_sessions()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(closed.abnormal);
    stop.store(true, Ordering::Release);
    reader.join().unwrap();
}
