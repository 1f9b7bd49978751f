use rayon::prelude::*;

use super::{axpy, chunk_blocks, decay, decay0, dot};
use crate::backend::Gamma;
use crate::error::{check_len, Result};
use crate::problem::Problem;

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
    let (nh, hv, dk, dv) = (p.heads, p.v_heads, p.dk, p.dv);
    let kv = p.state_len();
    check_len("q", q.len(), p.tokens() * nh * dk)?;
    check_len("k", k.len(), p.tokens() * nh * dk)?;
    p.check("v_new", v_new.len(), dv)?;
    check_len("h", h.len(), p.chunks().len() * hv * kv)?;
    p.check("gamma", gamma.gamma.len(), 1)?;
    p.check("seg", gamma.seg.len(), 1)?;
    let (gm, sg) = (&gamma.gamma, &gamma.seg);
    let chunk_index = |start: usize| p.chunks().partition_point(|c| c.start < start);
    let mut o = vec![0f32; p.tokens() * hv * dv];
    chunk_blocks(p, &mut o, hv * dv)
        .into_par_iter()
        .for_each(|(c, o)| {
            let ci = chunk_index(c.start);
            for j in 0..hv {
                let kh = p.qk_head(j);
                let state = &h[(ci * hv + j) * kv..][..kv];
                for i in 0..c.len {
                    let ti = (c.start + i) * hv + j;
                    let q_row = &q[((c.start + i) * nh + kh) * dk..][..dk];
                    let out = &mut o[(i * hv + j) * dv..][..dv];
                    let d0 = decay0(gm[ti], sg[ti]);
                    if d0 != 0.0 {
                        for (r, &qr) in q_row.iter().enumerate() {
                            axpy(out, d0 * qr, &state[r * dv..][..dv]);
                        }
                    }
                    for l in 0..=i {
                        let tl = (c.start + l) * hv + j;
                        let d = decay(gm[ti], sg[ti], gm[tl], sg[tl]);
                        if d != 0.0 {
                            let qk = dot(q_row, &k[((c.start + l) * nh + kh) * dk..][..dk]);
                            axpy(out, d * qk, &v_new[tl * dv..][..dv]);
                        }
                    }
                    out.iter_mut().for_each(|x| *x *= scale);
                }
            }
        });
    Ok(o)
}
