use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, tiled, Buf, CudaDevice};
use crate::backend::Gamma;
use crate::error::Result;
use crate::problem::Problem;

/// `A_strict[i, j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j)` for i > j within a chunk, zero
/// elsewhere; layout `[B, T, HV, BT]`.
pub(super) fn chunk_scaled_dot_kkt(
    dev: &CudaDevice,
    p: &Problem,
    k: &Buf,
    beta: &Buf,
    gamma: &Gamma<Buf>,
) -> Result<Buf> {
    let (h, hv, dk, bt) = (p.heads(), p.v_heads(), p.dk(), p.chunk_size());
    dev.check("k", k, p.tokens() * h * dk)?;
    dev.check("beta", beta, p.tokens() * hv)?;
    dev.check_gamma(gamma, p.tokens() * hv)?;
    // Zeroed: the kernel writes only the strictly lower triangle of each block.
    let mut a = dev.zeros(p.tokens() * hv * bt, "A_strict")?;
    let items = p.chunks().len() * hv;
    if items == 0 {
        return Ok(a);
    }
    let t = dev.tables(p)?;
    let f = dev.function("kkt", Some(bt), "chunk_scaled_dot_kkt")?;
    // SAFETY: the arguments match the kernel's signature; the chunk table lies within the
    // buffers' token ranges.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(k)
            .arg(beta)
            .arg(&gamma.gamma)
            .arg(&gamma.lo)
            .arg(&gamma.seg)
            .arg(&mut a)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&i(p.chunks().len()))
            .arg(&i(h))
            .arg(&i(hv))
            .arg(&i(dk))
            .arg(&tiled(p))
            .launch(cfg(items, 256, 0))
    }
    .map_err(cuda_err("launching chunk_scaled_dot_kkt"))?;
    Ok(a)
}
