//! Conversions between 16-bit floats and f32 on the device (kernels/cast.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;

const THREADS: usize = 256;

/// Mirrors `CastParams` in kernels/cast.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `n` elements of the source type.
    pub x: CUdeviceptr,
    /// `n` elements of the destination type.
    pub y: CUdeviceptr,
    pub n: i64,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/cast.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Cast;
}

/// `n` 16-bit floats of type `from` at `x` widened (exactly) to f32 at `y`.
///
/// # Safety
/// `x` and `y` hold `n` elements of their types, on the device's context, and do not overlap.
pub(crate) unsafe fn widen(
    dev: &CudaDevice,
    from: DType,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<()> {
    let kernel = match from {
        DType::BF16 => Kernel::Bf16ToF32,
        DType::F16 => Kernel::F16ToF32,
        DType::F32 => return dev.copy_f32(x, y, n),
    };
    launch(dev, kernel, x, y, n)
}

/// `n` f32 at `x` rounded to nearest even into type `to` at `y`.
///
/// # Safety
/// As [`widen`].
pub(crate) unsafe fn narrow(
    dev: &CudaDevice,
    to: DType,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<()> {
    let kernel = match to {
        DType::BF16 => Kernel::F32ToBf16,
        DType::F16 => Kernel::F32ToF16,
        DType::F32 => return dev.copy_f32(x, y, n),
    };
    launch(dev, kernel, x, y, n)
}

unsafe fn launch(
    dev: &CudaDevice,
    kernel: Kernel,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let params = Params { x, y, n: i(n) };
    dev.launch(
        kernel,
        None,
        cfg(n.div_ceil(THREADS), THREADS as u32, 0),
        &params,
    )
}
