use rayon::prelude::*;

use super::{axpy, chunk_blocks, decay0};
use crate::backend::{Gamma, Wy};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `w = A_inv (beta e^gamma k)` and `u = A_inv (beta v)`, chunk by chunk.
pub fn recompute_w_u(
    p: &Problem,
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    gamma: &Gamma<Vec<f32>>,
    a_inv: &[f32],
) -> Result<Wy<Vec<f32>>> {
    let (h, hv, dk, dv, bt) = (p.heads, p.v_heads, p.dk, p.dv, p.chunk_size);
    check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("v", v.len(), dv)?;
    p.check("beta", beta.len(), 1)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    p.check("A_inv", a_inv.len(), bt)?;
    let mut w = vec![0f32; p.tokens() * hv * dk];
    let mut u = vec![0f32; p.tokens() * hv * dv];
    chunk_blocks(p, &mut w, hv * dk)
        .into_par_iter()
        .zip(chunk_blocks(p, &mut u, hv * dv))
        .for_each(|((c, w), (_, u))| {
            for j in 0..hv {
                let kh = p.qk_head(j);
                for i in 0..c.len {
                    let a_row = &a_inv[((c.start + i) * hv + j) * bt..][..=i];
                    let w_row = &mut w[(i * hv + j) * dk..][..dk];
                    for (l, &a) in a_row.iter().enumerate() {
                        let t = (c.start + l) * hv + j;
                        let coef = a * beta[t] * decay0(gamma.gamma[t], gamma.seg[t]);
                        axpy(w_row, coef, &k[((c.start + l) * h + kh) * dk..][..dk]);
                    }
                    let u_row = &mut u[(i * hv + j) * dv..][..dv];
                    for (l, &a) in a_row.iter().enumerate() {
                        let t = (c.start + l) * hv + j;
                        axpy(u_row, a * beta[t], &v[t * dv..][..dv]);
                    }
                }
            }
        });
    Ok(Wy { w, u })
}
