//! `orbitte serve --metrics ADDR`: a small HTTP/1.1 responder that serves
//! `GET /metrics` in the Prometheus text format (anything else: 404, or
//! 405 for a method other than GET and HEAD).
//!
//! The metrics port is reachable by whoever reaches the address, so it is
//! built for clients that misbehave: each connection has its own thread,
//! at most [`MAX_CONNECTIONS`] at once; a request head is at most
//! [`MAX_HEAD`] bytes and must arrive within [`HEAD_TIMEOUT`] however
//! slowly it trickles in; one request per connection. When all
//! connections are taken, the one that has been sending its head the
//! longest is closed for the newcomer (as the engine's listener does with
//! unauthenticated connections), so slow clients, however many, cannot
//! keep a scraper out.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest request head read; a longer one gets 431.
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// The whole head must arrive within this; else the connection is closed.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once (see the module docs for a newcomer past
/// it).
pub(crate) const MAX_CONNECTIONS: usize = 32;
/// How long the accept loop pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);
/// Writing the answer may take this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the responder serves: the body of `GET /metrics`.
pub(crate) type Render = dyn Fn() -> String + Send + Sync;

/// Binds `addr` and serves on a thread of its own until the process
/// ends; returns the bound address (port 0: the one chosen).
pub(crate) fn start(
    addr: SocketAddr,
    content_type: &'static str,
    render: Arc<Render>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let conns = Arc::new(Conns::default());
    std::thread::Builder::new()
        .name("orbitte-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else {
                    // Out of descriptors or memory: wait for connections
                    // to close rather than spin on the failing accept.
                    std::thread::sleep(ACCEPT_PAUSE);
                    continue;
                };
                let Some(id) = conns.admit(&stream) else {
                    continue;
                };
                let (conns, render) = (conns.clone(), render.clone());
                let spawned = std::thread::Builder::new()
                    .name("orbitte-metrics-conn".into())
                    .spawn({
                        let conns = conns.clone();
                        move || {
                            answer(stream, content_type, &*render, || conns.head_read(id));
                            conns.closed(id);
                        }
                    });
                if let Err(e) = spawned {
                    conns.closed(id);
                    tracing::warn!(error = %e, "cannot spawn a thread for a metrics connection");
                }
            }
        })?;
    Ok(bound)
}

/// The connections being served.
#[derive(Debug, Default)]
struct Conns {
    table: Mutex<ConnTable>,
}

#[derive(Debug, Default)]
struct ConnTable {
    next: u64,
    live: HashMap<u64, Conn>,
}

#[derive(Debug)]
struct Conn {
    since: Instant,
    /// Still sending its request head.
    reading: bool,
    /// A handle on the socket, to close it for a newcomer.
    stream: TcpStream,
}

impl Conns {
    /// Takes `stream` on; when all connections are taken, closes the one
    /// sending its head the longest for it. `None`: no room (every
    /// connection is being answered, or the socket cannot be shared).
    fn admit(&self, stream: &TcpStream) -> Option<u64> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.live.len() >= MAX_CONNECTIONS {
            let oldest = t
                .live
                .iter()
                .filter(|(_, c)| c.reading)
                .min_by_key(|(_, c)| c.since)
                .map(|(id, _)| *id)?;
            if let Some(c) = t.live.remove(&oldest) {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
        }
        let handle = stream.try_clone().ok()?;
        t.next += 1;
        let id = t.next;
        t.live.insert(
            id,
            Conn {
                since: Instant::now(),
                reading: true,
                stream: handle,
            },
        );
        Some(id)
    }

    /// Connection `id` sent its whole head: it is answered now, and no
    /// newcomer closes it.
    fn head_read(&self, id: u64) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = t.live.get_mut(&id) {
            c.reading = false;
        }
    }

    fn closed(&self, id: u64) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.live.remove(&id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .len()
    }
}

/// Reads one request head (`head_read` once it is in) and answers it;
/// every error closes the connection.
fn answer(mut stream: TcpStream, content_type: &str, render: &Render, head_read: impl FnOnce()) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let head = read_head(&mut stream);
    head_read();
    let (status, body, kind) = match head {
        Head::Complete(head) => match route(&head) {
            Route::Metrics { head_only } => {
                let body = render();
                if head_only {
                    return respond(&mut stream, "200 OK", content_type, body.len(), "");
                }
                ("200 OK", body, content_type)
            }
            Route::NotFound => (
                "404 Not Found",
                "not found: the metrics are at /metrics\n".to_owned(),
                "text/plain",
            ),
            Route::NotAllowed => (
                "405 Method Not Allowed",
                "only GET and HEAD are served\n".to_owned(),
                "text/plain",
            ),
            Route::Bad => (
                "400 Bad Request",
                "not an HTTP/1.x request line\n".to_owned(),
                "text/plain",
            ),
        },
        Head::TooLarge => (
            "431 Request Header Fields Too Large",
            format!("the request head is limited to {MAX_HEAD} bytes\n"),
            "text/plain",
        ),
        Head::Gone => return,
    };
    respond(&mut stream, status, kind, body.len(), &body);
}

fn respond(stream: &mut TcpStream, status: &str, kind: &str, len: usize, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()));
    let _ = stream.flush();
    // What the client sent beyond the head is read and dropped before the
    // socket closes, so the close does not reset the answer away.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(LINGER));
    let mut sink = [0u8; 4096];
    let mut left = MAX_HEAD * 8;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// How long a closing connection waits for the client to finish sending.
const LINGER: Duration = Duration::from_millis(500);

enum Head {
    Complete(String),
    TooLarge,
    /// Closed, timed out or unreadable before the head ended.
    Gone,
}

fn read_head(stream: &mut TcpStream) -> Head {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Head::Gone;
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return Head::Gone,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = find_end(&buf) {
            return Head::Complete(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
        if buf.len() >= MAX_HEAD {
            return Head::TooLarge;
        }
    }
}

/// Where the head ends (the blank line), if it has.
fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    NotAllowed,
    Bad,
}

fn route(head: &str) -> Route {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Bad;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Route::NotAllowed,
    };
    let path = target.split('?').next().unwrap_or_default();
    if path == "/metrics" {
        Route::Metrics { head_only }
    } else {
        Route::NotFound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(20);

    fn server() -> SocketAddr {
        let render: Arc<Render> = Arc::new(|| "orbitte_test_total 7\n".to_owned());
        start(
            "127.0.0.1:0".parse().unwrap(),
            "text/plain; version=0.0.4",
            render,
        )
        .unwrap()
    }

    fn exchange(at: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(at).unwrap();
        s.set_read_timeout(Some(BOUND)).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn get_metrics_is_the_rendered_text_in_the_prometheus_type() {
        let at = server();
        let r = exchange(at, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains("Content-Type: text/plain; version=0.0.4\r\n"),
            "{r}"
        );
        assert!(r.contains("Content-Length: 21\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\norbitte_test_total 7\n"), "{r}");
        let r = exchange(at, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(r.ends_with("orbitte_test_total 7\n"), "{r}");
        let r = exchange(at, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
    }

    #[test]
    fn other_paths_methods_and_garbage_are_refused() {
        let at = server();
        let r = exchange(at, b"GET / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
        let r = exchange(at, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
        let r = exchange(at, b"\x16\x03\x01 hello\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.resize(MAX_HEAD + 100, b'a');
        let r = exchange(at, &huge);
        assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    }

    /// `n` connections whose request heads never end.
    fn slow_heads(at: SocketAddr, n: usize) -> Vec<TcpStream> {
        (0..n)
            .map(|_| {
                let mut s = TcpStream::connect(at).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").unwrap();
                s
            })
            .collect()
    }

    #[test]
    fn slow_clients_past_the_limit_make_room_for_a_newcomer() {
        let at = server();
        // More slow heads than there are connections: the oldest are
        // closed for the newer ones.
        let mut slow = slow_heads(at, MAX_CONNECTIONS + 4);
        let r = exchange(at, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(r.ends_with("orbitte_test_total 7\n"), "{r}");
        // The first slow one was closed without an answer.
        slow[0].set_read_timeout(Some(BOUND)).unwrap();
        let mut out = Vec::new();
        let _ = slow[0].read_to_end(&mut out);
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
        drop(slow);
    }

    #[test]
    fn a_connection_being_answered_is_never_closed_for_a_newcomer() {
        let conns = Conns::default();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let mut keep = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            keep.push(TcpStream::connect(at).unwrap());
            let (s, _) = listener.accept().unwrap();
            ids.push(conns.admit(&s).expect("room"));
            keep.push(s);
        }
        for id in &ids {
            conns.head_read(*id);
        }
        let _c = TcpStream::connect(at).unwrap();
        let (s, _) = listener.accept().unwrap();
        assert_eq!(conns.admit(&s), None, "every connection is being answered");
        conns.closed(ids[0]);
        assert!(conns.admit(&s).is_some());
        assert_eq!(conns.len(), MAX_CONNECTIONS);
    }

    #[test]
    fn a_slow_client_does_not_hold_up_the_others() {
        let at = server();
        // Slowloris: a head that never ends, on several connections.
        let slow = slow_heads(at, 4);
        let r = exchange(at, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(r.ends_with("orbitte_test_total 7\n"), "{r}");
        drop(slow);
    }

    #[test]
    fn routes_follow_the_request_line() {
        assert_eq!(
            route("GET /metrics HTTP/1.1"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(route("GET /metricsx HTTP/1.1"), Route::NotFound);
        assert_eq!(route("GET /metrics"), Route::Bad);
        assert_eq!(route("GET /metrics HTTP/1.1 extra"), Route::Bad);
        assert_eq!(route("DELETE /metrics HTTP/1.1"), Route::NotAllowed);
        assert_eq!(route(""), Route::Bad);
    }
}
