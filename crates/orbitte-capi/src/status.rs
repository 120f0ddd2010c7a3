//! Status codes, the thread-local last error, and the guard every entry
//! point runs its body in.
//!
//! The negative codes NIXL's backends return have NIXL's numbers
//! (`nixl_status_t`), so a backend written over this API passes them on
//! unchanged; the codes only this API has are -20 and below.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Success.
pub const ORBITTE_OK: i32 = 0;
/// A transfer is still moving (`orbitte_xfer_post`, `orbitte_xfer_check`).
pub const ORBITTE_IN_PROGRESS: i32 = 1;
/// No notification is waiting (`orbitte_notif_poll`).
pub const ORBITTE_EMPTY: i32 = 2;
/// The transfer was never posted: post it first.
pub const ORBITTE_ERR_NOT_POSTED: i32 = -1;
/// An argument was refused: a null pointer, a zero length, an unknown
/// operation or flag, text that is not UTF-8, a notification too large.
pub const ORBITTE_ERR_INVALID_PARAM: i32 = -2;
/// The engine failed underneath: it could not be built, listen, register,
/// or a request of a transfer did not complete.
pub const ORBITTE_ERR_BACKEND: i32 = -3;
/// An address is in no registration of this engine, or in no range the
/// peer published.
pub const ORBITTE_ERR_NOT_FOUND: i32 = -4;
/// Connection info or public data that is not this API's, or names
/// another engine (or an older incarnation) than the one that answered.
pub const ORBITTE_ERR_MISMATCH: i32 = -5;
/// The call is not allowed in this state (deregistering memory that
/// requests still use, connection info of an engine without a listener).
pub const ORBITTE_ERR_NOT_ALLOWED: i32 = -6;
/// The transfer is still in flight: wait until `orbitte_xfer_check` says
/// it ended before posting it again.
pub const ORBITTE_ERR_REPOST_ACTIVE: i32 = -7;
/// The peer cannot be reached, went away, restarted, or was disconnected.
pub const ORBITTE_ERR_REMOTE_DISCONNECT: i32 = -10;
/// The handle names no live engine, registration, peer or transfer
/// (destroyed, released, or never made).
pub const ORBITTE_ERR_BAD_HANDLE: i32 = -20;
/// The output buffer is too small (or null): the length needed was
/// written where the call writes lengths.
pub const ORBITTE_ERR_BUFFER_TOO_SMALL: i32 = -21;
/// A bug in this library: it panicked. The panic was caught, the engine
/// may be left in any state; `orbitte_last_error` says where.
pub const ORBITTE_ERR_PANIC: i32 = -22;

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
