//! Socket settings that the receives into memory ([`crate::HostMemory::recv_from_then`])
//! rely on and that no safe crate of the workspace sets.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Sets `SO_RCVLOWAT` on `socket`: a poll (or epoll) reports it readable
/// once `bytes` are queued, or earlier when the receive buffer or window
/// runs short (the kernel's own guard, so a mark above what the buffer
/// holds cannot stall the connection). A receive still returns what is
/// queued. Values above `c_int::MAX` are taken as `c_int::MAX`.
pub fn set_recv_lowat(socket: BorrowedFd<'_>, bytes: u32) -> std::io::Result<()> {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int for the call and its size is the one
    // passed; the fd is valid for the call (`BorrowedFd`); a non-socket fd
    // fails with ENOTSOCK.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    fn readable(s: &TcpStream) -> bool {
        let mut fd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, its count passed; zero timeout.
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
        n == 1
    }

    #[test]
    fn a_socket_is_readable_only_once_the_mark_is_queued() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nodelay(true).unwrap();
        set_recv_lowat(b.as_fd(), 1000).unwrap();
        a.write_all(&[7; 600]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!readable(&b), "readable with 600 of 1000 bytes queued");
        a.write_all(&[7; 400]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !readable(&b) {
            assert!(
                std::time::Instant::now() < deadline,
                "not readable with 1000 bytes queued"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        set_recv_lowat(b.as_fd(), 1).unwrap();
        assert!(readable(&b));
    }

    #[test]
    fn a_non_socket_is_refused() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let e = set_recv_lowat(f.as_fd(), 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK));
    }
}
