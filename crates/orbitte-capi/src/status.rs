//! Status codes, the thread-local last error, and the guard every entry
//! point runs its body in.
//!
//! The negative codes NIXL's backends return have NIXL's numbers
//! (`nixl_status_t`), so a backend written over this API passes them on
//! unchanged; the codes only this API has are -20 and below.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What every call returns (as an `int32_t`). In C these are enumerators,
/// safe in any expression; Rust code uses the `i32` constants of the same
/// names.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum orbitte_status {
    /// Success.
    ORBITTE_OK = 0,
    /// A transfer is still moving (`orbitte_xfer_post`, `orbitte_xfer_check`).
    ORBITTE_IN_PROGRESS = 1,
    /// No notification is waiting (`orbitte_notif_poll`).
    ORBITTE_EMPTY = 2,
    /// The transfer was never posted: post it first.
    ORBITTE_ERR_NOT_POSTED = -1,
    /// An argument was refused: a null pointer, a zero length, an unknown
    /// operation or flag, text that is not UTF-8, a notification too large.
    ORBITTE_ERR_INVALID_PARAM = -2,
    /// The engine failed underneath: it could not be built, listen, register,
    /// or a request of a transfer did not complete.
    ORBITTE_ERR_BACKEND = -3,
    /// An address is in no registration of this engine, or in no range the
    /// peer published.
    ORBITTE_ERR_NOT_FOUND = -4,
    /// Connection info or public data that is not this API's, or names
    /// another engine (or an older incarnation) than the one that answered.
    ORBITTE_ERR_MISMATCH = -5,
    /// The call is not allowed in this state (deregistering memory that
    /// requests still use, connection info of an engine without a listener).
    ORBITTE_ERR_NOT_ALLOWED = -6,
    /// The transfer is still in flight: wait until `orbitte_xfer_check` says
    /// it ended before posting it again.
    ORBITTE_ERR_REPOST_ACTIVE = -7,
    /// What was asked for is not available here (CUDA device memory on a
    /// machine without the CUDA driver or a device).
    ORBITTE_ERR_NOT_SUPPORTED = -9,
    /// The peer cannot be reached, went away, restarted, or was disconnected.
    ORBITTE_ERR_REMOTE_DISCONNECT = -10,
    /// The handle names no live engine, registration, peer or transfer
    /// (destroyed, released, or never made).
    ORBITTE_ERR_BAD_HANDLE = -20,
    /// The output buffer is too small (or null): the length needed was
    /// written where the call writes lengths.
    ORBITTE_ERR_BUFFER_TOO_SMALL = -21,
    /// A bug in this library: it panicked. The panic was caught, the engine
    /// may be left in any state; `orbitte_last_error` says where.
    ORBITTE_ERR_PANIC = -22,
}

// The same codes as `i32`, the type every entry point returns.
/// cbindgen:ignore
pub const ORBITTE_OK: i32 = orbitte_status::ORBITTE_OK as i32;
/// cbindgen:ignore
pub const ORBITTE_IN_PROGRESS: i32 = orbitte_status::ORBITTE_IN_PROGRESS as i32;
/// cbindgen:ignore
pub const ORBITTE_EMPTY: i32 = orbitte_status::ORBITTE_EMPTY as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_NOT_POSTED: i32 = orbitte_status::ORBITTE_ERR_NOT_POSTED as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_INVALID_PARAM: i32 = orbitte_status::ORBITTE_ERR_INVALID_PARAM as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_BACKEND: i32 = orbitte_status::ORBITTE_ERR_BACKEND as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_NOT_FOUND: i32 = orbitte_status::ORBITTE_ERR_NOT_FOUND as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_MISMATCH: i32 = orbitte_status::ORBITTE_ERR_MISMATCH as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_NOT_ALLOWED: i32 = orbitte_status::ORBITTE_ERR_NOT_ALLOWED as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_REPOST_ACTIVE: i32 = orbitte_status::ORBITTE_ERR_REPOST_ACTIVE as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_NOT_SUPPORTED: i32 = orbitte_status::ORBITTE_ERR_NOT_SUPPORTED as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_REMOTE_DISCONNECT: i32 = orbitte_status::ORBITTE_ERR_REMOTE_DISCONNECT as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_BAD_HANDLE: i32 = orbitte_status::ORBITTE_ERR_BAD_HANDLE as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_BUFFER_TOO_SMALL: i32 = orbitte_status::ORBITTE_ERR_BUFFER_TOO_SMALL as i32;
/// cbindgen:ignore
pub const ORBITTE_ERR_PANIC: i32 = orbitte_status::ORBITTE_ERR_PANIC as i32;

/// The name of one of this API's constants, for a message: checked to
/// exist, and written as C code names it.
macro_rules! c_name {
    ($name:ident) => {{
        let _ = $name;
        stringify!($name)
    }};
}
pub(crate) use c_name;

/// An error of one call: its code and what to tell the caller.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ORBITTE_ERR_INVALID_PARAM, message)
    }

    pub(crate) fn null(argument: &str) -> Self {
        Self::invalid(format!(
            "`{argument}` is a null pointer: pass a valid pointer"
        ))
    }

    pub(crate) fn bad_handle(what: &str, value: u64) -> Self {
        Self::new(
            ORBITTE_ERR_BAD_HANDLE,
            format!(
                "{what} handle {value:#x} is not live (destroyed, released or never made): use one this engine returned"
            ),
        )
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(message: &str) {
    // An interior NUL cannot end up in a C string: it is shown as U+FFFD.
    let text = CString::new(message.replace('\0', "\u{fffd}")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(text));
}

/// Runs one entry point's body: its `Ok` code is returned (the last error
/// cleared); a failure's code is returned with its message kept for
/// `orbitte_last_error`; a panic is caught and becomes
/// [`ORBITTE_ERR_PANIC`], so no unwinding crosses into C.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<i32, Failure>) -> i32 {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => {
            LAST_ERROR.with(|e| *e.borrow_mut() = None);
            code
        }
        Ok(Err(f)) => {
            set_last_error(&format!("{name}: {}", f.message));
            f.code
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            set_last_error(&format!(
                "{name}: internal error (a bug in orbitte, please report it): {why}"
            ));
            ORBITTE_ERR_PANIC
        }
    }
}

/// The message of the last call on this thread that failed, or NULL when
/// the last call succeeded. The text stays valid until the next call of
/// this API on the same thread; copy it to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn orbitte_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |s| s.as_ptr()))
    })
    .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> Option<String> {
        let p = orbitte_last_error();
        // SAFETY: a non-null pointer from orbitte_last_error is a NUL-terminated
        // string that stays valid until the next call on this thread.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    #[test]
    fn a_panic_becomes_a_code_and_a_message() {
        let code = guard("orbitte_test", || panic!("boom"));
        assert_eq!(code, ORBITTE_ERR_PANIC);
        let msg = last().expect("a message");
        assert!(
            msg.contains("orbitte_test") && msg.contains("boom"),
            "{msg}"
        );
    }

    #[test]
    fn a_failure_keeps_its_message_until_a_call_succeeds() {
        let code = guard("orbitte_test", || Err(Failure::null("out")));
        assert_eq!(code, ORBITTE_ERR_INVALID_PARAM);
        assert!(last().unwrap().contains("`out` is a null pointer"));
        assert_eq!(guard("orbitte_test", || Ok(ORBITTE_OK)), ORBITTE_OK);
        assert_eq!(last(), None);
    }
}
