//! `x / sqrt(sum x^2 + 1e-6)` over rows (kernels/l2norm.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params};
use crate::cuda::registry::{Kernel, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;

/// Rows per block (one warp each).
const ROWS_PER_BLOCK: usize = 8;

/// Mirrors `L2normParams` in kernels/l2norm.cu: `x` and `y` are `[rows, dim]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub x: CUdeviceptr,
    pub y: CUdeviceptr,
    pub rows: i64,
    pub dim: i64,
}
kernel_params!(Params, Source::L2norm);

/// `y = x / sqrt(sum x^2 + 1e-6)` over each of `rows` rows of `dim` elements.
///
/// # Safety
/// `x` and `y` hold `rows * dim` f32 on the device's context.
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    x: CUdeviceptr,
    y: CUdeviceptr,
    rows: usize,
    dim: usize,
) -> Result<()> {
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let params = Params {
        x,
        y,
        rows: i(rows),
        dim: i(dim),
    };
    let launch = cfg(rows.div_ceil(ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK as u32, 0);
    // SAFETY: the caller's.
    unsafe { dev.launch(Kernel::L2norm, None, launch, &params) }
}
