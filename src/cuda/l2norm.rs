use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, Buf, CudaDevice};
use crate::error::Result;

/// Rows per block of the l2norm kernel (one warp each).
const ROWS_PER_BLOCK: usize = 8;

/// `x / sqrt(sum x^2 + 1e-6)` over each of `rows` rows of `dim` elements.
pub(super) fn l2norm(dev: &CudaDevice, x: &Buf, rows: usize, dim: usize) -> Result<Buf> {
    dev.check("x", x, rows.saturating_mul(dim))?;
    let mut y = dev.uninit(x.len(), "l2norm output")?;
    if x.is_empty() {
        return Ok(y);
    }
    let f = dev.function("l2norm", None, "l2norm")?;
    let launch = cfg(rows.div_ceil(ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK as u32, 0);
    // SAFETY: the arguments match the kernel's signature; x and y hold rows * dim elements.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(x)
            .arg(&mut y)
            .arg(&i(rows))
            .arg(&i(dim))
            .launch(launch)
    }
    .map_err(cuda_err("launching l2norm"))?;
    Ok(y)
}
