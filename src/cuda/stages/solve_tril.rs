//! `A_inv = (I + A_strict)^-1` per chunk block (kernels/solve_tril.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, ChunkTable, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

/// Mirrors `SolveTrilParams` in kernels/solve_tril.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, HV, BT]` f32.
    pub a_strict: CUdeviceptr,
    /// `[B, T, HV, BT]` f32, zeroed by [`launch`] before the kernel writes its lower triangles.
    pub a_inv: CUdeviceptr,
    pub chunks: ChunkTable,
    pub hv: i64,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/solve_tril.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::SolveTril;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs) -> Params {
        Params {
            chunks: t.chunks,
            hv: i(p.v_heads()),
            ..Params::default()
        }
    }
}

/// Zeroes `A_inv`, then writes the lower triangle (diagonal included) of each chunk's block; a
/// short last chunk is a smaller block and columns past it stay zero.
///
/// # Safety
/// As [`super::kkt::launch`].
pub(crate) unsafe fn launch(dev: &CudaDevice, p: &Problem, params: &Params) -> Result<()> {
    let bt = p.chunk_size();
    dev.memset_zero(params.a_inv, p.tokens() * p.v_heads() * bt * 4, "A_inv")?;
    let items = p.chunks().len() * p.v_heads();
    if items == 0 {
        return Ok(());
    }
    dev.launch(
        Kernel::SolveTril,
        Some(bt),
        cfg(items, bt as u32, 0),
        params,
    )
}
