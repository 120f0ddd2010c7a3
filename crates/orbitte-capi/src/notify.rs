//! Notifications: those peers sent this engine (NIXL's `getNotifs`), and
//! one sent alone, without a transfer of the caller's (`genNotif`).

use std::time::Duration;

use orbitte::{
    DrainStatus, MAX_NOTIFICATION_LEN, Notification, NotificationStatus, RemoteTarget, Request,
    SubmitOptions,
};

use crate::args::{self, copy_out};
use crate::handle::{self, Engine, PeerEntry, lock, orbitte_engine, orbitte_peer};
use crate::status::{
    Failure, ORBITTE_EMPTY, ORBITTE_ERR_BACKEND, ORBITTE_ERR_BUFFER_TOO_SMALL,
    ORBITTE_ERR_REMOTE_DISCONNECT, ORBITTE_OK, guard,
};

/// How long `orbitte_notify` waits for its carrier request and its drain.
const NOTIFY_WAIT: Duration = Duration::from_secs(30);

/// Takes the oldest notification a peer sent this engine: the sender's
/// name (its engine's name, NUL-terminated) into `name` (capacity
/// `name_cap`, length without the NUL in `*name_len`) and its bytes into
/// `msg` (capacity `msg_cap`, length in `*msg_len`). Returns `ORBITTE_OK`,
/// or `ORBITTE_EMPTY` when none is waiting. When a buffer is too small
/// both lengths needed are written (the name's with its NUL), the call
/// returns `ORBITTE_ERR_BUFFER_TOO_SMALL`, and the notification stays
/// queued. `ORBITTE_MAX_NOTIF_LEN` bytes always hold a message.
///
/// # Safety
/// `name_len` and `msg_len` point at writable `size_t`; non-null `name`
/// and `msg` at `name_cap` and `msg_cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_notif_poll(
    engine: *const orbitte_engine,
    name: *mut u8,
    name_cap: usize,
    name_len: *mut usize,
    msg: *mut u8,
    msg_cap: usize,
    msg_len: *mut usize,
) -> i32 {
    guard("orbitte_notif_poll", || {
        let e = handle::engine(engine)?;
        if name_len.is_null() || msg_len.is_null() {
            return Err(Failure::null(if name_len.is_null() {
                "name_len"
            } else {
                "msg_len"
            }));
        }
        let mut inbox = lock(&e.inbox);
        if inbox.is_empty() {
            inbox.extend(e.engine.notifications());
        }
        let Some(n) = inbox.front() else {
            return Ok(ORBITTE_EMPTY);
        };
        // Both lengths are written, so one failed call tells both.
        // SAFETY: the caller's contract for `name`, `name_cap`, `name_len`.
        let named = unsafe {
            copy_out(
                n.source_id.as_bytes(),
                true,
                name,
                name_cap,
                name_len,
                "the sender's name",
            )
        };
        // SAFETY: the caller's contract for `msg`, `msg_cap`, `msg_len`.
        let carried =
            unsafe { copy_out(&n.payload, false, msg, msg_cap, msg_len, "the notification") };
        match (named, carried) {
            (Ok(()), Ok(())) => {
                inbox.pop_front();
                Ok(ORBITTE_OK)
            }
            (Err(f), _) | (_, Err(f)) if f.code == ORBITTE_ERR_BUFFER_TOO_SMALL => {
                Err(Failure::new(
                    f.code,
                    format!(
                        "a notification of {} bytes from {:?} does not fit: pass buffers of at least {} and {} bytes (it stays queued)",
                        n.payload.len(),
                        n.source_id,
                        n.source_id.len() + 1,
                        n.payload.len()
                    ),
                ))
            }
            (Err(f), _) | (_, Err(f)) => Err(f),
        }
    })
}

/// The one-byte READ of `p`'s anchor a notification without bytes of the
/// caller's rides on.
pub(crate) fn carrier(e: &Engine, p: &PeerEntry) -> Request {
    Request {
        op: orbitte::Op::Read,
        local: e.anchor.id,
        local_offset: 1,
        len: 1,
        remote: RemoteTarget::Address {
            peer: p.id,
            epoch: Some(p.epoch),
            address: p.anchor,
        },
        label: 0,
    }
}

/// Sends the `len` bytes at `msg` to `peer` as a notification alone
/// (NIXL's `genNotif`): it rides on a one-byte READ of the peer's anchor,
/// so it arrives once, like a transfer's. Waits until it was handed to the
/// peer's path (up to 30 s). At most `ORBITTE_MAX_NOTIF_LEN` bytes, at
/// least one.
///
/// # Safety
/// `msg` points at `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_notify(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
    msg: *const u8,
    len: usize,
) -> i32 {
    guard("orbitte_notify", || {
        let e = handle::engine(engine)?;
        let p = e.peer(peer)?;
        // SAFETY: the caller's contract for `msg` and `len`.
        let msg = unsafe { args::bytes(msg, len, "msg") }?;
        if msg.is_empty() || msg.len() > MAX_NOTIFICATION_LEN {
            return Err(Failure::invalid(format!(
                "a notification of {} bytes: send 1 to {MAX_NOTIFICATION_LEN} bytes",
                msg.len()
            )));
        }
        let carrier = carrier(&e, &p);
        let gone = |why: String| {
            Failure::new(
                ORBITTE_ERR_REMOTE_DISCONNECT,
                format!("cannot notify {:?}: {why}", p.source_id),
            )
        };
        let options = SubmitOptions::new().notification(Notification::new(msg.to_vec()));
        let ids = e
            .engine
            .submit_with(&[carrier], options)
            .map_err(|err| gone(err.to_string()))?;
        let outcome = e.engine.wait(ids[0], NOTIFY_WAIT).map_err(|err| {
            Failure::new(
                ORBITTE_ERR_BACKEND,
                format!("waiting for the notification: {err}"),
            )
        })?;
        if outcome.drain != DrainStatus::Drained {
            let _ = e.engine.wait_drain(ids[0], NOTIFY_WAIT);
        }
        match outcome.notification {
            NotificationStatus::Sent => Ok(ORBITTE_OK),
            NotificationStatus::NotSent { why } => Err(gone(why.to_string())),
            NotificationStatus::Refused { why } => Err(Failure::new(
                ORBITTE_ERR_BACKEND,
                format!("the peer refused the notification: {why}"),
            )),
            NotificationStatus::Unconfirmed { why } => Err(gone(why.to_string())),
            NotificationStatus::NotRequested => Err(gone("the engine dropped it".to_owned())),
        }
    })
}
