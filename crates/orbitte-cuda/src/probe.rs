//! The capability matrix rows for the CUDA paths, as plain data.
//!
//! The engine copies these rows into its capability matrix and `orbitte
//! doctor` prints them. Each path gets four separate checks: build,
//! discovery, completion and drain.

use std::fmt;

use crate::buffer::CudaBuffer;
use crate::device::{CudaDevice, DeviceError, devices};
use crate::driver::{DriverError, driver};
use crate::pipeline::StagingPipeline;

/// The scope of CUDA support (docs/cuda.md), carried in every CUDA row.
pub const COMPUTE_PROBE_CAVEAT: &str = "a successful small CUDA compute probe does not establish \
     any transport path; only a path's own completion and drain checks do";

/// Bytes the completion check moves through staging.
pub const PROBE_BYTES: usize = 1 << 20;
/// Chunk size of the completion check (4 chunks, so both bounce buffers
/// and the overlap are exercised).
pub const PROBE_CHUNK: usize = PROBE_BYTES / 4;

/// One check's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// It works; what was seen.
    Pass {
        /// What was seen.
        detail: String,
    },
    /// It does not work.
    Fail {
        /// Why.
        reason: String,
        /// What to do about it.
        fix: String,
    },
    /// Not checked.
    Skipped {
        /// Why not.
        why: String,
    },
    /// The path does not exist in this build.
    NotImplemented {
        /// What would be needed.
        note: String,
    },
}

impl Check {
    /// Whether this is [`Check::Pass`].
    pub fn is_pass(&self) -> bool {
        matches!(self, Self::Pass { .. })
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pass { detail } => write!(f, "pass: {detail}"),
            Self::Fail { reason, fix } => write!(f, "fail: {reason}; fix: {fix}"),
            Self::Skipped { why } => write!(f, "skipped: {why}"),
            Self::NotImplemented { note } => write!(f, "not implemented: {note}"),
        }
    }
}

/// One row of the capability matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathCapability {
    /// The path's name: `cuda-staging`, `gpudirect-rdma`, `cuda-ipc`, `nvlink`.
    pub path: &'static str,
    /// Compiled in.
    pub build: Check,
    /// Runtime library and devices usable.
    pub discovery: Check,
    /// A real request completed.
    pub completion: Check,
    /// Afterwards nothing is outstanding on the local buffers.
    pub drain: Check,
    /// Notes for the row (always includes [`COMPUTE_PROBE_CAVEAT`]).
    pub notes: Vec<String>,
}

/// Probes the CUDA paths on device 0 (see [`probe_device`]).
pub fn probe() -> Vec<PathCapability> {
    probe_device(0)
}

/// Probes the CUDA paths on device `index`: `cuda-staging` is checked for
/// real (a [`PROBE_BYTES`] round trip host → device → host through a
/// staging pipeline, then both streams queried idle); `gpudirect-rdma`,
/// `cuda-ipc` and `nvlink` are reported as not implemented. Never panics.
pub fn probe_device(index: usize) -> Vec<PathCapability> {
    let mut rows = vec![staging_row(index)];
    rows.extend(not_implemented_rows());
    rows
}

fn staging_row(index: usize) -> PathCapability {
    let build = Check::Pass {
        detail: "compiled in: cudarc driver API (CUDA 12.8 bindings), libcuda loaded at run time"
            .to_owned(),
    };
    let mut row = PathCapability {
        path: "cuda-staging",
        build,
        discovery: Check::Skipped { why: String::new() },
        completion: Check::Skipped {
            why: "discovery did not pass".to_owned(),
        },
        drain: Check::Skipped {
            why: "discovery did not pass".to_owned(),
        },
        notes: vec![
            "GPU memory moves through pinned host bounce buffers, chunked and double-buffered"
                .to_owned(),
            COMPUTE_PROBE_CAVEAT.to_owned(),
        ],
    };
    match discovery(index) {
        Ok(detail) => row.discovery = Check::Pass { detail },
        Err(check) => {
            row.discovery = check;
            return row;
        }
    }
    let device = match CudaDevice::open(index) {
        Ok(d) => d,
        Err(e) => {
            row.completion = fail_device(&e);
            return row;
        }
    };
    match round_trip(&device) {
        Ok((detail, pipeline)) => {
            row.completion = Check::Pass { detail };
            row.drain = match pipeline.is_drained() {
                Ok(true) => Check::Pass {
                    detail: "both staging streams idle (cuStreamQuery): no outstanding copies on \
                             the bounce buffers"
                        .to_owned(),
                },
                Ok(false) => Check::Fail {
                    reason: "a staging stream still has copies outstanding after the round trip"
                        .to_owned(),
                    fix: "report this: operations must drain before they return".to_owned(),
                },
                Err(e) => Check::Fail {
                    reason: e.to_string(),
                    fix: driver_fix(),
                },
            };
        }
        Err(reason) => {
            row.completion = Check::Fail {
                reason,
                fix: driver_fix(),
            };
            row.drain = Check::Skipped {
                why: "completion did not pass".to_owned(),
            };
        }
    }
    row
}

fn discovery(index: usize) -> Result<String, Check> {
    let info = driver().map_err(|e| match e {
        DriverError::NotFound { .. } => Check::Skipped { why: e.reason() },
        other => Check::Fail {
            reason: other.reason(),
            fix: driver_fix(),
        },
    })?;
    let list = devices().map_err(|e| match e {
        DeviceError::NoDevice { .. } => Check::Skipped { why: e.reason() },
        other => fail_device(&other),
    })?;
    let Some(dev) = list.iter().find(|d| d.index == index) else {
        return Err(fail_device(&DeviceError::NoSuchDevice {
            index,
            count: list.len(),
        }));
    };
    let version = info
        .version
        .map(|(a, b)| format!(" {a}.{b}"))
        .unwrap_or_default();
    Ok(format!(
        "{} (driver{version}): {} device(s); device {} is {} at PCI {}",
        info.library,
        list.len(),
        dev.index,
        dev.name,
        dev.pci_bus_id
    ))
}

fn round_trip(device: &CudaDevice) -> Result<(String, StagingPipeline), String> {
    let pattern: Vec<u8> = (0..PROBE_BYTES).map(|i| (i % 251) as u8).collect();
    let buf = CudaBuffer::alloc(device, PROBE_BYTES).map_err(|e| e.to_string())?;
    let mut pipeline = StagingPipeline::new(device, PROBE_CHUNK).map_err(|e| e.to_string())?;
    pipeline
        .upload(&buf, 0, PROBE_BYTES, |c| {
            c.write_from(&pattern[c.offset()..c.offset() + c.len()])
        })
        .map_err(|e| e.to_string())?;
    let mut back = vec![0u8; PROBE_BYTES];
    let report = pipeline
        .download(&buf, 0, PROBE_BYTES, |c| {
            c.read_into(&mut back[c.offset()..c.offset() + c.len()])
        })
        .map_err(|e| e.to_string())?;
    if back != pattern {
        let at = back
            .iter()
            .zip(&pattern)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(format!(
            "round trip through staging corrupted data: first difference at byte {at}"
        ));
    }
    Ok((
        format!(
            "{PROBE_BYTES} bytes host -> device -> host through staging in {} chunks of {PROBE_CHUNK}, \
             bytes match",
            report.chunks
        ),
        pipeline,
    ))
}

fn fail_device(e: &DeviceError) -> Check {
    Check::Fail {
        reason: e.reason(),
        fix: driver_fix(),
    }
}

fn driver_fix() -> String {
    "check `nvidia-smi`, `dmesg` (Xid errors) and CUDA_VISIBLE_DEVICES; reinstall the NVIDIA driver \
     if libcuda is not NVIDIA's"
        .to_owned()
}

fn not_implemented_rows() -> Vec<PathCapability> {
    let row = |path: &'static str, note: &str| {
        let ni = || Check::NotImplemented {
            note: note.to_owned(),
        };
        PathCapability {
            path,
            build: ni(),
            discovery: ni(),
            completion: ni(),
            drain: ni(),
            notes: vec![
                "GPU buffers move through cuda-staging instead".to_owned(),
                COMPUTE_PROBE_CAVEAT.to_owned(),
            ],
        }
    };
    vec![
        row(
            "gpudirect-rdma",
            "registering GPU memory with NICs (peer memory or dma-buf) needs its own \
             implementation and hardware qualification",
        ),
        row(
            "cuda-ipc",
            "sharing device memory between processes by CUDA IPC handles is not built",
        ),
        row("nvlink", "GPU-to-GPU transfer over NVLink is not built"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_cover_every_cuda_path_and_carry_the_caveat() {
        let rows = probe();
        let names: Vec<_> = rows.iter().map(|r| r.path).collect();
        assert_eq!(
            names,
            ["cuda-staging", "gpudirect-rdma", "cuda-ipc", "nvlink"]
        );
        for r in &rows {
            assert!(
                r.notes.iter().any(|n| n == COMPUTE_PROBE_CAVEAT),
                "{}",
                r.path
            );
        }
        for r in &rows[1..] {
            for c in [&r.build, &r.discovery, &r.completion, &r.drain] {
                assert!(matches!(c, Check::NotImplemented { .. }), "{}: {c}", r.path);
            }
        }
        let staging = &rows[0];
        assert!(staging.build.is_pass());
        match driver() {
            Err(DriverError::NotFound { .. }) => {
                assert_eq!(
                    staging.discovery,
                    Check::Skipped {
                        why: "no CUDA driver (libcuda.so.1 not found)".to_owned()
                    }
                );
                assert!(matches!(staging.completion, Check::Skipped { .. }));
                assert!(matches!(staging.drain, Check::Skipped { .. }));
                println!("skipped (hardware checks): no CUDA driver (libcuda.so.1 not found)");
            }
            _ => {
                // With hardware, a passing discovery must be followed by a
                // real completion check, never a skip.
                if staging.discovery.is_pass() {
                    assert!(!matches!(staging.completion, Check::Skipped { .. }));
                }
            }
        }
    }

    #[test]
    fn checks_print_their_reason_and_fix() {
        let c = Check::Fail {
            reason: "r".into(),
            fix: "f".into(),
        };
        assert_eq!(c.to_string(), "fail: r; fix: f");
        assert_eq!(Check::Skipped { why: "w".into() }.to_string(), "skipped: w");
    }
}
