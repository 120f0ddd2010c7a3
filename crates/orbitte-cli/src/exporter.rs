//! `orbitte serve --metrics ADDR`: a small HTTP/1.1 responder that serves
//! `GET /metrics` in the Prometheus text format (anything else: 404, or
//! 405 for a method other than GET and HEAD).
//!
//! The metrics port is reachable by whoever reaches the address, so it is
//! built for clients that misbehave. One thread runs one event loop (mio)
//! over every connection, so a slow client costs a table entry, never a
//! thread. Each connection lives through three phases, each with a
//! deadline for the whole phase, however slowly bytes trickle in:
//! - the request head (parsed by httparse): at most [`MAX_HEAD`] bytes
//!   within [`HEAD_TIMEOUT`];
//! - the answer, written as the client takes it, within
//!   [`ANSWER_TIMEOUT`];
//! - then what the client still sends (a request body is never waited
//!   for: the answer goes out once the head is in) is read and dropped
//!   for at most [`LINGER`] before the connection closes.
//!
//! At most [`MAX_CONNECTIONS`] at once: a newcomer past it closes the
//! oldest connection that is not being answered (or, if all are, the
//! oldest), so clients, fast or slow, cannot keep a scraper out. Scrapes
//! that arrive within [`RENDER_REUSE`] of each other share one rendered
//! text, so the memory the answers take is one text, not one per client.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

/// The largest request head read; a longer one gets 431.
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// The whole head must arrive within this; else the connection is closed.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole answer must be taken by the client within this.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// After the answer, what the client still sends is read and dropped for
/// at most this long (so the close does not reset the answer away).
pub(crate) const LINGER: Duration = Duration::from_millis(500);
/// Connections served at once (see the module docs for a newcomer past
/// it).
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// A text rendered this recently answers the next scrape too.
pub(crate) const RENDER_REUSE: Duration = Duration::from_millis(250);
/// Bytes read and dropped after a head before the connection closes.
const DISCARD_LIMIT: usize = 64 * 1024;
/// How long the loop waits before accepting again after a failed accept
/// (out of descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

const LISTENER: Token = Token(0);

/// What the responder serves: the body of `GET /metrics`.
pub(crate) type Render = dyn Fn() -> String + Send + Sync;

/// Binds `addr` and serves on a thread of its own until the process
/// ends; returns the bound address (port 0: the one chosen).
pub(crate) fn start(
    addr: SocketAddr,
    content_type: &'static str,
    render: Arc<Render>,
) -> std::io::Result<SocketAddr> {
    let mut listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut responder = Responder {
        poll,
        listener,
        conns: HashMap::new(),
        next: 1,
        content_type,
        render,
        rendered: None,
        accept_again: None,
    };
    std::thread::Builder::new()
        .name("orbitte-metrics".into())
        .spawn(move || responder.run())?;
    Ok(bound)
}

struct Responder {
    poll: Poll,
    listener: TcpListener,
    /// Invariant: at most [`MAX_CONNECTIONS`].
    conns: HashMap<Token, Conn>,
    /// The next connection's token (never reused, so a late event cannot
    /// reach a newer connection).
    next: usize,
    content_type: &'static str,
    render: Arc<Render>,
    /// The last text rendered and when.
    rendered: Option<(Instant, Arc<[u8]>)>,
    /// A failed accept: accept again at this time.
    accept_again: Option<Instant>,
}

struct Conn {
    stream: TcpStream,
    since: Instant,
    /// The end of the current phase.
    deadline: Instant,
    phase: Phase,
}

enum Phase {
    /// Reading the request head.
    Head(Vec<u8>),
    /// Writing `head` then `body`; `sent` bytes of both went.
    Answer {
        head: Vec<u8>,
        body: Option<Arc<[u8]>>,
        sent: usize,
    },
    /// Answered; reading and dropping what the client still sends.
    Linger,
}

/// What a connection asks for once its head is in.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    NotAllowed,
    Bad,
    TooLarge,
}

/// Whether the connection stays open after a turn.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    Open,
    Closed,
}

impl Responder {
    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            let wake = self
                .conns
                .values()
                .map(|c| c.deadline)
                .chain(self.accept_again)
                .min();
            let timeout = wake.map(|w| w.saturating_duration_since(now));
            if let Err(e) = self.poll.poll(&mut events, timeout)
                && e.kind() != ErrorKind::Interrupted
            {
                tracing::warn!(error = %e, "the metrics responder stopped: cannot wait for its sockets");
                return;
            }
            let now = Instant::now();
            for ev in &events {
                if ev.token() == LISTENER {
                    self.accept(now);
                } else {
                    self.drive(ev.token(), now);
                }
            }
            if self.accept_again.is_some_and(|at| at <= now) {
                self.accept_again = None;
                self.accept(now);
            }
            let expired: Vec<Token> = self
                .conns
                .iter()
                .filter(|(_, c)| c.deadline <= now)
                .map(|(t, _)| *t)
                .collect();
            for t in expired {
                self.close(t);
            }
        }
    }

    fn accept(&mut self, now: Instant) {
        loop {
            let mut stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: try again later
                    // rather than spin on the failing accept (the
                    // listener does not signal again for connections
                    // already waiting).
                    tracing::debug!(error = %e, "metrics: accept failed");
                    self.accept_again = Some(now + ACCEPT_PAUSE);
                    return;
                }
            };
            if self.conns.len() >= MAX_CONNECTIONS
                && let Some(t) =
                    victim(self.conns.iter().map(|(t, c)| (*t, c.since, c.answering())))
            {
                self.close(t);
            }
            let token = Token(self.next);
            self.next += 1;
            if self
                .poll
                .registry()
                .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                continue;
            }
            self.conns.insert(
                token,
                Conn {
                    stream,
                    since: now,
                    deadline: now + HEAD_TIMEOUT,
                    phase: Phase::Head(Vec::with_capacity(1024)),
                },
            );
            // Edge-triggered: what already arrived is read now.
            self.drive(token, now);
        }
    }

    fn close(&mut self, token: Token) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
        }
    }

    /// Moves connection `token` as far as its socket lets it.
    fn drive(&mut self, token: Token, now: Instant) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if self.turn(&mut conn, now) == Turn::Open {
            self.conns.insert(token, conn);
        } else {
            let _ = self.poll.registry().deregister(&mut conn.stream);
        }
    }

    fn turn(&mut self, conn: &mut Conn, now: Instant) -> Turn {
        loop {
            match &mut conn.phase {
                Phase::Head(buf) => {
                    let route = match read_head(&mut conn.stream, buf) {
                        Ok(Some(route)) => route,
                        Ok(None) => return Turn::Open,
                        Err(()) => return Turn::Closed,
                    };
                    let (head, body) = self.answer(route, now);
                    conn.phase = Phase::Answer {
                        head,
                        body,
                        sent: 0,
                    };
                    conn.deadline = now + ANSWER_TIMEOUT;
                }
                Phase::Answer { head, body, sent } => {
                    // A client that half-closed after its head still
                    // gets its answer.
                    if discard(&mut conn.stream) == Drained::Failed {
                        return Turn::Closed;
                    }
                    let body: &[u8] = body.as_deref().unwrap_or_default();
                    match write_answer(&mut conn.stream, head, body, sent) {
                        Ok(true) => {}
                        Ok(false) => return Turn::Open,
                        Err(()) => return Turn::Closed,
                    }
                    let _ = conn.stream.shutdown(Shutdown::Write);
                    conn.phase = Phase::Linger;
                    conn.deadline = now + LINGER;
                }
                Phase::Linger => {
                    return match discard(&mut conn.stream) {
                        Drained::Pending => Turn::Open,
                        Drained::End | Drained::Failed => Turn::Closed,
                    };
                }
            }
        }
    }

    /// The answer's head and body for `route`.
    fn answer(&mut self, route: Route, now: Instant) -> (Vec<u8>, Option<Arc<[u8]>>) {
        let text = |status: &str, body: String| {
            let head = head(status, "text/plain", body.len());
            (head, Some(Arc::from(body.into_bytes())))
        };
        match route {
            Route::Metrics { head_only } => {
                let body = self.rendered(now);
                let head = head("200 OK", self.content_type, body.len());
                (head, (!head_only).then_some(body))
            }
            Route::NotFound => text(
                "404 Not Found",
                "not found: the metrics are at /metrics\n".to_owned(),
            ),
            Route::NotAllowed => text(
                "405 Method Not Allowed",
                "only GET and HEAD are served\n".to_owned(),
            ),
            Route::Bad => text(
                "400 Bad Request",
                "not an HTTP/1.x request head\n".to_owned(),
            ),
            Route::TooLarge => text(
                "431 Request Header Fields Too Large",
                format!("the request head is limited to {MAX_HEAD} bytes\n"),
            ),
        }
    }

    /// The metrics text: the last one if it is recent, else a new one.
    fn rendered(&mut self, now: Instant) -> Arc<[u8]> {
        if let Some((at, body)) = &self.rendered
            && now.saturating_duration_since(*at) < RENDER_REUSE
        {
            return body.clone();
        }
        let body: Arc<[u8]> = Arc::from((self.render)().into_bytes());
        self.rendered = Some((now, body.clone()));
        body
    }
}

impl Conn {
    fn answering(&self) -> bool {
        matches!(self.phase, Phase::Answer { .. })
    }
}

/// The connection a newcomer closes when all are taken: the oldest that
/// is not being answered, else the oldest.
fn victim(conns: impl Iterator<Item = (Token, Instant, bool)>) -> Option<Token> {
    conns
        .min_by_key(|&(_, since, answering)| (answering, since))
        .map(|(t, _, _)| t)
}

fn head(status: &str, kind: &str, len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

/// Reads what arrived of the head into `buf`: `Some` once it is whole (or
/// cannot be), `None` to wait for more, `Err` when the client went away.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Route>, ()> {
    let mut chunk = [0u8; 2048];
    loop {
        let want = chunk.len().min(MAX_HEAD + 1 - buf.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => return Err(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        }
        if let Some(route) = route(buf) {
            return Ok(Some(route));
        }
    }
}

/// The route of a head so far; `None`: not whole yet.
fn route(buf: &[u8]) -> Option<Route> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Some(Route::TooLarge),
        Ok(httparse::Status::Partial) => return None,
        Err(httparse::Error::TooManyHeaders) => return Some(Route::TooLarge),
        Err(_) => return Some(Route::Bad),
    }
    if buf.len() > MAX_HEAD {
        return Some(Route::TooLarge);
    }
    let head_only = match req.method {
        Some("GET") => false,
        Some("HEAD") => true,
        _ => return Some(Route::NotAllowed),
    };
    let path = req.path.unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default();
    Some(if path == "/metrics" {
        Route::Metrics { head_only }
    } else {
        Route::NotFound
    })
}

/// Writes what the socket takes of `head` then `body` from `*sent`:
/// `Ok(true)` once all went.
fn write_answer(
    stream: &mut TcpStream,
    head: &[u8],
    body: &[u8],
    sent: &mut usize,
) -> Result<bool, ()> {
    loop {
        let rest = if *sent < head.len() {
            &head[*sent..]
        } else {
            &body[*sent - head.len()..]
        };
        if rest.is_empty() {
            return Ok(true);
        }
        match stream.write(rest) {
            Ok(0) => return Err(()),
            Ok(n) => *sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(()),
        }
    }
}

/// What [`discard`] found.
#[derive(Debug, PartialEq, Eq)]
enum Drained {
    /// Nothing more for now.
    Pending,
    /// The client sent its last byte.
    End,
    /// An error, or more than [`DISCARD_LIMIT`] in one turn.
    Failed,
}

/// Reads and drops what the client sent.
fn discard(stream: &mut TcpStream) -> Drained {
    let mut sink = [0u8; 4096];
    let mut read = 0;
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return Drained::End,
            Ok(n) => {
                read += n;
                if read > DISCARD_LIMIT {
                    return Drained::Failed;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Drained::Pending,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Drained::Failed,
        }
    }
}

#[cfg(test)]
mod tests;
