//! The sequential pass over each sequence's chunks (kernels/chunk_state.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, tiled, ChunkTable, GammaPtrs, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::problem::Problem;

/// State columns per block at most: the state tile `[K, VT]` lives in shared memory.
const VT: usize = 16;

/// Blocks worth having in flight (two per SM of an H100/H200: each holds a large tile).
const MIN_BLOCKS: usize = 256;

const THREADS: u32 = 256;

/// Mirrors `ChunkStateParams` in kernels/chunk_state.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, H, K]` f32.
    pub k: CUdeviceptr,
    /// `[B, T, HV, K]` f32.
    pub w: CUdeviceptr,
    /// `[B, T, HV, V]` f32.
    pub u: CUdeviceptr,
    pub gamma: GammaPtrs,
    /// `[N, HV, K, V]` f32; null means zero states. May equal `final_state` (updated in place).
    pub h0: CUdeviceptr,
    /// `[chunks, HV, K, V]` f32, written: the state entering each chunk.
    pub h: CUdeviceptr,
    /// `[B, T, HV, V]` f32, written.
    pub v_new: CUdeviceptr,
    /// `[N, HV, K, V]` f32, written.
    pub final_state: CUdeviceptr,
    pub chunks: ChunkTable,
    /// `[N + 1]` i64.
    pub seq_first_chunk: CUdeviceptr,
    pub seqs: i64,
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
    /// State columns per block (set by [`launch`]).
    pub vt: i64,
    pub tiled: i32,
    /// Whether the chunk's w and k rows are staged in shared memory (set by [`launch`]).
    pub staged: i32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/chunk_state.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::ChunkState;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs) -> Params {
        Params {
            chunks: t.chunks,
            seq_first_chunk: t.seq_first_chunk,
            seqs: i(p.num_seqs()),
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            dv: i(p.dv()),
            tiled: tiled(p),
            ..Params::default()
        }
    }
}

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
/// Every pointer of `params` holds its documented layout of `p` (`h0` null or valid), and the
/// tables are `p`'s, on the device's context.
pub(crate) unsafe fn launch(dev: &CudaDevice, p: &Problem, params: &Params) -> Result<()> {
    let items_per_tile = p.num_seqs() * p.v_heads();
    if items_per_tile == 0 {
        return Ok(());
    }
    let t = tiling(p, dev.max_shared_per_block())?;
    let params = Params {
        vt: i(t.vt),
        staged: i32::from(t.staged),
        ..*params
    };
    let items = items_per_tile * p.dv().div_ceil(t.vt);
    dev.launch(
        Kernel::ChunkState,
        Some(p.chunk_size()),
        cfg(items, THREADS, t.shared as u32),
        &params,
    )
}
