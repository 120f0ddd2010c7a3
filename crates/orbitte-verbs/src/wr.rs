//! Work requests and work completions.
//!
//! Work requests borrow their SGE lists, and posting takes a slice of them,
//! so the hot path allocates nothing per request: the caller keeps its
//! arrays of [`SendWr`] and [`Sge`] and reuses them.

use std::fmt;

/// One scatter/gather element: `length` bytes at virtual address `addr`
/// inside a memory region whose local key is `lkey`.
///
/// Layout is identical to `struct ibv_sge`, so the native provider hands
/// slices of these to the NIC without copying. Any value is safe to post:
/// the device (and the sim) checks the address range against the key and
/// reports a `LocalProtection` completion when it does not fit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C)]
pub struct Sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

impl Sge {
    /// An SGE from raw parts. Prefer [`crate::MemoryRegion::sge`], which
    /// checks the range.
    pub const fn new(addr: u64, length: u32, lkey: u32) -> Self {
        Self { addr, length, lkey }
    }

    /// Virtual address of the first byte.
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub const fn length(&self) -> u32 {
        self.length
    }

    /// Local key of the memory region.
    pub const fn lkey(&self) -> u32 {
        self.lkey
    }
}

impl fmt::Debug for Sge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sge({:#x}+{} lkey {:#x})",
            self.addr, self.length, self.lkey
        )
    }
}

/// A remote memory location: address and remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address (as the peer's MR reports it).
    pub addr: u64,
    /// Remote key of the peer's MR.
    pub rkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// RDMA WRITE the SGE bytes to `remote`; with `imm`, it also consumes a
    /// receive at the peer and delivers the immediate there.
    Write {
        /// Destination.
        remote: RemoteAddr,
        /// Immediate data (`IBV_WR_RDMA_WRITE_WITH_IMM`).
        imm: Option<u32>,
    },
    /// RDMA READ from `remote` into the SGEs.
    Read {
        /// Source.
        remote: RemoteAddr,
    },
    /// SEND the SGE bytes into the peer's next receive, with optional
    /// immediate data.
    Send {
        /// Immediate data (`IBV_WR_SEND_WITH_IMM`).
        imm: Option<u32>,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local buffers (gathered for WRITE/SEND, scattered into for READ).
    pub sges: &'a [Sge],
    /// Whether a success produces a completion (selective signaling).
    /// Errors always produce one. An unsignaled request keeps its send
    /// queue slot until a later signaled completion is polled.
    pub signaled: bool,
}

impl<'a> SendWr<'a> {
    /// RDMA WRITE, signaled.
    pub const fn write(wr_id: u64, sges: &'a [Sge], remote: RemoteAddr) -> Self {
        Self {
            wr_id,
            op: SendOp::Write { remote, imm: None },
            sges,
            signaled: true,
        }
    }

    /// RDMA READ, signaled.
    pub const fn read(wr_id: u64, sges: &'a [Sge], remote: RemoteAddr) -> Self {
        Self {
            wr_id,
            op: SendOp::Read { remote },
            sges,
            signaled: true,
        }
    }

    /// SEND with optional immediate, signaled.
    pub const fn send(wr_id: u64, sges: &'a [Sge], imm: Option<u32>) -> Self {
        Self {
            wr_id,
            op: SendOp::Send { imm },
            sges,
            signaled: true,
        }
    }

    /// Same request with `signaled` set as given.
    pub const fn signaled(mut self, signaled: bool) -> Self {
        self.signaled = signaled;
        self
    }

    /// Total bytes of the SGE list (saturating).
    pub fn byte_len(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Buffers an incoming SEND is scattered into (may be empty for
    /// WRITE-with-immediate only).
    pub sges: &'a [Sge],
}

/// Status of a work completion (`enum ibv_wc_status`), unknown values kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WcStatus {
    /// Success.
    #[default]
    Success,
    /// Local length error (a receive too small for the incoming SEND).
    LocalLength,
    /// Local QP operation error.
    LocalQpOperation,
    /// Local protection error (an SGE outside its MR, or a bad lkey).
    LocalProtection,
    /// Flushed because the QP is in the error state.
    WrFlush,
    /// Memory window bind error.
    MemoryWindowBind,
    /// Bad response.
    BadResponse,
    /// Local access error.
    LocalAccess,
    /// Remote invalid request (e.g. SEND longer than the receive).
    RemoteInvalidRequest,
    /// Remote access error: bad rkey, out of the remote MR's bounds, or
    /// access the remote MR/QP does not allow.
    RemoteAccess,
    /// Remote operation error.
    RemoteOperation,
    /// Transport retry counter exceeded (peer unreachable, port down).
    RetryExceeded,
    /// RNR retry counter exceeded (no receive posted at the peer).
    RnrRetryExceeded,
    /// Remote aborted.
    RemoteAbort,
    /// Fatal error.
    Fatal,
    /// Response timeout.
    ResponseTimeout,
    /// General error.
    General,
    /// Any other raw value.
    Other(u32),
}

impl WcStatus {
    /// From the raw `enum ibv_wc_status`.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Success,
            1 => Self::LocalLength,
            2 => Self::LocalQpOperation,
            4 => Self::LocalProtection,
            5 => Self::WrFlush,
            6 => Self::MemoryWindowBind,
            7 => Self::BadResponse,
            8 => Self::LocalAccess,
            9 => Self::RemoteInvalidRequest,
            10 => Self::RemoteAccess,
            11 => Self::RemoteOperation,
            12 => Self::RetryExceeded,
            13 => Self::RnrRetryExceeded,
            16 => Self::RemoteAbort,
            19 => Self::Fatal,
            20 => Self::ResponseTimeout,
            21 => Self::General,
            other => Self::Other(other),
        }
    }

    /// The raw value.
    pub const fn as_raw(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocalLength => 1,
            Self::LocalQpOperation => 2,
            Self::LocalProtection => 4,
            Self::WrFlush => 5,
            Self::MemoryWindowBind => 6,
            Self::BadResponse => 7,
            Self::LocalAccess => 8,
            Self::RemoteInvalidRequest => 9,
            Self::RemoteAccess => 10,
            Self::RemoteOperation => 11,
            Self::RetryExceeded => 12,
            Self::RnrRetryExceeded => 13,
            Self::RemoteAbort => 16,
            Self::Fatal => 19,
            Self::ResponseTimeout => 20,
            Self::General => 21,
            Self::Other(v) => v,
        }
    }

    /// Whether the status is `Success`.
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Success)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Success => "success",
            Self::LocalLength => "local length error",
            Self::LocalQpOperation => "local qp operation error",
            Self::LocalProtection => "local protection error",
            Self::WrFlush => "work request flushed",
            Self::MemoryWindowBind => "memory window bind error",
            Self::BadResponse => "bad response",
            Self::LocalAccess => "local access error",
            Self::RemoteInvalidRequest => "remote invalid request",
            Self::RemoteAccess => "remote access error",
            Self::RemoteOperation => "remote operation error",
            Self::RetryExceeded => "transport retry counter exceeded",
            Self::RnrRetryExceeded => "rnr retry counter exceeded",
            Self::RemoteAbort => "remote aborted",
            Self::Fatal => "fatal error",
            Self::ResponseTimeout => "response timeout",
            Self::General => "general error",
            Self::Other(raw) => return write!(f, "status {raw}"),
        };
        f.write_str(text)
    }
}

/// Opcode of a successful work completion (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND finished.
    Send,
    /// An RDMA WRITE finished.
    RdmaWrite,
    /// An RDMA READ finished (the bytes are in the local SGEs).
    RdmaRead,
    /// A receive consumed by a SEND.
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// Any other raw value.
    Other(u32),
}

impl WcOpcode {
    /// From the raw value.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Send,
            1 => Self::RdmaWrite,
            2 => Self::RdmaRead,
            128 => Self::Recv,
            129 => Self::RecvRdmaWithImm,
            other => Self::Other(other),
        }
    }
}

/// A work completion.
///
/// As on hardware, only `wr_id`, `status`, `qp_num` and `vendor_err` are
/// meaningful when `status` is not `Success`; this type makes that explicit:
/// `opcode` and `imm` are `None` and `byte_len` is 0 for error completions,
/// on both providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Completion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What finished (successful completions only).
    pub opcode: Option<WcOpcode>,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data of an incoming SEND/WRITE with immediate.
    pub imm: Option<u32>,
    /// Local queue pair number the work request was posted on.
    pub qp_num: u32,
    /// Vendor error syndrome (0 when none).
    pub vendor_err: u32,
}

impl Completion {
    /// Whether the completion is a success.
    pub const fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_status_round_trips_and_keeps_unknowns() {
        for raw in 0..32 {
            assert_eq!(WcStatus::from_raw(raw).as_raw(), raw);
        }
        assert_eq!(WcStatus::from_raw(10), WcStatus::RemoteAccess);
        assert_eq!(WcStatus::from_raw(5), WcStatus::WrFlush);
        assert_eq!(WcStatus::from_raw(3), WcStatus::Other(3));
        assert_eq!(WcOpcode::from_raw(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(WcOpcode::from_raw(7), WcOpcode::Other(7));
        assert_eq!(WcStatus::RemoteAccess.to_string(), "remote access error");
        assert_eq!(WcStatus::Other(99).to_string(), "status 99");
    }

    #[test]
    fn work_request_builders() {
        let sges = [Sge::new(0x1000, 10, 1), Sge::new(0x2000, 20, 1)];
        let r = RemoteAddr {
            addr: 0x9000,
            rkey: 7,
        };
        let w = SendWr::write(1, &sges, r).signaled(false);
        assert!(!w.signaled);
        assert_eq!(w.byte_len(), 30);
        assert_eq!(SendWr::read(2, &sges, r).op, SendOp::Read { remote: r });
        assert_eq!(
            SendWr::send(3, &[], Some(5)).op,
            SendOp::Send { imm: Some(5) }
        );
        assert_eq!(format!("{:?}", sges[0]), "Sge(0x1000+10 lkey 0x1)");
    }
}
