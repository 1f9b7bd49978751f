//! `A_strict = beta (k k^T) decay`, strictly lower per chunk (kernels/kkt.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{kernel_params, launch_per_chunk, ChunkTable, GammaPtrs, Shape, TablePtrs};
use crate::cuda::registry::{Kernel, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

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
kernel_params!(Params, Source::Kkt);

/// Zeroes `A_strict`, then writes the strictly lower triangle of each chunk's block.
///
/// # Safety
/// Every pointer of `params` holds its documented layout of `p`, and `t` are `p`'s tables, on
/// the device's context.
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    p: &Problem,
    t: &TablePtrs,
    params: &Params,
) -> Result<()> {
    let bytes = p.tokens() * p.v_heads() * p.chunk_size() * 4;
    let params = Params {
        chunks: t.chunks,
        shape: Shape::of(p),
        ..*params
    };
    // SAFETY: the caller's.
    unsafe {
        dev.memset_zero(params.a_strict, bytes, "A_strict")?;
        launch_per_chunk(dev, p, Kernel::ChunkScaledDotKkt, THREADS as u32, &params)
    }
}
