use rayon::prelude::*;

use crate::backend::Gamma;
use crate::cpu::{causal_dots, chunk_blocks, gather_rows, gather_scalars, transpose, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `A_strict` of one chunk of one head (`n x n`, row-major, zero on and above the diagonal):
/// `A[i, l] = beta_i (k_i . k_l) exp(gamma_i - gamma_l)` for i > l, from `kk` (the chunk's
/// [`causal_dots`] of `k` with itself, shared by the value heads of one qk head) and `pairs` (the
/// chunk's [`Decays::pairs`]).
pub(crate) fn kkt_block(kk: &[f32], beta: &[f32], pairs: &[f32], a: &mut [f32]) {
    let n = beta.len();
    for (i, ((row, dots), decays)) in a[..n * n]
        .chunks_exact_mut(n)
        .zip(kk.chunks_exact(n))
        .zip(pairs.chunks_exact(n))
        .enumerate()
    {
        for ((x, &dot), &decay) in row[..i].iter_mut().zip(dots).zip(decays) {
            *x = dot * beta[i] * decay;
        }
        row[i..].fill(0.0);
    }
}

/// `A_strict[i, j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j)` for i > j within a chunk, zero on
/// and above the diagonal; layout `[B, T, HV, BT]`.
pub fn chunk_scaled_dot_kkt(
    p: &Problem,
    k: &[f32],
    beta: &[f32],
    gamma: &Gamma<Vec<f32>>,
) -> Result<Vec<f32>> {
    let (h, hv, dk, bt) = (p.heads(), p.v_heads(), p.dk(), p.chunk_size());
    check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("beta", beta.len(), 1)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    p.check("lo", gamma.lo.len(), 1)?;
    let mut a = vec![0f32; p.tokens() * hv * bt];
    chunk_blocks(p, &mut a, hv * bt)
        .into_par_iter()
        .for_each(|(c, a)| {
            let n = c.len;
            let (mut block, mut pairs, mut kk, mut kt) = (
                vec![0f32; n * n],
                vec![0f32; n * n],
                vec![0f32; n * n],
                vec![0f32; n * dk],
            );
            for j in 0..hv {
                let kc = gather_rows(k, &c, h, p.qk_head(j), dk);
                transpose(&kc, n, dk, &mut kt);
                causal_dots(&kc, &kt, n, dk, &mut kk);
                let b = gather_scalars(beta, &c, hv, j);
                Decays::gather(gamma, &c, hv, j).pairs(&mut pairs);
                kkt_block(&kk, &b, &pairs, &mut block);
                for i in 0..n {
                    a[(i * hv + j) * bt..][..n].copy_from_slice(&block[i * n..][..n]);
                }
            }
        });
    Ok(a)
}
