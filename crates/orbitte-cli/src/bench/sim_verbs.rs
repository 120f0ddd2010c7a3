//! The baseline of `--path rdma --sim`: raw verbs on a simulated fabric
//! with the bench's settings (zero latency, unlimited bandwidth, a fabric
//! thread delivering completions), posting the same slices with no engine
//! in front: per initiator thread one connected queue pair, each batch
//! posted at once (every 16th request and the last signaled) and polled
//! to its end before the next.

use std::sync::Arc;
use std::time::Duration;

use orbitte::{HostMemory, Op};
use orbitte_verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric, SimTiming};
use orbitte_verbs::{
    Access, Completion, CompletionQueue, DmaBuffer, InitAttrs, Mtu, QpCaps, QueuePair, RemoteAddr,
    Route, RtrAttrs, RtsAttrs, SendOp, SendWr, Sge,
};

use super::timed::{Sample, Shape, timed, until_stopped};
use crate::stats::gbps;

/// Signal every this many requests (and the last of a batch).
pub(crate) const SIGNAL_EVERY: usize = 16;

fn err(what: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("sim verbs baseline: {what}: {e}"))
}

/// One thread's queue pair, its completion queue and both windows.
struct Lane {
    qp: QueuePair,
    cq: CompletionQueue,
    local: orbitte_verbs::MemoryRegion,
    remote: orbitte_verbs::MemoryRegion,
    /// Keeps the loopback peer of `qp` alive.
    _peer: QueuePair,
}

fn memory(len: usize) -> std::io::Result<Arc<dyn DmaBuffer>> {
    let m = HostMemory::alloc(len).map_err(|e| err("alloc", e))?;
    m.fill(0, len, 0x5a).map_err(|e| err("fill", e))?;
    Ok(m)
}

fn lanes(fabric: &SimFabric, shape: Shape) -> std::io::Result<Vec<Lane>> {
    let window = shape.block * shape.batch;
    let ctx = fabric
        .provider()
        .open("sim_raw")
        .map_err(|e| err("open", e))?;
    let pd = ctx.alloc_pd().map_err(|e| err("pd", e))?;
    let depth = u32::try_from(shape.batch.max(SIGNAL_EVERY)).map_err(|e| err("depth", e))?;
    let gid = ctx.query_gid(1, 1).map_err(|e| err("gid", e))?.gid;
    let mut out = Vec::with_capacity(shape.threads);
    for t in 0..shape.threads {
        let cq = ctx.create_cq(4 * depth).map_err(|e| err("cq", e))?;
        let local = pd
            .register(memory(window)?, 0..window, Access::LOCAL_WRITE)
            .map_err(|e| err("local mr", e))?;
        let remote = pd
            .register(memory(window)?, 0..window, Access::remote_read_write())
            .map_err(|e| err("remote mr", e))?;
        let caps = QpCaps {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
        };
        let init = |cq: &CompletionQueue| {
            pd.create_qp(cq, cq, caps)
                .map_err(|e| err("qp", e))?
                .init(InitAttrs::new(1))
                .map_err(|e| err("init", e))
        };
        let (q1, q2) = (init(&cq)?, init(&cq)?);
        let psn = 2 * t as u32 + 1;
        let (e1, e2) = (
            q1.endpoint(Route::Gid(gid), psn, Mtu::Mtu1024),
            q2.endpoint(Route::Gid(gid), psn + 1, Mtu::Mtu1024),
        );
        let qp = q1
            .rtr(RtrAttrs::new(e2, 1))
            .map_err(|e| err("rtr", e))?
            .rts(RtsAttrs::new(psn))
            .map_err(|e| err("rts", e))?;
        let peer = q2
            .rtr(RtrAttrs::new(e1, 1))
            .map_err(|e| err("rtr", e))?
            .rts(RtsAttrs::new(psn + 1))
            .map_err(|e| err("rts", e))?;
        out.push(Lane {
            qp,
            cq,
            local,
            remote,
            _peer: peer,
        });
    }
    Ok(out)
}

/// Posts one batch on `lane` and polls until its last request completed.
fn batch(lane: &mut Lane, op: Op, shape: Shape, sges: &[Sge]) -> std::io::Result<u64> {
    let last = sges.len() - 1;
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| SendWr {
            wr_id: i as u64,
            op: {
                // The same offset in the remote window as in the local one.
                let remote = RemoteAddr {
                    addr: lane.remote.addr() + (i * shape.block) as u64,
                    rkey: lane.remote.rkey(),
                };
                match op {
                    Op::Write => SendOp::Write { remote, imm: None },
                    Op::Read => SendOp::Read { remote },
                }
            },
            sges: std::slice::from_ref(s),
            signaled: i == last || i % SIGNAL_EVERY == SIGNAL_EVERY - 1,
        })
        .collect();
    lane.qp.post_send(&wrs).map_err(|e| err("post", e))?;
    let mut comps = [Completion::default(); 64];
    loop {
        let n = lane.cq.poll(&mut comps).map_err(|e| err("poll", e))?;
        for c in &comps[..n] {
            if !c.is_success() {
                return Err(err("completion", format!("{:?}", c.status)));
            }
            if c.wr_id == last as u64 {
                return Ok((shape.block * sges.len()) as u64);
            }
        }
        if n == 0 {
            lane.cq
                .wait(Duration::from_millis(100))
                .map_err(|e| err("wait", e))?;
        }
    }
}

pub(crate) fn measure(op: Op, shape: Shape) -> std::io::Result<Sample> {
    let fabric = SimFabric::new(
        SimDescription::new(vec![SimDeviceDesc::roce("sim_raw", [10, 0, 9, 1])])
            .with_delivery(Delivery::Background)
            .with_timing(SimTiming {
                base_latency: Duration::ZERO,
                bytes_per_sec: 0,
                jitter: Duration::ZERO,
            }),
        1,
    );
    let lanes: Vec<_> = lanes(&fabric, shape)?
        .into_iter()
        .map(std::sync::Mutex::new)
        .collect();
    let (bytes, elapsed) = timed(shape.threads, shape.duration, |t, stop, ready| {
        let mut lane = lanes[t]
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let block = u32::try_from(shape.block).map_err(|e| err("block", e))?;
        let sges: Vec<Sge> = (0..shape.batch)
            .map(|j| {
                Sge::new(
                    lane.local.addr() + (j * shape.block) as u64,
                    block,
                    lane.local.lkey(),
                )
            })
            .collect();
        until_stopped(stop, ready, || batch(&mut lane, op, shape, &sges))
    })?;
    Ok(Sample {
        name: format!(
            "raw sim verbs ({} queue pair(s), batch {} of {} KiB, zero-latency fabric thread, no engine)",
            shape.threads,
            shape.batch,
            shape.block >> 10
        ),
        gbps: gbps(bytes, elapsed),
        seconds: elapsed.as_secs_f64(),
    })
}
