//! Errors of decoding and encoding frames.
//!
//! Every malformed frame yields a [`DecodeError`] that names the frame, the
//! field and what was wrong with it ([`Problem`]). The engine turns it into an
//! `Error` frame with [`DecodeError::error_code`] and closes the session.

use crate::frame_type::FrameType;
use crate::types::ErrorCode;

/// What was wrong with a field. Shared by [`DecodeError`] and [`EncodeError`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The buffer ended before the field did.
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// The first four bytes were not `OBTE`: the peer is not an OrbitTE
    /// engine (or is another engine's wire, which is not supported).
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// The peer speaks another protocol version. There is no fallback.
    UnsupportedVersion {
        /// Our version ([`crate::PROTOCOL_VERSION`]).
        ours: u16,
        /// The version the peer sent.
        theirs: u16,
    },
    /// The frame type is not defined by this protocol version.
    UnknownFrameType,
    /// A length is larger than the protocol allows.
    TooLong {
        /// The length found (bytes).
        len: u64,
        /// The largest allowed (bytes).
        max: u64,
    },
    /// A length is smaller than the frame's fixed part.
    TooShort {
        /// The length found (bytes).
        len: u64,
        /// The smallest allowed (bytes).
        min: u64,
    },
    /// A list has more elements than the protocol allows.
    TooMany {
        /// The element count found.
        count: usize,
        /// The largest allowed.
        max: usize,
    },
    /// Bytes were left after the last field of a frame body.
    TrailingBytes {
        /// How many bytes were left.
        count: usize,
    },
    /// A text field is not UTF-8.
    InvalidUtf8,
    /// A field that must not be empty (or zero) is.
    Empty,
    /// A value is outside the field's domain.
    OutOfRange {
        /// The value found.
        value: u64,
        /// What the field must hold.
        expected: &'static str,
    },
    /// An option tag or boolean is neither 0 nor 1.
    InvalidTag {
        /// The tag found.
        tag: u8,
    },
    /// The same identifier appears twice in one list.
    Duplicate {
        /// The repeated identifier.
        value: u64,
    },
    /// A field disagrees with another field of the same frame.
    Inconsistent {
        /// What the rule is.
        rule: &'static str,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} left")
            }
            Self::BadMagic { found } => write!(
                f,
                "bad magic {found:02x?}, expected \"OBTE\": the peer is not an orbitte engine"
            ),
            Self::UnsupportedVersion { ours, theirs } => write!(
                f,
                "peer speaks orbitte protocol version {theirs}, we speak {ours}; \
                 upgrade both engines to the same release (no fallback exists)"
            ),
            Self::UnknownFrameType => write!(f, "frame type not defined by this protocol version"),
            Self::TooLong { len, max } => write!(f, "length {len} exceeds the maximum {max}"),
            Self::TooShort { len, min } => write!(f, "length {len} is below the minimum {min}"),
            Self::TooMany { count, max } => {
                write!(f, "{count} elements exceed the maximum {max}")
            }
            Self::TrailingBytes { count } => write!(f, "{count} trailing bytes after the body"),
            Self::InvalidUtf8 => write!(f, "text is not utf-8"),
            Self::Empty => write!(f, "must not be empty or zero"),
            Self::OutOfRange { value, expected } => {
                write!(f, "value {value} out of range: expected {expected}")
            }
            Self::InvalidTag { tag } => write!(f, "tag {tag} is neither 0 nor 1"),
            Self::Duplicate { value } => write!(f, "identifier {value} appears twice"),
            Self::Inconsistent { rule } => write!(f, "inconsistent: {rule}"),
        }
    }
}

/// A frame could not be decoded: which frame, which field, what was wrong.
///
/// The peer sent something wrong (rustls' "peer misbehaved" class): the
/// engine answers with an `Error` frame carrying [`DecodeError::error_code`]
/// and closes the session. Nothing was applied anywhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {frame} frame: field `{field}`: {problem}")]
pub struct DecodeError {
    /// The frame being decoded (from the header; may be an unknown type).
    pub frame: FrameType,
    /// The field, as named in docs/protocol.md (`header.magic`,
    /// `range.rkey.nic_id`, ...).
    pub field: &'static str,
    /// What was wrong.
    pub problem: Problem,
}

impl DecodeError {
    pub(crate) fn new(frame: FrameType, field: &'static str, problem: Problem) -> Self {
        Self {
            frame,
            field,
            problem,
        }
    }

    /// The stable code to put in the `Error` frame sent before closing.
    pub fn error_code(&self) -> ErrorCode {
        match self.problem {
            Problem::BadMagic { .. } => ErrorCode::NOT_ORBITTE,
            Problem::UnsupportedVersion { .. } => ErrorCode::UNSUPPORTED_VERSION,
            Problem::UnknownFrameType => ErrorCode::UNKNOWN_FRAME_TYPE,
            Problem::TooLong { .. } if self.field == "header.body_len" => {
                ErrorCode::FRAME_TOO_LARGE
            }
            _ => ErrorCode::MALFORMED_FRAME,
        }
    }

    /// Whether more bytes could turn this error into a successful decode
    /// (the buffer holds a proper prefix of a frame).
    pub fn is_truncation(&self) -> bool {
        matches!(self.problem, Problem::Truncated { .. })
    }
}

/// A frame value cannot be encoded: it breaks a protocol bound or rule.
///
/// The caller built a frame the protocol cannot carry (API misuse class);
/// the same rules make the decoder reject such a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {frame} frame: field `{field}`: {problem}")]
pub struct EncodeError {
    /// The frame being encoded.
    pub frame: FrameType,
    /// The offending field.
    pub field: &'static str,
    /// What was wrong.
    pub problem: Problem,
}

impl From<DecodeError> for EncodeError {
    fn from(e: DecodeError) -> Self {
        Self {
            frame: e.frame,
            field: e.field,
            problem: e.problem,
        }
    }
}
