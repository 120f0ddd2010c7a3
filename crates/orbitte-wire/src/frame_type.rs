//! Frame type codes.

/// The frame type field of the header. Keeps unknown values so that an error
/// can name what the peer sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameType(pub u16);

impl FrameType {
    /// Responder → initiator, first frame of a session: the responder's nonce.
    pub const CHALLENGE: Self = Self(0x0001);
    /// Initiator → responder: identity, epoch, capabilities, optional proof.
    pub const HELLO: Self = Self(0x0002);
    /// Responder → initiator: the responder's identity and optional proof.
    pub const HELLO_ACK: Self = Self(0x0003);
    /// Either side: orderly end of the session.
    pub const GOODBYE: Self = Self(0x0004);
    /// Either side: a stable error code; the sender closes the session.
    pub const ERROR: Self = Self(0x0005);
    /// Publication of registered ranges (segment descriptor).
    pub const SEGMENT_PUBLICATION: Self = Self(0x0010);
    /// Retirement (unpublication) of ranges.
    pub const SEGMENT_RETIRE: Self = Self(0x0011);
    /// RDMA RC connection request, one endpoint per rail.
    pub const CONNECT_REQUEST: Self = Self(0x0020);
    /// RDMA RC connection accept, one endpoint per requested rail.
    pub const CONNECT_ACCEPT: Self = Self(0x0021);
    /// RDMA RC connection refusal.
    pub const CONNECT_REJECT: Self = Self(0x0022);
    /// tcp path READ request.
    pub const READ_REQUEST: Self = Self(0x0030);
    /// tcp path READ response; carries the payload.
    pub const READ_RESPONSE: Self = Self(0x0031);
    /// tcp path WRITE request; carries the payload.
    pub const WRITE_REQUEST: Self = Self(0x0032);
    /// tcp path WRITE response.
    pub const WRITE_RESPONSE: Self = Self(0x0033);
    /// Initiator → target, after every request of a batch completed: the
    /// batch's notification.
    pub const NOTIFICATION: Self = Self(0x0034);
    /// Target → initiator: whether a notification was queued.
    pub const NOTIFICATION_ANSWER: Self = Self(0x0035);

    /// Every frame type of this protocol version.
    pub const ALL: [Self; 16] = [
        Self::CHALLENGE,
        Self::HELLO,
        Self::HELLO_ACK,
        Self::GOODBYE,
        Self::ERROR,
        Self::SEGMENT_PUBLICATION,
        Self::SEGMENT_RETIRE,
        Self::CONNECT_REQUEST,
        Self::CONNECT_ACCEPT,
        Self::CONNECT_REJECT,
        Self::READ_REQUEST,
        Self::READ_RESPONSE,
        Self::WRITE_REQUEST,
        Self::WRITE_RESPONSE,
        Self::NOTIFICATION,
        Self::NOTIFICATION_ANSWER,
    ];

    /// The name used in docs/protocol.md, or `None` for an unknown type.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::CHALLENGE => "challenge",
            Self::HELLO => "hello",
            Self::HELLO_ACK => "hello-ack",
            Self::GOODBYE => "goodbye",
            Self::ERROR => "error",
            Self::SEGMENT_PUBLICATION => "segment-publication",
            Self::SEGMENT_RETIRE => "segment-retire",
            Self::CONNECT_REQUEST => "connect-request",
            Self::CONNECT_ACCEPT => "connect-accept",
            Self::CONNECT_REJECT => "connect-reject",
            Self::READ_REQUEST => "read-request",
            Self::READ_RESPONSE => "read-response",
            Self::WRITE_REQUEST => "write-request",
            Self::WRITE_RESPONSE => "write-response",
            Self::NOTIFICATION => "notification",
            Self::NOTIFICATION_ANSWER => "notification-answer",
            _ => return None,
        })
    }

    /// Whether this protocol version defines the type.
    pub fn is_known(self) -> bool {
        self.name().is_some()
    }

    /// Whether frames of this type carry a payload after their fixed part
    /// (the zero-copy data frames).
    pub fn carries_payload(self) -> bool {
        matches!(self, Self::READ_RESPONSE | Self::WRITE_REQUEST)
    }
}

impl std::fmt::Display for FrameType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "unknown(0x{:04x})", self.0),
        }
    }
}
