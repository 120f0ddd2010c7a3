//! The descriptors `orbitte serve` needs, and its soft RLIMIT_NOFILE
//! raised to the hard limit so that its own caps, not a shell's default
//! of 1024, decide how many peers it serves.

use orbitte_engine::SessionConfig;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::config::ServeConfig;

/// Descriptors a serving process holds whatever its peers do: stdio, the
/// engine's tcp listener and same-host unix socket, the I/O threads'
/// event loops and wakers, the timer, the metadata store's connection and
/// room for the kernel's and the allocator's own.
const BASE: u64 = 64;

/// What the caps of `cfg` need at most, each part named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Need {
    /// Authenticated tcp sessions (data, rdma control) at once.
    pub(crate) sessions: u64,
    /// Same-host mapping sessions at once (the local path's own cap).
    pub(crate) mapping_sessions: u64,
    /// Connections that have not authenticated yet.
    pub(crate) unauthenticated: u64,
    /// Per range: its memfd, and the copy handed to a same-host peer.
    pub(crate) ranges: u64,
    /// The metrics responder: its listener, its event loop and its
    /// connections.
    pub(crate) metrics: u64,
}

impl Need {
    /// The caps of the engine about to serve (`session` is its effective
    /// session settings), with `--metrics` when `metrics`.
    pub(crate) fn of(cfg: &ServeConfig, session: &SessionConfig, metrics: bool) -> Self {
        let n = |x: usize| u64::try_from(x).unwrap_or(u64::MAX);
        Self {
            sessions: n(session.max_sessions),
            mapping_sessions: n(session.max_sessions),
            unauthenticated: n(session.max_unauthenticated),
            ranges: 2 * n(cfg.range.len()),
            metrics: if metrics {
                n(crate::exporter::MAX_CONNECTIONS) + 2
            } else {
                0
            },
        }
    }

    pub(crate) fn total(&self) -> u64 {
        [
            BASE,
            self.sessions,
            self.mapping_sessions,
            self.unauthenticated,
            self.ranges,
            self.metrics,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// What the total is made of, for the warning.
    fn parts(&self) -> String {
        let mut s = format!(
            "{} sessions (engine.max_sessions) + {} same-host mapping sessions + {} unauthenticated connections",
            self.sessions, self.mapping_sessions, self.unauthenticated
        );
        if self.ranges > 0 {
            s.push_str(&format!(" + {} for the ranges", self.ranges));
        }
        if self.metrics > 0 {
            s.push_str(&format!(" + {} for --metrics", self.metrics));
        }
        s.push_str(&format!(" + {BASE} of the process's own"));
        s
    }
}

/// The soft and hard limits before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) before: u64,
    pub(crate) after: u64,
    pub(crate) hard: u64,
}

/// A limit of `None` is unlimited; Linux caps descriptors at
/// `fs.nr_open` whatever the limit says.
fn finite(v: Option<u64>) -> u64 {
    v.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    })
}

/// The limits now, unchanged.
pub(crate) fn current() -> Limits {
    let l = getrlimit(Resource::Nofile);
    let soft = finite(l.current);
    Limits {
        before: soft,
        after: soft,
        hard: finite(l.maximum),
    }
}

/// Raises the soft descriptor limit to the hard one (never lowers it).
/// A refusal leaves the soft limit as it was, and says why.
pub(crate) fn raise() -> (Limits, Option<std::io::Error>) {
    let now = current();
    if now.before >= now.hard {
        return (now, None);
    }
    let new = Rlimit {
        current: Some(now.hard),
        maximum: getrlimit(Resource::Nofile).maximum,
    };
    match setrlimit(Resource::Nofile, new) {
        Ok(()) => (
            Limits {
                after: finite(getrlimit(Resource::Nofile).current),
                ..now
            },
            None,
        ),
        Err(e) => (now, Some(e.into())),
    }
}

/// The warning when `limits` leave fewer descriptors than `need`; `None`
/// when there are enough.
pub(crate) fn shortfall(need: &Need, limits: &Limits) -> Option<String> {
    let total = need.total();
    if limits.after >= total {
        return None;
    }
    Some(format!(
        "the descriptor limit is {} (hard limit {}) but this configuration's caps need up to {total}: {}; \
         past the limit new peers are refused or reset during their handshake. Raise the hard limit \
         to at least {total}: `ulimit -n {total}` in the shell that starts orbitte serve, \
         LimitNOFILE={total} in its systemd unit, or --ulimit nofile={total} for a container; \
         or lower engine.max_sessions",
        limits.after,
        limits.hard,
        need.parts()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need() -> Need {
        Need {
            sessions: 256,
            mapping_sessions: 256,
            unauthenticated: 128,
            ranges: 4,
            metrics: 0,
        }
    }

    #[test]
    fn the_need_adds_every_cap_and_the_base() {
        assert_eq!(need().total(), 64 + 256 + 256 + 128 + 4);
    }

    #[test]
    fn a_limit_below_the_need_is_warned_about_with_the_number_and_the_fix() {
        let low = Limits {
            before: 256,
            after: 256,
            hard: 256,
        };
        let w = shortfall(&need(), &low).expect("warned");
        for names in [
            "708",
            "ulimit -n 708",
            "LimitNOFILE=708",
            "engine.max_sessions",
        ] {
            assert!(w.contains(names), "{names}: {w}");
        }
        let enough = Limits {
            before: 1024,
            after: 4096,
            hard: 4096,
        };
        assert_eq!(shortfall(&need(), &enough), None);
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let (l, err) = raise();
        assert!(err.is_none(), "{err:?}");
        assert_eq!(l.after, l.hard);
        assert_eq!(current().before, l.hard);
    }
}
