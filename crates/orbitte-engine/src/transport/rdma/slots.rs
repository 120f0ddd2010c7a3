//! A rdma rail's notification buffer: one small buffer per rail,
//! registered local-only on its NIC, split into [`RECV_SLOTS`] receive
//! slots (each posted as a receive work request) and [`SEND_SLOTS`] send
//! slots, each holding one encoded `notification` frame of at most
//! [`RDMA_MAX_NOTIFICATION_LEN`] payload bytes (or a
//! `notification-answer`), and the backlog of frames waiting for a send
//! slot. A larger notification is refused on this path.
//!
//! Work request ids of these SENDs and receives carry [`WR_TAG`] in their
//! upper bits: their slot part is never a slot of the core's slice slab,
//! so the core can never mistake them for a slice.

use std::collections::VecDeque;
use std::sync::Arc;

use orbitte_memory::{DmaBuffer, HostMemory};
use orbitte_verbs::qp_state::Rts;
use orbitte_verbs::{self as verbs, QueuePair, RecvWr, SendOp, SendWr, Sge};
use orbitte_wire as wire;

use crate::notify::RDMA_MAX_NOTIFICATION_LEN;

/// Receive slots posted per rail (the queue pair's receive queue depth).
pub(crate) const RECV_SLOTS: usize = 16;
/// SENDs in flight per rail (added to the send queue depth).
pub(crate) const SEND_SLOTS: usize = 4;
/// Most notifications waiting for a send slot on one rail.
pub(super) const BACKLOG: usize = 1024;
/// Bytes per slot: one encoded frame of a [`RDMA_MAX_NOTIFICATION_LEN`]
/// payload, rounded up to a cache line.
pub(super) const SLOT: usize =
    (wire::NOTIFICATION_OVERHEAD + RDMA_MAX_NOTIFICATION_LEN).div_ceil(64) * 64;

pub(super) const WR_TAG: u64 = 0xffff_ffff_ffff_0000;
pub(super) const RECV: u64 = 0x100;
pub(super) const SEND: u64 = 0x200;

/// Whether a work completion belongs to a notification SEND or receive.
pub(crate) fn is_notification_wr(wr_id: u64) -> bool {
    wr_id & WR_TAG == WR_TAG
}

/// A rail's notification buffer and send state.
#[derive(Debug)]
pub(crate) struct RailNotify {
    pub(super) memory: Arc<HostMemory>,
    /// Invariant: `Some` until the rail's queue pair is destroyed.
    mr: Option<verbs::MemoryRegion>,
    pub(super) send_busy: [bool; SEND_SLOTS],
    pub(super) backlog: VecDeque<Arc<[u8]>>,
}

impl RailNotify {
    /// Registers the buffer on `pd` and posts every receive slot on `qp`.
    pub(crate) fn prepare(
        pd: &verbs::ProtectionDomain,
        qp: &mut QueuePair<Rts>,
    ) -> Result<Self, String> {
        let len = SLOT * (RECV_SLOTS + SEND_SLOTS);
        let memory = HostMemory::alloc(len).map_err(|e| e.to_string())?;
        let buf: Arc<dyn DmaBuffer> = memory.clone();
        let mr = pd
            .register(buf, 0..len, verbs::Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let mut n = Self {
            memory,
            mr: Some(mr),
            send_busy: [false; SEND_SLOTS],
            backlog: VecDeque::new(),
        };
        for slot in 0..RECV_SLOTS {
            if let Err(e) = n.post_recv(qp, slot) {
                // The queue pair keeps what was posted; release the rest
                // when the rail is destroyed.
                return Err(format!("posting notification receive {slot} failed: {e}"));
            }
        }
        Ok(n)
    }

    fn sge(&self, slot: usize, len: usize) -> Option<Sge> {
        let mr = self.mr.as_ref()?;
        Some(Sge::new(
            mr.addr() + (slot * SLOT) as u64,
            u32::try_from(len).ok()?,
            mr.lkey(),
        ))
    }

    pub(super) fn post_recv(&mut self, qp: &mut QueuePair<Rts>, slot: usize) -> Result<(), String> {
        let sge = self.sge(slot, SLOT).ok_or("notification buffer released")?;
        qp.post_recv(&[RecvWr {
            wr_id: WR_TAG | RECV | slot as u64,
            sges: &[sge],
        }])
        .map_err(|e| e.to_string())
    }

    /// Posts `frame` as a SEND in a free slot; `Ok(false)` when none is.
    pub(super) fn post_send(
        &mut self,
        qp: &mut QueuePair<Rts>,
        frame: &[u8],
    ) -> Result<bool, String> {
        let Some(k) = self.send_busy.iter().position(|b| !b) else {
            return Ok(false);
        };
        let slot = RECV_SLOTS + k;
        self.memory
            .write_at(slot * SLOT, frame)
            .map_err(|e| e.to_string())?;
        let sge = self
            .sge(slot, frame.len())
            .ok_or("notification buffer released")?;
        qp.post_send(&[SendWr {
            wr_id: WR_TAG | SEND | k as u64,
            op: SendOp::Send { imm: None },
            sges: &[sge],
            signaled: true,
        }])
        .map_err(|e| e.to_string())?;
        self.send_busy[k] = true;
        Ok(true)
    }

    /// Deregisters the buffer (after the queue pair was destroyed). A
    /// failure keeps it retained by verbs and is returned as evidence.
    pub(crate) fn close(&mut self) -> Result<(), Box<verbs::Unquiesced>> {
        match self.mr.take() {
            Some(mr) => mr.close().map_err(Box::new),
            None => Ok(()),
        }
    }
}
