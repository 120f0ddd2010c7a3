//! One tcp rail: one connection to a peer, a writer thread that pipelines
//! requests (up to the in-flight bound) and a reader thread that matches
//! answers, moves READ payloads into local memory and reports completions.
//!
//! Answers are matched to requests by request id (docs/protocol.md: a
//! peer may answer in any order; ours serves a connection in order, so the
//! match is usually at the front of the in-flight list). An answer that
//! names no request in flight, or the wrong operation, is a protocol error
//! that takes the rail down.
//!
//! When the rail goes down (socket error, peer error frame, no answer within
//! `io_timeout` while requests are outstanding, or a flush), the reader
//! shuts the socket, waits for the writer to stop touching local memory,
//! then reports a `RailDown` and every outstanding item as failed with
//! `released: true`: nothing reads or writes their bytes any more.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use orbitte_memory::HostMemory;
use orbitte_wire::{AccessToken, Frame, RangeId, ReadRequest, RequestId, Status, WriteRequest};

use super::payload::PayloadIo;
use super::serve::send_more as send_header_more;
use crate::session::io::{FrameReader, write_frame};
use crate::session::{SessionConfig, SessionError};
use crate::transport::{
    EventSink, Op, RailId, SliceFailure, SliceStatus, TransportEvent, WorkItem,
};

/// A publication or retire the peer sent on an established rail.
#[derive(Debug, Clone)]
pub(crate) enum SegmentUpdate {
    Published(orbitte_wire::SegmentPublication),
    Retired(orbitte_wire::SegmentRetire),
}

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) item: WorkItem,
    pub(crate) local: Arc<HostMemory>,
    pub(crate) token: AccessToken,
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Job>,
    in_flight: VecDeque<Job>,
    /// Encoded `notification` frames to send (no answer comes for them).
    notes: VecDeque<Arc<[u8]>>,
    /// Why the rail is down; `None` while up.
    down: Option<Arc<str>>,
    writer_done: bool,
    last_progress: Instant,
}

#[derive(Debug)]
pub(crate) struct Rail {
    pub(crate) id: RailId,
    pub(crate) session: orbitte_wire::SessionId,
    stream: TcpStream,
    state: Mutex<State>,
    cv: Condvar,
    max_in_flight: usize,
}

impl Rail {
    /// Starts the threads of a rail over an established session.
    pub(crate) fn start(
        id: RailId,
        session: orbitte_wire::SessionId,
        stream: TcpStream,
        cfg: &SessionConfig,
        sink: Arc<dyn EventSink>,
        on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
    ) -> std::io::Result<Arc<Self>> {
        let rail = Arc::new(Self {
            id,
            session,
            stream: stream.try_clone()?,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: VecDeque::new(),
                notes: VecDeque::new(),
                down: None,
                writer_done: false,
                last_progress: Instant::now(),
            }),
            cv: Condvar::new(),
            max_in_flight: cfg.max_in_flight_per_connection.max(1) as usize,
        });
        let w_stream = stream.try_clone()?;
        let (r1, r2) = (rail.clone(), rail.clone());
        let zero_copy = cfg.zero_copy;
        let (frame_timeout, io_timeout) = (cfg.frame_timeout, cfg.io_timeout);
        w_stream.set_write_timeout(Some(io_timeout))?;
        std::thread::Builder::new()
            .name(format!("orbitte-tcp-w{}", id.0))
            .spawn(move || writer(r1, w_stream, zero_copy))?;
        std::thread::Builder::new()
            .name(format!("orbitte-tcp-r{}", id.0))
            .spawn(move || {
                reader(
                    r2,
                    stream,
                    zero_copy,
                    frame_timeout,
                    io_timeout,
                    sink,
                    on_segment,
                )
            })?;
        Ok(rail)
    }

    /// Queues jobs; `Err` when the rail is down (nothing queued).
    pub(crate) fn push(&self, jobs: impl Iterator<Item = Job>) -> Result<(), Arc<str>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        if st.in_flight.is_empty() && st.queue.is_empty() {
            st.last_progress = Instant::now();
        }
        st.queue.extend(jobs);
        self.cv.notify_all();
        Ok(())
    }

    /// Queues an encoded `notification` frame; `Err` when the rail is down.
    pub(crate) fn push_note(&self, frame: Arc<[u8]>) -> Result<(), Arc<str>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.down {
            return Err(why.clone());
        }
        st.notes.push_back(frame);
        self.cv.notify_all();
        Ok(())
    }

    /// Takes the rail down (idempotent): the reader then reports everything.
    /// A rail that goes down unasked is a warning; one closed or flushed on
    /// request (`deliberate`) is logged at debug.
    pub(crate) fn fail(&self, why: &str, deliberate: bool) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.down.is_none() {
            if deliberate {
                tracing::debug!(rail = self.id.0, reason = why, "tcp rail closed");
            } else {
                tracing::warn!(rail = self.id.0, reason = why, "tcp rail down");
            }
            st.down = Some(why.into());
        }
        drop(st);
        let _ = self.stream.shutdown(Shutdown::Both);
        self.cv.notify_all();
    }

    pub(crate) fn is_down(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .down
            .is_some()
    }
}

fn writer(rail: Arc<Rail>, mut stream: TcpStream, zero_copy: bool) {
    let mut io = PayloadIo::new(zero_copy);
    let mut scratch = Vec::with_capacity(64);
    loop {
        let job = {
            let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if st.down.is_some() {
                    st.writer_done = true;
                    rail.cv.notify_all();
                    return;
                }
                if !st.notes.is_empty()
                    || (!st.queue.is_empty() && st.in_flight.len() < rail.max_in_flight)
                {
                    break;
                }
                st = rail.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if let Some(note) = st.notes.pop_front() {
                drop(st);
                if let Err(e) = std::io::Write::write_all(&mut stream, &note) {
                    rail.fail(&format!("sending a notification failed: {e}"), false);
                    let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
                    st.writer_done = true;
                    rail.cv.notify_all();
                    return;
                }
                continue;
            }
            let Some(job) = st.queue.pop_front() else {
                continue;
            };
            st.in_flight.push_back(job.clone());
            job
        };
        let it = &job.item;
        let r = match it.op {
            Op::Read => {
                let f = Frame::ReadRequest(ReadRequest {
                    request_id: RequestId(it.token.0),
                    range_id: RangeId(it.range.0),
                    token: job.token,
                    offset: it.remote_offset,
                    length: it.len,
                });
                write_frame(&mut stream, &f, &mut scratch)
            }
            Op::Write => {
                let f = Frame::WriteRequest(WriteRequest {
                    request_id: RequestId(it.token.0),
                    range_id: RangeId(it.range.0),
                    token: job.token,
                    offset: it.remote_offset,
                    length: it.len,
                });
                scratch.clear();
                match f.encode(&mut scratch) {
                    Err(e) => Err(SessionError::Protocol(e.to_string())),
                    Ok(()) => send_header_more(&stream, &scratch)
                        .and_then(|()| {
                            io.send(&stream, &job.local, it.local_offset, it.len as usize, None)
                        })
                        .map_err(SessionError::Io),
                }
            }
        };
        drop(job);
        if let Err(e) = r {
            rail.fail(&format!("sending a request failed: {e}"), false);
            let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
            st.writer_done = true;
            rail.cv.notify_all();
            return;
        }
    }
}

fn completion(status: Status) -> SliceStatus {
    if status.is_ok() {
        SliceStatus::Success
    } else {
        SliceStatus::Failed(SliceFailure::Completion {
            status: format!("peer answered {status}").into(),
            code: u32::from(status.0),
        })
    }
}

fn reader(
    rail: Arc<Rail>,
    mut stream: TcpStream,
    zero_copy: bool,
    frame_timeout: Duration,
    io_timeout: Duration,
    sink: Arc<dyn EventSink>,
    on_segment: Arc<dyn Fn(SegmentUpdate) + Send + Sync>,
) {
    let mut io = PayloadIo::new(zero_copy);
    let mut frames = FrameReader::new();
    let mut events = Vec::with_capacity(8);
    let poll = io_timeout.min(Duration::from_millis(250));
    let why: String = loop {
        let frame = match frames.read(&mut stream, Some(poll), frame_timeout) {
            Ok(f) => f,
            Err(SessionError::Idle) => {
                let st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(d) = &st.down {
                    break d.to_string();
                }
                if !st.in_flight.is_empty() && st.last_progress.elapsed() >= io_timeout {
                    break format!("no answer from the peer within {io_timeout:?}");
                }
                continue;
            }
            Err(e) => break format!("connection lost: {e}"),
        };
        let (request_id, status, length, op) = match &frame {
            Frame::ReadResponse(r) => (r.request_id, r.status, r.length, Op::Read),
            Frame::WriteResponse(w) => (w.request_id, w.status, w.length, Op::Write),
            Frame::SegmentPublication(p) => {
                on_segment(SegmentUpdate::Published(p.clone()));
                continue;
            }
            Frame::SegmentRetire(r) => {
                on_segment(SegmentUpdate::Retired(r.clone()));
                continue;
            }
            Frame::Error(e) => break format!("peer sent error {}: {}", e.code, e.message),
            Frame::Goodbye(g) => break format!("peer said goodbye ({}: {})", g.reason, g.message),
            other => break format!("unexpected {} from the peer", other.frame_type()),
        };
        let job = {
            let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
            let Some(at) = st
                .in_flight
                .iter()
                .position(|j| j.item.token.0 == request_id.0 && j.item.op == op)
            else {
                break format!(
                    "answer for request {} ({op:?}) matches no request in flight",
                    request_id.0
                );
            };
            st.last_progress = Instant::now();
            st.in_flight.remove(at)
        };
        let Some(job) = job else {
            break "in-flight list empty".into();
        };
        rail.cv.notify_all();
        let mut st_status = completion(status);
        if op == Op::Read && status.is_ok() {
            if length != job.item.len {
                let msg = format!(
                    "read answer of {length} bytes for a {}-byte request",
                    job.item.len
                );
                events.push(TransportEvent::Completed {
                    rail: rail.id,
                    token: job.item.token,
                    status: SliceStatus::Failed(SliceFailure::Completion {
                        status: msg.clone().into(),
                        code: 0,
                    }),
                    released: true,
                });
                sink.deliver(&mut events);
                events.clear();
                break msg;
            }
            let _ = stream.set_read_timeout(Some(io_timeout));
            if let Err(e) = io.recv(
                &stream,
                &job.local,
                job.item.local_offset,
                length as usize,
                None,
            ) {
                let msg = format!("receiving read data failed: {e}");
                // The reader is the only thread writing local memory: it
                // stopped, so the bytes are released (possibly partial).
                events.push(TransportEvent::Completed {
                    rail: rail.id,
                    token: job.item.token,
                    status: SliceStatus::Failed(SliceFailure::RailDown(msg.clone().into())),
                    released: true,
                });
                sink.deliver(&mut events);
                events.clear();
                break msg;
            }
        } else if op == Op::Write && status.is_ok() && length != job.item.len {
            st_status = SliceStatus::Failed(SliceFailure::Completion {
                status: format!(
                    "write answer of {length} bytes for a {}-byte request",
                    job.item.len
                )
                .into(),
                code: 0,
            });
        }
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token: job.item.token,
            status: st_status,
            released: true,
        });
        sink.deliver(&mut events);
        events.clear();
    };
    rail.fail(&why, false);
    // Wait until the writer let go of local memory (the socket is shut, so
    // a blocked send returns at once).
    let (in_flight, queued, reason) = {
        let mut st = rail.state.lock().unwrap_or_else(|p| p.into_inner());
        while !st.writer_done {
            let (g, _) = rail
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner());
            st = g;
        }
        let reason = st.down.clone().unwrap_or_else(|| why.clone().into());
        (
            std::mem::take(&mut st.in_flight),
            std::mem::take(&mut st.queue),
            reason,
        )
    };
    events.push(TransportEvent::RailDown {
        rail: rail.id,
        reason: reason.clone(),
    });
    for j in in_flight {
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token: j.item.token,
            status: SliceStatus::Failed(SliceFailure::RailDown(reason.clone())),
            released: true,
        });
    }
    for j in queued {
        events.push(TransportEvent::Completed {
            rail: rail.id,
            token: j.item.token,
            status: SliceStatus::Failed(SliceFailure::Flushed),
            released: true,
        });
    }
    sink.deliver(&mut events);
}
