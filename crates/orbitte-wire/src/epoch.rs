//! Authoritative epochs and how an engine chooses one.

/// The authoritative epoch of a source owner: which incarnation of the engine
/// speaks. A restarted engine presents a larger epoch; peers then drop every
/// connection, descriptor and rkey cached from the older one.
///
/// Invariant: non-zero (0 is reserved so that an all-zero field is never a
/// valid epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(u64);

/// An epoch could not be built or chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    /// Epoch 0 is reserved.
    #[error("epoch 0 is reserved; epochs start at 1")]
    Zero,
    /// The persisted epoch is `u64::MAX`: no newer epoch exists.
    #[error(
        "the last persisted epoch is u64::MAX, no newer epoch exists; \
         give the engine a new source id"
    )]
    Exhausted,
}

impl Epoch {
    /// The smallest epoch.
    pub const MIN: Self = Self(1);

    /// Checks the invariant.
    pub const fn new(value: u64) -> Result<Self, EpochError> {
        if value == 0 {
            Err(EpochError::Zero)
        } else {
            Ok(Self(value))
        }
    }

    /// The number.
    pub const fn value(self) -> u64 {
        self.0
    }

    /// Chooses the epoch a starting engine presents, so that a restart
    /// always presents a newer one than any earlier incarnation:
    /// `max(now_unix_ns, last_persisted + 1)`, and at least 1.
    ///
    /// `now_unix_ns` is the wall clock in nanoseconds since the Unix epoch
    /// (an argument: this crate reads no clock). `last_persisted` is the
    /// epoch the previous incarnation persisted, if any. The engine must
    /// persist the returned epoch (durably: write, fsync, rename) *before*
    /// presenting it to any peer; then a restart within the same nanosecond
    /// or after the clock stepped backwards still moves forward. Without
    /// persistence the clock alone gives the guarantee as long as it never
    /// steps back past the previous start.
    pub fn choose(now_unix_ns: u64, last_persisted: Option<Self>) -> Result<Self, EpochError> {
        let floor = match last_persisted {
            Some(last) => last.0.checked_add(1).ok_or(EpochError::Exhausted)?,
            None => 1,
        };
        Ok(Self(now_unix_ns.max(floor)))
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_moves_forward() {
        let first = Epoch::choose(1_000, None).unwrap();
        assert_eq!(first.value(), 1_000);
        // Clock stepped back: still newer than the persisted one.
        let second = Epoch::choose(500, Some(first)).unwrap();
        assert_eq!(second.value(), 1_001);
        // Same nanosecond.
        let third = Epoch::choose(1_001, Some(second)).unwrap();
        assert_eq!(third.value(), 1_002);
        // Clock ahead: clock wins.
        assert_eq!(Epoch::choose(9_999, Some(third)).unwrap().value(), 9_999);
        // Clock at zero, nothing persisted.
        assert_eq!(Epoch::choose(0, None).unwrap(), Epoch::MIN);
        assert_eq!(
            Epoch::choose(5, Some(Epoch::new(u64::MAX).unwrap())),
            Err(EpochError::Exhausted)
        );
        assert_eq!(Epoch::new(0), Err(EpochError::Zero));
    }
}
