use rayon::prelude::*;

use crate::backend::Gamma;
use crate::cpu::{chunk_blocks, gather_rows, gemm, gemm_causal, transpose, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `o` (`n x V`) of one chunk of one head: `q` is `n x K`, `kt` (`k^T`) `K x n`, `v_new`
/// `n x V`, `state` the `K x V` state entering the chunk, `pairs` the chunk's [`Decays::pairs`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_block(
    q: &[f32],
    kt: &[f32],
    v_new: &[f32],
    state: &[f32],
    d: &Decays,
    pairs: &[f32],
    scale: f32,
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
    // Within the chunk: causal(q k^T e^(gamma_i - gamma_l)) v_new, diagonal included (`pairs`
    // is zero above it).
    let mut p = vec![0f32; n * n];
    gemm(n, dk, n, 1.0, q, false, kt, false, 0.0, &mut p);
    for (i, (row, decays)) in p.chunks_exact_mut(n).zip(pairs.chunks_exact(n)).enumerate() {
        let (causal, rest) = row.split_at_mut(i + 1);
        causal
            .iter_mut()
            .zip(decays)
            .for_each(|(x, &decay)| *x *= decay);
        rest.fill(0.0);
    }
    gemm_causal(n, dv, &p, v_new, 1.0, o);
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
    check_len("q", q.len(), p.tokens() * nh * dk)?;
    check_len("k", k.len(), p.tokens() * nh * dk)?;
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
            let (mut oc, mut pairs, mut kt) =
                (vec![0f32; n * dv], vec![0f32; n * n], vec![0f32; n * dk]);
            for j in 0..hv {
                let kh = p.qk_head(j);
                let d = Decays::gather(gamma, &c, hv, j);
                d.pairs(&mut pairs);
                transpose(&gather_rows(k, &c, nh, kh, dk), n, dk, &mut kt);
                output_block(
                    &gather_rows(q, &c, nh, kh, dk),
                    &kt,
                    &gather_rows(v_new, &c, hv, j, dv),
                    &h[(ci * hv + j) * kv..][..kv],
                    &d,
                    &pairs,
                    scale,
                    &mut oc,
                );
                for i in 0..c.len {
                    o[(i * hv + j) * dv..][..dv].copy_from_slice(&oc[i * dv..][..dv]);
                }
            }
        });
    Ok(o)
}
