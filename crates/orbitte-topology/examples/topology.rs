//! Prints the topology discovered under a sysfs root and what the
//! configuration selects, with every reason.
//!
//! `cargo run -p orbitte-topology --example topology [FIXTURE_DIR] [TOML]`
//! (no FIXTURE_DIR: this machine's /sys and /dev). ORBITTE_RDMA_* apply.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use orbitte_topology::{DeviceMask, MemoryLocation, RdmaConfig, SysfsRoots, discover, select};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let roots = match args.first() {
        Some(dir) if dir != "-" => SysfsRoots::fixture(dir),
        _ => SysfsRoots::host(),
    };
    let topology = discover(&roots);
    println!("{topology}");
    for (i, _) in topology.gpus().iter().enumerate() {
        if let Ok(ranked) = topology.rank_nics(MemoryLocation::Cuda { device: i as u32 }) {
            let names: Vec<String> = ranked
                .iter()
                .map(|a| format!("{} ({})", a.name, a.pcie))
                .collect();
            println!("cuda {i}: {}", names.join(", "));
        }
    }
    let config = match RdmaConfig::resolve(RdmaConfig::default(), args.get(1).map(Path::new)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match select(&topology, &config, DeviceMask::ALL) {
        Ok(sel) => {
            for r in &sel.rails {
                println!("selected {} {} port {} {}", r.nic, r.device, r.port, r.gid);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
