//! The sequential pass over each sequence's chunks (kernels/chunk_state.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params, ChunkTable, Ctx, GammaPtrs, Shape};
use crate::cuda::registry::{Kernel, Source};
use crate::error::{Error, Result};
use crate::problem::Problem;

/// State columns per block at most: the state tile `[K, VT]` lives in shared memory.
const VT: usize = 16;

/// Blocks worth having in flight (two per SM of an H100/H200: each holds a large tile).
const MIN_BLOCKS: usize = 256;

const THREADS: u32 = 256;

/// Mirrors `ChunkStateParams` in kernels/chunk_state.cu: `k` `[B, T, H, K]`, `w`
/// `[B, T, HV, K]`, `u` `[B, T, HV, V]`, `h0` `[N, HV, K, V]` (null: zero states; it may be
/// `final_state`, advanced in place); written: `h` (the state entering each chunk)
/// `[chunks, HV, K, V]`, `v_new` `[B, T, HV, V]`, `final_state` `[N, HV, K, V]`; all f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub k: CUdeviceptr,
    pub w: CUdeviceptr,
    pub u: CUdeviceptr,
    pub gamma: GammaPtrs,
    pub h0: CUdeviceptr,
    pub h: CUdeviceptr,
    pub v_new: CUdeviceptr,
    pub final_state: CUdeviceptr,
    pub chunks: ChunkTable,
    pub seq_first_chunk: CUdeviceptr,
    pub shape: Shape,
    pub seqs: i64,
    /// State columns per block.
    pub vt: i64,
    /// Whether the chunk's w and k rows are staged in shared memory.
    pub staged: i32,
}
kernel_params!(Params, Source::ChunkState);

/// How the pass is tiled on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiling {
    /// State columns per block.
    pub vt: usize,
    /// Whether w and k rows are staged in shared memory.
    pub staged: bool,
    /// Dynamic shared memory per block, in bytes.
    pub shared: usize,
}

/// The tiling for `p` within `limit` bytes of shared memory per block; `Err` naming `k` when
/// even one state column of K rows does not fit.
pub(crate) fn tiling(p: &Problem, limit: usize) -> Result<Tiling> {
    let (hv, dk, dv, bt) = (p.v_heads(), p.dk(), p.dv(), p.chunk_size());
    // Shared memory: the state tile, the v_new tile and decays, and, when they fit, the
    // chunk's w and k rows.
    let tile_bytes = |vt: usize| (dk * vt + bt * vt + bt) * 4;
    let staged_bytes = 2 * bt * dk * 4;
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
    Ok(Tiling { vt, staged, shared })
}

/// # Safety
/// Every pointer of `params` holds its documented layout of `ctx.p`, and `ctx.t` are its
/// tables, on the device's context.
pub(crate) unsafe fn launch(ctx: &Ctx<'_>, params: &Params) -> Result<()> {
    let (p, t) = (ctx.p, &ctx.t);
    if p.num_seqs() * p.v_heads() == 0 {
        return Ok(());
    }
    let tiling = tiling(p, ctx.dev.max_shared_per_block())?;
    let params = Params {
        chunks: t.chunks,
        seq_first_chunk: t.seq_first_chunk,
        shape: Shape::of(p),
        seqs: i(p.num_seqs()),
        vt: i(tiling.vt),
        staged: i32::from(tiling.staged),
        ..*params
    };
    let items = p.num_seqs() * p.v_heads() * p.dv().div_ceil(tiling.vt);
    let launch = cfg(items, THREADS, tiling.shared as u32);
    // SAFETY: the caller's.
    unsafe {
        ctx.dev
            .launch(Kernel::ChunkState, Some(p.chunk_size()), launch, &params)
    }
}
