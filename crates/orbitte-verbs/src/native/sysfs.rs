//! What sysfs and the filesystem say about a device: driver, uverbs node
//! access, GID type and netdev (fallback for old libibverbs).

use std::path::Path;

use crate::types::{GidType, NodeAccess, UverbsNode};

const CLASS: &str = "/sys/class/infiniband";

/// The kernel driver behind a device: for software devices (recognised by
/// their `parent` attribute) `rxe`/`siw` from the name, otherwise the
/// `device/driver` link's name (`mlx5_core`).
pub(super) fn driver(name: &str) -> Option<String> {
    let dir = Path::new(CLASS).join(name);
    // Software devices (rxe, siw) have a `parent` netdev attribute; their
    // `device` link, where present, names the netdev's driver instead.
    if dir.join("parent").exists() {
        for soft in ["rxe", "siw"] {
            if name.starts_with(soft) {
                return Some(soft.to_owned());
            }
        }
        return Some("software".to_owned());
    }
    let link = std::fs::read_link(dir.join("device/driver")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// `/dev/infiniband/<dev_name>` and whether this process can read and
/// write it (`access(2)`).
pub(super) fn uverbs_node(dev_name: &str) -> UverbsNode {
    let path = format!("/dev/infiniband/{dev_name}");
    let access = match std::ffi::CString::new(path.clone()) {
        Ok(c) => {
            // SAFETY: `c` is a valid NUL-terminated path for the call.
            let rc = unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) };
            if rc == 0 {
                NodeAccess::ReadWrite
            } else {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOENT) => NodeAccess::Missing,
                    Some(errno) => NodeAccess::Denied { errno },
                    None => NodeAccess::Denied {
                        errno: libc::EACCES,
                    },
                }
            }
        }
        Err(_) => NodeAccess::Missing,
    };
    UverbsNode { path, access }
}

fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// GID type from `ports/<p>/gid_attrs/types/<i>` (`IB/RoCE v1`, `RoCE v2`).
pub(super) fn gid_type(name: &str, port: u8, index: u32) -> Option<GidType> {
    let p = Path::new(CLASS).join(format!("{name}/ports/{port}/gid_attrs/types/{index}"));
    let t = read_trimmed(&p)?;
    if t.eq_ignore_ascii_case("RoCE v2") {
        Some(GidType::RoceV2)
    } else if t.contains("RoCE") {
        Some(GidType::RoceV1)
    } else {
        Some(GidType::Ib)
    }
}

/// Netdev of a GID from `ports/<p>/gid_attrs/ndevs/<i>`.
pub(super) fn gid_netdev(name: &str, port: u8, index: u32) -> Option<String> {
    read_trimmed(&Path::new(CLASS).join(format!("{name}/ports/{port}/gid_attrs/ndevs/{index}")))
}

/// Interface name of an ifindex.
pub(super) fn ifname(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname may write.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    Some(super::c_field(&buf))
}
