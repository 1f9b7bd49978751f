use rayon::prelude::*;

use crate::backend::{Gamma, RESET_LOG_DECAY};
use crate::cpu::{chunk_blocks, gather_scalars, Decays};
use crate::error::Result;
use crate::problem::Problem;

/// `gamma`, `lo` and `seg` of one chunk of one head from its gates `g` (see [`Gamma`]).
pub(crate) fn cumsum_block(g: &[f32]) -> Decays {
    let n = g.len();
    let mut d = Decays {
        gamma: vec![0.0; n],
        lo: vec![0.0; n],
        seg: vec![0.0; n],
    };
    let (mut acc, mut err, mut resets) = (0f32, 0f32, 0f32);
    for (t, &x) in g.iter().enumerate() {
        if x < RESET_LOG_DECAY {
            (acc, err) = (0.0, 0.0);
            resets += 1.0;
        } else {
            // TwoSum: `s` is the rounded sum, `(acc - (s - b)) + (x - b)` exactly what the
            // rounding lost.
            let s = acc + x;
            let b = s - acc;
            err += (acc - (s - b)) + (x - b);
            acc = s;
        }
        d.gamma[t] = acc;
        d.lo[t] = err;
        d.seg[t] = resets;
    }
    d
}

/// `gamma = cumsum(g)` within each chunk, with its error term, restarted at hard resets (see
/// [`Gamma`]).
pub fn chunk_local_cumsum(p: &Problem, g: &[f32]) -> Result<Gamma<Vec<f32>>> {
    p.check("g", g.len(), 1)?;
    let hv = p.v_heads();
    let mut gamma = vec![0f32; g.len()];
    let mut lo = vec![0f32; g.len()];
    let mut seg = vec![0f32; g.len()];
    chunk_blocks(p, &mut gamma, hv)
        .into_par_iter()
        .zip(chunk_blocks(p, &mut lo, hv))
        .zip(chunk_blocks(p, &mut seg, hv))
        .for_each(|(((c, gamma), (_, lo)), (_, seg))| {
            for j in 0..hv {
                let d = cumsum_block(&gather_scalars(g, &c, hv, j));
                for i in 0..c.len {
                    gamma[i * hv + j] = d.gamma[i];
                    lo[i * hv + j] = d.lo[i];
                    seg[i * hv + j] = d.seg[i];
                }
            }
        });
    Ok(Gamma { gamma, lo, seg })
}
