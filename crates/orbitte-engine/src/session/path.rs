//! The path-selection policy (docs/paths.md), as a pure function.
//!
//! For each peer range the engine picks one path, in this order:
//!
//! 1. **local** when the range's descriptor carries a local hint with our
//!    host id (same host, memfd-backed, remotely readable) and attaching
//!    the peer's local server succeeded;
//! 2. **rdma** when both sides have usable rails (our NIC contexts with an
//!    active port, and rkeys for the range from the peer);
//! 3. **tcp** when the peer offers it.
//!
//! A path that *applies* (same host for local; both sides advertising RDMA
//! for rdma) but cannot be used is a **fallback**: it is logged as a
//! warning and listed in [`PathChoice::fell_back`] so that the peer info
//! and outcomes show it. A path that does not apply (another host) is
//! simply not a candidate. Falling back is never silent.

use crate::transport::PathKind;

/// What the policy looks at for one peer range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInputs {
    /// The range's local hint names our host id.
    pub same_host: bool,
    /// Local attach result: `Ok` when the range is mapped here, else why
    /// not (no memfd, write-only range, server unreachable, ...).
    pub local: Result<(), String>,
    /// Both sides advertise RDMA.
    pub rdma_applies: bool,
    /// rdma usability: `Ok` when both sides have a usable rail for the
    /// range, else why not.
    pub rdma: Result<(), String>,
    /// The peer offers tcp (and a tcp session is open).
    pub tcp: Result<(), String>,
}

/// The chosen path and what was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathChoice {
    /// The path requests for the range take.
    pub path: PathKind,
    /// Paths that applied but could not be used, with the reason.
    pub fell_back: Vec<(PathKind, String)>,
}

/// No path can reach the range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no path to the range: {}", .reasons.iter().map(|(p, r)| format!("{p}: {r}")).collect::<Vec<_>>().join("; "))]
pub struct NoPath {
    /// Every path and why it could not be used.
    pub reasons: Vec<(PathKind, String)>,
}

/// Applies the policy. Logs every fallback as a warning, naming `range`
/// when the choice is for one range (`None`: for every range of the peer;
/// the reasons name the ranges they concern).
pub fn choose_path(
    source: &str,
    range: Option<u64>,
    inputs: &PathInputs,
) -> Result<PathChoice, NoPath> {
    let mut fell_back = Vec::new();
    let mut reasons = Vec::new();
    if inputs.same_host {
        match &inputs.local {
            Ok(()) => {
                return Ok(PathChoice {
                    path: PathKind::Local,
                    fell_back,
                });
            }
            Err(why) => {
                fell_back.push((PathKind::Local, why.clone()));
                reasons.push((PathKind::Local, why.clone()));
            }
        }
    } else {
        reasons.push((PathKind::Local, "peer is on another host".to_owned()));
    }
    match &inputs.rdma {
        Ok(()) => {
            return Ok(warn_fallbacks(
                source,
                range,
                PathChoice {
                    path: PathKind::Rdma,
                    fell_back,
                },
            ));
        }
        Err(why) => {
            if inputs.rdma_applies {
                fell_back.push((PathKind::Rdma, why.clone()));
            }
            reasons.push((PathKind::Rdma, why.clone()));
        }
    }
    match &inputs.tcp {
        Ok(()) => Ok(warn_fallbacks(
            source,
            range,
            PathChoice {
                path: PathKind::Tcp,
                fell_back,
            },
        )),
        Err(why) => {
            reasons.push((PathKind::Tcp, why.clone()));
            Err(NoPath { reasons })
        }
    }
}

fn warn_fallbacks(source: &str, range: Option<u64>, choice: PathChoice) -> PathChoice {
    for (from, why) in &choice.fell_back {
        match range {
            Some(range) => tracing::warn!(
                peer = source, range, from = %from, to = %choice.path, reason = %why,
                "path fallback: {from} applies but cannot be used, using {}", choice.path
            ),
            None => tracing::warn!(
                peer = source, from = %from, to = %choice.path, reason = %why,
                "path fallback: {from} applies but cannot be used, using {}", choice.path
            ),
        }
    }
    choice
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> PathInputs {
        PathInputs {
            same_host: true,
            local: Ok(()),
            rdma_applies: true,
            rdma: Ok(()),
            tcp: Ok(()),
        }
    }

    #[test]
    fn local_first_then_rdma_then_tcp() {
        assert_eq!(
            choose_path("p", Some(1), &inputs()).unwrap().path,
            PathKind::Local
        );
        let mut i = inputs();
        i.same_host = false;
        let c = choose_path("p", Some(1), &i).unwrap();
        assert_eq!(
            (c.path, c.fell_back.len()),
            (PathKind::Rdma, 0),
            "another host is not a fallback"
        );
        i.rdma_applies = false;
        i.rdma = Err("peer has no rdma".into());
        let c = choose_path("p", Some(1), &i).unwrap();
        assert_eq!((c.path, c.fell_back.len()), (PathKind::Tcp, 0));
    }

    #[test]
    fn fallbacks_are_listed_never_silent() {
        let mut i = inputs();
        i.local = Err("range has no memfd".into());
        i.rdma = Err("port 1 down".into());
        let c = choose_path("p", Some(1), &i).unwrap();
        assert_eq!(c.path, PathKind::Tcp);
        assert_eq!(
            c.fell_back,
            vec![
                (PathKind::Local, "range has no memfd".into()),
                (PathKind::Rdma, "port 1 down".into())
            ]
        );
    }

    fn warnings(range: Option<u64>, i: &PathInputs) -> String {
        let (choice, log) = crate::session::log_budget::captured(|| choose_path("p", range, i));
        choice.unwrap();
        log
    }

    /// A choice made for a whole peer names no range (not `range=0`); the
    /// reason names the one it concerns.
    #[test]
    fn the_fallback_warning_names_the_range_only_when_there_is_one() {
        let mut i = inputs();
        i.local = Err("range 7 is not memfd-backed".into());
        let peer = warnings(None, &i);
        assert!(
            peer.contains("reason=range 7 is not memfd-backed"),
            "{peer}"
        );
        assert!(!peer.contains("range="), "{peer}");
        let one = warnings(Some(7), &i);
        assert!(one.contains("range=7"), "{one}");
    }

    #[test]
    fn no_path_names_every_reason() {
        let i = PathInputs {
            same_host: false,
            local: Err("n/a".into()),
            rdma_applies: false,
            rdma: Err("no rdma".into()),
            tcp: Err("no session".into()),
        };
        let e = choose_path("p", Some(1), &i).unwrap_err();
        assert_eq!(e.reasons.len(), 3);
        assert!(e.to_string().contains("tcp: no session"));
    }
}
