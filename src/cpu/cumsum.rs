use rayon::prelude::*;

use super::chunk_blocks;
use crate::backend::{Gamma, RESET_LOG_DECAY};
use crate::error::Result;
use crate::problem::Problem;

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
            for j in 0..hv {
                let (mut acc, mut resets) = (0f32, 0f32);
                for i in 0..c.len {
                    let x = g[(c.start + i) * hv + j];
                    if x < RESET_LOG_DECAY {
                        acc = 0.0;
                        resets += 1.0;
                    } else {
                        acc += x;
                    }
                    gamma[i * hv + j] = acc;
                    seg[i * hv + j] = resets;
                }
            }
        });
    Ok(Gamma { gamma, seg })
}
