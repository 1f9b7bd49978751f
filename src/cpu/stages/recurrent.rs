use rayon::prelude::*;

use crate::cpu::{axpy, dot};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// The gated delta rule token by token, updating `state` in place (`[N, HV, K, V]`, or
/// `[N, HV, V, K]` with `v_first`); returns `o` `[B, T, HV, V]`. `g` and `beta` are the
/// effective (activated) values.
#[allow(clippy::too_many_arguments)]
pub fn recurrent(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    v_first: bool,
    scale: f32,
) -> Result<Vec<f32>> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    check_len("q", q.len(), p.tokens() * nh * dk)?;
    check_len("k", k.len(), p.tokens() * nh * dk)?;
    p.check("v", v.len(), dv)?;
    p.check("g", g.len(), 1)?;
    p.check("beta", beta.len(), 1)?;
    check_len("state", state.len(), p.num_seqs() * hv * kv)?;

    let outs: Vec<Vec<f32>> = state
        .par_chunks_mut(kv)
        .enumerate()
        .map(|(task, s)| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
            let (t0, t1) = p.seqs()[n];
            let mut o = vec![0f32; (t1 - t0) * dv];
            let mut u = vec![0f32; dv];
            for t in t0..t1 {
                let tj = t * hv + j;
                let decay = g[tj].exp();
                let k_row = &k[(t * nh + kh) * dk..][..dk];
                let q_row = &q[(t * nh + kh) * dk..][..dk];
                let v_row = &v[tj * dv..][..dv];
                let o_row = &mut o[(t - t0) * dv..][..dv];
                if v_first {
                    for c in 0..dv {
                        let row = &mut s[c * dk..][..dk];
                        row.iter_mut().for_each(|x| *x *= decay);
                        let uc = beta[tj] * (v_row[c] - dot(row, k_row));
                        axpy(row, uc, k_row);
                        o_row[c] = scale * dot(row, q_row);
                    }
                } else {
                    // u = beta (v - S^T k), with S decayed first.
                    u.iter_mut().for_each(|x| *x = 0.0);
                    for (r, &kr) in k_row.iter().enumerate() {
                        let row = &mut s[r * dv..][..dv];
                        row.iter_mut().for_each(|x| *x *= decay);
                        axpy(&mut u, kr, row);
                    }
                    for (uc, &vc) in u.iter_mut().zip(v_row) {
                        *uc = beta[tj] * (vc - *uc);
                    }
                    for r in 0..dk {
                        let row = &mut s[r * dv..][..dv];
                        axpy(row, k_row[r], &u);
                        axpy(o_row, scale * q_row[r], row);
                    }
                }
            }
            o
        })
        .collect();

    let mut o = vec![0f32; p.tokens() * hv * dv];
    for (task, out) in outs.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let t0 = p.seqs()[n].0;
        crate::cpu::scatter_rows(&mut o, &out, t0, hv, j, dv);
    }
    Ok(o)
}
