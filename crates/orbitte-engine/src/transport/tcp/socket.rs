//! What both ends of a tcp session share about their socket: how many
//! answered bytes one end holds back ([`ANSWER_BATCH`]), the sizing of
//! the socket's buffers and the sender's unsent mark.

use std::net::TcpStream;
use std::os::fd::AsFd as _;

/// Bytes of answered slices that one end of a tcp session holds back at
/// most while data keeps arriving: a target sends its gathered WRITE
/// answers, and an initiator's reader hands its completions to the
/// engine, once they cover this many bytes, instead of waiting for the
/// stream to pause. Answers that arrived count in the completed prefix
/// (docs/contract.md) even when the connection dies before the stream
/// pauses; below the bound, several small answers still share one
/// `send` and one delivery. Both ends also pass on what they hold before
/// they wait on the socket, whatever it covers.
pub(crate) const ANSWER_BATCH: u64 = 1 << 20;

/// Asks for `size`-byte send and receive buffers on an established
/// session's socket (best effort: the kernel caps them at
/// `net.core.wmem_max`/`rmem_max`, and a refusal leaves autotuning on).
pub(crate) fn size_socket_buffers(s: &TcpStream, size: Option<usize>) {
    if let Some(n) = size.filter(|n| *n > 0) {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, n);
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size(s, n);
    }
}

/// Sets a rail's socket's unsent mark (`SessionConfig::unsent_limit`; best
/// effort, like the buffer sizes: a refusal leaves the kernel's default).
pub(crate) fn limit_unsent(s: &TcpStream, limit: Option<u32>) {
    if let Some(n) = limit
        && let Err(e) = orbitte_memory::set_notsent_lowat(s.as_fd(), n)
    {
        tracing::debug!(error = %e, "cannot set the socket's unsent mark; the kernel's default stays");
    }
}

/// Whether the connection stays on this host: its peer is a loopback
/// address or this end's own. Either address unknown: `false`.
pub(crate) fn same_host(s: &TcpStream) -> bool {
    match (s.local_addr(), s.peer_addr()) {
        (Ok(here), Ok(there)) => there.ip().is_loopback() || there.ip() == here.ip(),
        _ => false,
    }
}

/// Most bytes a payload that waits for more asks the socket to queue
/// before its reader is woken (`SO_RCVLOWAT`): each wake-up then reads up
/// to this much in one `recvmsg` instead of a segment or two, which on
/// loopback also sends fewer window updates (and runs fewer of the
/// sender's transmits on the reader's thread). A target's WRITE payloads
/// and an initiator's READ answers both use it.
pub(crate) const PAYLOAD_LOWAT: usize = 256 << 10;

/// The receive mark for a payload with `rest` bytes still to come: while
/// its reader waits for them (`waits`), woken once a good part of the rest
/// is queued, not at every segment, and never asked for more than the
/// rest (its last bytes always wake it); otherwise 1, so the next frame's
/// few header bytes wake the reader.
pub(crate) fn receive_mark(waits: bool, rest: usize) -> u32 {
    if !waits {
        return 1;
    }
    u32::try_from(rest.min(PAYLOAD_LOWAT)).map_or(1, |m| m.max(1))
}
