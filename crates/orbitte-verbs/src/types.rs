//! Plain data: attributes, addresses, access flags, device diagnostics.
//!
//! Everything here is `Copy`/`Clone` data with no handle inside, so the
//! engine can turn it into topology records or wire descriptors freely.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Which provider implementation a device belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// libibverbs, loaded at run time.
    Native,
    /// The in-process software fabric ([`crate::sim`]).
    Sim,
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Sim => "sim",
        })
    }
}

/// Who a device is: enough to name it in errors and evidence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceIdentity {
    /// Provider the device belongs to.
    pub provider: ProviderKind,
    /// Device name (`mlx5_0`, `rxe0`, `sim0`).
    pub name: String,
    /// Node GUID in host byte order (0 when unknown).
    pub guid: u64,
}

impl fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} device {} (guid {:016x})",
            self.provider, self.name, self.guid
        )
    }
}

/// Memory region and queue pair access flags (`IBV_ACCESS_*`).
///
/// `REMOTE_WRITE` (and `REMOTE_ATOMIC`) require `LOCAL_WRITE`, as in
/// libibverbs; registration rejects the combination otherwise.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No access beyond local reads (the NIC may read the memory to send it).
    pub const NONE: Self = Self(0);
    /// The local NIC may write (RDMA READ destinations, receive buffers).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Remote peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Remote peers may RDMA READ from the region.
    pub const REMOTE_READ: Self = Self(4);
    /// Remote atomics (not used by OrbitTE; passed through).
    pub const REMOTE_ATOMIC: Self = Self(8);

    /// Local-only registration: local read and write, no remote access.
    pub const fn local_only() -> Self {
        Self::LOCAL_WRITE
    }

    /// Remotely readable and writable (plus local write).
    pub const fn remote_read_write() -> Self {
        Self(Self::LOCAL_WRITE.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0)
    }

    /// Raw `IBV_ACCESS_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Builds from raw bits (unknown bits are kept and passed through).
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// Whether every flag in `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any remote flag is set.
    pub const fn is_remote(self) -> bool {
        self.0 & (Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0) != 0
    }

    /// Whether the combination is one libibverbs accepts
    /// (remote write/atomic need local write).
    pub const fn is_valid(self) -> bool {
        let needs_local = self.0 & (Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0) != 0;
        !needs_local || self.0 & Self::LOCAL_WRITE.0 != 0
    }
}

impl BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (bit, name) in [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ] {
            if self.contains(bit) {
                parts.push(name);
            }
        }
        if parts.is_empty() {
            f.write_str("Access(NONE)")
        } else {
            write!(f, "Access({})", parts.join("|"))
        }
    }
}

/// Path MTU (`IBV_MTU_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// From the raw `enum ibv_mtu` value; `None` for values outside 1..=5.
    pub const fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// The raw `enum ibv_mtu` value.
    pub const fn as_raw(self) -> u32 {
        self as u32
    }

    /// Size in bytes.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// Logical port state (`IBV_PORT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// No state change (`IBV_PORT_NOP`).
    Nop,
    /// Link down.
    Down,
    /// Link up, not yet configured by the subnet manager.
    Init,
    /// Configured, not yet active.
    Armed,
    /// Usable.
    Active,
    /// Active, deferring.
    ActiveDefer,
    /// A value this crate does not know.
    Unknown(u32),
}

impl PortState {
    /// From the raw `enum ibv_port_state`.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Nop,
            1 => Self::Down,
            2 => Self::Init,
            3 => Self::Armed,
            4 => Self::Active,
            5 => Self::ActiveDefer,
            other => Self::Unknown(other),
        }
    }

    /// The raw value.
    pub const fn as_raw(self) -> u32 {
        match self {
            Self::Nop => 0,
            Self::Down => 1,
            Self::Init => 2,
            Self::Armed => 3,
            Self::Active => 4,
            Self::ActiveDefer => 5,
            Self::Unknown(v) => v,
        }
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// Not reported (old kernels report this for InfiniBand).
    Unspecified,
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    Ethernet,
    /// A value this crate does not know.
    Unknown(u8),
}

impl LinkLayer {
    /// From the raw `IBV_LINK_LAYER_*` value.
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            0 => Self::Unspecified,
            1 => Self::InfiniBand,
            2 => Self::Ethernet,
            other => Self::Unknown(other),
        }
    }
}

/// Type of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet, layer 2).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
}

/// A 16-byte GID in network byte order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (marks an unused table entry).
    pub const ZERO: Self = Self([0; 16]);

    /// Whether every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4-mapped GID `::ffff:a.b.c.d` (RoCE v2 over IPv4).
    pub const fn from_ipv4(octets: [u8; 4]) -> Self {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12] = octets[0];
        g[13] = octets[1];
        g[14] = octets[2];
        g[15] = octets[3];
        Self(g)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// One GID table entry, with what the diagnostics of docs/troubleshooting.md need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's table.
    pub index: u32,
    /// The GID (zero when the entry is unused).
    pub gid: Gid,
    /// Whether the entry is populated and usable.
    pub valid: bool,
    /// GID type (`None` when invalid or not reported).
    pub gid_type: Option<GidType>,
    /// Network interface the entry belongs to (RoCE), if any.
    pub netdev: Option<String>,
}

/// Link width (`active_width` encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Width {
    /// 1x.
    X1,
    /// 2x.
    X2,
    /// 4x.
    X4,
    /// 8x.
    X8,
    /// 12x.
    X12,
    /// A value this crate does not know.
    Unknown(u8),
}

impl Width {
    /// From the raw `active_width` bit.
    pub const fn from_raw(raw: u8) -> Self {
        match raw {
            1 => Self::X1,
            16 => Self::X2,
            2 => Self::X4,
            4 => Self::X8,
            8 => Self::X12,
            other => Self::Unknown(other),
        }
    }

    /// Lanes (0 when unknown).
    pub const fn lanes(self) -> u32 {
        match self {
            Self::X1 => 1,
            Self::X2 => 2,
            Self::X4 => 4,
            Self::X8 => 8,
            Self::X12 => 12,
            Self::Unknown(_) => 0,
        }
    }
}

/// Per-lane signalling speed (`active_speed` encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Speed {
    /// SDR 2.5 Gb/s.
    Sdr,
    /// DDR 5 Gb/s.
    Ddr,
    /// QDR 10 Gb/s.
    Qdr,
    /// FDR10 10.3125 Gb/s.
    Fdr10,
    /// FDR 14.0625 Gb/s.
    Fdr,
    /// EDR 25.78125 Gb/s.
    Edr,
    /// HDR 53.125 Gb/s.
    Hdr,
    /// NDR 106.25 Gb/s.
    Ndr,
    /// XDR 212.5 Gb/s.
    Xdr,
    /// A value this crate does not know.
    Unknown(u32),
}

impl Speed {
    /// From the raw `active_speed` (or `active_speed_ex`) value.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            1 => Self::Sdr,
            2 => Self::Ddr,
            4 => Self::Qdr,
            8 => Self::Fdr10,
            16 => Self::Fdr,
            32 => Self::Edr,
            64 => Self::Hdr,
            128 => Self::Ndr,
            256 => Self::Xdr,
            other => Self::Unknown(other),
        }
    }

    /// Megabits per second per lane (0 when unknown).
    pub const fn lane_mbps(self) -> u64 {
        match self {
            Self::Sdr => 2_500,
            Self::Ddr => 5_000,
            Self::Qdr | Self::Fdr10 => 10_000,
            Self::Fdr => 14_000,
            Self::Edr => 25_000,
            Self::Hdr => 50_000,
            Self::Ndr => 100_000,
            Self::Xdr => 200_000,
            Self::Unknown(_) => 0,
        }
    }
}

/// What a port query returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port number (1-based).
    pub port: u8,
    /// Logical state.
    pub state: PortState,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently active.
    pub active_mtu: Mtu,
    /// Active link width.
    pub width: Width,
    /// Active per-lane speed.
    pub speed: Speed,
    /// Base LID (0 on Ethernet).
    pub lid: u16,
    /// GID table length.
    pub gid_table_len: u32,
}

impl PortAttr {
    /// Link rate in megabits per second (width times lane speed).
    pub fn rate_mbps(&self) -> u64 {
        u64::from(self.width.lanes()) * self.speed.lane_mbps()
    }
}

/// Device limits that matter to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most memory regions.
    pub max_mr: u32,
    /// Largest single registration in bytes.
    pub max_mr_size: u64,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most work requests per queue.
    pub max_qp_wr: u32,
    /// Most SGEs per work request.
    pub max_sge: u32,
    /// Most CQ entries.
    pub max_cqe: u32,
    /// Most outstanding RDMA READs a QP may issue/serve.
    pub max_qp_rd_atom: u32,
    /// Firmware version string.
    pub fw_ver: String,
}

/// Whether this process may open a uverbs character node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAccess {
    /// Readable and writable: the device can be opened.
    ReadWrite,
    /// Present but not both readable and writable by this process.
    Denied {
        /// errno from `access(2)` (typically EACCES).
        errno: i32,
    },
    /// The node does not exist.
    Missing,
}

/// The uverbs character node of a device (`/dev/infiniband/uverbsN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UverbsNode {
    /// Path of the node.
    pub path: String,
    /// Whether this process can read and write it.
    pub access: NodeAccess,
}

/// One device as the provider lists it, before opening.
///
/// Plain data: the engine converts it into topology records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Identity (provider, name, GUID).
    pub identity: DeviceIdentity,
    /// Kernel driver / verbs provider (`mlx5_core`, `rxe`, `sim`), when known.
    pub driver: Option<String>,
    /// The uverbs character node and this process's access to it.
    pub uverbs: Option<UverbsNode>,
    /// sysfs directory of the device, when there is one.
    pub sysfs_path: Option<String>,
}

/// Full diagnostics of one port: attributes and GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDiagnostics {
    /// Port attributes (state, link layer, MTU, width/speed).
    pub attr: PortAttr,
    /// GID table entries up to the last valid one (invalid ones before it
    /// included, marked); `attr.gid_table_len` is the full size.
    pub gids: Vec<GidEntry>,
}

/// Full diagnostics of an opened device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDiagnostics {
    /// What the device list said.
    pub info: DeviceInfo,
    /// Device limits.
    pub attr: DeviceAttr,
    /// Ports, in order; a port whose query failed is absent and listed
    /// in `port_errors`.
    pub ports: Vec<PortDiagnostics>,
    /// Ports whose query failed, with the error text.
    pub port_errors: Vec<(u8, String)>,
}

/// How to reach the remote side of an RC connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// InfiniBand local routing by LID.
    Lid(u16),
    /// Global routing by GID (required on RoCE).
    Gid(Gid),
}

/// What one side of an RC connection tells the other (exchanged out of
/// band, e.g. in the engine's handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteEndpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number the side will send (24 bits).
    pub psn: u32,
    /// LID or GID of the side's port.
    pub route: Route,
    /// The side's active MTU; the path MTU is the smaller of both.
    pub mtu: Mtu,
}

/// Attributes for RESET -> INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitAttrs {
    /// Port number (1-based).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote operations this QP accepts as a responder.
    pub access: Access,
}

impl InitAttrs {
    /// Port `port`, P_Key index 0, accepting remote READ and WRITE.
    pub const fn new(port: u8) -> Self {
        Self {
            port,
            pkey_index: 0,
            access: Access::remote_read_write(),
        }
    }
}

/// Attributes for INIT -> RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttrs {
    /// The remote side.
    pub remote: RemoteEndpoint,
    /// Path MTU (at most both sides' active MTU).
    pub path_mtu: Mtu,
    /// Local GID index used as source for a [`Route::Gid`].
    pub sgid_index: u8,
    /// Hop limit for a [`Route::Gid`].
    pub hop_limit: u8,
    /// Incoming RDMA READs served at once.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (`min_rnr_timer`).
    pub min_rnr_timer: u8,
}

impl RtrAttrs {
    /// Defaults: path MTU = remote MTU, hop limit 64, 16 reads, RNR timer 12.
    pub const fn new(remote: RemoteEndpoint, sgid_index: u8) -> Self {
        Self {
            remote,
            path_mtu: remote.mtu,
            sgid_index,
            hop_limit: 64,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
        }
    }
}

/// Attributes for RTR -> RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttrs {
    /// Our first send PSN (what we told the peer in our endpoint).
    pub sq_psn: u32,
    /// Local ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries before `RetryExceeded`.
    pub retry_cnt: u8,
    /// RNR retries before `RnrRetryExceeded` (7 = infinite).
    pub rnr_retry: u8,
    /// Outstanding RDMA READs we issue at once.
    pub max_rd_atomic: u8,
}

impl RtsAttrs {
    /// Defaults: timeout 14, 7 retries, infinite RNR retry, 16 reads.
    pub const fn new(sq_psn: u32) -> Self {
        Self {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}

/// Queue pair state (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Freshly created.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: all work flushes.
    Error,
    /// A value this crate does not know.
    Unknown(u32),
}

impl QpState {
    /// From the raw `enum ibv_qp_state`.
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => Self::Reset,
            1 => Self::Init,
            2 => Self::Rtr,
            3 => Self::Rts,
            4 => Self::Sqd,
            5 => Self::Sqe,
            6 => Self::Error,
            other => Self::Unknown(other),
        }
    }
}

/// Queue sizes of a new queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth (outstanding send WRs, signaled or not, until a
    /// later signaled completion is polled).
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
        }
    }
}

/// Asynchronous events a context reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A port went down (`IBV_EVENT_PORT_ERR`).
    PortError {
        /// Port number.
        port: u8,
    },
    /// A QP hit a fatal error and moved to the error state
    /// (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// Queue pair number.
        qpn: u32,
    },
    /// A remote peer violated this responder QP's access rules; the QP is
    /// in the error state (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// Queue pair number.
        qpn: u32,
    },
    /// An invalid request reached this responder QP (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError {
        /// Queue pair number.
        qpn: u32,
    },
    /// A completion queue overran (`IBV_EVENT_CQ_ERR`).
    CqError,
    /// The device is unusable (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
    /// A GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange {
        /// Port number.
        port: u8,
    },
    /// Any other event, with its raw `enum ibv_event_type` value.
    Other {
        /// Raw event type.
        raw: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_unknowns_are_kept() {
        for raw in 0..8 {
            assert_eq!(PortState::from_raw(raw).as_raw(), raw);
        }
        assert_eq!(PortState::from_raw(4), PortState::Active);
        assert_eq!(PortState::from_raw(99), PortState::Unknown(99));
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(Mtu::from_raw(m.as_raw()), Some(m));
        }
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_raw(0), None);
        assert_eq!(LinkLayer::from_raw(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_raw(9), LinkLayer::Unknown(9));
        assert_eq!(Width::from_raw(2).lanes(), 4);
        assert_eq!(Speed::from_raw(32), Speed::Edr);
        assert_eq!(QpState::from_raw(6), QpState::Error);
    }

    #[test]
    fn access_flags() {
        let rw = Access::remote_read_write();
        assert!(rw.contains(Access::REMOTE_WRITE) && rw.contains(Access::LOCAL_WRITE));
        assert!(rw.is_remote() && rw.is_valid());
        assert!(!Access::local_only().is_remote());
        assert!(!Access::REMOTE_WRITE.is_valid());
        assert!(Access::REMOTE_READ.is_valid());
        assert_eq!(format!("{:?}", Access::NONE), "Access(NONE)");
        assert_eq!(
            format!("{rw:?}"),
            "Access(LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ)"
        );
        assert_eq!(rw.bits(), 7);
    }

    #[test]
    fn gid_display_and_ipv4() {
        let g = Gid::from_ipv4([192, 168, 1, 2]);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c0a8:0102");
        assert!(!g.is_zero());
        assert!(Gid::ZERO.is_zero());
    }
}
