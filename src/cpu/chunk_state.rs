use rayon::prelude::*;

use super::{axpy, decay, decay0};
use crate::backend::{ChunkStates, Gamma, Wy};
use crate::error::{check_len, Result};
use crate::problem::Problem;

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
    let (h, hv, dk, dv) = (p.heads, p.v_heads, p.dk, p.dv);
    let kv = p.state_len();
    check_len("k", k.len(), p.tokens() * h * dk)?;
    p.check("w", wy.w.len(), dk)?;
    p.check("u", wy.u.len(), dv)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    if let Some(h0) = h0 {
        check_len("initial_state", h0.len(), p.num_seqs() * hv * kv)?;
    }
    let (gm, sg) = (&gamma.gamma, &gamma.seg);

    // One task per (sequence, head): its chunk states, its v_new rows, its final state.
    let tasks: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..p.num_seqs() * hv)
        .into_par_iter()
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
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
                let last = (c.start + c.len - 1) * hv + j;
                for i in 0..c.len {
                    let t = c.start + i;
                    let vn = &mut v_new[(t - s0) * dv..][..dv];
                    vn.copy_from_slice(&wy.u[(t * hv + j) * dv..][..dv]);
                    let w_row = &wy.w[(t * hv + j) * dk..][..dk];
                    for (r, &wr) in w_row.iter().enumerate() {
                        axpy(vn, -wr, &state[r * dv..][..dv]);
                    }
                }
                let d_last = decay0(gm[last], sg[last]);
                state.iter_mut().for_each(|x| *x *= d_last);
                for i in 0..c.len {
                    let t = c.start + i;
                    let ti = t * hv + j;
                    let d = decay(gm[last], sg[last], gm[ti], sg[ti]);
                    let k_row = &k[(t * h + kh) * dk..][..dk];
                    let vn = &v_new[(t - s0) * dv..][..dv];
                    for (r, &kr) in k_row.iter().enumerate() {
                        axpy(&mut state[r * dv..][..dv], d * kr, vn);
                    }
                }
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
        for (ti, row) in vn.chunks_exact(dv).enumerate() {
            v_new[((s0 + ti) * hv + j) * dv..][..dv].copy_from_slice(row);
        }
        final_state[task * kv..][..kv].copy_from_slice(&fin);
    }
    Ok(ChunkStates {
        h: h_all,
        v_new,
        final_state,
    })
}
