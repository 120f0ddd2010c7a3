//! When to re-establish an rdma rail: a sans-IO state per rail, driven
//! with `now`.
//!
//! Calling order (the driver in the parent module does the I/O):
//! 1. [`Recoveries::track`] each rdma rail when it is installed (with
//!    whether this side can re-establish it) and
//!    [`untrack`](Recoveries::untrack) it when it is closed for good;
//! 2. [`observe`](Recoveries::observe) whether the core has the rail up,
//!    as often as convenient (a rail seen down starts a recovery);
//! 3. [`due`](Recoveries::due) gives the rails whose attempt is due now;
//!    make the attempt and report it with
//!    [`recovered`](Recoveries::recovered),
//!    [`failed`](Recoveries::failed) or
//!    [`deferred`](Recoveries::deferred);
//! 4. [`retry_now`](Recoveries::retry_now) when the cause went away (the
//!    port came back): the backoff or the cooldown is skipped;
//! 5. sleep until [`next_timeout`](Recoveries::next_timeout).
//!
//! Attempt `n` that fails waits `first_backoff * 2^(n-1)` (at most
//! `max_backoff`) before attempt `n + 1`; after `max_attempts` failed
//! attempts the rail cools down for `cooldown`, then starts again at
//! attempt 1.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::transport::RailId;

/// How an rdma rail whose queue pair went to the error state (or whose
/// port went down) is re-established in the background: a new queue pair
/// on the same NIC pair, at the same peer epoch, over the peer's rdma
/// control session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// Attempts in a row before the rail cools down (at least 1).
    pub max_attempts: u32,
    /// Wait after the first failed attempt; doubles after each one.
    pub first_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// Wait after `max_attempts` failed attempts before trying again.
    pub cooldown: Duration,
}

impl Default for RecoveryPolicy {
    /// 5 attempts, backoff from 100 ms up to 5 s, 30 s cooldown.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            cooldown: Duration::from_secs(30),
        }
    }
}

impl RecoveryPolicy {
    /// The wait after failed attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.first_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }
}

/// Where a rail stands, as [`RailInfo`](crate::RailInfo) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryState {
    /// The rail takes new work.
    Up,
    /// Down since then, with no recovery from this side (the engine holds
    /// no rdma control session to the peer on which it opened the rail:
    /// the side that opened the peer re-establishes it).
    Down {
        /// When it was seen down.
        since: Instant,
    },
    /// Being re-established: attempt `attempt` is running or due.
    Recovering {
        /// 1-based attempt number within this round.
        attempt: u32,
        /// When the rail was seen down.
        since: Instant,
    },
    /// `max_attempts` attempts failed: the next round starts then (or
    /// when the port comes back).
    CoolingDown {
        /// When the next round starts.
        until: Instant,
        /// When the rail was seen down.
        since: Instant,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Up,
    Idle,
    Waiting { attempt: u32, at: Instant },
    Attempting { attempt: u32 },
    Cooling { until: Instant },
}

#[derive(Debug, Clone)]
struct Rail {
    recoverable: bool,
    phase: Phase,
    since: Instant,
    recoveries: u32,
}

/// What a failed attempt leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// The next attempt, at that instant.
    Retry { attempt: u32, at: Instant },
    /// The round is over: no attempt until then.
    CoolDown { until: Instant },
}

/// The recovery state of every rdma rail of an engine.
#[derive(Debug, Default)]
pub(crate) struct Recoveries {
    policy: RecoveryPolicy,
    rails: HashMap<RailId, Rail>,
    /// Recoveries of every rail ever tracked (retired ones included).
    total: u64,
}

impl Recoveries {
    pub(crate) fn new(mut policy: RecoveryPolicy) -> Self {
        policy.max_attempts = policy.max_attempts.max(1);
        Self {
            policy,
            rails: HashMap::new(),
            total: 0,
        }
    }

    /// Recoveries of every rail so far, retired rails included.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Follows `rail` (up now). `recoverable`: this side makes attempts.
    pub(crate) fn track(&mut self, rail: RailId, recoverable: bool, now: Instant) {
        self.rails.insert(
            rail,
            Rail {
                recoverable,
                phase: Phase::Up,
                since: now,
                recoveries: 0,
            },
        );
    }

    /// Lets this side make attempts for `rail` from now on (or not).
    pub(crate) fn set_recoverable(&mut self, rail: RailId, recoverable: bool, now: Instant) {
        if let Some(r) = self.rails.get_mut(&rail) {
            r.recoverable = recoverable;
            match r.phase {
                Phase::Idle if recoverable => {
                    r.phase = Phase::Waiting {
                        attempt: 1,
                        at: now,
                    }
                }
                Phase::Waiting { .. } | Phase::Cooling { .. } if !recoverable => {
                    r.phase = Phase::Idle
                }
                _ => {}
            }
        }
    }

    /// Forgets `rail` (closed for good).
    pub(crate) fn untrack(&mut self, rail: RailId) {
        self.rails.remove(&rail);
    }

    /// Feeds whether the core has `rail` up. A rail seen down starts a
    /// recovery (attempt 1 at once); a rail seen up again (the port came
    /// back with its queue pair intact) counts as recovered. Returns
    /// whether that was a recovery.
    pub(crate) fn observe(&mut self, rail: RailId, up: bool, now: Instant) -> bool {
        let Some(r) = self.rails.get_mut(&rail) else {
            return false;
        };
        match (r.phase, up) {
            (Phase::Up, false) => {
                r.since = now;
                r.phase = if r.recoverable {
                    Phase::Waiting {
                        attempt: 1,
                        at: now,
                    }
                } else {
                    Phase::Idle
                };
                false
            }
            (Phase::Up, true) => false,
            // Also during an attempt: the rail is up, whatever the attempt
            // then reports.
            (_, true) => {
                r.phase = Phase::Up;
                r.recoveries += 1;
                self.total += 1;
                true
            }
            _ => false,
        }
    }

    /// Rails whose attempt is due at `now`, each with its attempt number;
    /// they count as attempting until reported.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<(RailId, u32)> {
        let mut out = Vec::new();
        for (rail, r) in &mut self.rails {
            let attempt = match r.phase {
                Phase::Waiting { attempt, at } if at <= now => attempt,
                Phase::Cooling { until } if until <= now => 1,
                _ => continue,
            };
            r.phase = Phase::Attempting { attempt };
            out.push((*rail, attempt));
        }
        out.sort_by_key(|(rail, _)| rail.0);
        out
    }

    /// The attempt re-established the rail (counted once, also when the
    /// rail was seen up meanwhile).
    pub(crate) fn recovered(&mut self, rail: RailId) {
        if let Some(r) = self.rails.get_mut(&rail)
            && r.phase != Phase::Up
        {
            r.phase = Phase::Up;
            r.recoveries += 1;
            self.total += 1;
        }
    }

    /// The peer re-established the rail (a new queue pair here, whatever
    /// this side saw of it).
    pub(crate) fn replaced(&mut self, rail: RailId) {
        if let Some(r) = self.rails.get_mut(&rail) {
            r.phase = Phase::Up;
            r.recoveries += 1;
            self.total += 1;
        }
    }

    /// The attempt failed: the next one after the backoff, or the
    /// cooldown after the last one of the round.
    pub(crate) fn failed(&mut self, rail: RailId, now: Instant) -> Option<AfterFailure> {
        let policy = self.policy;
        let r = self.rails.get_mut(&rail)?;
        let Phase::Attempting { attempt } = r.phase else {
            return None;
        };
        let after = if attempt >= policy.max_attempts {
            AfterFailure::CoolDown {
                until: now + policy.cooldown,
            }
        } else {
            AfterFailure::Retry {
                attempt: attempt + 1,
                at: now + policy.backoff(attempt),
            }
        };
        r.phase = match after {
            AfterFailure::Retry { attempt, at } => Phase::Waiting { attempt, at },
            AfterFailure::CoolDown { until } => Phase::Cooling { until },
        };
        Some(after)
    }

    /// The attempt could not start yet (the old queue pair still holds
    /// work): the same attempt again after the first backoff, not counted.
    pub(crate) fn deferred(&mut self, rail: RailId, now: Instant) {
        let wait = self.policy.first_backoff;
        if let Some(r) = self.rails.get_mut(&rail)
            && let Phase::Attempting { attempt } = r.phase
        {
            r.phase = Phase::Waiting {
                attempt,
                at: now + wait,
            };
        }
    }

    /// The cause went away (the port is active again): a waiting or
    /// cooling rail starts a new round at once.
    pub(crate) fn retry_now(&mut self, rail: RailId, now: Instant) {
        if let Some(r) = self.rails.get_mut(&rail)
            && r.recoverable
            && matches!(r.phase, Phase::Waiting { .. } | Phase::Cooling { .. })
        {
            r.phase = Phase::Waiting {
                attempt: 1,
                at: now,
            };
        }
    }

    /// The earliest instant at which [`due`](Self::due) has a rail.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.rails
            .values()
            .filter_map(|r| match r.phase {
                Phase::Waiting { at, .. } => Some(at),
                Phase::Cooling { until } => Some(until),
                _ => None,
            })
            .min()
    }

    /// The rail's state and how many times it was recovered.
    pub(crate) fn state(&self, rail: RailId) -> Option<(RecoveryState, u32)> {
        let r = self.rails.get(&rail)?;
        let since = r.since;
        let state = match r.phase {
            Phase::Up => RecoveryState::Up,
            Phase::Idle => RecoveryState::Down { since },
            Phase::Waiting { attempt, .. } | Phase::Attempting { attempt } => {
                RecoveryState::Recovering { attempt, since }
            }
            Phase::Cooling { until } => RecoveryState::CoolingDown { until, since },
        };
        Some((state, r.recoveries))
    }

    /// Tracked rails.
    pub(crate) fn rails(&self) -> Vec<RailId> {
        let mut v: Vec<RailId> = self.rails.keys().copied().collect();
        v.sort_by_key(|r| r.0);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: RailId = RailId(3);

    fn policy() -> RecoveryPolicy {
        RecoveryPolicy {
            max_attempts: 3,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(250),
            cooldown: Duration::from_secs(10),
        }
    }

    fn down(t0: Instant) -> Recoveries {
        let mut r = Recoveries::new(policy());
        r.track(R, true, t0);
        assert!(!r.observe(R, false, t0));
        r
    }

    #[test]
    fn a_rail_seen_down_is_attempted_at_once_and_counted_when_recovered() {
        let t0 = Instant::now();
        let mut r = down(t0);
        assert_eq!(
            r.state(R),
            Some((
                RecoveryState::Recovering {
                    attempt: 1,
                    since: t0
                },
                0
            ))
        );
        assert_eq!(r.next_timeout(), Some(t0));
        assert_eq!(r.due(t0), vec![(R, 1)]);
        assert_eq!(r.due(t0), vec![], "an attempt is handed out once");
        r.recovered(R);
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
        assert_eq!(r.next_timeout(), None);
        // The core reports it up: not a second recovery.
        assert!(!r.observe(R, true, t0));
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
    }

    #[test]
    fn failed_attempts_back_off_exponentially_up_to_the_cap_then_cool_down() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = down(t0);
        assert_eq!(r.due(t0), vec![(R, 1)]);
        assert_eq!(
            r.failed(R, t0),
            Some(AfterFailure::Retry {
                attempt: 2,
                at: t0 + ms(100)
            })
        );
        assert_eq!(r.due(t0 + ms(99)), vec![], "not before the backoff");
        assert_eq!(r.due(t0 + ms(100)), vec![(R, 2)]);
        assert_eq!(
            r.failed(R, t0 + ms(100)),
            Some(AfterFailure::Retry {
                attempt: 3,
                at: t0 + ms(300)
            })
        );
        assert_eq!(r.due(t0 + ms(300)), vec![(R, 3)]);
        let after = r.failed(R, t0 + ms(300));
        assert_eq!(
            after,
            Some(AfterFailure::CoolDown {
                until: t0 + ms(300) + Duration::from_secs(10)
            }),
            "bounded: the third failure ends the round"
        );
        let until = t0 + ms(300) + Duration::from_secs(10);
        assert_eq!(
            r.state(R),
            Some((RecoveryState::CoolingDown { until, since: t0 }, 0))
        );
        assert_eq!(r.next_timeout(), Some(until));
        assert_eq!(r.due(until - ms(1)), vec![], "no attempt while cooling");
        assert_eq!(r.due(until), vec![(R, 1)], "a new round after it");
        assert_eq!(policy().backoff(5), ms(250), "capped");
    }

    #[test]
    fn the_port_coming_back_skips_the_cooldown() {
        let t0 = Instant::now();
        let mut r = down(t0);
        for _ in 0..3 {
            let now = r.next_timeout().unwrap();
            assert_eq!(r.due(now).len(), 1);
            r.failed(R, now);
        }
        assert!(matches!(
            r.state(R),
            Some((RecoveryState::CoolingDown { .. }, 0))
        ));
        let t1 = t0 + Duration::from_secs(1);
        r.retry_now(R, t1);
        assert_eq!(r.due(t1), vec![(R, 1)]);
    }

    #[test]
    fn the_port_coming_back_with_the_queue_pair_intact_is_a_recovery() {
        let t0 = Instant::now();
        let mut r = down(t0);
        assert_eq!(r.due(t0), vec![(R, 1)]);
        r.failed(R, t0);
        assert!(r.observe(R, true, t0 + Duration::from_millis(5)));
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
        assert_eq!(r.next_timeout(), None);
    }

    #[test]
    fn a_port_that_returns_during_an_attempt_counts_once() {
        let t0 = Instant::now();
        let mut r = down(t0);
        assert_eq!(r.due(t0), vec![(R, 1)]);
        assert!(r.observe(R, true, t0));
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
        // Whatever the attempt then says, the rail stays up, counted once.
        assert_eq!(r.failed(R, t0), None);
        r.deferred(R, t0);
        r.recovered(R);
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
        assert_eq!(r.next_timeout(), None);
    }

    #[test]
    fn a_deferred_attempt_is_not_counted() {
        let t0 = Instant::now();
        let mut r = down(t0);
        assert_eq!(r.due(t0), vec![(R, 1)]);
        r.deferred(R, t0);
        let at = r.next_timeout().unwrap();
        assert_eq!(at, t0 + Duration::from_millis(100));
        assert_eq!(r.due(at), vec![(R, 1)], "still attempt 1");
    }

    #[test]
    fn a_rail_this_side_cannot_recover_stays_down_without_attempts() {
        let t0 = Instant::now();
        let mut r = Recoveries::new(policy());
        r.track(R, false, t0);
        r.observe(R, false, t0);
        assert_eq!(r.state(R), Some((RecoveryState::Down { since: t0 }, 0)));
        assert_eq!(r.due(t0 + Duration::from_secs(60)), vec![]);
        r.retry_now(R, t0);
        assert_eq!(r.due(t0), vec![]);
        // The peer re-establishes it.
        r.replaced(R);
        assert_eq!(r.state(R), Some((RecoveryState::Up, 1)));
        r.untrack(R);
        assert_eq!(r.state(R), None);
    }
}
