//! What both ends of a tcp session share about their socket: how many
//! answered bytes one end holds back ([`ANSWER_BATCH`]) and the sizing of
//! the socket's buffers.

use std::net::TcpStream;

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
