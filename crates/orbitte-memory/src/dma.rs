//! Bounds-checked raw copies between any [`DmaBuffer`] and Rust slices.
//!
//! [`HostMemory`](crate::HostMemory)'s copy methods use these, and so can
//! other DMA-able buffers (orbitte-cuda's pinned bounce buffers): the
//! [`DmaBuffer`] contract promises exactly what a raw copy needs (one
//! mapping of `len()` bytes, valid while the value lives, readable at any
//! time and writable when [`is_writable`](DmaBuffer::is_writable)), so
//! these are safe functions. No Rust reference into the buffer is ever
//! made.

use crate::{DmaBuffer, MemoryError};

/// Checks that `offset..offset+len` lies inside `buf`.
pub fn check<B: DmaBuffer + ?Sized>(buf: &B, offset: usize, len: usize) -> Result<(), MemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.len() => Ok(()),
        _ => Err(MemoryError::OutOfBounds {
            offset,
            len,
            size: buf.len(),
        }),
    }
}

/// Copies `dst.len()` bytes of `buf` at `offset` into `dst`.
pub fn read_at<B: DmaBuffer + ?Sized>(
    buf: &B,
    offset: usize,
    dst: &mut [u8],
) -> Result<(), MemoryError> {
    check(buf, offset, dst.len())?;
    // SAFETY: bounds checked above, and the DmaBuffer contract makes the
    // range readable through the pointer at any time; `dst` is a distinct
    // Rust buffer, so the regions do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

/// Copies `src` into `buf` at `offset`. Refused with
/// [`MemoryError::ReadOnly`] when `buf` is not writable.
pub fn write_at<B: DmaBuffer + ?Sized>(
    buf: &B,
    offset: usize,
    src: &[u8],
) -> Result<(), MemoryError> {
    check(buf, offset, src.len())?;
    if !buf.is_writable() {
        return Err(MemoryError::ReadOnly);
    }
    // SAFETY: bounds checked above; the range is writable (checked above,
    // DmaBuffer contract); `src` is a distinct Rust buffer.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buf.as_ptr().add(offset), src.len()) };
    Ok(())
}

/// Sets `len` bytes of `buf` at `offset` to `byte`. Refused with
/// [`MemoryError::ReadOnly`] when `buf` is not writable.
pub fn fill<B: DmaBuffer + ?Sized>(
    buf: &B,
    offset: usize,
    len: usize,
    byte: u8,
) -> Result<(), MemoryError> {
    check(buf, offset, len)?;
    if !buf.is_writable() {
        return Err(MemoryError::ReadOnly);
    }
    // SAFETY: bounds checked above and the range is writable (checked
    // above, DmaBuffer contract).
    unsafe { std::ptr::write_bytes(buf.as_ptr().add(offset), byte, len) };
    Ok(())
}
