//! A prefill/decode KV-cache hand-off between two processes.
//!
//! ```sh
//! cargo run -p orbitte --example handoff
//! ```
//!
//! The process started by hand is the decode side: it listens, publishes a
//! KV buffer and starts the prefill side as a child process with its
//! address. Prefill writes its "KV cache" into decode's buffer in one batch
//! that carries a notification; decode waits for the notification (it
//! arrives only after every byte of the batch is in its memory), then
//! checks the bytes. On two hosts, run `handoff prefill DECODE_ADDR` on the
//! other host and listen on an address it can reach.
#![forbid(unsafe_code)]

use std::error::Error;
use std::time::Duration;

use orbitte::{
    Access, EngineBuilder, HostMemory, Notification, NotificationStatus, Request, TransferEngine,
};

/// 32 layers of 64 KiB.
const LAYERS: u64 = 32;
const LAYER: u64 = 64 << 10;
const WAIT: Duration = Duration::from_secs(30);

fn kv_byte(i: u64) -> u8 {
    (i * 7 % 251) as u8
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        None | Some("decode") => decode(),
        Some("prefill") => prefill(args.get(2).ok_or("usage: handoff prefill DECODE_ADDR")?),
        Some(other) => Err(format!("unknown role {other}: decode or prefill").into()),
    }
}

/// Hosts without RDMA NICs keep host memory off RDMA; on RDMA hosts leave
/// `host_memory_without_rdma` out (Host Direct registrations, rdma path).
fn builder(name: &str) -> EngineBuilder {
    EngineBuilder::new(name).host_memory_without_rdma()
}

fn decode() -> Result<(), Box<dyn Error>> {
    let engine = builder("decode-0").listen("127.0.0.1:0".parse()?).build()?;
    let kv = HostMemory::alloc((LAYERS * LAYER) as usize)?;
    engine.register(&kv, Access::RemoteWrite)?;
    let addr = engine.listen_addr().ok_or("not listening")?;
    println!("decode: listening on {addr}, starting prefill");
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["prefill", &addr.to_string()])
        .spawn()?;

    // The notification says the whole batch is placed: no polling of the
    // buffer, no flag byte, no side channel.
    let note = engine
        .wait_notification(WAIT)
        .ok_or("no notification from prefill")?;
    println!(
        "decode: {:?} from {} (epoch {}) over {}",
        String::from_utf8_lossy(&note.payload),
        note.source_id,
        note.epoch,
        note.path
    );
    let bytes = kv.to_vec(0, kv.len())?;
    let bad = (0..LAYERS * LAYER).find(|&i| bytes[i as usize] != kv_byte(i));
    if !child.wait()?.success() {
        return Err("prefill failed".into());
    }
    engine.shutdown(WAIT)?;
    match bad {
        None => {
            println!("decode: all {} layers hold the prefill's bytes", LAYERS);
            Ok(())
        }
        Some(i) => Err(format!("byte {i} differs").into()),
    }
}

fn prefill(decode_addr: &str) -> Result<(), Box<dyn Error>> {
    let engine: TransferEngine = builder("prefill-0").build()?;
    let src = HostMemory::alloc((LAYERS * LAYER) as usize)?;
    let bytes: Vec<u8> = (0..LAYERS * LAYER).map(kv_byte).collect();
    src.write_at(0, &bytes)?;
    let local = engine.register(&src, Access::LocalOnly)?;
    let peer = engine.connect(decode_addr.parse()?)?;
    let kv = peer.ranges()[0];
    // One request per layer, one batch, one notification after them all.
    let batch: Vec<Request> = (0..LAYERS)
        .map(|l| {
            Request::write(&local, l * LAYER..(l + 1) * LAYER)
                .to(&kv, l * LAYER)
                .label(l)
        })
        .collect();
    let note = Notification::new(format!("{LAYERS} layers of request 42 ready"));
    let ids = engine.submit_with_notification(&batch, note)?;
    for o in engine.wait_all(&ids, WAIT)? {
        if !o.is_complete() || o.notification != NotificationStatus::Sent {
            return Err(format!("layer {} not handed off: {o:?}", o.label).into());
        }
    }
    println!(
        "prefill: {LAYERS} layers written over {}, notification sent",
        peer.path
    );
    engine.shutdown(WAIT)?;
    Ok(())
}
