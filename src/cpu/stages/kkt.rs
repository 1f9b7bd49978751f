use rayon::prelude::*;

use crate::backend::Gamma;
use crate::cpu::{chunk_blocks, gather_rows, gather_scalars, gemm, transpose, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `A_strict` of one chunk of one head (`n x n`, row-major, zero on and above the diagonal):
/// `A[i, l] = beta_i (k_i . k_l) exp(gamma_i - gamma_l)` for i > l. `k` is `n x K`, `kt` its
/// transpose, `pairs` the chunk's [`Decays::pairs`].
pub(crate) fn kkt_block(
    k: &[f32],
    kt: &[f32],
    dk: usize,
    beta: &[f32],
    pairs: &[f32],
    a: &mut [f32],
) {
    let n = beta.len();
    gemm(n, dk, n, 1.0, k, false, kt, false, 0.0, a);
    for (i, (row, decays)) in a[..n * n]
        .chunks_exact_mut(n)
        .zip(pairs.chunks_exact(n))
        .enumerate()
    {
        let (below, rest) = row.split_at_mut(i);
        for (x, &decay) in below.iter_mut().zip(decays) {
            *x = *x * beta[i] * decay;
        }
        rest.fill(0.0);
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
            let (mut block, mut pairs, mut kt) =
                (vec![0f32; n * n], vec![0f32; n * n], vec![0f32; n * dk]);
            for j in 0..hv {
                let kc = gather_rows(k, &c, h, p.qk_head(j), dk);
                transpose(&kc, n, dk, &mut kt);
                let b = gather_scalars(beta, &c, hv, j);
                Decays::gather(gamma, &c, hv, j).pairs(&mut pairs);
                kkt_block(&kc, &kt, dk, &b, &pairs, &mut block);
                for i in 0..n {
                    a[(i * hv + j) * bt..][..n].copy_from_slice(&block[i * n..][..n]);
                }
            }
        });
    Ok(a)
}
