//! Waiting for connections on a listening socket.
//!
//! An accept thread parks in `poll(2)` on its non-blocking listening
//! socket and on one or more [`StopSignal`]s, with no timeout: a
//! connection that arrives is accepted at once (no timer runs between
//! its arrival and the `accept`), and raising a stop signal wakes the
//! thread at once. While nothing arrives the thread does not run.

use std::os::fd::{AsFd, OwnedFd};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};

/// How long an accept thread pauses after a failed `poll` or `accept`
/// before it tries again.
const PAUSE: Duration = Duration::from_millis(50);

/// A stop request an accept thread waits on: an eventfd that becomes
/// readable, for good, once raised (it is never read, so every thread
/// polling it wakes, now and on every later poll).
#[derive(Debug)]
pub(crate) struct StopSignal {
    fd: OwnedFd,
}

impl StopSignal {
    /// A signal not raised yet.
    pub(crate) fn new() -> std::io::Result<Self> {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self { fd })
    }

    /// Raises it: wakes every thread waiting on it.
    pub(crate) fn raise(&self) {
        // The counter saturates only after 2^64 - 2 raises; a write that
        // would block leaves the signal readable, which is all it is for.
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

/// Why [`wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The listening socket has a connection waiting (or an error to
    /// report, which the next `accept` returns).
    Connection,
    /// One of the stop signals was raised.
    Stop,
}

/// Parks until `listener` has a connection waiting or one of `stops` is
/// raised; a stop wins over a waiting connection.
pub(crate) fn wait(listener: &impl AsFd, stops: &[&StopSignal]) -> std::io::Result<Woken> {
    let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(1 + stops.len());
    fds.push(PollFd::new(listener, PollFlags::IN));
    for s in stops {
        fds.push(PollFd::new(&s.fd, PollFlags::IN));
    }
    loop {
        match rustix::event::poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[1..].iter().any(|f| !f.revents().is_empty()) {
            return Ok(Woken::Stop);
        }
        if !fds[0].revents().is_empty() {
            return Ok(Woken::Connection);
        }
    }
}

/// An accept thread's loop: parks in [`wait`] until a connection waits,
/// then takes every connection that waits (`accept` until it would block,
/// handing each to `take`), until one of `stops` is raised or `stop`
/// (the listener stops). `kind` names the listener in its log lines
/// (`tcp`, `local`). A failure to wait or to accept (out of descriptors)
/// is logged when `log_line` gives a line of the listener's budget
/// (`Some(left_out)`) and retried after a pause; the connection stays in
/// the backlog meanwhile.
pub(crate) fn serve<T>(
    kind: &'static str,
    listener: &impl AsFd,
    stops: &[&StopSignal],
    stop: &AtomicBool,
    log_line: impl Fn() -> Option<u64>,
    mut accept: impl FnMut() -> std::io::Result<T>,
    mut take: impl FnMut(T),
) {
    loop {
        match wait(listener, stops) {
            Ok(Woken::Stop) => return,
            Ok(Woken::Connection) => {}
            Err(e) => {
                if let Some(left_out) = log_line() {
                    tracing::warn!(listener = kind, error = %e, left_out, "cannot wait for connections");
                }
                std::thread::sleep(PAUSE);
                continue;
            }
        }
        while !stop.load(Ordering::Acquire) {
            match accept() {
                Ok(c) => take(c),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    if let Some(left_out) = log_line() {
                        tracing::warn!(listener = kind, error = %e, left_out, "accept failed");
                    }
                    std::thread::sleep(PAUSE);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_waiting_connection_wakes_the_wait() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let stop = StopSignal::new().unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(wait(&l, &[&stop]).unwrap(), Woken::Connection);
        assert!(l.accept().is_ok());
    }

    #[test]
    fn a_raised_signal_wakes_a_parked_wait_and_stays_raised() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(StopSignal::new().unwrap());
        let s = stop.clone();
        let waiter = std::thread::spawn(move || wait(&l, &[&s]).unwrap());
        stop.raise();
        assert_eq!(waiter.join().unwrap(), Woken::Stop);
        // Raised for good: a second waiter does not park.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let quiet = StopSignal::new().unwrap();
        assert_eq!(wait(&l, &[&quiet, &stop]).unwrap(), Woken::Stop);
    }
}
