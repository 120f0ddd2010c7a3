//! Moving payload bytes between a socket and [`HostMemory`] without an
//! intermediate buffer.
//!
//! Received payloads go straight from the socket into the mapped range
//! ([`HostMemory::recv_from_then`]: one `recvmsg(2)`, the kernel's one
//! copy), and what follows a payload in the same call into the
//! connection's frame buffer.
//! Sent payloads go out of the mapped range with the frame header in front
//! ([`HostMemory::send_to`]: one `sendmsg(2)`), or, for memfd-backed
//! memory with `zero_copy`, with `sendfile(2)` from the memfd after the
//! header. Only a refused WRITE's payload, which must be read and dropped,
//! goes through a scratch buffer that the connection keeps for its life.
//!
//! Every call works on a blocking socket whose timeouts the connection set
//! once (no `setsockopt` per call). Without a deadline a timeout of the
//! socket ends the operation (`WouldBlock`); with one, the operation
//! carries on across socket timeouts until the deadline, so the whole
//! operation ends by the deadline (within one socket timeout) however the
//! peer paces its reads or writes, and a timeout past it is `TimedOut`.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::Instant;

use orbitte_memory::HostMemory;

use crate::session::io::FrameBuffer;

/// Largest piece one `sendfile` call moves, and the scratch size.
const CHUNK: usize = 1 << 20;

/// Whether a failed call may be retried: interrupted, or a socket timeout
/// before `deadline`. A socket timeout past the deadline (or without one)
/// becomes the operation's error.
fn retry(e: io::Error, deadline: Option<Instant>) -> io::Result<()> {
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => match deadline {
            Some(d) if Instant::now() < d => Ok(()),
            Some(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "payload not moved within its deadline",
            )),
            None => Err(e),
        },
        _ => Err(e),
    }
}

/// `TimedOut` once `deadline` passed (checked between system calls that
/// made progress: a peer that trickles bytes is cut off as well).
fn past(deadline: Option<Instant>) -> io::Result<()> {
    match deadline {
        Some(d) if Instant::now() >= d => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "payload not moved within its deadline",
        )),
        _ => Ok(()),
    }
}

/// What a WRITE payload's last `recvmsg` may bring of the next frame: the
/// header and fixed part of a WRITE request (its payload is received
/// straight into its own destination).
const NEXT_REQUEST: usize = orbitte_wire::HEADER_LEN + orbitte_wire::WRITE_REQUEST_FIXED_LEN;

/// Per-connection payload mover. Create one per connection and reuse it.
#[derive(Debug)]
pub(crate) struct PayloadIo {
    scratch: Vec<u8>,
    /// Whether memfd-backed memory is sent with `sendfile` (otherwise with
    /// `sendmsg` from the mapping; tests cover both).
    zero_copy: bool,
    /// Largest payload sent with `sendfile`; larger ones go with `sendmsg`.
    sendfile_max: usize,
}

/// Largest READ answer a target sends with `sendfile`. On loopback a
/// `sendfile` payload reaches the receiver as page references that count
/// whole pages against its receive memory: with 1 MiB answers the
/// initiator's socket kept wanting to advertise a zero window and
/// retransmissions followed, and `sendmsg` from the mapping moved READ
/// 1 MiB 3.10/2.97/3.79 GB/s against 2.35/2.95/3.20 with `sendfile`
/// (2.0-2.6 against 1.7-2.0 GB per CPU-second), while at 64 KiB `sendfile`
/// was faster (5.17 against 3.79 GB/s, the same CPU per byte); measured
/// with orbitte bench, two rails, load average 6 to 12.
pub(crate) const ANSWER_SENDFILE_MAX: usize = 256 << 10;

impl PayloadIo {
    pub(crate) fn new(zero_copy: bool) -> Self {
        Self {
            scratch: Vec::new(),
            zero_copy,
            sendfile_max: usize::MAX,
        }
    }

    /// A mover for a target's READ answers: with `zero_copy`, payloads up
    /// to [`ANSWER_SENDFILE_MAX`] go with `sendfile`, larger ones with
    /// `sendmsg` from the mapping.
    pub(crate) fn for_answers(zero_copy: bool) -> Self {
        Self {
            sendfile_max: ANSWER_SENDFILE_MAX,
            ..Self::new(zero_copy)
        }
    }

    /// Writes `head` and then `mem[offset..offset + len]` to `sock`, all
    /// of it by `deadline` when one is given.
    pub(crate) fn send(
        &mut self,
        sock: &TcpStream,
        head: &[u8],
        mem: &HostMemory,
        offset: u64,
        len: usize,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let offset = check(mem, offset, len)?;
        if self.zero_copy
            && len > 0
            && len <= self.sendfile_max
            && let Some(fd) = mem.memfd()
        {
            send_all(sock, head, true, deadline)?;
            let mut off = offset as u64;
            let end = off + len as u64;
            while off < end {
                let want = usize::try_from(end - off)
                    .unwrap_or(usize::MAX)
                    .min(CHUNK * 4);
                match rustix::fs::sendfile(sock.as_fd(), fd, Some(&mut off), want) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) if off < end => past(deadline)?,
                    Ok(_) => {}
                    Err(e) => retry(e.into(), deadline)?,
                }
            }
            return Ok(());
        }
        let (mut head, mut off, end) = (head, offset, offset + len);
        while !head.is_empty() || off < end {
            match mem.send_to(sock.as_fd(), head, off, end - off, false) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    let from_head = n.min(head.len());
                    head = &head[from_head..];
                    off += n - from_head;
                    if off < end {
                        past(deadline)?;
                    }
                }
                Err(e) => retry(e, deadline)?,
            }
        }
        Ok(())
    }

    /// Reads exactly `len` bytes from `sock` into `mem[offset..]`, all of
    /// them by `deadline` when one is given; bytes that follow them and
    /// arrive in the same system calls go on into `frames` (up to the next
    /// request's header: one `recvmsg` per payload, not one more `recv`).
    ///
    /// `answers` holds encoded answers not sent yet: the receive never
    /// waits for the peer while it holds them. When no byte is there, it
    /// sends them (by `deadline`) and empties it first, so the peer learns
    /// of the requests served before this one even if this payload never
    /// arrives.
    pub(crate) fn recv(
        &mut self,
        sock: &TcpStream,
        frames: &mut FrameBuffer,
        mem: &HostMemory,
        (offset, len): (u64, usize),
        answers: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let (mut off, end) = {
            let o = check(mem, offset, len)?;
            (o, o + len)
        };
        while off < end {
            let holding = !answers.is_empty();
            match mem.recv_from_then(
                sock.as_fd(),
                off,
                end - off,
                frames.spare(NEXT_REQUEST),
                holding,
            ) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    let to_mem = n.min(end - off);
                    frames.filled(n - to_mem);
                    off += to_mem;
                    if off < end {
                        past(deadline)?;
                    }
                }
                Err(e) if holding && e.kind() == io::ErrorKind::WouldBlock => {
                    send_all(sock, answers, false, deadline)?;
                    answers.clear();
                }
                Err(e) => retry(e, deadline)?,
            }
        }
        Ok(())
    }

    /// Reads and drops `len` bytes (the payload of a refused WRITE), never
    /// touching registered memory; all of them by `deadline` when given.
    pub(crate) fn discard(
        &mut self,
        sock: &TcpStream,
        len: u64,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; CHUNK];
        }
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(CHUNK);
            match rustix::net::recv(
                sock.as_fd(),
                &mut self.scratch[..n],
                rustix::net::RecvFlags::empty(),
            ) {
                Ok((0, _)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok((m, _)) => {
                    left -= m as u64;
                    if left > 0 {
                        past(deadline)?;
                    }
                }
                Err(e) => retry(e.into(), deadline)?,
            }
        }
        Ok(())
    }
}

/// Sends all of `bytes`, by `deadline` when given; `more`: more data
/// follows at once (`MSG_MORE`: the bytes may wait to share a packet).
pub(crate) fn send_all(
    sock: &TcpStream,
    mut bytes: &[u8],
    more: bool,
    deadline: Option<Instant>,
) -> io::Result<()> {
    use rustix::net::SendFlags;
    let flags = if more {
        SendFlags::NOSIGNAL | SendFlags::MORE
    } else {
        SendFlags::NOSIGNAL
    };
    while !bytes.is_empty() {
        match rustix::net::send(sock.as_fd(), bytes, flags) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                if !bytes.is_empty() {
                    past(deadline)?;
                }
            }
            Err(e) => retry(e.into(), deadline)?,
        }
    }
    Ok(())
}

/// Sends as much of `bytes` as the socket takes without waiting; returns
/// how many went out (fewer than all when its buffer filled).
pub(crate) fn send_ready(sock: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    use rustix::net::SendFlags;
    let mut sent = 0;
    while sent < bytes.len() {
        match rustix::net::send(
            sock.as_fd(),
            &bytes[sent..],
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(rustix::io::Errno::AGAIN) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(sent)
}

/// Checks the range and returns its offset as `usize`.
fn check(mem: &HostMemory, offset: u64, len: usize) -> io::Result<usize> {
    let off = usize::try_from(offset).map_err(|_| io::Error::other("offset overflows usize"))?;
    mem.check(off, len).map_err(io::Error::other)?;
    Ok(off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Sends a head and `3 * CHUNK` bytes from `src` (memfd-backed, or a
    /// peer mapping of one with `mapped_src`) and receives them into `dst`
    /// (likewise), checking every byte.
    fn roundtrip(zero_copy: bool, mapped_src: bool, mapped_dst: bool) {
        roundtrip_with(PayloadIo::new(zero_copy), mapped_src, mapped_dst);
    }

    fn roundtrip_with(mut sender: PayloadIo, mapped_src: bool, mapped_dst: bool) {
        let zero_copy = sender.zero_copy;
        let mapping = |m: Arc<HostMemory>| {
            HostMemory::map_shared(
                m.memfd().unwrap().try_clone_to_owned().unwrap(),
                m.len(),
                true,
            )
            .unwrap()
        };
        let (a, b) = pair();
        let mut src = HostMemory::alloc(3 * CHUNK + 17).unwrap();
        for i in 0..src.len() / 4096 {
            src.fill(i * 4096, 4096, (i % 251) as u8).unwrap();
        }
        if mapped_src {
            src = mapping(src);
        }
        let mut dst = HostMemory::alloc(3 * CHUNK + 17).unwrap();
        if mapped_dst {
            dst = mapping(dst);
        }
        let len = 3 * CHUNK;
        let t = std::thread::spawn(move || {
            sender.send(&a, b"HDR", &src, 17, len, None).unwrap();
            src
        });
        let mut head = [0u8; 3];
        io::Read::read_exact(&mut &b, &mut head).unwrap();
        assert_eq!(&head, b"HDR");
        let mut io = PayloadIo::new(zero_copy);
        io.recv(
            &b,
            &mut FrameBuffer::new(),
            &dst,
            (5, len),
            &mut Vec::new(),
            None,
        )
        .unwrap();
        let src = t.join().unwrap();
        assert_eq!(src.to_vec(17, len).unwrap(), dst.to_vec(5, len).unwrap());
        assert_eq!(dst.to_vec(0, 5).unwrap(), vec![0; 5]);
    }

    #[test]
    fn sendfile_roundtrip_moves_exact_bytes() {
        roundtrip(true, false, false);
    }

    #[test]
    fn sendmsg_roundtrip_moves_exact_bytes() {
        roundtrip(false, false, false);
        // A peer mapping has no memfd of its own: sent with sendmsg.
        roundtrip(true, true, true);
        // A READ answer above ANSWER_SENDFILE_MAX: sent with sendmsg.
        roundtrip_with(PayloadIo::for_answers(true), false, false);
    }

    #[test]
    fn frames_after_a_payload_reach_the_frame_buffer_whole() {
        use orbitte_wire::{Frame, Goodbye, GoodbyeReason, Message};
        let (a, b) = pair();
        let bye = Frame::Goodbye(Goodbye {
            reason: GoodbyeReason::SHUTDOWN,
            message: Message::truncating("after the payload"),
        });
        let mut tail = Vec::new();
        bye.encode(&mut tail).unwrap();
        let src = HostMemory::alloc(CHUNK).unwrap();
        for i in 0..CHUNK / 4096 {
            src.fill(i * 4096, 4096, (i % 251) as u8).unwrap();
        }
        let t = std::thread::spawn(move || {
            // Payload and the next frame in one write, so that they arrive
            // together as often as the kernel allows.
            let mut bytes = src.to_vec(0, CHUNK).unwrap();
            bytes.extend_from_slice(&tail);
            io::Write::write_all(&mut &a, &bytes).unwrap();
            (a, src)
        });
        let dst = HostMemory::alloc(CHUNK).unwrap();
        let mut frames = FrameBuffer::new();
        PayloadIo::new(true)
            .recv(&b, &mut frames, &dst, (0, CHUNK), &mut Vec::new(), None)
            .unwrap();
        let got = loop {
            if let Some(f) = frames.next().unwrap() {
                break f;
            }
            assert!(frames.fill(&b, false).unwrap() > 0);
        };
        let (_a, src) = t.join().unwrap();
        assert_eq!(got, bye);
        assert!(frames.is_empty());
        assert_eq!(src.to_vec(0, CHUNK).unwrap(), dst.to_vec(0, CHUNK).unwrap());
    }

    #[test]
    fn a_deadline_outlasts_socket_timeouts_and_then_ends_the_receive() {
        let (a, b) = pair();
        b.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        let m = HostMemory::alloc(4096).unwrap();
        let mut io = PayloadIo::new(true);
        // Ten bytes into `m`, holding no answers.
        let mut ten = |deadline| {
            io.recv(
                &b,
                &mut FrameBuffer::new(),
                &m,
                (0, 10),
                &mut Vec::new(),
                deadline,
            )
        };
        // Without a deadline, the socket's timeout ends it.
        let e = ten(None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // With one, bytes that come after several socket timeouts count.
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            io::Write::write_all(&mut &a, b"0123456789").unwrap();
            a
        });
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        ten(Some(deadline)).unwrap();
        // Past the deadline, a socket timeout ends it as TimedOut.
        let e = ten(Some(Instant::now())).unwrap_err();
        assert_eq!(m.to_vec(0, 10).unwrap(), b"0123456789");
        let _a = t.join().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    /// A receive that holds answers sends them before it waits: a peer
    /// that sends half a payload and then waits for the answers of the
    /// requests before it gets them, and the rest of the payload follows.
    #[test]
    fn a_receive_sends_the_answers_it_holds_before_it_waits() {
        let (a, b) = pair();
        b.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        // A peer that never gets the answers fails the test, not hangs it.
        a.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let answers = b"answers of earlier requests".to_vec();
        let want = answers.clone();
        let t = std::thread::spawn(move || {
            io::Write::write_all(&mut &a, &[1u8; 4096]).unwrap();
            let mut got = vec![0u8; want.len()];
            io::Read::read_exact(&mut &a, &mut got)
                .expect("the answers came before the rest of the payload");
            assert_eq!(got, want);
            io::Write::write_all(&mut &a, &[2u8; 4096]).unwrap();
            a
        });
        let m = HostMemory::alloc(8192).unwrap();
        let mut held = answers;
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        PayloadIo::new(true)
            .recv(
                &b,
                &mut FrameBuffer::new(),
                &m,
                (0, 8192),
                &mut held,
                Some(deadline),
            )
            .unwrap();
        let _a = t.join().unwrap();
        assert!(held.is_empty(), "the answers sent are taken out");
        assert_eq!(m.to_vec(0, 4096).unwrap(), vec![1u8; 4096]);
        assert_eq!(m.to_vec(4096, 4096).unwrap(), vec![2u8; 4096]);
    }

    #[test]
    fn send_ready_stops_where_the_socket_would_wait_and_never_blocks() {
        let (a, b) = pair();
        // Nobody reads `b`: the buffers fill long before 64 MiB went out.
        let bytes = vec![7u8; 64 << 20];
        let t0 = Instant::now();
        let n = send_ready(&a, &bytes).unwrap();
        assert!(n > 0 && n < bytes.len(), "sent {n}");
        // Full: nothing more goes, at once.
        assert_eq!(send_ready(&a, &bytes).unwrap(), 0);
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        // What went out arrives whole and in order.
        let mut got = vec![0u8; n];
        io::Read::read_exact(&mut &b, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == 7));
        // A closed peer is an error, not a partial send.
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let e = (0..3)
            .find_map(|_| send_ready(&a, &bytes[..1024]).err())
            .expect("sending to a closed peer fails");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }

    #[test]
    fn out_of_bounds_is_refused_before_any_io() {
        let (a, _b) = pair();
        let m = HostMemory::alloc(4096).unwrap();
        let mut io = PayloadIo::new(true);
        assert!(io.send(&a, b"h", &m, 4000, 100, None).is_err());
        assert!(
            io.recv(
                &a,
                &mut FrameBuffer::new(),
                &m,
                (u64::MAX, 1),
                &mut Vec::new(),
                None
            )
            .is_err()
        );
    }
}
