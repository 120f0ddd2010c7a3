//! The rails of one request, held without an allocation in the common case.

use crate::RailId;

/// Rails held inline; more go to the heap.
const INLINE: usize = 4;

/// A request's rails in striping order (slice `i` goes to `rails[i % n]`):
/// up to four inline, so admitting a request allocates nothing for them.
#[derive(Clone, PartialEq, Eq)]
pub struct RailList(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    /// Invariant: `len <= INLINE`.
    Inline {
        len: u8,
        rails: [RailId; INLINE],
    },
    Heap(Vec<RailId>),
}

impl RailList {
    /// No rails.
    pub fn new() -> Self {
        Self(Repr::Inline {
            len: 0,
            rails: [RailId(0); INLINE],
        })
    }
}

impl RailList {
    /// Appends a rail (the list moves to the heap past four).
    pub fn push(&mut self, rail: RailId) {
        let spilled = match &mut self.0 {
            Repr::Inline { len, rails } if usize::from(*len) < INLINE => {
                rails[usize::from(*len)] = rail;
                *len += 1;
                return;
            }
            Repr::Inline { len, rails } => {
                let mut v = Vec::with_capacity(2 * INLINE);
                v.extend_from_slice(&rails[..usize::from(*len)]);
                v.push(rail);
                v
            }
            Repr::Heap(v) => {
                v.push(rail);
                return;
            }
        };
        self.0 = Repr::Heap(spilled);
    }

    /// Keeps the rails for which `keep` holds, in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(&RailId) -> bool) {
        match &mut self.0 {
            Repr::Inline { len, rails } => {
                let mut kept = 0;
                for i in 0..usize::from(*len) {
                    if keep(&rails[i]) {
                        rails[kept] = rails[i];
                        kept += 1;
                    }
                }
                *len = kept as u8;
            }
            Repr::Heap(v) => v.retain(|r| keep(r)),
        }
    }
}

impl Default for RailList {
    fn default() -> Self {
        Self::new()
    }
}

impl From<&[RailId]> for RailList {
    fn from(rails: &[RailId]) -> Self {
        if rails.len() <= INLINE {
            let mut inline = [RailId(0); INLINE];
            inline[..rails.len()].copy_from_slice(rails);
            Self(Repr::Inline {
                len: rails.len() as u8,
                rails: inline,
            })
        } else {
            Self(Repr::Heap(rails.to_vec()))
        }
    }
}

impl From<Vec<RailId>> for RailList {
    fn from(rails: Vec<RailId>) -> Self {
        if rails.len() <= INLINE {
            Self::from(&rails[..])
        } else {
            Self(Repr::Heap(rails))
        }
    }
}

impl std::ops::Deref for RailList {
    type Target = [RailId];
    fn deref(&self) -> &[RailId] {
        match &self.0 {
            Repr::Inline { len, rails } => &rails[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for RailList {
    fn deref_mut(&mut self) -> &mut [RailId] {
        match &mut self.0 {
            Repr::Inline { len, rails } => &mut rails[..usize::from(*len)],
            Repr::Heap(v) => v,
        }
    }
}

impl<'a> IntoIterator for &'a RailList {
    type Item = &'a RailId;
    type IntoIter = std::slice::Iter<'a, RailId>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for RailList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_lists_stay_inline_and_long_ones_keep_every_rail() {
        let short: Vec<RailId> = (0..3).map(RailId).collect();
        let long: Vec<RailId> = (0..7).map(RailId).collect();
        let mut a = RailList::from(&short[..]);
        assert!(matches!(a.0, Repr::Inline { len: 3, .. }));
        a.rotate_left(1);
        assert_eq!(&a[..], &[RailId(1), RailId(2), RailId(0)]);
        let b = RailList::from(long.clone());
        assert!(matches!(b.0, Repr::Heap(_)));
        assert_eq!(&b[..], &long[..]);
        assert!(RailList::new().is_empty());
    }

    #[test]
    fn pushed_rails_spill_to_the_heap_past_four_and_retain_keeps_their_order() {
        let mut a = RailList::new();
        for r in 0..4 {
            a.push(RailId(r));
        }
        assert!(matches!(a.0, Repr::Inline { len: 4, .. }));
        a.push(RailId(4));
        a.push(RailId(5));
        assert!(matches!(a.0, Repr::Heap(_)));
        assert_eq!(&a[..], &(0..6).map(RailId).collect::<Vec<_>>()[..]);
        a.retain(|r| r.0 % 2 == 1);
        assert_eq!(&a[..], &[RailId(1), RailId(3), RailId(5)]);

        let mut b = RailList::from(&[RailId(7), RailId(8), RailId(9)][..]);
        b.retain(|r| r.0 != 8);
        assert!(matches!(b.0, Repr::Inline { len: 2, .. }));
        assert_eq!(&b[..], &[RailId(7), RailId(9)]);
        b.retain(|_| false);
        assert!(b.is_empty());
    }
}
