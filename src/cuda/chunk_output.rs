use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, tiled, Buf, CudaDevice};
use crate::backend::Gamma;
use crate::error::Result;
use crate::problem::Problem;

/// `o = scale (e^gamma (q h) + causal(q k^T e^(gamma_i - gamma_j)) v_new)`, diagonal included.
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_output(
    dev: &CudaDevice,
    p: &Problem,
    q: &Buf,
    k: &Buf,
    v_new: &Buf,
    h: &Buf,
    gamma: &Gamma<Buf>,
    scale: f32,
) -> Result<Buf> {
    let (nh, hv, dk, dv, bt) = (p.heads(), p.v_heads(), p.dk(), p.dv(), p.chunk_size());
    let n = p.tokens() * hv;
    dev.check("q", q, p.tokens() * nh * dk)?;
    dev.check("k", k, p.tokens() * nh * dk)?;
    dev.check("v_new", v_new, n * dv)?;
    dev.check("h", h, p.chunks().len() * hv * p.state_len())?;
    dev.check_gamma(gamma, n)?;
    let mut o = dev.uninit(n * dv, "o")?;
    let items = p.chunks().len() * hv;
    if items == 0 {
        return Ok(o);
    }
    let t = dev.tables(p)?;
    let f = dev.function("chunk_output", Some(bt), "chunk_output")?;
    // SAFETY: the arguments match the kernel's signature; the chunks tile every token, so every
    // element of o is written.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(q)
            .arg(k)
            .arg(v_new)
            .arg(h)
            .arg(&gamma.gamma)
            .arg(&gamma.lo)
            .arg(&gamma.seg)
            .arg(&mut o)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&i(p.chunks().len()))
            .arg(&i(nh))
            .arg(&i(hv))
            .arg(&i(dk))
            .arg(&i(dv))
            .arg(&scale)
            .arg(&tiled(p))
            .launch(cfg(items, 256, 0))
    }
    .map_err(cuda_err("launching chunk_output"))?;
    Ok(o)
}
