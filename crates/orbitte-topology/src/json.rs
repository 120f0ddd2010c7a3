//! How topology values appear in JSON (`orbitte topology --json`,
//! docs/json.md): every enum is a tagged object or a snake_case string.
//! A variant that wraps one value which is not an object names it with a
//! field of its own, through these functions.

use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};

fn one_field<S: Serializer, T: Serialize + ?Sized>(
    name: &'static str,
    value: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(1))?;
    m.serialize_entry(name, value)?;
    m.end()
}

/// `{"state": ...}`.
pub(crate) fn state<S: Serializer, T: Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    one_field("state", v, s)
}

/// `{"reasons": [...]}`.
pub(crate) fn reasons<S: Serializer, T: Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    one_field("reasons", v, s)
}

/// `{"address": ...}`.
pub(crate) fn address<S: Serializer, T: Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    one_field("address", v, s)
}

/// `{"gid": {...}}`.
pub(crate) fn gid<S: Serializer, T: Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    one_field("gid", v, s)
}

/// `[{"index": 3, "problem": {...}}, ...]` for (GID index, problem)
/// pairs.
pub(crate) fn rejected_gids<S: Serializer>(
    v: &[(u32, crate::GidProblem)],
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Rejected<'a> {
        index: u32,
        problem: &'a crate::GidProblem,
    }
    s.collect_seq(v.iter().map(|(index, problem)| Rejected {
        index: *index,
        problem,
    }))
}

/// A node GUID as sysfs writes it (`b859:9f03:00d4:e8e2`): a string, since
/// JSON numbers above 2^53 lose digits in many readers.
pub(crate) fn guid<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(g) => s.collect_str(&format_args!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )),
    }
}

/// `{"message": ...}`.
pub(crate) fn message<S: Serializer, T: Serialize>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    one_field("message", v, s)
}

#[cfg(test)]
mod tests {
    use crate::{
        DeviceExclusion, GidChoiceError, GidProblem, InertCause, PortExclusion, PortOutcome,
        PortState, UverbsAccess,
    };

    fn json<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn exclusions_are_tagged_objects_with_snake_case_names() {
        assert_eq!(
            json(&PortOutcome::Excluded(vec![
                PortExclusion::NotActive(PortState::Down),
                PortExclusion::Gid(GidChoiceError::Pinned {
                    index: 3,
                    problem: GidProblem::Empty
                }),
            ])),
            r#"{"outcome":"excluded","reasons":[{"kind":"port_not_active","state":"down"},{"kind":"gid","gid_error":"pinned","index":3,"problem":{"kind":"empty"}}]}"#
        );
        assert_eq!(
            json(&GidChoiceError::NoUsableGid {
                rejected: vec![(0, GidProblem::TypeUnknown)]
            }),
            r#"{"gid_error":"no_usable_gid","rejected":[{"index":0,"problem":{"kind":"type_unknown"}}]}"#
        );
        assert_eq!(
            json(&DeviceExclusion::Inert(InertCause::Construction(
                "ENODEV".into()
            ))),
            r#"{"kind":"inert","cause":"construction","detail":"ENODEV"}"#
        );
        assert_eq!(
            json(&DeviceExclusion::Uverbs {
                node: None,
                access: UverbsAccess::NoNode
            }),
            r#"{"kind":"uverbs","node":null,"access":{"access":"no_node"}}"#
        );
        assert_eq!(json(&PortState::ActiveDefer), r#""active_defer""#);
    }
}
