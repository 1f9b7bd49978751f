//! The AVX-512 kernels of the CPU path, used where the CPU has AVX-512F (checked at run time;
//! the callers fall back to portable code): the register-blocked product behind
//! [`super::blocks::gemm`], the decays of a chunk with a vector `exp`, the triangular solve and
//! the transpose of `k`.
//!
//! A chunk's products are small (64 x 128 x 128 at most for the usual shapes), so packing both
//! operands, as a general sgemm does, costs a noticeable share of the work. Here `b` is read in
//! place as row-major `k x n` (a transposed `b` is copied once into that form by the caller) and
//! each element of `a` is broadcast from where it lies, so only strides differ between `a` and
//! `a^T`. The output is walked in tiles of [`MR`] rows by [`NR`] columns held in 16 zmm
//! accumulators; a column panel of `b` (`k x 32`, 16 KiB at k = 128) stays in L1 while the row
//! tiles pass over it.
//!
//! Every element of `c` is `alpha * (sum over p in order of a[i, p] b[p, j]) + beta * c`, the sum
//! a chain of FMAs: the result depends on the operands alone, never on alignment or threads.

use std::arch::x86_64::*;

use super::blocks::Operands;

/// Rows of an output tile.
pub(crate) const MR: usize = 8;
/// Columns of an output tile (two zmm registers).
pub(crate) const NR: usize = 32;

/// Whether [`gemm_avx512`] may be called on this CPU.
#[inline]
pub(crate) fn have_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f")
}

/// `c = alpha a b + beta c` (see [`Operands`]); with `beta == 0`, `c` is only written.
///
/// # Safety
/// The CPU must support AVX-512F ([`have_avx512`]), and every element the strides reach for
/// `i < m`, `p < k`, `j < n` must lie inside the allocations `a`, `b` and `c` point into, with `c`
/// aliasing neither input.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gemm_avx512(o: &Operands) {
    let mut j0 = 0;
    while j0 < o.n {
        let cols = (o.n - j0).min(NR);
        // Lanes of the two column vectors that lie inside `c`: loads past them read nothing and
        // give zero, stores past them write nothing.
        let m0: __mmask16 = if cols >= 16 {
            0xffff
        } else {
            (1u16 << cols) - 1
        };
        let m1: __mmask16 = if cols >= NR {
            0xffff
        } else if cols > 16 {
            (1u16 << (cols - 16)) - 1
        } else {
            0
        };
        let mut i0 = 0;
        while i0 < o.m {
            let rows = (o.m - i0).min(MR);
            if o.lower_c && i0 + rows <= j0 {
                i0 += rows;
                continue;
            }
            let kk = if o.lower_a { (i0 + rows).min(o.k) } else { o.k };
            let t = Tile {
                kk,
                a: o.a.add(i0 * o.rsa),
                rsa: o.rsa,
                csa: o.csa,
                b: o.b.add(j0),
                ldb: o.ldb,
                c: o.c.add(i0 * o.ldc + j0),
                ldc: o.ldc,
                m0,
                m1,
                alpha: o.alpha,
                beta: o.beta,
            };
            match rows {
                8 => tile::<8>(&t),
                7 => tile::<7>(&t),
                6 => tile::<6>(&t),
                5 => tile::<5>(&t),
                4 => tile::<4>(&t),
                3 => tile::<3>(&t),
                2 => tile::<2>(&t),
                _ => tile::<1>(&t),
            }
            i0 += rows;
        }
        j0 += NR;
    }
}

/// One output tile: its corner in `a`, `b` and `c`, the depth it sums over and its column masks.
struct Tile {
    kk: usize,
    a: *const f32,
    rsa: usize,
    csa: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    m0: __mmask16,
    m1: __mmask16,
    alpha: f32,
    beta: f32,
}

/// `R` rows by up to [`NR`] columns of `c`.
///
/// # Safety
/// As [`gemm_avx512`], for the tile's rows, columns (the masks) and depth.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    // One pointer a row, each stepped on its own (see the AVX2 kernel's `tile`): no chain of
    // dependent address additions carried from step to step.
    let mut a: [*const f32; R] = std::array::from_fn(|r| t.a.wrapping_add(r * t.rsa));
    let mut b = t.b;
    for _ in 0..t.kk {
        let b0 = _mm512_maskz_loadu_ps(t.m0, b);
        // Past the last column, as for the pointers below, only an address is formed (masked
        // lanes read nothing); `wrapping_add` keeps forming it defined.
        let b1 = _mm512_maskz_loadu_ps(t.m1, b.wrapping_add(16));
        for (acc, a) in acc.iter_mut().zip(a.iter_mut()) {
            let x = _mm512_set1_ps(**a);
            acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            *a = a.wrapping_add(t.csa);
        }
        b = b.wrapping_add(t.ldb);
    }
    let alpha = _mm512_set1_ps(t.alpha);
    let beta = _mm512_set1_ps(t.beta);
    for (r, acc) in acc.iter().enumerate() {
        let c = t.c.add(r * t.ldc);
        for (h, (&v, mask)) in acc.iter().zip([t.m0, t.m1]).enumerate() {
            let ab = _mm512_mul_ps(alpha, v);
            let out = if t.beta == 0.0 {
                ab
            } else {
                _mm512_fmadd_ps(
                    beta,
                    _mm512_maskz_loadu_ps(mask, c.wrapping_add(16 * h)),
                    ab,
                )
            };
            _mm512_mask_storeu_ps(c.wrapping_add(16 * h), mask, out);
        }
    }
}

/// `e^x` in 16 lanes, within 2 ulp of the exact value; inf, zero and NaN where `f32::exp` gives
/// them.
///
/// `x = m ln2 + r` with `|r| <= ln2 / 2` (ln2 split in two so `r` is exact), `e^r` by its Taylor
/// series to degree 7 (truncation below 1e-8 relative), then `2^m e^r` in one scaling, which
/// rounds to an infinity or a subnormal as the exact value does.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp16(x: __m512) -> __m512 {
    // e^-104 rounds to zero and e^89 to infinity; `max`/`min` return their second operand when
    // either is NaN, so NaN passes through.
    let x = _mm512_min_ps(
        _mm512_set1_ps(89.0),
        _mm512_max_ps(_mm512_set1_ps(-104.0), x),
    );
    let m =
        _mm512_roundscale_ps::<0x08>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm512_fnmadd_ps(m, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(m, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, m)
}

/// The lanes `0..len` of a 16-lane vector.
#[inline]
fn lanes(len: usize) -> __mmask16 {
    if len >= 16 {
        0xffff
    } else {
        ((1u32 << len) - 1) as __mmask16
    }
}

/// [`super::blocks::Decays::pairs`] 16 lanes at a time: row i of `out` (`n x n`) holds
/// `e^((gamma_i - gamma_l) + (lo_i - lo_l))` for `l <= i` in the same segment, zero elsewhere.
///
/// # Safety
/// The CPU must support AVX-512F; `gamma`, `lo`, `seg` hold `n` values and `out` `n * n`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pairs_avx512(gamma: &[f32], lo: &[f32], seg: &[f32], out: &mut [f32]) {
    let n = gamma.len();
    assert!(lo.len() == n && seg.len() == n && out.len() >= n * n);
    for i in 0..n {
        let (gi, li, si) = (
            _mm512_set1_ps(gamma[i]),
            _mm512_set1_ps(lo[i]),
            _mm512_set1_ps(seg[i]),
        );
        let row = out.as_mut_ptr().add(i * n);
        let mut l = 0;
        // Blocks of sixteen wholly above the diagonal hold zeros: no exponentials for them.
        while l <= i {
            let inside = lanes(n - l);
            let causal = lanes((i + 1).saturating_sub(l));
            let g = _mm512_maskz_loadu_ps(causal, gamma.as_ptr().add(l));
            let lw = _mm512_maskz_loadu_ps(causal, lo.as_ptr().add(l));
            let s = _mm512_maskz_loadu_ps(causal, seg.as_ptr().add(l));
            let same = _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(causal, s, si);
            let x = _mm512_add_ps(_mm512_sub_ps(gi, g), _mm512_sub_ps(li, lw));
            let e = _mm512_maskz_mov_ps(same, exp16(x));
            _mm512_mask_storeu_ps(row.add(l), inside, e);
            l += 16;
        }
        while l < n {
            _mm512_mask_storeu_ps(row.add(l), lanes(n - l), _mm512_setzero_ps());
            l += 16;
        }
    }
}

/// `out` (`cols x rows`) = the transpose of `x` (`rows x cols`, row-major), each run of 16
/// outputs gathered from 16 input rows.
///
/// # Safety
/// The CPU must support AVX-512F; `x` and `out` hold `rows * cols` elements, and
/// `rows * cols < 2^31`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_avx512(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    assert!(x.len() >= rows * cols && out.len() >= rows * cols && rows * cols < 1 << 31);
    let step = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(cols as i32),
    );
    let mut i0 = 0;
    while i0 < rows {
        let m = lanes(rows - i0);
        let src = x.as_ptr().add(i0 * cols);
        for p in 0..cols {
            let v = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, step, src.add(p));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(p * rows + i0), m, v);
        }
        i0 += 16;
    }
}

/// [`super::stages::solve_tril::solve_tril_block`] with each row of `A_inv` held in four zmm
/// registers: the same operations on every element in the same order (a product, then a sum),
/// so the same result, without the short loops.
///
/// # Safety
/// The CPU must support AVX-512F; `n <= 64`, `a` and `a_inv` hold `n * n` values.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn solve_tril_avx512(a: &[f32], n: usize, a_inv: &mut [f32]) {
    assert!(n <= 64 && a.len() >= n * n && a_inv.len() >= n * n);
    let out = a_inv.as_mut_ptr();
    for i in 0..n {
        let mut row = [_mm512_setzero_ps(); 4];
        row[i / 16] = _mm512_maskz_mov_ps(1 << (i % 16), _mm512_set1_ps(1.0));
        for l in 0..i {
            let x = a[i * n + l];
            if x == 0.0 {
                continue;
            }
            let nx = _mm512_set1_ps(-x);
            let done = out.add(l * n);
            // Row l of the inverse is nonzero in columns 0..=l only: only those are updated.
            for (v, acc) in row.iter_mut().enumerate() {
                if 16 * v <= l {
                    let m = lanes(l + 1 - 16 * v);
                    let prod = _mm512_mul_ps(nx, _mm512_maskz_loadu_ps(m, done.add(16 * v)));
                    *acc = _mm512_mask_add_ps(*acc, m, *acc, prod);
                }
            }
        }
        for (v, acc) in row.iter().enumerate() {
            if 16 * v < n {
                _mm512_mask_storeu_ps(out.add(i * n + 16 * v), lanes(n - 16 * v), *acc);
            }
        }
    }
}

/// Copies `len` floats from `src` to `dst`, the 64-byte-aligned part of `dst` by non-temporal
/// stores (no read for ownership of lines written whole, no eviction of the working set), the
/// rest by plain stores. Non-temporal stores are weakly ordered: the caller runs
/// [`store_fence`] before another thread may read what they wrote.
///
/// # Safety
/// The CPU must support AVX-512F; `src` must be valid for `len` reads and `dst` for `len`
/// writes, the two not overlapping.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn copy_streaming(src: *const f32, dst: *mut f32, len: usize) {
    let lead = dst.align_offset(64).min(len);
    std::ptr::copy_nonoverlapping(src, dst, lead);
    let mut i = lead;
    while i + 16 <= len {
        _mm512_stream_ps(dst.add(i), _mm512_loadu_ps(src.add(i)));
        i += 16;
    }
    std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
}

/// Orders the non-temporal stores of [`copy_streaming`] before every later store (`sfence`).
#[inline]
pub(crate) fn store_fence() {
    // SAFETY: `sfence` is part of SSE, which every x86_64 CPU has; it only orders stores.
    unsafe { _mm_sfence() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp16_is_within_two_ulp_and_keeps_the_special_values() {
        if !have_avx512() {
            return;
        }
        crate::cpu::check_exp(|x| {
            let mut out = [0f32; 16];
            // SAFETY: AVX-512F detected; both arrays hold 16 lanes.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp16(_mm512_loadu_ps(x.as_ptr()))) };
            out
        });
    }
}
