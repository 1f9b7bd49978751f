//! The CPU forward with every stage fused per (sequence, value head): each task walks its chunks
//! with the stages' block functions, on chunk-sized buffers that stay in cache, and
//! reads q/k/v where they lie (host tensors in their own dtype, or f32 buffers) one chunk at a
//! time, the next chunk's rows prefetched while this one is computed. A task takes the value
//! heads of one qk head together (they share q, k, `k k^T` and `q k^T`), or a tile of V's
//! columns when there are more threads than heads. Nothing of size T is materialised except
//! `o`, so memory stays near the inputs' size.
//!
//! Equals l2norm + gate + cumsum + kkt + solve_tril + wy + chunk_state + chunk_output, up to
//! rounding: `w` and `u` are never formed (see [`v_new_direct`]); every other block is the
//! stages' own.

use half::{bf16, f16};
use rayon::prelude::*;

use super::blocks::{
    causal_dots, gather_rows_with, gemm, gemm_causal, prefetch, transpose, try_zeroed,
    zeroed_output, Aligned, Decays, RowWriter,
};
use super::stages::chunk_output::output_block;
use super::stages::chunk_state::advance_block;
use super::stages::cumsum::cumsum_block;
use super::stages::gate::Activation;
use super::stages::kkt::kkt_block;
use super::stages::l2norm::l2norm_row;
use super::stages::solve_tril::solve_tril_block;
use crate::backend::StageInputs;
use crate::dtype::{Data, Tensor};
use crate::error::{check_len, Result};
use crate::forward::ForwardOut;
use crate::options::Options;
use crate::problem::{Chunk, Inputs, Problem};

/// What the fused forward returns: f32 `o` `[B, T, HV, V]`, final states `[N, HV, K, V]`
/// (K-major), and the state entering every chunk with `Options::output_chunk_states`.
pub type FusedOut = ForwardOut<Vec<f32>>;

/// Columns of a `[tokens, heads, width]` input: `width` and the range read.
#[derive(Clone, Copy)]
struct Cols {
    width: usize,
    first: usize,
    len: usize,
}

impl Cols {
    /// Every column of rows of `width`.
    fn all(width: usize) -> Cols {
        Cols {
            width,
            first: 0,
            len: width,
        }
    }
}

/// A `[tokens, heads, width]` input, read one chunk of one head at a time.
trait ChunkRows: Sync {
    /// Columns `cols` of the rows of chunk `c` for head `head` (`len x cols.len`), as f32, into
    /// `out`.
    fn rows(&self, c: &Chunk, heads: usize, head: usize, cols: Cols, out: &mut Vec<f32>);
    /// Starts fetching what [`ChunkRows::rows`] will read into the caches.
    fn prefetch(&self, c: &Chunk, heads: usize, head: usize, cols: Cols);
}

/// Prefetches columns `cols` of the rows of chunk `c` for head `head` of a
/// `[tokens, heads, width]` buffer.
fn prefetch_rows<T>(x: &[T], c: &Chunk, heads: usize, head: usize, cols: Cols) {
    for t in c.start..c.start + c.len {
        prefetch(x, (t * heads + head) * cols.width + cols.first, cols.len);
    }
}

/// [`ChunkRows::rows`] of a buffer of `T`, converted by `to_f32`.
fn gather<T: Copy, F: Fn(T) -> f32>(
    x: &[T],
    to_f32: F,
    c: &Chunk,
    heads: usize,
    head: usize,
    cols: Cols,
    out: &mut Vec<f32>,
) {
    let range = cols.first..cols.first + cols.len;
    gather_rows_with(x, to_f32, c, heads, head, cols.width, range, out)
}

impl ChunkRows for Vec<f32> {
    fn rows(&self, c: &Chunk, heads: usize, head: usize, cols: Cols, out: &mut Vec<f32>) {
        gather(self, |v| v, c, heads, head, cols, out)
    }
    fn prefetch(&self, c: &Chunk, heads: usize, head: usize, cols: Cols) {
        prefetch_rows(self, c, heads, head, cols);
    }
}

impl ChunkRows for Tensor<'_> {
    fn rows(&self, c: &Chunk, heads: usize, head: usize, cols: Cols, out: &mut Vec<f32>) {
        match self.data() {
            Data::F32(d) => gather(d, |v| v, c, heads, head, cols, out),
            Data::BF16(d) => gather(d, bf16::to_f32, c, heads, head, cols, out),
            Data::F16(d) => gather(d, f16::to_f32, c, heads, head, cols, out),
        }
    }
    fn prefetch(&self, c: &Chunk, heads: usize, head: usize, cols: Cols) {
        match self.data() {
            Data::F32(d) => prefetch_rows(d, c, heads, head, cols),
            Data::BF16(d) => prefetch_rows(d, c, heads, head, cols),
            Data::F16(d) => prefetch_rows(d, c, heads, head, cols),
        }
    }
}

/// What a task leaves for one of its value heads: `n * HV + j`, its first column, and its final
/// state and chunk states (`K x` its columns).
type TaskState = (usize, usize, Vec<f32>, Vec<f32>);

/// The output `o` shared by the tasks, each writing only its own (token, head) rows.
struct SharedOut(*mut f32);
// SAFETY: tasks write disjoint elements through the pointer (see its one use) while the buffer
// outlives them.
unsafe impl Sync for SharedOut {}

/// The fused forward's inputs where they lie; the initial state K-major (`[N, HV, K, V]`).
struct Sources<'a, R> {
    q: &'a R,
    k: &'a R,
    v: &'a R,
    g: &'a R,
    beta: &'a R,
    h0: Option<&'a [f32]>,
    a_log: Option<&'a [f32]>,
    dt_bias: Option<&'a [f32]>,
}

impl<'a, R> Sources<'a, R> {
    /// From q, k, v, g, beta and the initial state, A_log, dt_bias.
    fn new([q, k, v, g, beta]: [&'a R; 5], [h0, a_log, dt_bias]: [Option<&'a [f32]>; 3]) -> Self {
        Sources {
            q,
            k,
            v,
            g,
            beta,
            h0,
            a_log,
            dt_bias,
        }
    }
}

/// The chunked forward on the CPU, fused (see the module doc), on host inputs: validates `x`
/// against `opts`. The same computation as [`crate::forward`] on [`crate::Device::Cpu`], with the
/// results left as f32 buffers and the final state K-major.
pub fn fused_forward(x: &Inputs<'_>, opts: &Options) -> Result<FusedOut> {
    fused_host(&Problem::from_inputs(x, opts)?, x, opts)
}

/// The fused forward on host inputs already validated into `p` with the same `opts`, read in
/// place in their own dtype.
pub(crate) fn fused_host(p: &Problem, x: &Inputs<'_>, opts: &Options) -> Result<FusedOut> {
    on_host(p, x, opts, |src| fused(p, opts, src))
}

/// The fused forward into the caller's buffers, as an engine calls it: `o` `[B, T, HV, V]` and
/// `final_state` `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`, the layout
/// `initial_state` is read in), both f32; every element of both is written. Nothing of the size of T is allocated, so a caller that keeps
/// its buffers across calls pays no page faults for a fresh `o` (for a large `o`, the kernel's
/// zeroing of new pages costs about a tenth of the forward). `x` is read in place in its own
/// dtype and validated against `opts` as [`crate::forward`] does; the chunk states are not
/// written here (`output_chunk_states` is refused: [`fused_forward`] returns them).
///
/// ```
/// use deltanet::{Inputs, Options, Tensor};
/// let (t, h, hv, k, v) = (70, 1, 2, 16, 8);
/// let wave = |n: usize, a: f32| (0..n).map(|i| (i as f32 * a).sin()).collect::<Vec<f32>>();
/// let x = Inputs::new(
///     Tensor::from_f32(wave(t * h * k, 0.37), vec![1, t, h, k])?,
///     Tensor::from_f32(wave(t * h * k, 0.53), vec![1, t, h, k])?,
///     Tensor::from_f32(wave(t * hv * v, 0.71), vec![1, t, hv, v])?,
///     Tensor::from_f32(vec![-0.1; t * hv], vec![1, t, hv])?,
///     Tensor::from_f32(vec![0.5; t * hv], vec![1, t, hv])?,
/// );
/// let opts = Options { use_qk_l2norm: true, ..Options::default() };
/// // Buffers an engine keeps from call to call.
/// let (mut o, mut state) = (vec![0f32; t * hv * v], vec![0f32; hv * k * v]);
/// deltanet::cpu::forward_into(&x, &opts, &mut o, &mut state)?;
/// let same = deltanet::cpu::fused_forward(&x, &opts)?;
/// assert_eq!(o, same.o);
/// assert_eq!(state, same.final_state);
/// # Ok::<(), deltanet::Error>(())
/// ```
pub fn forward_into(
    x: &Inputs<'_>,
    opts: &Options,
    o: &mut [f32],
    final_state: &mut [f32],
) -> Result<()> {
    if opts.output_chunk_states {
        return Err(crate::error::Error::invalid(
            "opts.output_chunk_states",
            "false (forward_into writes o and the final state only)",
            "true",
        ));
    }
    let p = Problem::from_inputs(x, opts)?;
    let (hv, kv) = (p.v_heads(), p.state_len());
    check_len("o", o.len(), p.tokens() * hv * p.dv())?;
    check_len("final_state", final_state.len(), p.num_seqs() * hv * kv)?;
    on_host(&p, x, opts, |src| {
        fused_into(&p, opts, src, o, final_state, opts.state_v_first)
    })
    .map(|_| ())
}

/// Runs `f` on the [`Sources`] of host inputs: the token tensors in place, the small per-head
/// tensors and the initial state as f32 (K-major).
fn on_host<T>(
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
    f: impl FnOnce(&Sources<'_, Tensor<'_>>) -> Result<T>,
) -> Result<T> {
    let (a_log, dt_bias) = (
        x.a_log.as_ref().map(|t| t.to_f32()),
        x.dt_bias.as_ref().map(|t| t.to_f32()),
    );
    let h0 = x.initial_state.as_ref().map(|s| {
        let s = s.to_f32();
        if opts.state_v_first {
            std::borrow::Cow::Owned(crate::host::transpose_states(&s, p.dk(), p.dv(), false))
        } else {
            s
        }
    });
    let tokens = [&x.q, &x.k, &x.v, &x.g, &x.beta];
    let src = Sources::new(
        tokens,
        [h0.as_deref(), a_log.as_deref(), dt_bias.as_deref()],
    );
    f(&src)
}

/// The fused forward on f32 buffers (states K-major): the CPU's [`crate::Backend::forward`].
pub(crate) fn fused_staged(
    p: &Problem,
    opts: &Options,
    x: &StageInputs<Vec<f32>>,
) -> Result<FusedOut> {
    let tokens = [&x.q, &x.k, &x.v, &x.g, &x.beta];
    let src = Sources::new(
        tokens,
        [x.h0.as_deref(), x.a_log.as_deref(), x.dt_bias.as_deref()],
    );
    fused(p, opts, &src)
}

fn fused<R: ChunkRows>(p: &Problem, opts: &Options, x: &Sources<'_, R>) -> Result<FusedOut> {
    let mut o = zeroed_output(p.tokens() * p.v_heads() * p.dv(), "o")?;
    let mut final_state = try_zeroed(p.num_seqs() * p.v_heads() * p.state_len(), "final_state")?;
    let h = fused_into(p, opts, x, &mut o, &mut final_state, false)?;
    Ok(ForwardOut { o, h, final_state })
}

/// The chunk size the CPU's fused forward computes `p` in: the caller's `chunk_size`, or less
/// where that measured faster and no chunk states (which come at the caller's granularity) are
/// asked for. Per token and value head the chunk's own products (`k k^T`, `q k^T`, the
/// tri-solve's application, the causal `o` term) cost about `BT (K + V) / 2` multiply-adds
/// against the state products' `3 K V`, so at K = V = 128 chunks of 32 do about a tenth fewer
/// operations than chunks of 64; the result changes only by rounding. With the AVX2 kernel (a
/// 2-core Zen 3, T=4096, H=16, HV=32, K=V=128, f32) chunks of 32 were faster in 32 of 44
/// interleaved pairs at one and two threads, by 5-10 % (NOTES-CPU.md); the AVX-512 kernel
/// keeps the caller's chunk until measured there, and the portable build takes 32 for the
/// operation count alone. `DELTANET_CPU_CHUNK=16|32|64`, read once, sets it (never above the
/// caller's), for measurements.
///
/// ```
/// use deltanet::{Dims, Options, Problem};
/// let dims = Dims { batch: 1, seq_len: 100, heads: 1, v_heads: 1, dk: 16, dv: 16 };
/// let opts = Options { output_chunk_states: true, ..Options::default() };
/// let p = Problem::new(dims, None, &opts)?;
/// // Chunk states are asked for: they come at the caller's chunk size.
/// assert_eq!(deltanet::cpu::computed_chunk_size(&p, &opts), 64);
/// # Ok::<(), deltanet::Error>(())
/// ```
pub fn computed_chunk_size(p: &Problem, opts: &Options) -> usize {
    if opts.output_chunk_states {
        return p.chunk_size();
    }
    static FROM_ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let from_env = FROM_ENV.get_or_init(|| {
        std::env::var("DELTANET_CPU_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|bt| crate::options::CHUNK_SIZES.contains(bt))
    });
    let chosen = from_env.unwrap_or(if super::use_avx512() {
        p.chunk_size()
    } else {
        32
    });
    chosen.min(p.chunk_size())
}

/// [`fused`] into `o` and `final_state` (of the problem's sizes; the final state V-first with
/// `v_first_out`, else K-major); returns the chunk states (K-major) where `opts` asks for them.
fn fused_into<R: ChunkRows>(
    p: &Problem,
    opts: &Options,
    x: &Sources<'_, R>,
    o: &mut [f32],
    final_state: &mut [f32],
    v_first_out: bool,
) -> Result<Option<Vec<f32>>> {
    let rechunked;
    let p = match computed_chunk_size(p, opts) {
        bt if bt < p.chunk_size() => {
            rechunked = p.rechunked(bt)?;
            &rechunked
        }
        _ => p,
    };
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    let scale = opts.scale_for(dk);
    let act = Activation::new(hv, opts, x.a_log, x.dt_bias)?;
    if let Some(h0) = x.h0 {
        check_len("initial_state", h0.len(), p.num_seqs() * hv * kv)?;
    }

    // One task per (sequence, qk head, share of its value heads, tile of V): the value heads of
    // one qk head share q, k and the products of the chunk's tokens, so they go together, and
    // V stays whole, unless the threads need more tasks. The columns of V are independent
    // (only `A_strict` and `A_inv` span them, and each tile recomputes those), and each
    // value head's arithmetic is the same however heads and columns are split, so results do
    // not depend on the thread count.
    let threads = rayon::current_num_threads();
    let per_qk = hv / nh;
    let group_of: Vec<Vec<usize>> = (0..nh)
        .map(|kh| (0..hv).filter(|&j| p.qk_head(j) == kh).collect())
        .collect();
    let mut shares = 1;
    while shares < per_qk && p.num_seqs() * nh * shares < 2 * threads {
        shares += 1;
        while per_qk % shares != 0 {
            shares += 1;
        }
    }
    // Tiles of whole zmm registers: halved while each half keeps 16 columns or more.
    let mut tiles = 1;
    while p.num_seqs() * nh * shares * tiles < 2 * threads
        && dv % (2 * tiles) == 0
        && dv / (2 * tiles) >= 16
        && (dv / (2 * tiles)) % 16 == 0
    {
        tiles *= 2;
    }
    let (per_task, tw) = ((per_qk / shares).max(1), dv / tiles);
    let tasks: Vec<(usize, &[usize], usize)> = (0..p.num_seqs())
        .flat_map(|n| {
            group_of.iter().flat_map(move |g| {
                g.chunks(per_task)
                    .flat_map(move |js| (0..tiles).map(move |tile| (n, js, tile * tw)))
            })
        })
        .collect();
    // Columns c0..c0 + tw of the K rows of a state `[.., K, V]` at `at`.
    let state_rows =
        move |at: usize, c0: usize| (0..dk).map(move |r| at + r * dv + c0..at + r * dv + c0 + tw);

    check_len("o", o.len(), p.tokens() * hv * dv)?;
    check_len("final_state", final_state.len(), p.num_seqs() * hv * kv)?;
    let out = SharedOut(o.as_mut_ptr());
    let writer = RowWriter::new(std::mem::size_of_val(o));
    let bt = p.chunk_size();
    let results: Vec<Vec<TaskState>> = tasks
        .par_iter()
        .map(|&(n, js, c0)| {
            let out = &out;
            let kh = p.qk_head(js[0]);
            let v_cols = Cols {
                width: dv,
                first: c0,
                len: tw,
            };
            let mut states: Vec<Aligned> = js
                .iter()
                .map(|&j| {
                    let mut state = Aligned::zeroed(dk * tw);
                    if let Some(h0) = x.h0 {
                        let rows = state_rows((n * hv + j) * kv, c0);
                        for (row, r) in state.chunks_exact_mut(tw).zip(rows) {
                            row.copy_from_slice(&h0[r]);
                        }
                    }
                    state
                })
                .collect();
            let chunks = &p.chunks()[p.seq_chunks(n)];
            let mut hs: Vec<Vec<f32>> = js
                .iter()
                .map(|_| {
                    Vec::with_capacity(if opts.output_chunk_states {
                        chunks.len() * dk * tw
                    } else {
                        0
                    })
                })
                .collect();
            // Chunk-sized work buffers, allocated once per task; those the products read as
            // `b` or write start on a cache line.
            let [mut q, mut k, mut v, mut g, mut beta] =
                std::array::from_fn(|_| Vec::with_capacity(bt * dk.max(tw)));
            let mut kt = Aligned::zeroed(bt * dk);
            let [mut r, mut v_new, mut o_c] = std::array::from_fn(|_| Aligned::zeroed(bt * tw));
            let [mut kk, mut qk, mut a, mut a_inv, mut pairs, mut scratch] =
                std::array::from_fn(|_| Aligned::zeroed(bt * bt));
            // The next chunk's rows are prefetched in `steps` parts spread over this chunk's
            // work, so that the loads overlap the products instead of stalling in one burst.
            let steps = 4 * js.len();
            let prefetch_part = |next: &Chunk, step: usize| {
                let (t0, t1) = (next.len * step / steps, next.len * (step + 1) / steps);
                let part = Chunk {
                    start: next.start + t0,
                    len: t1 - t0,
                    ..*next
                };
                x.q.prefetch(&part, nh, kh, Cols::all(dk));
                x.k.prefetch(&part, nh, kh, Cols::all(dk));
                for &j in js {
                    x.v.prefetch(&part, hv, j, v_cols);
                    x.g.prefetch(&part, hv, j, Cols::all(1));
                    x.beta.prefetch(&part, hv, j, Cols::all(1));
                }
            };
            for (ci, c) in chunks.iter().enumerate() {
                let next = chunks.get(ci + 1);
                let mut step = 0;
                let mut prefetch_step = || {
                    if let Some(next) = next {
                        prefetch_part(next, step);
                        step += 1;
                    }
                };
                let len = c.len;
                x.q.rows(c, nh, kh, Cols::all(dk), &mut q);
                x.k.rows(c, nh, kh, Cols::all(dk), &mut k);
                if opts.use_qk_l2norm {
                    q.chunks_exact_mut(dk).for_each(l2norm_row);
                    k.chunks_exact_mut(dk).for_each(l2norm_row);
                }
                let (kt, kk, qk) = (
                    &mut kt[..len * dk],
                    &mut kk[..len * len],
                    &mut qk[..len * len],
                );
                transpose(&k, len, dk, kt);
                causal_dots(&k, kt, len, dk, kk);
                causal_dots(&q, kt, len, dk, qk);
                for (jj, &j) in js.iter().enumerate() {
                    let state = &mut states[jj];
                    x.v.rows(c, hv, j, v_cols, &mut v);
                    x.g.rows(c, hv, j, Cols::all(1), &mut g);
                    x.beta.rows(c, hv, j, Cols::all(1), &mut beta);
                    g.iter_mut().for_each(|g| *g = act.g(*g, j));
                    beta.iter_mut().for_each(|b| *b = act.beta(*b));
                    let d = cumsum_block(&g);
                    let (a, a_inv, pairs, scratch) = (
                        &mut a[..len * len],
                        &mut a_inv[..len * len],
                        &mut pairs[..len * len],
                        &mut scratch[..len * len],
                    );
                    let (r, v_new, o_c) = (
                        &mut r[..len * tw],
                        &mut v_new[..len * tw],
                        &mut o_c[..len * tw],
                    );
                    prefetch_step();
                    d.pairs(pairs);
                    kkt_block(kk, &beta, pairs, a);
                    solve_tril_block(a, len, a_inv);
                    prefetch_step();
                    if opts.output_chunk_states {
                        hs[jj].extend_from_slice(state);
                    }
                    v_new_direct(a_inv, &k, &v, &beta, &d, state, r, v_new);
                    prefetch_step();
                    output_block(&q, qk, v_new, state, &d, pairs, scale, scratch, o_c);
                    for (i, row) in o_c.chunks_exact(tw).enumerate() {
                        // SAFETY: `o` holds `tokens x hv x dv` elements and outlives the tasks;
                        // these columns of this row (token `c.start + i`, head `j`) belong to
                        // this task alone: tasks are disjoint sets of (sequence, value head,
                        // columns), and a sequence's chunks hold its tokens only.
                        unsafe {
                            writer.write(row, out.0.add(((c.start + i) * hv + j) * dv + c0));
                        }
                    }
                    prefetch_step();
                    advance_block(&k, v_new, &d, dk, tw, state);
                }
            }
            writer.finish();
            js.iter()
                .zip(states)
                .zip(hs)
                .map(|((&j, s), h)| (n * hv + j, c0, s.to_vec(), h))
                .collect()
        })
        .collect();

    let mut h = opts
        .output_chunk_states
        .then(|| vec![0f32; p.chunks().len() * hv * kv]);
    for (nj, c0, fin, hs) in results.into_iter().flatten() {
        let (n, j) = (nj / hv, nj % hv);
        if v_first_out {
            // Column c of the K x V state is row c of the V x K one.
            for (r, row) in fin.chunks_exact(tw).enumerate() {
                for (c, &x) in row.iter().enumerate() {
                    final_state[nj * kv + (c0 + c) * dk + r] = x;
                }
            }
        } else {
            for (r, row) in state_rows(nj * kv, c0).zip(fin.chunks_exact(tw)) {
                final_state[r].copy_from_slice(row);
            }
        }
        if let Some(h) = &mut h {
            let first = p.seq_chunks(n).start;
            for (ci, hc) in hs.chunks_exact(dk * tw).enumerate() {
                let at = ((first + ci) * hv + j) * kv;
                for (r, row) in state_rows(at, c0).zip(hc.chunks_exact(tw)) {
                    h[r].copy_from_slice(row);
                }
            }
        }
    }
    Ok(h)
}

/// `v_new = A_inv (beta (v - e^gamma K h))` for one chunk of one head: `k` is `n x K`, `v`, `r`
/// (scratch) and `v_new` `n x V`, `state` (h) `K x V`. This equals the stages' `u - w h` with
/// `w = A_inv (beta e^gamma K)` and `u = A_inv (beta v)` (wy, then chunk_state's v_new), with
/// `A_inv` taken out of both: one `n x K x V` product and one triangular `n x n x V` one instead
/// of the triangular `n x n x (K + V)` pair and the `n x K x V`, about a quarter fewer
/// multiply-adds per chunk at K = V, and `w` never written. The GPU's fused kernels take the
/// same form.
#[allow(clippy::too_many_arguments)]
fn v_new_direct(
    a_inv: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    d: &Decays,
    state: &[f32],
    r: &mut [f32],
    v_new: &mut [f32],
) {
    let n = beta.len();
    if n == 0 {
        return;
    }
    let (dk, dv) = (k.len() / n, v.len() / n);
    gemm(n, dk, dv, 1.0, k, false, state, false, 0.0, r);
    for (l, (row, v_row)) in r.chunks_exact_mut(dv).zip(v.chunks_exact(dv)).enumerate() {
        let (decay, b) = (d.decay0(l), beta[l]);
        for (x, &vc) in row.iter_mut().zip(v_row) {
            *x = b * (vc - decay * *x);
        }
    }
    gemm_causal(n, dv, a_inv, r, 0.0, v_new);
}

#[cfg(test)]
mod tests {
    use super::super::stages::chunk_state::v_new_block;
    use super::super::stages::wy::wy_block;
    use super::*;

    /// Times each block of one chunk on its own at the usual shape (chunk 64, K = V = 128):
    /// `cargo test --release --lib block_times -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run by hand"]
    fn block_times() {
        let (n, dk, dv, reps) = (64usize, 128usize, 128usize, 2000u32);
        let vals = |len: usize, seed: u64| -> Vec<f32> {
            let mut r = crate::selftest::Rng::new(seed);
            (0..len).map(|_| r.range(-0.5, 0.5)).collect()
        };
        let (mut q, mut k, v) = (vals(n * dk, 1), vals(n * dk, 2), vals(n * dv, 3));
        q.chunks_exact_mut(dk).for_each(l2norm_row);
        k.chunks_exact_mut(dk).for_each(l2norm_row);
        let g: Vec<f32> = vals(n, 4).iter().map(|x| -0.05 - 0.1 * x.abs()).collect();
        let beta: Vec<f32> = vals(n, 5).iter().map(|x| 0.5 + x).collect();
        let state = vals(dk * dv, 6);
        let d = cumsum_block(&g);
        let (mut pairs, mut kt, mut a, mut a_inv) = (
            vec![0f32; n * n],
            vec![0f32; n * dk],
            vec![0f32; n * n],
            vec![0f32; n * n],
        );
        let (mut kk, mut qk, mut scratch) =
            (vec![0f32; n * n], vec![0f32; n * n], vec![0f32; n * n]);
        let (mut w, mut u, mut v_new, mut o) = (
            vec![0f32; n * dk],
            vec![0f32; n * dv],
            vec![0f32; n * dv],
            vec![0f32; n * dv],
        );
        let mut h = state.clone();
        let time = |name: &str, flops: f64, f: &mut dyn FnMut()| {
            f();
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f();
            }
            let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
            println!("{name:<12} {us:8.2} us  {:6.1} GFLOP/s", flops / us / 1e3);
        };
        let (nf, kf, vf) = (n as f64, dk as f64, dv as f64);
        time("pairs", nf * nf / 2.0, &mut || d.pairs(&mut pairs));
        time("transpose", 0.0, &mut || transpose(&k, n, dk, &mut kt));
        time("k k^T", 2.0 * nf * nf * kf, &mut || {
            causal_dots(&k, &kt, n, dk, &mut kk)
        });
        time("q k^T", 2.0 * nf * nf * kf, &mut || {
            causal_dots(&q, &kt, n, dk, &mut qk)
        });
        time("kkt", 0.0, &mut || kkt_block(&kk, &beta, &pairs, &mut a));
        time("solve_tril", nf * nf * nf / 3.0, &mut || {
            solve_tril_block(&a, n, &mut a_inv)
        });
        time("wy", nf * nf * (kf + vf), &mut || {
            wy_block(&a_inv, &k, &v, &beta, &d, &mut w, &mut u)
        });
        time("v_new", 2.0 * nf * kf * vf, &mut || {
            v_new_block(&w, &u, &state, dk, dv, &mut v_new)
        });
        let mut r = vec![0f32; n * dv];
        time(
            "v_new_direct",
            2.0 * nf * kf * vf + nf * nf * vf,
            &mut || v_new_direct(&a_inv, &k, &v, &beta, &d, &state, &mut r, &mut v_new),
        );
        time("output", 2.0 * nf * kf * vf + nf * nf * vf, &mut || {
            output_block(
                &q,
                &qk,
                &v_new,
                &state,
                &d,
                &pairs,
                1.0,
                &mut scratch,
                &mut o,
            )
        });
        time("advance", 2.0 * nf * kf * vf, &mut || {
            advance_block(&k, &v_new, &d, dk, dv, &mut h)
        });
    }
}
