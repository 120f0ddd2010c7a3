use std::io::{Read, Write};
use std::net::TcpStream as StdStream;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// How long a test waits for an answer before it calls it missing.
const BOUND: Duration = Duration::from_secs(20);
const TEXT: &str = "orbitte_test_total 7\n";

fn server() -> SocketAddr {
    let render: Arc<Render> = Arc::new(|| TEXT.to_owned());
    start(
        "127.0.0.1:0".parse().unwrap(),
        "text/plain; version=0.0.4",
        render,
    )
    .unwrap()
}

fn exchange(at: SocketAddr, request: &[u8]) -> String {
    let mut s = StdStream::connect(at).unwrap();
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
    assert!(r.ends_with(TEXT), "{r}");
    let r = exchange(at, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
        "{r}"
    );
    // A client that half-closes after its request still gets the answer.
    let mut s = StdStream::connect(at).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    assert!(r.ends_with(TEXT), "{r}");
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

#[test]
fn routes_follow_the_request_line() {
    let r = |s: &str| route(s.as_bytes());
    assert_eq!(
        r("GET /metrics HTTP/1.1\r\n\r\n"),
        Some(Route::Metrics { head_only: false })
    );
    assert_eq!(
        r("HEAD /metrics HTTP/1.0\r\nHost: x\r\n\r\n"),
        Some(Route::Metrics { head_only: true })
    );
    assert_eq!(r("GET /metrics HTTP/1.1\r\nHost: x\r\n"), None, "not whole");
    assert_eq!(r("GET /metricsx HTTP/1.1\r\n\r\n"), Some(Route::NotFound));
    assert_eq!(r("GET /metrics\r\n\r\n"), Some(Route::Bad));
    assert_eq!(r("GET /metrics HTTP/1.1 x\r\n\r\n"), Some(Route::Bad));
    assert_eq!(
        r("DELETE /metrics HTTP/1.1\r\n\r\n"),
        Some(Route::NotAllowed)
    );
}

#[test]
fn a_newcomer_closes_the_oldest_connection_not_being_answered() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let conns = [
        (Token(1), at(0), true),
        (Token(2), at(1), false),
        (Token(3), at(2), false),
    ];
    assert_eq!(victim(conns.into_iter()), Some(Token(2)));
    let answering = [(Token(1), at(5), true), (Token(2), at(1), true)];
    assert_eq!(
        victim(answering.into_iter()),
        Some(Token(2)),
        "all answered: the oldest"
    );
}

#[test]
fn scrapes_close_together_share_one_rendered_text() {
    let renders = Arc::new(AtomicUsize::new(0));
    let counted = renders.clone();
    let mut listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let poll = Poll::new().unwrap();
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .unwrap();
    let mut r = Responder {
        poll,
        listener,
        conns: HashMap::new(),
        next: 1,
        content_type: "text/plain",
        render: Arc::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            TEXT.to_owned()
        }),
        rendered: None,
        accept_again: None,
    };
    let t0 = Instant::now();
    let a = r.rendered(t0);
    let b = r.rendered(t0 + RENDER_REUSE / 2);
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(renders.load(Ordering::Relaxed), 1);
    r.rendered(t0 + RENDER_REUSE);
    assert_eq!(renders.load(Ordering::Relaxed), 2);
}

/// `n` connections whose request heads never end.
fn slow_heads(at: SocketAddr, n: usize) -> Vec<StdStream> {
    (0..n)
        .map(|_| {
            let mut s = StdStream::connect(at).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").unwrap();
            s
        })
        .collect()
}

#[test]
fn slow_clients_past_the_limit_make_room_for_a_newcomer() {
    let at = server();
    // More slow heads than there are connections: the oldest are closed
    // for the newer ones.
    let mut slow = slow_heads(at, MAX_CONNECTIONS + 4);
    let r = exchange(at, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.ends_with(TEXT), "{r}");
    // The first slow one was closed without an answer.
    slow[0].set_read_timeout(Some(BOUND)).unwrap();
    let mut out = Vec::new();
    let _ = slow[0].read_to_end(&mut out);
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    drop(slow);
}

/// A client that sends `start`, then one byte every `every` until the
/// server closes or `stop` is set.
fn trickler(
    at: SocketAddr,
    start: &'static [u8],
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut s = StdStream::connect(at).unwrap();
    s.write_all(start).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(every);
            if s.write_all(b"a").is_err() {
                return;
            }
        }
    })
}

#[test]
fn clients_that_trickle_never_keep_a_scraper_out() {
    let at = server();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // As many slow clients as there are connections, and more: half
    // trickle a head that never ends, half send a whole request that
    // announces a body, then trickle it.
    let every = Duration::from_millis(100);
    let n = MAX_CONNECTIONS + 8;
    let mut threads = Vec::new();
    let whole: &'static [u8] = b"GET /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n";
    for _ in 0..n / 2 {
        threads.push(trickler(at, whole, every, stop.clone()));
    }
    // Their requests are in and answered before the slow heads arrive.
    std::thread::sleep(every / 2);
    for _ in n / 2..n {
        threads.push(trickler(
            at,
            b"GET /metrics HTTP/1.1\r\nX-Slow: ",
            every,
            stop.clone(),
        ));
    }
    for _ in 0..5 {
        let r = exchange(at, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.ends_with(TEXT),
            "a scrape while {n} clients trickle: {r:?}"
        );
        std::thread::sleep(every);
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_client_that_trickles_after_its_request_is_closed_after_the_linger() {
    let at = server();
    let mut s = StdStream::connect(at).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // A byte every 100 ms, for up to 20 times the linger: the server
    // closes long before (its linger is a deadline for the whole phase,
    // not for each byte).
    let rounds = (LINGER.as_millis() / 100 * 20) as usize;
    let mut answer = Vec::new();
    let mut closed = false;
    for _ in 0..rounds {
        // The server's end of the answer (a half close) is not the close:
        // only a refused byte is.
        if s.write_all(b"a").is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            // The answer ended: reads return at once from now on.
            Ok(0) => std::thread::sleep(Duration::from_millis(100)),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.ends_with(TEXT), "{answer}");
    assert!(
        closed,
        "the connection stayed open while the client trickled"
    );
}
