//! The rdma control link on the target side: every TCP connection is a
//! control link over which an initiator opens its peer
//! (`TransferEngine::open_peer` there, `accept_peer` here).

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use orbitte::TransferEngine;
use orbitte::session::TcpControlLink;

/// Accepts rdma peers on `listener` (non-blocking) until `stop` is set.
/// The links stay open while this runs.
pub(crate) fn accept_rdma_peers(
    listener: &TcpListener,
    engine: &TransferEngine,
    stop: &AtomicBool,
) {
    let mut links = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let accepted = stream
                    .set_nonblocking(false)
                    .and_then(|()| TcpControlLink::new(stream, Duration::from_secs(5)));
                let mut link = match accepted {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(%from, error = %e, "control link setup failed");
                        continue;
                    }
                };
                match engine.accept_peer(&mut link) {
                    Ok(p) => {
                        tracing::info!(%from, peer = %p.source_id, rails = p.rails.len(), "rdma peer accepted");
                        links.push(link);
                    }
                    Err(e) => tracing::warn!(%from, error = %e, "rdma peer refused"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a control link failed");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
