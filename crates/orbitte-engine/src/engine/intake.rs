//! Event intake: attached transports, their rails, and the sink they
//! deliver events through.

use std::sync::Arc;

use super::{Owner, Shared, TransferEngine};
use crate::transport::{EventSink, RailId, RailSpec, Transport, TransportEvent, TransportId};

struct Sink(std::sync::Weak<Shared>);

impl EventSink for Sink {
    fn deliver(&self, events: &mut Vec<TransportEvent>) {
        if let Some(shared) = self.0.upgrade() {
            shared.deliver(events);
        } else {
            events.clear();
        }
    }
}

impl TransferEngine {
    /// Attaches another path's transport (tcp, local). Its rails are added
    /// with [`add_rail`](Self::add_rail); it reports through
    /// [`event_sink`](Self::event_sink).
    pub(crate) fn attach_transport(&self, transport: Box<dyn Transport>) -> TransportId {
        let mut st = self.lock();
        st.others.push(Arc::from(transport));
        TransportId(st.others.len() - 1)
    }

    /// Adds a rail of an attached transport to an open peer.
    pub(crate) fn add_rail(&self, transport: TransportId, spec: RailSpec) -> RailId {
        self.lock().add_rail(Owner::Other(transport.0), spec)
    }

    /// Where attached transports deliver their events.
    pub(crate) fn event_sink(&self) -> Arc<dyn EventSink> {
        Arc::new(Sink(Arc::downgrade(&self.shared)))
    }
}
