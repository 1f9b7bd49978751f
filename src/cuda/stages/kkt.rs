//! `A_strict = beta (k k^T) decay`, strictly lower per chunk (kernels/kkt.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{kernel_params, launch_per_chunk, ChunkTable, Ctx, GammaPtrs, Shape};
use crate::cuda::registry::{Kernel, Source};
use crate::error::Result;

/// Threads per block (the source's `THREADS`).
pub(crate) const THREADS: usize = 256;

/// Mirrors `KktParams` in kernels/kkt.cu: `k` `[B, T, H, K]`, `beta` (effective) `[B, T, HV]`,
/// `a_strict` `[B, T, HV, BT]`, all f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub k: CUdeviceptr,
    pub beta: CUdeviceptr,
    pub gamma: GammaPtrs,
    pub a_strict: CUdeviceptr,
    pub chunks: ChunkTable,
    pub shape: Shape,
}
kernel_params!(
    Params,
    Source::Kkt,
    per_chunk: Kernel::ChunkScaledDotKkt,
    THREADS
);

/// Zeroes `A_strict`, then writes the strictly lower triangle of each chunk's block.
///
/// # Safety
/// As [`launch_per_chunk`].
pub(crate) unsafe fn launch(ctx: &Ctx<'_>, params: &Params) -> Result<()> {
    let p = ctx.p;
    let bytes = p.tokens() * p.v_heads() * p.chunk_size() * 4;
    // SAFETY: the caller's.
    unsafe {
        ctx.dev.memset_zero(params.a_strict, bytes, "A_strict")?;
        launch_per_chunk(ctx, params)
    }
}
