use cudarc::driver::PushKernelArg;

use super::{cfg, cuda_err, i, Buf, CudaDevice};
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// The effective gate and beta (see [`crate::Backend::gate`]).
pub(super) fn gate(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    g: &Buf,
    beta: &Buf,
    a_log: Option<&Buf>,
    dt_bias: Option<&Buf>,
) -> Result<(Buf, Buf)> {
    let hv = p.v_heads();
    let n = p.tokens() * hv;
    dev.check("g", g, n)?;
    dev.check("beta", beta, n)?;
    let (a_log, dt_bias) = if opts.gate_in_kernel {
        let a_log = a_log.ok_or_else(|| {
            Error::invalid("A_log", "a [HV] tensor (gate_in_kernel is on)", "none")
        })?;
        let dt_bias = dt_bias.ok_or_else(|| {
            Error::invalid("dt_bias", "a [HV] tensor (gate_in_kernel is on)", "none")
        })?;
        dev.check("A_log", a_log, hv)?;
        dev.check("dt_bias", dt_bias, hv)?;
        (a_log, dt_bias)
    } else {
        // Not read by the kernel without gate_in_kernel; any valid pointer will do.
        (g, g)
    };
    let mut g_out = dev.uninit(n, "g")?;
    let mut beta_out = dev.uninit(n, "beta")?;
    if n == 0 {
        return Ok((g_out, beta_out));
    }
    let f = dev.function("gate", None, "gate")?;
    let beta_mult: f32 = if opts.allow_neg_eigval { 2.0 } else { 1.0 };
    const THREADS: usize = 256;
    // SAFETY: the arguments match the kernel's signature; every buffer holds n elements (A_log
    // and dt_bias HV, read only with gate_in_kernel).
    unsafe {
        dev.stream()
            .launch_builder(&f)
            .arg(g)
            .arg(beta)
            .arg(a_log)
            .arg(dt_bias)
            .arg(&mut g_out)
            .arg(&mut beta_out)
            .arg(&i(n))
            .arg(&i(hv))
            .arg(&i32::from(opts.gate_in_kernel))
            .arg(&i32::from(opts.beta_is_logits))
            .arg(&beta_mult)
            .launch(cfg(n.div_ceil(THREADS), THREADS as u32, 0))
    }
    .map_err(cuda_err("launching gate"))?;
    Ok((g_out, beta_out))
}
