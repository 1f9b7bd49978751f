//! Memory estimates: what a forward needs against what the machine has, so an impossible shape
//! is a clear error rather than an allocation abort.

use std::path::Path;

use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// Bytes of host memory the forward of `p` needs beyond its inputs, roughly: f32 copies of the
/// inputs (the CPU's fused forward reads them in place; an upload may widen them), the output `o`
/// in f32, the states and, when asked for, the chunk states. The chunked intermediates (`w`, `u`,
/// `v_new`, `A_inv`) are never held for a whole problem on the host: the fused forwards keep them
/// per chunk, and the stage path keeps them on its device.
pub fn forward_bytes(p: &Problem, opts: &Options) -> u128 {
    let tokens = p.tokens() as u128;
    let (h, hv, k, v) = (
        p.heads() as u128,
        p.v_heads() as u128,
        p.dk() as u128,
        p.dv() as u128,
    );
    let states = (p.num_seqs() as u128) * hv * k * v;
    let inputs = 2 * h * k + hv * (v + 2);
    let chunk_states = if opts.output_chunk_states {
        (p.chunks().len() as u128) * hv * k * v
    } else {
        0
    };
    4 * (tokens * (inputs + hv * v) + chunk_states + 3 * states)
}

/// The memory this machine can give now (`MemAvailable`), when it can be read.
pub fn available_memory() -> Option<u128> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Fails with a clear error, instead of an allocation abort, when the forward of `p` would need
/// more memory than is available.
pub fn check_memory(path: &Path, p: &Problem, opts: &Options) -> Result<()> {
    let need = forward_bytes(p, opts);
    if let Some(avail) = available_memory() {
        if need > avail {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            return Err(Error::file(
                path,
                format!(
                    "shapes too large to allocate: B={} T={} H={} HV={} K={} V={} need about {:.1} GiB, {:.1} GiB available",
                    p.batch(), p.seq_len(), p.heads(), p.v_heads(), p.dk(), p.dv(), gib(need), gib(avail)
                ),
            ));
        }
    }
    Ok(())
}

/// Fails with a clear error when the initial and final states of every sequence of `p` would not
/// fit in the memory available.
pub fn check_states(path: &Path, p: &Problem) -> Result<()> {
    let need = 2 * 4 * (p.num_seqs() as u128) * (p.v_heads() as u128) * (p.state_len() as u128);
    match available_memory() {
        Some(avail) if need > avail => {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            Err(Error::file(
                path,
                format!(
                    "states too large to allocate: N={} HV={} K={} V={} need about {:.1} GiB, {:.1} GiB available",
                    p.num_seqs(), p.v_heads(), p.dk(), p.dv(), gib(need), gib(avail)
                ),
            ))
        }
        _ => Ok(()),
    }
}
