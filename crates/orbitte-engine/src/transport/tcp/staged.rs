//! The tcp target's side of GPU memory a peer may READ and WRITE: a
//! published CUDA registration is served through pinned host bounce
//! buffers (cuda-staging), never by the NIC or by mapping.
//!
//! The serving code asks two things here, whatever range a request names:
//! - [`ReadSource::of`]: the host memory and offset a READ answer's payload
//!   is sent from. For a device range the first piece of the slice is
//!   copied device → host (synchronized) before the answer's header is
//!   encoded, so a failed copy is the answer's status.
//!   [`ReadSource::send`] sends the payload, copying each further piece
//!   before it goes out.
//! - [`receive_write`]: receives a WRITE's payload into the range, or for
//!   a device range into a bounce buffer piece by piece, each piece copied
//!   host → device and synchronized before the next is received; the
//!   status it returns is the answer, so the WRITE is acknowledged only
//!   once every byte is on the device.
//!
//! Bounce memory is bounded per session and never sized by the peer: a
//! session serving a device range holds one bounce buffer of
//! [`BOUNCE_BYTES`] while it serves one request, and a request longer than
//! that (a tcp frame carries up to 16 MiB) moves in pieces of that size.
//! Bounce buffers are kept per device for the next request (at most
//! [`KEPT_IDLE`] idle). A failed device copy answers the request with
//! [`Status::INTERNAL`] and is logged with its cause; when the failure
//! comes after a READ's header went out (a later piece), the answer cannot
//! change any more, so the session is closed with the reason and the
//! initiator's request fails instead of completing.

use std::io;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use orbitte_cuda::{CopyError, CopyStream, CudaBuffer, CudaDevice, PinnedBuffer};
use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_wire::Status;

use super::payload::PayloadIo;
use crate::session::io::FrameBuffer;

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
        })
    }
}

#[derive(Debug)]
struct Bounce {
    pinned: Arc<PinnedBuffer>,
    host: Arc<HostMemory>,
    stream: CopyStream,
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
            stream,
        })
    }
}

/// A bounce buffer taken for one request. [`give_back`](Self::give_back)
/// returns it to its device's idle ones; a copy on it that did not drain
/// leaks it instead (orbitte-cuda retains what such a copy touches, and
/// the buffer is never used again).
#[derive(Debug)]
pub(crate) struct Taken {
    bounce: Bounce,
    owner: Arc<DeviceBounces>,
}

impl Taken {
    /// One synchronized copy of `n` bytes between the bounce buffer's start
    /// and `at` of the range (`up`: host to device). A copy that did not
    /// drain consumes the buffer.
    fn copy(self, range: &DeviceRange, at: usize, n: usize, up: bool) -> Result<Self, String> {
        let b = &self.bounce;
        let r = if up {
            b.stream.upload(&b.pinned, 0, &range.buffer, at, n)
        } else {
            b.stream.download(&range.buffer, at, &b.pinned, 0, n)
        };
        match r {
            Ok(()) => Ok(self),
            Err(e) => {
                if matches!(e, CopyError::NotDrained { .. }) {
                    std::mem::forget(self);
                } else {
                    self.give_back();
                }
                Err(e.to_string())
            }
        }
    }

    fn give_back(self) {
        let mut idle = self.owner.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < KEPT_IDLE {
            idle.push(self.bounce);
        }
    }
}

/// Where a READ answer's payload comes from.
#[derive(Debug)]
pub(crate) enum ReadSource<'a> {
    /// Host memory, sent in place.
    Host {
        memory: &'a HostMemory,
        at: u64,
        len: usize,
    },
    /// A device range: its first `first` bytes are in `taken`'s buffer.
    Device {
        range: &'a DeviceRange,
        taken: Taken,
        at: usize,
        len: usize,
        first: usize,
    },
}

impl<'a> ReadSource<'a> {
    /// The source of `len` bytes at `at` of `memory` (checked against the
    /// range by the caller). For a device range the first piece is copied
    /// to host memory now; `Err`: the answer's status (the cause logged).
    pub(crate) fn of(memory: &'a ServedMemory, at: u64, len: u32) -> Result<Self, Status> {
        let len = len as usize;
        let range = match memory {
            ServedMemory::Host(memory) => return Ok(Self::Host { memory, at, len }),
            ServedMemory::Device(range) => range,
        };
        let at = usize::try_from(at).map_err(|_| Status::OUT_OF_BOUNDS)?;
        let first = len.min(BOUNCE_BYTES);
        let taken = range.bounces.take().map_err(|why| {
            failed(range, "READ", at, len, &why);
            Status::BUSY
        })?;
        let taken = if first == 0 {
            taken
        } else {
            taken.copy(range, at, first, false).map_err(|why| {
                failed(range, "READ", at, len, &why);
                Status::INTERNAL
            })?
        };
        Ok(Self::Device {
            range,
            taken,
            at,
            len,
            first,
        })
    }

    /// Sends `head` and then the payload with `send(head, memory, offset,
    /// len)`, called once per piece (`head` empty after the first). A
    /// device copy that fails after the head went out is an error: the
    /// caller closes the session.
    pub(crate) fn send(
        self,
        head: &[u8],
        mut send: impl FnMut(&[u8], &HostMemory, u64, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        match self {
            Self::Host { memory, at, len } => send(head, memory, at, len),
            Self::Device {
                range,
                mut taken,
                at,
                len,
                first,
            } => {
                send(head, &taken.bounce.host, 0, first)?;
                let mut done = first;
                while done < len {
                    let n = (len - done).min(BOUNCE_BYTES);
                    taken = taken.copy(range, at + done, n, false).map_err(|why| {
                        failed(range, "READ", at, len, &why);
                        io::Error::other(format!(
                            "device copy of a READ answer on range {} failed after its header \
                             was sent: {why}",
                            range.range
                        ))
                    })?;
                    send(&[], &taken.bounce.host, 0, n)?;
                    done += n;
                }
                taken.give_back();
                Ok(())
            }
        }
    }
}

/// A WRITE payload as the serving code receives it.
pub(crate) struct Incoming<'s> {
    pub(crate) stream: &'s TcpStream,
    pub(crate) frames: &'s mut FrameBuffer,
    pub(crate) io: &'s mut PayloadIo,
    /// Encoded answers not sent yet (see `PayloadIo::recv`).
    pub(crate) out: &'s mut Vec<u8>,
    pub(crate) deadline: Option<Instant>,
}

impl Incoming<'_> {
    /// Receives the next `n` payload bytes into `memory` at `at`: those
    /// already buffered, then the rest from the socket.
    fn receive(&mut self, memory: &HostMemory, at: u64, n: usize) -> io::Result<()> {
        let buffered = self.frames.take_payload(n);
        let b = buffered.len();
        usize::try_from(at)
            .map_err(io::Error::other)
            .and_then(|a| memory.write_at(a, buffered).map_err(io::Error::other))?;
        self.frames.payload_received((n - b) as u64);
        self.io.recv(
            self.stream,
            self.frames,
            memory,
            (at + b as u64, n - b),
            self.out,
            self.deadline,
        )
    }

    /// Reads and drops the next `n` payload bytes.
    pub(crate) fn discard(&mut self, n: usize) -> io::Result<()> {
        let b = self.frames.take_payload(n).len();
        self.frames.payload_received((n - b) as u64);
        self.io.discard(self.stream, (n - b) as u64, self.deadline)
    }
}

/// Receives a WRITE's `len` payload bytes into `memory` at `at` (checked
/// against the range by the caller); the status to answer with. A device
/// range's bytes are on the device when it returns `OK`; after a failed
/// device copy the rest of the payload is dropped and the status is
/// `INTERNAL` (the cause logged).
pub(crate) fn receive_write(
    memory: &ServedMemory,
    at: u64,
    len: u32,
    payload: &mut Incoming<'_>,
) -> io::Result<Status> {
    let len = len as usize;
    let range = match memory {
        ServedMemory::Host(memory) => return payload.receive(memory, at, len).map(|()| Status::OK),
        ServedMemory::Device(range) => range,
    };
    let Ok(at) = usize::try_from(at) else {
        return payload.discard(len).map(|()| Status::OUT_OF_BOUNDS);
    };
    let mut taken = match range.bounces.take() {
        Ok(t) => t,
        Err(why) => {
            failed(range, "WRITE", at, len, &why);
            return payload.discard(len).map(|()| Status::BUSY);
        }
    };
    let mut done = 0;
    while done < len {
        let n = (len - done).min(BOUNCE_BYTES);
        payload.receive(&taken.bounce.host, 0, n)?;
        taken = match taken.copy(range, at + done, n, true) {
            Ok(t) => t,
            Err(why) => {
                failed(range, "WRITE", at, len, &why);
                return payload.discard(len - done - n).map(|()| Status::INTERNAL);
            }
        };
        done += n;
    }
    taken.give_back();
    Ok(Status::OK)
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
