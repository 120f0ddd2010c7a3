//! Big-endian primitives with field-named errors (crate-private).
//!
//! The reader never indexes out of bounds (every access goes through
//! `take`), and never reserves capacity for more list elements than the bytes
//! left could encode at the element's minimum wire size: allocation is
//! bounded by the body length (see `docs/protocol.md`, "Bounds").

use crate::error::{DecodeError, EncodeError, Problem};
use crate::frame_type::FrameType;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    frame: FrameType,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(frame: FrameType, buf: &'a [u8]) -> Self {
        Self { buf, frame }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn err(&self, field: &'static str, problem: Problem) -> DecodeError {
        DecodeError::new(self.frame, field, problem)
    }

    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(self.err(
                field,
                Problem::Truncated {
                    needed: n,
                    available: self.buf.len(),
                },
            ));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, field)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// A 0/1 tag (option presence or boolean).
    pub(crate) fn tag(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(self.err(field, Problem::InvalidTag { tag })),
        }
    }

    /// `u8` length then that many bytes.
    pub(crate) fn bytes8(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u8(field)?);
        self.take(n, field)
    }

    /// `u16` length then that many bytes, at most `max`.
    pub(crate) fn bytes16(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u16(field)?);
        if n > max {
            return Err(self.err(
                field,
                Problem::TooLong {
                    len: n as u64,
                    max: max as u64,
                },
            ));
        }
        self.take(n, field)
    }

    /// `u32` length then that many bytes, at most `max`. The length is
    /// checked against `max` and the bytes left before anything is taken.
    pub(crate) fn bytes32(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(field)? as usize;
        if n > max {
            return Err(self.err(
                field,
                Problem::TooLong {
                    len: n as u64,
                    max: max as u64,
                },
            ));
        }
        self.take(n, field)
    }

    /// A UTF-8 string of `bytes8` or `bytes16` form.
    pub(crate) fn utf8(bytes: &[u8]) -> Result<String, Problem> {
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| Problem::InvalidUtf8)
    }

    /// A list count (`u8` when `wide` is false, `u16` otherwise), checked
    /// against `max` and against the bytes left at `min_elem` bytes each.
    /// The returned count is safe to pass to `Vec::with_capacity`.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        wide: bool,
        max: usize,
        min_elem: usize,
    ) -> Result<usize, DecodeError> {
        let count = if wide {
            usize::from(self.u16(field)?)
        } else {
            usize::from(self.u8(field)?)
        };
        if count > max {
            return Err(self.err(field, Problem::TooMany { count, max }));
        }
        let needed = count.saturating_mul(min_elem);
        if needed > self.remaining() {
            return Err(self.err(
                field,
                Problem::Truncated {
                    needed,
                    available: self.remaining(),
                },
            ));
        }
        Ok(count)
    }

    /// The body must be fully consumed.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::new(
                self.frame,
                "body",
                Problem::TrailingBytes {
                    count: self.buf.len(),
                },
            ))
        }
    }
}

pub(crate) struct Writer<'a> {
    out: &'a mut Vec<u8>,
    frame: FrameType,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(frame: FrameType, out: &'a mut Vec<u8>) -> Self {
        Self { out, frame }
    }

    pub(crate) fn err(&self, field: &'static str, problem: Problem) -> EncodeError {
        EncodeError {
            frame: self.frame,
            field,
            problem,
        }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.put(&v.to_be_bytes());
    }

    pub(crate) fn tag(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// Callers validated `bytes.len() <= 255` (newtype invariants).
    pub(crate) fn bytes8(&mut self, field: &'static str, bytes: &[u8]) -> Result<(), EncodeError> {
        let n = u8::try_from(bytes.len()).map_err(|_| {
            self.err(
                field,
                Problem::TooLong {
                    len: bytes.len() as u64,
                    max: 255,
                },
            )
        })?;
        self.u8(n);
        self.put(bytes);
        Ok(())
    }

    pub(crate) fn bytes16(
        &mut self,
        field: &'static str,
        bytes: &[u8],
        max: usize,
    ) -> Result<(), EncodeError> {
        if bytes.len() > max {
            return Err(self.err(
                field,
                Problem::TooLong {
                    len: bytes.len() as u64,
                    max: max as u64,
                },
            ));
        }
        // max <= u16::MAX is a protocol constant.
        self.u16(bytes.len() as u16);
        self.put(bytes);
        Ok(())
    }

    /// `u32` length then the bytes, at most `max`.
    pub(crate) fn bytes32(
        &mut self,
        field: &'static str,
        bytes: &[u8],
        max: usize,
    ) -> Result<(), EncodeError> {
        let n = u32::try_from(bytes.len())
            .ok()
            .filter(|n| *n as usize <= max);
        let Some(n) = n else {
            return Err(self.err(
                field,
                Problem::TooLong {
                    len: bytes.len() as u64,
                    max: max as u64,
                },
            ));
        };
        self.u32(n);
        self.put(bytes);
        Ok(())
    }

    /// A list count, `u8` or `u16` wide, at most `max`.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        wide: bool,
        count: usize,
        max: usize,
    ) -> Result<(), EncodeError> {
        if count > max {
            return Err(self.err(field, Problem::TooMany { count, max }));
        }
        if wide {
            self.u16(count as u16);
        } else {
            self.u8(count as u8);
        }
        Ok(())
    }
}
