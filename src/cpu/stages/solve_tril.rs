use rayon::prelude::*;

use crate::cpu::{axpy, chunk_blocks};
use crate::error::Result;
use crate::problem::Problem;

/// `A_inv = (I + A)^-1` of one `n x n` strictly lower triangular block (row-major).
///
/// Forward substitution row by row: `A_inv[i] = e_i - sum_{l<i} A[i, l] A_inv[l]`, where row l
/// of the inverse is nonzero only in columns `0..=l`, so each step touches a triangle.
pub(crate) fn solve_tril_block(a: &[f32], n: usize, a_inv: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if n <= 64 && crate::cpu::use_avx512() {
        // SAFETY: AVX-512F is present and n <= 64; the kernel checks the lengths.
        unsafe { crate::cpu::kernel::solve_tril_avx512(a, n, a_inv) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if n <= 64 && crate::cpu::use_avx2() {
        // SAFETY: AVX2 and FMA are present and n <= 64; the kernel checks the lengths.
        unsafe { crate::cpu::kernel_avx2::solve_tril_avx2(a, n, a_inv) };
        return;
    }
    solve_tril_portable(a, n, a_inv)
}

/// [`solve_tril_block`] without vector instructions.
pub(crate) fn solve_tril_portable(a: &[f32], n: usize, a_inv: &mut [f32]) {
    a_inv.fill(0.0);
    for i in 0..n {
        let (done, row) = a_inv.split_at_mut(i * n);
        let row = &mut row[..n];
        row[i] = 1.0;
        for (l, &x) in a[i * n..][..i].iter().enumerate() {
            if x != 0.0 {
                axpy(&mut row[..=l], -x, &done[l * n..][..=l]);
            }
        }
    }
}

/// `A_inv = (I + A_strict)^-1` for every chunk block of `A_strict` (`[B, T, HV, BT]`, row stride
/// `HV * BT`). A short last chunk is a smaller block; columns past it stay zero.
pub fn solve_tril(p: &Problem, a_strict: &[f32]) -> Result<Vec<f32>> {
    let (hv, bt) = (p.v_heads(), p.chunk_size());
    p.check("A_strict", a_strict.len(), bt)?;
    let mut a_inv = vec![0f32; a_strict.len()];
    chunk_blocks(p, &mut a_inv, hv * bt)
        .into_par_iter()
        .for_each(|(c, inv)| {
            let n = c.len;
            let (mut a, mut x) = (vec![0f32; n * n], vec![0f32; n * n]);
            for j in 0..hv {
                for i in 0..n {
                    a[i * n..][..n]
                        .copy_from_slice(&a_strict[((c.start + i) * hv + j) * bt..][..n]);
                }
                solve_tril_block(&a, n, &mut x);
                for i in 0..n {
                    inv[(i * hv + j) * bt..][..n].copy_from_slice(&x[i * n..][..n]);
                }
            }
        });
    Ok(a_inv)
}
