//! The vocabulary every layer shares: paths, operations and the ids of
//! rails, registrations, peers, ranges and slices.

use std::fmt;

/// A path: one way bytes move between registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathKind {
    /// Host Direct: host memory registered on RDMA NICs, one-sided verbs.
    Rdma,
    /// One-sided READ/WRITE emulated over TCP sessions.
    Tcp,
    /// Same host, different process: shared memory.
    Local,
    /// GPU memory through pinned host bounce buffers.
    CudaStaging,
    /// Direct GPU registration on RDMA NICs (not implemented).
    GpudirectRdma,
    /// CUDA IPC between processes on one host (not implemented).
    CudaIpc,
    /// NVLink peer transfers (not implemented).
    Nvlink,
}

impl PathKind {
    /// Every path, in capability-matrix order.
    pub const ALL: [Self; 7] = [
        Self::Rdma,
        Self::Tcp,
        Self::Local,
        Self::CudaStaging,
        Self::GpudirectRdma,
        Self::CudaIpc,
        Self::Nvlink,
    ];

    /// The path's name as the docs and `orbitte doctor` write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rdma => "rdma",
            Self::Tcp => "tcp",
            Self::Local => "local",
            Self::CudaStaging => "cuda-staging",
            Self::GpudirectRdma => "gpudirect-rdma",
            Self::CudaIpc => "cuda-ipc",
            Self::Nvlink => "nvlink",
        }
    }
}

impl fmt::Display for PathKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One-sided operation of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Copy remote bytes into local memory.
    Read,
    /// Copy local bytes into remote memory.
    Write,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
        })
    }
}

/// A rail: one lane (queue pair, connection, mapping) to one peer on one
/// path. Assigned by the engine; stable for the rail's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RailId(pub u32);

/// A local registration (a registered host range), engine-assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrationId(pub u64);

/// A peer (remote source owner) as opened in this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// A range a peer published, identified by the id in its segment
/// descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RangeId(pub u64);

/// Opaque token naming one posted slice; rdma uses it as the `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SliceToken(pub u64);
