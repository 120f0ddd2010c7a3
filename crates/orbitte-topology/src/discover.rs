//! Discovery from sysfs and `/dev` under injectable roots.
//!
//! Files read (relative to the sys root):
//! - `class/infiniband/<dev>/node_guid`, `class/infiniband/<dev>/ports/<n>/`
//!   `{state,link_layer,rate}`, `.../gids/<i>`, `.../gid_attrs/types/<i>`,
//!   `.../gid_attrs/ndevs/<i>`;
//! - `class/infiniband/<dev>/device` (link to the PCI device) resolved to
//!   `devices/pciDDDD:BB/<bridge>/.../<function>`, and its `numa_node`;
//! - `class/infiniband_verbs/uverbs*/ibdev`, matched to
//!   `<dev root>/infiniband/uverbs*`;
//! - `bus/pci/devices/*/{vendor,class,device,numa_node}` for NVIDIA GPUs;
//! - `devices/system/node/node*/distance`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::Ipv6Addr;
use std::path::{Component, Path, PathBuf};

use crate::error::DiscoveryError;
use crate::model::{
    Gid, GidType, Gpu, InertCause, LinkLayer, Nic, Port, PortState, Topology, TopologyBuilder,
    UverbsAccess,
};
use crate::pci::{PciAddress, PciLocation};

/// How discovery decides whether this process can open a uverbs node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessCheck {
    /// Open the node read-write (then read-only, then write-only) and close
    /// it again, as `ibv_open_device` would. The truth for this process on
    /// a real machine. Root (`CAP_DAC_OVERRIDE`) opens any node whatever its
    /// mode, so a root process never sees the "cannot open" case this way.
    Open,
    /// Read the access recorded in the fixture: the node is a regular file
    /// whose content is one word, `rw`, `r`, `w` or `none`, the access the
    /// recording process had. Used for fixture trees, where file modes are
    /// not kept by git and mean nothing to root.
    Recorded,
}

/// Where discovery reads from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SysfsRoots {
    /// The sysfs root (`/sys`).
    pub sys: PathBuf,
    /// The device root (`/dev`).
    pub dev: PathBuf,
    /// How uverbs node access is decided.
    pub access: AccessCheck,
}

impl SysfsRoots {
    /// This machine: `/sys`, `/dev`, access checked by opening.
    pub fn host() -> Self {
        Self {
            sys: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
            access: AccessCheck::Open,
        }
    }

    /// A recorded fixture tree: `<root>/sys`, `<root>/dev`, recorded access.
    pub fn fixture(root: impl AsRef<Path>) -> Self {
        let root = root.as_ref();
        Self {
            sys: root.join("sys"),
            dev: root.join("dev"),
            access: AccessCheck::Recorded,
        }
    }
}

/// Discovers the topology under `roots`.
///
/// Never fails as a whole: a missing `class/infiniband` gives no NICs; a
/// device whose essential files (`node_guid`, `ports/`) cannot be read or
/// parsed becomes an inert slot with the error; port and GID problems are
/// kept on the port; other problems in [`Topology::problems`]. NIC IDs
/// follow device names in natural order (`mlx5_2` before `mlx5_10`).
pub fn discover(roots: &SysfsRoots) -> Topology {
    let _span = tracing::debug_span!("discover", sys = %roots.sys.display()).entered();
    let mut b = Topology::builder();
    let mut problems = Vec::new();
    let class = roots.sys.join("class/infiniband");
    let mut names = match list_dir(&class) {
        Ok(names) => names,
        Err(e) => {
            if !matches!(&e, DiscoveryError::Io { kind, .. } if *kind == io::ErrorKind::NotFound) {
                problems.push(e);
            }
            Vec::new()
        }
    };
    names.sort_by_key(|n| natural_key(n));
    let uverbs = uverbs_map(roots, &mut problems);
    let canon_sys = fs::canonicalize(&roots.sys).unwrap_or_else(|_| roots.sys.clone());
    for name in names {
        match read_nic(roots, &canon_sys, &name, &uverbs, &mut problems) {
            Ok(nic) => {
                tracing::debug!(name = %nic.name, ports = nic.ports.len(), "nic discovered");
                b = b.nic(nic);
            }
            Err(e) => {
                tracing::warn!(%name, error = %e, "nic discovery failed; slot kept inert");
                b = b.inert(name, None, InertCause::Discovery(e));
            }
        }
    }
    b = discover_gpus(roots, &canon_sys, b, &mut problems);
    b = discover_numa(roots, b, &mut problems);
    for p in problems {
        tracing::debug!(problem = %p, "discovery problem");
        b = b.problem(p);
    }
    b.build()
}

/// The NIC ID order of device names: natural order (`mlx5_2` before
/// `mlx5_10`), the order [`discover`] numbers sysfs devices in. Whoever
/// numbers NICs from another listing (the engine, from the verbs provider)
/// sorts with this so that NIC IDs are the same topology positions
/// everywhere.
pub fn nic_name_order(a: &str, b: &str) -> std::cmp::Ordering {
    natural_key(a).cmp(&natural_key(b))
}

fn natural_key(s: &str) -> (String, u64, String) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (prefix, num) = s.split_at(s.len() - digits);
    (prefix.to_owned(), num.parse().unwrap_or(0), s.to_owned())
}

fn list_dir(dir: &Path) -> Result<Vec<String>, DiscoveryError> {
    let rd = fs::read_dir(dir).map_err(|e| DiscoveryError::io(dir, &e))?;
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| DiscoveryError::io(dir, &e))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push(name);
        }
    }
    Ok(out)
}

fn read_text(path: &Path) -> Result<String, DiscoveryError> {
    let bytes = fs::read(path).map_err(|e| DiscoveryError::io(path, &e))?;
    match String::from_utf8(bytes) {
        Ok(s) => Ok(s.trim().to_owned()),
        Err(e) => Err(DiscoveryError::malformed(
            path,
            "utf-8 text",
            &String::from_utf8_lossy(e.as_bytes()),
        )),
    }
}

fn is_not_found(e: &DiscoveryError) -> bool {
    matches!(e, DiscoveryError::Io { kind, .. } if *kind == io::ErrorKind::NotFound)
}

fn parse_guid(path: &Path, text: &str) -> Result<u64, DiscoveryError> {
    let expected = "a guid like b859:9f03:00d4:e8e2";
    let groups: Vec<&str> = text.split(':').collect();
    if groups.len() != 4 || groups.iter().any(|g| g.len() != 4) {
        return Err(DiscoveryError::malformed(path, expected, text));
    }
    u64::from_str_radix(&groups.concat(), 16)
        .map_err(|_| DiscoveryError::malformed(path, expected, text))
}

fn uverbs_map(roots: &SysfsRoots, problems: &mut Vec<DiscoveryError>) -> BTreeMap<String, String> {
    let dir = roots.sys.join("class/infiniband_verbs");
    let mut map = BTreeMap::new();
    let entries = match list_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            if !is_not_found(&e) {
                problems.push(e);
            }
            return map;
        }
    };
    for node in entries.into_iter().filter(|n| n.starts_with("uverbs")) {
        match read_text(&dir.join(&node).join("ibdev")) {
            Ok(ibdev) => {
                map.insert(ibdev, node);
            }
            Err(e) => problems.push(e),
        }
    }
    map
}

fn read_nic(
    roots: &SysfsRoots,
    canon_sys: &Path,
    name: &str,
    uverbs: &BTreeMap<String, String>,
    problems: &mut Vec<DiscoveryError>,
) -> Result<Nic, DiscoveryError> {
    let dir = roots.sys.join("class/infiniband").join(name);
    let guid_path = dir.join("node_guid");
    let node_guid = Some(parse_guid(&guid_path, &read_text(&guid_path)?)?);
    let ports_dir = dir.join("ports");
    let mut numbers = Vec::new();
    for entry in list_dir(&ports_dir)? {
        match entry.parse::<u32>() {
            Ok(n) if n > 0 => numbers.push(n),
            _ => problems.push(DiscoveryError::malformed(
                &ports_dir.join(&entry),
                "a port directory named by its number (1, 2, ...)",
                &entry,
            )),
        }
    }
    numbers.sort_unstable();
    let ports = numbers
        .into_iter()
        .map(|n| read_port(&ports_dir.join(n.to_string()), n))
        .collect();
    let (pci, numa_node) = pci_of(canon_sys, &dir.join("device"), problems);
    let (uverbs_node, uverbs_access) = match uverbs.get(name) {
        None => (None, UverbsAccess::NoNode),
        Some(node) => {
            let path = roots.dev.join("infiniband").join(node);
            let access = check_access(&path, roots.access, problems);
            (Some(path), access)
        }
    };
    Ok(Nic {
        name: name.to_owned(),
        node_guid,
        ports,
        uverbs_node,
        uverbs_access,
        provider: Default::default(),
        pci,
        numa_node,
    })
}

fn read_port(dir: &Path, number: u32) -> Port {
    let mut port = Port {
        number,
        ..Port::default()
    };
    let state_path = dir.join("state");
    match read_text(&state_path) {
        Ok(text) => {
            let code = text.split(':').next().unwrap_or("").trim();
            match code.parse::<u8>() {
                Ok(code) => port.state = PortState::from_code(code),
                Err(_) => port.problems.push(DiscoveryError::malformed(
                    &state_path,
                    "a port state like \"4: ACTIVE\"",
                    &text,
                )),
            }
        }
        Err(e) => port.problems.push(e),
    }
    let ll_path = dir.join("link_layer");
    match read_text(&ll_path) {
        Ok(text) => match text.as_str() {
            "InfiniBand" => port.link_layer = Some(LinkLayer::InfiniBand),
            "Ethernet" => port.link_layer = Some(LinkLayer::Ethernet),
            _ => port.problems.push(DiscoveryError::malformed(
                &ll_path,
                "InfiniBand or Ethernet",
                &text,
            )),
        },
        Err(e) => port.problems.push(e),
    }
    port.rate = read_text(&dir.join("rate")).ok();
    read_gids(dir, &mut port);
    port
}

fn read_gids(dir: &Path, port: &mut Port) {
    let gids_dir = dir.join("gids");
    let entries = match list_dir(&gids_dir) {
        Ok(e) => e,
        Err(e) => {
            // No table at all reads as an empty table, with the reason kept.
            port.problems.push(e);
            return;
        }
    };
    let mut indices: Vec<u32> = entries.iter().filter_map(|e| e.parse().ok()).collect();
    indices.sort_unstable();
    for index in indices {
        let path = gids_dir.join(index.to_string());
        let value = match read_text(&path) {
            Ok(text) => match text.parse::<Ipv6Addr>() {
                Ok(v) => v,
                Err(_) => {
                    port.problems.push(DiscoveryError::malformed(
                        &path,
                        "a gid like fe80:0000:0000:0000:ba59:9fff:fed4:e8e2",
                        &text,
                    ));
                    continue;
                }
            },
            Err(e) => {
                port.problems.push(e);
                continue;
            }
        };
        if value.is_unspecified() {
            continue;
        }
        let type_path = dir.join("gid_attrs/types").join(index.to_string());
        let gid_type = match read_text(&type_path) {
            Ok(t) if t == "RoCE v2" => Some(GidType::RoceV2),
            Ok(t) if t == "IB/RoCE v1" => match port.link_layer {
                Some(LinkLayer::InfiniBand) => Some(GidType::Ib),
                Some(LinkLayer::Ethernet) => Some(GidType::RoceV1),
                None => None,
            },
            Ok(t) => {
                port.problems.push(DiscoveryError::malformed(
                    &type_path,
                    "\"IB/RoCE v1\" or \"RoCE v2\"",
                    &t,
                ));
                None
            }
            // Kernels without gid_attrs: only InfiniBand can do without.
            Err(e) if is_not_found(&e) && port.link_layer == Some(LinkLayer::InfiniBand) => {
                Some(GidType::Ib)
            }
            Err(e) => {
                port.problems.push(e);
                None
            }
        };
        let ndev_path = dir.join("gid_attrs/ndevs").join(index.to_string());
        // The kernel answers EINVAL for entries without a netdev (all of
        // InfiniBand), so a failed read just means "none".
        let netdev = read_text(&ndev_path).ok().filter(|n| !n.is_empty());
        port.gids.push(Gid {
            index,
            value,
            gid_type,
            netdev,
        });
    }
}

/// Resolves a `device` link (or a `bus/pci/devices` entry) into a PCI
/// location and reads its NUMA node.
fn pci_of(
    canon_sys: &Path,
    link: &Path,
    problems: &mut Vec<DiscoveryError>,
) -> (Option<PciLocation>, Option<u32>) {
    let target = match fs::canonicalize(link) {
        Ok(t) => t,
        // Software devices (rxe, siw) have no PCI parent.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (None, None),
        Err(e) => {
            problems.push(DiscoveryError::io(link, &e));
            return (None, None);
        }
    };
    let location = target
        .strip_prefix(canon_sys)
        .ok()
        .and_then(pci_location_from_sys_path);
    if location.is_none() {
        tracing::debug!(link = %link.display(), target = %target.display(), "not a pci device");
    }
    let numa_path = target.join("numa_node");
    let numa = match read_text(&numa_path) {
        Ok(t) => match t.parse::<i64>() {
            Ok(n) if n < 0 => None,
            Ok(n) => u32::try_from(n).ok(),
            Err(_) => {
                problems.push(DiscoveryError::malformed(
                    &numa_path,
                    "a numa node number or -1",
                    &t,
                ));
                None
            }
        },
        Err(e) if is_not_found(&e) => None,
        Err(e) => {
            problems.push(e);
            None
        }
    };
    (location, numa)
}

/// `devices/pci0000:00/0000:00:01.0/0000:01:00.0` → location.
fn pci_location_from_sys_path(rel: &Path) -> Option<PciLocation> {
    let mut comps = rel.components().filter_map(|c| match c {
        Component::Normal(s) => s.to_str(),
        _ => None,
    });
    if comps.next()? != "devices" {
        return None;
    }
    let bridge = comps.next()?;
    if !bridge.starts_with("pci") {
        return None;
    }
    let path: Option<Vec<PciAddress>> = comps.map(|c| c.parse().ok()).collect();
    PciLocation::new(bridge, path?)
}

fn check_access(path: &Path, how: AccessCheck, problems: &mut Vec<DiscoveryError>) -> UverbsAccess {
    match how {
        AccessCheck::Open => {
            let open = |r, w| fs::OpenOptions::new().read(r).write(w).open(path);
            match open(true, true) {
                Ok(_) => UverbsAccess::ReadWrite,
                Err(e) if e.kind() == io::ErrorKind::NotFound => UverbsAccess::NoNode,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    match (open(true, false).is_ok(), open(false, true).is_ok()) {
                        (true, _) => UverbsAccess::ReadOnly,
                        (false, true) => UverbsAccess::WriteOnly,
                        (false, false) => UverbsAccess::Denied,
                    }
                }
                Err(e) => UverbsAccess::Failed(e.to_string()),
            }
        }
        AccessCheck::Recorded => match read_text(path) {
            Ok(t) => match t.as_str() {
                "rw" => UverbsAccess::ReadWrite,
                "r" => UverbsAccess::ReadOnly,
                "w" => UverbsAccess::WriteOnly,
                "none" => UverbsAccess::Denied,
                _ => {
                    let e =
                        DiscoveryError::malformed(path, "recorded access: rw, r, w or none", &t);
                    let msg = e.to_string();
                    problems.push(e);
                    UverbsAccess::Failed(msg)
                }
            },
            Err(e) if is_not_found(&e) => UverbsAccess::NoNode,
            Err(e) => {
                let msg = e.to_string();
                problems.push(e);
                UverbsAccess::Failed(msg)
            }
        },
    }
}

fn parse_hex(path: &Path, expected: &'static str) -> Result<u32, DiscoveryError> {
    let t = read_text(path)?;
    t.strip_prefix("0x")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| DiscoveryError::malformed(path, expected, &t))
}

fn discover_gpus(
    roots: &SysfsRoots,
    canon_sys: &Path,
    mut b: TopologyBuilder,
    problems: &mut Vec<DiscoveryError>,
) -> TopologyBuilder {
    let dir = roots.sys.join("bus/pci/devices");
    let entries = match list_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            if !is_not_found(&e) {
                problems.push(e);
            }
            return b;
        }
    };
    for entry in entries {
        let dev = dir.join(&entry);
        let vendor = match parse_hex(&dev.join("vendor"), "a vendor id like 0x10de") {
            Ok(v) => v,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if vendor != 0x10de {
            continue;
        }
        let class = match parse_hex(&dev.join("class"), "a class code like 0x030200") {
            Ok(c) => c,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        // 0x0302xx: 3D controller (data-center GPUs); 0x0300xx: VGA.
        if !matches!(class >> 8, 0x0302 | 0x0300) {
            continue;
        }
        let (pci, numa_node) = pci_of(canon_sys, &dev, problems);
        let Some(pci) = pci else {
            problems.push(DiscoveryError::malformed(
                &dev,
                "a link into devices/pci<domain>:<bus>/...",
                &entry,
            ));
            continue;
        };
        let device_id = parse_hex(&dev.join("device"), "a device id like 0x2330")
            .ok()
            .and_then(|d| u16::try_from(d).ok());
        b = b.gpu(Gpu {
            pci,
            numa_node,
            device_id,
        });
    }
    b
}

fn discover_numa(
    roots: &SysfsRoots,
    mut b: TopologyBuilder,
    problems: &mut Vec<DiscoveryError>,
) -> TopologyBuilder {
    let dir = roots.sys.join("devices/system/node");
    let Ok(entries) = list_dir(&dir) else {
        return b;
    };
    for entry in entries {
        let Some(node) = entry
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = dir.join(&entry).join("distance");
        match read_text(&path) {
            Ok(t) => {
                let d: Result<Vec<u32>, _> = t.split_whitespace().map(str::parse).collect();
                match d {
                    Ok(d) if !d.is_empty() => b = b.numa_distances(node, d),
                    _ => problems.push(DiscoveryError::malformed(
                        &path,
                        "space-separated node distances like \"10 21\"",
                        &t,
                    )),
                }
            }
            Err(e) => problems.push(e),
        }
    }
    b
}
