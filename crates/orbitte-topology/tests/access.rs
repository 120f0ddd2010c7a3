//! `AccessCheck::Open` on real files: what this process can open.
//!
//! Root opens any file whatever its mode (CAP_DAC_OVERRIDE), so under root
//! a mode-000 node reads as read-write; the recorded fixtures cover the
//! "cannot open" case for every user.
#![forbid(unsafe_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use orbitte_topology::{AccessCheck, SysfsRoots, UverbsAccess, discover};

fn running_as_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn open_check_reports_this_processes_access() {
    let root = std::env::temp_dir().join(format!("orbitte-topology-access-{}", std::process::id()));
    fs::remove_dir_all(&root).ok();
    for (i, mode) in [(0, 0o666), (1, 0o444), (2, 0o000)] {
        let dev = root.join(format!("sys/class/infiniband/dev{i}"));
        write(&dev.join("node_guid"), "0000:0000:0000:000a\n");
        write(&dev.join("ports/1/state"), "4: ACTIVE\n");
        write(&dev.join("ports/1/link_layer"), "Ethernet\n");
        write(
            &root.join(format!("sys/class/infiniband_verbs/uverbs{i}/ibdev")),
            &format!("dev{i}\n"),
        );
        let node = root.join(format!("dev/infiniband/uverbs{i}"));
        write(&node, "");
        fs::set_permissions(&node, fs::Permissions::from_mode(mode)).unwrap();
    }
    // dev3 has a uverbs class entry but no /dev node.
    write(
        &root.join("sys/class/infiniband/dev3/node_guid"),
        "0000:0000:0000:000b\n",
    );
    write(
        &root.join("sys/class/infiniband/dev3/ports/1/state"),
        "4: ACTIVE\n",
    );
    write(
        &root.join("sys/class/infiniband_verbs/uverbs3/ibdev"),
        "dev3\n",
    );
    let t = discover(&SysfsRoots {
        sys: root.join("sys"),
        dev: root.join("dev"),
        access: AccessCheck::Open,
    });
    fs::remove_dir_all(&root).ok();
    let access: Vec<UverbsAccess> = t
        .slots()
        .iter()
        .map(|s| s.nic().unwrap().uverbs_access.clone())
        .collect();
    if running_as_root() {
        assert_eq!(
            access,
            [
                UverbsAccess::ReadWrite,
                UverbsAccess::ReadWrite,
                UverbsAccess::ReadWrite,
                UverbsAccess::NoNode
            ]
        );
    } else {
        assert_eq!(
            access,
            [
                UverbsAccess::ReadWrite,
                UverbsAccess::ReadOnly,
                UverbsAccess::Denied,
                UverbsAccess::NoNode
            ]
        );
    }
}
