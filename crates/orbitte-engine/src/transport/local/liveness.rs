//! Whether the target of a local mapping still serves it.
//!
//! A mapping of a peer's memfd stays valid after the peer dies: copies into
//! it succeed and reach no one. So the initiator watches the mapping
//! session: the target's local server holds it open until the initiator
//! leaves or the target's listener stops (notifications travel on it), and
//! when the target process exits the kernel closes the target's end, so
//! the socket reports a hang-up. Checking it is one `poll` with a zero
//! timeout and reads nothing. This needs no process id, so it holds across
//! pid namespaces, and it also notices a target that stopped serving.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags};

/// The mapping session of one peer, watched for its hang-up.
#[derive(Debug)]
pub(crate) struct TargetSession {
    /// A duplicate of the session's socket (the transport keeps the
    /// original to send notifications).
    sock: Option<OwnedFd>,
}

impl TargetSession {
    /// Watches `sock`, a connected mapping session.
    pub(crate) fn watch(sock: &UnixStream) -> Self {
        let sock = match sock.try_clone() {
            Ok(s) => Some(OwnedFd::from(s)),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot watch the local peer's session: the local path cannot notice if it dies"
                );
                None
            }
        };
        Self { sock }
    }

    /// Whether the target's end is gone (`false` when it cannot be told).
    pub(crate) fn is_gone(&self) -> bool {
        let Some(fd) = &self.sock else {
            return false;
        };
        let mut fds = [PollFd::new(fd, PollFlags::RDHUP)];
        match rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())) {
            Ok(n) => {
                n > 0
                    && fds[0]
                        .revents()
                        .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
            }
            Err(_) => false,
        }
    }
}
