//! Quick Start: two engines, register, connect, write, read back, print the
//! outcome.
//!
//! ```sh
//! cargo run -p orbitte --example quickstart
//! ```
//!
//! The two engines ("prefill" and "decode") live in this process and talk
//! over the simulated RDMA fabric (`orbitte::verbs::sim`), so the example
//! needs no NIC. On an RDMA host, leave out `.provider(..)`: the engine then
//! uses the native libibverbs provider and the same code runs on real NICs.
//! `docs/quickstart.md` walks through it step by step.
#![forbid(unsafe_code)]

use std::error::Error;
use std::time::Duration;

use orbitte::verbs::sim::{Delivery, SimDescription, SimDeviceDesc, SimFabric};
use orbitte::{
    Access, EngineBuilder, HostMemory, InProcessLink, Outcome, RangeId, TransferEngine,
    TransferRequest,
};

const LEN: usize = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    // 1. A fabric with one RoCE NIC per host (sim: no hardware needed).
    let fabric = SimFabric::new(
        SimDescription::new(vec![
            SimDeviceDesc::roce("prefill_nic0", [10, 0, 0, 1]),
            SimDeviceDesc::roce("decode_nic0", [10, 0, 0, 2]),
        ])
        // Completions arrive in the background, in real time.
        .with_delivery(Delivery::Background),
        7,
    );

    // 2. Two engines: each is a source owner with its own id and epoch.
    let prefill = EngineBuilder::new("prefill-0")
        .provider(fabric.provider_for(&["prefill_nic0"]))
        .build()?;
    let decode = EngineBuilder::new("decode-0")
        .provider(fabric.provider_for(&["decode_nic0"]))
        .build()?;

    // 3. Register memory (Host Direct). The source is local-only; the
    //    destination is published to peers for one-sided READ and WRITE.
    let src = HostMemory::alloc(LEN)?;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    src.write_at(0, &pattern)?;
    let dst = HostMemory::alloc(LEN)?;
    let local = prefill.register_host(src.clone(), Access::LocalOnly)?;
    let published = decode.register_host(dst.clone(), Access::REMOTE_READ_WRITE)?;
    println!(
        "registered: {} bytes local-only ({} MR copies), {} bytes remote ({} MR copies)",
        local.len, local.copies, published.len, published.copies
    );

    // 4. Connect: handshake with epochs, descriptors exchanged (p2p), one RC
    //    queue pair per rail.
    let decode_peer = connect(&prefill, &decode)?;
    println!(
        "connected to {} (epoch {}), {} rail(s), {} published range(s)",
        decode_peer.source_id,
        decode_peer.epoch,
        decode_peer.rails.len(),
        decode_peer.ranges.len()
    );
    let range = RangeId(published.id.0);

    // 5. WRITE the whole buffer into decode's range.
    let ids = prefill.submit(&[TransferRequest::write(
        local.id,
        0,
        decode_peer.id,
        range,
        0,
        LEN as u64,
    )
    .label(1)])?;
    let outcome = prefill.wait(ids[0], Duration::from_secs(30))?;
    show("write", &outcome);
    if !outcome.is_complete() {
        return Err(format!("write did not complete: {:?}", outcome.failure).into());
    }

    // 6. READ it back into the (cleared) source buffer and compare.
    src.fill(0, LEN, 0)?;
    let ids = prefill.submit(&[TransferRequest::read(
        local.id,
        0,
        decode_peer.id,
        range,
        0,
        LEN as u64,
    )
    .label(2)])?;
    let outcome = prefill.wait(ids[0], Duration::from_secs(30))?;
    show("read", &outcome);
    // The buffer is ours again only once the request is drained.
    prefill.wait_drain(ids[0], Duration::from_secs(30))?;
    let same = src.to_vec(0, LEN)? == pattern;
    println!(
        "read back {} bytes: {}",
        outcome.completed_prefix,
        if same { "identical" } else { "DIFFERENT" }
    );

    // 7. Shut down: fences, waits for drain, destroys native objects (an
    //    error here would be Unquiesced, with the evidence).
    prefill.shutdown(Duration::from_secs(5))?;
    decode.shutdown(Duration::from_secs(5))?;
    if same {
        Ok(())
    } else {
        Err("bytes read back differ from the bytes written".into())
    }
}

/// Prints every part of an outcome: status, completed prefix, failure
/// information, remote effect (of a WRITE) and drain status.
fn show(what: &str, o: &Outcome) {
    let failure = o
        .failure
        .as_ref()
        .map_or_else(|| "none".to_owned(), ToString::to_string);
    println!(
        "{what}: {:?}, completed prefix {} of {} bytes ({} of {} slices), failure {failure}, remote effect {:?}, drain {:?}",
        o.status, o.completed_prefix, o.len, o.completed_slices, o.slices, o.remote_effect, o.drain
    );
}

/// Opens `b` as a peer of `a` over an in-process control link (between
/// hosts, a TCP control link plays this role).
fn connect(a: &TransferEngine, b: &TransferEngine) -> Result<orbitte::PeerInfo, Box<dyn Error>> {
    let (mut la, mut lb) = InProcessLink::pair();
    std::thread::scope(|s| {
        let accept = s.spawn(move || b.accept_peer(&mut lb));
        let opened = a.open_peer(&mut la);
        let accepted = accept
            .join()
            .map_err(|_| "accept thread panicked".to_string())?;
        accepted?;
        Ok(opened?)
    })
}
