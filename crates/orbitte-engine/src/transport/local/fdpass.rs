//! Passing a file descriptor to a same-host peer over a unix socket
//! (`SCM_RIGHTS`), with rustix's safe wrappers.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Sends what the socket takes now of `bytes` (at least one) with `fd`
/// attached to the first of them, without waiting: `WouldBlock` when the
/// socket has no room (nothing was sent, `fd` included); otherwise how
/// many bytes went, `fd` with them, and the rest is the caller's to send
/// plainly.
pub(crate) fn send_with_fd_now(
    sock: &UnixStream,
    bytes: &[u8],
    fd: BorrowedFd<'_>,
) -> io::Result<usize> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("ancillary buffer too small for one fd"));
    }
    loop {
        match rustix::net::sendmsg(
            sock.as_fd(),
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Err(rustix::io::Errno::INTR) => {}
            other => return Ok(other?),
        }
    }
}

/// Receives up to `buf.len()` bytes and the fd attached to them, if any.
/// Extra fds (a misbehaving peer) are closed.
pub(crate) fn recv_with_fd(
    sock: &UnixStream,
    buf: &mut [u8],
) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut got = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for fd in fds {
                if got.is_none() {
                    got = Some(fd);
                }
                // Others drop here, which closes them.
            }
        }
    }
    Ok((msg.bytes, got))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orbitte_memory::HostMemory;

    #[test]
    fn memfd_crosses_a_unix_socket_and_maps_the_same_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = HostMemory::alloc(8192).unwrap();
        m.write_at(4100, b"shared").unwrap();
        assert_eq!(
            send_with_fd_now(&a, b"range-7", m.memfd().unwrap()).unwrap(),
            7
        );
        let mut buf = [0u8; 16];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"range-7");
        let peer = HostMemory::map_shared(fd.unwrap(), 8192, true).unwrap();
        assert_eq!(peer.to_vec(4100, 6).unwrap(), b"shared");
        peer.write_at(0, b"back").unwrap();
        assert_eq!(m.to_vec(0, 4).unwrap(), b"back");
    }
}
