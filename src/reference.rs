//! The oracle: the definition of the gated delta rule as a float64 recurrence, token by token,
//! with every option. Slow and obviously right; every test compares against it.

use rayon::prelude::*;

use crate::error::Result;
use crate::options::Options;
use crate::problem::{Inputs, Problem};

/// The exact answer in float64.
#[derive(Clone, Debug)]
pub struct Reference {
    /// `[B, T, HV, V]`.
    pub o: Vec<f64>,
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
    pub final_state: Vec<f64>,
}

fn to_f64(t: &crate::Tensor<'_>) -> Vec<f64> {
    t.to_f32().iter().map(|&x| x as f64).collect()
}

fn l2norm_rows(x: &mut [f64], dim: usize) {
    for row in x.chunks_exact_mut(dim) {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The inputs in float64 after the optional l2norm of q and k and the gate and beta
/// activations: what the recurrence consumes.
#[derive(Clone, Debug)]
pub struct Activated64 {
    /// `[B, T, H, K]`.
    pub q: Vec<f64>,
    /// `[B, T, H, K]`.
    pub k: Vec<f64>,
    /// `[B, T, HV, V]`.
    pub v: Vec<f64>,
    /// The effective log decay `[B, T, HV]`.
    pub g: Vec<f64>,
    /// The effective beta `[B, T, HV]`.
    pub beta: Vec<f64>,
}

/// `x` in float64, activated as `opts` say (see [`Activated64`]).
pub fn activate(x: &Inputs<'_>, opts: &Options) -> Result<Activated64> {
    let p = Problem::from_inputs(x, opts)?;
    let (hv, dk) = (p.v_heads(), p.dk());
    let (mut q, mut k, v) = (to_f64(&x.q), to_f64(&x.k), to_f64(&x.v));
    if opts.use_qk_l2norm {
        l2norm_rows(&mut q, dk);
        l2norm_rows(&mut k, dk);
    }
    let mut g = to_f64(&x.g);
    if opts.gate_in_kernel {
        let (a_log, dt_bias) = match (&x.a_log, &x.dt_bias) {
            (Some(a), Some(d)) => (to_f64(a), to_f64(d)),
            _ => {
                unreachable!("Problem::from_inputs requires A_log and dt_bias with gate_in_kernel")
            }
        };
        for (i, gi) in g.iter_mut().enumerate() {
            let j = i % hv;
            *gi = -a_log[j].exp() * softplus(*gi + dt_bias[j]);
        }
    }
    let mut beta = to_f64(&x.beta);
    if opts.beta_is_logits {
        let m = if opts.allow_neg_eigval { 2.0 } else { 1.0 };
        beta.iter_mut().for_each(|b| *b = m / (1.0 + (-*b).exp()));
    }
    Ok(Activated64 { q, k, v, g, beta })
}

/// Runs the definition on `x` with `opts`:
/// per sequence and value head j, `S <- e^g S; u = beta (v - S^T k); S <- S + k u^T;
/// o = S^T (scale q)`, after the optional l2norm, beta and gate activations.
pub fn reference(x: &Inputs<'_>, opts: &Options) -> Result<Reference> {
    let p = Problem::from_inputs(x, opts)?;
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let Activated64 { q, k, v, g, beta } = activate(x, opts)?;
    let scale = opts
        .scale
        .map(|s| s as f64)
        .unwrap_or(1.0 / (dk as f64).sqrt());
    let kv = dk * dv;
    // Index of the state element (r, c) (key r, value c) in the caller's layout.
    let at = |r: usize, c: usize| {
        if opts.state_v_first {
            c * dk + r
        } else {
            r * dv + c
        }
    };
    let h0 = x.initial_state.as_ref().map(to_f64);

    let results: Vec<(Vec<f64>, Vec<f64>)> = (0..p.num_seqs() * hv)
        .into_par_iter()
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
            // s[r * dv + c], K-major.
            let mut s = vec![0f64; kv];
            if let Some(h0) = &h0 {
                for r in 0..dk {
                    for c in 0..dv {
                        s[r * dv + c] = h0[task * kv + at(r, c)];
                    }
                }
            }
            let (t0, t1) = p.seqs()[n];
            let mut o = vec![0f64; (t1 - t0) * dv];
            for t in t0..t1 {
                let tj = t * hv + j;
                let decay = g[tj].exp();
                s.iter_mut().for_each(|x| *x *= decay);
                let kt = &k[(t * nh + kh) * dk..][..dk];
                let qt = &q[(t * nh + kh) * dk..][..dk];
                for c in 0..dv {
                    let sk: f64 = (0..dk).map(|r| s[r * dv + c] * kt[r]).sum();
                    let u = beta[tj] * (v[tj * dv + c] - sk);
                    for r in 0..dk {
                        s[r * dv + c] += kt[r] * u;
                    }
                    o[(t - t0) * dv + c] =
                        scale * (0..dk).map(|r| s[r * dv + c] * qt[r]).sum::<f64>();
                }
            }
            let mut fin = vec![0f64; kv];
            for r in 0..dk {
                for c in 0..dv {
                    fin[at(r, c)] = s[r * dv + c];
                }
            }
            (o, fin)
        })
        .collect();

    let mut o = vec![0f64; p.tokens() * hv * dv];
    let mut final_state = vec![0f64; p.num_seqs() * hv * kv];
    for (task, (ot, fin)) in results.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let t0 = p.seqs()[n].0;
        crate::cpu::scatter_rows(&mut o, &ot, t0, hv, j, dv);
        final_state[task * kv..][..kv].copy_from_slice(&fin);
    }
    Ok(Reference { o, final_state })
}

/// `||out - ref|| / ||ref||` over whole tensors (0 when both are zero; infinite on a length
/// mismatch or a non-finite output).
pub fn rel_l2(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in out.iter().zip(reference) {
        let d = a as f64 - b;
        num += d * d;
        den += b * b;
    }
    if !num.is_finite() {
        return f64::INFINITY;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}
