//! `A_inv = (I + A_strict)^-1` per chunk block (kernels/solve_tril.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{i, kernel_params, launch_per_chunk, ChunkTable, TablePtrs};
use crate::cuda::registry::{Kernel, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

/// Mirrors `SolveTrilParams` in kernels/solve_tril.cu: both arrays `[B, T, HV, BT]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub a_strict: CUdeviceptr,
    pub a_inv: CUdeviceptr,
    pub chunks: ChunkTable,
    pub hv: i64,
}
kernel_params!(Params, Source::SolveTril);

/// Zeroes `A_inv`, then writes the lower triangle (diagonal included) of each chunk's block; a
/// short last chunk is a smaller block and columns past it stay zero. One thread per column.
///
/// # Safety
/// As [`super::kkt::launch`].
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    p: &Problem,
    t: &TablePtrs,
    params: &Params,
) -> Result<()> {
    let bt = p.chunk_size();
    let bytes = p.tokens() * p.v_heads() * bt * 4;
    let params = Params {
        chunks: t.chunks,
        hv: i(p.v_heads()),
        ..*params
    };
    // SAFETY: the caller's.
    unsafe {
        dev.memset_zero(params.a_inv, bytes, "A_inv")?;
        launch_per_chunk(dev, p, Kernel::SolveTril, bt as u32, &params)
    }
}
