//! Errors: one enum per operation, plus [`Unquiesced`] for cleanup.
//!
//! Grouped by whose fault it is, in the variant docs: the caller misused
//! the API (`Invalid*`, `OutOfRange`, `WrongProvider`), the device or
//! kernel refused (`Native`), or the library is unavailable
//! (`Unavailable`).

use std::fmt;

use crate::types::{DeviceIdentity, QpState};

/// A failed native call: which call, and the errno it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NativeError {
    /// The verbs call (`ibv_reg_mr`, `ibv_destroy_qp`, ...).
    pub call: &'static str,
    /// The errno (positive).
    pub errno: i32,
}

impl NativeError {
    /// A native error from a call name and errno.
    pub const fn new(call: &'static str, errno: i32) -> Self {
        Self { call, errno }
    }
}

impl fmt::Display for NativeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.errno);
        write!(
            f,
            "{} failed with errno {} ({})",
            self.call, self.errno, text
        )
    }
}

impl std::error::Error for NativeError {}

/// Listing devices failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceListError {
    /// libibverbs could not be loaded (local system).
    #[error("libibverbs is not available: {reason}; install rdma-core (libibverbs1)")]
    Unavailable {
        /// Why loading failed.
        reason: String,
    },
    /// The device list call failed (ENOSYS: no RDMA support in this
    /// kernel/container; EPERM/EACCES: permissions).
    #[error("{0}; check that the RDMA kernel modules are loaded and /dev/infiniband is visible")]
    Native(NativeError),
}

/// Opening a device failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// No device of that name (caller error or device vanished).
    #[error("no rdma device named {name:?}; available: {available:?}")]
    NoSuchDevice {
        /// Name asked for.
        name: String,
        /// Names the provider lists.
        available: Vec<String>,
    },
    /// Listing the devices failed first.
    #[error(transparent)]
    List(#[from] DeviceListError),
    /// `ibv_open_device` (or the sim's injected failure) refused.
    #[error("opening {device} failed: {source}; check read/write access to its uverbs node")]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// The native failure.
        source: NativeError,
    },
}

/// A device, port or GID query failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The port does not exist (caller error).
    #[error("port {port} does not exist; the device has ports 1..={ports}")]
    InvalidPort {
        /// Port asked for.
        port: u8,
        /// Number of ports.
        ports: u8,
    },
    /// The GID index is outside the table (caller error).
    #[error("gid index {index} is outside the {len}-entry table of port {port}")]
    InvalidGidIndex {
        /// Port.
        port: u8,
        /// Index asked for.
        index: u32,
        /// Table length.
        len: u32,
    },
    /// The device refused.
    #[error("query on {device} failed: {source}")]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// The native failure.
        source: NativeError,
    },
}

/// Allocating a protection domain failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocPdError {
    /// The device refused.
    #[error("allocating a protection domain on {device} failed: {source}")]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// The native failure.
        source: NativeError,
    },
}

/// Registering a memory region failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The range is empty or outside the buffer (caller error).
    #[error("registration range {start}..{end} is empty or outside the {len}-byte buffer")]
    OutOfRange {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// Buffer length.
        len: usize,
    },
    /// The access flags are not a valid combination (caller error).
    #[error("access {access:?} is invalid: remote write needs local write")]
    InvalidAccess {
        /// The flags.
        access: crate::Access,
    },
    /// Write access was asked for a read-only buffer (caller error): the
    /// NIC would fault writing it.
    #[error(
        "access {access:?} needs a writable buffer, but the buffer is mapped read-only; register it with read-only access (Access::NONE or REMOTE_READ)"
    )]
    ReadOnlyBuffer {
        /// The flags.
        access: crate::Access,
    },
    /// The device refused (ENOMEM: out of MRs or pinnable memory, check
    /// `ulimit -l`; EFAULT: bad address; EINVAL: size above the limit).
    #[error(
        "registering {len} bytes on {device} failed: {source}; check `ulimit -l` and the device's max_mr"
    )]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// Bytes asked for.
        len: usize,
        /// The native failure.
        source: NativeError,
    },
}

/// Creating a completion queue failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateCqError {
    /// The depth is zero or above the device's `max_cqe` (caller error).
    #[error("completion queue depth {depth} is outside 1..={max}")]
    InvalidDepth {
        /// Depth asked for.
        depth: u32,
        /// Device limit.
        max: u32,
    },
    /// The device refused.
    #[error("creating a completion queue on {device} failed: {source}")]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// The native failure.
        source: NativeError,
    },
}

/// Creating a queue pair failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// A CQ belongs to another device/context than the PD (caller error).
    #[error(
        "completion queue belongs to {cq_device}, protection domain to {pd_device}; use objects of one context"
    )]
    ForeignCq {
        /// The CQ's device.
        cq_device: String,
        /// The PD's device.
        pd_device: String,
    },
    /// Capacities outside the device limits (caller error).
    #[error(
        "queue pair capacities {caps:?} exceed the device limits (max_qp_wr {max_wr}, max_sge {max_sge})"
    )]
    InvalidCaps {
        /// What was asked.
        caps: crate::QpCaps,
        /// Device work-request limit.
        max_wr: u32,
        /// Device SGE limit.
        max_sge: u32,
    },
    /// The device refused.
    #[error("creating a queue pair on {device} failed: {source}")]
    Native {
        /// The device.
        device: DeviceIdentity,
        /// The native failure.
        source: NativeError,
    },
}

/// A queue pair state transition failed; the QP keeps its old state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// An attribute is invalid for this device/port (caller error), e.g. a
    /// port that does not exist, an MTU above the port's, a bad GID index.
    #[error("invalid attribute for {to:?}: {reason}")]
    InvalidAttr {
        /// Target state.
        to: QpState,
        /// What is wrong.
        reason: String,
    },
    /// The device refused.
    #[error("moving qp {qpn} to {to:?} failed: {source}")]
    Native {
        /// Queue pair number.
        qpn: u32,
        /// Target state.
        to: QpState,
        /// The native failure.
        source: NativeError,
    },
}

/// Why a post failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostErrorKind {
    /// The queue pair is not in a state that accepts this queue's work
    /// (send: RTS or error; receive: INIT, RTR, RTS or error).
    #[error("queue pair is in state {0:?}")]
    InvalidState(QpState),
    /// The queue is full: poll completions (a signaled one frees the
    /// unsignaled requests before it).
    #[error("queue full ({depth} outstanding); poll the completion queue")]
    QueueFull {
        /// Queue depth.
        depth: u32,
    },
    /// More SGEs than the QP was created with.
    #[error("{sges} sges exceed the queue pair's limit of {max}")]
    TooManySges {
        /// SGEs in the request.
        sges: usize,
        /// Limit.
        max: u32,
    },
    /// The driver refused with an errno.
    #[error("{0}")]
    Native(NativeError),
}

/// Posting work requests failed at `index`; the requests before `index`
/// were posted and will complete, the rest were not posted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("posting work request {index} on qp {qpn} failed: {kind}")]
pub struct PostError {
    /// Queue pair number.
    pub qpn: u32,
    /// Index of the first request not posted.
    pub index: usize,
    /// Why.
    pub kind: PostErrorKind,
}

/// Polling a completion queue failed (the CQ is in error, e.g. overrun).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PollError {
    /// The device refused.
    #[error("polling the completion queue failed: {0}; the cq overran or the device failed")]
    Native(NativeError),
}

/// Waiting for a completion failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// Arming or reading the completion channel failed.
    #[error("waiting for completions failed: {0}")]
    Native(NativeError),
}

/// Reading an asynchronous event failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AsyncEventError {
    /// Reading the async event fd failed.
    #[error("reading async events failed: {0}")]
    Native(NativeError),
}

/// Kind of verbs object, for errors and evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// Device context.
    Context,
    /// Protection domain.
    ProtectionDomain,
    /// Memory region.
    MemoryRegion,
    /// Completion queue.
    CompletionQueue,
    /// Queue pair.
    QueuePair,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Context => "context",
            Self::ProtectionDomain => "protection domain",
            Self::MemoryRegion => "memory region",
            Self::CompletionQueue => "completion queue",
            Self::QueuePair => "queue pair",
        })
    }
}

/// Why an object was not destroyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnquiescedCause {
    /// The native destroy call failed (EBUSY and friends). The native
    /// object and everything it depends on are retained.
    Native(NativeError),
    /// Other handles (clones, or children such as MRs and QPs of a PD)
    /// still hold the object; this handle was released and the destroy
    /// will run when the last holder goes.
    InUse {
        /// Holders left besides the closed handle.
        holders: usize,
    },
}

impl fmt::Display for UnquiescedCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native(e) => write!(f, "{e}"),
            Self::InUse { holders } => write!(f, "still held by {holders} other handle(s)"),
        }
    }
}

/// What cleanup was tried and what was kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupEvidence {
    /// Steps tried, in order (`ibv_destroy_qp(qpn 17)`, ...).
    pub tried: Vec<String>,
    /// Whether the native object (and its parents and memory) is retained
    /// in this process (listed by [`crate::retained`]).
    pub retained: bool,
    /// Registered bytes kept alive by the retention (memory regions).
    pub retained_bytes: usize,
}

/// A close that could not establish that the native object is gone.
///
/// Never pretend: the native owner and its memory stay retained (see
/// [`crate::retained`]), and the engine fences new admission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object} {label} on {device} is unquiesced: {cause}; cleanup tried: {tried}; keep the device identity and this evidence for diagnosis", tried = .cleanup.tried.join(", "))]
pub struct Unquiesced {
    /// Kind of object.
    pub object: ObjectKind,
    /// Which one (`qpn 17`, `lkey 0x1200`, ...).
    pub label: String,
    /// The device it lives on.
    pub device: DeviceIdentity,
    /// Why it was not destroyed.
    pub cause: UnquiescedCause,
    /// What was tried and what is retained.
    pub cleanup: CleanupEvidence,
}
