use rayon::prelude::*;

use crate::backend::{Gamma, Wy};
use crate::cpu::{chunk_blocks, gather_rows, gather_scalars, gemm_causal, with_scratch, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `w = A_inv (beta e^gamma k)` (`n x K`) and `u = A_inv (beta v)` (`n x V`) of one chunk of one
/// head, from its `n x n` `A_inv`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn wy_block(
    a_inv: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    d: &Decays,
    w: &mut [f32],
    u: &mut [f32],
) {
    let n = beta.len();
    if n == 0 {
        return;
    }
    let (dk, dv) = (k.len() / n, v.len() / n);
    with_scratch(k, |kb| {
        for (l, row) in kb.chunks_exact_mut(dk).enumerate() {
            let coef = beta[l] * d.decay0(l);
            row.iter_mut().for_each(|x| *x *= coef);
        }
        gemm_causal(n, dk, a_inv, kb, 0.0, w);
    });
    with_scratch(v, |vb| {
        for (row, &b) in vb.chunks_exact_mut(dv).zip(beta) {
            row.iter_mut().for_each(|x| *x *= b);
        }
        gemm_causal(n, dv, a_inv, vb, 0.0, u);
    });
}

/// `w = A_inv (beta e^gamma k)` and `u = A_inv (beta v)`, chunk by chunk.
pub fn recompute_w_u(
    p: &Problem,
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    gamma: &Gamma<Vec<f32>>,
    a_inv: &[f32],
) -> Result<Wy<Vec<f32>>> {
    let (h, hv, dk, dv, bt) = (p.heads(), p.v_heads(), p.dk(), p.dv(), p.chunk_size());
    check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("v", v.len(), dv)?;
    p.check("beta", beta.len(), 1)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    p.check("lo", gamma.lo.len(), 1)?;
    p.check("A_inv", a_inv.len(), bt)?;
    let mut w = vec![0f32; p.tokens() * hv * dk];
    let mut u = vec![0f32; p.tokens() * hv * dv];
    chunk_blocks(p, &mut w, hv * dk)
        .into_par_iter()
        .zip(chunk_blocks(p, &mut u, hv * dv))
        .for_each(|((c, w), (_, u))| {
            let n = c.len;
            let (mut a, mut wc, mut uc) =
                (vec![0f32; n * n], vec![0f32; n * dk], vec![0f32; n * dv]);
            for j in 0..hv {
                for i in 0..n {
                    a[i * n..][..n].copy_from_slice(&a_inv[((c.start + i) * hv + j) * bt..][..n]);
                }
                wy_block(
                    &a,
                    &gather_rows(k, &c, h, p.qk_head(j), dk),
                    &gather_rows(v, &c, hv, j, dv),
                    &gather_scalars(beta, &c, hv, j),
                    &Decays::gather(gamma, &c, hv, j),
                    &mut wc,
                    &mut uc,
                );
                for i in 0..n {
                    w[(i * hv + j) * dk..][..dk].copy_from_slice(&wc[i * dk..][..dk]);
                    u[(i * hv + j) * dv..][..dv].copy_from_slice(&uc[i * dv..][..dv]);
                }
            }
        });
    Ok(Wy { w, u })
}
