//! The tcp target's side of GPU memory a peer may READ and WRITE: a
//! published CUDA registration is served through pinned host bounce
//! buffers (cuda-staging), never by the NIC or by mapping.
//!
//! A session's serving state machine (`serve::Serving`) carries the
//! payload of the request in progress as a value made here, whatever
//! memory the range is; host memory is read and written in place:
//! - [`ReadPayload`]: where a READ answer's payload is sent from. For a
//!   device range the first piece of the slice is copied device → host
//!   (synchronized) when the request is taken, before the answer's header
//!   is encoded, so a failed copy is the answer's status
//!   ([`Status::INTERNAL`], no payload). Once a piece went out and more
//!   remains, the next piece is copied into the same bounce buffer. A
//!   copy that fails then cannot change the answer any more (its header
//!   went out), so the session is closed with the reason and the
//!   initiator's request fails instead of completing.
//! - [`WritePayload`]: where a WRITE's payload is received. For a device
//!   range it goes into a bounce buffer, and each full piece is copied
//!   host → device and synchronized before more is received. After a
//!   failed copy the rest of the payload is read and dropped and the
//!   WRITE is answered [`Status::INTERNAL`]; it is answered `OK` only once
//!   every byte is on the device.
//!
//! Bounce memory is bounded per session and never sized by the peer: a
//! session holds one bounce buffer of [`BOUNCE_BYTES`] while it serves one
//! request on a device range (none otherwise), and a longer request (a tcp
//! frame carries up to 16 MiB) moves in pieces of that size. The buffer
//! goes back to its device's idle ones (at most [`KEPT_IDLE`] kept) when
//! the request ends or the session closes, unless a copy on it did not
//! drain. Every failed device copy is logged with its cause.
//!
//! The device copies are synchronous and run on the I/O loop thread that
//! serves the session: each piece (1 MiB at most) holds that loop, and the
//! other sessions on it, for one copy and its synchronization.

use std::io;
use std::sync::{Arc, Mutex};

use orbitte_cuda::{CopyError, CopyStream, CudaBuffer, CudaDevice, PinnedBuffer};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_wire::Status;

use super::payload::span;

/// Bytes of one bounce buffer: the most bounce memory one session holds.
pub(crate) const BOUNCE_BYTES: usize = 1 << 20;

/// Idle bounce buffers a device keeps for the next request.
pub(crate) const KEPT_IDLE: usize = 8;

/// The memory behind a published range.
#[derive(Debug, Clone)]
pub enum ServedMemory {
    /// Host memory, read and written in place (and mapped by same-host
    /// peers when mappable).
    Host(Arc<HostMemory>),
    /// CUDA device memory, staged through host memory by the tcp target.
    Device(Arc<DeviceRange>),
}

/// A published CUDA registration as the tcp target serves it.
#[derive(Debug)]
pub struct DeviceRange {
    range: u64,
    buffer: Arc<CudaBuffer>,
    bounces: Arc<DeviceBounces>,
}

impl DeviceRange {
    /// Registration `range` over `buffer`, staged through `bounces` (of
    /// the buffer's device).
    pub(crate) fn new(range: u64, buffer: Arc<CudaBuffer>, bounces: Arc<DeviceBounces>) -> Self {
        Self {
            range,
            buffer,
            bounces,
        }
    }

    /// The device buffer.
    pub fn buffer(&self) -> &Arc<CudaBuffer> {
        &self.buffer
    }
}

/// The idle bounce buffers of one CUDA device's served ranges.
#[derive(Debug)]
pub(crate) struct DeviceBounces {
    device: CudaDevice,
    idle: Mutex<Vec<Bounce>>,
}

impl DeviceBounces {
    /// None yet on `device`: they are made by the first request served.
    pub(crate) fn new(device: CudaDevice) -> Arc<Self> {
        Arc::new(Self {
            device,
            idle: Mutex::new(Vec::new()),
        })
    }

    fn take(self: &Arc<Self>) -> Result<Taken, String> {
        let kept = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let bounce = match kept {
            Some(b) => b,
            None => Bounce::alloc(&self.device)?,
        };
        Ok(Taken {
            bounce,
            owner: self.clone(),
            reusable: true,
        })
    }
}

#[derive(Debug, Clone)]
struct Bounce {
    pinned: Arc<PinnedBuffer>,
    host: Arc<HostMemory>,
    stream: Arc<CopyStream>,
}

impl Bounce {
    fn alloc(device: &CudaDevice) -> Result<Self, String> {
        let pinned = PinnedBuffer::alloc(device, BOUNCE_BYTES)
            .map_err(|e| format!("cannot allocate a {BOUNCE_BYTES}-byte bounce buffer: {e}"))?;
        let host = HostMemory::from_dma_buffer(pinned.clone() as Arc<dyn DmaBuffer>)
            .map_err(|e| format!("cannot use the bounce buffer as host memory: {e}"))?;
        let stream = CopyStream::new(device)
            .map_err(|e| format!("cannot make a copy stream for the bounce buffer: {e}"))?;
        Ok(Self {
            pinned,
            host,
            stream: Arc::new(stream),
        })
    }
}

/// A bounce buffer taken for one request. Dropping it gives it back to its
/// device's idle ones, unless a copy on it did not drain: orbitte-cuda
/// then retains what the copy touches, and the buffer is never used again.
#[derive(Debug)]
struct Taken {
    bounce: Bounce,
    owner: Arc<DeviceBounces>,
    /// False once a copy on it did not drain.
    reusable: bool,
}

/// Which way a device copy goes.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// Host to device (a WRITE's piece).
    Up,
    /// Device to host (a READ answer's piece).
    Down,
}

impl Taken {
    /// One synchronized copy of `n` bytes between the bounce buffer's start
    /// and `at` of the range.
    fn copy(&mut self, range: &DeviceRange, at: usize, n: usize, way: Way) -> Result<(), String> {
        let b = &self.bounce;
        let r = match way {
            Way::Up => b.stream.upload(&b.pinned, 0, &range.buffer, at, n),
            Way::Down => b.stream.download(&range.buffer, at, &b.pinned, 0, n),
        };
        r.map_err(|e| {
            if matches!(e, CopyError::NotDrained { .. }) {
                self.reusable = false;
            }
            e.to_string()
        })
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if !self.reusable {
            return;
        }
        let mut idle = self.owner.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < KEPT_IDLE {
            idle.push(self.bounce.clone());
        }
    }
}

/// One request's slice of a device range moving through a bounce buffer,
/// a piece at a time.
#[derive(Debug)]
pub(crate) struct Staged {
    range: Arc<DeviceRange>,
    bounce: Taken,
    /// Where the slice starts in the range's buffer, and its length.
    at: usize,
    len: usize,
    /// Bytes of the slice before the piece in the bounce buffer.
    done: usize,
    /// The piece: the bounce buffer's first `piece` bytes, of which
    /// `moved` were sent (READ) or received (WRITE).
    ///
    /// Invariant: `moved <= piece <= BOUNCE_BYTES` and `done + piece <= len`.
    piece: usize,
    moved: usize,
}

impl Staged {
    /// A bounce buffer for `len` bytes at `at` of `range` (`op` names the
    /// request in the log); `Err`: the answer's status.
    fn take(range: &Arc<DeviceRange>, op: &str, at: u64, len: u32) -> Result<Self, Status> {
        let len = len as usize;
        let at = usize::try_from(at).map_err(|_| Status::OUT_OF_BOUNDS)?;
        let bounce = range.bounces.take().map_err(|why| {
            failed(range, op, at, len, &why);
            Status::BUSY
        })?;
        Ok(Self {
            range: range.clone(),
            bounce,
            at,
            len,
            done: 0,
            piece: len.min(BOUNCE_BYTES),
            moved: 0,
        })
    }

    /// Copies the piece between the bounce buffer and the device.
    fn copy(&mut self, op: &str, way: Way) -> Result<(), String> {
        let at = self.at + self.done;
        self.bounce
            .copy(&self.range, at, self.piece, way)
            .inspect_err(|why| failed(&self.range, op, self.at, self.len, why))
    }

    /// The next piece follows the one just moved; `false`: none is left.
    fn step(&mut self) -> bool {
        self.done += self.piece;
        self.moved = 0;
        self.piece = (self.len - self.done).min(BOUNCE_BYTES);
        self.piece > 0
    }
}

/// Where a READ answer's payload comes from, and how far it went.
#[derive(Debug)]
pub(crate) enum ReadPayload {
    /// Host memory, sent in place: its bytes `off..end`, of a payload of
    /// `whole` bytes.
    Host {
        memory: Arc<HostMemory>,
        off: usize,
        end: usize,
        whole: usize,
    },
    /// A device range, sent from a bounce buffer.
    Device(Staged),
}

impl ReadPayload {
    /// The payload of a READ of `len` bytes at `at` of `memory` (checked
    /// against the range by the caller). For a device range the first piece
    /// is copied to host memory now; `Err`: the answer's status (the cause
    /// logged).
    pub(crate) fn of(memory: &ServedMemory, at: u64, len: u32) -> Result<Self, Status> {
        let range = match memory {
            ServedMemory::Host(memory) => {
                let (off, end) =
                    span(memory, at, len as usize).map_err(|_| Status::OUT_OF_BOUNDS)?;
                return Ok(Self::Host {
                    memory: memory.clone(),
                    off,
                    end,
                    whole: len as usize,
                });
            }
            ServedMemory::Device(range) => range,
        };
        let mut staged = Staged::take(range, "READ", at, len)?;
        if staged.piece > 0 {
            staged
                .copy("READ", Way::Down)
                .map_err(|_| Status::INTERNAL)?;
        }
        Ok(Self::Device(staged))
    }

    /// What goes out next: host memory, its bytes `off..end`, and the
    /// length of the payload (or piece) they belong to.
    pub(crate) fn unsent(&self) -> (&HostMemory, (usize, usize), usize) {
        match self {
            Self::Host {
                memory,
                off,
                end,
                whole,
            } => (memory, (*off, *end), *whole),
            Self::Device(s) => (&s.bounce.bounce.host, (s.moved, s.piece), s.piece),
        }
    }

    /// `n` bytes of [`unsent`](Self::unsent) went out.
    pub(crate) fn sent(&mut self, n: usize) {
        match self {
            Self::Host { off, .. } => *off += n,
            Self::Device(s) => s.moved += n,
        }
    }

    /// Whether what [`unsent`](Self::unsent) names all went.
    pub(crate) fn piece_sent(&self) -> bool {
        let (_, (off, end), _) = self.unsent();
        off == end
    }

    /// Once [`piece_sent`](Self::piece_sent): `Ok(true)` when the next
    /// piece was copied into the bounce buffer and waits to go,
    /// `Ok(false)` when the whole payload went. `Err`: that copy failed
    /// after the answer's header went out, the reason to close the session.
    pub(crate) fn next_piece(&mut self) -> Result<bool, String> {
        let Self::Device(s) = self else {
            return Ok(false);
        };
        if !s.step() {
            return Ok(false);
        }
        s.copy("READ", Way::Down).map_err(|why| {
            format!(
                "device copy of a READ answer's next piece on GPU range {} failed after its \
                 header was sent, so the answer cannot say so: {why}",
                s.range.range
            )
        })?;
        Ok(true)
    }
}

/// What became of the WRITE payload bytes handed to a [`WritePayload`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landed {
    /// Taken; more of the payload is awaited.
    More,
    /// The whole payload is in the range (on the device, for GPU memory).
    All,
    /// A device copy failed (logged): the rest of the payload, `left`
    /// bytes still in the socket, is to be read and dropped, and the WRITE
    /// answered [`Status::INTERNAL`].
    Failed { left: u64 },
}

/// Where a WRITE's payload goes, and how much of it came.
#[derive(Debug)]
pub(crate) enum WritePayload {
    /// Host memory, written in place: its bytes `off..end` are still to
    /// come.
    Host {
        memory: Arc<HostMemory>,
        off: usize,
        end: usize,
    },
    /// A device range, received into a bounce buffer.
    Device(Staged),
}

impl WritePayload {
    /// Where a WRITE of `len` bytes at `at` of `memory` (checked against
    /// the range by the caller) lands; `Err`: the answer's status (the
    /// cause logged).
    pub(crate) fn of(memory: &ServedMemory, at: u64, len: u32) -> Result<Self, Status> {
        match memory {
            ServedMemory::Host(memory) => {
                let (off, end) =
                    span(memory, at, len as usize).map_err(|_| Status::OUT_OF_BOUNDS)?;
                Ok(Self::Host {
                    memory: memory.clone(),
                    off,
                    end,
                })
            }
            ServedMemory::Device(range) => Staged::take(range, "WRITE", at, len).map(Self::Device),
        }
    }

    /// Takes the payload bytes that came in with the request's header
    /// (received before the payload was asked for).
    pub(crate) fn buffered(&mut self, mut bytes: &[u8]) -> io::Result<Landed> {
        if self.is_complete() {
            return Ok(Landed::All);
        }
        while !bytes.is_empty() {
            let (memory, (off, end), _) = self.room();
            let n = bytes.len().min(end - off);
            memory
                .write_at(off, &bytes[..n])
                .map_err(io::Error::other)?;
            bytes = &bytes[n..];
            match self.received(n) {
                Landed::More => {}
                Landed::All => break,
                Landed::Failed { left } => {
                    return Ok(Landed::Failed {
                        left: left - bytes.len() as u64,
                    });
                }
            }
        }
        Ok(if self.is_complete() {
            Landed::All
        } else {
            Landed::More
        })
    }

    /// Where the next payload bytes from the socket go: host memory and
    /// its bytes `off..end`, and whether the payload ends at `end` (what
    /// follows it in the stream is the next frame).
    pub(crate) fn room(&self) -> (&HostMemory, (usize, usize), bool) {
        match self {
            Self::Host { memory, off, end } => (memory, (*off, *end), true),
            Self::Device(s) => (
                &s.bounce.bounce.host,
                (s.moved, s.piece),
                s.done + s.piece == s.len,
            ),
        }
    }

    /// `n` bytes arrived in [`room`](Self::room); a full piece is copied to
    /// the device (synchronized) before this returns.
    pub(crate) fn received(&mut self, n: usize) -> Landed {
        match self {
            Self::Host { off, end, .. } => {
                *off += n;
                if *off == *end {
                    Landed::All
                } else {
                    Landed::More
                }
            }
            Self::Device(s) => {
                s.moved += n;
                if s.moved < s.piece {
                    return Landed::More;
                }
                if s.piece > 0 && s.copy("WRITE", Way::Up).is_err() {
                    return Landed::Failed {
                        left: (s.len - s.done - s.piece) as u64,
                    };
                }
                if s.step() { Landed::More } else { Landed::All }
            }
        }
    }

    /// Whether every byte is in the range (on the device, for GPU memory).
    pub(crate) fn is_complete(&self) -> bool {
        match self {
            Self::Host { off, end, .. } => off == end,
            Self::Device(s) => s.done == s.len,
        }
    }
}

fn failed(range: &DeviceRange, op: &str, at: usize, len: usize, why: &str) {
    tracing::warn!(
        range = range.range,
        device = range.bounces.device.index(),
        offset = at,
        len,
        "cuda-staging: served {op} on GPU memory (staged through host memory) failed: {why}"
    );
}
