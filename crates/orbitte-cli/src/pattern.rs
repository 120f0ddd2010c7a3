//! The bench pattern: what a bench target's range holds before anything
//! is written, and what `orbitte serve` writes into a range with
//! `fill = "pattern"`, so that a READ with `--check` knows every byte.

use orbitte::HostMemory;

/// Byte `k` of a target's range before anything is written (the pattern a
/// READ with `--check` expects).
pub(crate) fn target_byte(k: u64) -> u8 {
    ((k.wrapping_mul(0x9E37_79B1) >> 13) as u8) ^ (k as u8)
}

/// Fills `mem` with [`target_byte`].
pub(crate) fn fill_target_pattern(mem: &HostMemory) -> Result<(), String> {
    const CHUNK: usize = 1 << 20;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0;
    while off < mem.len() {
        let n = CHUNK.min(mem.len() - off);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = target_byte((off + i) as u64);
        }
        mem.write_at(off, &buf[..n]).map_err(|e| e.to_string())?;
        off += n;
    }
    Ok(())
}
