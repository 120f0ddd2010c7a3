//! cargo-fuzz target: arbitrary bytes through the frame decoder, checked
//! with the same oracle as the stable harness (`examples/fuzz_decode.rs`):
//! no panic, both receive paths agree, canonical re-encoding, prefixes are
//! truncations.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = orbitte_wire::conformance::check(data) {
        panic!("{violation}");
    }
});
