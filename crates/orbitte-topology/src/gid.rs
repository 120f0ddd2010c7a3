//! Choosing the GID of a port: a pinned index checked strictly, or the
//! automatic order.
//!
//! Automatic order on an Ethernet (RoCE) port, best first, lowest index
//! first within a rank:
//! 1. RoCE v2 over IPv4 (`::ffff:a.b.c.d`),
//! 2. RoCE v2 over global IPv6,
//! 3. RoCE v2 over link-local IPv6 (`fe80::/10`),
//! 4. RoCE v1, in the same family order.
//!
//! On an InfiniBand port: the port GID, index 0.
//! Zero entries and entries whose type is unknown or does not fit the link
//! layer are skipped, as are entries not matching the configured GID type
//! or netdev.

use std::fmt;

use crate::config::RdmaConfig;
use crate::model::{Gid, GidFamily, GidType, LinkLayer, Port};

/// Why one GID table entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GidProblem {
    /// The entry is empty (zero, or absent from the table).
    Empty,
    /// sysfs did not say the entry's type (needed to tell RoCE v1 from v2).
    TypeUnknown,
    /// The entry's type cannot exist on the port's link layer.
    LinkLayer {
        /// The entry's type.
        gid_type: GidType,
        /// The port's link layer.
        link_layer: LinkLayer,
    },
    /// The entry's type is not the configured GID type.
    Type {
        /// The configured type.
        wanted: GidType,
        /// The entry's type.
        found: GidType,
    },
    /// The entry is not on the configured network interface.
    Netdev {
        /// The configured netdev.
        wanted: String,
        /// The entry's netdev (`None`: no netdev, e.g. an InfiniBand GID).
        found: Option<String>,
    },
    /// On InfiniBand only the port GID (index 0) is chosen automatically.
    NotPortGid,
}

impl fmt::Display for GidProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("empty entry"),
            Self::TypeUnknown => {
                f.write_str("gid type unknown (gid_attrs/types missing or malformed)")
            }
            Self::LinkLayer {
                gid_type,
                link_layer,
            } => write!(f, "{gid_type} gid invalid on an {link_layer} port"),
            Self::Type { wanted, found } => write!(f, "type {found}, configured {wanted}"),
            Self::Netdev { wanted, found } => match found {
                Some(n) => write!(f, "netdev {n}, configured {wanted}"),
                None => write!(f, "no netdev, configured {wanted}"),
            },
            Self::NotPortGid => f.write_str("not the port gid (index 0)"),
        }
    }
}

/// No GID of a port fits the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(tag = "gid_error", rename_all = "snake_case")]
pub enum GidChoiceError {
    /// The port's link layer is unknown, so no GID can be judged.
    #[error("link layer unknown")]
    LinkLayerUnknown,
    /// The pinned GID index does not fit (strict: no fallback).
    #[error("pinned gid index {index}: {problem}")]
    Pinned {
        /// The pinned index.
        index: u32,
        /// The mismatch.
        problem: GidProblem,
    },
    /// Automatic choice found nothing; every nonempty entry with its
    /// problem (empty when the table is empty).
    #[error("no usable gid{}", rejected_list(.rejected))]
    NoUsableGid {
        /// Each nonempty entry's index and problem.
        #[serde(serialize_with = "crate::json::rejected_gids")]
        rejected: Vec<(u32, GidProblem)>,
    },
}

fn rejected_list(rejected: &[(u32, GidProblem)]) -> String {
    if rejected.is_empty() {
        return " (gid table empty)".to_owned();
    }
    let items: Vec<String> = rejected.iter().map(|(i, p)| format!("{i}: {p}")).collect();
    format!(" ({})", items.join("; "))
}

fn check(gid: &Gid, link_layer: LinkLayer, config: &RdmaConfig) -> Result<GidType, GidProblem> {
    if gid.family() == GidFamily::Zero {
        return Err(GidProblem::Empty);
    }
    let gid_type = match (gid.gid_type, link_layer) {
        (Some(t), _) => t,
        // An InfiniBand port has only one kind of GID.
        (None, LinkLayer::InfiniBand) => GidType::Ib,
        (None, LinkLayer::Ethernet) => return Err(GidProblem::TypeUnknown),
    };
    if !gid_type.fits(link_layer) {
        return Err(GidProblem::LinkLayer {
            gid_type,
            link_layer,
        });
    }
    if let Some(wanted) = config.gid_type
        && wanted != gid_type
    {
        return Err(GidProblem::Type {
            wanted,
            found: gid_type,
        });
    }
    if let Some(wanted) = &config.netdev
        && gid.netdev.as_ref() != Some(wanted)
    {
        return Err(GidProblem::Netdev {
            wanted: wanted.clone(),
            found: gid.netdev.clone(),
        });
    }
    Ok(gid_type)
}

fn rank(gid_type: GidType, family: GidFamily) -> u32 {
    let t = match gid_type {
        GidType::RoceV2 | GidType::Ib => 0,
        GidType::RoceV1 => 1,
    };
    let fam = match family {
        GidFamily::Ipv4 => 0,
        GidFamily::Ipv6Global => 1,
        GidFamily::Ipv6LinkLocal | GidFamily::Zero => 2,
    };
    t * 3 + fam
}

/// The GID to use on `port` under `config`: the pinned index checked
/// strictly, or the automatic order of this module's documentation.
pub fn choose_gid<'p>(port: &'p Port, config: &RdmaConfig) -> Result<&'p Gid, GidChoiceError> {
    let link_layer = port.link_layer.ok_or(GidChoiceError::LinkLayerUnknown)?;
    if let Some(index) = config.gid_index {
        let gid = port.gid(index).ok_or(GidChoiceError::Pinned {
            index,
            problem: GidProblem::Empty,
        })?;
        return check(gid, link_layer, config)
            .map(|_| gid)
            .map_err(|problem| GidChoiceError::Pinned { index, problem });
    }
    let mut best: Option<(u32, &Gid)> = None;
    let mut rejected = Vec::new();
    for gid in &port.gids {
        match check(gid, link_layer, config) {
            Err(GidProblem::Empty) => {}
            Err(problem) => rejected.push((gid.index, problem)),
            Ok(_) if link_layer == LinkLayer::InfiniBand && gid.index != 0 => {
                rejected.push((gid.index, GidProblem::NotPortGid));
            }
            Ok(t) => {
                let r = rank(t, gid.family());
                if best.is_none_or(|(b, g)| (r, gid.index) < (b, g.index)) {
                    best = Some((r, gid));
                }
            }
        }
    }
    best.map(|(_, g)| g)
        .ok_or(GidChoiceError::NoUsableGid { rejected })
}
