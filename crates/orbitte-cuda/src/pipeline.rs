//! The chunked, double-buffered staging pipeline.
//!
//! Two pinned bounce buffers, each with its own stream. A download copies
//! chunk `k + 1` from the device while the caller's handler works on chunk
//! `k` (posting it to a NIC, writing it to a socket); an upload copies chunk
//! `k - 1` to the device while the handler fills chunk `k`. Every chunk is
//! synchronized before it is handed on (download) or counted as landed
//! (upload), and every operation drains both streams before it returns, on
//! success, on error and on unwinding. A failed drain makes the pipeline
//! *unquiesced*: its buffers are retained forever and it refuses new work.

use std::fmt;
use std::sync::Arc;

use crate::buffer::CudaBuffer;
use crate::copy::{CopyError, CopyStream, Direction, retain_forever};
use crate::device::{CudaDevice, DeviceError};
use crate::error::{RangeError, check_range};
use crate::pinned::{PinnedBuffer, PinnedError};

/// Chunk size when none is given: 4 MiB, large enough to run the copy
/// engine near its peak, small enough that the first chunk is handed on
/// quickly.
pub const DEFAULT_CHUNK_SIZE: usize = 4 << 20;

/// Why a pipeline could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The driver or device is unusable.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A bounce buffer could not be pinned.
    #[error(transparent)]
    Pinned(#[from] PinnedError),
    /// A zero chunk size.
    #[error("zero staging chunk size: use at least one byte (the default is 4 MiB)")]
    ZeroChunk,
}

/// What stopped a staging operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingFailure<E> {
    /// The caller's handler returned an error for the chunk at `offset`.
    #[error("the handler failed on the chunk at offset {offset}: {source}")]
    Handler {
        /// Offset of the chunk, relative to the start of the operation.
        offset: usize,
        /// The handler's error.
        source: E,
    },
    /// A copy failed, or a range was out of bounds.
    #[error(transparent)]
    Copy(#[from] CopyError),
    /// An earlier operation did not drain.
    #[error(
        "staging pipeline is unquiesced: an earlier copy did not drain ({0}); drop it (its \
         buffers stay retained) and make a new one"
    )]
    Unquiesced(CopyError),
}

/// A failed staging operation, with what is known to be done.
#[derive(Debug, thiserror::Error)]
#[error(
    "staging {direction} failed after a completed prefix of {completed} bytes ({}): {failure}",
    if *drained { "drained" } else { "NOT drained: buffers retained" }
)]
pub struct StagingError<E> {
    /// "download" (device to host) or "upload" (host to device).
    pub direction: &'static str,
    /// The completed prefix: bytes handed to the handler (download) or
    /// known to have landed in device memory (upload), from the start of
    /// the operation, contiguous.
    pub completed: usize,
    /// Whether every copy had finished when the error was returned. When
    /// false, an upload may have written device bytes past `completed`
    /// (a possible effect), and the pipeline is unquiesced.
    pub drained: bool,
    /// What went wrong.
    pub failure: StagingFailure<E>,
}

/// A finished staging operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingReport {
    /// Bytes moved (the whole requested length).
    pub bytes: usize,
    /// Chunks it took.
    pub chunks: usize,
}

/// One chunk in a bounce buffer, as the handler sees it.
///
/// For a download the device bytes have already arrived (the copy is
/// synchronized); for an upload the handler must put exactly
/// [`len`](Self::len) bytes at [`buffer_offset`](Self::buffer_offset) of
/// [`buffer`](Self::buffer) before returning. The handler has the chunk to
/// itself until it returns: a NIC may read or write it (the buffer is a
/// [`DmaBuffer`](orbitte_memory::DmaBuffer)), but must be done by then.
#[derive(Debug)]
pub struct StagedChunk<'a> {
    buffer: &'a Arc<PinnedBuffer>,
    index: usize,
    offset: usize,
    device_offset: usize,
    len: usize,
}

impl StagedChunk<'_> {
    /// Chunk number, from 0.
    pub fn index(&self) -> usize {
        self.index
    }
    /// Offset from the start of the operation.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Offset in the device buffer.
    pub fn device_offset(&self) -> usize {
        self.device_offset
    }
    /// Bytes in this chunk (the chunk size, or less for the last one).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: empty chunks are never handed out.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bounce buffer holding the chunk (register it with a NIC once to
    /// post RDMA straight from or into it).
    pub fn buffer(&self) -> &Arc<PinnedBuffer> {
        self.buffer
    }
    /// Where the chunk starts in [`buffer`](Self::buffer).
    pub fn buffer_offset(&self) -> usize {
        0
    }
    /// Copies the chunk's first `dst.len()` bytes out (at most `len`).
    pub fn read_into(&self, dst: &mut [u8]) -> Result<(), RangeError> {
        check_range("staged chunk", 0, dst.len(), self.len)?;
        self.buffer.read_at(self.buffer_offset(), dst)
    }
    /// Copies the chunk into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // In range by construction: the chunk lies inside its buffer.
        if self.buffer.read_at(self.buffer_offset(), &mut v).is_err() {
            v.clear();
        }
        v
    }
    /// Puts `src` at the start of the chunk (at most `len` bytes).
    pub fn write_from(&self, src: &[u8]) -> Result<(), RangeError> {
        check_range("staged chunk", 0, src.len(), self.len)?;
        self.buffer.write_at(self.buffer_offset(), src)
    }
}

#[derive(Debug)]
struct Slot {
    buffer: Arc<PinnedBuffer>,
    stream: CopyStream,
}

/// Chunked, double-buffered staging between one device's memory and the
/// host (see the module docs for the order of events).
///
/// One operation at a time (`&mut self`); make one pipeline per concurrent
/// transfer stream. The bounce buffers are allocated once, in
/// [`new`](Self::new), and reused.
pub struct StagingPipeline {
    device: CudaDevice,
    chunk_size: usize,
    slots: [Slot; 2],
    /// Invariant: once set, never cleared; the bounce buffers and the
    /// device buffer of the failed operation have been retained forever.
    unquiesced: Option<CopyError>,
    /// Test builds only: skip the wait on each chunk's copy (see
    /// [`omit_chunk_waits`](Self::omit_chunk_waits)).
    #[cfg(feature = "testing")]
    omit_chunk_waits: bool,
}

impl StagingPipeline {
    /// Makes a pipeline on `device` with two pinned bounce buffers of
    /// `chunk_size` bytes and two streams.
    pub fn new(device: &CudaDevice, chunk_size: usize) -> Result<Self, PipelineError> {
        if chunk_size == 0 {
            return Err(PipelineError::ZeroChunk);
        }
        let slot = || -> Result<Slot, PipelineError> {
            Ok(Slot {
                buffer: PinnedBuffer::alloc(device, chunk_size)?,
                stream: CopyStream::new(device)?,
            })
        };
        Ok(Self {
            device: device.clone(),
            chunk_size,
            slots: [slot()?, slot()?],
            unquiesced: None,
            #[cfg(feature = "testing")]
            omit_chunk_waits: false,
        })
    }

    /// Feature `testing` only, never in a production build: with `true`
    /// the pipeline leaves out the wait on each chunk's copy (a download
    /// hands the chunk on without waiting for its copy, an upload refills a
    /// bounce buffer without waiting for its previous copy); the final
    /// drain stays. Tests use it to show that their checks catch a missing
    /// synchronization.
    #[cfg(feature = "testing")]
    pub fn omit_chunk_waits(&mut self, omit: bool) {
        self.omit_chunk_waits = omit;
    }

    /// Whether each chunk's copy is waited for before the chunk is handed
    /// on or its bounce buffer refilled (always, outside test builds).
    fn waits_each_chunk(&self) -> bool {
        #[cfg(feature = "testing")]
        return !self.omit_chunk_waits;
        #[cfg(not(feature = "testing"))]
        true
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The two bounce buffers, for registering them with NICs once.
    pub fn bounce_buffers(&self) -> [Arc<PinnedBuffer>; 2] {
        [self.slots[0].buffer.clone(), self.slots[1].buffer.clone()]
    }

    /// Whether an earlier operation failed to drain (the pipeline then
    /// refuses work).
    pub fn is_unquiesced(&self) -> bool {
        self.unquiesced.is_some()
    }

    /// Whether no copy is outstanding on either stream (the drain check).
    pub fn is_drained(&self) -> Result<bool, CopyError> {
        Ok(self.slots[0].stream.is_idle()? && self.slots[1].stream.is_idle()?)
    }

    /// Moves `len` bytes of `src` from `offset` to the host, chunk by
    /// chunk, calling `deliver` on each chunk in order once its copy has
    /// completed; the copy of the next chunk runs while `deliver` works.
    ///
    /// On error, the completed prefix is the bytes `deliver` accepted.
    pub fn download<E, F>(
        &mut self,
        src: &Arc<CudaBuffer>,
        offset: usize,
        len: usize,
        mut deliver: F,
    ) -> Result<StagingReport, StagingError<E>>
    where
        F: FnMut(&StagedChunk<'_>) -> Result<(), E>,
    {
        let wait = self.waits_each_chunk();
        self.stage("download", src, offset, len, |run, chunks, completed| {
            for k in 0..chunks.min(2) {
                run.issue(Direction::DeviceToHost, k)?;
            }
            for k in 0..chunks {
                if wait {
                    run.wait(k)?;
                }
                deliver(&run.chunk(k)).map_err(|source| StagingFailure::Handler {
                    offset: run.start(k),
                    source,
                })?;
                *completed += run.chunk_len(k);
                if k + 2 < chunks {
                    run.issue(Direction::DeviceToHost, k + 2)?;
                }
            }
            Ok(())
        })
    }

    /// Moves `len` bytes from the host into `dst` at `offset`, chunk by
    /// chunk: `fill` puts each chunk's bytes into the bounce buffer, then its
    /// copy to the device starts while `fill` works on the next chunk.
    /// Returns once every byte has landed in device memory.
    ///
    /// On error, the completed prefix is the bytes known to have landed.
    pub fn upload<E, F>(
        &mut self,
        dst: &Arc<CudaBuffer>,
        offset: usize,
        len: usize,
        mut fill: F,
    ) -> Result<StagingReport, StagingError<E>>
    where
        F: FnMut(&StagedChunk<'_>) -> Result<(), E>,
    {
        let wait = self.waits_each_chunk();
        self.stage("upload", dst, offset, len, |run, chunks, completed| {
            for k in 0..chunks {
                if k >= 2 {
                    // The slot's previous copy (chunk k - 2) must land before
                    // the slot is refilled; chunks land in order.
                    if wait {
                        run.wait(k - 2)?;
                    }
                    *completed += run.chunk_len(k - 2);
                }
                fill(&run.chunk(k)).map_err(|source| StagingFailure::Handler {
                    offset: run.start(k),
                    source,
                })?;
                run.issue(Direction::HostToDevice, k)?;
            }
            for k in chunks.saturating_sub(2)..chunks {
                run.wait(k)?;
                *completed += run.chunk_len(k);
            }
            Ok(())
        })
    }

    /// What both directions share around their chunk schedule: the span,
    /// admission, the [`Run`], and the drain and result of [`finish`].
    /// `schedule` gets the run, the chunk count and the completed prefix to
    /// advance.
    fn stage<E>(
        &mut self,
        direction: &'static str,
        buf: &Arc<CudaBuffer>,
        offset: usize,
        len: usize,
        schedule: impl FnOnce(&mut Run<'_>, usize, &mut usize) -> Result<(), StagingFailure<E>>,
    ) -> Result<StagingReport, StagingError<E>> {
        let span = tracing::debug_span!(
            "staging",
            direction,
            device = self.device.index(),
            offset,
            len
        );
        let _entered = span.enter();
        self.admit(direction, buf, offset, len)?;
        let chunks = len.div_ceil(self.chunk_size);
        let mut run = Run::new(
            &self.slots,
            &mut self.unquiesced,
            buf,
            self.chunk_size,
            offset,
            len,
        );
        let mut completed = 0;
        let outcome = schedule(&mut run, chunks, &mut completed);
        finish(
            direction,
            run,
            outcome,
            completed,
            StagingReport { bytes: len, chunks },
        )
    }

    /// Checks that the pipeline and the range can be used.
    fn admit<E>(
        &self,
        direction: &'static str,
        buf: &CudaBuffer,
        offset: usize,
        len: usize,
    ) -> Result<(), StagingError<E>> {
        let fail = |failure| StagingError {
            direction,
            completed: 0,
            drained: true,
            failure,
        };
        if let Some(e) = &self.unquiesced {
            return Err(StagingError {
                direction,
                completed: 0,
                drained: false,
                failure: StagingFailure::Unquiesced(e.clone()),
            });
        }
        if buf.device().index() != self.device.index() {
            return Err(fail(StagingFailure::Copy(CopyError::WrongDevice {
                buffer_device: buf.device().index(),
                stream_device: self.device.index(),
            })));
        }
        buf.check(offset, len)
            .map_err(|e| fail(StagingFailure::Copy(e.into())))
    }
}

/// Drains, and turns the outcome into the result (a failed drain has made
/// the pipeline unquiesced).
fn finish<E>(
    direction: &'static str,
    mut run: Run<'_>,
    outcome: Result<(), StagingFailure<E>>,
    completed: usize,
    report: StagingReport,
) -> Result<StagingReport, StagingError<E>> {
    let drain = run.drain();
    let issued = run.issued_bytes();
    drop(run);
    let failure = match (outcome, &drain) {
        (Ok(()), Ok(())) => return Ok(report),
        (Err(failure), _) => failure,
        (Ok(()), Err(e)) => StagingFailure::Copy(e.clone()),
    };
    let drained = drain.is_ok();
    // An upload that stopped for any reason but a failed copy: once drained,
    // every issued chunk has landed, and issued chunks form a prefix.
    let copy_failed = matches!(failure, StagingFailure::Copy(CopyError::NotDrained { .. }));
    let completed = if direction == "upload" && drained && !copy_failed {
        issued
    } else {
        completed
    };
    Err(StagingError {
        direction,
        completed,
        drained,
        failure,
    })
}

impl fmt::Debug for StagingPipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingPipeline")
            .field("device", &self.device.index())
            .field("chunk_size", &self.chunk_size)
            .field("unquiesced", &self.unquiesced.is_some())
            .finish()
    }
}

/// One operation in flight: issues copies and, whatever happens (even a
/// panic in the handler), drains both streams before the borrows end; if
/// the drain fails, retains the buffers forever.
struct Run<'p> {
    slots: &'p [Slot; 2],
    /// The pipeline's unquiesced state, set if a drain fails.
    unquiesced: &'p mut Option<CopyError>,
    device_buf: Arc<CudaBuffer>,
    chunk_size: usize,
    base: usize,
    len: usize,
    /// Chunks issued so far (they are issued in order).
    issued: usize,
    /// Set once drained (or the buffers were retained).
    settled: bool,
}

impl<'p> Run<'p> {
    fn new(
        slots: &'p [Slot; 2],
        unquiesced: &'p mut Option<CopyError>,
        buf: &Arc<CudaBuffer>,
        chunk_size: usize,
        base: usize,
        len: usize,
    ) -> Self {
        Self {
            slots,
            unquiesced,
            device_buf: buf.clone(),
            chunk_size,
            base,
            len,
            issued: 0,
            settled: false,
        }
    }

    fn start(&self, k: usize) -> usize {
        k * self.chunk_size
    }

    fn chunk_len(&self, k: usize) -> usize {
        self.chunk_size.min(self.len - self.start(k))
    }

    fn issued_bytes(&self) -> usize {
        (self.issued * self.chunk_size).min(self.len)
    }

    fn chunk(&self, k: usize) -> StagedChunk<'p> {
        StagedChunk {
            buffer: &self.slots[k % 2].buffer,
            index: k,
            offset: self.start(k),
            device_offset: self.base + self.start(k),
            len: self.chunk_len(k),
        }
    }

    fn issue(&mut self, dir: Direction, k: usize) -> Result<(), CopyError> {
        let slot = &self.slots[k % 2];
        // The Run holds the device buffer and borrows the pipeline holding
        // the bounce buffer; it drains (or retains all buffers) before drop.
        // SAFETY: so both outlive the copy; the slot goes to no handler before `wait(k)`.
        unsafe {
            slot.stream.enqueue(
                dir,
                &self.device_buf,
                self.base + self.start(k),
                &slot.buffer,
                0,
                self.chunk_len(k),
            )
        }?;
        self.issued = k + 1;
        Ok(())
    }

    fn wait(&self, k: usize) -> Result<(), CopyError> {
        self.slots[k % 2].stream.synchronize()
    }

    /// Waits for both streams (once). On failure every buffer is retained
    /// forever and the pipeline becomes unquiesced.
    fn drain(&mut self) -> Result<(), CopyError> {
        self.settled = true;
        let a = self.slots[0].stream.synchronize();
        let b = self.slots[1].stream.synchronize();
        let result = a.and(b);
        if let Err(cause) = &result {
            retain_forever(&self.device_buf);
            retain_forever(&self.slots[0].buffer);
            retain_forever(&self.slots[1].buffer);
            tracing::error!(error = %cause, "staging copies did not drain; pipeline unquiesced, buffers retained");
            self.unquiesced.get_or_insert_with(|| cause.clone());
        }
        result
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        if !self.settled {
            // Unwinding out of a handler: drain before the borrows end.
            let _ = self.drain();
        }
    }
}
