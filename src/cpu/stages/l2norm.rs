use rayon::prelude::*;

use crate::error::{check_len, Result};

/// Scales one row to `x / sqrt(sum x^2 + 1e-6)` (FLA's l2norm; the epsilon inside the root keeps
/// an all-zero row finite).
pub(crate) fn l2norm_row(row: &mut [f32]) {
    let inv = 1.0 / (crate::cpu::dot(row, row) + 1e-6).sqrt();
    row.iter_mut().for_each(|v| *v *= inv);
}

/// `x / sqrt(sum x^2 + 1e-6)` over each of `rows` rows of `dim` elements.
pub fn l2norm(x: &[f32], rows: usize, dim: usize) -> Result<Vec<f32>> {
    check_len("x", x.len(), rows.saturating_mul(dim))?;
    let mut out = x.to_vec();
    if dim > 0 {
        out.par_chunks_mut(dim).for_each(l2norm_row);
    }
    Ok(out)
}
