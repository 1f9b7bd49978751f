use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, tiled, Buf, CudaDevice};
use crate::backend::{ChunkStates, Gamma, Wy};
use crate::error::{Error, Result};
use crate::problem::Problem;

/// State columns per block: the state tile `[K, VT]` lives in shared memory.
const VT: usize = 16;

/// Blocks worth having in flight (two per SM of an H100/H200: each holds a large tile).
const MIN_BLOCKS: usize = 256;

/// The sequential pass over each sequence's chunks, parallel over (sequence, value head, tile of
/// state columns): `h`, `v_new = u - w h`, the next state and the final state.
pub(super) fn chunk_state(
    dev: &CudaDevice,
    p: &Problem,
    k: &Buf,
    wy: &Wy<Buf>,
    gamma: &Gamma<Buf>,
    h0: Option<&Buf>,
) -> Result<ChunkStates<Buf>> {
    let (h, hv, dk, dv, bt) = (p.heads(), p.v_heads(), p.dk(), p.dv(), p.chunk_size());
    let n = p.tokens() * hv;
    let kv = p.state_len();
    dev.check("k", k, p.tokens() * h * dk)?;
    dev.check("w", &wy.w, n * dk)?;
    dev.check("u", &wy.u, n * dv)?;
    dev.check_gamma(gamma, n)?;
    if let Some(h0) = h0 {
        dev.check("initial_state", h0, p.num_seqs() * hv * kv)?;
    }
    // Shared memory: the state tile, the v_new tile and decays, and, when they fit, the
    // chunk's w and k rows.
    let tile_bytes = |vt: usize| (dk * vt + bt * vt + bt) * 4;
    let staged_bytes = 2 * bt * dk * 4;
    let limit = dev.max_shared_per_block();
    let mut vt = VT.min(dv);
    // The pass is sequential over chunks: with few (sequence, head) pairs, narrower tiles give
    // the GPU more blocks to spread it over.
    while vt > 2 && p.num_seqs() * hv * dv.div_ceil(vt) < MIN_BLOCKS {
        vt /= 2;
    }
    while vt > 1 && tile_bytes(vt) > limit {
        vt /= 2;
    }
    if tile_bytes(vt) > limit {
        return Err(Error::invalid(
            "k",
            format!(
                "K (k.shape[3]) at most {} on this GPU",
                (limit / 4).saturating_sub(2 * bt)
            ),
            format!("K = {dk}"),
        ));
    }
    let staged = tile_bytes(vt) + staged_bytes <= limit;
    let shared = tile_bytes(vt) + if staged { staged_bytes } else { 0 };
    let mut h_all = dev.uninit(p.chunks().len() * hv * kv, "h")?;
    let mut v_new = dev.uninit(n * dv, "v_new")?;
    let mut final_state = dev.uninit(p.num_seqs() * hv * kv, "final_state")?;
    let items = p.num_seqs() * hv * dv.div_ceil(vt);
    if final_state.is_empty() {
        return Ok(ChunkStates {
            h: h_all,
            v_new,
            final_state,
        });
    }
    let t = dev.tables(p)?;
    let f = dev.function("chunk_state", Some(bt), "chunk_state")?;
    // Always the same value (the device's opt-in limit), so threads sharing the cached function
    // cannot race each other's launches; each launch asks for `shared` within it.
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        i32::try_from(limit).unwrap_or(i32::MAX),
    )
    .map_err(cuda_err("setting chunk_state's shared memory"))?;
    // Without an initial state the kernel reads none; k stands in as a valid pointer.
    let (h0_buf, has_h0) = match h0 {
        Some(b) => (b, 1i32),
        None => (k, 0i32),
    };
    // SAFETY: the arguments match the kernel's signature; (sequence, head, tile) items cover
    // every element of h, v_new and final_state; the shared memory asked for is what the kernel
    // indexes.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(k)
            .arg(&wy.w)
            .arg(&wy.u)
            .arg(&gamma.gamma)
            .arg(&gamma.lo)
            .arg(&gamma.seg)
            .arg(h0_buf)
            .arg(&has_h0)
            .arg(&mut h_all)
            .arg(&mut v_new)
            .arg(&mut final_state)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&t.seq_first_chunk)
            .arg(&i(p.num_seqs()))
            .arg(&i(h))
            .arg(&i(hv))
            .arg(&i(dk))
            .arg(&i(dv))
            .arg(&i(vt))
            .arg(&tiled(p))
            .arg(&i32::from(staged))
            .launch(cfg(items, 256, shared as u32))
    }
    .map_err(cuda_err("launching chunk_state"))?;
    Ok(ChunkStates {
        h: h_all,
        v_new,
        final_state,
    })
}
