//! Waiting for connections on a listening socket, on an I/O loop.
//!
//! A listening socket waits on epoll on one of the pool's loops
//! ([`crate::io_pool`]) as an [`Acceptor`]: woken when connections wait,
//! it takes those that wait (`accept` until it would block, at most
//! [`ACCEPTS_PER_TURN`] before the loop's other descriptors get their
//! turn), so a connection is accepted the moment it arrives and nothing
//! runs while none does. A failure to accept (out of descriptors) is logged within
//! the listener's budget and tried again after [`PAUSE`]; the connection
//! stays in the backlog meanwhile.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::io_pool::{Next, Watched};

/// How long an acceptor pauses after a failed `accept` before it tries
/// again.
pub(crate) const PAUSE: Duration = Duration::from_millis(50);

/// Connections taken in one call at most; the registration is
/// level-triggered, so the loop calls again for the rest on its next
/// round. The handshakes of the connections taken run on the same loops:
/// a burst taken whole would hold a legitimate peer's hello unread while
/// the newcomers behind it close the oldest unauthenticated connections,
/// its own among them.
pub(crate) const ACCEPTS_PER_TURN: usize = 32;

/// What an [`Acceptor`] accepts on and hands connections to.
pub(crate) trait Accepting: Send {
    /// A connection accepted.
    type Conn;
    /// The listener's name in log lines (`tcp`, `local`).
    const KIND: &'static str;
    /// The listening socket (non-blocking).
    fn fd(&self) -> RawFd;
    /// One `accept`.
    fn accept(&mut self) -> std::io::Result<Self::Conn>;
    /// Takes an accepted connection.
    fn take(&mut self, conn: Self::Conn);
    /// Whether the listener stops (no connection is taken then).
    fn stopped(&self) -> bool;
    /// `Some(left_out)` when a line of the listener's budget for local
    /// failures may be logged now.
    fn log_line(&self) -> Option<u64>;
}

/// A listening socket on its I/O loop.
pub(crate) struct Acceptor<A>(pub(crate) A);

impl<A: Accepting> Acceptor<A> {
    /// Accepts until the backlog is empty or [`ACCEPTS_PER_TURN`] were
    /// taken; after a failure, tries again after a pause.
    fn take_all(mut self: Box<Self>, now: Instant) -> Next
    where
        A: 'static,
    {
        let mut taken = 0;
        while !self.0.stopped() && taken < ACCEPTS_PER_TURN {
            match self.0.accept() {
                Ok(c) => {
                    self.0.take(c);
                    taken += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if let Some(left_out) = self.0.log_line() {
                        tracing::warn!(listener = A::KIND, error = %e, left_out, "accept failed");
                    }
                    return Next::Wait(self, Some(now + PAUSE));
                }
            }
        }
        Next::Wait(self, None)
    }
}

impl<A: Accepting + 'static> Watched for Acceptor<A> {
    fn fd(&self) -> RawFd {
        self.0.fd()
    }

    fn ready(self: Box<Self>, now: Instant) -> Next {
        self.take_all(now)
    }

    fn expired(self: Box<Self>, now: Instant) -> Next {
        self.take_all(now)
    }

    fn abandoned(self: Box<Self>, why: &str) {
        if !self.0.stopped() {
            tracing::error!(listener = A::KIND, why, "the listener stopped accepting");
        }
    }
    /// A listener weighs nothing: the connections it accepts are watched
    /// on their own, and count where they land.
    fn weight(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io_pool::IoPool;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;

    struct Counting {
        listener: TcpListener,
        taken: mpsc::Sender<TcpStream>,
    }

    impl Accepting for Counting {
        type Conn = TcpStream;
        const KIND: &'static str = "test";
        fn fd(&self) -> RawFd {
            self.listener.as_raw_fd()
        }
        fn accept(&mut self) -> std::io::Result<TcpStream> {
            self.listener.accept().map(|(s, _)| s)
        }
        fn take(&mut self, conn: TcpStream) {
            let _ = self.taken.send(conn);
        }
        fn stopped(&self) -> bool {
            false
        }
        fn log_line(&self) -> Option<u64> {
            Some(0)
        }
    }

    #[test]
    fn every_waiting_connection_is_taken_as_it_arrives() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let pool = IoPool::new(1, "test").unwrap();
        let key = pool.watch(
            Box::new(Acceptor(Counting {
                listener: l,
                taken: tx,
            })),
            None,
        );
        let bound = Duration::from_secs(20);
        for _ in 0..3 {
            let _held: Vec<_> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
            for _ in 0..4 {
                rx.recv_timeout(bound).unwrap();
            }
        }
        // A burst above what one call takes is taken whole over the
        // loop's next rounds.
        let burst = 3 * ACCEPTS_PER_TURN + 1;
        let _held: Vec<_> = (0..burst)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        for _ in 0..burst {
            rx.recv_timeout(bound).unwrap();
        }
        pool.forget(key);
        assert!(TcpStream::connect(addr).is_err(), "closed once forgotten");
    }
}
