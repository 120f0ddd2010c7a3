//! Moving payload bytes between a socket and [`HostMemory`] without an
//! intermediate buffer per operation.
//!
//! memfd-backed memory (what [`HostMemory::alloc`] makes) goes through the
//! kernel: `sendfile(2)` from the memfd into the socket, and `splice(2)` from
//! the socket through a pipe into the memfd. The bytes are copied once, by
//! the kernel, exactly as a raw socket `send`/`recv` would. Other memory
//! (caller-owned, or a peer's mapping) goes through one scratch buffer that
//! the connection keeps for its whole life, so no operation allocates.
//!
//! Every call works on a blocking socket. Without a deadline the caller's
//! read/write timeouts apply per system call; with one, every call re-arms
//! the socket timeout to the time left, so the whole operation ends by the
//! deadline however the peer paces its reads or writes. A timeout comes back
//! as `WouldBlock`/`TimedOut`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use orbitte_memory::HostMemory;
use rustix::pipe::SpliceFlags;

/// Scratch size for memory that has no memfd, and the pipe size for splice.
const CHUNK: usize = 1 << 20;

/// Which socket timeout a deadline re-arms.
#[derive(Clone, Copy)]
enum Dir {
    Send,
    Recv,
}

/// Sets the socket timeout of `dir` to the time left before `deadline`
/// (nothing without a deadline); past it, `TimedOut`.
fn arm(sock: &TcpStream, deadline: Option<Instant>, dir: Dir) -> io::Result<()> {
    let Some(deadline) = deadline else {
        return Ok(());
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "payload not moved within its deadline",
        ));
    }
    let left = Some(left.max(Duration::from_millis(1)));
    match dir {
        Dir::Send => sock.set_write_timeout(left),
        Dir::Recv => sock.set_read_timeout(left),
    }
}

/// Per-connection payload mover. Create one per connection and reuse it.
#[derive(Debug)]
pub(crate) struct PayloadIo {
    scratch: Vec<u8>,
    /// (read end, write end), made on first use.
    pipe: Option<(OwnedFd, OwnedFd)>,
    /// Whether the zero-copy syscalls may be used (tests turn it off to
    /// cover the scratch-buffer path).
    zero_copy: bool,
}

impl PayloadIo {
    pub(crate) fn new(zero_copy: bool) -> Self {
        Self {
            scratch: Vec::new(),
            pipe: None,
            zero_copy,
        }
    }

    fn scratch(&mut self) -> &mut [u8] {
        if self.scratch.is_empty() {
            self.scratch = vec![0; CHUNK];
        }
        &mut self.scratch
    }

    /// Writes `mem[offset..offset + len]` to `sock`, all of it by
    /// `deadline` when one is given.
    pub(crate) fn send(
        &mut self,
        sock: &TcpStream,
        mem: &HostMemory,
        offset: u64,
        len: usize,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        check(mem, offset, len)?;
        if self.zero_copy
            && let Some(fd) = mem.memfd()
        {
            let mut off = offset;
            let end = offset + len as u64;
            while off < end {
                let want = usize::try_from(end - off)
                    .unwrap_or(usize::MAX)
                    .min(CHUNK * 4);
                arm(sock, deadline, Dir::Send)?;
                match rustix::fs::sendfile(sock.as_fd(), fd, Some(&mut off), want) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(());
        }
        let mut done = 0usize;
        let mut sock = sock;
        while done < len {
            let n = (len - done).min(CHUNK);
            let buf = &mut self.scratch()[..n];
            mem.read_at(offset as usize + done, buf)
                .map_err(io::Error::other)?;
            let mut sent = 0;
            while sent < n {
                arm(sock, deadline, Dir::Send)?;
                match sock.write(&buf[sent..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(m) => sent += m,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            done += n;
        }
        Ok(())
    }

    /// Reads exactly `len` bytes from `sock` into `mem[offset..]`, all of
    /// them by `deadline` when one is given.
    pub(crate) fn recv(
        &mut self,
        sock: &TcpStream,
        mem: &HostMemory,
        offset: u64,
        len: usize,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        check(mem, offset, len)?;
        if !mem.is_writable() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "memory is read-only",
            ));
        }
        if self.zero_copy
            && let Some(fd) = mem.memfd()
        {
            if self.pipe.is_none() {
                let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
                // Best effort: a larger pipe means fewer syscalls.
                let _ = rustix::pipe::fcntl_setpipe_size(&w, CHUNK);
                self.pipe = Some((r, w));
            }
            let Some((r, w)) = &self.pipe else {
                unreachable!("pipe made above")
            };
            let mut out_off = offset;
            let mut left = len;
            while left > 0 {
                arm(sock, deadline, Dir::Recv)?;
                let n = match rustix::pipe::splice(
                    sock.as_fd(),
                    None,
                    w,
                    None,
                    left.min(CHUNK),
                    SpliceFlags::MOVE,
                ) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(rustix::io::Errno::AGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                    Err(e) => return Err(e.into()),
                };
                // Drain the pipe into the memfd completely before the next
                // socket read, so the pipe never holds bytes across an error.
                let mut in_pipe = n;
                while in_pipe > 0 {
                    match rustix::pipe::splice(
                        r,
                        None,
                        fd,
                        Some(&mut out_off),
                        in_pipe,
                        SpliceFlags::MOVE,
                    ) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(m) => in_pipe -= m,
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => {
                            // The pipe holds unread bytes now: drop it.
                            self.pipe = None;
                            return Err(e.into());
                        }
                    }
                }
                left -= n;
            }
            return Ok(());
        }
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(CHUNK);
            let buf = &mut self.scratch()[..n];
            read_exact_by(sock, buf, deadline)?;
            mem.write_at(offset as usize + done, buf)
                .map_err(io::Error::other)?;
            done += n;
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
        let mut left = len;
        while left > 0 {
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(CHUNK);
            let buf = &mut self.scratch()[..n];
            read_exact_by(sock, buf, deadline)?;
            left -= n as u64;
        }
        Ok(())
    }
}

/// `read_exact` with the deadline re-armed before every read.
fn read_exact_by(sock: &TcpStream, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<()> {
    let mut sock = sock;
    if deadline.is_none() {
        return sock.read_exact(buf);
    }
    let mut done = 0;
    while done < buf.len() {
        arm(sock, deadline, Dir::Recv)?;
        match sock.read(&mut buf[done..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn check(mem: &HostMemory, offset: u64, len: usize) -> io::Result<()> {
    let off = usize::try_from(offset).map_err(|_| io::Error::other("offset overflows usize"))?;
    mem.check(off, len).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn roundtrip(zero_copy: bool, raw_dst: bool) {
        let (a, b) = pair();
        let src = HostMemory::alloc(3 * CHUNK + 17).unwrap();
        for i in 0..src.len() / 4096 {
            src.fill(i * 4096, 4096, (i % 251) as u8).unwrap();
        }
        let dst = if raw_dst {
            let fd = HostMemory::alloc(3 * CHUNK + 17).unwrap();
            // A peer mapping has no memfd of its own: exercises the scratch path.
            HostMemory::map_shared(
                fd.memfd().unwrap().try_clone_to_owned().unwrap(),
                fd.len(),
                true,
            )
            .unwrap()
        } else {
            HostMemory::alloc(3 * CHUNK + 17).unwrap()
        };
        let len = 3 * CHUNK;
        let t = std::thread::spawn(move || {
            let mut io = PayloadIo::new(zero_copy);
            io.send(&a, &src, 17, len, None).unwrap();
            src
        });
        let mut io = PayloadIo::new(zero_copy);
        io.recv(&b, &dst, 5, len, None).unwrap();
        let src = t.join().unwrap();
        assert_eq!(src.to_vec(17, len).unwrap(), dst.to_vec(5, len).unwrap());
        assert_eq!(dst.to_vec(0, 5).unwrap(), vec![0; 5]);
    }

    #[test]
    fn zero_copy_roundtrip_moves_exact_bytes() {
        roundtrip(true, false);
    }

    #[test]
    fn scratch_roundtrip_moves_exact_bytes() {
        roundtrip(false, false);
        roundtrip(true, true);
    }

    #[test]
    fn out_of_bounds_is_refused_before_any_io() {
        let (a, _b) = pair();
        let m = HostMemory::alloc(4096).unwrap();
        let mut io = PayloadIo::new(true);
        assert!(io.send(&a, &m, 4000, 100, None).is_err());
        assert!(io.recv(&a, &m, u64::MAX, 1, None).is_err());
    }
}
