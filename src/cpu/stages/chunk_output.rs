use rayon::prelude::*;

use crate::backend::Gamma;
use crate::cpu::{causal_dots, chunk_blocks, gather_rows, gemm, gemm_causal, transpose, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `o` (`n x V`) of one chunk of one head: `q` is `n x K`, `qk` the chunk's [`causal_dots`] of
/// `q` with `k` (shared by the value heads of one qk head), `v_new` `n x V`, `state` the `K x V`
/// state entering the chunk, `pairs` the chunk's [`Decays::pairs`]; `p` is `n x n` scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_block(
    q: &[f32],
    qk: &[f32],
    v_new: &[f32],
    state: &[f32],
    d: &Decays,
    pairs: &[f32],
    scale: f32,
    p: &mut [f32],
    o: &mut [f32],
) {
    let n = d.len();
    if n == 0 {
        return;
    }
    let (dk, dv) = (q.len() / n, v_new.len() / n);
    // Across chunks: e^gamma_i q_i^T h.
    gemm(n, dk, dv, 1.0, q, false, state, false, 0.0, o);
    for i in 0..n {
        let d0 = d.decay0(i);
        o[i * dv..][..dv].iter_mut().for_each(|x| *x *= d0);
    }
    // Within the chunk: causal(q k^T e^(gamma_i - gamma_l)) v_new, diagonal included.
    for (i, ((row, dots), decays)) in p[..n * n]
        .chunks_exact_mut(n)
        .zip(qk.chunks_exact(n))
        .zip(pairs.chunks_exact(n))
        .enumerate()
    {
        for ((x, &dot), &decay) in row[..=i].iter_mut().zip(dots).zip(decays) {
            *x = dot * decay;
        }
        row[i + 1..].fill(0.0);
    }
    gemm_causal(n, dv, &p[..n * n], v_new, 1.0, o);
    o[..n * dv].iter_mut().for_each(|x| *x *= scale);
}

/// `o_i = scale (e^gamma_i q_i^T h + sum_{j <= i} e^(gamma_i - gamma_j) (q_i . k_j) v_new_j)` for
/// every token i of every chunk, with h the state entering the chunk.
pub fn chunk_output(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v_new: &[f32],
    h: &[f32],
    gamma: &Gamma<Vec<f32>>,
    scale: f32,
) -> Result<Vec<f32>> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    p.check_qk(q, k)?;
    p.check("v_new", v_new.len(), dv)?;
    check_len("h", h.len(), p.chunks().len() * hv * kv)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    p.check("lo", gamma.lo.len(), 1)?;
    let mut o = vec![0f32; p.tokens() * hv * dv];
    chunk_blocks(p, &mut o, hv * dv)
        .into_par_iter()
        .enumerate()
        .for_each(|(ci, (c, o))| {
            let n = c.len;
            let (mut oc, mut pairs, mut kt, mut qk, mut scratch) = (
                vec![0f32; n * dv],
                vec![0f32; n * n],
                vec![0f32; n * dk],
                vec![0f32; n * n],
                vec![0f32; n * n],
            );
            for j in 0..hv {
                let kh = p.qk_head(j);
                let d = Decays::gather(gamma, &c, hv, j);
                d.pairs(&mut pairs);
                let qc = gather_rows(q, &c, nh, kh, dk);
                transpose(&gather_rows(k, &c, nh, kh, dk), n, dk, &mut kt);
                causal_dots(&qc, &kt, n, dk, &mut qk);
                output_block(
                    &qc,
                    &qk,
                    &gather_rows(v_new, &c, hv, j, dv),
                    &h[(ci * hv + j) * kv..][..kv],
                    &d,
                    &pairs,
                    scale,
                    &mut scratch,
                    &mut oc,
                );
                for i in 0..c.len {
                    o[(i * hv + j) * dv..][..dv].copy_from_slice(&oc[i * dv..][..dv]);
                }
            }
        });
    Ok(o)
}
