//! The AVX2 product kernel of the CPU path, used where the CPU has AVX2 and FMA but not
//! AVX-512F (checked at run time): [`super::kernel`]'s register-blocked product with 256-bit
//! vectors, behind [`super::blocks::gemm`].
//!
//! The same shape as the AVX-512 one: `b` read in place as row-major `k x n`, each element of
//! `a` broadcast from where it lies, no packing (a chunk's products are 64 x 128 x 128 at most,
//! where packing both operands, as `matrixmultiply` does, costs about a tenth of the forward),
//! and the zeros of a triangular `a` or the unwanted upper triangle of `c` skipped. The output
//! is walked in tiles of [`MR`] rows by [`NR`] columns held in 12 of the 16 ymm registers (two
//! more hold a row of `b`, one the broadcast element): the fewest accumulators that keep both
//! FMA units busy through their latency.
//!
//! Every element of `c` is `alpha * (sum over p in order of a[i, p] b[p, j]) + beta * c`, the sum
//! a chain of FMAs, as in the AVX-512 kernel: both give the same bits, which depend on the
//! operands alone, never on alignment or threads.

use std::arch::x86_64::*;

use super::blocks::Operands;

/// Rows of an output tile.
const MR: usize = 6;
/// Columns of an output tile (two ymm registers).
const NR: usize = 16;

/// Whether [`gemm_avx2`] may be called on this CPU.
#[inline]
pub(crate) fn have_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `c = alpha a b + beta c` (see [`Operands`]); with `beta == 0`, `c` is only written.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`have_avx2_fma`]), and every element the strides reach
/// for `i < m`, `p < k`, `j < n` must lie inside the allocations `a`, `b` and `c` point into, with
/// `c` aliasing neither input.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_avx2(o: &Operands) {
    let mut j0 = 0;
    while j0 < o.n {
        let cols = (o.n - j0).min(NR);
        // Lanes of the two column vectors that lie inside `c`: masked loads past them read
        // nothing and give zero, masked stores past them write nothing.
        let lane = |l: usize| if l < cols { -1 } else { 0 };
        let m0 = _mm256_setr_epi32(
            lane(0),
            lane(1),
            lane(2),
            lane(3),
            lane(4),
            lane(5),
            lane(6),
            lane(7),
        );
        let m1 = _mm256_setr_epi32(
            lane(8),
            lane(9),
            lane(10),
            lane(11),
            lane(12),
            lane(13),
            lane(14),
            lane(15),
        );
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
            match (rows, cols == NR) {
                (6, true) => tile::<6, true>(&t),
                (6, false) => tile::<6, false>(&t),
                (5, true) => tile::<5, true>(&t),
                (5, false) => tile::<5, false>(&t),
                (4, true) => tile::<4, true>(&t),
                (4, false) => tile::<4, false>(&t),
                (3, true) => tile::<3, true>(&t),
                (3, false) => tile::<3, false>(&t),
                (2, true) => tile::<2, true>(&t),
                (2, false) => tile::<2, false>(&t),
                (_, true) => tile::<1, true>(&t),
                (_, false) => tile::<1, false>(&t),
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
    m0: __m256i,
    m1: __m256i,
    alpha: f32,
    beta: f32,
}

/// `R` rows by [`NR`] columns of `c` (`FULL`), or by the columns the masks keep.
///
/// # Safety
/// As [`gemm_avx2`], for the tile's rows, columns (the masks) and depth.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const FULL: bool>(t: &Tile) {
    let load = |p: *const f32, mask: __m256i| {
        if FULL {
            _mm256_loadu_ps(p)
        } else {
            _mm256_maskload_ps(p, mask)
        }
    };
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    // One pointer a row, each stepped on its own, so that no chain of dependent address
    // additions is carried from step to step: rows addressed as `a + r rsa` off one stepped
    // pointer make such a chain of R + 1 additions, which bounds the loop at 7 cycles a step
    // against the 6 rows' 6 cycles of multiply-adds on a core with two FMA units.
    let mut a: [*const f32; R] = std::array::from_fn(|r| t.a.wrapping_add(r * t.rsa));
    let mut b = t.b;
    for _ in 0..t.kk {
        let b0 = load(b, t.m0);
        // Past the last column, as for the pointers below, only an address is formed (masked
        // lanes read nothing); `wrapping_add` keeps forming it defined.
        let b1 = load(b.wrapping_add(8), t.m1);
        for (acc, a) in acc.iter_mut().zip(a.iter_mut()) {
            let x = _mm256_broadcast_ss(&**a);
            acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
            acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            *a = a.wrapping_add(t.csa);
        }
        b = b.wrapping_add(t.ldb);
    }
    let alpha = _mm256_set1_ps(t.alpha);
    let beta = _mm256_set1_ps(t.beta);
    for (r, acc) in acc.iter().enumerate() {
        let c = t.c.add(r * t.ldc);
        for (h, (&v, mask)) in acc.iter().zip([t.m0, t.m1]).enumerate() {
            let at = c.wrapping_add(8 * h);
            let ab = _mm256_mul_ps(alpha, v);
            let out = if t.beta == 0.0 {
                ab
            } else {
                _mm256_fmadd_ps(beta, load(at, mask), ab)
            };
            if FULL {
                _mm256_storeu_ps(at, out);
            } else {
                _mm256_maskstore_ps(at, mask, out);
            }
        }
    }
}

/// `e^x` in 8 lanes, as [`super::kernel`]'s 16-lane `exp16` computes it (the same bits): within
/// 2 ulp of the exact value; inf, zero and NaN where `f32::exp` gives them.
///
/// `x = m ln2 + r` with `|r| <= ln2 / 2` (ln2 split in two so `r` is exact), `e^r` by its Taylor
/// series to degree 7, then `2^m e^r`: AVX2 has no `scalef`, so the scaling is two exact powers
/// of two, `2^floor(m/2)` and `2^(m - floor(m/2))`, each a normal number for every `m` the clamp
/// allows; the first product is exact and the second rounds once, to an infinity or a
/// subnormal as the exact value does.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    // e^-104 rounds to zero and e^89 to infinity; `max`/`min` return their second operand when
    // either is NaN, so NaN passes through.
    let x = _mm256_min_ps(
        _mm256_set1_ps(89.0),
        _mm256_max_ps(_mm256_set1_ps(-104.0), x),
    );
    let m = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(m, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(m, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    // NaN lanes give a meaningless m here, and stay NaN through p.
    let mi = _mm256_cvtps_epi32(m);
    let m1 = _mm256_srai_epi32::<1>(mi);
    let m2 = _mm256_sub_epi32(mi, m1);
    let pow2 = |e: __m256i| {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            e,
            _mm256_set1_epi32(127),
        )))
    };
    _mm256_mul_ps(_mm256_mul_ps(p, pow2(m1)), pow2(m2))
}

/// The lanes `0..len` of an 8-lane vector, as a mask for `maskload`/`maskstore`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lanes(len: usize) -> __m256i {
    let len = len.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(len),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// [`super::blocks::Decays::pairs`] 8 lanes at a time: row i of `out` (`n x n`) holds
/// `e^((gamma_i - gamma_l) + (lo_i - lo_l))` for `l <= i` in the same segment, zero elsewhere.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `gamma`, `lo`, `seg` hold `n` values and `out` `n * n`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pairs_avx2(gamma: &[f32], lo: &[f32], seg: &[f32], out: &mut [f32]) {
    let n = gamma.len();
    assert!(lo.len() == n && seg.len() == n && out.len() >= n * n);
    for i in 0..n {
        let (gi, li, si) = (
            _mm256_set1_ps(gamma[i]),
            _mm256_set1_ps(lo[i]),
            _mm256_set1_ps(seg[i]),
        );
        let row = out.as_mut_ptr().add(i * n);
        let mut l = 0;
        // Blocks of eight wholly above the diagonal hold zeros: no exponentials for them.
        while l <= i {
            let inside = lanes(n - l);
            let causal = lanes((i + 1).saturating_sub(l));
            let g = _mm256_maskload_ps(gamma.as_ptr().add(l), causal);
            let lw = _mm256_maskload_ps(lo.as_ptr().add(l), causal);
            let s = _mm256_maskload_ps(seg.as_ptr().add(l), causal);
            let same = _mm256_and_ps(
                _mm256_castsi256_ps(causal),
                _mm256_cmp_ps::<_CMP_EQ_OQ>(s, si),
            );
            let x = _mm256_add_ps(_mm256_sub_ps(gi, g), _mm256_sub_ps(li, lw));
            let e = _mm256_and_ps(same, exp8(x));
            _mm256_maskstore_ps(row.add(l), inside, e);
            l += 8;
        }
        while l < n {
            _mm256_maskstore_ps(row.add(l), lanes(n - l), _mm256_setzero_ps());
            l += 8;
        }
    }
}

/// [`crate::cpu::stages::solve_tril::solve_tril_block`] for `n <= 64` with the same bits: each
/// element of the inverse takes the same terms in the same order (row `i`'s terms `l = 0..i`,
/// each a multiply then an add, zero entries of `A` skipped, a column `c` updated by term `l`
/// only where `c <= l`), but the work is ordered for instruction-level parallelism instead of
/// row after row: by blocks of eight columns, four rows at a time, their sums over the rows
/// already done side by side (four independent chains of adds, where one row's chain waits on
/// each add's latency), then their terms among themselves in order.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn solve_tril_avx2(a: &[f32], n: usize, a_inv: &mut [f32]) {
    assert!(n <= 64 && a.len() >= n * n && a_inv.len() >= n * n);
    a_inv[..n * n].fill(0.0);
    let out = a_inv.as_mut_ptr();
    let lane_index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut c0 = 0;
    while c0 < n {
        let cols = lanes(n - c0);
        // Row r's entry at column c0 + lane, for r in this block of columns: 1 on the diagonal.
        let unit = |r: usize| {
            let hit = _mm256_cmpeq_epi32(_mm256_set1_epi32(r as i32 - c0 as i32), lane_index);
            _mm256_and_ps(_mm256_castsi256_ps(hit), _mm256_set1_ps(1.0))
        };
        // Term l of a row: `acc - a * X[l]` on the lanes c <= l (all of them once l >= c0 + 7).
        let term = |acc: __m256, x: f32, l: usize, xl: __m256| {
            let sum = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(-x), xl));
            if l >= c0 + 7 {
                sum
            } else {
                let upto = _mm256_cmpgt_epi32(_mm256_set1_epi32((l - c0) as i32 + 1), lane_index);
                _mm256_blendv_ps(acc, sum, _mm256_castsi256_ps(upto))
            }
        };
        // Rows above c0 are zero in these columns; rows from c0 on, four at a time.
        let mut i = c0;
        while i < n {
            let group = (n - i).min(4);
            let mut acc = [_mm256_setzero_ps(); 4];
            for (g, acc) in acc.iter_mut().enumerate().take(group) {
                *acc = unit(i + g);
            }
            for l in c0..i {
                let xl = _mm256_maskload_ps(out.add(l * n + c0), cols);
                for (g, acc) in acc.iter_mut().enumerate().take(group) {
                    let x = a[(i + g) * n + l];
                    if x != 0.0 {
                        *acc = term(*acc, x, l, xl);
                    }
                }
            }
            for g in 0..group {
                for h in 0..g {
                    let x = a[(i + g) * n + i + h];
                    if x != 0.0 {
                        acc[g] = term(acc[g], x, i + h, acc[h]);
                    }
                }
                _mm256_maskstore_ps(out.add((i + g) * n + c0), cols, acc[g]);
            }
            i += group;
        }
        c0 += 8;
    }
}

/// [`super::blocks::transpose`] by 8 x 8 tiles in ymm registers (the usual unpack, shuffle and
/// lane-permute network), the edges element by element: the scalar loop's column-wise stores
/// were ~2 % of a one-thread prefill.
///
/// # Safety
/// The CPU must support AVX.
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose_avx(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    assert!(x.len() >= rows * cols && out.len() >= rows * cols);
    let (src, dst) = (x.as_ptr(), out.as_mut_ptr());
    let (full_rows, full_cols) = (rows / 8 * 8, cols / 8 * 8);
    for i0 in (0..full_rows).step_by(8) {
        for p0 in (0..full_cols).step_by(8) {
            let r: [__m256; 8] =
                std::array::from_fn(|i| _mm256_loadu_ps(src.add((i0 + i) * cols + p0)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let o = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (p, v) in o.iter().enumerate() {
                _mm256_storeu_ps(dst.add((p0 + p) * rows + i0), *v);
            }
        }
    }
    // The edges: rows past the last full tile, and columns past it in the full tiles' rows.
    for i in 0..rows {
        let first = if i < full_rows { full_cols } else { 0 };
        for p in first..cols {
            *dst.add(p * rows + i) = *src.add(i * cols + p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp8_is_within_two_ulp_and_keeps_the_special_values() {
        if !have_avx2_fma() {
            return;
        }
        crate::cpu::check_exp(|x| {
            let mut out = [0f32; 16];
            for h in 0..2 {
                // SAFETY: AVX2 and FMA detected; both arrays hold 16 lanes.
                unsafe {
                    let e = exp8(_mm256_loadu_ps(x.as_ptr().add(8 * h)));
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), e);
                }
            }
            out
        });
    }

    #[test]
    fn transpose_avx_moves_every_element() {
        if !std::is_x86_feature_detected!("avx") {
            return;
        }
        for (rows, cols) in [
            (64, 128),
            (1, 1),
            (8, 8),
            (13, 21),
            (64, 3),
            (9, 16),
            (7, 7),
        ] {
            let x: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let mut out = vec![f32::NAN; rows * cols];
            // SAFETY: AVX detected; both buffers hold rows x cols.
            unsafe { transpose_avx(&x, rows, cols, &mut out) };
            for i in 0..rows {
                for p in 0..cols {
                    assert_eq!(
                        out[p * rows + i],
                        x[i * cols + p],
                        "{rows} x {cols} at ({i}, {p})"
                    );
                }
            }
        }
    }

    /// The same bits as the portable substitution, on blocks with zeros, partial vectors, and
    /// an infinity in `A` (NaN only where the portable code makes it).
    #[test]
    fn solve_tril_avx2_gives_the_bits_of_the_portable_substitution() {
        if !have_avx2_fma() {
            return;
        }
        for n in [1, 5, 8, 9, 17, 63, 64] {
            for poison in [false, true] {
                let a: Vec<f32> = (0..n * n)
                    .map(|i| {
                        let (r, c) = (i / n, i % n);
                        if c >= r || (r + c) % 5 == 0 {
                            0.0
                        } else if poison && r == n - 1 && c == n / 2 {
                            f32::INFINITY
                        } else {
                            ((i * 7919 % 211) as f32 - 105.0) / 400.0
                        }
                    })
                    .collect();
                let mut want = vec![0f32; n * n];
                crate::cpu::stages::solve_tril::solve_tril_portable(&a, n, &mut want);
                let mut got = vec![f32::NAN; n * n];
                // SAFETY: AVX2 and FMA detected; n <= 64 and both buffers hold n x n.
                unsafe { solve_tril_avx2(&a, n, &mut got) };
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n {n} poison {poison}");
            }
        }
    }
}
