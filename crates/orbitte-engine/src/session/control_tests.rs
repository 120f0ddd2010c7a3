//! An rdma control link on the listener's loops (`control_conn`), end to
//! end: a listener with a control acceptor that answers every frame.

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitte_wire::{Epoch, Frame, Notification, PeerTable, SessionPurpose, SourceId};

use crate::io_pool::IoThreads;
use crate::session::handshake::{Handshake, connect_for};
use crate::session::io::{FrameReader, write_frame};
use crate::session::listener::Listener;
use crate::session::serving::ControlSession;
use crate::session::serving::{ControlAcceptor, ControlServed};
use crate::session::{PublicationTable, SessionConfig};
use crate::transport::tcp::serve::CloseReason;

/// Sets nothing up and answers every frame with itself, noting the
/// thread that answered.
#[derive(Debug, Default)]
struct Echo {
    threads: Arc<Mutex<Vec<String>>>,
}

impl ControlAcceptor for Echo {
    fn serve(&self, _stream: TcpStream, _hs: &Handshake) -> ControlServed {
        ControlServed::Open(Box::new(Self {
            threads: self.threads.clone(),
        }))
    }
}

impl ControlSession for Echo {
    fn answer(&mut self, frame: Frame) -> Result<Option<Frame>, CloseReason> {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name);
        match frame {
            Frame::Goodbye(_) => Err(CloseReason::normal("echo: goodbye")),
            other => Ok(Some(other)),
        }
    }
}

fn cfg(source: &str) -> SessionConfig {
    SessionConfig::new(SourceId::new(source).unwrap(), Epoch::new(1).unwrap())
}

fn target(control: Arc<Echo>) -> Listener {
    let c = cfg("control-target");
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
