//! A request as the core takes it in ([`CoreRequest`]) and its state
//! inside the core.

use std::any::Any;
use std::sync::Arc;

use crate::outcome::FailureInfo;
use crate::{Op, PeerId, RailId, RangeId, RegistrationId};

use super::RailList;

/// One request as the core sees it: validated, with its rails chosen.
pub struct CoreRequest {
    /// Caller's label, echoed in the outcome.
    pub label: u64,
    /// READ or WRITE.
    pub op: Op,
    /// Local registration.
    pub registration: RegistrationId,
    /// Offset in it.
    pub local_offset: u64,
    /// Peer.
    pub peer: PeerId,
    /// Peer's range.
    pub range: RangeId,
    /// Offset in it.
    pub remote_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Rails to stripe over, in order (slice `i` goes to `rails[i % n]`).
    pub rails: RailList,
    /// Kept alive until the request is drained (the registration, so its
    /// memory and MRs outlive every slice).
    pub keepalive: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for CoreRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreRequest")
            .field("label", &self.label)
            .field("op", &self.op)
            .field("len", &self.len)
            .field("rails", &self.rails)
            .finish_non_exhaustive()
    }
}

/// Invariants: `prefix` leading bits of `done` are set;
/// `unanswered <= outstanding <= posted`; a request is freed (`live` false,
/// `generation` bumped) only when `finished` and `outstanding == 0`.
pub(super) struct Req {
    pub(super) generation: u32,
    pub(super) live: bool,
    pub(super) label: u64,
    pub(super) op: Op,
    pub(super) registration: RegistrationId,
    pub(super) local_offset: u64,
    pub(super) peer: PeerId,
    pub(super) range: RangeId,
    pub(super) remote_offset: u64,
    pub(super) len: u64,
    pub(super) slices: u32,
    /// Bytes per slice (the last may be shorter).
    pub(super) slice: u64,
    pub(super) rails: RailList,
    /// Next slice index to post, per rail position.
    pub(super) next: Vec<u32>,
    pub(super) done: Vec<u64>,
    pub(super) prefix: u32,
    pub(super) posted: u32,
    pub(super) unanswered: u32,
    pub(super) outstanding: u32,
    /// End (request-relative) of the furthest slice ever posted.
    pub(super) hull_end: u64,
    pub(super) failure: Option<Box<FailureInfo>>,
    /// No more slices get posted.
    pub(super) abandoned: bool,
    /// The outcome was made.
    pub(super) finished: bool,
    /// Held until the request is drained (buffer ownership).
    pub(super) keepalive: Option<Arc<dyn Any + Send + Sync>>,
}

impl Req {
    pub(super) fn vacant() -> Self {
        Self {
            generation: 0,
            live: false,
            label: 0,
            op: Op::Read,
            registration: RegistrationId(0),
            local_offset: 0,
            peer: PeerId(0),
            range: RangeId(0),
            remote_offset: 0,
            len: 0,
            slices: 0,
            slice: 1,
            rails: RailList::new(),
            next: Vec::new(),
            done: Vec::new(),
            prefix: 0,
            posted: 0,
            unanswered: 0,
            outstanding: 0,
            hull_end: 0,
            failure: None,
            abandoned: false,
            finished: false,
            keepalive: None,
        }
    }

    pub(super) fn fill(&mut self, r: CoreRequest, slices: u32, slice: u64) {
        self.generation = self.generation.wrapping_add(1);
        self.live = true;
        self.label = r.label;
        self.op = r.op;
        self.registration = r.registration;
        self.local_offset = r.local_offset;
        self.peer = r.peer;
        self.range = r.range;
        self.remote_offset = r.remote_offset;
        self.len = r.len;
        self.slices = slices;
        self.slice = slice;
        self.rails = r.rails;
        self.next.clear();
        self.next.extend(0..self.rails.len() as u32);
        self.done.clear();
        self.done.resize((slices as usize).div_ceil(64), 0);
        self.prefix = 0;
        self.posted = 0;
        self.unanswered = 0;
        self.outstanding = 0;
        self.hull_end = 0;
        self.failure = None;
        self.abandoned = false;
        self.finished = false;
        self.keepalive = r.keepalive;
    }

    /// A post refused slice `index` (called for the refused slices of a
    /// rail newest first): if it is the last slice handed out on that
    /// rail, rolls the rail's next slice back to it, so `hull_end` covers
    /// only slices the transport accepted. A slice handed out after it
    /// (the driver posts without holding the core, so it may hand out more
    /// before it learns of the failure) may still be posted: then nothing
    /// rolls back and the hull keeps covering it. The request is
    /// abandoned, so nothing is posted from there again.
    pub(super) fn unpost(&mut self, rail: RailId, index: u32, slice_size: u64) {
        let k = self.rails.len() as u32;
        if let Some(pos) = self.rails.iter().position(|r| *r == rail)
            && self.next[pos] == index + k
        {
            self.next[pos] = index;
        }
        // Each rail position posts its slices in order (pos, pos + k, ...),
        // so the furthest posted slice ends with one of the last ones.
        self.hull_end = self
            .next
            .iter()
            .filter(|&&n| n >= k)
            .map(|&n| ((u64::from(n - k) + 1) * slice_size).min(self.len))
            .max()
            .unwrap_or(0);
    }

    /// Marks slice `index` done and advances the completed prefix.
    pub(super) fn mark_done(&mut self, index: u32) {
        let (w, b) = ((index / 64) as usize, index % 64);
        if let Some(word) = self.done.get_mut(w) {
            *word |= 1 << b;
        }
        while self.prefix < self.slices {
            let (w, b) = ((self.prefix / 64) as usize, self.prefix % 64);
            if self.done[w] & (1 << b) == 0 {
                break;
            }
            self.prefix += 1;
        }
    }

    /// Frees the slot: drops the keepalive (the buffer-ownership hold).
    pub(super) fn clear(&mut self) {
        self.live = false;
        self.generation = self.generation.wrapping_add(1);
        self.keepalive = None;
        self.failure = None;
        self.rails = RailList::new();
    }
}
