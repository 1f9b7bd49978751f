//! The CPU forward with every stage fused per (sequence, value head): each task walks its chunks
//! with the same block functions the stages use, on chunk-sized buffers that stay in cache, and
//! reads q/k/v where they lie (host tensors in their own dtype, or f32 buffers) one chunk at a
//! time. Nothing of size T is materialised except `o`, so memory stays near the inputs' size;
//! results are bitwise those of the staged path.
//!
//! Equals l2norm + gate + cumsum + kkt + solve_tril + wy + chunk_state + chunk_output.

use half::{bf16, f16};
use rayon::prelude::*;

use super::blocks::{gather_rows_with, scatter_rows};
use super::stages::chunk_output::output_block;
use super::stages::chunk_state::{advance_block, v_new_block};
use super::stages::cumsum::cumsum_block;
use super::stages::gate::Activation;
use super::stages::kkt::kkt_block;
use super::stages::l2norm::l2norm_row;
use super::stages::solve_tril::solve_tril_block;
use super::stages::wy::wy_block;
use crate::backend::StageInputs;
use crate::dtype::{Data, Tensor};
use crate::error::{check_len, Result};
use crate::forward::ForwardOut;
use crate::options::Options;
use crate::problem::{Chunk, Inputs, Problem};

/// What the fused forward returns: f32 `o` `[B, T, HV, V]`, final states `[N, HV, K, V]`
/// (K-major), and the state entering every chunk with `Options::output_chunk_states`.
pub type FusedOut = ForwardOut<Vec<f32>>;

/// A `[tokens, heads, width]` input, read one chunk of one head at a time.
pub(crate) trait ChunkRows: Sync {
    /// The `len x width` rows of chunk `c` for head `head`, as f32.
    fn rows(&self, c: &Chunk, heads: usize, head: usize, width: usize) -> Vec<f32>;
}

impl ChunkRows for Vec<f32> {
    fn rows(&self, c: &Chunk, heads: usize, head: usize, width: usize) -> Vec<f32> {
        gather_rows_with(self, |v| v, c, heads, head, width)
    }
}

impl ChunkRows for Tensor<'_> {
    fn rows(&self, c: &Chunk, heads: usize, head: usize, width: usize) -> Vec<f32> {
        match self.data() {
            Data::F32(d) => gather_rows_with(d, |v| v, c, heads, head, width),
            Data::BF16(d) => gather_rows_with(d, bf16::to_f32, c, heads, head, width),
            Data::F16(d) => gather_rows_with(d, f16::to_f32, c, heads, head, width),
        }
    }
}

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

/// The chunked forward on the CPU, fused (see the module doc), on host inputs: validates `x`
/// against `opts`. The same computation as [`crate::forward`] on [`crate::Device::Cpu`], with the
/// results left as f32 buffers and the final state K-major.
pub fn fused_forward(x: &Inputs<'_>, opts: &Options) -> Result<FusedOut> {
    fused_host(&Problem::from_inputs(x, opts)?, x, opts)
}

/// The fused forward on host inputs already validated into `p` with the same `opts`, read in
/// place in their own dtype.
pub(crate) fn fused_host(p: &Problem, x: &Inputs<'_>, opts: &Options) -> Result<FusedOut> {
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
    fused(
        p,
        opts,
        &Sources {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
            h0: h0.as_deref(),
            a_log: a_log.as_deref(),
            dt_bias: dt_bias.as_deref(),
        },
    )
}

/// The fused forward on f32 buffers (states K-major): the CPU's [`crate::Backend::forward`].
pub(crate) fn fused_staged(
    p: &Problem,
    opts: &Options,
    x: &StageInputs<Vec<f32>>,
) -> Result<FusedOut> {
    fused(
        p,
        opts,
        &Sources {
            q: &x.q,
            k: &x.k,
            v: &x.v,
            g: &x.g,
            beta: &x.beta,
            h0: x.h0.as_deref(),
            a_log: x.a_log.as_deref(),
            dt_bias: x.dt_bias.as_deref(),
        },
    )
}

fn fused<R: ChunkRows>(p: &Problem, opts: &Options, x: &Sources<'_, R>) -> Result<FusedOut> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    let scale = opts.scale_for(dk);
    let act = Activation::new(hv, opts, x.a_log, x.dt_bias)?;
    if let Some(h0) = x.h0 {
        check_len("initial_state", h0.len(), p.num_seqs() * hv * kv)?;
    }

    let tasks: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..p.num_seqs() * hv)
        .into_par_iter()
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
            let mut state =
                x.h0.map_or_else(|| vec![0f32; kv], |h0| h0[task * kv..][..kv].to_vec());
            let (s0, s1) = p.seqs()[n];
            let chunks = &p.chunks()[p.seq_chunks(n)];
            let mut o = vec![0f32; (s1 - s0) * dv];
            let mut hs = Vec::with_capacity(if opts.output_chunk_states {
                chunks.len() * kv
            } else {
                0
            });
            for c in chunks {
                let len = c.len;
                let (mut q, mut k, v) = (
                    x.q.rows(c, nh, kh, dk),
                    x.k.rows(c, nh, kh, dk),
                    x.v.rows(c, hv, j, dv),
                );
                if opts.use_qk_l2norm {
                    q.chunks_exact_mut(dk).for_each(l2norm_row);
                    k.chunks_exact_mut(dk).for_each(l2norm_row);
                }
                let g: Vec<f32> =
                    x.g.rows(c, hv, j, 1)
                        .into_iter()
                        .map(|g| act.g(g, j))
                        .collect();
                let beta: Vec<f32> = x
                    .beta
                    .rows(c, hv, j, 1)
                    .into_iter()
                    .map(|b| act.beta(b))
                    .collect();
                let d = cumsum_block(&g);
                let (mut a, mut a_inv) = (vec![0f32; len * len], vec![0f32; len * len]);
                kkt_block(&k, dk, &beta, &d, &mut a);
                solve_tril_block(&a, len, &mut a_inv);
                let (mut w, mut u) = (vec![0f32; len * dk], vec![0f32; len * dv]);
                wy_block(&a_inv, &k, &v, &beta, &d, &mut w, &mut u);
                if opts.output_chunk_states {
                    hs.extend_from_slice(&state);
                }
                let mut v_new = vec![0f32; len * dv];
                v_new_block(&w, &u, &state, dk, dv, &mut v_new);
                let o_c = &mut o[(c.start - s0) * dv..][..len * dv];
                output_block(&q, &k, &v_new, &state, &d, scale, o_c);
                advance_block(&k, &v_new, &d, dk, dv, &mut state);
            }
            (o, state, hs)
        })
        .collect();

    let mut o = vec![0f32; p.tokens() * hv * dv];
    let mut final_state = vec![0f32; p.num_seqs() * hv * kv];
    let mut h = opts
        .output_chunk_states
        .then(|| vec![0f32; p.chunks().len() * hv * kv]);
    for (task, (ot, fin, hs)) in tasks.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let s0 = p.seqs()[n].0;
        scatter_rows(&mut o, &ot, s0, hv, j, dv);
        final_state[task * kv..][..kv].copy_from_slice(&fin);
        if let Some(h) = &mut h {
            let first = p.seq_chunks(n).start;
            for (ci, hc) in hs.chunks_exact(kv).enumerate() {
                h[((first + ci) * hv + j) * kv..][..kv].copy_from_slice(hc);
            }
        }
    }
    Ok(ForwardOut { o, h, final_state })
}
