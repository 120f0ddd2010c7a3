//! The budget ledger: what registrations and retained copies charge
//! against the budgets.

use crate::error::RegisterRefusal;
use crate::registration::{Budgets, Charges};

/// Budget accounting. Invariant: `in_use` is the sum of the charges of
/// every entry in the registration table plus the charges of retained
/// (unquiesced) copies.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The limits.
    pub budgets: Budgets,
    /// What is charged now.
    pub in_use: Charges,
}

impl Ledger {
    /// Checks that `ask` fits; names the first budget it exceeds.
    pub fn check(&self, ask: Charges) -> Result<(), RegisterRefusal> {
        if self.in_use.mrs.saturating_add(ask.mrs) > self.budgets.max_mrs {
            return Err(RegisterRefusal::ResourceExhausted {
                resource: "memory regions",
                asked: ask.mrs,
                in_use: self.in_use.mrs,
                limit: self.budgets.max_mrs,
            });
        }
        if self.in_use.bytes.saturating_add(ask.bytes) > self.budgets.max_bytes {
            return Err(RegisterRefusal::ResourceExhausted {
                resource: "registered bytes",
                asked: ask.bytes,
                in_use: self.in_use.bytes,
                limit: self.budgets.max_bytes,
            });
        }
        Ok(())
    }

    /// Adds `c` to what is in use.
    pub fn charge(&mut self, c: Charges) {
        self.in_use.mrs += c.mrs;
        self.in_use.bytes += c.bytes;
    }

    /// Takes `c` back from what is in use.
    pub fn release(&mut self, c: Charges) {
        self.in_use.mrs = self.in_use.mrs.saturating_sub(c.mrs);
        self.in_use.bytes = self.in_use.bytes.saturating_sub(c.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_name_the_first_exceeded_limit() {
        let l = Ledger {
            budgets: Budgets {
                max_mrs: 2,
                max_bytes: 100,
            },
            in_use: Charges { mrs: 1, bytes: 10 },
        };
        assert!(l.check(Charges { mrs: 1, bytes: 90 }).is_ok());
        let e = l
            .check(Charges { mrs: 2, bytes: 1 })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("memory regions")
                && e.contains("asked 2")
                && e.contains("in use 1")
                && e.contains("limit 2"),
            "{e}"
        );
        let e = l
            .check(Charges { mrs: 1, bytes: 91 })
            .unwrap_err()
            .to_string();
        assert!(e.contains("registered bytes"), "{e}");
    }
}
