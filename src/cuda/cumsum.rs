use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, Buf, CudaDevice};
use crate::backend::{Gamma, RESET_LOG_DECAY};
use crate::error::Result;
use crate::problem::Problem;

/// `gamma = cumsum(g)` within each chunk with its rounding error, restarted at hard resets (see
/// [`Gamma`]).
pub(super) fn chunk_local_cumsum(dev: &CudaDevice, p: &Problem, g: &Buf) -> Result<Gamma<Buf>> {
    let hv = p.v_heads();
    dev.check("g", g, p.tokens() * hv)?;
    let mut gamma = dev.uninit(g.len(), "gamma")?;
    let mut lo = dev.uninit(g.len(), "lo")?;
    let mut seg = dev.uninit(g.len(), "seg")?;
    let items = p.chunks().len() * hv;
    if items == 0 {
        return Ok(Gamma { gamma, lo, seg });
    }
    let t = dev.tables(p)?;
    let f = dev.function("cumsum", None, "chunk_local_cumsum")?;
    const THREADS: usize = 128;
    // SAFETY: the arguments match the kernel's signature; the chunk table covers every token,
    // so every element of gamma, lo and seg is written.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(g)
            .arg(&mut gamma)
            .arg(&mut lo)
            .arg(&mut seg)
            .arg(&t.chunk_start)
            .arg(&t.chunk_len)
            .arg(&i(p.chunks().len()))
            .arg(&i(hv))
            .arg(&RESET_LOG_DECAY)
            .launch(cfg(items.div_ceil(THREADS), THREADS as u32, 0))
    }
    .map_err(cuda_err("launching chunk_local_cumsum"))?;
    Ok(Gamma { gamma, lo, seg })
}
