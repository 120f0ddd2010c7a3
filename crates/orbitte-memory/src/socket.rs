//! Socket settings that the engine's tcp path relies on, around the
//! receives into memory ([`crate::HostMemory::recv_from_then`]) and the
//! sends from it, and that no safe crate of the workspace sets.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Sets `SO_RCVLOWAT` on `socket`: a poll (or epoll) reports it readable
/// once `bytes` are queued, or earlier when the receive buffer or window
/// runs short (the kernel's own guard, so a mark above what the buffer
/// holds cannot stall the connection). A receive still returns what is
/// queued. Values above `c_int::MAX` are taken as `c_int::MAX`.
pub fn set_recv_lowat(socket: BorrowedFd<'_>, bytes: u32) -> std::io::Result<()> {
    setsockopt_int(socket, libc::SOL_SOCKET, libc::SO_RCVLOWAT, bytes)
}

/// Sets `TCP_NOTSENT_LOWAT` on `socket`: a send takes more only while
/// fewer than `bytes` of what was sent before wait in the socket unsent
/// (bytes sent and not yet acknowledged do not count), and a poll reports
/// it writable only then. The sender keeps the rest of its data itself, so
/// the kernel holds about one window plus `bytes` of it. Values above
/// `c_int::MAX` are taken as `c_int::MAX`.
pub fn set_notsent_lowat(socket: BorrowedFd<'_>, bytes: u32) -> std::io::Result<()> {
    setsockopt_int(socket, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, bytes)
}

/// The `TCP_NOTSENT_LOWAT` of `socket`: 0 when never set (the kernel's
/// `net.ipv4.tcp_notsent_lowat` applies then).
pub fn notsent_lowat(socket: BorrowedFd<'_>) -> std::io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live for the call and `len` is `v`'s size;
    // the fd is valid for the call (`BorrowedFd`).
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

fn setsockopt_int(
    socket: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: u32,
) -> std::io::Result<()> {
    let v = libc::c_int::try_from(value).unwrap_or(libc::c_int::MAX);
    // SAFETY: `v` is a live c_int for the call and its size is the one
    // passed; the fd is valid for the call (`BorrowedFd`); a descriptor
    // that is not a socket of that level fails (ENOTSOCK, EOPNOTSUPP).
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
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

    /// Writes into non-blocking `a` until it refuses more, its peer
    /// reading nothing; returns how much it took.
    fn fill(a: &mut TcpStream) -> usize {
        a.set_nonblocking(true).unwrap();
        let chunk = [7u8; 64 << 10];
        let mut took = 0;
        loop {
            match a.write(&chunk) {
                Ok(n) => took += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return took,
                Err(e) => panic!("write: {e}"),
            }
        }
    }

    /// With a 4 MiB send buffer and a peer that does not read, a socket
    /// takes its peer's window plus the send buffer; with a 16 KiB unsent
    /// mark, about its peer's window plus the mark.
    #[test]
    fn an_unsent_mark_bounds_what_a_socket_takes_beyond_the_window() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let took = |mark: Option<u32>| {
            let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (b, _) = l.accept().unwrap();
            size_buffers(&a, &b);
            if let Some(m) = mark {
                set_notsent_lowat(a.as_fd(), m).unwrap();
                assert_eq!(notsent_lowat(a.as_fd()).unwrap(), m);
            }
            let n = fill(&mut a);
            drop(b);
            n
        };
        let unbounded = took(None);
        let bounded = took(Some(16 << 10));
        assert!(
            bounded < 1 << 20 && unbounded > 2 << 20,
            "took {bounded} bytes with the mark, {unbounded} without"
        );
    }

    /// A 4 MiB send buffer on `a` and a 64 KiB receive buffer on `b`.
    fn size_buffers(a: &TcpStream, b: &TcpStream) {
        for (s, opt, n) in [
            (a, libc::SO_SNDBUF, 4 << 20),
            (b, libc::SO_RCVBUF, 64 << 10),
        ] {
            setsockopt_int(s.as_fd(), libc::SOL_SOCKET, opt, n).unwrap();
        }
    }

    #[test]
    fn a_non_socket_is_refused() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let e = set_recv_lowat(f.as_fd(), 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK));
        let e = set_notsent_lowat(f.as_fd(), 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTSOCK));
    }
}
