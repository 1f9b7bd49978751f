use crate::error::{check_len, Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// FLA's softplus: `ln(1 + e^x)`, the identity above 20 where the two agree in f32.
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The effective gate and beta (see [`crate::Backend::gate`]).
pub fn gate(
    p: &Problem,
    opts: &Options,
    g: &[f32],
    beta: &[f32],
    a_log: Option<&[f32]>,
    dt_bias: Option<&[f32]>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    p.check("g", g.len(), 1)?;
    p.check("beta", beta.len(), 1)?;
    let hv = p.v_heads;
    let g = if opts.gate_in_kernel {
        let a_log = a_log.ok_or_else(|| {
            Error::invalid("A_log", "a [HV] tensor (gate_in_kernel is on)", "none")
        })?;
        let dt_bias = dt_bias.ok_or_else(|| {
            Error::invalid("dt_bias", "a [HV] tensor (gate_in_kernel is on)", "none")
        })?;
        check_len("A_log", a_log.len(), hv)?;
        check_len("dt_bias", dt_bias.len(), hv)?;
        g.iter()
            .enumerate()
            .map(|(i, &x)| {
                let j = i % hv;
                -a_log[j].exp() * softplus(x + dt_bias[j])
            })
            .collect()
    } else {
        g.to_vec()
    };
    let beta = if opts.beta_is_logits {
        let m = if opts.allow_neg_eigval { 2.0 } else { 1.0 };
        beta.iter().map(|&x| m / (1.0 + (-x).exp())).collect()
    } else {
        beta.to_vec()
    };
    Ok((g, beta))
}
