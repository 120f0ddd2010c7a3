//! `orbitte topology`: what sysfs shows (discovered), how NICs rank for
//! each memory location (affinity), what the configuration selects, and
//! what an engine has initialized.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use orbitte::{
    Access, DeviceMask, EngineBuilder, EngineTopology, HostMemory, MemoryLocation, RdmaConfig,
};
use orbitte_topology::{
    NicAffinity, NicReport, Selection, SelectionError, SysfsRoots, Topology, discover, select,
};
use orbitte_verbs::Provider as _;
use orbitte_verbs::native::NativeProvider;
use serde::Serialize;

use crate::cli::TopologyArgs;
use crate::failure::Failure;

/// The ranking of NICs for one memory location.
#[derive(Debug, Serialize)]
struct AffinityRow {
    location: String,
    ranking: Vec<NicAffinity>,
}

/// What an engine initialized (or why nothing is).
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Initialized {
    /// No engine ran here.
    NotInitialized { why: String },
    /// An engine initialized its contexts.
    Initialized {
        trigger: String,
        listed: Vec<String>,
        contexts: Vec<ContextRow>,
        selection_error: Option<String>,
        registration_error: Option<String>,
    },
}

#[derive(Debug, Serialize)]
struct ContextRow {
    nic: u32,
    device: String,
    port: u8,
    gid_index: u32,
    port_active: bool,
}

/// What the verbs provider said about the discovered devices.
#[derive(Debug, Serialize)]
struct ProviderReport {
    /// The devices the provider lists, when it was asked and answered.
    listed: Option<Vec<String>>,
    /// Why visibility is unknown, when it is.
    unknown: Option<String>,
}

/// What the selection kept, or why it kept nothing.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum SelectionReport {
    /// Rails were selected; `report` says why every other device and
    /// port was left out.
    Selected(Selection),
    /// Nothing was selected: why, and (when the selection looked at the
    /// devices) each device and port with the reason it was left out.
    Failed {
        error: String,
        report: Vec<NicReport>,
    },
}

/// The `--json` document (docs/json.md).
#[derive(Debug, Serialize)]
struct Report {
    schema_version: u32,
    command: &'static str,
    sysfs_root: String,
    discovered: Topology,
    provider: ProviderReport,
    affinity: Vec<AffinityRow>,
    config: String,
    #[serde(serialize_with = "selection_report")]
    selection: Result<Selection, SelectionError>,
    initialized: Initialized,
}

fn selection_report<S: serde::Serializer>(
    r: &Result<Selection, SelectionError>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match r {
        Ok(sel) => SelectionReport::Selected(sel.clone()),
        Err(e) => SelectionReport::Failed {
            error: e.to_string(),
            report: match e {
                SelectionError::NothingSelected { report, .. } => report.clone(),
                _ => Vec::new(),
            },
        },
    }
    .serialize(s)
}

pub(crate) fn run(args: &TopologyArgs) -> Result<(), Failure> {
    if args.initialize && args.sysfs_root.is_some() {
        return Err(Failure::usage(
            "--initialize opens this machine's devices and cannot be combined with --sysfs-root: drop one of them",
        ));
    }
    let (roots, root_name) = match &args.sysfs_root {
        Some(dir) => {
            if !dir.join("sys").is_dir() {
                return Err(Failure::usage(format!(
                    "--sysfs-root {}: no `sys` directory inside; pass a directory holding sys/ and dev/ (a recorded tree)",
                    dir.display()
                )));
            }
            (SysfsRoots::fixture(dir), dir.display().to_string())
        }
        None => (SysfsRoots::host(), "/".to_owned()),
    };
    let mut topology = discover(&roots);
    let listing = if args.sysfs_root.is_some() {
        Err("not asked: --sysfs-root is a recorded tree, not this machine's devices".to_owned())
    } else {
        native_listing()
    };
    let provider = apply_visibility(&mut topology, listing);
    let config = RdmaConfig::resolve(RdmaConfig::default(), args.config.as_deref())
        .map_err(|e| Failure::usage(e.to_string()))?;
    let selection = select(&topology, &config, DeviceMask::ALL);
    let affinity = affinity(&topology);
    let initialized = if args.initialize {
        initialize(&config)
    } else {
        Initialized::NotInitialized {
            why: "no engine running in this process; contexts initialize at the first Host Direct \
                  registration or first RDMA use (run with --initialize to do one here)"
                .into(),
        }
    };
    let report = Report {
        schema_version: crate::schema::SCHEMA_VERSION,
        command: "topology",
        sysfs_root: root_name,
        discovered: topology,
        provider,
        affinity,
        config: config.to_string(),
        selection,
        initialized,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::failed(format!("cannot write json: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", human(&report));
    }
    match initialize_failure(&report.initialized) {
        Some(why) if args.initialize => Err(Failure::failed(format!(
            "--initialize: {why}; `orbitte doctor --path rdma` says what this host lacks for Host Direct"
        ))),
        _ => Ok(()),
    }
}

/// Why `--initialize` did not initialize, or its registration failed.
fn initialize_failure(i: &Initialized) -> Option<String> {
    match i {
        Initialized::NotInitialized { why } => Some(format!("nothing was initialized: {why}")),
        Initialized::Initialized {
            registration_error: Some(e),
            ..
        } => Some(format!("the 4 KiB Host Direct registration failed: {e}")),
        Initialized::Initialized { .. } => None,
    }
}

/// A pinned device must exist on this machine; `place` says where the pin
/// was set.
pub(crate) fn check_device(device: &str, place: &str) -> Result<(), Failure> {
    let topology = discover(&SysfsRoots::host());
    if topology.slot_by_name(device).is_some() {
        return Ok(());
    }
    let names: Vec<&str> = topology.slots().iter().map(|s| s.name()).collect();
    let found = if names.is_empty() {
        "this machine has no RDMA device".to_owned()
    } else {
        format!("devices here: {}", names.join(", "))
    };
    Err(Failure::usage(format!(
        "{place}: no RDMA device named {device} ({found}); name one that `orbitte topology` lists, or remove the pin to discover"
    )))
}

/// The device names the native provider (libibverbs) lists, or why the
/// list failed.
fn native_listing() -> Result<Vec<String>, String> {
    NativeProvider::new()
        .devices()
        .map(|l| l.into_iter().map(|d| d.identity.name).collect())
        .map_err(|e| format!("device list failed: {e}"))
}

/// Marks each discovered NIC visible or not visible to the provider from
/// its listing; when there is no listing, visibility stays unknown and the
/// report says why.
fn apply_visibility(
    topology: &mut Topology,
    listing: Result<Vec<String>, String>,
) -> ProviderReport {
    match listing {
        Ok(names) => {
            topology.set_provider_visibility(names.iter().map(String::as_str));
            ProviderReport {
                listed: Some(names),
                unknown: None,
            }
        }
        Err(why) => ProviderReport {
            listed: None,
            unknown: Some(why),
        },
    }
}

/// Host memory on each NUMA node that has a NIC, then each GPU.
fn affinity(topology: &Topology) -> Vec<AffinityRow> {
    let mut nodes: Vec<u32> = topology.active().filter_map(|(_, n)| n.numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut locations: Vec<MemoryLocation> = nodes
        .into_iter()
        .map(|n| MemoryLocation::Host { numa_node: Some(n) })
        .collect();
    if locations.is_empty() {
        locations.push(MemoryLocation::Host { numa_node: None });
    }
    locations.extend((0..topology.gpus().len()).map(|i| MemoryLocation::Cuda {
        device: u32::try_from(i).unwrap_or(u32::MAX),
    }));
    locations
        .into_iter()
        .filter_map(|loc| {
            topology.rank_nics(loc).ok().map(|ranking| AffinityRow {
                location: loc.to_string(),
                ranking,
            })
        })
        .collect()
}

/// Builds an engine on the native provider and makes one Host Direct
/// registration (which initializes contexts), then reports its topology.
fn initialize(config: &RdmaConfig) -> Initialized {
    let engine = match EngineBuilder::new("orbitte-topology")
        .rdma(config.clone())
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            return Initialized::NotInitialized {
                why: format!("the engine could not be built: {e}"),
            };
        }
    };
    let registration_error = match HostMemory::alloc(4096) {
        Ok(m) => match engine.register_host(Arc::clone(&m), Access::LocalOnly) {
            Ok(r) => {
                if let Err(e) = engine.unregister(r.id) {
                    tracing::warn!(error = %e, "unregistering the probe range failed");
                }
                None
            }
            Err(e) => Some(e.to_string()),
        },
        Err(e) => Some(format!("cannot allocate 4 KiB of host memory: {e}")),
    };
    let t: EngineTopology = engine.topology();
    if let Err(u) = engine.shutdown(Duration::from_secs(5)) {
        tracing::error!(error = %u, "engine shutdown after --initialize");
    }
    if !t.initialized {
        return Initialized::NotInitialized {
            why: registration_error.map_or_else(
                || "the engine did not initialize contexts".into(),
                |e| format!("the 4 KiB Host Direct registration failed: {e}"),
            ),
        };
    }
    Initialized::Initialized {
        trigger: "one 4 KiB Host Direct registration (local-only), then unregistered".into(),
        listed: t.listed,
        contexts: t
            .contexts
            .into_iter()
            .map(|c| ContextRow {
                nic: c.nic.0,
                device: c.device,
                port: c.port,
                gid_index: c.gid_index,
                port_active: c.port_active,
            })
            .collect(),
        selection_error: t.selection_error.map(|e| e.to_string()),
        registration_error,
    }
}

fn human(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "discovered (sysfs under {}): {} NIC slot(s), {} GPU(s)",
        r.sysfs_root,
        r.discovered.len(),
        r.discovered.gpus().len()
    );
    let listing = r.discovered.to_string();
    if listing.trim().is_empty() {
        let _ = writeln!(
            out,
            "  no RDMA device in sysfs (class/infiniband is empty or missing)"
        );
    } else {
        for line in listing.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    match (&r.provider.listed, &r.provider.unknown) {
        (Some(names), _) if names.is_empty() => {
            let _ = writeln!(out, "provider (libibverbs) lists no device");
        }
        (Some(names), _) => {
            let _ = writeln!(out, "provider (libibverbs) lists: {}", names.join(", "));
        }
        (None, Some(why)) => {
            let _ = writeln!(out, "provider visibility unknown: {why}");
        }
        (None, None) => {}
    }
    let _ = writeln!(
        out,
        "affinity (best first: pcie distance, numa distance, nic id):"
    );
    if r.affinity.iter().all(|a| a.ranking.is_empty()) {
        let _ = writeln!(out, "  no active NIC to rank");
    } else {
        for a in &r.affinity {
            let ranked: Vec<String> = a
                .ranking
                .iter()
                .map(|n| {
                    let numa = n
                        .numa_distance
                        .map_or_else(|| "numa ?".to_owned(), |d| format!("numa {d}"));
                    format!("{} {} ({}, {numa})", n.nic, n.name, n.pcie)
                })
                .collect();
            let _ = writeln!(out, "  {}: {}", a.location, ranked.join(", "));
        }
    }
    let _ = writeln!(out, "selection ({}):", r.config);
    match &r.selection {
        Ok(sel) if sel.rails.is_empty() => {
            let _ = writeln!(out, "  nothing selected");
        }
        Ok(sel) => {
            for rail in &sel.rails {
                let _ = writeln!(
                    out,
                    "  selected {} {} port {} {}",
                    rail.nic, rail.device, rail.port, rail.gid
                );
            }
            // Every other slot and port, with why it was left out.
            let _ = writeln!(out, "  every device and port:");
            for nic in &sel.report {
                for line in nic.to_string().lines() {
                    let _ = writeln!(out, "    {line}");
                }
            }
        }
        Err(e) => {
            for line in e.to_string().lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    match &r.initialized {
        Initialized::NotInitialized { why } => {
            let _ = writeln!(out, "initialized: not initialized: {why}");
        }
        Initialized::Initialized {
            trigger,
            listed,
            contexts,
            selection_error,
            registration_error,
        } => {
            let _ = writeln!(out, "initialized (by {trigger}):");
            let _ = writeln!(out, "  provider lists: {}", listed.join(", "));
            for c in contexts {
                let _ = writeln!(
                    out,
                    "  context nic {} {} port {} gid {}: port {}",
                    c.nic,
                    c.device,
                    c.port,
                    c.gid_index,
                    if c.port_active {
                        "ACTIVE"
                    } else {
                        "not active (paused)"
                    }
                );
            }
            if let Some(e) = selection_error {
                for line in e.lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
            if let Some(e) = registration_error {
                let _ = writeln!(out, "  registration: {e}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn report(listing: Result<Vec<String>, String>) -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../orbitte-topology/tests/fixtures/cx7-roce");
        let mut discovered = discover(&SysfsRoots::fixture(&root));
        let provider = apply_visibility(&mut discovered, listing);
        let config = RdmaConfig::default();
        let selection = select(&discovered, &config, DeviceMask::ALL);
        human(&Report {
            schema_version: crate::schema::SCHEMA_VERSION,
            command: "topology",
            sysfs_root: root.display().to_string(),
            affinity: affinity(&discovered),
            discovered,
            provider,
            config: config.to_string(),
            selection,
            initialized: Initialized::NotInitialized { why: "test".into() },
        })
    }

    fn nic_line<'a>(out: &'a str, nic: &str) -> &'a str {
        out.lines()
            .find(|l| l.trim_start().starts_with(nic))
            .unwrap_or_else(|| panic!("no line for {nic}: {out}"))
    }

    #[test]
    fn the_provider_listing_marks_nics_visible_and_not_visible() {
        let out = report(Ok(vec!["mlx5_0".into()]));
        assert!(
            nic_line(&out, "nic 0 mlx5_0").contains("provider visible"),
            "{out}"
        );
        assert!(
            nic_line(&out, "nic 1 mlx5_1").contains("provider not visible"),
            "{out}"
        );
        assert!(out.contains("provider (libibverbs) lists: mlx5_0"), "{out}");
    }

    #[test]
    fn a_failed_device_list_leaves_visibility_unknown_with_the_reason() {
        let out = report(Err(
            "device list failed: ibv_get_device_list failed: errno 38".into(),
        ));
        assert!(
            nic_line(&out, "nic 0 mlx5_0").contains("provider unknown"),
            "{out}"
        );
        assert!(
            out.contains("provider visibility unknown: device list failed: ibv_get_device_list failed: errno 38"),
            "{out}"
        );
    }
}
