//! `segment-publication` and `segment-retire`: the segment descriptor.

use std::collections::HashSet;

use crate::codec::{Reader, Writer};
use crate::epoch::Epoch;
use crate::error::{DecodeError, EncodeError, Problem};
use crate::types::{AccessFlags, AccessToken, Gid, HostId, LocalMechanism, NicId, RangeId};

/// The most ranges in one publication or retire frame.
pub const MAX_RANGES_PER_FRAME: usize = 1024;
/// The most per-NIC rkeys of one range (one per NIC of the owner).
pub const MAX_RKEYS_PER_RANGE: usize = 64;

/// Wire bytes of one [`NicRkey`].
pub(crate) const NIC_RKEY_LEN: usize = 24;
/// Minimum wire bytes of one [`RangeDescriptor`] (no rkeys, no local hint).
pub(crate) const RANGE_MIN_LEN: usize = 38;

/// Published ranges of the sender (a segment descriptor). A range id
/// already published in the same epoch is replaced (a re-send is
/// idempotent); range ids are never reused for different memory within an
/// epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPublication {
    /// The owner's epoch; a receiver drops a publication whose epoch is not
    /// the session's.
    pub epoch: Epoch,
    /// The ranges. Invariant: at most [`MAX_RANGES_PER_FRAME`], unique ids.
    pub ranges: Vec<RangeDescriptor>,
}

/// One published range and the keys each path needs to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeDescriptor {
    /// Id within the owner's epoch.
    pub range_id: RangeId,
    /// Virtual address of the first byte in the owner's address space (what
    /// RDMA work requests name).
    pub address: u64,
    /// Bytes. Invariant: non-zero and `address + length` does not overflow.
    pub length: u64,
    /// What peers may do.
    pub access: AccessFlags,
    /// The token the tcp and local paths check.
    pub token: AccessToken,
    /// One rkey per NIC the range is registered on (Host Direct).
    /// Invariant: at most [`MAX_RKEYS_PER_RANGE`], unique NIC IDs. Empty when
    /// the range is not reachable over RDMA.
    pub rkeys: Vec<NicRkey>,
    /// How a same-host peer can map the range, if it can.
    pub local: Option<LocalHint>,
}

/// The rkey of a range on one of the owner's NICs, with the NIC's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicRkey {
    /// The owner's NIC ID.
    pub nic_id: NicId,
    /// The remote key of the range's MR on that NIC.
    pub rkey: u32,
    /// The port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The selected GID of the NIC's port.
    pub gid: Gid,
}

/// Same-host sharing hint for the local path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalHint {
    /// The owner's host; the local path applies only when it equals ours.
    pub host_id: HostId,
    /// How to obtain the memory.
    pub mechanism: LocalMechanism,
    /// Offset of the range's first byte within the shared file.
    pub file_offset: u64,
}

/// Ranges the sender no longer publishes. A peer drops their descriptors and
/// rkeys; data requests naming them fail with status `retired` or
/// `unknown-range`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRetire {
    /// The owner's epoch.
    pub epoch: Epoch,
    /// Invariant: at most [`MAX_RANGES_PER_FRAME`], unique.
    pub range_ids: Vec<RangeId>,
}

impl SegmentPublication {
    pub(crate) fn validate(&self) -> Result<(), (&'static str, Problem)> {
        let mut ids = HashSet::with_capacity(self.ranges.len());
        for range in &self.ranges {
            if !ids.insert(range.range_id) {
                return Err((
                    "range.range_id",
                    Problem::Duplicate {
                        value: range.range_id.0,
                    },
                ));
            }
            range.validate()?;
        }
        Ok(())
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        // Counts first so that the error names the bound, then the rules.
        w.u64(self.epoch.value());
        w.count("ranges", true, self.ranges.len(), MAX_RANGES_PER_FRAME)?;
        if let Err((field, problem)) = self.validate() {
            return Err(w.err(field, problem));
        }
        for range in &self.ranges {
            range.encode(w)?;
        }
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let epoch = decode_epoch(r, "epoch")?;
        let n = r.count("ranges", true, MAX_RANGES_PER_FRAME, RANGE_MIN_LEN)?;
        let mut ranges = Vec::with_capacity(n);
        for _ in 0..n {
            ranges.push(RangeDescriptor::decode(r)?);
        }
        let p = Self { epoch, ranges };
        p.validate().map_err(|(f, pr)| r.err(f, pr))?;
        Ok(p)
    }
}

pub(crate) fn decode_epoch(r: &mut Reader<'_>, field: &'static str) -> Result<Epoch, DecodeError> {
    let v = r.u64(field)?;
    Epoch::new(v).map_err(|_| r.err(field, Problem::Empty))
}

impl RangeDescriptor {
    fn validate(&self) -> Result<(), (&'static str, Problem)> {
        if self.length == 0 {
            return Err(("range.length", Problem::Empty));
        }
        if self.address.checked_add(self.length).is_none() {
            return Err((
                "range.length",
                Problem::Inconsistent {
                    rule: "address + length must not overflow u64",
                },
            ));
        }
        if self.rkeys.len() > MAX_RKEYS_PER_RANGE {
            return Err((
                "range.rkeys",
                Problem::TooMany {
                    count: self.rkeys.len(),
                    max: MAX_RKEYS_PER_RANGE,
                },
            ));
        }
        let mut nics = HashSet::with_capacity(self.rkeys.len());
        for k in &self.rkeys {
            if !nics.insert(k.nic_id) {
                return Err((
                    "range.rkey.nic_id",
                    Problem::Duplicate {
                        value: k.nic_id.0.into(),
                    },
                ));
            }
        }
        Ok(())
    }

    fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.range_id.0);
        w.u64(self.address);
        w.u64(self.length);
        w.u32(self.access.0);
        w.u64(self.token.0);
        w.count("range.rkeys", false, self.rkeys.len(), MAX_RKEYS_PER_RANGE)?;
        for k in &self.rkeys {
            w.u16(k.nic_id.0);
            w.u32(k.rkey);
            w.u16(k.lid);
            w.put(&k.gid.0);
        }
        w.tag(self.local.is_some());
        if let Some(l) = &self.local {
            w.u8(l.mechanism.0);
            w.u64(l.file_offset);
            w.bytes8("range.local.host_id", l.host_id.as_str().as_bytes())?;
        }
        Ok(())
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let range_id = RangeId(r.u64("range.range_id")?);
        let address = r.u64("range.address")?;
        let length = r.u64("range.length")?;
        let access = AccessFlags(r.u32("range.access")?);
        let token = AccessToken(r.u64("range.token")?);
        let n = r.count("range.rkeys", false, MAX_RKEYS_PER_RANGE, NIC_RKEY_LEN)?;
        let mut rkeys = Vec::with_capacity(n);
        for _ in 0..n {
            rkeys.push(NicRkey {
                nic_id: NicId(r.u16("range.rkey.nic_id")?),
                rkey: r.u32("range.rkey.rkey")?,
                lid: r.u16("range.rkey.lid")?,
                gid: Gid(r.array("range.rkey.gid")?),
            });
        }
        let local = if r.tag("range.local")? {
            let mechanism = LocalMechanism(r.u8("range.local.mechanism")?);
            let file_offset = r.u64("range.local.file_offset")?;
            let raw = r.bytes8("range.local.host_id")?;
            let text = Reader::utf8(raw).map_err(|p| r.err("range.local.host_id", p))?;
            let host_id =
                HostId::new(text).map_err(|_| r.err("range.local.host_id", Problem::Empty))?;
            Some(LocalHint {
                host_id,
                mechanism,
                file_offset,
            })
        } else {
            None
        };
        Ok(Self {
            range_id,
            address,
            length,
            access,
            token,
            rkeys,
            local,
        })
    }
}

impl SegmentRetire {
    fn validate(&self) -> Result<(), (&'static str, Problem)> {
        let mut ids = HashSet::with_capacity(self.range_ids.len());
        for id in &self.range_ids {
            if !ids.insert(*id) {
                return Err(("range_ids", Problem::Duplicate { value: id.0 }));
            }
        }
        Ok(())
    }

    pub(crate) fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        w.u64(self.epoch.value());
        w.count(
            "range_ids",
            true,
            self.range_ids.len(),
            MAX_RANGES_PER_FRAME,
        )?;
        if let Err((field, problem)) = self.validate() {
            return Err(w.err(field, problem));
        }
        for id in &self.range_ids {
            w.u64(id.0);
        }
        Ok(())
    }

    pub(crate) fn decode_body(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let epoch = decode_epoch(r, "epoch")?;
        let n = r.count("range_ids", true, MAX_RANGES_PER_FRAME, 8)?;
        let mut range_ids = Vec::with_capacity(n);
        for _ in 0..n {
            range_ids.push(RangeId(r.u64("range_ids")?));
        }
        let f = Self { epoch, range_ids };
        f.validate().map_err(|(field, p)| r.err(field, p))?;
        Ok(f)
    }
}
