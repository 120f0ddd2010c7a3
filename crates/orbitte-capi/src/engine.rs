//! Engines and peers: create and destroy an engine, publish its
//! connection info, connect to a peer by the bytes it published, and
//! disconnect.

use std::ffi::c_char;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitte::{
    Access, ClusterSecret, ConnectError, ConnectOptions, DrainStatus, EngineBuilder, HostMemory,
    ListenerToken, Op, RemoteTarget, Request, SubmitOptions,
};

use crate::args::{self, copy_out, put};
use crate::cma;
use crate::handle::{self, Anchor, Engine, PeerEntry, lock, orbitte_engine, orbitte_peer};
use crate::status::{
    Failure, ORBITTE_ERR_BACKEND, ORBITTE_ERR_MISMATCH, ORBITTE_ERR_NOT_ALLOWED,
    ORBITTE_ERR_REMOTE_DISCONNECT, ORBITTE_OK, c_name, guard,
};

/// `orbitte_engine_create` flag: also register host memory on the RDMA
/// NICs found (Host Direct); without it registrations are served by the
/// tcp and local paths only.
pub const ORBITTE_ENGINE_RDMA: u32 = 1;

/// `orbitte_engine_create` flag: listen with a fresh listener token,
/// carried in the connection info. Only peers handed the connection
/// info connect (with a cluster secret as well, they need both).
pub const ORBITTE_ENGINE_TOKEN: u32 = 2;

/// `orbitte_engine_create` flag: copy WRITE and READ of host memory with
/// same-host peers that set it too, by `process_vm_writev` and
/// `process_vm_readv` (one kernel copy between the two processes). The
/// engine publishes its pid, uid and host identity in the connection info.
/// It takes the kernel's permission (same uid, Yama `ptrace_scope` absent
/// or 0), which lets a process of the same uid touch any of this process's
/// memory, not only its registrations: leave it out where that is not
/// wanted. `orbitte_peer_cma` says whether a peer is served so, or why not.
pub const ORBITTE_ENGINE_CMA: u32 = 4;

/// The format tag of the connection info.
const CONN_INFO_FORMAT: &str = "orbitte-capi-conn/1";

/// How long `orbitte_engine_destroy` waits for transfers to drain.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The anchor's size: a byte peers READ, a byte this engine READs into,
/// the nonce peers check its pid with, and room to read theirs.
const ANCHOR_LEN: usize = 128;
/// Where the anchor holds its nonce, and where a peer's is read into.
const NONCE_AT: usize = 64;
const PEER_NONCE_AT: usize = 96;
const NONCE_LEN: usize = 32;

/// How long the pid proof at connect waits for its READ.
const PROOF_WAIT: Duration = Duration::from_secs(10);

/// The cluster secret: from `file`, else from the file
/// `$ORBITTE_SECRET_FILE` names, else none.
fn secret(file: Option<&str>) -> Result<Option<ClusterSecret>, Failure> {
    match file {
        Some(f) => {
            orbitte::secret::read_secret_file(Path::new(f), "argument secret_file").map(Some)
        }
        None => orbitte::secret::secret_from_env(),
    }
    .map_err(|e| Failure::invalid(e.to_string()))
}

/// The `host:port` peers are told to connect to: the listen host, or this
/// machine's name when it listens on every address.
fn advertised(listen_host: &str, bound: SocketAddr) -> String {
    let host = match listen_host.parse::<IpAddr>() {
        Ok(ip) if ip.is_unspecified() => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| listen_host.to_owned()),
        _ => listen_host.to_owned(),
    };
    if host.contains(':') {
        format!("[{host}]:{}", bound.port())
    } else {
        format!("{host}:{}", bound.port())
    }
}

fn create(
    name: &str,
    listen: Option<&str>,
    secret_file: Option<&str>,
    flags: u32,
) -> Result<Engine, Failure> {
    if name.is_empty() {
        return Err(Failure::invalid(
            "`name` is empty: give the engine a name (its source id)",
        ));
    }
    if flags & !(ORBITTE_ENGINE_RDMA | ORBITTE_ENGINE_TOKEN | ORBITTE_ENGINE_CMA) != 0 {
        return Err(Failure::invalid(format!(
            "unknown flags {flags:#x}: pass 0 or any of {}, {} and {}",
            c_name!(ORBITTE_ENGINE_RDMA),
            c_name!(ORBITTE_ENGINE_TOKEN),
            c_name!(ORBITTE_ENGINE_CMA)
        )));
    }
    let mut b = EngineBuilder::new(name);
    let token = if flags & ORBITTE_ENGINE_TOKEN != 0 {
        let t = orbitte::new_listener_token().map_err(|e| {
            Failure::new(
                ORBITTE_ERR_BACKEND,
                format!("cannot draw a listener token from the kernel's random source: {e}"),
            )
        })?;
        b = b.listener_token(t);
        Some(t)
    } else {
        None
    };
    if let Some(s) = secret(secret_file)? {
        b = b.cluster_secret(s);
    }
    let mut listen_at = None;
    if let Some(l) = listen {
        let at = l
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "listen address {l:?} does not resolve: write \"host:port\" (port 0: any free port)"
                ))
            })?;
        let host = l.rsplit_once(':').map_or(l, |(h, _)| h);
        listen_at = Some((host.trim_matches(['[', ']']).to_owned(), at));
        b = b.listen(at);
    }
    if flags & ORBITTE_ENGINE_RDMA == 0 {
        b = b.host_memory_without_rdma();
    }
    let engine = b
        .build()
        .map_err(|e| Failure::new(ORBITTE_ERR_BACKEND, format!("cannot build the engine: {e}")))?;
    let memory = HostMemory::alloc(ANCHOR_LEN).map_err(|e| {
        Failure::new(
            ORBITTE_ERR_BACKEND,
            format!("cannot allocate the notification anchor: {e}"),
        )
    })?;
    let reg = engine
        .register(memory.clone(), Access::RemoteRead)
        .map_err(|e| {
            Failure::new(
                ORBITTE_ERR_BACKEND,
                format!("cannot register the notification anchor: {e}"),
            )
        })?;
    let nonce = cma::nonce().map_err(|e| {
        Failure::new(
            ORBITTE_ERR_BACKEND,
            format!("cannot draw the anchor's nonce from the kernel's random source: {e}"),
        )
    })?;
    memory.write_at(NONCE_AT, &nonce).map_err(|e| {
        Failure::new(
            ORBITTE_ERR_BACKEND,
            format!("cannot write the anchor's nonce: {e}"),
        )
    })?;
    let anchor = Anchor {
        id: reg.id,
        address: memory.as_ptr() as u64,
        memory,
        proof: Mutex::new(()),
    };
    let advertised = match (listen_at, engine.listen_addr()) {
        (Some((host, _)), Some(bound)) => Some(advertised(&host, bound)),
        _ => None,
    };
    let host = if flags & ORBITTE_ENGINE_CMA != 0 {
        Some(cma::host_id())
    } else {
        None
    };
    Ok(Engine::new(engine, anchor, advertised, token, host))
}

/// Creates an engine named `name` (its source id: the name peers see as
/// the sender of its notifications).
///
/// `listen` is `"host:port"` (port 0: any free port) for an engine peers
/// connect to, or NULL for one that only connects out. `secret_file`
/// names a file of at least 16 bytes, the cluster secret peers must share;
/// NULL reads the file `$ORBITTE_SECRET_FILE` names, if set. `flags`: 0 or
/// any of `ORBITTE_ENGINE_RDMA`, `ORBITTE_ENGINE_TOKEN` and
/// `ORBITTE_ENGINE_CMA`. On success `*out` is the engine.
///
/// # Safety
/// `name` and non-null `listen` and `secret_file` are NUL-terminated
/// strings; `out` points at writable memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_engine_create(
    name: *const c_char,
    listen: *const c_char,
    secret_file: *const c_char,
    flags: u32,
    out: *mut *mut orbitte_engine,
) -> i32 {
    guard("orbitte_engine_create", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller's contract for each string.
        let (name, listen, secret_file) = unsafe {
            (
                args::str(name, "name")?,
                args::opt_str(listen, "listen")?,
                args::opt_str(secret_file, "secret_file")?,
            )
        };
        let engine = create(name, listen, secret_file, flags)?;
        let h = handle::insert(engine);
        // SAFETY: `out` is writable (the caller's contract; null checked).
        unsafe { put(out, h, "out") }?;
        Ok(ORBITTE_OK)
    })
}

/// Destroys an engine: stops serving, cancels what runs, waits up to 5 s
/// for drain, frees what it allocated. Every handle of it is invalid
/// afterwards; a second destroy returns `ORBITTE_ERR_BAD_HANDLE`.
///
/// # Safety
/// None beyond passing a value `orbitte_engine_create` returned (any
/// other value is refused, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_engine_destroy(engine: *mut orbitte_engine) -> i32 {
    guard("orbitte_engine_destroy", || {
        let e = handle::remove(engine)?;
        lock(&e.xfers).clear();
        e.engine.shutdown(SHUTDOWN_TIMEOUT).map_err(|u| {
            Failure::new(
                ORBITTE_ERR_BACKEND,
                format!("the engine was destroyed, but not everything drained: {u}"),
            )
        })?;
        Ok(ORBITTE_OK)
    })
}

/// Writes the engine's connection info, the bytes a peer passes to
/// `orbitte_connect` (NIXL's `getConnInfo`), into `buf` (capacity
/// `cap`) and its length to `*len`. A null or short `buf` gets
/// `ORBITTE_ERR_BUFFER_TOO_SMALL` with the length needed in `*len`. An
/// engine created without `listen` has none (`ORBITTE_ERR_NOT_ALLOWED`).
///
/// # Safety
/// `len` points at a writable `size_t`; a non-null `buf` at `cap`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_conn_info(
    engine: *const orbitte_engine,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard("orbitte_conn_info", || {
        let e = handle::engine(engine)?;
        let Some(address) = &e.advertised else {
            return Err(Failure::new(
                ORBITTE_ERR_NOT_ALLOWED,
                "the engine has no listener, so peers cannot connect to it: create it with a listen address",
            ));
        };
        let mut doc = serde_json::json!({
            "format": CONN_INFO_FORMAT,
            "source_id": e.engine.source_id(),
            "epoch": e.engine.epoch().value(),
            "address": address,
            "anchor": e.anchor.address,
        });
        if let Some(t) = &e.token {
            doc["token"] = serde_json::Value::String(t.to_hex());
        }
        if let Some(Ok(host)) = &e.host {
            let (pid, uid) = cma::pid_uid();
            doc["host"] = serde_json::json!({"id": host, "pid": pid, "uid": uid});
        }
        // SAFETY: the caller's contract for `buf`, `cap` and `len`.
        unsafe {
            copy_out(
                doc.to_string().as_bytes(),
                false,
                buf,
                cap,
                len,
                "the connection info",
            )
        }?;
        Ok(ORBITTE_OK)
    })
}

/// Writes what the engine counted since it was created, in the
/// Prometheus text format (requests, bytes and outcomes per path, peer
/// and operation; notifications; listener refusals; same-host copies:
/// `orbitte_capi_cma_*`), into `buf`
/// (capacity `cap`) and its length to `*len`. Buffer rules as for
/// `orbitte_conn_info`.
///
/// # Safety
/// `len` points at a writable `size_t`; a non-null `buf` at `cap`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_metrics(
    engine: *const orbitte_engine,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard("orbitte_metrics", || {
        let e = handle::engine(engine)?;
        let mut text = e.engine.metrics().to_prometheus();
        text.push_str(&e.cma.to_prometheus());
        // SAFETY: the caller's contract for `buf`, `cap` and `len`.
        unsafe { copy_out(text.as_bytes(), false, buf, cap, len, "the metrics") }?;
        Ok(ORBITTE_OK)
    })
}

/// Connection info as `orbitte_conn_info` wrote it.
struct ConnInfo {
    source_id: String,
    epoch: u64,
    address: String,
    anchor: u64,
    token: Option<ListenerToken>,
    /// (host id, pid, uid) of an engine created with `ORBITTE_ENGINE_CMA`.
    host: Option<(String, u32, u32)>,
}

fn parse_conn_info(bytes: &[u8]) -> Result<ConnInfo, Failure> {
    let mismatch = |why: &str| {
        Failure::new(
            ORBITTE_ERR_MISMATCH,
            format!("{why}: pass the bytes orbitte_conn_info wrote on the peer"),
        )
    };
    let doc: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|_| mismatch("the connection info is not this API's"))?;
    if doc.get("format").and_then(|f| f.as_str()) != Some(CONN_INFO_FORMAT) {
        return Err(mismatch(&format!(
            "the connection info is not of format {CONN_INFO_FORMAT:?}"
        )));
    }
    let text = |k: &str| doc.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let num = |k: &str| doc.get(k).and_then(serde_json::Value::as_u64);
    let token = match doc.get("token") {
        None => None,
        Some(v) => Some(
            v.as_str()
                .and_then(|t| ListenerToken::from_hex(t).ok())
                .ok_or_else(|| {
                    mismatch("the connection info's token is not 64 hexadecimal digits")
                })?,
        ),
    };
    let host = doc.get("host").and_then(|h| {
        Some((
            h.get("id")?.as_str()?.to_owned(),
            u32::try_from(h.get("pid")?.as_u64()?).ok()?,
            u32::try_from(h.get("uid")?.as_u64()?).ok()?,
        ))
    });
    match (
        text("source_id"),
        num("epoch"),
        text("address"),
        num("anchor"),
    ) {
        (Some(source_id), Some(epoch), Some(address), Some(anchor)) => Ok(ConnInfo {
            source_id,
            epoch,
            address,
            anchor,
            token,
            host,
        }),
        _ => Err(mismatch("the connection info lacks a field")),
    }
}

fn connect(e: &Engine, info: &[u8]) -> Result<orbitte_peer, Failure> {
    let info = parse_conn_info(info)?;
    let addr = info
        .address
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Failure::new(
                ORBITTE_ERR_REMOTE_DISCONNECT,
                format!(
                    "the peer's address {:?} does not resolve here",
                    info.address
                ),
            )
        })?;
    let mut options = ConnectOptions::default();
    if let Some(t) = info.token {
        options = options.token(t);
    }
    let peer = e.engine.connect_with(addr, options).map_err(|err| {
        let code = match err {
            ConnectError::Session(_) => ORBITTE_ERR_REMOTE_DISCONNECT,
            _ => ORBITTE_ERR_BACKEND,
        };
        Failure::new(
            code,
            format!("cannot connect to {:?} at {addr}: {err}", info.source_id),
        )
    })?;
    if peer.source_id() != info.source_id {
        return Err(Failure::new(
            ORBITTE_ERR_MISMATCH,
            format!(
                "the engine at {addr} is {:?}, not {:?} of the connection info: take the info again from the peer",
                peer.source_id(),
                info.source_id
            ),
        ));
    }
    if peer.epoch().value() != info.epoch {
        return Err(Failure::new(
            ORBITTE_ERR_MISMATCH,
            format!(
                "{:?} runs epoch {}, the connection info is of epoch {} (it restarted): take the info again",
                info.source_id,
                peer.epoch(),
                info.epoch
            ),
        ));
    }
    let mut entry = PeerEntry {
        id: peer.id(),
        epoch: peer.epoch(),
        source_id: info.source_id,
        path: peer.path,
        addr,
        anchor: info.anchor,
        options,
        cma: Err(String::new()),
    };
    entry.cma = same_host(e, &entry, info.host.as_ref()).map(Arc::new);
    let h = e.mint();
    lock(&e.peers).insert(h, entry);
    Ok(h)
}

/// Opens the session to the peer `handle` names again, which brings the
/// ranges it published since (a peer's registrations after the session
/// opened are not pushed to this engine). Refused when the peer restarted
/// meanwhile.
pub(crate) fn reopen(e: &Engine, handle: orbitte_peer) -> Result<PeerEntry, Failure> {
    let old = e.peer(handle)?;
    let peer = e
        .engine
        .connect_with(old.addr, old.options)
        .map_err(|err| {
            Failure::new(
                ORBITTE_ERR_REMOTE_DISCONNECT,
                format!(
                    "cannot reach {:?} at {} again: {err}",
                    old.source_id, old.addr
                ),
            )
        })?;
    if peer.source_id() != old.source_id || peer.epoch() != old.epoch {
        return Err(Failure::new(
            ORBITTE_ERR_REMOTE_DISCONNECT,
            format!(
                "{:?} at {} is now {:?} of epoch {}: the peer restarted; take its connection info again and connect",
                old.source_id,
                old.addr,
                peer.source_id(),
                peer.epoch()
            ),
        ));
    }
    let entry = PeerEntry {
        id: peer.id(),
        path: peer.path,
        ..old
    };
    if let Some(slot) = lock(&e.peers).get_mut(&handle) {
        *slot = entry.clone();
    }
    Ok(entry)
}

/// Connects to the peer whose connection info (`orbitte_conn_info` on
/// the peer) is the `len` bytes at `info` (NIXL's `loadRemoteConnInfo`
/// and `connect`): a handshake now, which also brings the memory the peer
/// published. On success `*out` is the peer.
///
/// # Safety
/// `info` points at `len` readable bytes; `out` at a writable
/// `orbitte_peer`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_connect(
    engine: *const orbitte_engine,
    info: *const u8,
    len: usize,
    out: *mut orbitte_peer,
) -> i32 {
    guard("orbitte_connect", || {
        let e = handle::engine(engine)?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller's contract for `info` and `len`.
        let info = unsafe { args::bytes(info, len, "info") }?;
        let h = connect(&e, info)?;
        // SAFETY: the caller's contract for `out` (null checked).
        unsafe { put(out, h, "out") }?;
        Ok(ORBITTE_OK)
    })
}

/// Forgets a peer (NIXL's `disconnect`): transfers prepared for it are
/// refused at post with `ORBITTE_ERR_REMOTE_DISCONNECT`, and the handle is
/// invalid afterwards. The engine keeps its session to the peer for the
/// engine's other users; `orbitte_connect` opens the peer again.
///
/// # Safety
/// None beyond passing values this API returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_disconnect(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
) -> i32 {
    guard("orbitte_disconnect", || {
        let e = handle::engine(engine)?;
        lock(&e.peers)
            .remove(&peer)
            .ok_or_else(|| Failure::bad_handle("peer", peer))?;
        lock(&e.loaded).remove(&peer);
        e.unloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(ORBITTE_OK)
    })
}

/// Whether `p` can be served by same-host copies, with its process opened
/// and proven, or why not.
fn same_host(
    e: &Engine,
    p: &PeerEntry,
    host: Option<&(String, u32, u32)>,
) -> Result<cma::Target, String> {
    let mine = match &e.host {
        None => {
            return Err(format!(
                "this engine was created without {}",
                c_name!(ORBITTE_ENGINE_CMA)
            ));
        }
        Some(Err(why)) => return Err(format!("this host's identity is unknown: {why}")),
        Some(Ok(h)) => h,
    };
    let Some((id, pid, uid)) = host else {
        return Err(format!(
            "{:?} publishes no host identity (created without {})",
            p.source_id,
            c_name!(ORBITTE_ENGINE_CMA)
        ));
    };
    if id != mine {
        return Err(format!(
            "{:?} runs on another host or in another pid namespace",
            p.source_id
        ));
    }
    let (_, my_uid) = cma::pid_uid();
    if *uid != my_uid {
        return Err(format!(
            "{:?} runs as uid {uid}, this process as uid {my_uid}: the kernel lets only one uid copy between processes",
            p.source_id
        ));
    }
    if let Some(why) = cma::kernel_refuses() {
        return Err(why);
    }
    let t = cma::Target::open(*pid)?;
    prove(e, p, &t)?;
    Ok(t)
}

/// Checks that `t` is the process serving `p`'s session: the nonce of
/// its anchor read over the session (which took the listener token)
/// equals the one `process_vm_readv` reads at the same address of `t`.
fn prove(e: &Engine, p: &PeerEntry, t: &cma::Target) -> Result<(), String> {
    let _one_at_a_time = lock(&e.anchor.proof);
    let request = Request {
        op: Op::Read,
        local: e.anchor.id,
        local_offset: PEER_NONCE_AT as u64,
        len: NONCE_LEN as u64,
        remote: RemoteTarget::Address {
            peer: p.id,
            epoch: Some(p.epoch),
            address: p.anchor + NONCE_AT as u64,
        },
        label: 0,
    };
    let ids = e
        .engine
        .submit_with(&[request], SubmitOptions::new())
        .map_err(|err| format!("cannot read its anchor over the session: {err}"))?;
    let outcome = e
        .engine
        .wait(ids[0], PROOF_WAIT)
        .map_err(|err| format!("reading its anchor over the session: {err}"))?;
    if outcome.drain != DrainStatus::Drained {
        let _ = e.engine.wait_drain(ids[0], PROOF_WAIT);
    }
    if !outcome.is_complete() {
        return Err(format!(
            "reading its anchor over the session ended {:?}",
            outcome.status
        ));
    }
    let mut by_session = [0u8; NONCE_LEN];
    e.anchor
        .memory
        .read_at(PEER_NONCE_AT, &mut by_session)
        .map_err(|err| format!("cannot read the anchor: {err}"))?;
    let mut by_kernel = [0u8; NONCE_LEN];
    let seg = cma::Seg {
        local: by_kernel.as_mut_ptr() as u64,
        remote: p.anchor + NONCE_AT as u64,
        len: NONCE_LEN as u64,
    };
    cma::copy(t, Op::Read, &[seg]).map_err(|err| {
        format!(
            "the kernel refuses process_vm_readv of pid {}: {}",
            t.pid, err.why
        )
    })?;
    if by_session != by_kernel {
        return Err(format!(
            "pid {} of the connection info is not the process serving {:?}",
            t.pid, p.source_id
        ));
    }
    Ok(())
}

/// Says whether WRITE and READ of host memory with `peer` are copied by
/// the kernel between the two processes (`ORBITTE_ENGINE_CMA` on both
/// engines, same host and uid, the kernel allowing it): `*used` is 1 or 0,
/// and `buf` receives a line saying so (the peer's pid) or why not.
/// Buffer rules as for `orbitte_conn_info`.
///
/// # Safety
/// `used` points at a writable `uint8_t`, `len` at a writable `size_t`; a
/// non-null `buf` at `cap` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn orbitte_peer_cma(
    engine: *const orbitte_engine,
    peer: orbitte_peer,
    used: *mut u8,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> i32 {
    guard("orbitte_peer_cma", || {
        let e = handle::engine(engine)?;
        let p = e.peer(peer)?;
        if used.is_null() {
            return Err(Failure::null("used"));
        }
        let (yes, text) = match &p.cma {
            Ok(t) => (
                1u8,
                format!(
                    "{:?} is pid {} on this host: process_vm_writev and process_vm_readv",
                    p.source_id, t.pid
                ),
            ),
            Err(why) => (
                0u8,
                format!("{:?} over the engine's paths: {why}", p.source_id),
            ),
        };
        // SAFETY: the caller's contract for `used` (null checked).
        unsafe { put(used, yes, "used") }?;
        // SAFETY: the caller's contract for `buf`, `cap` and `len`.
        unsafe { copy_out(text.as_bytes(), false, buf, cap, len, "the text") }?;
        Ok(ORBITTE_OK)
    })
}
