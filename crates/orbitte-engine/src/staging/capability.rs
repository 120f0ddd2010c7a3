//! The CUDA rows of the capability matrix: `cuda-staging` evaluated
//! through the engine, `gpudirect-rdma`, `cuda-ipc` and `nvlink` not
//! implemented.
//!
//! The `cuda-staging` checks:
//! - **build**: compiled in (orbitte-cuda, libcuda loaded at run time);
//! - **discovery**: the driver loads and the device exists (name, PCI bus
//!   id); skipped without a driver ("no CUDA driver (libcuda.so.1 not
//!   found)") or without a device;
//! - **completion**: a real round trip GPU → remote → GPU *through the
//!   engine*: a staged WRITE of [`LOOPBACK_BYTES`] from GPU memory to a
//!   scratch range of a loopback peer, a staged READ of it back into
//!   another GPU range, bytes compared. Without a loopback peer range it is
//!   skipped: orbitte-cuda's device-only round trip (host → device → host,
//!   no network) is reported as a note, never as this check;
//! - **drain**: both staged requests drained (pipeline streams idle, no
//!   engine request outstanding on the bounce buffers) and the pool idle.
//!
//! Every row carries the scope docs/cuda.md states in its notes: a small CUDA compute
//! probe succeeding proves nothing about any transport path.

use std::sync::Arc;

use orbitte_cuda::{self as cuda, CudaBuffer, CudaDevice, StagingPipeline};

use crate::capability::{CapabilityMatrix, Check, PathRow};
use crate::engine::{TransferEngine, TransferRequest};
use crate::outcome::{DrainStatus, Outcome};
use crate::registration::Access;
use crate::transport::{PathKind, PeerId, RangeId};

/// Bytes the completion check moves each way.
pub const LOOPBACK_BYTES: u64 = 256 << 10;
/// Chunk size of the device-only copies that fill and read back the GPU
/// memory of the completion check (the staged requests use the engine's
/// [`StagingConfig`](super::StagingConfig) chunk).
pub const LOOPBACK_CHUNK: usize = 64 << 10;

/// A scratch range of a loopback peer (another engine on this host, opened
/// by this one) for the completion check. Its bytes at
/// `offset..offset + LOOPBACK_BYTES` are overwritten; it must allow remote
/// READ and WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackTarget {
    /// The loopback peer.
    pub peer: PeerId,
    /// Its scratch range.
    pub range: RangeId,
    /// Where in the range.
    pub offset: u64,
}

/// The CUDA rows. Each row's notes say what its checks saw, why a path is
/// not implemented, and [`COMPUTE_PROBE_CAVEAT`](super::COMPUTE_PROBE_CAVEAT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaCapability {
    /// `cuda-staging`, `gpudirect-rdma`, `cuda-ipc`, `nvlink`.
    pub rows: Vec<PathRow>,
}

impl CudaCapability {
    /// Puts the rows into a matrix (replacing the baseline rows).
    pub fn contribute_to(&self, matrix: &mut CapabilityMatrix) {
        for row in &self.rows {
            matrix.contribute(row.clone());
        }
    }

    /// The row of a path.
    pub fn row(&self, path: PathKind) -> Option<&PathRow> {
        self.rows.iter().find(|r| r.path == path)
    }

    fn row_mut(&mut self, path: PathKind) -> Option<&mut PathRow> {
        self.rows.iter_mut().find(|r| r.path == path)
    }
}

/// Contributes the CUDA rows of device 0 without the engine round trip
/// (see [`cuda_rows`]) to `matrix`: what
/// [`TransferEngine::capabilities`] shows.
pub fn contribute_cuda_rows(matrix: &mut CapabilityMatrix) {
    cuda_rows(0).contribute_to(matrix);
}

fn kind(name: &str) -> Option<PathKind> {
    PathKind::ALL.into_iter().find(|p| p.name() == name)
}

/// Converts a check of orbitte-cuda's probe, keeping its detail as a note.
fn convert(path: &str, what: &str, c: &cuda::Check, notes: &mut Vec<String>) -> Check {
    match c {
        cuda::Check::Pass { detail } => {
            notes.push(format!("{path} {what}: {detail}"));
            Check::Pass
        }
        cuda::Check::Fail { reason, fix } => Check::Fail {
            reason: reason.clone(),
            fix: fix.clone(),
        },
        cuda::Check::Skipped { why } => Check::Skipped { why: why.clone() },
        cuda::Check::NotImplemented { note } => {
            // Build and discovery of a path that does not exist say the
            // same thing: note it once.
            let note = format!("{path}: not implemented: {note}");
            if !notes.contains(&note) {
                notes.push(note);
            }
            Check::NotImplemented
        }
    }
}

const NO_TARGET: &str = "no loopback peer range given: the completion check is a GPU -> remote -> \
     GPU round trip through the engine (evaluate_cuda_staging with a LoopbackTarget)";

/// The CUDA rows without the engine round trip: build and discovery of
/// `cuda-staging` from orbitte-cuda's probe of device `device`, completion
/// and drain skipped (the probe's device-only round trip moves no bytes
/// over any transport and is kept as a note), the three other paths not
/// implemented. Never panics; without a driver discovery says
/// "no CUDA driver (libcuda.so.1 not found)".
pub fn cuda_rows(device: usize) -> CudaCapability {
    let mut rows = Vec::new();
    for r in cuda::probe_device(device) {
        let mut notes = Vec::new();
        let Some(path) = kind(r.path) else { continue };
        let name = r.path;
        let mut row = PathRow {
            path,
            build: convert(name, "build", &r.build, &mut notes),
            discovery: convert(name, "discovery", &r.discovery, &mut notes),
            completion: Check::NotImplemented,
            drain: Check::NotImplemented,
            notes: Vec::new(),
        };
        if path == PathKind::CudaStaging {
            let skip = if row.discovery.is_pass() {
                NO_TARGET.to_owned()
            } else {
                "discovery did not pass".to_owned()
            };
            if r.completion.is_pass() {
                notes.push(format!(
                    "{name}: device-only round trip (no network, not the completion check): {}",
                    r.completion
                ));
            }
            row.completion = Check::Skipped { why: skip.clone() };
            row.drain = Check::Skipped { why: skip };
        } else {
            row.completion = convert(name, "completion", &r.completion, &mut Vec::new());
            row.drain = convert(name, "drain", &r.drain, &mut Vec::new());
        }
        for n in r.notes {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
        if !notes.iter().any(|n| n == cuda::COMPUTE_PROBE_CAVEAT) {
            notes.push(cuda::COMPUTE_PROBE_CAVEAT.to_owned());
        }
        row.notes = notes;
        rows.push(row);
    }
    CudaCapability { rows }
}

/// The CUDA rows with `cuda-staging`'s completion and drain evaluated for
/// real through `engine` when `target` is given (see the module docs).
pub fn evaluate_cuda_staging(
    engine: &TransferEngine,
    device: usize,
    target: Option<LoopbackTarget>,
) -> CudaCapability {
    let mut cap = cuda_rows(device);
    let Some(target) = target else {
        return cap;
    };
    let Some(row) = cap.row_mut(PathKind::CudaStaging) else {
        return cap;
    };
    if !row.discovery.is_pass() {
        return cap;
    }
    let (completion, drain) = match round_trip(engine, device, target) {
        Ok((detail, drain)) => {
            row.notes.push(format!("cuda-staging completion: {detail}"));
            (Check::Pass, drain)
        }
        Err(reason) => (
            Check::Fail {
                reason,
                fix: "check the loopback peer (rails up, scratch range published for remote read \
                      and write), `nvidia-smi` and `dmesg` (Xid errors)"
                    .to_owned(),
            },
            Check::Skipped {
                why: "completion did not pass".to_owned(),
            },
        ),
    };
    row.completion = completion;
    row.drain = drain;
    cap
}

/// The round trip; returns the completion detail and the drain check.
fn round_trip(
    engine: &TransferEngine,
    device: usize,
    t: LoopbackTarget,
) -> Result<(String, Check), String> {
    let n = LOOPBACK_BYTES as usize;
    let dev = CudaDevice::open(device).map_err(|e| e.to_string())?;
    let gpu: Arc<CudaBuffer> = CudaBuffer::alloc(&dev, 2 * n).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..n).map(|i| (i % 253) as u8 ^ 0x5a).collect();
    // Put the pattern in GPU memory and scrub the landing half (device
    // copies only, no network).
    let mut local = StagingPipeline::new(&dev, LOOPBACK_CHUNK).map_err(|e| e.to_string())?;
    local
        .upload(&gpu, 0, n, |c| {
            c.write_from(&pattern[c.offset()..c.offset() + c.len()])
        })
        .map_err(|e| format!("filling GPU memory: {e}"))?;
    gpu.fill(n, n, 0).map_err(|e| e.to_string())?;
    let reg = engine
        .register(gpu.clone(), Access::LocalOnly)
        .map_err(|e| e.to_string())?;
    let result = staged_round_trip(engine, reg.id, n, t);
    // The lanes' drain check, before the unregistration stops them.
    let lanes = engine.cuda_staging(device).map(|s| s.is_drained());
    if let Err(e) = engine.unregister(reg.id) {
        tracing::warn!(error = %e, "unregistering the completion check's GPU memory failed");
    }
    let (w, r) = result?;
    let mut back = vec![0u8; n];
    local
        .download(&gpu, n, n, |c| {
            c.read_into(&mut back[c.offset()..c.offset() + c.len()])
        })
        .map_err(|e| format!("reading GPU memory back: {e}"))?;
    if back != pattern {
        let at = back
            .iter()
            .zip(&pattern)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "GPU -> remote -> GPU round trip corrupted data: first difference at byte {at}"
        ));
    }
    let detail = format!(
        "{n} bytes GPU -> peer {} range {} -> GPU through the engine in {} chunks of \
         {LOOPBACK_CHUNK} each way, bytes match",
        t.peer.0, t.range.0, w.slices
    );
    let drain = if w.drain != DrainStatus::Drained || r.drain != DrainStatus::Drained {
        Check::Fail {
            reason: format!(
                "staged requests not drained: WRITE {:?}, READ {:?}",
                w.drain, r.drain
            ),
            fix: "keep the evidence; the bounce buffers stay retained".to_owned(),
        }
    } else {
        match lanes {
            Some(Ok(true)) => Check::Pass,
            Some(Ok(false)) | None => Check::Fail {
                reason: "a staging stream or lane is still busy after the round trip".to_owned(),
                fix: "report this: staged requests must drain before they return".to_owned(),
            },
            Some(Err(e)) => Check::Fail {
                reason: e,
                fix: "check `nvidia-smi` and `dmesg` (Xid errors)".to_owned(),
            },
        }
    };
    Ok((detail, drain))
}

/// The staged WRITE GPU -> remote and READ remote -> GPU of the round
/// trip, each submitted, waited for and drained through the engine.
fn staged_round_trip(
    engine: &TransferEngine,
    reg: crate::transport::RegistrationId,
    n: usize,
    t: LoopbackTarget,
) -> Result<(Outcome, Outcome), String> {
    let len = n as u64;
    let staged = |req: TransferRequest, what: &str| -> Result<Outcome, String> {
        let id = engine
            .submit(&[req])
            .map_err(|e| format!("staged {what} refused: {e}"))?[0];
        let o = engine
            .wait(id, super::DEFAULT_CHUNK_WAIT)
            .map_err(|e| format!("staged {what}: {e}"))?;
        if !o.is_complete() {
            return Err(format!(
                "staged {what} ended {:?} after {} of {n} bytes: {}",
                o.status,
                o.completed_prefix,
                o.failure.map(|f| f.to_string()).unwrap_or_default()
            ));
        }
        // Drain is the next check: a timeout here is reported there.
        let _ = engine.wait_drain(id, super::DEFAULT_DRAIN_WAIT);
        Ok(Outcome {
            drain: engine.drain_status(id),
            ..o
        })
    };
    let w = staged(
        TransferRequest::write(reg, 0, t.peer, t.range, t.offset, len),
        "WRITE GPU -> remote",
    )?;
    let r = staged(
        TransferRequest::read(reg, len, t.peer, t.range, t.offset, len),
        "READ remote -> GPU",
    )?;
    Ok((w, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The not-implemented rows (whatever this machine has: they are never
    /// probed) carry each note once.
    #[test]
    fn not_implemented_rows_print_each_note_once() {
        let cap = cuda_rows(0);
        for path in [PathKind::GpudirectRdma, PathKind::CudaIpc, PathKind::Nvlink] {
            let row = cap.row(path).expect("row");
            assert_eq!(row.build, Check::NotImplemented, "{row:?}");
            let mut seen = std::collections::HashSet::new();
            for n in &row.notes {
                assert!(seen.insert(n), "{} note printed twice: {n}", path.name());
            }
            assert!(
                row.notes.iter().any(|n| n.contains("not implemented")),
                "{row:?}"
            );
        }
    }
}
