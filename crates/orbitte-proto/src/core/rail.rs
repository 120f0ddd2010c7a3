//! One rail's state inside the core.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::RailSpec;

/// Invariant: `fifo.len() <= capacity()`; `fifo` holds the tokens posted on
/// the rail and not yet reported, oldest first.
#[derive(Debug)]
pub(super) struct Rail {
    pub(super) spec: RailSpec,
    pub(super) fifo: VecDeque<u64>,
    /// Requests with slices still to post here: (slot, generation, rail
    /// position in the request).
    pub(super) waiting: VecDeque<(u32, u32, u32)>,
    /// Whether the rail is in the core's ready list.
    pub(super) queued: bool,
    /// Unsignaled items posted since the last signaled one.
    pub(super) since_signal: u32,
    /// An error was reported: later implied items count as flushed.
    pub(super) errored: bool,
    pub(super) down: Option<Arc<str>>,
    pub(super) closed: bool,
    pub(super) flush_requested: bool,
}

impl Rail {
    pub(super) fn new(mut spec: RailSpec) -> Self {
        spec.max_in_flight = spec.max_in_flight.max(1);
        spec.signal_interval = spec.signal_interval.clamp(1, spec.max_in_flight);
        Self {
            fifo: VecDeque::with_capacity(spec.max_in_flight as usize),
            spec,
            waiting: VecDeque::new(),
            queued: false,
            since_signal: 0,
            errored: false,
            down: None,
            closed: false,
            flush_requested: false,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.spec.max_in_flight as usize
    }
}
