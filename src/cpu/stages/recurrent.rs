use std::marker::PhantomData;

use rayon::prelude::*;

use crate::cpu::{axpy, dot};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// `rows` rows of `width` floats, `stride` apart, read only: one head's K-major state in a pool
/// or a tile of its columns (see [`RowsMut`]).
#[derive(Clone, Copy)]
pub(crate) struct Rows<'r> {
    ptr: *const f32,
    stride: usize,
    width: usize,
    rows: usize,
    _data: PhantomData<&'r [f32]>,
}

impl<'r> Rows<'r> {
    /// The rows of `data`; panics where they do not fit in it.
    #[cfg(test)]
    pub(crate) fn new(data: &'r [f32], stride: usize, width: usize, rows: usize) -> Self {
        assert!(
            fits(data.len(), stride, width, rows),
            "rows outside their data"
        );
        // SAFETY: the rows lie inside `data`, borrowed for 'r.
        unsafe { Self::from_raw(data.as_ptr(), stride, width, rows) }
    }

    /// # Safety
    /// Every row must lie in one allocation and nothing may write to them for 'r.
    pub(crate) unsafe fn from_raw(
        ptr: *const f32,
        stride: usize,
        width: usize,
        rows: usize,
    ) -> Self {
        Rows {
            ptr,
            stride,
            width,
            rows,
            _data: PhantomData,
        }
    }

    /// Row `r`.
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> &'r [f32] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: row r < rows lies inside the data (`new`, `from_raw`), unwritten for 'r.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r * self.stride), self.width) }
    }
}

/// `rows` rows of `width` floats, `stride` apart, written by one task: one head's K-major state,
/// or a tile of its columns, whose rows interleave with the other tiles' in memory without
/// overlapping them (which slices of whole rows could not say), made without a table of row
/// slices per state.
pub(crate) struct RowsMut<'r> {
    ptr: *mut f32,
    stride: usize,
    width: usize,
    rows: usize,
    _data: PhantomData<&'r mut [f32]>,
}

impl<'r> RowsMut<'r> {
    /// The rows of `data`; panics where they do not fit in it.
    pub(crate) fn new(data: &'r mut [f32], stride: usize, width: usize, rows: usize) -> Self {
        assert!(
            fits(data.len(), stride, width, rows),
            "rows outside their data"
        );
        // SAFETY: the rows lie inside `data`, borrowed uniquely for 'r.
        unsafe { Self::from_raw(data.as_mut_ptr(), stride, width, rows) }
    }

    /// # Safety
    /// Every row must lie in one allocation, and nothing else may read or write them for 'r.
    pub(crate) unsafe fn from_raw(ptr: *mut f32, stride: usize, width: usize, rows: usize) -> Self {
        RowsMut {
            ptr,
            stride,
            width,
            rows,
            _data: PhantomData,
        }
    }

    /// Row `r`.
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> &[f32] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: row r < rows lies inside the data, which only `self` reaches.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r * self.stride), self.width) }
    }

    /// The same rows, borrowed for a shorter while.
    pub(crate) fn reborrow(&mut self) -> RowsMut<'_> {
        RowsMut {
            ptr: self.ptr,
            stride: self.stride,
            width: self.width,
            rows: self.rows,
            _data: PhantomData,
        }
    }

    /// Row `r`, to write.
    #[inline(always)]
    pub(crate) fn row_mut(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        // SAFETY: as `row`, and `&mut self` keeps this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r * self.stride), self.width) }
    }
}

/// Whether `rows` rows of `width`, `stride` apart, fit in `len` floats.
fn fits(len: usize, stride: usize, width: usize, rows: usize) -> bool {
    rows == 0
        || (width <= stride || rows == 1)
            && (rows - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(width))
                .is_some_and(|end| end <= len)
}

/// One token of the gated delta rule on some columns of one head's K-major state, given as its
/// `K = k.len()` rows (`w = u.len()` columns each): with `S` the state decayed by `decay`,
/// `u = beta (v - S^T k)`, then `S <- S + k u^T` and `o = scale S^T q`. The state is read from
/// `src` (`None`: from `state`) and written to `state`; `v`, `u` and `o` hold `w` values.
pub(crate) struct Token<'a, 'r> {
    pub state: RowsMut<'r>,
    pub src: Option<Rows<'r>>,
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub v: &'a [f32],
    pub decay: f32,
    pub beta: f32,
    pub scale: f32,
    pub u: &'a mut [f32],
    pub o: &'a mut [f32],
    /// The rows the caller will step next (their first element, and the row stride), fetched
    /// towards the cache while this step's second pass runs: decode steps stream states far
    /// larger than the caches, and the second pass works from cache, leaving memory idle.
    pub next: Option<(*const f32, usize)>,
}

/// Advances one [`Token`]. Two passes over the state: the first reads it for `S^T k` and
/// `S^T q` on the undecayed state, the second writes `decay S + k u^T`; the output follows from
/// the sums, `o = scale (decay S^T q + u (q . k))`, which equals `scale S_new^T q` without a
/// third read of the state or a running sum per column in the second pass. Compiled for
/// AVX-512 and for AVX2 with FMA as well, chosen at run time. Every sum and update is a fused
/// multiply-add in a fixed order (two roundings fewer per element than a multiply and an add,
/// and half the instructions), so those variants round alike; the portable variant, on a CPU
/// without FMA, multiplies and adds separately: deterministic on its own, the last bits not
/// those of the others.
pub(crate) fn token_step(t: &mut Token<'_, '_>) {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if crate::cpu::use_avx512() {
        // SAFETY: AVX-512F is present.
        return unsafe { token_step_avx512(t) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::use_avx2() {
            // SAFETY: AVX2 and FMA are present.
            return unsafe { token_step_avx2(t) };
        }
    }
    let next = t.next;
    rows_step::<PORTABLE_FMA>(t, |r| ahead_of(next, r))
}

/// Whether the portable build of [`token_step`] fuses its multiply-adds: where the target has
/// them in hardware for certain (aarch64, or x86 built with FMA enabled). Elsewhere `mul_add`
/// could be a library call per element, many times slower than the multiply and add it
/// replaces.
const PORTABLE_FMA: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// [`token_step`] compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(all(target_arch = "x86_64", deltanet_avx512))]
#[target_feature(enable = "avx512f")]
unsafe fn token_step_avx512(t: &mut Token<'_, '_>) {
    token_step_plain::<128, true>(t)
}

/// [`token_step`] compiled for AVX2 with FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn token_step_avx2(t: &mut Token<'_, '_>) {
    let next = t.next;
    rows_step::<true>(t, |r| ahead_of(next, r))
}

/// Row `r` of the rows given as `Token::next`.
#[inline(always)]
fn ahead_of(next: Option<(*const f32, usize)>, r: usize) -> Option<*const f32> {
    next.map(|(base, stride)| base.wrapping_add(r * stride))
}

/// Widths whose sums [`rows_step`] keeps on the stack.
const SUMS_MAX: usize = 256;

/// `S^T k` and `S^T q` of up to [`SUMS_MAX`] columns, aligned to a cache line.
#[repr(align(64))]
struct Sums([f32; SUMS_MAX]);

/// [`token_step`] with whole rows: the first pass walks the state row by row, four rows at a
/// time, each column's sums in memory (in the cache) rather than registers, and the second
/// pass row by row again; the state stepped next (row `r` at `ahead(r)`) is fetched towards the
/// cache over both passes, its first half during the first, as [`update`] says why. Each
/// column's sums take the rows in order, one multiply-add each, so the bits are those of the
/// column blocks ([`token_step_plain`]); the memory is walked in order, which the hardware
/// prefetchers follow (column blocks narrower than a row, where the sums fit the sixteen AVX2
/// registers, leave them strided; NOTES-CPU.md).
#[inline(always)]
fn rows_step<const FMA: bool>(t: &mut Token<'_, '_>, ahead: impl Fn(usize) -> Option<*const f32>) {
    // The sums on the stack, aligned to cache lines: in the caller's `u` and `o` (16-byte
    // aligned heap rows), or with the compiler not knowing which, the step took 1.2-1.5x as
    // long (NOTES-CPU.md).
    let w = t.u.len();
    if w <= SUMS_MAX {
        let (mut ka, mut qa) = (Sums([0.0; SUMS_MAX]), Sums([0.0; SUMS_MAX]));
        rows_step_with::<FMA>(t, ahead, &mut ka.0[..w], &mut qa.0[..w]);
    } else {
        let mut sums = vec![0f32; 2 * w];
        let (ka, qa) = sums.split_at_mut(w);
        rows_step_with::<FMA>(t, ahead, ka, qa);
    }
}

/// [`rows_step`] with its sums in `ka` and `qa` (`w` zeros each).
#[inline(always)]
fn rows_step_with<const FMA: bool>(
    t: &mut Token<'_, '_>,
    ahead: impl Fn(usize) -> Option<*const f32>,
    ka: &mut [f32],
    qa: &mut [f32],
) {
    let Token {
        state,
        src,
        k,
        q,
        v,
        decay,
        beta,
        scale,
        u,
        o,
        ..
    } = t;
    let (w, kdim) = (u.len(), k.len());
    let (decay, beta, scale, src) = (*decay, *beta, *scale, *src);
    {
        let state: &RowsMut<'_> = state;
        let row = |r: usize| -> &[f32] {
            match src {
                Some(src) => &src.row(r)[..w],
                None => &state.row(r)[..w],
            }
        };
        let mut r = 0;
        while r + 4 <= kdim {
            // The first half of the next state's rows, two every four rows.
            for h in [r / 2, r / 2 + 1] {
                if let Some(p) = ahead(h) {
                    prefetch_row(p, w);
                }
            }
            let (s0, s1, s2, s3) = (row(r), row(r + 1), row(r + 2), row(r + 3));
            let (k0, k1, k2, k3) = (k[r], k[r + 1], k[r + 2], k[r + 3]);
            let (q0, q1, q2, q3) = (q[r], q[r + 1], q[r + 2], q[r + 3]);
            for c in 0..w {
                let (x0, x1, x2, x3) = (s0[c], s1[c], s2[c], s3[c]);
                let a = madd::<FMA>(k1, x1, madd::<FMA>(k0, x0, ka[c]));
                ka[c] = madd::<FMA>(k3, x3, madd::<FMA>(k2, x2, a));
                let b = madd::<FMA>(q1, x1, madd::<FMA>(q0, x0, qa[c]));
                qa[c] = madd::<FMA>(q3, x3, madd::<FMA>(q2, x2, b));
            }
            r += 4;
        }
        for r in r..kdim {
            let (s, kr, qr) = (row(r), k[r], q[r]);
            for c in 0..w {
                ka[c] = madd::<FMA>(kr, s[c], ka[c]);
                qa[c] = madd::<FMA>(qr, s[c], qa[c]);
            }
        }
    }
    let kq = dot_fma::<FMA>(k, q);
    let v = &v[..w];
    for c in 0..w {
        let (uc, oc) = u_and_o::<FMA>(ka[c], qa[c], v[c], decay, beta, scale, kq);
        (ka[c], u[c], o[c]) = (uc, uc, oc);
    }
    let ub = &*ka;
    // The rest of the next state's rows, one every other row.
    let half = 2 * (kdim / 4);
    for r in 0..kdim {
        if let Some(p) = ahead(half + r / 2).filter(|_| r % 2 == 1 && half + r / 2 < kdim) {
            prefetch_row(p, w);
        }
        let kr = k[r];
        let out = &mut state.row_mut(r)[..w];
        match src {
            Some(src) => {
                let s = &src.row(r)[..w];
                for c in 0..w {
                    out[c] = madd::<FMA>(kr, ub[c], decay * s[c]);
                }
            }
            None => {
                for x in out.iter_mut().zip(ub) {
                    *x.0 = madd::<FMA>(kr, *x.1, decay * *x.0);
                }
            }
        }
    }
}

#[inline(always)]
fn token_step_plain<const WIDE: usize, const FMA: bool>(t: &mut Token<'_, '_>) {
    // Blocks of WIDE columns (then 16, then single ones): a block's sums stay in registers while
    // the rows pass, so only the state itself goes through memory, and a whole row of 128 is
    // one block where 32 registers hold it.
    let w = t.u.len();
    let mut c0 = 0;
    while c0 < w {
        let step = match w - c0 {
            r if r >= WIDE => columns::<WIDE, FMA>(t, c0),
            r if r >= 16 => columns::<16, FMA>(t, c0),
            _ => columns::<1, FMA>(t, c0),
        };
        c0 += step;
    }
}

/// [`token_step`] on columns `c0..c0 + B`; returns `B`.
#[inline(always)]
fn columns<const B: usize, const FMA: bool>(t: &mut Token<'_, '_>, c0: usize) -> usize {
    let next = t.next.map(|(base, stride)| (base.wrapping_add(c0), stride));
    let (ka, qa) = sums::<B, FMA>(t, c0, next);
    let ub = finish::<B, FMA>(t, c0, &ka, &qa);
    update::<B, FMA>(t, c0, &ub, next);
    B
}

/// The second pass on columns `c0..c0 + B` ([`update_row`] for every row), fetching the last
/// half of the rows of `next` (its first column, the row stride) as it goes: [`sums`] fetched
/// the first half. Spread over both passes, the next state's reads keep memory busy through
/// the whole step rather than bunching behind the second pass, whose own reads come from the
/// cache: a decode step over 32 MiB of states, 2 threads, took 0.73 ms against 0.88 with the
/// whole next state fetched during the second pass (`dev/cpu_micro/`, NOTES-CPU.md).
#[inline(always)]
fn update<const B: usize, const FMA: bool>(
    t: &mut Token<'_, '_>,
    c0: usize,
    ub: &[f32; B],
    next: Option<(*const f32, usize)>,
) {
    let (kdim, half) = (t.k.len(), t.k.len() / 2);
    for r in 0..kdim {
        if let Some((base, stride)) = next.filter(|_| r % 2 == 1) {
            prefetch_row(base.wrapping_add((half + r / 2) * stride), B);
        }
        update_row::<B, FMA>(t, c0, r, ub);
    }
}

/// The first pass on columns `c0..c0 + B`: `S^T k` and `S^T q` of the state entering the token,
/// the rows in order; fetching the first half of the rows of `next` (its first column, the row
/// stride) as it goes ([`update`] fetches the rest).
#[inline(always)]
fn sums<const B: usize, const FMA: bool>(
    t: &Token<'_, '_>,
    c0: usize,
    next: Option<(*const f32, usize)>,
) -> ([f32; B], [f32; B]) {
    let (mut ka, mut qa) = ([0f32; B], [0f32; B]);
    for r in 0..t.k.len() {
        if let Some((base, stride)) = next.filter(|_| r % 2 == 1) {
            prefetch_row(base.wrapping_add(r / 2 * stride), B);
        }
        sum_row::<B, FMA>(t, c0, r, &mut ka, &mut qa);
    }
    (ka, qa)
}

/// Row `r`'s terms of [`sums`].
#[inline(always)]
fn sum_row<const B: usize, const FMA: bool>(
    t: &Token<'_, '_>,
    c0: usize,
    r: usize,
    ka: &mut [f32; B],
    qa: &mut [f32; B],
) {
    let (kr, qr) = (t.k[r], t.q[r]);
    let s_in: &[f32] = match t.src {
        Some(src) => src.row(r),
        None => t.state.row(r),
    };
    for ((a, b), &s) in ka.iter_mut().zip(qa.iter_mut()).zip(&s_in[c0..c0 + B]) {
        *a = madd::<FMA>(kr, s, *a);
        *b = madd::<FMA>(qr, s, *b);
    }
}

/// From the sums: `u` and `o` of columns `c0..c0 + B` (written to the token's), and `u`.
#[inline(always)]
fn finish<const B: usize, const FMA: bool>(
    t: &mut Token<'_, '_>,
    c0: usize,
    ka: &[f32; B],
    qa: &[f32; B],
) -> [f32; B] {
    let (decay, beta, scale) = (t.decay, t.beta, t.scale);
    let kq = dot_fma::<FMA>(t.k, t.q);
    let mut ub = [0f32; B];
    for (((ub, o), (&a, &b)), &vc) in ub
        .iter_mut()
        .zip(&mut t.o[c0..c0 + B])
        .zip(ka.iter().zip(qa))
        .zip(&t.v[c0..c0 + B])
    {
        (*ub, *o) = u_and_o::<FMA>(a, b, vc, decay, beta, scale, kq);
    }
    t.u[c0..c0 + B].copy_from_slice(&ub);
    ub
}

/// The second pass on row `r`, columns `c0..c0 + B`: `decay S + k u^T` written to the state.
#[inline(always)]
fn update_row<const B: usize, const FMA: bool>(
    t: &mut Token<'_, '_>,
    c0: usize,
    r: usize,
    ub: &[f32; B],
) {
    let (decay, kr) = (t.decay, t.k[r]);
    let src = t.src;
    let row = &mut t.state.row_mut(r)[c0..c0 + B];
    match src {
        Some(src) => {
            for ((out, &s), &uc) in row.iter_mut().zip(&src.row(r)[c0..c0 + B]).zip(ub) {
                *out = madd::<FMA>(kr, uc, decay * s);
            }
        }
        None => {
            for (out, &uc) in row.iter_mut().zip(ub) {
                *out = madd::<FMA>(kr, uc, decay * *out);
            }
        }
    }
}

/// [`token_step`] on each of `tokens` in turn (tokens of distinct states: different sequences,
/// heads or column tiles), the same arithmetic and so the same bits, software-pipelined where
/// every token is one block of the widest columns: the second pass of token i runs row by row
/// together with the first pass of token i + 1, so that the next state's reads overlap this
/// one's writes (a two-pass step per state alone leaves them apart: `dev/cpu_micro/`,
/// NOTES-CPU.md). That is the AVX-512 form, which also fetches the state given as the last
/// token's `next`. With AVX2 each token takes [`rows_step`], and `fetch` says whether to fetch
/// each next state (the next token's, then the last token's `next`) during the step before it:
/// the caller asks for it where the states do not stay in the last-level cache between steps
/// (measured on an AVX2 host only; the AVX-512 form is unchanged).
pub(crate) fn token_steps(tokens: &mut [Token<'_, '_>], fetch: bool) {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if crate::cpu::use_avx512() && tokens.iter().all(|t| t.u.len() == 128) {
        // SAFETY: AVX-512F is present.
        return unsafe { token_steps_avx512(tokens) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::use_avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { token_steps_avx2(tokens, fetch) };
    }
    tokens.iter_mut().for_each(token_step);
}

/// [`token_steps`] compiled for AVX2 with FMA: each token by [`rows_step`], fetching the next
/// token's state during its second pass.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn token_steps_avx2(tokens: &mut [Token<'_, '_>], fetch: bool) {
    for i in 0..tokens.len() {
        let (done, rest) = tokens.split_at_mut(i + 1);
        let cur = &mut done[i];
        let next = cur.next;
        match rest.first() {
            _ if !fetch => rows_step::<true>(cur, |_| None),
            Some(after) => rows_step::<true>(cur, |r| Some(in_row(after, r))),
            None => rows_step::<true>(cur, |r| ahead_of(next, r)),
        }
    }
}

/// Where token `t` reads row `r`: its source row, else its state row.
#[inline(always)]
fn in_row(t: &Token<'_, '_>, r: usize) -> *const f32 {
    match t.src {
        Some(src) => src.row(r).as_ptr(),
        None => t.state.row(r).as_ptr(),
    }
}

/// [`token_steps`] compiled for AVX-512, every token 128 columns wide.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(all(target_arch = "x86_64", deltanet_avx512))]
#[target_feature(enable = "avx512f")]
unsafe fn token_steps_avx512(tokens: &mut [Token<'_, '_>]) {
    pipelined::<128, true>(tokens)
}

#[inline(always)]
fn pipelined<const B: usize, const FMA: bool>(tokens: &mut [Token<'_, '_>]) {
    let Some(first) = tokens.first() else {
        return;
    };
    // One token alone (a run of one state): its next state fetched over both passes.
    let alone = tokens.len() == 1;
    let (mut ka, mut qa) = sums::<B, FMA>(first, 0, first.next.filter(|_| alone));
    for i in 0..tokens.len() {
        let (done, rest) = tokens.split_at_mut(i + 1);
        let cur = &mut done[i];
        let ub = finish::<B, FMA>(cur, 0, &ka, &qa);
        match rest.first() {
            Some(next) => {
                let (mut nka, mut nqa) = ([0f32; B], [0f32; B]);
                for r in 0..cur.k.len() {
                    update_row::<B, FMA>(cur, 0, r, &ub);
                    sum_row::<B, FMA>(next, 0, r, &mut nka, &mut nqa);
                }
                (ka, qa) = (nka, nqa);
            }
            None if alone => update::<B, FMA>(cur, 0, &ub, cur.next),
            None => {
                let prefetch = cur.next;
                for r in 0..cur.k.len() {
                    if let Some((base, stride)) = prefetch {
                        prefetch_row(base.wrapping_add(r * stride), B);
                    }
                    update_row::<B, FMA>(cur, 0, r, &ub);
                }
            }
        }
    }
}

/// One token of the gated delta rule on some rows of one head's V-major state (`[V, K]`, the
/// layout of `state_v_first`: row c holds column c of S, `K = k.len()` values), `w = v.len()`
/// rows: per row, `S^T k` and `S^T q` of that column, then `u`, `o` and the row's update, in one
/// pass over the row (the row is still in L1 for the update). The state is read from `src`
/// (`None`: from `rows`) and written to `rows`; `v` and `o` hold one value a row.
pub(crate) struct VTile<'a> {
    pub rows: &'a mut [f32],
    pub src: Option<&'a [f32]>,
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub v: &'a [f32],
    pub decay: f32,
    pub beta: f32,
    pub scale: f32,
    pub o: &'a mut [f32],
    /// The rows the caller will step next (their first value; rows `K` apart), fetched towards
    /// the cache a row for each row stepped here: a decode step streams states larger than the
    /// caches.
    pub next: Option<*const f32>,
}

/// Advances one [`VTile`]. Each row's sums take its K values in sixteen interleaved partial sums
/// (lane l: the values at l, l + 16, ..., one multiply-add each, in order) combined in a fixed
/// tree (a vector reduction's halvings): the same bits with AVX-512 (one register a sum, k and
/// q held in registers; K = 128), AVX2 (two registers a sum; K a multiple of 16) and the
/// portable build with FMA (every other K). The intrinsic forms replaced the compiler's
/// vectorisation of the portable lanes (which went through the stack for the reduction): at
/// two threads N=1 0.042 -> 0.024 ms with AVX-512, 0.049 -> 0.036 with AVX2; N=16 0.92-0.98 ->
/// 0.72-0.78 and 0.98-1.01 -> 0.86-0.89 (NOTES-CPU.md, thirtieth stop). `u` and `o` follow the
/// K-major step's formula ([`u_and_o`]) and so does each element's update; only the order of
/// the column sums differs from [`token_step`], so the two layouts agree to rounding, not to
/// the bit.
pub(crate) fn v_tile_step(t: &mut VTile<'_>) {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if crate::cpu::use_avx512() {
        // SAFETY: AVX-512F is present.
        return unsafe { v_tile_step_avx512(t) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::use_avx2() {
            // SAFETY: AVX2 and FMA are present.
            return unsafe { v_tile_step_avx2(t) };
        }
    }
    v_tile_rows::<PORTABLE_FMA>(t)
}

/// [`v_tile_step`] compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(all(target_arch = "x86_64", deltanet_avx512))]
#[target_feature(enable = "avx512f")]
// Compiled only where the AVX-512 intrinsics are stable (build.rs), whatever the rust-version.
#[clippy::msrv = "1.89"]
unsafe fn v_tile_step_avx512(t: &mut VTile<'_>) {
    use std::arch::x86_64::*;
    if t.k.len() != 128 {
        return v_tile_rows::<true>(t);
    }
    // k and q in sixteen registers for the whole tile: lane l of register j holds element
    // 16 j + l, the lane layout of `v_tile_rows`.
    // SAFETY (every load and store below): k and q hold 128 values, and so does each row.
    let kv: [__m512; 8] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_ps(t.k.as_ptr().add(16 * j)) });
    let qv: [__m512; 8] =
        std::array::from_fn(|j| unsafe { _mm512_loadu_ps(t.q.as_ptr().add(16 * j)) });
    let dec = _mm512_set1_ps(t.decay);
    let sums = |x: *const f32| {
        let (mut a, mut b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for (j, (&kj, &qj)) in kv.iter().zip(&qv).enumerate() {
            let xs = unsafe { _mm512_loadu_ps(x.add(16 * j)) };
            a = _mm512_fmadd_ps(kj, xs, a);
            b = _mm512_fmadd_ps(qj, xs, b);
        }
        let lanes = |r: __m512| {
            let lo = _mm512_castps512_ps256(r);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1));
            unsafe { lane_sum8(_mm256_add_ps(lo, hi)) }
        };
        (lanes(a), lanes(b))
    };
    let update = |x: *const f32, out: *mut f32, u: f32| {
        let uv = _mm512_set1_ps(u);
        for (j, &kj) in kv.iter().enumerate() {
            unsafe {
                let y = _mm512_loadu_ps(x.add(16 * j));
                _mm512_storeu_ps(
                    out.add(16 * j),
                    _mm512_fmadd_ps(kj, uv, _mm512_mul_ps(dec, y)),
                );
            }
        }
    };
    v_tile_loop(t, sums, update)
}

/// The row loop of the V-major forms: per row, `sums(x)` (its `S^T k` and `S^T q` from the
/// row read at `x`), then `u` and `o`, then `update(x, out, u)` (the row written at `out`: the
/// same row, or the source's row where there is a source), fetching the next rows meanwhile.
#[inline(always)]
fn v_tile_loop(
    t: &mut VTile<'_>,
    sums: impl Fn(*const f32) -> (f32, f32),
    update: impl Fn(*const f32, *mut f32, f32),
) {
    let VTile {
        rows,
        src,
        k,
        q,
        v,
        decay,
        beta,
        scale,
        o,
        next,
    } = t;
    let (kdim, w) = (k.len(), v.len());
    let kq = dot_fma::<true>(k, q);
    for i in 0..w {
        if let Some(p) = next {
            prefetch_row(p.wrapping_add(i * kdim), kdim);
        }
        // The row written, and the row read (the source's, else the same row, read before it
        // is written).
        let out = rows[i * kdim..][..kdim].as_mut_ptr();
        let x: *const f32 = match src {
            Some(s) => s[i * kdim..][..kdim].as_ptr(),
            None => out,
        };
        let (a, b) = sums(x);
        let (u, oc) = u_and_o::<true>(a, b, v[i], *decay, *beta, *scale, kq);
        o[i] = oc;
        update(x, out, u);
    }
}

/// [`lane_sum`]'s tree from its first level on: `s8[l] = a[l] + a[l + 8]` given, then
/// `s8[l] + s8[l + 4]`, then `(s4[0] + s4[2]) + (s4[1] + s4[3])`.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn lane_sum8(s8: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
}

/// [`v_tile_step`] compiled for AVX2 with FMA.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn v_tile_step_avx2(t: &mut VTile<'_>) {
    use std::arch::x86_64::*;
    let kdim = t.k.len();
    if kdim % LANES != 0 {
        return v_tile_rows::<true>(t);
    }
    let dec = _mm256_set1_ps(t.decay);
    let (kp, qp) = (t.k.as_ptr(), t.q.as_ptr());
    // SAFETY (every load and store below): k, q and each row hold kdim values, a multiple
    // of 16.
    let sums = |x: *const f32| {
        // Lanes 0..8 and 8..16 of `v_tile_rows`'s sixteen, in two registers each.
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut b0, mut b1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in (0..kdim).step_by(LANES) {
            unsafe {
                let (x0, x1) = (_mm256_loadu_ps(x.add(j)), _mm256_loadu_ps(x.add(j + 8)));
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(j)), x0, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(j + 8)), x1, a1);
                b0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j)), x0, b0);
                b1 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j + 8)), x1, b1);
            }
        }
        unsafe {
            (
                lane_sum8(_mm256_add_ps(a0, a1)),
                lane_sum8(_mm256_add_ps(b0, b1)),
            )
        }
    };
    let update = |x: *const f32, out: *mut f32, u: f32| {
        let uv = _mm256_set1_ps(u);
        for j in (0..kdim).step_by(8) {
            unsafe {
                let y = _mm256_loadu_ps(x.add(j));
                let r = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(j)), uv, _mm256_mul_ps(dec, y));
                _mm256_storeu_ps(out.add(j), r);
            }
        }
    };
    v_tile_loop(t, sums, update)
}

/// Lanes of [`v_tile_step`]'s partial sums.
const LANES: usize = 16;

#[inline(always)]
fn v_tile_rows<const FMA: bool>(t: &mut VTile<'_>) {
    let VTile {
        rows,
        src,
        k,
        q,
        v,
        decay,
        beta,
        scale,
        o,
        next,
    } = t;
    let (kdim, w) = (k.len(), v.len());
    let (decay, beta, scale) = (*decay, *beta, *scale);
    let kq = dot_fma::<FMA>(k, q);
    let whole = kdim / LANES * LANES;
    for i in 0..w {
        if let Some(p) = next {
            prefetch_row(p.wrapping_add(i * kdim), kdim);
        }
        let (a, b) = {
            let x: &[f32] = match src {
                Some(s) => &s[i * kdim..][..kdim],
                None => &rows[i * kdim..][..kdim],
            };
            let (mut a, mut b) = ([0f32; LANES], [0f32; LANES]);
            for ((xs, ks), qs) in x[..whole]
                .chunks_exact(LANES)
                .zip(k[..whole].chunks_exact(LANES))
                .zip(q[..whole].chunks_exact(LANES))
            {
                for l in 0..LANES {
                    a[l] = madd::<FMA>(ks[l], xs[l], a[l]);
                    b[l] = madd::<FMA>(qs[l], xs[l], b[l]);
                }
            }
            for (l, r) in (whole..kdim).enumerate() {
                a[l] = madd::<FMA>(k[r], x[r], a[l]);
                b[l] = madd::<FMA>(q[r], x[r], b[l]);
            }
            (lane_sum(&a), lane_sum(&b))
        };
        let (u, oc) = u_and_o::<FMA>(a, b, v[i], decay, beta, scale, kq);
        o[i] = oc;
        let out = &mut rows[i * kdim..][..kdim];
        match src {
            Some(s) => {
                for ((y, &x), &kr) in out.iter_mut().zip(&s[i * kdim..][..kdim]).zip(k.iter()) {
                    *y = madd::<FMA>(kr, u, decay * x);
                }
            }
            None => {
                for (y, &kr) in out.iter_mut().zip(k.iter()) {
                    *y = madd::<FMA>(kr, u, decay * *y);
                }
            }
        }
    }
}

/// The sixteen partial sums of [`v_tile_step`] added in a fixed tree: lane l with lane l + 8,
/// then l + 4, then l + 2, then the last two (the halvings a vector reduction does).
#[inline(always)]
fn lane_sum(a: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for l in 0..8 {
        s8[l] = a[l] + a[l + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// One column's `u = beta (v - decay S^T k)` and `o = scale (decay S^T q + u (q . k))` from its
/// sums `ka = S^T k`, `qa = S^T q` of the undecayed state: the one formula of every step form,
/// so they give the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn u_and_o<const FMA: bool>(
    ka: f32,
    qa: f32,
    v: f32,
    decay: f32,
    beta: f32,
    scale: f32,
    kq: f32,
) -> (f32, f32) {
    let u = beta * madd::<FMA>(-decay, ka, v);
    (u, scale * madd::<FMA>(u, kq, decay * qa))
}

/// `a * b + c`: one fused multiply-add with `FMA` (the variants built for CPUs that have it),
/// else a multiply and an add (the portable variant, where `mul_add` could be a library call
/// per element).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `a . b` by (with `FMA`, fused) multiply-adds in eight interleaved sums (one chain would wait on each add's
/// latency), combined in a fixed order.
#[inline(always)]
fn dot_fma<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] = madd::<FMA>(x[i], y[i], acc[i]);
        }
    }
    for (i, (&x, &y)) in ar.iter().zip(br).enumerate() {
        acc[i] = madd::<FMA>(x, y, acc[i]);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// Asks for the cache lines of `len` floats from `p` (a hint: no access, no fault).
#[inline(always)]
fn prefetch_row(p: *const f32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..len).step_by(16) {
        // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                p.wrapping_add(i) as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// The gated delta rule token by token, updating `state` in place (`[N, HV, K, V]`, or
/// `[N, HV, V, K]` with `v_first`); returns `o` `[B, T, HV, V]`. `g` and `beta` are the
/// effective (activated) values.
#[allow(clippy::too_many_arguments)]
pub fn recurrent(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    v_first: bool,
    scale: f32,
) -> Result<Vec<f32>> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    p.check_qk(q, k)?;
    p.check("v", v.len(), dv)?;
    p.check("g", g.len(), 1)?;
    p.check("beta", beta.len(), 1)?;
    check_len("state", state.len(), p.num_seqs() * hv * kv)?;

    let outs: Vec<Vec<f32>> = state
        .par_chunks_mut(kv)
        .enumerate()
        .map(|(task, s)| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
            let (t0, t1) = p.seqs()[n];
            let mut o = vec![0f32; (t1 - t0) * dv];
            let token = |t: usize| {
                let tj = t * hv + j;
                (
                    tj,
                    g[tj].exp(),
                    &k[(t * nh + kh) * dk..][..dk],
                    &q[(t * nh + kh) * dk..][..dk],
                    &v[tj * dv..][..dv],
                )
            };
            if v_first {
                for t in t0..t1 {
                    let (tj, decay, k_row, q_row, v_row) = token(t);
                    let o_row = &mut o[(t - t0) * dv..][..dv];
                    for c in 0..dv {
                        let row = &mut s[c * dk..][..dk];
                        row.iter_mut().for_each(|x| *x *= decay);
                        let uc = beta[tj] * (v_row[c] - dot(row, k_row));
                        axpy(row, uc, k_row);
                        o_row[c] = scale * dot(row, q_row);
                    }
                }
            } else {
                let mut u = vec![0f32; dv];
                for t in t0..t1 {
                    let (tj, decay, k_row, q_row, v_row) = token(t);
                    let o_row = &mut o[(t - t0) * dv..][..dv];
                    token_step(&mut Token {
                        state: RowsMut::new(s, dv, dv, dk),
                        src: None,
                        k: k_row,
                        q: q_row,
                        v: v_row,
                        decay,
                        beta: beta[tj],
                        scale,
                        u: &mut u,
                        o: o_row,
                        next: None,
                    });
                }
            }
            o
        })
        .collect();

    let mut o = vec![0f32; p.tokens() * hv * dv];
    for (task, out) in outs.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let t0 = p.seqs()[n].0;
        crate::cpu::scatter_rows(&mut o, &out, t0, hv, j, dv);
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-major step gives the bits of the column blocks (each column's sums over the rows
    /// in order), for any width and row count, in place and from a separate source.
    /// A random step's operands: a state of `kdim x w` values, a source of as many, k, q (kdim
    /// each) and v (w), in [-0.5, 0.5), from a fixed generator.
    #[allow(clippy::type_complexity)]
    fn random_case(
        seed: &mut u32,
        kdim: usize,
        w: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (*seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        (rnd(kdim * w), rnd(kdim * w), rnd(kdim), rnd(kdim), rnd(w))
    }

    #[test]
    fn rows_step_gives_the_bits_of_the_column_blocks() {
        let mut seed = 7u32;
        for (kdim, w) in [(128, 128), (7, 40), (13, 3), (4, 16), (1, 1), (130, 96)] {
            for from_src in [false, true] {
                let (state0, src, k, q, v) = random_case(&mut seed, kdim, w);
                let run = |rows_major: bool| {
                    let mut state = state0.clone();
                    let (mut u, mut o) = (vec![0f32; w], vec![0f32; w]);
                    let mut t = Token {
                        state: RowsMut::new(&mut state, w, w, kdim),
                        src: from_src.then(|| Rows::new(&src, w, w, kdim)),
                        k: &k,
                        q: &q,
                        v: &v,
                        decay: 0.93,
                        beta: 0.7,
                        scale: 0.3,
                        u: &mut u,
                        o: &mut o,
                        next: None,
                    };
                    if rows_major {
                        // Fetching rows ahead (here the source's) changes nothing.
                        let ahead = src.as_ptr();
                        rows_step::<true>(&mut t, |r| Some(ahead.wrapping_add(r * w)));
                    } else {
                        token_step_plain::<16, true>(&mut t);
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    (bits(&state), bits(&u), bits(&o))
                };
                assert_eq!(run(true), run(false), "K {kdim} V {w} from_src {from_src}");
            }
        }
    }

    /// The V-major step's instruction-set forms give the portable lanes' bits (with FMA), in
    /// place and from a separate source, for K = 128 (every form), other multiples of 16 (AVX2)
    /// and others (the portable lanes everywhere).
    #[test]
    fn v_tile_forms_give_the_bits_of_the_portable_lanes() {
        let mut seed = 11u32;
        #[allow(clippy::type_complexity)]
        let mut forms: Vec<(&str, unsafe fn(&mut VTile<'_>))> = Vec::new();
        #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
        if crate::cpu::kernel::have_avx512() {
            forms.push(("avx512", v_tile_step_avx512));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::kernel_avx2::have_avx2_fma() {
            forms.push(("avx2", v_tile_step_avx2));
        }
        for (kdim, w) in [(128, 64), (128, 1), (64, 5), (48, 17), (20, 3), (1, 2)] {
            for from_src in [false, true] {
                let (rows0, src, k, q, v) = random_case(&mut seed, kdim, w);
                let run = |form: Option<unsafe fn(&mut VTile<'_>)>| {
                    let mut rows = rows0.clone();
                    let mut o = vec![0f32; w];
                    let mut t = VTile {
                        rows: &mut rows,
                        src: from_src.then_some(&src[..]),
                        k: &k,
                        q: &q,
                        v: &v,
                        decay: 0.93,
                        beta: 0.7,
                        scale: 0.3,
                        o: &mut o,
                        next: Some(src.as_ptr()),
                    };
                    match form {
                        // SAFETY: the forms listed are the ones this CPU supports.
                        Some(f) => unsafe { f(&mut t) },
                        None => v_tile_rows::<true>(&mut t),
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    (bits(&rows), bits(&o))
                };
                let want = run(None);
                for (name, f) in &forms {
                    assert_eq!(
                        run(Some(*f)),
                        want,
                        "{name}: K {kdim} V {w} from_src {from_src}"
                    );
                }
            }
        }
    }
}
