//! Stable-toolchain fuzz harness for the frame decoder: seeded random bytes
//! and mutations of valid frames, each checked with
//! `orbitte_wire::conformance::check` (no panic, both receive paths agree,
//! canonical re-encoding, prefixes are truncations).
//!
//! ```text
//! cargo run -p orbitte-wire --example fuzz_decode -- --seconds 5
//! cargo run -p orbitte-wire --release --example fuzz_decode -- --seconds 36000 --seed 42
//! ```
//!
//! Options: `--seconds N` (default 5), `--iterations N` (stop after N inputs
//! instead), `--seed N` (default: from the clock; printed so a failure can be
//! replayed), `--write-corpus DIR` (write the valid sample frames as a seed
//! corpus for cargo-fuzz and exit). On a violation or a panic it prints the seed, the iteration and
//! the input in hex, and exits with status 1. For coverage-guided fuzzing on
//! nightly see `crates/orbitte-wire/fuzz/`.
#![forbid(unsafe_code)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use orbitte_wire::{FrameType, HEADER_LEN, MAGIC, PROTOCOL_VERSION, conformance, decode};

/// splitmix64: small, seedable, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

const INTERESTING_U32: [u32; 10] = [
    0,
    1,
    11,
    12,
    36,
    255,
    0xffff,
    4 << 20,
    (4 << 20) + 1,
    u32::MAX,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        match rng.below(10) {
            // flip a bit
            0 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] ^= 1 << rng.below(8);
            }
            // set a byte to an interesting value
            1 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = [0, 1, 2, 0x7f, 0x80, 0xff][rng.below(6)];
            }
            // random byte
            2 if !input.is_empty() => {
                let i = rng.below(input.len());
                input[i] = rng.byte();
            }
            // truncate
            3 => {
                let n = rng.below(input.len() + 1);
                input.truncate(n);
            }
            // insert bytes
            4 => {
                let at = rng.below(input.len() + 1);
                let n = 1 + rng.below(8);
                for _ in 0..n {
                    input.insert(at, rng.byte());
                }
            }
            // delete a span
            5 if !input.is_empty() => {
                let at = rng.below(input.len());
                let n = 1 + rng.below((input.len() - at).min(16));
                input.drain(at..at + n);
            }
            // body length field to an interesting value
            6 if input.len() >= HEADER_LEN => {
                let v = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
                let v = if rng.below(2) == 0 {
                    v
                } else {
                    (input.len() - HEADER_LEN) as u32
                };
                input[8..12].copy_from_slice(&v.to_be_bytes());
            }
            // frame type or version field
            7 if input.len() >= HEADER_LEN => {
                if rng.below(2) == 0 {
                    let t = FrameType::ALL[rng.below(FrameType::ALL.len())];
                    input[6..8].copy_from_slice(&t.0.to_be_bytes());
                } else {
                    let v = [0, PROTOCOL_VERSION + 1, u16::MAX][rng.below(3)];
                    input[4..6].copy_from_slice(&v.to_be_bytes());
                }
            }
            // overwrite a 2/4/8-byte field-sized window with extremes
            8 if input.len() >= 8 => {
                let w = [2, 4, 8][rng.below(3)];
                let at = rng.below(input.len() - w + 1);
                let fill = if rng.below(2) == 0 { 0 } else { 0xff };
                input[at..at + w].fill(fill);
            }
            // splice with another corpus entry
            _ => {
                let other = &corpus[rng.below(corpus.len())];
                let at = rng.below(input.len() + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
        }
    }
}

fn random_input(rng: &mut Rng) -> Vec<u8> {
    let len = rng.below(300);
    let mut v: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
    // Half the time give it a plausible header so bodies get exercised.
    if rng.below(2) == 0 {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
        let t = FrameType::ALL[rng.below(FrameType::ALL.len())];
        h.extend_from_slice(&t.0.to_be_bytes());
        h.extend_from_slice(&(len as u32).to_be_bytes());
        h.append(&mut v);
        v = h;
    }
    v
}

struct Args {
    seconds: u64,
    iterations: Option<u64>,
    seed: u64,
    write_corpus: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 5,
        iterations: None,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        write_corpus: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))
        };
        match a.as_str() {
            "--seconds" => args.seconds = value("--seconds")?,
            "--iterations" => args.iterations = Some(value("--iterations")?),
            "--seed" => args.seed = value("--seed")?,
            "--write-corpus" => {
                args.write_corpus = Some(it.next().ok_or("--write-corpus needs a directory")?);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`; use --seconds N, --iterations N, --seed N, \
                     --write-corpus DIR"
                ));
            }
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fuzz_decode: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(dir) = &args.write_corpus {
        return write_corpus(dir);
    }
    // Keep the default hook quiet: panics are reported below with the input.
    std::panic::set_hook(Box::new(|_| {}));
    println!(
        "fuzz_decode: seed {} for {} s{}",
        args.seed,
        args.seconds,
        args.iterations
            .map(|n| format!(" or {n} inputs"))
            .unwrap_or_default()
    );
    let mut rng = Rng(args.seed);
    let mut corpus = common::encoded_samples();
    let seeds = corpus.len();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut decoded = 0u64;
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    let mut n = 0u64;
    loop {
        if args.iterations.is_some_and(|max| n >= max)
            || (args.iterations.is_none() && n.is_multiple_of(256) && Instant::now() >= deadline)
        {
            break;
        }
        let input = if rng.below(8) == 0 {
            random_input(&mut rng)
        } else {
            let mut v = corpus[rng.below(corpus.len())].clone();
            mutate(&mut rng, &mut v, &corpus);
            v
        };
        match catch_unwind(AssertUnwindSafe(|| conformance::check(&input))) {
            Ok(Ok(Some(_))) => {
                decoded += 1;
                // New valid frames join the corpus (bounded).
                if corpus.len() < seeds + 4096
                    && let Ok(d) = decode(&input)
                {
                    corpus.push(input[..d.frame_len].to_vec());
                }
            }
            Ok(Ok(None)) => {
                if let Err(e) = decode(&input) {
                    let kind = format!("{:?}", e.problem);
                    let kind = kind.split([' ', '{', '(']).next().unwrap_or("").to_owned();
                    *rejected.entry(format!("{}/{kind}", e.field)).or_default() += 1;
                }
            }
            Ok(Err(violation)) => {
                report(&args, n, &input, &violation.to_string());
                return ExitCode::FAILURE;
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".to_owned());
                report(&args, n, &input, &format!("panic: {what}"));
                return ExitCode::FAILURE;
            }
        }
        n += 1;
    }
    let mut top: Vec<_> = rejected.into_iter().collect();
    top.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    println!(
        "fuzz_decode: {n} inputs, {decoded} decoded, {} rejected, corpus {} frames, 0 violations",
        n - decoded,
        corpus.len()
    );
    for (kind, count) in top.iter().take(12) {
        println!("  rejected {count:>9}  {kind}");
    }
    ExitCode::SUCCESS
}

/// Writes every sample frame as one file, a seed corpus for cargo-fuzz.
fn write_corpus(dir: &str) -> ExitCode {
    let dir = std::path::Path::new(dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("fuzz_decode: cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for (i, bytes) in common::encoded_samples().iter().enumerate() {
        let path = dir.join(format!("sample-{i:03}"));
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("fuzz_decode: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!(
        "fuzz_decode: wrote {} seed frames to {}",
        common::samples().len(),
        dir.display()
    );
    ExitCode::SUCCESS
}

fn report(args: &Args, iteration: u64, input: &[u8], what: &str) {
    eprintln!(
        "fuzz_decode: VIOLATION at seed {} iteration {iteration}: {what}",
        args.seed
    );
    let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
    eprintln!("input ({} bytes): {hex}", input.len());
}
