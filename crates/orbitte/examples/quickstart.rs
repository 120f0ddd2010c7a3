//! Quick Start: two engines on loopback over real sockets, one WRITE with a
//! notification and one READ back. `cargo run -p orbitte --example quickstart`;
//! `docs/quickstart.md` walks through it.
#![forbid(unsafe_code)]

use std::error::Error;
use std::time::Duration;

use orbitte::{Access, EngineBuilder, HostMemory, Notification, Request};

const LEN: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn Error>> {
    // 1. Two engines. "decode" listens: its one listener serves tcp,
    //    same-host (local) and rdma sessions. Keeping host memory off RDMA
    //    lets this run on any host; leave that line out on RDMA hosts.
    let decode = EngineBuilder::new("decode-0").listen("127.0.0.1:0".parse()?);
    let decode = decode.host_memory_without_rdma().build()?;
    let prefill = EngineBuilder::new("prefill-0")
        .host_memory_without_rdma()
        .build()?;

    // 2. Register: decode publishes its buffer to peers; prefill's source
    //    stays local.
    let kv = HostMemory::alloc(LEN)?;
    decode.register(&kv, Access::RemoteReadWrite)?;
    let src = HostMemory::alloc(LEN)?;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    src.write_at(0, &pattern)?;
    let local = prefill.register(&src, Access::LocalOnly)?;

    // 3. Connect by address: handshake, decode's publications, and the
    //    path policy (local > rdma > tcp), with every fallback reported.
    let peer = prefill.connect(decode.listen_addr().ok_or("not listening")?)?;
    println!(
        "{} over {} ({:?})",
        peer.source_id(),
        peer.path,
        peer.fell_back
    );
    let remote = peer.ranges()[0];

    // 4. WRITE the whole buffer into decode's range, with a notification
    //    that decode receives once every byte of the batch is in place.
    let write = Request::write(&local, 0..LEN as u64).to(&remote, 0);
    let ids = prefill.submit_with_notification(&[write], Notification::new("kv ready"))?;
    let wrote = prefill.wait(ids[0], WAIT)?;
    let note = decode.wait_notification(WAIT).ok_or("no notification")?;
    let text = String::from_utf8_lossy(&note.payload);
    println!("write: {:?}; decode got {text:?}", wrote.status);

    // 5. READ it back, naming decode's memory by address this time.
    src.fill(0, LEN, 0)?;
    let back = Request::read(&local, 0..LEN as u64).from_address(&peer, remote.address);
    let ids = prefill.submit(&[back])?;
    let read = prefill.wait(ids[0], WAIT)?;
    prefill.wait_drain(ids[0], WAIT)?; // the buffer is ours again once drained
    let same = src.to_vec(0, LEN)? == pattern;
    println!("read: {:?}, same bytes: {same}", read.status);

    // 6. Shut down: fence, wait for drain, destroy native objects.
    prefill.shutdown(WAIT)?;
    decode.shutdown(WAIT)?;
    if !(wrote.is_complete() && read.is_complete() && same) {
        return Err("the bytes read back differ from the bytes written".into());
    }
    Ok(())
}
