use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, tiled, Buf, CudaDevice};
use crate::backend::{Gamma, Wy};
use crate::error::Result;
use crate::problem::Problem;

/// `w = A_inv (beta e^gamma k)` and `u = A_inv (beta v)`, chunk by chunk.
pub(super) fn recompute_w_u(
    dev: &CudaDevice,
    p: &Problem,
    k: &Buf,
    v: &Buf,
    beta: &Buf,
    gamma: &Gamma<Buf>,
    a_inv: &Buf,
) -> Result<Wy<Buf>> {
    let (h, hv, dk, dv, bt) = (p.heads(), p.v_heads(), p.dk(), p.dv(), p.chunk_size());
    let n = p.tokens() * hv;
    dev.check("k", k, p.tokens() * h * dk)?;
    dev.check("v", v, n * dv)?;
    dev.check("beta", beta, n)?;
    dev.check_gamma(gamma, n)?;
    dev.check("A_inv", a_inv, n * bt)?;
    let mut w = dev.uninit(n * dk, "w")?;
    let mut u = dev.uninit(n * dv, "u")?;
    let items = p.chunks().len() * hv;
    if items == 0 {
        return Ok(Wy { w, u });
    }
    let t = dev.tables(p)?;
    let f = dev.function("wy", Some(bt), "recompute_w_u")?;
    // SAFETY: the arguments match the kernel's signature; the chunks tile every token, so every
    // element of w and u is written.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(k)
            .arg(v)
            .arg(beta)
            .arg(&gamma.gamma)
            .arg(&gamma.lo)
            .arg(&gamma.seg)
            .arg(a_inv)
            .arg(&mut w)
            .arg(&mut u)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&i(p.chunks().len()))
            .arg(&i(h))
            .arg(&i(hv))
            .arg(&i(dk))
            .arg(&i(dv))
            .arg(&tiled(p))
            .launch(cfg(items, 256, 0))
    }
    .map_err(cuda_err("launching recompute_w_u"))?;
    Ok(Wy { w, u })
}
