//! Conversions between 16-bit floats and f32 on the device (kernels/cast.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params};
use crate::cuda::registry::{Kernel, Source};
use crate::cuda::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};

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
    /// The 16-bit side is bf16 (1) or f16 (0).
    pub bf16: i32,
}
kernel_params!(Params, Source::Cast);

/// `n` elements at `x` of type `from` written at `y` as type `to`: 16 bits widened to f32
/// exactly, f32 narrowed to 16 bits with round-to-nearest-even, f32 copied.
///
/// # Safety
/// `x` and `y` hold `n` elements of their types on the device's context, and are equal (f32 to
/// f32 only) or do not overlap.
pub(crate) unsafe fn convert(
    dev: &CudaDevice,
    from: DType,
    to: DType,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<()> {
    let (kernel, half) = match (from, to) {
        // SAFETY: the caller's.
        (DType::F32, DType::F32) => return unsafe { dev.copy_f32(x, y, n) },
        (half, DType::F32) => (Kernel::Widen, half),
        (DType::F32, half) => (Kernel::Narrow, half),
        _ => {
            return Err(Error::invalid(
                "dtype",
                "a conversion to or from f32",
                format!("{from} to {to}"),
            ))
        }
    };
    if n == 0 {
        return Ok(());
    }
    let params = Params {
        x,
        y,
        n: i(n),
        bf16: i32::from(half == DType::BF16),
    };
    let launch = cfg(n.div_ceil(THREADS), THREADS as u32, 0);
    // SAFETY: the caller's.
    unsafe { dev.launch(kernel, None, launch, &params) }
}
