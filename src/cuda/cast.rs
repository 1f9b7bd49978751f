use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, Buf, CudaDevice};
use crate::dtype::{DType, Data, Tensor};
use crate::error::Result;

const THREADS: usize = 256;

/// A host tensor on the device as f32: f32 is copied as it is; bf16 and f16 travel as their 16
/// bits and are widened on the device (exactly), halving the bytes sent.
pub(super) fn upload_tensor(dev: &CudaDevice, t: &Tensor<'_>) -> Result<Buf> {
    let (bits, kernel): (&[u16], &str) = match t.data() {
        Data::F32(d) => return crate::HostIo::upload(dev, d),
        Data::BF16(d) => (bytemuck::cast_slice(d), "bf16_to_f32"),
        Data::F16(d) => (bytemuck::cast_slice(d), "f16_to_f32"),
    };
    let mut y = dev.uninit(bits.len(), "an upload")?;
    if bits.is_empty() {
        return Ok(y);
    }
    let x = dev.stream().clone_htod(bits).map_err(cuda_err(format!(
        "uploading {} {} elements",
        bits.len(),
        t.dtype()
    )))?;
    debug_assert!(t.dtype() != DType::F32);
    let f = dev.function("cast", None, kernel)?;
    // SAFETY: the arguments match the kernel's signature; x and y hold bits.len() elements.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(&x)
            .arg(&mut y)
            .arg(&i(bits.len()))
            .launch(cfg(bits.len().div_ceil(THREADS), THREADS as u32, 0))
    }
    .map_err(cuda_err(format!("launching {kernel}")))?;
    Ok(y)
}
