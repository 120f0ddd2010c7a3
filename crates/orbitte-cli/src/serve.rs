//! `orbitte serve --config FILE`: a target engine that publishes the
//! configured ranges and serves peers until it is stopped.
//!
//! The engine's own listener (`engine.listen`) serves every session: tcp
//! data sessions, same-host mapping (the local path) and rdma control
//! links. With an `[rdma]` table the ranges are Host Direct registrations
//! on every usable NIC context (a registration failure is then an error,
//! never a silent switch); without it they are host memory kept off rdma,
//! served by tcp and local only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use orbitte::{
    Access, Budgets, ClusterSecret, DeviceMask, EngineBuilder, HostMemory, RdmaConfig,
    TransferEngine,
};
use orbitte_engine::ListenerStats;
use orbitte_topology::ConfigOverrides;
use serde::Serialize;

use crate::cli::ServeArgs;
use crate::config::{self, Fill, RangeAccess, ServeConfig};
use crate::descriptors::{self, Need};
use crate::failure::Failure;
use crate::topology::check_device;

#[derive(Debug, Serialize)]
struct Effective {
    config: EffectiveConfig,
    /// The RdmaConfig after the file and the ORBITTE_RDMA_* variables.
    rdma_effective: String,
}

/// The file's settings with every default filled in: what the engine
/// runs with. `null` only where no value is the setting (no pinned
/// epoch, no secret file, no idle timeout, no control listener).
#[derive(Debug, Serialize)]
struct EffectiveConfig {
    engine: config::EngineConfig,
    budgets: config::BudgetConfig,
    range: Vec<config::RangeConfig>,
    /// The `[rdma]` selectors after the ORBITTE_RDMA_* variables
    /// (`"auto"`: discovered).
    rdma: serde_json::Value,
    rdma_table: bool,
}

/// `cfg` with the values the engine takes for the keys the file leaves
/// out: the session caps from the engine's session settings `session`,
/// and the `[rdma]` selectors of `rdma`.
fn effective(
    cfg: &ServeConfig,
    session: &orbitte_engine::SessionConfig,
    rdma: &RdmaConfig,
) -> Result<EffectiveConfig, Failure> {
    let mut engine = cfg.engine.clone();
    engine.max_sessions = Some(u64::try_from(session.max_sessions).unwrap_or(u64::MAX));
    engine.evict_idle_after_ms = Some(
        session
            .evict_idle_after
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    );
    let mut r = serde_json::to_value(rdma)
        .map_err(|e| Failure::failed(format!("cannot write json: {e}")))?;
    if let Some(fields) = r.as_object_mut() {
        for value in fields.values_mut() {
            if value.is_null() {
                *value = "auto".into();
            }
        }
    }
    Ok(EffectiveConfig {
        engine,
        budgets: cfg.budgets.clone(),
        range: cfg.range.clone(),
        rdma: r,
        rdma_table: cfg.rdma_table,
    })
}

pub(crate) fn run(args: &ServeArgs) -> Result<(), Failure> {
    let origin = args.config.display().to_string();
    let mut cfg = config::load(&args.config).map_err(|e| Failure::usage(e.0))?;
    let env = ConfigOverrides::from_env().map_err(|e| Failure::usage(e.to_string()))?;
    let mut rdma = RdmaConfig::default();
    rdma.apply(&cfg.rdma);
    rdma.apply(&env);
    if let Some(device) = &rdma.device {
        let place = if matches!(env.device, Some(Some(_))) {
            "environment variable ORBITTE_RDMA_DEVICE".to_owned()
        } else {
            format!("config file {origin}: key rdma.device")
        };
        check_device(device, &place)?;
    }
    // A filled range is written whole at start: it must fit in memory. A
    // zero range is backed only as peers write it.
    let filled = |r: &&config::RangeConfig| r.fill != Fill::Byte(0);
    let total_filled: u64 = cfg
        .range
        .iter()
        .filter(filled)
        .map(|r| r.size)
        .fold(0, u64::saturating_add);
    crate::memory::check(
        total_filled,
        &format!(
            "the {} [[range]] table(s) with a nonzero range.fill of config file {origin} (written whole at start)",
            cfg.range.iter().filter(filled).count()
        ),
        "lower range.size, or leave range.fill at 0 so that memory is backed only as peers write it",
    )?;
    let total: u64 = cfg
        .range
        .iter()
        .map(|r| r.size)
        .fold(0, u64::saturating_add);
    if let Some(avail) = crate::memory::available()
        && total > avail
    {
        tracing::warn!(
            "the ranges of {origin} total {}, more than the {} of memory available here: peers that write all of them will exhaust it",
            crate::memory::gib(total),
            crate::memory::gib(avail)
        );
    }
    let metadata = args
        .metadata
        .clone()
        .unwrap_or_else(|| cfg.engine.metadata.clone());
    let secret = match &cfg.engine.cluster_secret_file {
        Some(file) => Some(
            orbitte::secret::read_secret_file(
                std::path::Path::new(file),
                "key engine.cluster_secret_file",
            )
            .map_err(|e| Failure::usage(format!("config file {origin}: {e}")))?,
        ),
        None => orbitte::secret::secret_from_env().map_err(|e| Failure::usage(e.to_string()))?,
    };
    if !cfg.engine.listen_given && secret.is_none() {
        cfg.engine.listen = config::DEFAULT_LISTEN_OPEN;
        tracing::info!(
            "engine.listen is not set and there is no cluster secret: listening on {} (this host only); \
             set engine.cluster_secret_file or ORBITTE_SECRET_FILE to serve other hosts on {}, \
             or set engine.listen",
            config::DEFAULT_LISTEN_OPEN,
            config::DEFAULT_LISTEN
        );
    }
    let open = open_listener_warning(cfg.engine.listen, secret.is_some());
    // Serving, the engine logs it itself when it listens.
    if let Some(w) = open.as_ref().filter(|_| args.check) {
        tracing::warn!("{w}");
    }
    let pinned = pinned_epoch_warning(&cfg);
    if let Some(w) = &pinned {
        tracing::warn!("{w}");
    }
    let engine = build_engine(&cfg, &rdma, &origin, None, args.metrics_peer_rows)?;
    let session = session_settings(&cfg, &origin)?;
    let need = Need::of(&cfg, &session, args.metrics.is_some());
    if args.check {
        let eff = Effective {
            config: effective(&cfg, &session, &rdma)?,
            rdma_effective: rdma.to_string(),
        };
        // serve raises the soft limit to the hard one at start.
        let limits = descriptors::current();
        let short = descriptors::shortfall(
            &need,
            &descriptors::Limits {
                after: limits.hard,
                ..limits
            },
        );
        if let Some(w) = &short {
            tracing::warn!("{w}");
        }
        if args.json {
            let text = serde_json::to_string_pretty(&eff)
                .map_err(|e| Failure::failed(format!("cannot write json: {e}")))?;
            println!("{text}");
        } else {
            println!("config file {origin} is valid");
            println!(
                "  source id {}, listen {}, {} range(s), rdma {}",
                cfg.engine.source_id,
                cfg.engine.listen,
                cfg.range.len(),
                eff.rdma_effective
            );
            println!(
                "  descriptors: up to {} needed, limit {} (hard {}; serve raises the limit to it)",
                need.total(),
                limits.before,
                limits.hard
            );
            for w in [&open, &pinned, &short].into_iter().flatten() {
                println!("  WARNING: {w}");
            }
        }
        // Nothing was initialized or registered: dropping the engine
        // stops its timer thread and owns no native object.
        drop(engine);
        return Ok(());
    }
    drop(engine);
    // From here a stop signal is kept for the serve loop, which drains;
    // one that arrives while starting stops serve as soon as it serves.
    let signal = stop_signals()?;
    let (limits, refused) = descriptors::raise();
    match refused {
        None => tracing::info!(
            "descriptor limit: soft {} -> {} (hard {}); this configuration needs up to {}",
            limits.before,
            limits.after,
            limits.hard,
            need.total()
        ),
        Some(e) => tracing::warn!(
            "descriptor limit: soft {} left as it is (hard {}): raising it failed: {e}",
            limits.before,
            limits.hard
        ),
    }
    if let Some(w) = descriptors::shortfall(&need, &limits) {
        tracing::warn!("{w}");
        println!("WARNING: {w}");
    }
    let metadata_key = if args.metadata.is_some() {
        "--metadata".to_owned()
    } else {
        format!("config file {origin}: key engine.metadata")
    };
    let mut store = metadata.connect(&metadata_key)?;
    // The engine's own listener serves every session: tcp data sessions,
    // same-host mapping and rdma control links. With an [rdma] table the
    // ranges are Host Direct registrations, also reachable by rdma peers;
    // without it, host memory kept off rdma (an explicit choice, not a
    // fallback).
    let engine = Arc::new(build_engine(
        &cfg,
        &rdma,
        &origin,
        Some(secret),
        args.metrics_peer_rows,
    )?);
    let host_id = engine.host_id().to_owned();
    for r in &cfg.range {
        let mem = alloc_range(r.size, &r.name)?;
        if let Fill::Byte(b) = r.fill
            && b != 0
        {
            mem.fill(0, mem.len(), b)
                .map_err(|e| Failure::failed(format!("range {}: {e}", r.name)))?;
        }
        let access = match r.access {
            RangeAccess::Read => Access::RemoteRead,
            RangeAccess::Write => Access::RemoteWrite,
            RangeAccess::ReadWrite => Access::REMOTE_READ_WRITE,
        };
        if r.fill == Fill::Pattern {
            crate::pattern::fill_target_pattern(&mem)
                .map_err(|e| Failure::failed(format!("range {}: {e}", r.name)))?;
        }
        let (id, note) = if cfg.rdma_table {
            let reg = engine.register(&mem, access).map_err(|e| {
                let text = e.to_string();
                Failure::failed(format!(
                    "range {}: host direct registration failed: {}; fix the [rdma] table of {origin} or remove it to serve over tcp/local only (`orbitte topology` shows every device and port)",
                    r.name,
                    text.lines().next().unwrap_or_default()
                ))
            })?;
            (reg.id.0, format!(", rdma: {} MR copies", reg.copies))
        } else {
            let reg = engine
                .register(mem, access)
                .map_err(|e| Failure::failed(format!("range {}: cannot publish: {e}", r.name)))?;
            (reg.id.0, ", tcp/local only (no [rdma] table)".to_owned())
        };
        println!(
            "published range {} (id {id}): {} bytes, {:?} access, fill {}{note}",
            r.name, r.size, r.access, r.fill
        );
        tracing::info!(range = %r.name, id, size = r.size, access = ?r.access, "published");
    }
    if cfg.range.is_empty() {
        tracing::warn!(
            "no [[range]] in the config: peers can connect but find nothing to read or write"
        );
    }
    if let Some(at) = cfg.engine.control_listen {
        tracing::warn!(
            %at,
            "engine.control_listen is not used: the engine's listener on engine.listen serves rdma control links too"
        );
    }
    let addr = engine
        .listen_addr()
        .ok_or_else(|| Failure::failed("the engine does not listen"))?;
    if let Some(s) = store.as_mut() {
        let at = crate::metadata::advertised(addr, &metadata);
        crate::metadata::publish(s, &engine, at, &host_id)?;
        println!(
            "published {} at {at} to etcd ({metadata_key}); peers name it by its source id",
            engine.source_id()
        );
    }
    println!(
        "serving as {} (epoch {}) on {addr}; local path {}",
        engine.source_id(),
        engine.epoch(),
        if engine.serves_local() {
            "served"
        } else {
            "not served"
        }
    );
    if cfg.rdma_table {
        println!("rdma peers open this engine on the same address");
    }
    for w in [&open, &pinned].into_iter().flatten() {
        println!("WARNING: {w}");
    }
    if let Some(at) = args.metrics {
        let e = engine.clone();
        let bound = crate::exporter::start(
            at,
            orbitte_engine::metrics::PROMETHEUS_CONTENT_TYPE,
            Arc::new(move || e.metrics().to_prometheus()),
        )
        .map_err(|e| {
            Failure::failed(format!(
                "--metrics {at}: cannot listen there: {e}; choose a free port on an address of this host (port 0: any free port)"
            ))
        })?;
        println!("metrics at http://{bound}/metrics (Prometheus text format)");
        tracing::info!(%bound, "serving metrics");
        if let Some(w) = open_metrics_warning(bound) {
            tracing::warn!("{w}");
            println!("WARNING: {w}");
        }
    }
    tracing::info!(source = engine.source_id(), epoch = engine.epoch().value(), %addr, "serving");
    let started = Instant::now();
    let report_every = args.report_every.map(Duration::from_secs_f64);
    let stats = || engine.listener_stats().unwrap_or_default();
    let mut logged = stats();
    let mut next_log = started + LOG_EVERY;
    let mut reported = (started, logged);
    let mut next_report = report_every.map(|d| started + d);
    let received = loop {
        std::thread::sleep(TICK);
        let got = signal.load(Ordering::SeqCst);
        if got != 0 {
            break got;
        }
        // serve runs no application that reads notifications: take them
        // as they come, so the inbox holds none and peers' notifications
        // are queued (and answered so) rather than refused or kept.
        for n in engine.notifications() {
            tracing::debug!(
                peer = %n.source_id,
                bytes = n.payload.len(),
                "notification received (serve reads and discards notifications)"
            );
        }
        let now = Instant::now();
        if next_report.is_some_and(|at| now >= at) {
            let s = stats();
            println!("{}", throughput_line(&reported.1, &s, now - reported.0));
            reported = (now, s);
            next_report = report_every.map(|d| now + d);
        }
        if now >= next_log {
            let s = stats();
            if s != logged {
                tracing::info!(
                    sessions = s.live,
                    admitted = s.admitted,
                    refused = s.refused,
                    requests = s.data_requests,
                    bytes = s.data_bytes,
                    "serving"
                );
                logged = s;
            }
            next_log = now + LOG_EVERY;
        }
    };
    let name = signal_name(received);
    let drain = cfg.engine.drain_timeout();
    println!(
        "{name}: shutting down: draining for up to {} ms (engine.drain_timeout_ms), then closing every session; {name} again exits at once",
        drain.as_millis()
    );
    // The last counts before the listener goes with the engine.
    let last = stats();
    let drained = engine.shutdown(drain);
    println!("{}", last_line(&last, started.elapsed()));
    drained.map_err(|u| {
        Failure::failed(format!(
            "the engine did not shut down cleanly: {u}; its native objects stay with the process until it exits"
        ))
    })
}

/// How often the wait for a signal wakes up.
const TICK: Duration = Duration::from_millis(50);

/// How often a changed listener is logged (at `info`).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Installs the stop signals: the first SIGINT or SIGTERM is stored in
/// the returned cell (the signal's number) for the serve loop to drain;
/// a second one exits at once with 128 + its number.
fn stop_signals() -> Result<Arc<AtomicUsize>, Failure> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let got = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        let installed =
            signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())
                .and_then(|_| signal_hook::flag::register(sig, armed.clone()))
                .and_then(|_| {
                    signal_hook::flag::register_usize(
                        sig,
                        got.clone(),
                        usize::try_from(sig).unwrap_or(1),
                    )
                });
        if let Err(e) = installed {
            return Err(Failure::failed(format!(
                "cannot install the handler of signal {sig}: {e}; serve would not drain when stopped"
            )));
        }
    }
    Ok(got)
}

fn signal_name(sig: usize) -> &'static str {
    match i32::try_from(sig) {
        Ok(signal_hook::consts::SIGINT) => "SIGINT",
        Ok(signal_hook::consts::SIGTERM) => "SIGTERM",
        _ => "signal",
    }
}

/// `bytes` over `over` in MB/s (10^6 bytes per second).
fn rate(bytes: u64, over: Duration) -> f64 {
    let secs = over.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / secs / 1e6
    } else {
        0.0
    }
}

/// The periodic line of `--report-every`: what the listener served
/// between two counts `before` and `now`, `over` apart.
fn throughput_line(before: &ListenerStats, now: &ListenerStats, over: Duration) -> String {
    let bytes = now.data_bytes.saturating_sub(before.data_bytes);
    let requests = now.data_requests.saturating_sub(before.data_requests);
    let secs = over.as_secs_f64().max(f64::MIN_POSITIVE);
    format!(
        "throughput: {:.1} MB/s served ({bytes} bytes of READ and WRITE payload in {:.1} s), {:.0} requests/s, {} sessions open, {} admitted, {} refused",
        rate(bytes, over),
        over.as_secs_f64(),
        requests as f64 / secs,
        now.live,
        now.admitted.saturating_sub(before.admitted),
        now.refused.saturating_sub(before.refused)
    )
}

/// The line `serve` prints last, after it drained.
fn last_line(s: &ListenerStats, uptime: Duration) -> String {
    format!(
        "stopped after {:.1} s: served {} bytes in {} requests ({:.1} MB/s on average), {} sessions admitted, {} refused",
        uptime.as_secs_f64(),
        s.data_bytes,
        s.data_requests,
        rate(s.data_bytes, uptime),
        s.admitted,
        s.refused
    )
}

/// The warning of a config that pins `engine.epoch`: a restart with the
/// same file presents the same epoch, which peers take for the same
/// incarnation (a reconnect), so the handles they kept from the previous
/// process stay valid against the new one.
fn pinned_epoch_warning(cfg: &ServeConfig) -> Option<String> {
    let e = cfg.engine.epoch?;
    Some(format!(
        "engine.epoch is pinned to {e}: a restart with this file presents the same epoch, which \
         peers take for the same incarnation, so the handles they kept from the previous process \
         read and write this process's memory; remove engine.epoch and persist engine.last_epoch \
         instead (each start then chooses an epoch newer than it), or raise engine.epoch before \
         every restart"
    ))
}

/// What `serve` warns about in its banner (and `--check`'s summary) when
/// it listens where other hosts can reach it without a cluster secret:
/// the engine's own warning, naming this config's key. `None` with a
/// secret, or on a loopback address.
fn open_listener_warning(listen: std::net::SocketAddr, secret: bool) -> Option<String> {
    if secret {
        return None;
    }
    orbitte::secret::open_listener_warning(listen)
        .map(|w| format!("{w} (in this config: engine.cluster_secret_file)"))
}

/// What `serve` warns about when its metrics listen where other hosts
/// can reach them: the responder has no authentication. `None` on a
/// loopback address.
fn open_metrics_warning(at: std::net::SocketAddr) -> Option<String> {
    if at.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "--metrics {at} is reachable from other hosts: anyone who reaches it reads the metrics \
         (peer source ids, traffic per peer, listener counters) with no authentication; serve \
         them on a loopback or management address (--metrics 127.0.0.1:PORT) unless every \
         host that reaches {at} may read them"
    ))
}

fn alloc_range(size: u64, name: &str) -> Result<Arc<HostMemory>, Failure> {
    let n = usize::try_from(size).map_err(|_| {
        Failure::usage(format!(
            "range {name}: size {size} does not fit this machine"
        ))
    })?;
    HostMemory::alloc(n).map_err(|e| {
        Failure::failed(format!(
            "range {name}: cannot allocate {size} bytes of host memory: {e}; lower range.size"
        ))
    })
}

/// The session settings the engine of `cfg` serves with: the engine's
/// defaults, with the file's session caps.
fn session_settings(
    cfg: &ServeConfig,
    origin: &str,
) -> Result<orbitte_engine::SessionConfig, Failure> {
    let e = &cfg.engine;
    let id = orbitte_wire::SourceId::new(e.source_id.clone()).map_err(|err| {
        Failure::usage(format!("config file {origin}: key engine.source_id: {err}"))
    })?;
    let mut s = orbitte_engine::SessionConfig::new(id, orbitte_wire::Epoch::MIN);
    if let Some(n) = e.max_sessions {
        s.max_sessions = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(after) = e.evict_idle_after() {
        s.evict_idle_after = after;
    }
    Ok(s)
}

/// The serving engine; `serve`: with its listener on `engine.listen` and
/// this cluster secret (`None`: only checking the settings, nothing bound).
fn build_engine(
    cfg: &ServeConfig,
    rdma: &RdmaConfig,
    origin: &str,
    serve: Option<Option<ClusterSecret>>,
    metrics_peer_rows: usize,
) -> Result<TransferEngine, Failure> {
    let e = &cfg.engine;
    let mut b = EngineBuilder::new(e.source_id.clone())
        .rdma(rdma.clone())
        .budgets(Budgets {
            max_mrs: cfg.budgets.max_mrs,
            max_bytes: cfg.budgets.max_bytes,
        })
        .dispatch_mask(DeviceMask(e.dispatch_mask))
        .slice_size(u32::try_from(e.slice_size).unwrap_or(u32::MAX))
        .request_timeout(e.request_timeout())
        .drain_timeout(e.drain_timeout())
        .handshake_timeout(e.handshake_timeout())
        .idle_timeout(e.idle_timeout())
        .max_in_flight(e.max_in_flight)
        .signal_interval(e.signal_interval)
        .metrics_peer_rows(metrics_peer_rows);
    if let Some(n) = e.max_sessions {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        b = b.session_settings(move |c| c.max_sessions = n);
    }
    if let Some(after) = e.evict_idle_after() {
        b = b.session_settings(move |c| c.evict_idle_after = after);
    }
    if let Some(x) = e.epoch {
        b = b.epoch(x);
    }
    if let Some(x) = e.last_epoch {
        b = b.last_epoch(x);
    }
    if !cfg.rdma_table {
        b = b.host_memory_without_rdma();
    }
    if let Some(secret) = serve {
        b = b.listen(e.listen);
        if let Some(s) = secret {
            b = b.cluster_secret(s);
        }
    }
    b.build().map_err(|err| {
        if let orbitte::BuildError::Listen(_) = &err {
            return Failure::failed(format!("{err} (config file {origin}, key engine.listen)"));
        }
        let key = match &err {
            orbitte::BuildError::Setting { name, .. } => format!("engine.{name}"),
            orbitte::BuildError::SourceId(_) => "engine.source_id".into(),
            _ => "engine.epoch".into(),
        };
        Failure::usage(format!("config file {origin}: key {key}: {err}"))
    })
}

#[cfg(test)]
mod tests {
    use super::{open_listener_warning, open_metrics_warning};

    #[test]
    fn metrics_other_hosts_reach_are_warned_about() {
        let at = |s: &str| s.parse().unwrap();
        let w = open_metrics_warning(at("0.0.0.0:9464")).expect("warned");
        assert!(w.contains("0.0.0.0:9464") && w.contains("anyone"), "{w}");
        assert!(open_metrics_warning(at("[::]:9464")).is_some());
        assert!(open_metrics_warning(at("10.0.0.5:9464")).is_some());
        assert_eq!(open_metrics_warning(at("127.0.0.1:9464")), None);
        assert_eq!(open_metrics_warning(at("[::1]:9464")), None);
    }

    #[test]
    fn without_a_secret_only_a_listener_other_hosts_reach_is_warned_about() {
        let at = |s: &str| s.parse().unwrap();
        let w = open_listener_warning(at("0.0.0.0:7400"), false).expect("warned");
        for names in ["0.0.0.0:7400", "engine.cluster_secret_file", "fence"] {
            assert!(w.contains(names), "{w}");
        }
        assert!(open_listener_warning(at("10.1.2.3:7400"), false).is_some());
        assert!(open_listener_warning(at("[::]:7400"), false).is_some());
        assert_eq!(open_listener_warning(at("127.0.0.1:7400"), false), None);
        assert_eq!(open_listener_warning(at("[::1]:7400"), false), None);
        assert_eq!(open_listener_warning(at("0.0.0.0:7400"), true), None);
    }
}
