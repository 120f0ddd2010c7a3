//! Whether the target process of a local mapping still exists.
//!
//! A mapping of a peer's memfd stays valid after the peer dies: copies into
//! it succeed and reach no one. So the initiator watches the process that
//! serves the mapping: when it connects to the peer's local server it reads
//! the server's pid from the socket (`SO_PEERCRED`) and opens a pidfd on it
//! before the handshake. The handshake and the handout that follow prove
//! that the pid still named the server then (a dead process answers
//! nothing, and a live one's pid cannot be reused), so the pidfd watches
//! the right process from then on. A pidfd becomes readable when its
//! process exits; checking it is one `poll` with a zero timeout.
//!
//! Where no pidfd can be had (a kernel before 5.3, a server in another pid
//! namespace), the mapping is used without the check, and that is logged.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags};
use rustix::process::PidfdFlags;

/// The process serving one peer's mappings.
#[derive(Debug)]
pub(crate) struct TargetProcess {
    pidfd: Option<OwnedFd>,
}

impl TargetProcess {
    /// The process at the other end of `sock` (a connected unix socket).
    pub(crate) fn of_peer(sock: &UnixStream) -> Self {
        let pidfd = rustix::net::sockopt::socket_peercred(sock)
            .ok()
            .and_then(|cred| rustix::process::pidfd_open(cred.pid, PidfdFlags::empty()).ok());
        if pidfd.is_none() {
            tracing::warn!(
                "no pidfd for the local peer's process: the local path cannot notice if it dies"
            );
        }
        Self { pidfd }
    }

    /// Whether the process has exited (`false` when it cannot be told).
    pub(crate) fn is_gone(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return false;
        };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())) {
            Ok(n) => n > 0 && !fds[0].revents().is_empty(),
            Err(_) => false,
        }
    }
}
