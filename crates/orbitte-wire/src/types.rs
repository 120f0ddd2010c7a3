//! Field types of the frames: identifiers, keys and the wire enums.
//!
//! Wire enums keep unknown values (`struct ErrorCode(u16)` with named
//! constants, rustls' habit): a frame from a peer that knows a code we do not
//! still decodes, and the unknown value is shown as a number.

/// A text field could not be built: empty or too long.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The text is empty but the field requires at least one byte.
    #[error("{what} must not be empty")]
    Empty {
        /// The field (`source id`, `host id`).
        what: &'static str,
    },
    /// The text is longer than the field allows.
    #[error("{what} is {len} bytes, the maximum is {max}; use a shorter one")]
    TooLong {
        /// The field.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The maximum in bytes.
        max: usize,
    },
}

/// Writes peer-supplied text for a log or an error message: control
/// characters (newlines, terminal escapes), bidirectional-text overrides and
/// backslashes come out escaped (`\n`, `\u{1b}`, `\\`), so text from the
/// network can neither start a forged log line nor drive a terminal.
fn write_escaped(f: &mut std::fmt::Formatter<'_>, s: &str) -> std::fmt::Result {
    use std::fmt::Write as _;
    let mut rest = s;
    while let Some(at) = rest.find(needs_escape) {
        f.write_str(&rest[..at])?;
        let mut chars = rest[at..].chars();
        let Some(c) = chars.next() else { break };
        match c {
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c => {
                for e in c.escape_unicode() {
                    f.write_char(e)?;
                }
            }
        }
        rest = chars.as_str();
    }
    f.write_str(rest)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn short_text(what: &'static str, s: String) -> Result<String, TextError> {
    if s.is_empty() {
        Err(TextError::Empty { what })
    } else if s.len() > 255 {
        Err(TextError::TooLong {
            what,
            len: s.len(),
            max: 255,
        })
    } else {
        Ok(s)
    }
}

/// The stable identity of a source owner (an engine), chosen by its owner,
/// e.g. `"prefill-3"`. It survives restarts; the epoch tells incarnations
/// apart.
///
/// Invariant: 1 to 255 bytes of UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(String);

impl SourceId {
    /// Checks the invariant.
    pub fn new(id: impl Into<String>) -> Result<Self, TextError> {
        short_text("source id", id.into()).map(Self)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Escapes control characters (see [`SourceId::as_str`] for the raw text):
/// the text may come from a peer and may end up in a log.
impl std::fmt::Display for SourceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_escaped(f, &self.0)
    }
}

/// The identity of a host, used by the local path to decide whether a range
/// can be mapped directly (same host). Typically `/etc/machine-id` plus the
/// boot id; the engine chooses it.
///
/// Invariant: 1 to 255 bytes of UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(String);

impl HostId {
    /// Checks the invariant.
    pub fn new(id: impl Into<String>) -> Result<Self, TextError> {
        short_text("host id", id.into()).map(Self)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Escapes control characters (see [`HostId::as_str`] for the raw text):
/// the text may come from a peer and may end up in a log.
impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_escaped(f, &self.0)
    }
}

/// Human-readable text in error, goodbye and reject frames.
///
/// Invariant: at most [`Message::MAX_LEN`] bytes of UTF-8 (may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Message(String);

impl Message {
    /// The largest message in bytes.
    pub const MAX_LEN: usize = 1024;

    /// Checks the invariant.
    pub fn new(text: impl Into<String>) -> Result<Self, TextError> {
        let s = text.into();
        if s.len() > Self::MAX_LEN {
            return Err(TextError::TooLong {
                what: "message",
                len: s.len(),
                max: Self::MAX_LEN,
            });
        }
        Ok(Self(s))
    }

    /// Never fails: cuts the text at the last character boundary that fits.
    pub fn truncating(text: impl Into<String>) -> Self {
        let mut s = text.into();
        if s.len() > Self::MAX_LEN {
            let mut end = Self::MAX_LEN;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
        }
        Self(s)
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Escapes control characters (see [`Message::as_str`] for the raw text):
/// the text may come from a peer and may end up in a log.
impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write_escaped(f, &self.0)
    }
}

/// Optional features a peer offers. Unknown bits are kept and ignored: they
/// name features of a later release that this one does not use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// Host Direct RDMA (RC queue pairs, `connect-request`).
    pub const RDMA: Self = Self(1 << 0);
    /// tcp data operations (`read-request`, `write-request`).
    pub const TCP: Self = Self(1 << 1);
    /// Same-host shared memory (memfd passed over a unix socket).
    pub const LOCAL: Self = Self(1 << 2);
    /// GPU memory through pinned host staging.
    pub const CUDA_STAGING: Self = Self(1 << 3);

    /// No capability.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits both sides have.
    pub const fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// 32 random bytes, fresh per session, chosen by the caller (sans-IO: this
/// crate has no randomness). Use a CSPRNG: the proofs are only as fresh as
/// the nonces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce(pub [u8; 32]);

/// An HMAC-SHA256 authentication proof (see [`crate::auth`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthTag(pub [u8; 32]);

impl std::fmt::Debug for AuthTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthTag(")?;
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// A NIC ID: the NIC's position in the owner's topology (inert slots keep
/// theirs). Meaningful only together with the owner's source id and epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NicId(pub u16);

/// A 16-byte RDMA GID (IPv6 format; RoCE or InfiniBand).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

/// Identifies a published range within its source owner's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RangeId(pub u64);

/// Identifies a tcp data request within a session; the response echoes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Identifies an RC connection attempt within a session; accept and reject
/// echo it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectId(pub u64);

/// Access rights of a published range. Unknown bits are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// The owner's NICs may write into the range (needed to receive READ data).
    pub const LOCAL_WRITE: Self = Self(1 << 0);
    /// Peers may READ from the range.
    pub const REMOTE_READ: Self = Self(1 << 1);
    /// Peers may WRITE into the range.
    pub const REMOTE_WRITE: Self = Self(1 << 2);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for AccessFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// The secret the tcp and local paths check on every data request for a
/// range (the rkey's role on those paths). Chosen randomly per range by the
/// owner; never reused across epochs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AccessToken(pub u64);

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(..)")
    }
}

/// A 24-bit RDMA queue pair number.
///
/// Invariant: `<= 0xff_ffff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Qpn(u32);

impl Qpn {
    /// `None` when the value does not fit 24 bits.
    pub const fn new(v: u32) -> Option<Self> {
        if v <= 0xff_ffff { Some(Self(v)) } else { None }
    }
    /// The number.
    pub const fn value(self) -> u32 {
        self.0
    }
}

/// A 24-bit RDMA packet sequence number.
///
/// Invariant: `<= 0xff_ffff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// `None` when the value does not fit 24 bits.
    pub const fn new(v: u32) -> Option<Self> {
        if v <= 0xff_ffff { Some(Self(v)) } else { None }
    }
    /// The number.
    pub const fn value(self) -> u32 {
        self.0
    }
}

/// An RDMA path MTU in bytes.
///
/// Invariant: one of 256, 512, 1024, 2048, 4096.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mtu(u16);

impl Mtu {
    /// 1024 bytes, the usual RoCE MTU on 1500-byte Ethernet.
    pub const MTU_1024: Self = Self(1024);
    /// 4096 bytes.
    pub const MTU_4096: Self = Self(4096);

    /// `None` unless `bytes` is a valid IB MTU.
    pub const fn new(bytes: u16) -> Option<Self> {
        match bytes {
            256 | 512 | 1024 | 2048 | 4096 => Some(Self(bytes)),
            _ => None,
        }
    }
    /// The MTU in bytes.
    pub const fn bytes(self) -> u16 {
        self.0
    }
}

/// How a same-host peer can map a range. Unknown values are kept (a peer
/// then simply cannot use the local path for that range).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalMechanism(pub u8);

impl LocalMechanism {
    /// The range lives in a memfd that the owner passes over its unix socket
    /// (`SCM_RIGHTS`); the peer maps it at `file_offset`.
    pub const MEMFD: Self = Self(1);
}

macro_rules! wire_enum_display {
    ($ty:ident { $($name:ident => $text:literal),* $(,)? }) => {
        impl $ty {
            /// The documented name, or `None` for a value this release does
            /// not know.
            pub fn name(self) -> Option<&'static str> {
                match self {
                    $(Self::$name => Some($text),)*
                    _ => None,
                }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "unknown({})", self.0),
                }
            }
        }
    };
}

/// Stable error codes of `error` and `connect-reject` frames. Never
/// renumbered; new codes only get added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    /// A frame failed to decode ([`crate::DecodeError`]).
    pub const MALFORMED_FRAME: Self = Self(1);
    /// The peer's protocol version is not ours; the message names both.
    pub const UNSUPPORTED_VERSION: Self = Self(2);
    /// The frame type is not defined by our protocol version.
    pub const UNKNOWN_FRAME_TYPE: Self = Self(3);
    /// A valid frame arrived in a state where it is not allowed.
    pub const UNEXPECTED_FRAME: Self = Self(4);
    /// The header length field exceeds the protocol bound.
    pub const FRAME_TOO_LARGE: Self = Self(5);
    /// The bytes did not start with the OrbitTE magic.
    pub const NOT_ORBITTE: Self = Self(6);
    /// We require an authentication proof and none came.
    pub const AUTH_REQUIRED: Self = Self(7);
    /// The proof is wrong, or only one side has a cluster secret.
    pub const AUTH_FAILED: Self = Self(8);
    /// The presented epoch is older than the one recorded for the source.
    pub const STALE_EPOCH: Self = Self(9);
    /// The peer presented our own source id.
    pub const SOURCE_CONFLICT: Self = Self(10);
    /// A resource limit was hit (sessions, queue pairs, memory).
    pub const RESOURCE_EXHAUSTED: Self = Self(11);
    /// The engine is shutting down or fenced.
    pub const SHUTTING_DOWN: Self = Self(12);
    /// No rail of the request can be served (connect-reject).
    pub const NO_USABLE_RAIL: Self = Self(13);
    /// A NIC named in the request does not exist or is an inert slot.
    pub const UNKNOWN_NIC: Self = Self(14);
    /// The peer did not answer in time.
    pub const TIMEOUT: Self = Self(15);
    /// A local failure that is not the peer's fault.
    pub const INTERNAL: Self = Self(16);
}

wire_enum_display!(ErrorCode {
    MALFORMED_FRAME => "malformed-frame",
    UNSUPPORTED_VERSION => "unsupported-version",
    UNKNOWN_FRAME_TYPE => "unknown-frame-type",
    UNEXPECTED_FRAME => "unexpected-frame",
    FRAME_TOO_LARGE => "frame-too-large",
    NOT_ORBITTE => "not-orbitte",
    AUTH_REQUIRED => "auth-required",
    AUTH_FAILED => "auth-failed",
    STALE_EPOCH => "stale-epoch",
    SOURCE_CONFLICT => "source-conflict",
    RESOURCE_EXHAUSTED => "resource-exhausted",
    SHUTTING_DOWN => "shutting-down",
    NO_USABLE_RAIL => "no-usable-rail",
    UNKNOWN_NIC => "unknown-nic",
    TIMEOUT => "timeout",
    INTERNAL => "internal",
});

/// Result of a tcp data operation (`read-response`, `write-response`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Status(pub u16);

impl Status {
    /// Done: every requested byte was read or written.
    pub const OK: Self = Self(0);
    /// No published range has this id in the owner's current epoch.
    pub const UNKNOWN_RANGE: Self = Self(1);
    /// The token does not match the range's.
    pub const BAD_TOKEN: Self = Self(2);
    /// `offset + length` lies outside the range.
    pub const OUT_OF_BOUNDS: Self = Self(3);
    /// The range does not allow this operation (remote read / remote write).
    pub const ACCESS_DENIED: Self = Self(4);
    /// The range was retired; re-read the owner's descriptors.
    pub const RETIRED: Self = Self(5);
    /// The owner is out of a resource; retry later.
    pub const BUSY: Self = Self(6);
    /// The owner failed locally (e.g. memory error); nothing was written.
    pub const INTERNAL: Self = Self(7);

    /// Whether the operation succeeded.
    pub fn is_ok(self) -> bool {
        self == Self::OK
    }
}

wire_enum_display!(Status {
    OK => "ok",
    UNKNOWN_RANGE => "unknown-range",
    BAD_TOKEN => "bad-token",
    OUT_OF_BOUNDS => "out-of-bounds",
    ACCESS_DENIED => "access-denied",
    RETIRED => "retired",
    BUSY => "busy",
    INTERNAL => "internal",
});

/// What a target did with a `notification` (in `notification-answer`).
/// Unknown values are kept (a sender reads them as a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NotificationVerdict(pub u16);

impl NotificationVerdict {
    /// Queued: the target's application reads it.
    pub const QUEUED: Self = Self(0);
    /// Refused: the target holds as many notifications from this sender
    /// as it keeps (`limit`); its application must read them.
    pub const INBOX_FULL: Self = Self(1);
    /// Refused: the notifications the target holds from this sender, with
    /// this one, pass its byte budget (`limit`); its application must
    /// read them.
    pub const BYTES_FULL: Self = Self(2);
    /// Refused: this target keeps no notifications at all.
    pub const NOT_KEPT: Self = Self(3);
    /// Refused: the unread notifications the target holds from every
    /// sender, with this one, pass its engine-wide byte budget (`limit`);
    /// its application must read them.
    pub const TOTAL_FULL: Self = Self(4);

    /// Whether the target queued it.
    pub fn is_queued(self) -> bool {
        self == Self::QUEUED
    }
}

wire_enum_display!(NotificationVerdict {
    QUEUED => "queued",
    INBOX_FULL => "inbox-full",
    BYTES_FULL => "bytes-full",
    NOT_KEPT => "not-kept",
    TOTAL_FULL => "total-full",
});

/// What an initiator opens a session for (in `hello`): the responder serves
/// the connection accordingly. Unknown values are kept; a responder refuses
/// a purpose it does not serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionPurpose(pub u8);

impl SessionPurpose {
    /// Publications, tcp data requests and same-host mapping.
    pub const DATA: Self = Self(0);
    /// The rdma control link: publications both ways, then RC connect
    /// request and accept.
    pub const RDMA_CONTROL: Self = Self(1);
}

wire_enum_display!(SessionPurpose {
    DATA => "data",
    RDMA_CONTROL => "rdma-control",
});

/// Why a session ends in a `goodbye` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GoodbyeReason(pub u16);

impl GoodbyeReason {
    /// The session is no longer needed.
    pub const NORMAL: Self = Self(0);
    /// The engine is shutting down.
    pub const SHUTDOWN: Self = Self(1);
    /// The engine is restarting; it will come back with a newer epoch.
    pub const RESTART: Self = Self(2);
    /// The session was idle.
    pub const IDLE: Self = Self(3);
}

wire_enum_display!(GoodbyeReason {
    NORMAL => "normal",
    SHUTDOWN => "shutdown",
    RESTART => "restart",
    IDLE => "idle",
});
