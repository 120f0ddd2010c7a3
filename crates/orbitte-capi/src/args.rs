//! What crosses the boundary: C strings, byte ranges and output pointers
//! read and written once each, with a null pointer refused by name. The
//! dereferences of caller pointers live here and in `memory.rs`' wrapping
//! of caller memory.

use std::ffi::{CStr, c_char};

use crate::status::{Failure, ORBITTE_ERR_BUFFER_TOO_SMALL};

/// The UTF-8 text `p` points at, or `None` for a null pointer.
///
/// # Safety
/// A non-null `p` points at a NUL-terminated string that stays valid and
/// unchanged during the call.
pub(crate) unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller promises a NUL-terminated string valid for the call.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str()
        .map(Some)
        .map_err(|e| Failure::invalid(format!("`{what}` is not UTF-8 text: {e}")))
}

/// The UTF-8 text `p` points at; a null pointer is refused.
///
/// # Safety
/// As [`opt_str`].
pub(crate) unsafe fn str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: forwarded contract.
    unsafe { opt_str(p, what) }?.ok_or_else(|| Failure::null(what))
}

/// The `len` bytes at `p` (none for `len == 0`, where `p` may be null).
///
/// # Safety
/// A non-null `p` points at `len` readable bytes that stay unchanged
/// during the call.
pub(crate) unsafe fn bytes<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(what));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "`{what}` is not aligned for its type"
        )));
    }
    // SAFETY: non-null and aligned (checked), and the caller promises `len`
    // readable elements that do not change during the call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// Writes `value` where `p` points; a null pointer is refused.
///
/// # Safety
/// A non-null `p` points at writable memory for one `T`.
pub(crate) unsafe fn put<T>(p: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "`{what}` is not aligned for its type"
        )));
    }
    // SAFETY: non-null and aligned (checked); the caller promises it is
    // writable. `write` drops nothing the caller left there.
    unsafe { p.write(value) };
    Ok(())
}

/// Copies `data` into `buf` (capacity `cap`) and writes its length to
/// `len`. With `nul`, a NUL byte follows the data (not counted in `len`).
/// A null or short `buf` gets [`ORBITTE_ERR_BUFFER_TOO_SMALL`] with the
/// length needed (NUL included) in `len`.
///
/// # Safety
/// `len` points at a writable `usize`; a non-null `buf` at `cap` writable
/// bytes.
pub(crate) unsafe fn copy_out(
    data: &[u8],
    nul: bool,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    what: &str,
) -> Result<(), Failure> {
    let needed = data.len() + usize::from(nul);
    if buf.is_null() || cap < needed {
        // SAFETY: forwarded contract.
        unsafe { put(len, needed, "len") }?;
        return Err(Failure::new(
            ORBITTE_ERR_BUFFER_TOO_SMALL,
            format!("{what} needs {needed} bytes, the buffer has {cap}: pass a larger one"),
        ));
    }
    // SAFETY: forwarded contract.
    unsafe { put(len, data.len(), "len") }?;
    // SAFETY: `buf` is non-null with `cap >= needed` writable bytes (the
    // caller's promise, the length checked above); `data` is our own memory,
    // so the two do not overlap unless the caller passed our memory back,
    // which it cannot name.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), buf, data.len());
        if nul {
            buf.add(data.len()).write(0);
        }
    }
    Ok(())
}
