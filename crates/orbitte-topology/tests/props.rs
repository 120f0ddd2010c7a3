//! Property tests: the selector algebra (whitelist, blacklist, pin, mask)
//! and the stability of NIC IDs.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use orbitte_topology::{
    DeviceMask, Gid, GidType, InertCause, LinkLayer, Nic, NicId, Port, RdmaConfig, SelectionError,
    Topology, select,
};
use proptest::prelude::*;

const MAX: usize = 10;

fn name(i: usize) -> String {
    format!("mlx5_{i}")
}

fn healthy(i: usize) -> Nic {
    let gid = Gid {
        index: 0,
        value: format!("::ffff:10.0.0.{}", i + 1).parse().unwrap(),
        gid_type: Some(GidType::RoceV2),
        netdev: Some(format!("eth{i}")),
    };
    Nic::new(
        name(i),
        vec![Port::active(1, LinkLayer::Ethernet, vec![gid])],
    )
}

fn topology(n: usize) -> Topology {
    Topology::from_nics((0..n).map(healthy))
}

fn subset(max: usize) -> impl Strategy<Value = BTreeSet<usize>> {
    proptest::collection::btree_set(0..max, 0..=max)
}

fn names(set: &BTreeSet<usize>) -> Vec<String> {
    set.iter().map(|&i| name(i)).collect()
}

fn selected(
    t: &Topology,
    cfg: &RdmaConfig,
    mask: DeviceMask,
) -> Result<BTreeSet<usize>, SelectionError> {
    select(t, cfg, mask).map(|s| s.rails.iter().map(|r| r.nic.index()).collect())
}

proptest! {
    /// The selected set is exactly: masked in, and the pin admits it, and
    /// (whitelist nonempty ? whitelisted : not blacklisted).
    #[test]
    fn algebra_matches_the_rule(
        n in 1..MAX,
        white in subset(MAX + 2),
        black in subset(MAX + 2),
        pin in proptest::option::of(0..MAX + 2),
        mask in any::<u64>(),
    ) {
        let t = topology(n);
        let mut cfg = RdmaConfig::default().whitelist(names(&white)).blacklist(names(&black));
        cfg.device = pin.map(name);
        let expected: BTreeSet<usize> = (0..n)
            .filter(|&i| mask >> i & 1 == 1)
            .filter(|&i| pin.is_none_or(|p| p == i))
            .filter(|&i| if white.is_empty() { !black.contains(&i) } else { white.contains(&i) })
            .collect();
        match selected(&t, &cfg, DeviceMask(mask)) {
            Ok(got) => prop_assert_eq!(got, expected),
            Err(SelectionError::NothingSelected { report, .. }) => {
                prop_assert!(expected.is_empty());
                prop_assert_eq!(report.len(), n);
                // Every device left out says why.
                prop_assert!(report.iter().all(|r| !r.excluded.is_empty()));
            }
            Err(SelectionError::MaskSelectsNoActiveNic { .. }) => {
                prop_assert!((0..n).all(|i| mask >> i & 1 == 0));
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    /// With a nonempty whitelist the blacklist changes nothing.
    #[test]
    fn whitelist_makes_blacklist_irrelevant(
        n in 1..MAX,
        white in subset(MAX).prop_filter("nonempty", |w| !w.is_empty()),
        black in subset(MAX),
    ) {
        let t = topology(n);
        let a = selected(&t, &RdmaConfig::default().whitelist(names(&white)), DeviceMask::ALL);
        let b = selected(&t, &RdmaConfig::default().whitelist(names(&white)).blacklist(names(&black)), DeviceMask::ALL);
        prop_assert_eq!(a.ok(), b.ok());
    }

    /// A larger mask never selects less; a selection is always within the mask.
    #[test]
    fn mask_is_monotone(n in 1..MAX, small in any::<u64>(), extra in any::<u64>()) {
        let t = topology(n);
        let cfg = RdmaConfig::default();
        let a = selected(&t, &cfg, DeviceMask(small)).unwrap_or_default();
        let b = selected(&t, &cfg, DeviceMask(small | extra)).unwrap_or_default();
        prop_assert!(a.is_subset(&b));
        prop_assert!(a.iter().all(|&i| small >> i & 1 == 1));
    }

    /// Marking slots inert never moves or removes a slot, and selects the
    /// same as masking those slots out.
    #[test]
    fn nic_ids_are_stable_under_inert_marking(
        n in 1..MAX,
        failures in proptest::collection::vec(0..MAX + 3, 0..8),
        mask in any::<u64>(),
    ) {
        let mut t = topology(n);
        let before: Vec<String> = t.slots().iter().map(|s| s.name().to_owned()).collect();
        let mut inert_bits = 0u64;
        for f in &failures {
            let r = t.mark_inert(NicId(*f as u32), InertCause::Construction(format!("fail {f}")));
            prop_assert_eq!(r.is_ok(), *f < n);
            if *f < n {
                inert_bits |= 1 << f;
            }
        }
        // Editing a NIC in place does not move it either.
        if let Some(nic) = t.nic_mut(NicId(0)) {
            nic.ports[0].state = orbitte_topology::PortState::Active;
        }
        let after: Vec<String> = t.slots().iter().map(|s| s.name().to_owned()).collect();
        prop_assert_eq!(&before, &after);
        for (i, slot) in t.slots().iter().enumerate() {
            prop_assert_eq!(slot.id(), NicId(i as u32));
            prop_assert_eq!(slot.is_inert(), inert_bits >> i & 1 == 1);
        }
        // A slot that failed first keeps its first cause.
        if let Some(f) = failures.iter().find(|f| **f < n) {
            let cause = t.slot(NicId(*f as u32)).unwrap().inert_cause().unwrap().to_string();
            let want = format!("fail {f}");
            prop_assert!(cause.ends_with(&want), "{} vs {}", cause, want);
        }
        let cfg = RdmaConfig::default();
        let fresh = topology(n);
        prop_assert_eq!(
            selected(&t, &cfg, DeviceMask(mask)).ok(),
            selected(&fresh, &cfg, DeviceMask(mask & !inert_bits)).ok()
        );
        // A mask naming only inert or absent slots is its own error.
        if mask & !inert_bits & ((1u64 << n) - 1) == 0 {
            let only_inert = matches!(
                select(&t, &cfg, DeviceMask(mask)),
                Err(SelectionError::MaskSelectsNoActiveNic { .. })
            );
            prop_assert!(only_inert);
        }
    }

    /// Records keep their order as NIC IDs.
    #[test]
    fn record_order_is_nic_id_order(order in Just((0..MAX).collect::<Vec<_>>()).prop_shuffle()) {
        let t = Topology::from_nics(order.iter().map(|&i| healthy(i)));
        for (pos, &i) in order.iter().enumerate() {
            prop_assert_eq!(t.slot(NicId(pos as u32)).unwrap().name(), name(i));
        }
    }
}
