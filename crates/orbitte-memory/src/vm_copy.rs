//! Copies the kernel makes for us, for memory that may be unmapped or
//! write-protected while we hold its address.
//!
//! `process_vm_writev(2)` on our own process reads the source and writes
//! the destination with the kernel's user-copy routines: a page that is not
//! mapped with the access the copy needs stops the call with `EFAULT` (or a
//! short count), never with `SIGSEGV`. One call moves a whole range (the
//! kernel pins the destination's pages a batch at a time), so a copy costs
//! one system call plus the page pinning, not one call per page.
//!
//! What the kernel cannot tell is whether a range was unmapped and then
//! mapped again by something else: it copies into whatever is mapped there.
//! Callers must still keep their memory mapped while it is in use; these
//! copies only turn the mistake of unmapping it into an error.

use std::io;

/// Bytes of the pattern one [`fill`] call repeats.
const PATTERN: usize = 4096;
/// Pattern iovecs per [`fill`] call (1 MiB a call; Linux takes up to 1024).
const FILL_IOVS: usize = 256;

/// Why a kernel copy stopped before its end.
#[derive(Debug)]
pub(crate) enum Stop {
    /// A page of the source or the destination is not mapped with the
    /// access the copy needs (unmapped, or the destination not writable).
    Fault,
    /// The system call failed for another reason: `process_vm_writev` is
    /// blocked (seccomp: `EPERM`, `ENOSYS`) or the kernel is out of memory.
    Os(io::Error),
}

/// Bytes moved by one call, or why it moved none.
fn advance(n: isize) -> Result<usize, Stop> {
    if n > 0 {
        return Ok(n.unsigned_abs());
    }
    if n == 0 {
        // Nothing moved although bytes were asked for: the first page of
        // one side is not accessible.
        return Err(Stop::Fault);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EFAULT) => Err(Stop::Fault),
        Some(libc::EINTR) => Ok(0),
        _ => Err(Stop::Os(e)),
    }
}

/// One `process_vm_writev` on this process: the bytes named by `local`
/// are written to the bytes named by `remote`.
///
/// # Safety
/// Every iovec names memory that no Rust reference aliases while the call
/// runs, except that a `local` iovec may name bytes behind a shared
/// reference (they are only read). The memory need not be mapped.
unsafe fn writev(local: &[libc::iovec], remote: &libc::iovec) -> Result<usize, Stop> {
    // SAFETY: getpid has no preconditions. The kernel reads the `local`
    // iovecs and writes the `remote` one with its fault-handling user-copy
    // routines (an inaccessible page is EFAULT or a short count, never a
    // signal); no Rust reference aliases what it writes (the caller's
    // promise); both iovec arrays outlive the call.
    let n = unsafe {
        libc::process_vm_writev(
            libc::getpid(),
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote,
            1,
            0,
        )
    };
    advance(n)
}

/// Copies `len` bytes from `src` to `dst` through the kernel.
///
/// # Safety
/// `dst..dst+len` must not be aliased by any Rust reference while the call
/// runs, and the two ranges must not overlap (the kernel copies forward
/// page by page, not as `memmove`). Neither range needs to be mapped.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Stop> {
    let mut done = 0;
    while done < len {
        let local = libc::iovec {
            iov_base: src.wrapping_add(done).cast_mut().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: dst.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        // SAFETY: `remote` is `dst`'s rest, which nothing aliases (the
        // caller's promise); `local` is `src`'s rest, only read.
        done += unsafe { writev(std::slice::from_ref(&local), &remote) }?;
    }
    Ok(())
}

/// Sets `len` bytes at `dst` to `byte` through the kernel.
///
/// # Safety
/// As for [`copy`]'s destination: no Rust reference aliases
/// `dst..dst+len` while the call runs; it need not be mapped.
pub(crate) unsafe fn fill(dst: *mut u8, len: usize, byte: u8) -> Result<(), Stop> {
    let pattern = [byte; PATTERN];
    let piece = libc::iovec {
        iov_base: pattern.as_ptr().cast_mut().cast(),
        iov_len: PATTERN,
    };
    let local = [piece; FILL_IOVS];
    let mut done = 0;
    while done < len {
        let want = (len - done).min(PATTERN * FILL_IOVS);
        let remote = libc::iovec {
            iov_base: dst.wrapping_add(done).cast(),
            iov_len: want,
        };
        let iovs = want.div_ceil(PATTERN);
        // SAFETY: `remote` is part of `dst`, which nothing aliases (the
        // caller's promise); every `local` iovec names `pattern`, a live
        // array only read.
        done += unsafe { writev(&local[..iovs], &remote) }?;
    }
    Ok(())
}
