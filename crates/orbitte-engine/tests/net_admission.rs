//! Session slots on a target whose `max_sessions` are all taken: a
//! newcomer takes the slot of the tcp data session idle the longest, and
//! when none may be closed it is refused in reply to its hello, before any
//! hello-ack, with an error naming the limit and how to raise it.
#![forbid(unsafe_code)]

mod net_support;

use std::net::TcpStream;
use std::time::Duration;

use net_support::{Target, cfg, raw};
use orbitte_wire::{
    Capabilities, Epoch, ErrorCode, Frame, GoodbyeReason, Hello, Identity, Nonce, RangeId,
    ReadRequest, RequestId, SessionPurpose, SourceId,
};

/// `count` authenticated tcp data sessions, each from its own source.
fn sessions(t: &Target, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|i| raw::handshake(t.addr(), &format!("idle-{i}"), 1, None).0)
        .collect()
}

/// A request on `s` (for a range the target does not have) and its answer.
fn request(s: &mut TcpStream, id: u64) {
    let read = ReadRequest {
        request_id: RequestId(id),
        range_id: RangeId(77),
        token: orbitte_wire::AccessToken(0),
        offset: 0,
        length: 8,
    };
    raw::send(s, &Frame::ReadRequest(read));
    let answer = raw::read_frame(s).unwrap();
    assert!(matches!(answer, Frame::ReadResponse(_)), "{answer:?}");
}

#[test]
fn with_the_default_settings_a_newcomer_past_max_sessions_takes_the_slot_idle_longest() {
    net_support::logs();
    let defaults = cfg("target", 1);
    let idle_enough = defaults
        .evict_idle_after
        .expect("idle sessions make room by default");
    let t = Target::start(defaults.clone());
    let mut held = sessions(&t, defaults.max_sessions);
    std::thread::sleep(idle_enough + Duration::from_millis(200));
    // The first session is the oldest, but it just made a request: the
    // second is now the one idle the longest.
    request(&mut held[0], 1);
    let (_newcomer, publication) = raw::handshake(t.addr(), "newcomer", 1, None);
    assert!(
        matches!(publication, Frame::SegmentPublication(_)),
        "the newcomer was not served: {publication:?}"
    );
    let frames = raw::read_until_closed(&mut held[1]);
    assert!(
        frames.iter().any(
            |f| matches!(f, Frame::Goodbye(g) if g.reason == GoodbyeReason::IDLE
                && g.message.to_string().contains("max_sessions"))
        ),
        "{frames:?}"
    );
    net_support::eventually("the closed session gives its thread back", || {
        t.listener.stats().live == defaults.max_sessions as u64
    });
    // The session that made the request is still served.
    request(&mut held[0], 2);
}

#[test]
fn a_newcomer_past_max_sessions_is_refused_before_its_hello_ack_when_none_may_be_closed() {
    net_support::logs();
    let mut c = cfg("target", 1);
    c.max_sessions = 4;
    // Idle, but not for this long: none may be closed for the newcomer.
    c.evict_idle_after = Some(Duration::from_secs(3600));
    let t = Target::start(c);
    let _held = sessions(&t, 4);
    let mut s = raw::connect(t.addr());
    assert!(matches!(raw::read_frame(&mut s), Ok(Frame::Challenge(_))));
    let hello = Hello {
        identity: Identity::new(
            SourceId::new("newcomer").unwrap(),
            Epoch::new(1).unwrap(),
            Capabilities::TCP,
        ),
        nonce: Nonce([7; 32]),
        purpose: SessionPurpose::DATA,
        proof: None,
    };
    raw::send(&mut s, &Frame::Hello(hello));
    let frames = raw::read_until_closed(&mut s);
    let Some(Frame::Error(e)) = frames.first() else {
        panic!("the reply to the hello is not an error: {frames:?}");
    };
    assert_eq!(e.code, ErrorCode::RESOURCE_EXHAUSTED, "{e:?}");
    let text = e.message.to_string();
    for names in ["max_sessions 4", "engine.max_sessions"] {
        assert!(text.contains(names), "{text}");
    }
    assert!(
        !frames.iter().any(|f| matches!(f, Frame::HelloAck(_))),
        "{frames:?}"
    );
    // Nothing of the newcomer was admitted.
    let newcomer = SourceId::new("newcomer").unwrap();
    assert_eq!(t.peers.lock().unwrap().epoch_of(&newcomer), None);
    assert_eq!(t.listener.stats().admitted, 4);
}
