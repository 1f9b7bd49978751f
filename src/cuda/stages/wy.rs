//! `w = A_inv (beta e^gamma k)`, `u = A_inv (beta v)` (kernels/wy.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{kernel_params, ChunkTable, GammaPtrs, Shape};
use crate::cuda::registry::{Kernel, Source};

/// Mirrors `WyParams` in kernels/wy.cu: `k` `[B, T, H, K]`, `v` `[B, T, HV, V]`, `beta`
/// (effective) `[B, T, HV]`, `a_inv` `[B, T, HV, BT]`; written: `w` `[B, T, HV, K]`, `u`
/// `[B, T, HV, V]`; all f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub k: CUdeviceptr,
    pub v: CUdeviceptr,
    pub beta: CUdeviceptr,
    pub gamma: GammaPtrs,
    pub a_inv: CUdeviceptr,
    pub w: CUdeviceptr,
    pub u: CUdeviceptr,
    pub chunks: ChunkTable,
    pub shape: Shape,
}
kernel_params!(
    Params,
    Source::Wy,
    per_chunk: Kernel::RecomputeWU,
    256
);
