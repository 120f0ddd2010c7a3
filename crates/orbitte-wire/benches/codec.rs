//! Codec speed, each group with a baseline in the same run: the cost of
//! copying the same bytes, so the numbers read as "codec overhead over a
//! memcpy" on whatever machine runs them.
//!
//! `cargo bench -p orbitte-wire --bench codec`
#![forbid(unsafe_code)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use orbitte_wire::*;

fn write_request() -> Frame {
    Frame::WriteRequest(WriteRequest {
        request_id: RequestId(1),
        range_id: RangeId(2),
        token: AccessToken(3),
        offset: 4096,
        length: 1 << 20,
    })
}

fn publication(ranges: u64, nics: u16) -> Frame {
    Frame::SegmentPublication(SegmentPublication {
        epoch: Epoch::new(1).unwrap(),
        ranges: (0..ranges)
            .map(|id| RangeDescriptor {
                range_id: RangeId(id),
                address: 0x7f00_0000_0000 + (id << 20),
                length: 1 << 20,
                access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                token: AccessToken(id),
                rkeys: (0..nics)
                    .map(|n| NicRkey {
                        nic_id: NicId(n),
                        rkey: u32::from(n),
                        lid: 0,
                        gid: Gid([n as u8; 16]),
                    })
                    .collect(),
                local: None,
            })
            .collect(),
    })
}

fn data_header(c: &mut Criterion) {
    let frame = write_request();
    let bytes = frame.to_bytes().unwrap();
    let mut g = c.benchmark_group("write_request_header");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(64);
    g.bench_function("baseline_copy_48_bytes", |b| {
        b.iter(|| {
            out.clear();
            out.extend_from_slice(black_box(&bytes));
            black_box(&out);
        })
    });
    g.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            black_box(&frame).encode(&mut out).unwrap();
            black_box(&out);
        })
    });
    g.bench_function("decode_header_first", |b| {
        b.iter(|| {
            let bytes = black_box(&bytes);
            let header = FrameHeader::decode(bytes.first_chunk().unwrap()).unwrap();
            let fixed = &bytes[HEADER_LEN..HEADER_LEN + header.fixed_len()];
            black_box(decode_body(&header, fixed).unwrap());
        })
    });
    g.finish();
}

fn publications(c: &mut Criterion) {
    let frame = publication(64, 8);
    let bytes = frame.to_bytes().unwrap();
    let mut g = c.benchmark_group("publication_64_ranges_8_nics");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    let mut out = Vec::with_capacity(bytes.len());
    g.bench_function("baseline_copy", |b| {
        b.iter(|| {
            out.clear();
            out.extend_from_slice(black_box(&bytes));
            black_box(&out);
        })
    });
    g.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            black_box(&frame).encode(&mut out).unwrap();
            black_box(&out);
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| black_box(decode_exact(black_box(&bytes)).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, data_header, publications);
criterion_main!(benches);
