use rayon::prelude::*;

use super::{chunk_blocks, gather_scalars};
use crate::backend::{Gamma, RESET_LOG_DECAY};
use crate::error::Result;
use crate::problem::Problem;

/// `gamma` and `seg` of one chunk of one head from its gates `g` (see [`Gamma`]).
pub(crate) fn cumsum_block(g: &[f32], gamma: &mut [f32], seg: &mut [f32]) {
    let (mut acc, mut resets) = (0f32, 0f32);
    for ((&x, gm), sg) in g.iter().zip(gamma.iter_mut()).zip(seg.iter_mut()) {
        if x < RESET_LOG_DECAY {
            acc = 0.0;
            resets += 1.0;
        } else {
            acc += x;
        }
        *gm = acc;
        *sg = resets;
    }
}

/// `gamma = cumsum(g)` within each chunk, restarted at hard resets (see [`Gamma`]).
pub fn chunk_local_cumsum(p: &Problem, g: &[f32]) -> Result<Gamma<Vec<f32>>> {
    p.check("g", g.len(), 1)?;
    let hv = p.v_heads;
    let mut gamma = vec![0f32; g.len()];
    let mut seg = vec![0f32; g.len()];
    chunk_blocks(p, &mut gamma, hv)
        .into_par_iter()
        .zip(chunk_blocks(p, &mut seg, hv))
        .for_each(|((c, gamma), (_, seg))| {
            let (mut gm, mut sg) = (vec![0f32; c.len], vec![0f32; c.len]);
            for j in 0..hv {
                cumsum_block(&gather_scalars(g, &c, hv, j), &mut gm, &mut sg);
                for i in 0..c.len {
                    gamma[i * hv + j] = gm[i];
                    seg[i * hv + j] = sg[i];
                }
            }
        });
    Ok(Gamma { gamma, seg })
}
