//! Errno and file-descriptor helpers the native objects share.

use std::os::fd::RawFd;
use std::time::Duration;

use crate::error::NativeError;

pub(super) fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A verbs return code as an errno (some return `errno`, some `-errno`,
/// a few -1 with `errno` set).
pub(super) fn rc_errno(rc: i32) -> i32 {
    match rc {
        -1 => errno(),
        r if r < 0 => -r,
        r => r,
    }
}

/// `Ok` for a verbs call that returned 0, else the call's native error.
pub(super) fn rc_check(call: &'static str, rc: i32) -> Result<(), NativeError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(NativeError::new(call, rc_errno(rc)))
    }
}

pub(super) fn set_nonblocking(fd: RawFd) -> Result<(), i32> {
    // SAFETY: fcntl on an fd owned by libibverbs for this context; only
    // the O_NONBLOCK status flag changes.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(errno());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(errno());
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes. `Ok(true)` when
/// readable (or interrupted: callers treat it as a spurious wakeup).
pub(super) fn wait_readable(fd: RawFd, timeout: Duration) -> Result<bool, i32> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    match rc {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => match errno() {
            libc::EINTR => Ok(true),
            e => Err(e),
        },
    }
}
