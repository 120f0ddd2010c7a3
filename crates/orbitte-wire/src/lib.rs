//! The OrbitTE wire protocol: frames, versions, authoritative epochs.
//!
//! Pure encoding, decoding and peer-table rules: no I/O, no clock, no
//! randomness, no `unsafe`. `docs/protocol.md` is the specification; this
//! crate is its reference implementation.
//!
//! # Entry points
//!
//! Sending:
//! - [`Frame::encode`] appends header + body to a caller-owned buffer. For
//!   the data frames ([`WriteRequest`], [`ReadResponse`]) it writes header +
//!   fixed part only and the caller sends `length` payload bytes straight
//!   from user memory after it (vectored write, zero-copy).
//!
//! Receiving (zero-copy, header first):
//! 1. read [`HEADER_LEN`] bytes, [`FrameHeader::decode`] them;
//! 2. read [`FrameHeader::fixed_len`] bytes (at most
//!    [`MAX_CONTROL_BODY_LEN`]) and [`decode_body`] them;
//! 3. read [`FrameHeader::payload_len`] bytes straight into the destination
//!    named by the request id.
//!
//! Or, with everything in one buffer: [`decode`] / [`decode_exact`].
//!
//! ```
//! use std::io::{IoSlice, Read, Write};
//! use orbitte_wire::*;
//!
//! // Sender: header + fixed part into a small buffer, payload from user memory.
//! let user_memory = vec![7u8; 4096];
//! let req = WriteRequest {
//!     request_id: RequestId(1),
//!     range_id: RangeId(9),
//!     token: AccessToken(0x5eed),
//!     offset: 0,
//!     length: 4096,
//! };
//! let mut head = Vec::with_capacity(HEADER_LEN + WRITE_REQUEST_FIXED_LEN);
//! Frame::WriteRequest(req).encode(&mut head)?;
//! let mut socket: Vec<u8> = Vec::new(); // stands in for a TcpStream
//! socket.write_vectored(&[IoSlice::new(&head), IoSlice::new(&user_memory)])?;
//!
//! // Receiver: header, fixed part, then the payload straight into place.
//! let mut rx = &socket[..];
//! let mut h = [0u8; HEADER_LEN];
//! rx.read_exact(&mut h)?;
//! let header = FrameHeader::decode(&h)?;
//! let mut fixed = vec![0u8; header.fixed_len()]; // <= MAX_CONTROL_BODY_LEN
//! rx.read_exact(&mut fixed)?;
//! let Frame::WriteRequest(got) = decode_body(&header, &fixed)? else {
//!     unreachable!("the header said write-request")
//! };
//! let mut destination = vec![0u8; 8192]; // the registered range
//! let at = got.offset as usize;
//! rx.read_exact(&mut destination[at..at + header.payload_len() as usize])?;
//! assert_eq!(&destination[..4096], &user_memory[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Sessions: [`handshake::Initiator`] and [`handshake::Responder`] drive the
//! challenge / hello / hello-ack exchange ([`auth`] computes the proofs) and
//! feed the peer's identity to the [`PeerTable`], which applies the epoch
//! and version rules and returns what to invalidate.
//!
//! # Decoding guarantees
//!
//! Decoding never panics, never allocates more than a bound derived from the
//! body length (itself bounded by [`MAX_CONTROL_BODY_LEN`]; payloads are
//! never allocated by this crate), rejects trailing bytes in a body, rejects
//! unknown frame types, and keeps unknown values of wire enums
//! ([`ErrorCode`], [`Status`], [`Capabilities`], ...). Every failure is a
//! [`DecodeError`] naming the frame, the field and the problem. Encoding is
//! canonical: every successfully decoded frame re-encodes to the same bytes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
mod codec;
pub mod conformance;
mod epoch;
mod error;
mod frame_type;
mod frames;
pub mod handshake;
mod header;
mod peer_table;
mod types;

pub use epoch::{Epoch, EpochError};
pub use error::{DecodeError, EncodeError, Problem};
pub use frame_type::FrameType;
pub use frames::{
    Challenge, ConnectAccept, ConnectReject, ConnectRequest, Decoded, ErrorFrame, Frame, Goodbye,
    Hello, HelloAck, Identity, LocalHint, MAX_NOTIFICATION_FRAME_LEN, MAX_NOTIFICATION_LEN,
    MAX_RAILS, MAX_RANGES_PER_FRAME, MAX_RKEYS_PER_RANGE, NOTIFICATION_ANSWER_LEN,
    NOTIFICATION_OVERHEAD, NicRkey, Notification, NotificationAnswer, RailEndpoint, RailRequest,
    RangeDescriptor, ReadRequest, ReadResponse, SegmentPublication, SegmentRetire, WriteRequest,
    WriteResponse, decode, decode_body, decode_exact,
};
pub use header::{
    FrameHeader, HEADER_LEN, MAGIC, MAX_CONTROL_BODY_LEN, MAX_FRAME_LEN, MAX_PAYLOAD_LEN,
    MAX_RETIRE_BODY_LEN, MAX_SMALL_BODY_LEN, PROTOCOL_VERSION, READ_REQUEST_LEN,
    READ_RESPONSE_FIXED_LEN, WRITE_REQUEST_FIXED_LEN, WRITE_RESPONSE_LEN, max_body_len,
};
pub use peer_table::{
    Admission, AdmitError, CachedRkey, FLOOR_BUCKETS, Invalidation, PeerTable, PeerTableLimits,
    RecordError, SessionId, SourceRecord,
};
pub use types::{
    AccessFlags, AccessToken, AuthTag, Capabilities, ConnectId, ErrorCode, Gid, GoodbyeReason,
    HostId, LocalMechanism, Message, Mtu, NicId, Nonce, NotificationVerdict, Psn, Qpn, RangeId,
    RequestId, SessionPurpose, SourceId, Status, TextError,
};
