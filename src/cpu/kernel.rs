//! The register-blocked AVX-512 product behind [`super::blocks::gemm`] on CPUs that have it.
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows of an output tile.
pub(crate) const MR: usize = 8;
/// Columns of an output tile (two zmm registers).
pub(crate) const NR: usize = 32;

/// Whether [`gemm_avx512`] may be called on this CPU.
#[inline]
pub(crate) fn have_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The operands of one product: `a` is read at `a[i * rsa + p * csa]`, `b` is row-major `k x n`
/// with row stride `ldb`, `c` row-major `m x n` with row stride `ldc`.
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) alpha: f32,
    pub(crate) a: *const f32,
    pub(crate) rsa: usize,
    pub(crate) csa: usize,
    pub(crate) b: *const f32,
    pub(crate) ldb: usize,
    pub(crate) beta: f32,
    pub(crate) c: *mut f32,
    pub(crate) ldc: usize,
    /// `a` is lower triangular (`a[i, p] == 0` for `p > i`, `k >= m`): a tile of rows `i0..i1`
    /// sums over `p < i1` only.
    pub(crate) lower: bool,
}

/// `c = alpha a b + beta c` (see [`Operands`]); with `beta == 0`, `c` is only written.
///
/// # Safety
/// The CPU must support AVX-512F ([`have_avx512`]), and every element the strides reach for
/// `i < m`, `p < k`, `j < n` must lie inside the allocations `a`, `b` and `c` point into, with `c`
/// aliasing neither input.
#[cfg(target_arch = "x86_64")]
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
            let kk = if o.lower { (i0 + rows).min(o.k) } else { o.k };
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
#[cfg(target_arch = "x86_64")]
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (mut a, mut b) = (t.a, t.b);
    for _ in 0..t.kk {
        let b0 = _mm512_maskz_loadu_ps(t.m0, b);
        let b1 = _mm512_maskz_loadu_ps(t.m1, b.add(16));
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*a.add(r * t.rsa));
            acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
        }
        a = a.add(t.csa);
        b = b.add(t.ldb);
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
                _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mask, c.add(16 * h)), ab)
            };
            _mm512_mask_storeu_ps(c.add(16 * h), mask, out);
        }
    }
}
