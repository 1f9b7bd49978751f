//! `o = scale (e^gamma (q h) + causal(q k^T decay) v_new)` (kernels/chunk_output.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, tiled, ChunkTable, GammaPtrs, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

/// Threads per block (the source's `THREADS`).
pub(crate) const THREADS: usize = 256;

/// Mirrors `ChunkOutputParams` in kernels/chunk_output.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, H, K]` f32.
    pub q: CUdeviceptr,
    /// `[B, T, H, K]` f32.
    pub k: CUdeviceptr,
    /// `[B, T, HV, V]` f32.
    pub v_new: CUdeviceptr,
    /// `[chunks, HV, K, V]` f32, the state entering each chunk.
    pub h: CUdeviceptr,
    pub gamma: GammaPtrs,
    /// `[B, T, HV, V]` f32, written.
    pub o: CUdeviceptr,
    pub chunks: ChunkTable,
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
    pub scale: f32,
    pub tiled: i32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/chunk_output.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::ChunkOutput;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs, scale: f32) -> Params {
        Params {
            chunks: t.chunks,
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            dv: i(p.dv()),
            scale,
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
        Kernel::ChunkOutput,
        Some(p.chunk_size()),
        cfg(items, THREADS as u32, 0),
        params,
    )
}
