use rayon::prelude::*;

use super::{chunk_blocks, decay, dot};
use crate::backend::Gamma;
use crate::error::Result;
use crate::problem::Problem;

/// `A_strict[i, j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j)` for i > j within a chunk, zero on
/// and above the diagonal; layout `[B, T, HV, BT]`.
pub fn chunk_scaled_dot_kkt(
    p: &Problem,
    k: &[f32],
    beta: &[f32],
    gamma: &Gamma<Vec<f32>>,
) -> Result<Vec<f32>> {
    let (h, hv, dk, bt) = (p.heads, p.v_heads, p.dk, p.chunk_size);
    crate::error::check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("beta", beta.len(), 1)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    let (gm, sg) = (&gamma.gamma, &gamma.seg);
    let mut a = vec![0f32; p.tokens() * hv * bt];
    chunk_blocks(p, &mut a, hv * bt)
        .into_par_iter()
        .for_each(|(c, a)| {
            for j in 0..hv {
                let kh = p.qk_head(j);
                let krow = |i: usize| &k[((c.start + i) * h + kh) * dk..][..dk];
                let gi = |i: usize| (c.start + i) * hv + j;
                for r in 1..c.len {
                    let (tr, kr) = (gi(r), krow(r));
                    let row = &mut a[(r * hv + j) * bt..][..bt];
                    for (col, x) in row.iter_mut().enumerate().take(r) {
                        let tc = gi(col);
                        *x = beta[tr] * dot(kr, krow(col)) * decay(gm[tr], sg[tr], gm[tc], sg[tc]);
                    }
                }
            }
        });
    Ok(a)
}
