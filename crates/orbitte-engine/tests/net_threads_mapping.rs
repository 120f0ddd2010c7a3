//! Same-host mapping sessions opening at once hold no thread: their
//! handshake, their handout and the notifications after it run on the
//! target's I/O loops. This binary holds this one test, so
//! `/proc/self/task` counts the target's threads and the test's own
//! thread only (the raw initiators run on the test's thread).
#![forbid(unsafe_code)]

mod net_support;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::Duration;

use net_support::{RW, Target, cfg, raw, threads};
use orbitte_memory::HostMemory;
use orbitte_wire::{Frame, Goodbye, GoodbyeReason, Message, Notification, NotificationVerdict};

const SESSIONS: usize = 200;

#[test]
fn mapping_sessions_opening_at_once_hold_no_thread() {
    net_support::logs();
    if net_support::skip_unless_ready(
        "this test",
        net_support::descriptors_short_of(3 * SESSIONS + 256),
    ) {
        return;
    }
    let mut c = cfg("mapping-target", 1);
    c.max_sessions = SESSIONS + 8;
    c.preauth_timeout = Duration::from_secs(60);
    c.handshake_timeout = Duration::from_secs(60);
    let t = Target::start(c);
    assert!(t.listener.serves_local());
    let mem = HostMemory::alloc(1 << 20).unwrap();
    t.ranges.publish(mem, RW).unwrap();
    let name = orbitte_engine::transport::local::socket_name(&t.cfg.source_id, t.cfg.epoch);
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let idle = threads();
    // All of them open, and each is in its handshake.
    let mut open: Vec<UnixStream> = (0..SESSIONS)
        .map(|i| {
            let mut s = UnixStream::connect_addr(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let first = raw::read_frame(&mut s).unwrap();
            assert!(matches!(first, Frame::Challenge(_)), "{i}: {first:?}");
            s
        })
        .collect();
    let handshaking = threads();
    assert_eq!(handshaking, idle, "threads made for handshaking sessions");
    // Every hello, then every handout: a publication (its fd dropped by
    // the plain read) and the goodbye.
    for (i, s) in open.iter_mut().enumerate() {
        raw::send(s, &raw::hello(&format!("mapping-peer-{i}")));
    }
    for (i, s) in open.iter_mut().enumerate() {
        let frames: Vec<Frame> = (0..3).map(|_| raw::read_frame(s).unwrap()).collect();
        assert!(matches!(frames[0], Frame::HelloAck(_)), "{i}: {frames:?}");
        assert!(
            matches!(frames[1], Frame::SegmentPublication(_)),
            "{i}: {frames:?}"
        );
        assert!(matches!(frames[2], Frame::Goodbye(_)), "{i}: {frames:?}");
    }
    let handed = threads();
    // Notifications on every session are taken on the loops too.
    for (i, s) in open.iter_mut().enumerate() {
        raw::send(
            s,
            &Frame::Notification(Notification {
                notification_id: i as u64,
                payload: vec![1; 64],
            }),
        );
    }
    // Each is answered on its session (this bare listener keeps no
    // notifications: refused, not kept).
    for (i, s) in open.iter_mut().enumerate() {
        match raw::read_frame(s).unwrap() {
            Frame::NotificationAnswer(a) => {
                assert_eq!(a.notification_id, i as u64);
                assert_eq!(a.verdict, NotificationVerdict::NOT_KEPT, "{i}: {a:?}");
            }
            other => panic!("{i}: {other:?} instead of the answer"),
        }
    }
    let notified = threads();
    println!(
        "{SESSIONS} mapping sessions: {idle} threads idle, {handshaking} in their handshake, \
         {handed} handed out, {notified} after a notification each"
    );
    assert_eq!((handed, notified), (idle, idle));
    // A goodbye ends the session: the target closes it.
    let mut last = open.pop().unwrap();
    raw::send(
        &mut last,
        &Frame::Goodbye(Goodbye {
            reason: GoodbyeReason::NORMAL,
            message: Message::truncating("done"),
        }),
    );
    let mut rest = Vec::new();
    assert_eq!(std::io::Read::read_to_end(&mut last, &mut rest).unwrap(), 0);
    drop(open);
    assert_eq!(threads(), idle);
}
