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
//! header. A refused WRITE's payload, which must be read and dropped, goes
//! through a scratch buffer that the connection keeps for its life (and a
//! rail copies WRITE payloads of up to 16 KiB in behind their headers,
//! `rail::SMALL_WRITE`).
//!
//! Every move works on a non-blocking socket ([`PayloadIo::send_now`],
//! [`PayloadIo::recv_now`], [`PayloadIo::discard_now`], [`send_ready`]):
//! each moves what the socket takes or has now, at most a budget, and says
//! how far it got ([`Moved`]); the caller (a session or a rail on its I/O
//! loop) keeps the position and the deadline.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;

use orbitte_memory::HostMemory;

use crate::session::io::FrameBuffer;

/// Largest piece one `sendfile` call moves, and the scratch size.
const CHUNK: usize = 1 << 20;

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

/// Largest READ answer a target sends with `sendfile` to a peer on
/// another host. Larger answers go with `sendmsg` from the mapping: on
/// loopback a `sendfile` payload reaches the receiver as page references
/// that count whole pages against its receive memory, and with 1 MiB
/// answers the initiator's socket kept wanting to advertise a zero window
/// and retransmissions followed (`sendmsg` moved READ 1 MiB 3.10/2.97/3.79
/// GB/s against 2.35/2.95/3.20 with `sendfile`).
pub(crate) const ANSWER_SENDFILE_MAX: usize = 256 << 10;

impl PayloadIo {
    pub(crate) fn new(zero_copy: bool) -> Self {
        Self {
            scratch: Vec::new(),
            zero_copy,
            sendfile_max: usize::MAX,
        }
    }

    /// A mover for a target's READ answers. To a peer on another host,
    /// with `zero_copy`, payloads up to [`ANSWER_SENDFILE_MAX`] go with
    /// `sendfile` (the NIC reads the pages, no copy on this host), larger
    /// ones with `sendmsg` from the mapping. To a peer on this host
    /// (`same_host`: the connection stays in this kernel) every answer
    /// goes with `sendmsg`, header and payload in one call: the page
    /// references of `sendfile` save the sender's copy but cost the
    /// receiver more than they save, and the header needs its own `send`
    /// (performance.md, "tcp payloads and socket buffers": READ 16 KiB to
    /// 256 KiB moved a fifth to a third more).
    pub(crate) fn for_answers(zero_copy: bool, same_host: bool) -> Self {
        Self {
            sendfile_max: ANSWER_SENDFILE_MAX,
            ..Self::new(zero_copy && !same_host)
        }
    }
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

// Non-blocking moves: what the target's sessions on the I/O loops use. The
// socket is non-blocking; each call moves what it can now, at most a
// budget, and says how far it got and whether the socket would block.

/// How far a non-blocking move got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Moved {
    /// Bytes of the head that went (a send's gathered answers and header).
    pub(crate) head: usize,
    /// Payload bytes moved.
    pub(crate) payload: usize,
    /// Whether it stopped because the socket would block (otherwise it
    /// finished, or spent its budget).
    pub(crate) blocked: bool,
}

/// `offset..offset + len` of `mem` as `usize` bounds, checked against the
/// memory before any system call touches it.
pub(crate) fn span(mem: &HostMemory, offset: u64, len: usize) -> io::Result<(usize, usize)> {
    let off = check(mem, offset, len)?;
    Ok((off, off + len))
}

impl PayloadIo {
    /// Whether a READ answer of `whole` bytes from `mem` goes with
    /// `sendmsg` from the mapping (not `sendfile`): then several can go
    /// in one call ([`HostMemory::send_gathered`]).
    pub(crate) fn copies(&self, mem: &HostMemory, whole: usize) -> bool {
        !(self.zero_copy && whole > 0 && whole <= self.sendfile_max && mem.memfd().is_some())
    }

    /// Sends, without waiting and at most `budget` bytes, the rest of
    /// `head` and then of `mem[off..end]`, a READ answer of `whole`
    /// payload bytes: with `zero_copy`, memfd-backed memory and `whole`
    /// up to the mover's `sendfile` bound, the head goes with `MSG_MORE`
    /// and the payload with `sendfile`; otherwise both with `sendmsg`
    /// from the mapping. `off..end` was checked with [`span`].
    pub(crate) fn send_now(
        &mut self,
        sock: &TcpStream,
        mut head: &[u8],
        mem: &HostMemory,
        (mut off, end): (usize, usize),
        whole: usize,
        budget: usize,
    ) -> io::Result<Moved> {
        let mut moved = Moved::default();
        let memfd = if self.copies(mem, whole) {
            None
        } else {
            mem.memfd()
        };
        while (!head.is_empty() || off < end) && moved.head + moved.payload < budget {
            let left = budget - moved.head - moved.payload;
            let sent = match memfd {
                Some(_) if !head.is_empty() => {
                    let n = head.len().min(left);
                    send_dontwait(sock, &head[..n], true).map(|n| (n, 0))
                }
                Some(fd) => {
                    let mut at = off as u64;
                    let want = (end - off).min(left);
                    rustix::fs::sendfile(sock.as_fd(), fd, Some(&mut at), want)
                        .map(|n| (0, n))
                        .map_err(io::Error::from)
                }
                None => {
                    let want = (end - off).min(left.saturating_sub(head.len()).max(1));
                    mem.send_to(sock.as_fd(), head, off, want, false)
                        .map(|n| (n.min(head.len()), n - n.min(head.len())))
                }
            };
            match sent {
                Ok((0, 0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok((h, p)) => {
                    head = &head[h..];
                    off += p;
                    moved.head += h;
                    moved.payload += p;
                }
                Err(e) => {
                    if blocked(e)? {
                        moved.blocked = true;
                        break;
                    }
                }
            }
        }
        Ok(moved)
    }

    /// Receives, without waiting and at most `budget` bytes, the rest of a
    /// WRITE payload into `mem[off..end]` (checked with [`span`]). With
    /// `frames` (the payload ends at `end`), the call that asks for its
    /// last bytes brings what follows them (up to the next request's
    /// header) into `frames` in the same `recvmsg`; without (more payload
    /// follows `end`), nothing past `end` is received. The peer's close is
    /// `UnexpectedEof`.
    pub(crate) fn recv_now(
        &mut self,
        sock: &TcpStream,
        mut frames: Option<&mut FrameBuffer>,
        mem: &HostMemory,
        (mut off, end): (usize, usize),
        budget: usize,
    ) -> io::Result<Moved> {
        let mut moved = Moved::default();
        while off < end && moved.payload < budget {
            let want = (end - off).min(budget - moved.payload);
            // Only bytes past the payload may go to the frame buffer.
            let tail = match frames.as_deref_mut() {
                Some(frames) if want == end - off => frames.spare(NEXT_REQUEST),
                _ => &mut [],
            };
            match mem.recv_from_then(sock.as_fd(), off, want, tail, true) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    let to_mem = n.min(want);
                    if let Some(frames) = frames.as_deref_mut() {
                        frames.filled(n - to_mem);
                    }
                    off += to_mem;
                    moved.payload += to_mem;
                }
                Err(e) => {
                    if blocked(e)? {
                        moved.blocked = true;
                        break;
                    }
                }
            }
        }
        Ok(moved)
    }

    /// Reads and drops, without waiting and at most `budget` bytes, up to
    /// `left` bytes (the payload of a refused WRITE), never touching
    /// registered memory. The peer's close is `UnexpectedEof`.
    pub(crate) fn discard_now(
        &mut self,
        sock: &TcpStream,
        left: u64,
        budget: usize,
    ) -> io::Result<Moved> {
        if self.scratch.is_empty() {
            self.scratch = vec![0; CHUNK];
        }
        let mut moved = Moved::default();
        let mut left = usize::try_from(left).unwrap_or(usize::MAX).min(budget);
        while left > 0 {
            let n = left.min(CHUNK);
            match rustix::net::recv(
                sock.as_fd(),
                &mut self.scratch[..n],
                rustix::net::RecvFlags::DONTWAIT,
            ) {
                Ok((0, _)) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok((m, _)) => {
                    left -= m;
                    moved.payload += m;
                }
                Err(e) => {
                    if blocked(e.into())? {
                        moved.blocked = true;
                        break;
                    }
                }
            }
        }
        Ok(moved)
    }
}

/// What a failed non-blocking call means for the move: `Ok(true)` the
/// socket would block (the move stops there), `Ok(false)` interrupted
/// (call again), `Err` the move's error.
fn blocked(e: io::Error) -> io::Result<bool> {
    match e.kind() {
        io::ErrorKind::WouldBlock => Ok(true),
        io::ErrorKind::Interrupted => Ok(false),
        _ => Err(e),
    }
}

/// One `send` that never waits (`more`: `MSG_MORE`).
fn send_dontwait(sock: &TcpStream, bytes: &[u8], more: bool) -> io::Result<usize> {
    use rustix::net::SendFlags;
    let mut flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
    if more {
        flags |= SendFlags::MORE;
    }
    rustix::net::send(sock.as_fd(), bytes, flags).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;
    use std::time::Instant;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Receives `len` bytes into `mem[offset..]` with [`PayloadIo::recv_now`]
    /// on the non-blocking `sock`, in turns of at most `budget` bytes,
    /// pausing whenever the socket would block; returns the turns.
    fn recv_whole(
        io: &mut PayloadIo,
        sock: &TcpStream,
        frames: &mut FrameBuffer,
        mem: &HostMemory,
        (offset, len): (u64, usize),
        budget: usize,
    ) -> io::Result<usize> {
        sock.set_nonblocking(true)?;
        let (mut off, end) = span(mem, offset, len)?;
        let mut turns = 0;
        let t0 = Instant::now();
        while off < end {
            let m = io.recv_now(sock, Some(&mut *frames), mem, (off, end), budget)?;
            assert!(m.payload <= budget, "a turn stays within its budget");
            off += m.payload;
            turns += 1;
            if m.blocked {
                assert!(t0.elapsed() < std::time::Duration::from_secs(20));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(turns)
    }

    /// Sends `head` and `len` bytes of `mem` from `offset` with
    /// [`PayloadIo::send_now`] on the non-blocking `sock`, pausing
    /// whenever the socket would block.
    fn send_whole(
        io: &mut PayloadIo,
        sock: &TcpStream,
        mut head: &[u8],
        mem: &HostMemory,
        (offset, len): (u64, usize),
    ) -> io::Result<()> {
        sock.set_nonblocking(true)?;
        let (mut off, end) = span(mem, offset, len)?;
        let t0 = Instant::now();
        while !head.is_empty() || off < end {
            let m = io.send_now(sock, head, mem, (off, end), len, usize::MAX)?;
            head = &head[m.head..];
            off += m.payload;
            if m.blocked {
                assert!(t0.elapsed() < std::time::Duration::from_secs(20));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
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
            send_whole(&mut sender, &a, b"HDR", &src, (17, len)).unwrap();
            src
        });
        let mut head = [0u8; 3];
        io::Read::read_exact(&mut &b, &mut head).unwrap();
        assert_eq!(&head, b"HDR");
        let mut io = PayloadIo::new(zero_copy);
        recv_whole(&mut io, &b, &mut FrameBuffer::new(), &dst, (5, len), CHUNK).unwrap();
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
        roundtrip_with(PayloadIo::for_answers(true, false), false, false);
        // Any READ answer to a peer on this host: sent with sendmsg.
        roundtrip_with(PayloadIo::for_answers(true, true), false, false);
    }

    #[test]
    fn answers_to_this_host_never_go_with_sendfile() {
        let (a, _b) = pair();
        assert!(super::super::socket::same_host(&a), "a loopback connection");
        assert!(!PayloadIo::for_answers(true, true).zero_copy);
        assert!(PayloadIo::for_answers(true, false).zero_copy);
        assert!(!PayloadIo::for_answers(false, false).zero_copy);
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
        // In turns smaller than the payload: only the last may bring the
        // next frame's bytes.
        let turns = recv_whole(
            &mut PayloadIo::new(true),
            &b,
            &mut frames,
            &dst,
            (0, CHUNK),
            CHUNK / 3,
        )
        .unwrap();
        assert!(turns >= 3);
        b.set_nonblocking(false).unwrap();
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

    /// A non-blocking send stops where the socket would wait and says so,
    /// stays within its budget, and a later call goes on from there: the
    /// peer gets the head and every payload byte in order.
    #[test]
    fn a_send_now_resumes_where_the_socket_stopped_it() {
        for zero_copy in [true, false] {
            let (a, b) = pair();
            a.set_nonblocking(true).unwrap();
            let len = 8 * CHUNK;
            let src = HostMemory::alloc(len).unwrap();
            for i in 0..len / 4096 {
                src.fill(i * 4096, 4096, (i % 251) as u8).unwrap();
            }
            let mut io = PayloadIo::new(zero_copy);
            let head = b"HEADER".to_vec();
            let (mut off, end) = span(&src, 0, len).unwrap();
            let mut head_sent = 0;
            // Nobody reads yet: the socket's buffers fill and it blocks.
            let m = io
                .send_now(&a, &head, &src, (off, end), len, usize::MAX)
                .unwrap();
            assert!(
                m.blocked && m.head == head.len() && m.payload < len,
                "{m:?}"
            );
            head_sent += m.head;
            off += m.payload;
            let reader = std::thread::spawn(move || {
                let mut got = vec![0u8; head.len() + len];
                io::Read::read_exact(&mut &b, &mut got).unwrap();
                got
            });
            while off < end {
                let m = io
                    .send_now(&a, &[], &src, (off, end), len, CHUNK / 2)
                    .unwrap();
                assert!(m.payload <= CHUNK / 2);
                off += m.payload;
                if m.blocked {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            let got = reader.join().unwrap();
            assert_eq!(head_sent, 6);
            assert_eq!(&got[..6], b"HEADER");
            assert!(got[6..] == src.to_vec(0, len).unwrap()[..]);
        }
    }

    /// A refused WRITE's payload is read and dropped in turns, up to what
    /// is left and never past it: the next frame's bytes stay in the
    /// socket.
    #[test]
    fn a_discard_drops_exactly_the_payload_left() {
        let (a, b) = pair();
        b.set_nonblocking(true).unwrap();
        io::Write::write_all(&mut &a, &[9u8; 10_000]).unwrap();
        io::Write::write_all(&mut &a, b"NEXT").unwrap();
        let mut io = PayloadIo::new(true);
        let mut left = 10_000u64;
        while left > 0 {
            let m = io.discard_now(&b, left, 4096).unwrap();
            assert!(m.payload <= 4096);
            left -= m.payload as u64;
            if m.blocked {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        b.set_nonblocking(false).unwrap();
        let mut next = [0u8; 4];
        io::Read::read_exact(&mut &b, &mut next).unwrap();
        assert_eq!(&next, b"NEXT");
        // The peer's close before the payload ends is an error.
        drop(a);
        b.set_nonblocking(true).unwrap();
        let e = loop {
            match io.discard_now(&b, 10, 10) {
                Err(e) => break e,
                Ok(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        };
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
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
        assert!(send_whole(&mut io, &a, b"h", &m, (4000, 100)).is_err());
        assert!(span(&m, 4000, 100).is_err());
        assert!(span(&m, u64::MAX, 1).is_err());
    }
}
