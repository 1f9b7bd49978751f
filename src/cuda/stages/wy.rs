//! `w = A_inv (beta e^gamma k)`, `u = A_inv (beta v)` (kernels/wy.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, tiled, ChunkTable, GammaPtrs, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

const THREADS: u32 = 256;

/// Mirrors `WyParams` in kernels/wy.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, H, K]` f32.
    pub k: CUdeviceptr,
    /// `[B, T, HV, V]` f32.
    pub v: CUdeviceptr,
    /// `[B, T, HV]` f32, effective.
    pub beta: CUdeviceptr,
    pub gamma: GammaPtrs,
    /// `[B, T, HV, BT]` f32.
    pub a_inv: CUdeviceptr,
    /// `[B, T, HV, K]` f32, written.
    pub w: CUdeviceptr,
    /// `[B, T, HV, V]` f32, written.
    pub u: CUdeviceptr,
    pub chunks: ChunkTable,
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
    pub tiled: i32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/wy.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Wy;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs) -> Params {
        Params {
            chunks: t.chunks,
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            dv: i(p.dv()),
            tiled: tiled(p),
            ..Params::default()
        }
    }
}

/// # Safety
/// As [`super::kkt::launch`].
pub(crate) unsafe fn launch(dev: &CudaDevice, p: &Problem, params: &Params) -> Result<()> {
    let items = p.chunks().len() * p.v_heads();
    if items == 0 {
        return Ok(());
    }
    dev.launch(
        Kernel::RecomputeWU,
        Some(p.chunk_size()),
        cfg(items, THREADS, 0),
        params,
    )
}
