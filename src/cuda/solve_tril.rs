use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, Buf, CudaDevice};
use crate::error::Result;
use crate::problem::Problem;

/// `A_inv = (I + A_strict)^-1` for every chunk block, on layout `[B, T, HV, BT]`. A short last
/// chunk is a smaller block; columns past it stay zero.
pub(super) fn solve_tril(dev: &CudaDevice, p: &Problem, a_strict: &Buf) -> Result<Buf> {
    let (hv, bt) = (p.v_heads(), p.chunk_size());
    dev.check("A_strict", a_strict, p.tokens() * hv * bt)?;
    // Zeroed: the kernel writes only the lower triangle (diagonal included) of each block.
    let mut a_inv = dev.zeros(a_strict.len(), "A_inv")?;
    let items = p.chunks().len() * hv;
    if items == 0 {
        return Ok(a_inv);
    }
    let t = dev.tables(p)?;
    let f = dev.function("solve_tril", Some(bt), "solve_tril")?;
    // SAFETY: the arguments match the kernel's signature; the chunk table lies within the
    // buffers' token ranges.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(a_strict)
            .arg(&mut a_inv)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&i(p.chunks().len()))
            .arg(&i(hv))
            .launch(cfg(items, bt as u32, 0))
    }
    .map_err(cuda_err("launching solve_tril"))?;
    Ok(a_inv)
}
