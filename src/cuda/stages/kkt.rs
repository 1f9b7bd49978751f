//! `A_strict = beta (k k^T) decay`, strictly lower per chunk (kernels/kkt.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, tiled, ChunkTable, GammaPtrs, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

/// Threads per block (the source's `THREADS`).
pub(crate) const THREADS: usize = 256;

/// Mirrors `KktParams` in kernels/kkt.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, H, K]` f32.
    pub k: CUdeviceptr,
    /// `[B, T, HV]` f32, effective.
    pub beta: CUdeviceptr,
    pub gamma: GammaPtrs,
    /// `[B, T, HV, BT]` f32, zeroed by [`launch`] before the kernel writes its lower triangles.
    pub a_strict: CUdeviceptr,
    pub chunks: ChunkTable,
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub tiled: i32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/kkt.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Kkt;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs) -> Params {
        Params {
            chunks: t.chunks,
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            tiled: tiled(p),
            ..Params::default()
        }
    }
}

/// Zeroes `A_strict`, then writes the strictly lower triangle of each chunk's block.
///
/// # Safety
/// Every pointer of `params` holds its documented layout of `p`, and the tables are `p`'s, on
/// the device's context.
pub(crate) unsafe fn launch(dev: &CudaDevice, p: &Problem, params: &Params) -> Result<()> {
    let bt = p.chunk_size();
    dev.memset_zero(
        params.a_strict,
        p.tokens() * p.v_heads() * bt * 4,
        "A_strict",
    )?;
    let items = p.chunks().len() * p.v_heads();
    if items == 0 {
        return Ok(());
    }
    dev.launch(
        Kernel::ChunkScaledDotKkt,
        Some(bt),
        cfg(items, THREADS as u32, 0),
        params,
    )
}
