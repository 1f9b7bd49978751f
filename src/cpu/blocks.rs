//! The block-level helpers every CPU stage and the fused path share: per-chunk gathers and
//! scatters between FLA's `[tokens, heads, width]` layouts and chunk-sized row blocks, the decays
//! of one chunk, and the small dense products.

use crate::backend::Gamma;
use crate::error::{Error, Result};
use crate::problem::{Chunk, Problem};

/// Splits a `[tokens, per_token]` output into the disjoint, contiguous row blocks of each chunk,
/// so chunks can be written in parallel without sharing.
pub(crate) fn chunk_blocks<'a>(
    p: &Problem,
    out: &'a mut [f32],
    per_token: usize,
) -> Vec<(Chunk, &'a mut [f32])> {
    let mut rest = out;
    let mut blocks = Vec::with_capacity(p.chunks().len());
    for c in p.chunks() {
        // Chunks tile the tokens in order (sequences are contiguous), so each block starts
        // where the previous one ended.
        let (block, tail) = std::mem::take(&mut rest).split_at_mut(c.len * per_token);
        blocks.push((*c, block));
        rest = tail;
    }
    blocks
}

/// Columns `cols` of the rows of one chunk for head `head` of a `[tokens, heads, width]` buffer
/// (`n x cols.len()`), as f32 (`to_f32` converts each element), into `out` (its capacity is kept
/// from chunk to chunk). Generic and inlined so that the conversion is inlined into the copy
/// loop: this is the fused forward's every read of its inputs.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn gather_rows_with<T: Copy, F: Fn(T) -> f32>(
    x: &[T],
    to_f32: F,
    c: &Chunk,
    heads: usize,
    head: usize,
    width: usize,
    cols: std::ops::Range<usize>,
    out: &mut Vec<f32>,
) {
    out.clear();
    for t in c.start..c.start + c.len {
        out.extend(
            x[(t * heads + head) * width + cols.start..][..cols.len()]
                .iter()
                .map(|&v| to_f32(v)),
        );
    }
}

/// The `n x width` rows of one chunk for head `head` of a `[tokens, heads, width]` buffer.
pub(crate) fn gather_rows(
    x: &[f32],
    c: &Chunk,
    heads: usize,
    head: usize,
    width: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(c.len * width);
    gather_rows_with(x, |v| v, c, heads, head, width, 0..width, &mut out);
    out
}

/// Writes the consecutive rows of one head, `rows` (`len x width`, tokens `first..`), into a
/// `[tokens, heads, width]` buffer: how per-(sequence, head) results reach FLA's layout.
pub(crate) fn scatter_rows<T: Copy>(
    out: &mut [T],
    rows: &[T],
    first: usize,
    heads: usize,
    head: usize,
    width: usize,
) {
    for (i, row) in rows.chunks_exact(width).enumerate() {
        out[((first + i) * heads + head) * width..][..width].copy_from_slice(row);
    }
}

/// The `n` values of one chunk for head `head` of a `[tokens, heads]` buffer.
pub(crate) fn gather_scalars(x: &[f32], c: &Chunk, heads: usize, head: usize) -> Vec<f32> {
    (c.start..c.start + c.len)
        .map(|t| x[t * heads + head])
        .collect()
}

/// The decays of one chunk of one head: its slice of [`Gamma`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Decays {
    pub(crate) gamma: Vec<f32>,
    pub(crate) lo: Vec<f32>,
    pub(crate) seg: Vec<f32>,
}

impl Decays {
    /// Chunk `c`, value head `j`, of a `[tokens, HV]` [`Gamma`].
    pub(crate) fn gather(gm: &Gamma<Vec<f32>>, c: &Chunk, hv: usize, j: usize) -> Decays {
        Decays {
            gamma: gather_scalars(&gm.gamma, c, hv, j),
            lo: gather_scalars(&gm.lo, c, hv, j),
            seg: gather_scalars(&gm.seg, c, hv, j),
        }
    }

    /// Tokens in the chunk.
    pub(crate) fn len(&self) -> usize {
        self.gamma.len()
    }

    /// The decay from token j to token i (j <= i).
    #[inline]
    pub(crate) fn decay(&self, i: usize, j: usize) -> f32 {
        if self.seg[i] == self.seg[j] {
            ((self.gamma[i] - self.gamma[j]) + (self.lo[i] - self.lo[j])).exp()
        } else {
            0.0
        }
    }

    /// The decays between the chunk's tokens, `n x n` row-major: `decay(i, l)` for `l <= i`, zero
    /// above the diagonal. Computed once per chunk and shared by `A_strict` and `o`, so each
    /// exponential is taken once.
    pub(crate) fn pairs(&self, out: &mut [f32]) {
        let n = self.len();
        #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
        if super::use_avx512() {
            // SAFETY: AVX-512F is present; the kernel checks the lengths.
            unsafe { super::kernel::pairs_avx512(&self.gamma, &self.lo, &self.seg, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if super::use_avx2() {
            // SAFETY: AVX2 and FMA are present; the kernel checks the lengths.
            unsafe { super::kernel_avx2::pairs_avx2(&self.gamma, &self.lo, &self.seg, out) };
            return;
        }
        for (i, row) in out[..n * n].chunks_exact_mut(n).enumerate() {
            for (l, x) in row.iter_mut().enumerate() {
                *x = if l <= i { self.decay(i, l) } else { 0.0 };
            }
        }
    }

    /// The decay from the state entering the chunk to token i.
    #[inline]
    pub(crate) fn decay0(&self, i: usize) -> f32 {
        if self.seg[i] == 0.0 {
            (self.gamma[i] + self.lo[i]).exp()
        } else {
            0.0
        }
    }
}

/// `c = alpha op(a) op(b) + beta c` on row-major blocks: `op(a)` is `m x k` (stored `k x m` when
/// `a_t`), `op(b)` is `k x n` (stored `n x k` when `b_t`), `c` is `m x n`. The small dense
/// products of a chunk are where the CPU spends its time: they go to the AVX-512 kernel where the
/// CPU has it, else to the AVX2 one (the same bits), else to a tuned sgemm; all are
/// single-threaded, hence deterministic. With `beta == 0`, `c` is only written.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    a_t: bool,
    b: &[f32],
    b_t: bool,
    beta: f32,
    c: &mut [f32],
) {
    product([m, k, n], alpha, (a, a_t), (b, b_t), beta, c, Tri::Full);
}

/// `out[i, l] = x_i . k_l` for `l <= i` (`n x n`): the products of a chunk's tokens that causal
/// attention and `A_strict` use, from `x` (`n x K`) and `kt` (`k^T`, `K x n`). Entries above the
/// diagonal are left unspecified.
pub(crate) fn causal_dots(x: &[f32], kt: &[f32], n: usize, dk: usize, out: &mut [f32]) {
    product(
        [n, dk, n],
        1.0,
        (x, false),
        (kt, false),
        0.0,
        out,
        Tri::LowerC,
    );
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
    pub(crate) lower_a: bool,
    /// Only the lower triangle of `c` (`j <= i`, diagonal included) is wanted: tiles wholly
    /// above the diagonal are skipped and keep what `c` held.
    pub(crate) lower_c: bool,
}

/// A product kernel (see [`Operands`]); unsafe: for the instruction set it was built for.
type Kernel = unsafe fn(&Operands);

/// The register-blocked product kernel for this CPU, AVX-512 or else AVX2 with FMA (`None`:
/// the general sgemm of `matrixmultiply`).
#[allow(unreachable_code)]
fn product_kernel() -> Option<Kernel> {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if super::use_avx512() {
        return Some(super::kernel::gemm_avx512 as Kernel);
    }
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        return Some(super::kernel_avx2::gemm_avx2 as Kernel);
    }
    None
}

/// What the kernel may assume or skip in a product.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tri {
    /// Every element of `c`.
    Full,
    /// `op(a)` is lower triangular (`m <= k`, zero past the diagonal): its zeros are skipped.
    LowerA,
    /// Only `c[i, j]` with `j <= i` is wanted (square `c`); the others may be skipped.
    LowerC,
}

/// [`gemm`] with what [`Tri`] allows the kernel to skip: `[m, k, n]` the sizes, `a` and `b`
/// each with whether it is stored transposed.
fn product(
    [m, k, n]: [usize; 3],
    alpha: f32,
    (a, a_t): (&[f32], bool),
    (b, b_t): (&[f32], bool),
    beta: f32,
    c: &mut [f32],
    tri: Tri,
) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "gemm block sizes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c[..m * n]
            .iter_mut()
            .for_each(|x| *x = if beta == 0.0 { 0.0 } else { *x * beta });
        return;
    }
    let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
    if let Some(kernel) = product_kernel() {
        let mut run = |b: &[f32]| {
            let o = Operands {
                m,
                k,
                n,
                alpha,
                a: a.as_ptr(),
                rsa,
                csa,
                b: b.as_ptr(),
                ldb: n,
                beta,
                c: c.as_mut_ptr(),
                ldc: n,
                lower_a: tri == Tri::LowerA && !a_t && m <= k,
                lower_c: tri == Tri::LowerC && m == n,
            };
            // SAFETY: `product_kernel` returned the kernel of an instruction set it detected;
            // the assert keeps every element the strides reach (row-major m x k or its
            // transpose, k x n, m x n) inside `a`, `b` and `c`, and `c` is a unique borrow,
            // aliasing neither input.
            unsafe { kernel(&o) }
        };
        if b_t {
            // The kernel reads rows of `b`: transpose the `n x k` block once, in a buffer each
            // thread keeps, so no allocation recurs per chunk.
            PACKED.with(|buf| {
                let mut bt = buf.borrow_mut();
                let bt = line_aligned(&mut bt, k * n);
                transpose(b, n, k, bt);
                run(bt);
            });
        } else {
            run(b);
        }
        return;
    }
    // The general sgemm computes every element: nothing for it to skip.
    let _ = tri;
    let (rsb, csb) = if b_t { (1, k) } else { (n, 1) };
    // SAFETY: the assert above keeps every element the strides reach inside `a`, `b` and `c`
    // (row-major m x k, k x n and m x n, or their transposes), and `c` is a unique borrow, so it
    // aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

thread_local! {
    /// Chunk-sized scratch of the block functions (see [`with_scratch`]).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `x` copied into a buffer each thread keeps: the row-scaled copies the block
/// functions make of a chunk's rows, without an allocation per chunk. The copy starts on a
/// cache line, as [`Aligned`] does, for the products that read it.
pub(crate) fn with_scratch<R>(x: &[f32], f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        let copy = line_aligned(&mut buf, x.len());
        copy.copy_from_slice(x);
        f(copy)
    })
}

/// Runs `f` on a copy of the rows of `x` (`width` wide), row `i` multiplied by `scale(i)`, in
/// the buffer [`with_scratch`] uses: one pass over `x` where a copy and then a scaling take two.
pub(crate) fn with_scaled_rows<R>(
    x: &[f32],
    width: usize,
    scale: impl Fn(usize) -> f32,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    SCRATCH.with(|buf| {
        let mut buf = buf.borrow_mut();
        let copy = line_aligned(&mut buf, x.len());
        for (i, (out, row)) in copy
            .chunks_exact_mut(width)
            .zip(x.chunks_exact(width))
            .enumerate()
        {
            let s = scale(i);
            out.iter_mut().zip(row).for_each(|(o, &x)| *o = x * s);
        }
        f(copy)
    })
}

/// Floats in a cache line.
const LINE: usize = 16;

/// `len` elements of `buf` starting on a 64-byte boundary (`buf` grown to hold them).
fn line_aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    let first = grow_for_line(buf, len);
    &mut buf[first..first + len]
}

/// Grows `buf` to hold `len` elements from a 64-byte boundary; returns where they start.
fn grow_for_line(buf: &mut Vec<f32>, len: usize) -> usize {
    if buf.len() < len + LINE - 1 {
        buf.resize(len + LINE - 1, 0.0);
    }
    buf.as_ptr().align_offset(64).min(LINE - 1)
}

/// A zeroed f32 buffer whose first element starts a cache line. The products read their `b`
/// operand in rows of 16 floats and write `c` so: from a `Vec`'s 16-byte boundary every other
/// 32-byte load or store straddles two lines, which cost the AVX2 kernel 5-8 % on a chunk's
/// `64 x 128 x 128` product (NOTES-CPU.md, fourteenth stop).
pub(crate) struct Aligned {
    buf: Vec<f32>,
    first: usize,
    len: usize,
}

impl Aligned {
    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Aligned {
        let mut buf = Vec::new();
        let first = grow_for_line(&mut buf, len);
        Aligned { buf, first, len }
    }
}

impl std::ops::Deref for Aligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.first..self.first + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.first..self.first + self.len]
    }
}

thread_local! {
    /// A transposed `b` for the AVX-512 kernel.
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The transpose of the `rows x cols` row-major `x`, written to `out` (`cols x rows`): `k^T`, the
/// form in which the products with `k^T` read it.
pub(crate) fn transpose(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    let x = &x[..rows * cols];
    let out = &mut out[..rows * cols];
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if super::use_avx512() {
        // SAFETY: AVX-512F is present; both slices hold rows x cols elements.
        unsafe { super::kernel::transpose_avx512(x, rows, cols, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::use_avx2() {
        // SAFETY: AVX is present (AVX2 is); both slices hold rows x cols elements.
        unsafe { super::kernel_avx2::transpose_avx(x, rows, cols, out) };
        return;
    }
    for (i, row) in x.chunks_exact(cols).enumerate() {
        for (p, &v) in row.iter().enumerate() {
            out[p * rows + i] = v;
        }
    }
}

/// A zeroed buffer of `len` f32 for a large output. Above a few MiB its pages are asked to be
/// huge ones: such a buffer is first touched by the forward itself, and one fault per 2 MiB
/// instead of one per 4 KiB is a visible share of the prefill's time.
pub(crate) fn zeroed_output(len: usize, arg: &'static str) -> Result<Vec<f32>> {
    let mut v = try_zeroed(len, arg)?;
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = len * std::mem::size_of::<f32>();
        if bytes >= 2 * HUGE {
            let start = v.as_mut_ptr() as usize;
            let first = start.next_multiple_of(HUGE);
            let end = (start + bytes) / HUGE * HUGE;
            if end > first {
                // SAFETY: the range lies inside the allocation of `v`; the advice changes how
                // the kernel backs those pages, never their contents. A refusal is harmless.
                unsafe {
                    libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
                }
            }
        }
    }
    Ok(v)
}

/// `len` zeros, or an error naming `arg` where the memory cannot be had (a `vec!` of that size
/// would abort the process).
/// Zeroed by the allocator, as `vec!` does (fresh pages are not written twice).
pub(crate) fn try_zeroed(len: usize, arg: &'static str) -> Result<Vec<f32>> {
    let failed = || Error::Overflow {
        arg,
        detail: format!(
            "{len} f32 ({:.1} GiB) could not be allocated",
            len as f64 * 4.0 / (1u64 << 30) as f64
        ),
    };
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(len).map_err(|_| failed())?;
    // SAFETY: the layout's size is not zero (len > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return Err(failed());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` f32 (the capacity
    // given), and all its bytes are zero, which is 0.0 in every element.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// Outputs of at least this many bytes are written by non-temporal stores (see [`RowWriter`]):
/// past every core's private caches and a good part of a usual last-level cache, where the
/// next reader finds most of them in memory anyway.
pub(crate) const STREAM_MIN_BYTES: usize = 32 << 20;

/// Writes the rows of an output no later step of the forward reads (`o`): by non-temporal
/// stores where the CPU has AVX-512 and the output is large ([`STREAM_MIN_BYTES`]: no read for
/// ownership of each line, and the forward's working set stays in the caches), else by plain
/// copies (a small `o` is better left in the caches for whatever reads it next).
/// [`RowWriter::finish`] makes the stores visible to other threads.
#[derive(Clone, Copy)]
pub(crate) struct RowWriter {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    streaming: bool,
}

impl RowWriter {
    /// A writer for an output of `bytes` bytes.
    pub(crate) fn new(bytes: usize) -> Self {
        let _ = bytes;
        RowWriter {
            #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
            streaming: bytes >= STREAM_MIN_BYTES && super::use_avx512(),
        }
    }

    /// Copies `src` to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `src.len()` writes, overlapping neither `src` nor memory another
    /// thread uses before [`RowWriter::finish`].
    #[inline]
    pub(crate) unsafe fn write(&self, src: &[f32], dst: *mut f32) {
        #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
        if self.streaming {
            // SAFETY: AVX-512F was detected in `new`; the caller vouches for `dst`.
            return unsafe { super::kernel::copy_streaming(src.as_ptr(), dst, src.len()) };
        }
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }

    /// Orders every write before the caller's later stores (and so before another thread sees
    /// the task finished).
    pub(crate) fn finish(&self) {
        #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
        if self.streaming {
            super::kernel::store_fence();
        }
    }
}

/// Asks the CPU to start loading the bytes `x[first..first + len]` into its caches: the rows of
/// the next chunk are fetched while this one is computed. A hint only, with no effect on results.
#[inline]
pub(crate) fn prefetch<T>(x: &[T], first: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let end = (first + len).min(x.len());
        if first >= end {
            return;
        }
        let bytes = (end - first) * std::mem::size_of::<T>();
        let base = x[first..].as_ptr().cast::<i8>();
        for off in (0..bytes).step_by(64) {
            // SAFETY: the address lies inside `x` (`off < bytes`), and a prefetch never faults
            // nor changes memory.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(base.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, first, len);
}

/// `sum a[i] b[i]`.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha x`.
#[inline]
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// How many of the `n` rows of `x` (`n x width`, row-major) come before the first row holding a
/// NaN or an infinity: `n` when all are finite.
pub(crate) fn finite_rows(x: &[f32], n: usize) -> usize {
    if n == 0 || x.len() < n {
        return n;
    }
    let width = x.len() / n;
    // `v * 0` is zero for every finite `v` and NaN otherwise; summed in eight lanes this is one
    // branch-free pass that vectorises, and only a block that fails it is searched row by row.
    let mut lanes = [0f32; 8];
    let mut blocks = x.chunks_exact(8);
    for b in &mut blocks {
        for (l, v) in lanes.iter_mut().zip(b) {
            *l += v * 0.0;
        }
    }
    let tail: f32 = blocks.remainder().iter().map(|v| v * 0.0).sum();
    if lanes.iter().sum::<f32>() + tail == 0.0 {
        return n;
    }
    x.chunks_exact(width)
        .position(|row| row.iter().any(|v| !v.is_finite()))
        .unwrap_or(n)
}

/// `c = l b + beta c` for a lower-triangular `n x n` `l` (row-major, zero above the diagonal) and
/// an `n x w` `b`: the products of a chunk that mix its tokens causally (`A_inv (beta k)`,
/// `causal(q k^T) v_new`).
///
/// Row i needs only rows `0..=i` of `b`, but a full product also multiplies the zeros above the
/// diagonal by the later rows, and `0 * NaN` is NaN: a non-finite row of `b` would reach every
/// earlier row of `c`. So when `b` has one, the rows before it are computed from the rows before
/// it alone, as a chunk ending there would compute them.
pub(crate) fn gemm_causal(n: usize, w: usize, l: &[f32], b: &[f32], beta: f32, c: &mut [f32]) {
    let m = finite_rows(&b[..n * w], n);
    if m == n {
        product([n, n, w], 1.0, (l, false), (b, false), beta, c, Tri::LowerA);
        return;
    }
    let mut head = vec![0f32; m * m];
    for i in 0..m {
        head[i * m..][..m].copy_from_slice(&l[i * n..][..m]);
    }
    gemm(m, m, w, 1.0, &head, false, b, false, beta, &mut c[..m * w]);
    gemm(
        n - m,
        n,
        w,
        1.0,
        &l[m * n..],
        false,
        b,
        false,
        beta,
        &mut c[m * w..],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product kernels this CPU runs, by name.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        #[allow(unused_mut)]
        let mut all: Vec<(&'static str, Kernel)> = Vec::new();
        #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
        if super::super::kernel::have_avx512() {
            all.push(("avx512", super::super::kernel::gemm_avx512));
        }
        #[cfg(target_arch = "x86_64")]
        if super::super::kernel_avx2::have_avx2_fma() {
            all.push(("avx2", super::super::kernel_avx2::gemm_avx2));
        }
        all
    }

    /// Each kernel gives, bit for bit, `alpha (sum in order of a b by FMAs) + beta c` on odd
    /// shapes (partial tiles of rows and columns), with `a` transposed or triangular, with
    /// `beta = 0` (`c` only written: NaN there stays out), and with only the lower triangle of
    /// `c` wanted.
    #[test]
    fn product_kernels_match_a_plain_product_on_odd_shapes() {
        let val = |i: usize| ((i * 7919 % 211) as f32 - 105.0) / 97.0;
        let shapes = [
            (1, 1, 1),
            (9, 5, 33),
            (64, 128, 64),
            (17, 3, 47),
            (64, 64, 128),
            (13, 13, 13),
            (7, 20, 7),
        ];
        for (name, kernel) in kernels() {
            for &(m, k, n) in &shapes {
                for (a_t, lower_a, lower_c, beta) in [
                    (false, false, false, 0.5),
                    (true, false, false, 0.5),
                    (false, true, false, 0.5),
                    (false, false, false, 0.0),
                    (false, false, true, 0.5),
                    (true, false, true, 0.0),
                ] {
                    if lower_a && m > k || lower_c && m != n {
                        continue;
                    }
                    let a: Vec<f32> = (0..m * k)
                        .map(|i| {
                            let (r, p) = if a_t { (i % m, i / m) } else { (i / k, i % k) };
                            if lower_a && p > r {
                                0.0
                            } else {
                                val(i)
                            }
                        })
                        .collect();
                    let b: Vec<f32> = (0..k * n).map(|i| val(i + 5)).collect();
                    let c0: Vec<f32> = (0..m * n)
                        .map(|i| if beta == 0.0 { f32::NAN } else { val(i + 11) })
                        .collect();
                    let mut c = c0.clone();
                    let (rsa, csa) = if a_t { (1, m) } else { (k, 1) };
                    let o = Operands {
                        m,
                        k,
                        n,
                        alpha: -1.0,
                        a: a.as_ptr(),
                        rsa,
                        csa,
                        b: b.as_ptr(),
                        ldb: n,
                        beta,
                        c: c.as_mut_ptr(),
                        ldc: n,
                        lower_a,
                        lower_c,
                    };
                    // SAFETY: `kernels` lists the kernels of detected instruction sets; the
                    // buffers hold m x k, k x n and m x n.
                    unsafe { kernel(&o) };
                    for i in 0..m {
                        for j in 0..n {
                            if lower_c && j > i {
                                continue;
                            }
                            let mut s = 0f32;
                            for p in 0..k {
                                let x = if a_t { a[p * m + i] } else { a[i * k + p] };
                                s = x.mul_add(b[p * n + j], s);
                            }
                            let want = if beta == 0.0 {
                                -s
                            } else {
                                beta.mul_add(c0[i * n + j], -s)
                            };
                            assert_eq!(
                                c[i * n + j].to_bits(),
                                want.to_bits(),
                                "{name}: m {m} k {k} n {n} a_t {a_t} lower_a {lower_a} \
                                 lower_c {lower_c} beta {beta} at ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
