//! Resolving requests at submit: a remote address becomes (range, offset)
//! against the peer's publication as it is now.

use orbitte_wire::{Epoch, RangeDescriptor};

use super::{State, TransferEngine, TransferRequest};
use crate::outcome::{RequestError, SubmitError};
use crate::request::{RemoteTarget, Request};
use crate::transport::{PeerId, RangeId};

/// Finds the published range of `peer` holding `address..address + len`.
/// An address learned from an older incarnation of the peer is refused as
/// such, not as an address in no range.
fn resolve_address(
    st: &State,
    peer: PeerId,
    epoch: Option<Epoch>,
    address: u64,
    len: u64,
) -> Result<(RangeId, u64), RequestError> {
    let p = st
        .engine
        .tables()
        .peers
        .get(&peer.0)
        .ok_or_else(|| st.engine.tables().missing_peer(peer))?;
    orbitte_proto::state::check_epoch(p, peer, epoch)?;
    find_range(p.ranges.values(), peer, address, len).map_err(|e| match e {
        RequestError::UnknownAddress { peer, address } => {
            match st.engine.tables().predecessor_epoch(peer) {
                Some(previous) => RequestError::AddressAfterRestart {
                    peer,
                    address,
                    previous,
                    current: p.epoch,
                },
                None => e,
            }
        }
        e => e,
    })
}

/// The range among `ranges` holding `address..address + len`, and the
/// offset of `address` in it.
fn find_range<'a>(
    ranges: impl Iterator<Item = &'a RangeDescriptor> + Clone,
    peer: PeerId,
    address: u64,
    len: u64,
) -> Result<(RangeId, u64), RequestError> {
    let Some(d) = ranges
        .clone()
        .find(|d| address >= d.address && address - d.address < d.length)
    else {
        return Err(RequestError::UnknownAddress { peer, address });
    };
    let end = d.address.saturating_add(d.length);
    if address.checked_add(len).is_none_or(|e| e > end) {
        let mut ranges = ranges;
        return Err(if ranges.any(|n| n.address == end) {
            RequestError::CrossesRanges {
                peer,
                address,
                len,
                boundary: end,
            }
        } else {
            RequestError::PastEnd {
                peer,
                address,
                len,
                end,
            }
        });
    }
    Ok((RangeId(d.range_id.0), address - d.address))
}

impl TransferEngine {
    /// Turns requests into the engine's resolved form: remote addresses
    /// become (range, offset) against the peers' publications as they are
    /// now. A refusal names the request (index and label).
    pub(crate) fn resolve<R: Into<Request> + Copy>(
        &self,
        batch: &[R],
    ) -> Result<Vec<TransferRequest>, SubmitError> {
        let mut out = Vec::with_capacity(batch.len());
        let mut st = None;
        for (index, r) in batch.iter().enumerate() {
            let r: Request = (*r).into();
            let (peer, epoch, range, remote_offset) = match r.remote {
                RemoteTarget::Range { range, offset } => {
                    (range.peer, Some(range.epoch), range.range, offset)
                }
                RemoteTarget::Ids {
                    peer,
                    epoch,
                    range,
                    offset,
                } => (peer, epoch, range, offset),
                RemoteTarget::Address {
                    peer,
                    epoch,
                    address,
                } => {
                    let st = st.get_or_insert_with(|| self.lock());
                    let (range, offset) = resolve_address(st, peer, epoch, address, r.len)
                        .map_err(|error| SubmitError::Invalid {
                            index,
                            label: r.label,
                            error,
                        })?;
                    (peer, epoch, range, offset)
                }
            };
            out.push(TransferRequest {
                op: r.op,
                registration: r.local,
                local_offset: r.local_offset,
                peer,
                range,
                remote_offset,
                len: r.len,
                label: r.label,
                epoch,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use orbitte_wire::{AccessFlags, AccessToken, RangeId as WireRangeId};

    use super::*;

    fn range(id: u64, address: u64, length: u64) -> RangeDescriptor {
        RangeDescriptor {
            range_id: WireRangeId(id),
            address,
            length,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            token: AccessToken(0),
            rkeys: Vec::new(),
            local: None,
        }
    }

    #[test]
    fn addresses_resolve_to_range_and_offset_or_a_refusal_naming_the_address() {
        // Two adjacent ranges and one apart.
        let ranges = [
            range(1, 0x1000, 0x1000),
            range(2, 0x2000, 0x1000),
            range(3, 0x9000, 0x100),
        ];
        let peer = PeerId(4);
        let find = |address, len| find_range(ranges.iter(), peer, address, len);
        assert_eq!(find(0x1000, 0x1000), Ok((RangeId(1), 0)));
        assert_eq!(find(0x2ff0, 0x10), Ok((RangeId(2), 0xff0)));
        assert_eq!(find(0x9080, 0x80), Ok((RangeId(3), 0x80)));
        assert_eq!(
            find(0x0fff, 1),
            Err(RequestError::UnknownAddress {
                peer,
                address: 0x0fff
            })
        );
        assert_eq!(
            find(0x3000, 1),
            Err(RequestError::UnknownAddress {
                peer,
                address: 0x3000
            })
        );
        assert_eq!(
            find(0x1ff0, 0x20),
            Err(RequestError::CrossesRanges {
                peer,
                address: 0x1ff0,
                len: 0x20,
                boundary: 0x2000
            })
        );
        assert_eq!(
            find(0x9080, 0x81),
            Err(RequestError::PastEnd {
                peer,
                address: 0x9080,
                len: 0x81,
                end: 0x9100
            })
        );
        assert_eq!(
            find(0x9080, u64::MAX),
            Err(RequestError::PastEnd {
                peer,
                address: 0x9080,
                len: u64::MAX,
                end: 0x9100
            })
        );
        let text = find(0x1ff0, 0x20).unwrap_err().to_string();
        assert!(text.contains("0x1ff0") && text.contains("0x2000"), "{text}");
    }
}
