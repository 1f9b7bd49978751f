use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, tiled, Buf, CudaDevice};
use crate::error::Result;
use crate::problem::Problem;

/// State columns per block with K-major states (one thread each).
const COLS_PER_BLOCK: usize = 128;
/// State rows per block with V-major states (one warp each).
const ROWS_PER_BLOCK: usize = 8;

/// The gated delta rule token by token, updating `state` in place (`[N, HV, K, V]`, or
/// `[N, HV, V, K]` with `v_first`); returns `o` `[B, T, HV, V]`. `g` and `beta` are the
/// effective (activated) values.
#[allow(clippy::too_many_arguments)]
pub(super) fn recurrent(
    dev: &CudaDevice,
    p: &Problem,
    q: &Buf,
    k: &Buf,
    v: &Buf,
    g: &Buf,
    beta: &Buf,
    state: &mut Buf,
    v_first: bool,
    scale: f32,
) -> Result<Buf> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let n = p.tokens() * hv;
    dev.check("q", q, p.tokens() * nh * dk)?;
    dev.check("k", k, p.tokens() * nh * dk)?;
    dev.check("v", v, n * dv)?;
    dev.check("g", g, n)?;
    dev.check("beta", beta, n)?;
    dev.check("state", state, p.num_seqs() * hv * p.state_len())?;
    let mut o = dev.uninit(n * dv, "o")?;
    if n == 0 {
        return Ok(o);
    }
    let t = dev.tables(p)?;
    let (func, threads, items) = if v_first {
        let items = p.num_seqs() * hv * dv.div_ceil(ROWS_PER_BLOCK);
        ("recurrent_vk", 32 * ROWS_PER_BLOCK, items)
    } else {
        let threads = dv.next_multiple_of(32).min(COLS_PER_BLOCK);
        (
            "recurrent_kv",
            threads,
            p.num_seqs() * hv * dv.div_ceil(threads),
        )
    };
    let f = dev.function("recurrent", None, func)?;
    // SAFETY: the arguments match the kernel's signature; the sequences tile every token, so
    // every element of o is written.
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(g)
            .arg(beta)
            .arg(state)
            .arg(&mut o)
            .arg(&t.seq_start)
            .arg(&i(p.num_seqs()))
            .arg(&i(nh))
            .arg(&i(hv))
            .arg(&i(dk))
            .arg(&i(dv))
            .arg(&scale)
            .arg(&tiled(p))
            .launch(cfg(items, threads as u32, 0))
    }
    .map_err(cuda_err(format!("launching {func}")))?;
    Ok(o)
}
