use rayon::prelude::*;

use crate::backend::{ChunkStates, Gamma, Wy};
use crate::cpu::{gather_rows, gemm, with_scaled_rows, Decays};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `v_new = u - w h` for one chunk of one head: `w` is `n x K`, `u` and `v_new` `n x V`, `state`
/// (h) `K x V`.
pub(crate) fn v_new_block(
    w: &[f32],
    u: &[f32],
    state: &[f32],
    dk: usize,
    dv: usize,
    v_new: &mut [f32],
) {
    v_new.copy_from_slice(u);
    gemm(
        u.len() / dv.max(1),
        dk,
        dv,
        -1.0,
        w,
        false,
        state,
        false,
        1.0,
        v_new,
    );
}

/// `h <- e^(gamma_last) h + sum_i e^(gamma_last - gamma_i) k_i v_new_i^T` for one chunk of one
/// head: `k` is `n x K`, `v_new` `n x V`, `state` `K x V`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn advance_block(
    k: &[f32],
    v_new: &[f32],
    d: &Decays,
    dk: usize,
    dv: usize,
    state: &mut [f32],
) {
    let n = d.len();
    if n == 0 {
        return;
    }
    let last = n - 1;
    with_scaled_rows(
        v_new,
        dv,
        |i| d.decay(last, i),
        |scaled| {
            gemm(
                dk,
                n,
                dv,
                1.0,
                k,
                true,
                scaled,
                false,
                d.decay0(last),
                state,
            );
        },
    );
}

/// The sequential pass over each sequence's chunks, parallel over (sequence, value head).
///
/// For each chunk, with `h` the state entering it: `v_new = u - w h`, then
/// `h <- e^(gamma_last) h + sum_i e^(gamma_last - gamma_i) k_i v_new_i^T`.
pub fn chunk_state(
    p: &Problem,
    k: &[f32],
    wy: &Wy<Vec<f32>>,
    gamma: &Gamma<Vec<f32>>,
    h0: Option<&[f32]>,
) -> Result<ChunkStates<Vec<f32>>> {
    let (h, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("w", wy.w.len(), dk)?;
    p.check("u", wy.u.len(), dv)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    p.check("lo", gamma.lo.len(), 1)?;
    if let Some(h0) = h0 {
        check_len("initial_state", h0.len(), p.num_seqs() * hv * kv)?;
    }

    // One task per (sequence, head): its chunk states, its v_new rows, its final state.
    let tasks: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..p.num_seqs() * hv)
        .into_par_iter()
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            let mut state = match h0 {
                Some(h0) => h0[task * kv..][..kv].to_vec(),
                None => vec![0f32; kv],
            };
            let chunks = &p.chunks()[p.seq_chunks(n)];
            let (s0, s1) = p.seqs()[n];
            let mut hs = Vec::with_capacity(chunks.len() * kv);
            let mut v_new = vec![0f32; (s1 - s0) * dv];
            for c in chunks {
                hs.extend_from_slice(&state);
                let d = Decays::gather(gamma, c, hv, j);
                let vn = &mut v_new[(c.start - s0) * dv..][..c.len * dv];
                v_new_block(
                    &gather_rows(&wy.w, c, hv, j, dk),
                    &gather_rows(&wy.u, c, hv, j, dv),
                    &state,
                    dk,
                    dv,
                    vn,
                );
                advance_block(
                    &gather_rows(k, c, h, p.qk_head(j), dk),
                    vn,
                    &d,
                    dk,
                    dv,
                    &mut state,
                );
            }
            (hs, v_new, state)
        })
        .collect();

    let mut h_all = vec![0f32; p.chunks().len() * hv * kv];
    let mut v_new = vec![0f32; p.tokens() * hv * dv];
    let mut final_state = vec![0f32; p.num_seqs() * hv * kv];
    for (task, (hs, vn, fin)) in tasks.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let first_chunk = p.seq_chunks(n).start;
        for (ci, hc) in hs.chunks_exact(kv).enumerate() {
            h_all[((first_chunk + ci) * hv + j) * kv..][..kv].copy_from_slice(hc);
        }
        let s0 = p.seqs()[n].0;
        crate::cpu::scatter_rows(&mut v_new, &vn, s0, hv, j, dv);
        final_state[task * kv..][..kv].copy_from_slice(&fin);
    }
    Ok(ChunkStates {
        h: h_all,
        v_new,
        final_state,
    })
}
