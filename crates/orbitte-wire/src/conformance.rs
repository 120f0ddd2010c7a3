//! The decoder's invariants as a checkable oracle, shared by the cargo-fuzz
//! target (`fuzz/`), the stable fuzz harness (`examples/fuzz_decode.rs`) and
//! the tests.
//!
//! [`check`] decodes arbitrary bytes and verifies:
//! - decoding returns (it never panics; a panic is the fuzzer's finding);
//! - the buffered path ([`crate::decode`]) and the header-first zero-copy
//!   path ([`FrameHeader::decode`] + [`crate::decode_body`]) agree;
//! - a decoded frame re-encodes to exactly the bytes it came from
//!   (canonical encoding; an `error` frame of another protocol version
//!   re-encodes with ours, so the version field is not compared);
//! - every proper prefix of a decoded frame is reported as a truncation
//!   (checked for frames up to 4 KiB, to keep the oracle fast);
//! - error messages render.

use crate::error::DecodeError;
use crate::frames::{Frame, decode, decode_body};
use crate::header::{FrameHeader, HEADER_LEN};

/// An invariant of the codec does not hold: a bug in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The header-first path disagrees with the buffered path.
    #[error("header-first decode disagrees with buffered decode: {0}")]
    PathsDisagree(String),
    /// A decoded frame failed to encode.
    #[error("decoded frame does not re-encode: {0}")]
    ReencodeFailed(String),
    /// A decoded frame re-encodes to other bytes.
    #[error("decoded frame re-encodes to different bytes ({original} vs {reencoded} bytes)")]
    NotCanonical {
        /// Bytes of the original frame.
        original: usize,
        /// Bytes of the re-encoding.
        reencoded: usize,
    },
    /// A proper prefix of a frame was not reported as a truncation.
    #[error("prefix of {len} bytes was not reported as truncated: {outcome}")]
    PrefixNotTruncated {
        /// The prefix length.
        len: usize,
        /// What decoding it gave.
        outcome: String,
    },
}

/// Checks the invariants on `bytes`. Returns the decoded frame, `None` when
/// the bytes are (correctly) rejected, or the violated invariant.
pub fn check(bytes: &[u8]) -> Result<Option<Frame>, Violation> {
    let buffered = decode(bytes);
    let header_first = header_first(bytes);
    match (&buffered, &header_first) {
        (Ok(d), Some(Ok(f))) if d.frame == *f => {}
        (Err(_), Some(Err(_)) | None) => {}
        (b, h) => {
            return Err(Violation::PathsDisagree(format!(
                "buffered {:?}, header-first {:?}",
                b.as_ref().map(|d| &d.frame),
                h
            )));
        }
    }
    let d = match buffered {
        Ok(d) => d,
        Err(e) => {
            let _ = e.to_string();
            let _ = e.error_code();
            return Ok(None);
        }
    };
    let mut out = Vec::with_capacity(d.frame_len);
    d.frame
        .encode_with_payload(d.payload, &mut out)
        .map_err(|e| Violation::ReencodeFailed(e.to_string()))?;
    // An `error` frame from another version re-encodes with ours: compare
    // the rest.
    out[4..6].copy_from_slice(&bytes[4..6]);
    if out[..] != bytes[..d.frame_len] {
        return Err(Violation::NotCanonical {
            original: d.frame_len,
            reencoded: out.len(),
        });
    }
    if d.frame_len <= 4096 {
        for len in 0..d.frame_len {
            match decode(&bytes[..len]) {
                Err(e) if e.is_truncation() => {}
                other => {
                    return Err(Violation::PrefixNotTruncated {
                        len,
                        outcome: format!("{other:?}"),
                    });
                }
            }
        }
    }
    Ok(Some(d.frame))
}

/// The zero-copy receive path over an in-memory buffer; `None` when the
/// buffer is too short to reach the decision point.
fn header_first(bytes: &[u8]) -> Option<Result<Frame, DecodeError>> {
    let head = bytes.first_chunk::<HEADER_LEN>()?;
    let header = match FrameHeader::decode(head) {
        Ok(h) => h,
        Err(e) => return Some(Err(e)),
    };
    let fixed = bytes.get(HEADER_LEN..HEADER_LEN + header.fixed_len())?;
    let frame = decode_body(&header, fixed);
    // The payload must also be present for the buffered path to succeed.
    if frame.is_ok() && bytes.len() < header.frame_len() {
        return None;
    }
    Some(frame)
}
