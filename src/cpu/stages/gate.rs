use crate::error::{check_len, Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// FLA's softplus: `ln(1 + e^x)`, the identity above 20 where the two agree in f32.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The gate and beta activations of one call, applied value by value.
pub(crate) struct Activation<'a> {
    gate: Option<(&'a [f32], &'a [f32])>,
    beta_scale: Option<f32>,
}

impl<'a> Activation<'a> {
    pub(crate) fn new(
        hv: usize,
        opts: &Options,
        a_log: Option<&'a [f32]>,
        dt_bias: Option<&'a [f32]>,
    ) -> Result<Self> {
        let gate = if opts.gate_in_kernel {
            let a_log = a_log.ok_or_else(|| {
                Error::invalid("A_log", "a [HV] tensor (gate_in_kernel is on)", "none")
            })?;
            let dt_bias = dt_bias.ok_or_else(|| {
                Error::invalid("dt_bias", "a [HV] tensor (gate_in_kernel is on)", "none")
            })?;
            check_len("A_log", a_log.len(), hv)?;
            check_len("dt_bias", dt_bias.len(), hv)?;
            Some((a_log, dt_bias))
        } else {
            None
        };
        let beta_scale =
            opts.beta_is_logits
                .then_some(if opts.allow_neg_eigval { 2.0 } else { 1.0 });
        Ok(Activation { gate, beta_scale })
    }

    /// The effective log decay of value head `j` from the input `g`.
    #[inline]
    pub(crate) fn g(&self, g: f32, j: usize) -> f32 {
        match self.gate {
            Some((a_log, dt_bias)) => -a_log[j].exp() * softplus(g + dt_bias[j]),
            None => g,
        }
    }

    /// The effective beta from the input `beta`.
    #[inline]
    pub(crate) fn beta(&self, beta: f32) -> f32 {
        match self.beta_scale {
            Some(m) => m / (1.0 + (-beta).exp()),
            None => beta,
        }
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
    let hv = p.v_heads();
    let act = Activation::new(hv, opts, a_log, dt_bias)?;
    let g = g
        .iter()
        .enumerate()
        .map(|(i, &x)| act.g(x, i % hv))
        .collect();
    let beta = beta.iter().map(|&x| act.beta(x)).collect();
    Ok((g, beta))
}
