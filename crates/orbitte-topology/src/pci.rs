//! PCI addresses, the PCIe path from a host bridge to a device, and the
//! distance between two such paths.

use std::fmt;
use std::str::FromStr;

/// A PCI function address, `DDDD:BB:DD.F` (domain, bus, device, function),
/// as sysfs names PCI devices (`0000:3b:00.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment), 16 bits on Linux but kept as `u32`.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// The text was not a PCI address of the form `DDDD:BB:DD.F`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("expected a pci address like 0000:3b:00.0, found {found:?}")]
pub struct PciAddressError {
    /// The text that did not parse.
    pub found: String,
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddressError {
            found: s.to_owned(),
        };
        let mut parts = s.split(':');
        let (Some(domain), Some(bus), Some(devfn), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err());
        };
        let (device, function) = devfn.split_once('.').ok_or_else(err)?;
        let hex = |t: &str, max_len: usize| {
            if t.is_empty() || t.len() > max_len || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                None
            } else {
                u32::from_str_radix(t, 16).ok()
            }
        };
        let domain = hex(domain, 8).ok_or_else(err)?;
        let bus = hex(bus, 2).ok_or_else(err)?;
        let device = hex(device, 2).filter(|d| *d < 32).ok_or_else(err)?;
        let function = hex(function, 1).filter(|f| *f < 8).ok_or_else(err)?;
        Ok(Self {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl serde::Serialize for PciAddress {
    /// As text, `0000:3b:00.0`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Where a PCI function sits in the PCIe hierarchy.
///
/// Read from the resolved sysfs path of the device, e.g.
/// `/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0`
/// gives `host_bridge = "pci0000:00"` and `path = [00:01.0, 01:00.0, 02:08.0,
/// 03:00.0]`: the root port, the switch's upstream and downstream ports,
/// then the device itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PciLocation {
    /// The host bridge (root complex) the device hangs from, as sysfs names
    /// it (`pci0000:00`).
    pub host_bridge: String,
    /// Bridges from the root port down, then the device itself.
    ///
    /// Invariant: nonempty; the last element is the device's own address.
    pub path: Vec<PciAddress>,
}

impl PciLocation {
    /// A location from a host bridge name and the bridge path ending with
    /// the device. Returns `None` when `path` is empty.
    pub fn new(host_bridge: impl Into<String>, path: Vec<PciAddress>) -> Option<Self> {
        if path.is_empty() {
            None
        } else {
            Some(Self {
                host_bridge: host_bridge.into(),
                path,
            })
        }
    }

    /// The device's own PCI address (the last element of the path).
    pub fn address(&self) -> PciAddress {
        // Invariant: path is nonempty (checked by `new`, kept by discovery).
        self.path.last().copied().unwrap_or(PciAddress {
            domain: 0,
            bus: 0,
            device: 0,
            function: 0,
        })
    }

    /// The PCIe distance between two devices; see [`PcieDistance`].
    pub fn distance_to(&self, other: &Self) -> PcieDistance {
        if self.host_bridge != other.host_bridge {
            return PcieDistance::CrossHostBridge;
        }
        // Compare the bridges above the devices; the devices themselves
        // (last elements) are never a shared ancestor.
        let a = &self.path[..self.path.len().saturating_sub(1)];
        let b = &other.path[..other.path.len().saturating_sub(1)];
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let hops = (a.len() - common + b.len() - common) as u32;
        if common == 0 {
            PcieDistance::HostBridge { hops }
        } else {
            PcieDistance::SharedBridge { hops }
        }
    }
}

/// How far apart two PCI devices are in the PCIe tree, best first (the
/// derived order is the ranking order).
///
/// The classes follow the usual NCCL-style reading of `lspci -t`: traffic
/// between devices below a shared bridge (a PCIe switch or a shared root
/// port) never reaches the CPU; traffic between different root ports of the
/// same host bridge crosses the root complex; traffic between different
/// host bridges crosses the CPU interconnect, and may cross sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PcieDistance {
    /// Both devices sit below a common PCIe bridge. `hops` counts the bridges
    /// between each device and the deepest common bridge, summed over both
    /// sides (two devices on one switch's downstream ports: 2).
    SharedBridge {
        /// Bridges traversed below the common bridge, both sides summed.
        hops: u32,
    },
    /// Same host bridge, different root ports: traffic crosses the root
    /// complex. `hops` counts bridges on both sides.
    HostBridge {
        /// Bridges traversed on both sides up to the host bridge.
        hops: u32,
    },
    /// Different host bridges: traffic crosses the CPU interconnect.
    CrossHostBridge,
    /// At least one side has no known PCI location (a software device, a
    /// record without PCI data, or host memory).
    Unknown,
}

impl fmt::Display for PcieDistance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SharedBridge { hops } => write!(f, "shared pcie bridge, {hops} hops"),
            Self::HostBridge { hops } => write!(f, "same host bridge, {hops} hops"),
            Self::CrossHostBridge => f.write_str("different host bridges"),
            Self::Unknown => f.write_str("unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let a: PciAddress = "0000:3b:00.1".parse().unwrap();
        assert_eq!(a.bus, 0x3b);
        assert_eq!(a.function, 1);
        assert_eq!(a.to_string(), "0000:3b:00.1");
        for bad in [
            "",
            "0000:3b:00",
            "0000:3b:00.8",
            "0000:3b:20.0",
            "x:3b:00.0",
            "0:0:0.0:1",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }

    #[test]
    fn distance_classes() {
        let p = |s: &[&str]| {
            PciLocation::new("pci0000:00", s.iter().map(|a| a.parse().unwrap()).collect()).unwrap()
        };
        let nic = p(&[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:08.0",
            "0000:03:00.0",
        ]);
        let gpu = p(&[
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:10.0",
            "0000:04:00.0",
        ]);
        let far = p(&["0000:00:03.0", "0000:05:00.0"]);
        assert_eq!(
            nic.distance_to(&gpu),
            PcieDistance::SharedBridge { hops: 2 }
        );
        assert_eq!(nic.distance_to(&far), PcieDistance::HostBridge { hops: 4 });
        let other = PciLocation::new("pci0000:80", vec!["0000:80:01.0".parse().unwrap()]).unwrap();
        assert_eq!(nic.distance_to(&other), PcieDistance::CrossHostBridge);
        assert!(PcieDistance::SharedBridge { hops: 9 } < PcieDistance::HostBridge { hops: 0 });
    }
}
