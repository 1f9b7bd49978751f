use rayon::prelude::*;

use super::{axpy, chunk_blocks};
use crate::error::Result;
use crate::problem::Problem;

/// `A_inv = (I + A_strict)^-1` for every chunk block of `A_strict` (`[B, T, HV, BT]`, row stride
/// `HV * BT`). A short last chunk is a smaller block; columns past it stay zero.
///
/// Forward substitution row by row: `A_inv[i] = e_i - sum_{l<i} A_strict[i, l] A_inv[l]`, where
/// row l of the inverse is nonzero only in columns `0..=l`.
pub fn solve_tril(p: &Problem, a_strict: &[f32]) -> Result<Vec<f32>> {
    let (hv, bt) = (p.v_heads, p.chunk_size);
    p.check("A_strict", a_strict.len(), bt)?;
    let mut a_inv = vec![0f32; a_strict.len()];
    chunk_blocks(p, &mut a_inv, hv * bt)
        .into_par_iter()
        .for_each(|(c, inv)| {
            let n = c.len;
            for j in 0..hv {
                let mut x = vec![0f32; n * n];
                for i in 0..n {
                    let a_row = &a_strict[((c.start + i) * hv + j) * bt..][..i];
                    let (done, row) = x.split_at_mut(i * n);
                    let row = &mut row[..n];
                    row[i] = 1.0;
                    for (l, &a) in a_row.iter().enumerate() {
                        if a != 0.0 {
                            axpy(&mut row[..=l], -a, &done[l * n..][..=l]);
                        }
                    }
                    inv[(i * hv + j) * bt..][..n].copy_from_slice(row);
                }
            }
        });
    Ok(a_inv)
}
