//! `o = scale (e^gamma (q h) + causal(q k^T decay) v_new)` (kernels/chunk_output.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{kernel_params, ChunkTable, GammaPtrs, Shape};
use crate::cuda::registry::{Kernel, Source};

/// Threads per block (the source's `THREADS`).
pub(crate) const THREADS: usize = 256;

/// Mirrors `ChunkOutputParams` in kernels/chunk_output.cu: `q`, `k` `[B, T, H, K]`, `v_new`
/// `[B, T, HV, V]`, `h` (the state entering each chunk) `[chunks, HV, K, V]`; written: `o`
/// `[B, T, HV, V]`; all f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub q: CUdeviceptr,
    pub k: CUdeviceptr,
    pub v_new: CUdeviceptr,
    pub h: CUdeviceptr,
    pub gamma: GammaPtrs,
    pub o: CUdeviceptr,
    pub chunks: ChunkTable,
    pub shape: Shape,
    pub scale: f32,
}
kernel_params!(
    Params,
    Source::ChunkOutput,
    per_chunk: Kernel::ChunkOutput,
    THREADS
);
