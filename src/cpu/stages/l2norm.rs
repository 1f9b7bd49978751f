use rayon::prelude::*;

use crate::error::{check_len, Result};

/// Scales one row to `x / sqrt(sum x^2 + 1e-6)` (FLA's l2norm; the epsilon inside the root keeps
/// an all-zero row finite).
pub(crate) fn l2norm_row(row: &mut [f32]) {
    // The squares summed in eight interleaved lanes, combined in a fixed order: one running sum
    // waits on each add's latency (about 5 us for the 32 rows of a decode step at K = 128, the
    // step's largest serial part), and a fixed order keeps every thread count's bits alike.
    let mut acc = [0f32; 8];
    let rows = row.chunks_exact(8);
    let rest = rows.remainder();
    for c in rows {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    for (a, &x) in acc.iter_mut().zip(rest) {
        *a += x * x;
    }
    let sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    let inv = 1.0 / (sum + 1e-6).sqrt();
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
