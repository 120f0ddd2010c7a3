//! The challenge / hello / hello-ack exchange driven over real encoded bytes.
#![forbid(unsafe_code)]

mod common;

use common::*;
use orbitte_wire::auth::{AuthError, ClusterSecret};
use orbitte_wire::handshake::{HandshakeError, Initiator, Responder};
use orbitte_wire::*;

/// Sends a frame "over the wire": encode, then decode.
fn wire(f: Frame) -> Frame {
    decode_exact(&f.to_bytes().unwrap()).unwrap().0
}

fn secret(b: u8) -> Option<ClusterSecret> {
    Some(ClusterSecret::new(vec![b; 32]).unwrap())
}

struct Outcome {
    initiator: Result<handshake::Established, HandshakeError>,
    responder: Result<handshake::Established, HandshakeError>,
    init_table: PeerTable,
    resp_table: PeerTable,
}

fn run(init_secret: Option<ClusterSecret>, resp_secret: Option<ClusterSecret>) -> Outcome {
    let mut init_table = PeerTable::new(source("prefill"));
    let mut resp_table = PeerTable::new(source("decode"));
    let mut init = Initiator::new(identity("prefill", 100), init_secret, Nonce([1; 32]));
    let mut resp = Responder::new(identity("decode", 200), resp_secret, Nonce([2; 32]));
    let hello = init.handle_challenge(wire(resp.challenge())).unwrap();
    let responder = resp.handle_hello(wire(hello), &mut resp_table, SessionId(1), None);
    let (ack, responder) = match responder {
        Ok((ack, est)) => (ack, Ok(est)),
        Err(e) => (Frame::Error(e.error_frame().unwrap()), Err(e)),
    };
    let initiator = init.handle_hello_ack(wire(ack), &mut init_table, SessionId(9), None);
    Outcome {
        initiator,
        responder,
        init_table,
        resp_table,
    }
}

#[test]
fn without_secret_both_sides_admit_each_other() {
    let o = run(None, None);
    let i = o.initiator.unwrap();
    let r = o.responder.unwrap();
    assert_eq!(i.peer.source_id, source("decode"));
    assert_eq!(r.peer.source_id, source("prefill"));
    assert_eq!(i.admission, Admission::New);
    assert_eq!(o.init_table.epoch_of(&source("decode")), Some(epoch(200)));
    assert_eq!(o.resp_table.epoch_of(&source("prefill")), Some(epoch(100)));
}

#[test]
fn with_the_same_secret_proofs_verify() {
    let o = run(secret(7), secret(7));
    assert!(o.initiator.is_ok());
    assert!(o.responder.is_ok());
}

#[test]
fn a_wrong_secret_is_rejected_and_the_peer_learns_why() {
    let o = run(secret(7), secret(8));
    assert_eq!(
        o.responder.unwrap_err(),
        HandshakeError::Auth(AuthError::WrongProof)
    );
    let HandshakeError::Rejected { code, .. } = o.initiator.unwrap_err() else {
        panic!("expected a rejection")
    };
    assert_eq!(code, ErrorCode::AUTH_FAILED);
    assert!(o.resp_table.source(&source("prefill")).is_none());
}

#[test]
fn one_sided_configuration_fails_loudly() {
    let o = run(None, secret(7));
    assert_eq!(
        o.responder.unwrap_err(),
        HandshakeError::Auth(AuthError::ProofRequired)
    );
    let o = run(secret(7), None);
    assert_eq!(
        o.responder.unwrap_err(),
        HandshakeError::Auth(AuthError::UnexpectedProof)
    );
}

#[test]
fn a_replayed_hello_fails_against_a_new_challenge() {
    let s = secret(7);
    let mut init = Initiator::new(identity("prefill", 100), s.clone(), Nonce([1; 32]));
    let first = Responder::new(identity("decode", 200), s.clone(), Nonce([2; 32]));
    let hello = init.handle_challenge(first.challenge()).unwrap();
    // An attacker replays the captured hello to a new session.
    let mut second = Responder::new(identity("decode", 200), s, Nonce([3; 32]));
    let mut t = PeerTable::new(source("decode"));
    let err = second
        .handle_hello(hello, &mut t, SessionId(1), None)
        .unwrap_err();
    assert_eq!(err, HandshakeError::Auth(AuthError::WrongProof));
}

#[test]
fn a_tampered_hello_fails() {
    let s = secret(7);
    let mut init = Initiator::new(identity("prefill", 100), s.clone(), Nonce([1; 32]));
    let mut resp = Responder::new(identity("decode", 200), s, Nonce([2; 32]));
    let Frame::Hello(mut hello) = init.handle_challenge(resp.challenge()).unwrap() else {
        panic!("not a hello")
    };
    hello.identity.epoch = epoch(101);
    let mut t = PeerTable::new(source("decode"));
    let err = resp
        .handle_hello(Frame::Hello(hello), &mut t, SessionId(1), None)
        .unwrap_err();
    assert_eq!(err, HandshakeError::Auth(AuthError::WrongProof));
}

#[test]
fn a_stale_epoch_is_rejected_by_the_responder() {
    let mut t = PeerTable::new(source("decode"));
    t.admit(SessionId(1), None, &identity("prefill", 500))
        .unwrap();
    let mut init = Initiator::new(identity("prefill", 100), None, Nonce([1; 32]));
    let mut resp = Responder::new(identity("decode", 200), None, Nonce([2; 32]));
    let hello = init.handle_challenge(resp.challenge()).unwrap();
    let err = resp
        .handle_hello(hello, &mut t, SessionId(2), None)
        .unwrap_err();
    let frame = err.error_frame().unwrap();
    assert_eq!(frame.code, ErrorCode::STALE_EPOCH);
    assert!(frame.message.as_str().contains("epoch 100"));
}

#[test]
fn frames_out_of_order_are_unexpected() {
    let mut init = Initiator::new(identity("prefill", 100), None, Nonce([1; 32]));
    let err = init
        .handle_challenge(Frame::Goodbye(Goodbye {
            reason: GoodbyeReason::NORMAL,
            message: Message::default(),
        }))
        .unwrap_err();
    assert_eq!(
        err,
        HandshakeError::UnexpectedFrame {
            expected: FrameType::CHALLENGE,
            received: FrameType::GOODBYE,
        }
    );
    assert_eq!(err.error_frame().unwrap().code, ErrorCode::UNEXPECTED_FRAME);
    // Used again after failing.
    assert_eq!(
        init.handle_challenge(Frame::Challenge(Challenge {
            nonce: Nonce([0; 32])
        })),
        Err(HandshakeError::Finished)
    );
}

#[test]
fn short_secrets_are_refused() {
    assert_eq!(
        ClusterSecret::new(vec![1; 8]).unwrap_err(),
        AuthError::SecretTooShort { len: 8, min: 16 }
    );
    assert!(!format!("{:?}", secret(0x5a).unwrap()).contains("5a"));
}

/// A test vector for second implementations (docs/protocol.md,
/// "Authentication"), cross-checked against an independent HMAC-SHA256.
#[test]
fn proof_test_vector() {
    let secret = ClusterSecret::new(vec![0x0b; 32]).unwrap();
    let challenge = Challenge {
        nonce: Nonce([0x02; 32]),
    };
    let hello = Hello {
        identity: Identity::new(source("ab"), epoch(2), Capabilities::TCP),
        nonce: Nonce([0x07; 32]),
        purpose: SessionPurpose::DATA,
        proof: None,
    };
    let ack = HelloAck {
        identity: Identity::new(source("cd"), epoch(3), Capabilities::TCP),
        proof: None,
    };
    let hex = |t: AuthTag| t.0.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let h = hex(auth::hello_proof(&secret, &challenge, &hello));
    let a = hex(auth::hello_ack_proof(&secret, &challenge, &hello, &ack));
    assert_eq!(h, HELLO_PROOF);
    assert_eq!(a, ACK_PROOF);
}

const HELLO_PROOF: &str = "088021af27230cf06868cf2a1766b8f7cf125904e1320e03a572ff55ba84233d";
const ACK_PROOF: &str = "13abba6f2e914bdaeeadab890b8712b2274a6e8135fe96a04d9bcdf272d853a3";

#[test]
fn listener_tokens_read_back_from_hex_and_refuse_anything_else() {
    use orbitte_wire::auth::ListenerToken;
    let t = ListenerToken([0xa5; 32]);
    let hex = t.to_hex();
    assert_eq!(hex.len(), 64);
    assert_eq!(ListenerToken::from_hex(&hex).unwrap(), t);
    for bad in ["", &hex[..62], &format!("{hex}00"), &hex.replace('a', "g")] {
        let e = ListenerToken::from_hex(bad).unwrap_err();
        assert!(e.to_string().contains("64 hexadecimal digits"), "{e}");
    }
}

#[test]
fn an_access_key_needs_the_token_and_the_cluster_secret_it_was_made_with() {
    use orbitte_wire::auth::ListenerToken;
    let ch = Challenge {
        nonce: Nonce([0x02; 32]),
    };
    let hello = Hello {
        identity: Identity::new(source("ab"), epoch(2), Capabilities::TCP),
        nonce: Nonce([0x07; 32]),
        purpose: SessionPurpose::DATA,
        proof: None,
    };
    let t = ListenerToken([1; 32]);
    let s = ClusterSecret::new(b"sixteen-or-more-bytes".to_vec()).unwrap();
    let key = ClusterSecret::access_key(Some(&s), &t);
    let proof = |k: &ClusterSecret| {
        let mut h = hello.clone();
        h.proof = Some(auth::hello_proof(k, &ch, &h));
        h
    };
    let good = proof(&ClusterSecret::access_key(Some(&s), &t));
    assert!(auth::verify_hello(Some(&key), &ch, &good).is_ok());
    for other in [
        ClusterSecret::access_key(None, &t),
        ClusterSecret::access_key(Some(&s), &ListenerToken([2; 32])),
        s.clone(),
    ] {
        let h = proof(&other);
        assert_eq!(
            auth::verify_hello(Some(&key), &ch, &h),
            Err(AuthError::WrongProof)
        );
    }
}
