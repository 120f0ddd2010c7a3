//! An rdma control link on the listener's loops (`control_conn`), end to
//! end: a listener with a control acceptor that answers every frame, and
//! one whose links must be set up first.

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orbitte_wire::{
    Epoch, ErrorCode, ErrorFrame, Frame, FrameType, Message, Notification, PeerTable, RequestId,
    SessionPurpose, SourceId,
};

use crate::io_pool::IoThreads;
use crate::session::handshake::{Handshake, connect_for};
use crate::session::io::{FrameReader, write_frame};
use crate::session::listener::Listener;
use crate::session::serving::{ControlAcceptor, ControlEnd, ControlSession};
use crate::session::{PublicationTable, SessionConfig};
use crate::transport::tcp::serve::CloseReason;

/// Sets nothing up and answers every frame with itself, noting the
/// thread that answered.
#[derive(Debug, Default)]
struct Echo {
    threads: Arc<Mutex<Vec<String>>>,
}

impl ControlAcceptor for Echo {
    fn open(&self, _hs: &Handshake) -> Result<Box<dyn ControlSession>, CloseReason> {
        Ok(Box::new(Self {
            threads: self.threads.clone(),
        }))
    }
}

impl ControlSession for Echo {
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, ControlEnd> {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name);
        match frame {
            Frame::Goodbye(_) => Err(CloseReason::normal("echo: goodbye").into()),
            other => Ok(Some(other)),
        }
    }
}

fn cfg(source: &str) -> SessionConfig {
    SessionConfig::new(SourceId::new(source).unwrap(), Epoch::new(1).unwrap())
}

fn target(control: Arc<dyn ControlAcceptor>) -> Listener {
    target_with(control, cfg("control-target"))
}

fn target_with(control: Arc<dyn ControlAcceptor>, c: SessionConfig) -> Listener {
    let peers = Arc::new(Mutex::new(PeerTable::new(c.source_id.clone())));
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Listener::bind_serving(
        c,
        peers,
        PublicationTable::new(),
        addr,
        Some(control),
        &IoThreads::new(2),
    )
    .unwrap()
}

fn notification(i: u64) -> Frame {
    Frame::Notification(Notification {
        notification_id: i,
        payload: vec![7; 1024],
    })
}

/// A busy link is answered on the loops: a burst of frames the peer
/// sends before it reads any answer (so that answers wait for room)
/// comes back whole and in order, and every answer was made on an
/// I/O thread.
#[test]
fn a_busy_control_link_is_answered_on_the_loops_in_order() {
    let echo = Arc::new(Echo::default());
    let l = target(echo.clone());
    let c = cfg("control-peer");
    let peers = Arc::new(Mutex::new(PeerTable::new(c.source_id.clone())));
    let mut s = TcpStream::connect(l.local_addr()).unwrap();
    connect_for(&mut s, &c, &peers, None, SessionPurpose::RDMA_CONTROL).unwrap();
    const BURST: u64 = 2000;
    let mut writer = s.try_clone().unwrap();
    let sent = std::thread::spawn(move || {
        let mut scratch = Vec::new();
        for i in 0..BURST {
            write_frame(&mut writer, &notification(i), &mut scratch).unwrap();
        }
    });
    // Nothing read until the whole burst is out (or its tail is held
    // by the target, which stops reading while answers wait).
    std::thread::sleep(Duration::from_millis(200));
    let mut reader = FrameReader::new();
    let bound = Duration::from_secs(20);
    for i in 0..BURST {
        let got = reader.read(&mut s, Some(bound), bound).unwrap();
        assert_eq!(got, notification(i));
    }
    sent.join().unwrap();
    let threads = echo.threads.lock().unwrap().clone();
    assert_eq!(threads.len() as u64, BURST);
    assert!(
        threads.iter().all(|t| t.starts_with("orbitte-io-")),
        "answered off the loops: {:?}",
        threads.iter().find(|t| !t.starts_with("orbitte-io-"))
    );
}

/// Its links are set up by a notification with id 0 and echo every frame
/// after; a notification with id 1 ends the link with an error frame
/// for the peer.
#[derive(Debug, Default)]
struct Gate {
    set_up: bool,
}

impl ControlAcceptor for Gate {
    fn open(&self, _hs: &Handshake) -> Result<Box<dyn ControlSession>, CloseReason> {
        Ok(Box::new(Self::default()))
    }
}

impl ControlSession for Gate {
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, ControlEnd> {
        match frame {
            Frame::Notification(n) if n.notification_id == 1 => Err(ControlEnd {
                last: Some(Box::new(Frame::Error(ErrorFrame {
                    code: ErrorCode::NO_USABLE_RAIL,
                    frame_type: FrameType::HELLO,
                    request_id: RequestId(0),
                    message: Message::truncating("gate: refused"),
                }))),
                reason: CloseReason::abnormal("gate: refused"),
            }),
            Frame::Notification(n) if n.notification_id == 0 => {
                self.set_up = true;
                Ok(Some(Frame::Notification(n)))
            }
            other => Ok(Some(other)),
        }
    }

    fn is_set_up(&self) -> bool {
        self.set_up
    }
}

const SETUP_BOUND: Duration = Duration::from_millis(400);

fn gated() -> Listener {
    let mut c = cfg("gate-target");
    c.handshake_timeout = SETUP_BOUND;
    target_with(Arc::new(Gate::default()), c)
}

fn gate_peer(l: &Listener) -> TcpStream {
    let c = cfg("gate-peer");
    let peers = Arc::new(Mutex::new(PeerTable::new(c.source_id.clone())));
    let mut s = TcpStream::connect(l.local_addr()).unwrap();
    connect_for(&mut s, &c, &peers, None, SessionPurpose::RDMA_CONTROL).unwrap();
    s
}

fn read_to_close(s: &mut TcpStream) -> Vec<Frame> {
    let mut reader = FrameReader::new();
    let bound = Duration::from_secs(20);
    let mut frames = Vec::new();
    loop {
        match reader.read(s, Some(bound), bound) {
            Ok(f) => frames.push(f),
            Err(crate::session::SessionError::Closed { .. }) => return frames,
            Err(e) => panic!("the target did not close the link: {e}; frames {frames:?}"),
        }
    }
}

/// A link whose rails are not set up within the handshake timeout is
/// closed at its end, and the close says why.
#[test]
fn a_control_link_not_set_up_in_time_is_closed() {
    let l = gated();
    let opened = Instant::now();
    let mut s = gate_peer(&l);
    let frames = read_to_close(&mut s);
    assert!(frames.is_empty(), "{frames:?}");
    assert!(opened.elapsed() >= SETUP_BOUND, "{:?}", opened.elapsed());
    let closes = l.closed_sessions();
    assert!(
        closes.iter().any(|c| c.abnormal
            && c.reason
                .contains("rails were not set up within the handshake timeout")),
        "{closes:?}"
    );
}

/// A link set up in time stays open past the handshake timeout and is
/// answered as before.
#[test]
fn a_control_link_set_up_in_time_stays_open() {
    let l = gated();
    let mut s = gate_peer(&l);
    let mut scratch = Vec::new();
    let bound = Duration::from_secs(20);
    let mut reader = FrameReader::new();
    write_frame(&mut s, &notification(0), &mut scratch).unwrap();
    assert_eq!(
        reader.read(&mut s, Some(bound), bound).unwrap(),
        notification(0)
    );
    std::thread::sleep(SETUP_BOUND * 2);
    write_frame(&mut s, &notification(7), &mut scratch).unwrap();
    assert_eq!(
        reader.read(&mut s, Some(bound), bound).unwrap(),
        notification(7)
    );
}

/// A link that ends with a last frame sends it, then closes: the peer
/// reads the frame before the close, and the close says why.
#[test]
fn a_last_frame_reaches_the_peer_before_the_close() {
    let l = gated();
    let mut s = gate_peer(&l);
    let mut scratch = Vec::new();
    write_frame(&mut s, &notification(1), &mut scratch).unwrap();
    let frames = read_to_close(&mut s);
    assert!(
        matches!(&frames[..], [Frame::Error(e)] if e.code == ErrorCode::NO_USABLE_RAIL),
        "{frames:?}"
    );
    // Recorded once the target closed its side too (after it lingered
    // for the peer's close).
    drop(s);
    let recorded = || {
        l.closed_sessions()
            .iter()
            .any(|c| c.abnormal && c.reason == "gate: refused")
    };
    let t0 = Instant::now();
    while !recorded() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(recorded(), "{:?}", l.closed_sessions());
}
