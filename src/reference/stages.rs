//! The float64 definition of every stage of the chunked forward. Each takes the stage's own
//! inputs (f32 from a device or f64 from the definition before it), so a device's stage can be
//! judged on its own.

use super::{initial_state_k_major, states_to_caller, tensor_f64, widen, Real, Reference};
use crate::backend::{ChunkStates, Wy, RESET_LOG_DECAY};
use crate::error::Result;
use crate::options::Options;
use crate::problem::{Chunk, Inputs, Problem};

/// `ln(1 + e^x)`, linear above 20 where the two agree in f64.
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Rows of `dim` divided by `sqrt(sum x^2 + 1e-6)`.
pub fn l2norm<T: Real>(x: &[T], dim: usize) -> Vec<f64> {
    let mut out = widen(x);
    for row in out.chunks_exact_mut(dim) {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
    out
}

/// The effective log decay `[B, T, HV]`: with the gate parameters `(A_log, dt_bias)` (each
/// `[HV]`, given exactly when `gate_in_kernel` is set), `-exp(A_log[j]) softplus(g + dt_bias[j])`
/// for value head j; otherwise g itself.
pub fn gate(g: &[f32], hv: usize, params: Option<(&[f32], &[f32])>) -> Vec<f64> {
    match params {
        Some((a_log, dt_bias)) => g
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let j = i % hv;
                -(a_log[j] as f64).exp() * softplus(x as f64 + dt_bias[j] as f64)
            })
            .collect(),
        None => widen(g),
    }
}

/// The effective beta: with `beta_is_logits`, `sigmoid(beta)` (twice that with
/// `allow_neg_eigval`); otherwise beta itself.
pub fn beta_activation(beta: &[f32], opts: &Options) -> Vec<f64> {
    let mut b = widen(beta);
    if opts.beta_is_logits {
        let m = if opts.allow_neg_eigval { 2.0 } else { 1.0 };
        b.iter_mut().for_each(|x| *x = m / (1.0 + (-*x).exp()));
    }
    b
}

/// The inputs in float64 after the optional l2norm of q and k and the gate and beta
/// activations: what the recurrence consumes.
#[derive(Clone, Debug)]
pub struct Activated64 {
    /// `[B, T, H, K]`.
    pub q: Vec<f64>,
    /// `[B, T, H, K]`.
    pub k: Vec<f64>,
    /// `[B, T, HV, V]`.
    pub v: Vec<f64>,
    /// The effective log decay `[B, T, HV]`.
    pub g: Vec<f64>,
    /// The effective beta `[B, T, HV]`.
    pub beta: Vec<f64>,
}

/// `x` in float64, activated as `opts` say (see [`Activated64`]).
pub fn activate(x: &Inputs<'_>, opts: &Options) -> Result<Activated64> {
    let p = Problem::from_inputs(x, opts)?;
    let (q, k) = if opts.use_qk_l2norm {
        (l2norm(&x.q.to_f32(), p.dk()), l2norm(&x.k.to_f32(), p.dk()))
    } else {
        (tensor_f64(&x.q), tensor_f64(&x.k))
    };
    let a_log = x.a_log.as_ref().map(|t| t.to_f32());
    let dt_bias = x.dt_bias.as_ref().map(|t| t.to_f32());
    let params = match (opts.gate_in_kernel, &a_log, &dt_bias) {
        (true, Some(a), Some(d)) => Some((&a[..], &d[..])),
        // Problem::from_inputs has refused gate_in_kernel without both.
        _ => None,
    };
    Ok(Activated64 {
        q,
        k,
        v: tensor_f64(&x.v),
        g: gate(&x.g.to_f32(), p.v_heads(), params),
        beta: beta_activation(&x.beta.to_f32(), opts),
    })
}

/// The within-chunk cumulative log decay and its decay rule, in float64.
///
/// `gamma[t]` is the sum of g over the chunk's tokens up to t, restarted at every hard reset
/// (a gate below [`RESET_LOG_DECAY`]); `seg[t]` counts the chunk's resets up to t. The decay
/// from token j to token i of one chunk (j <= i) is `exp(gamma[i] - gamma[j])` when
/// `seg[i] == seg[j]` and 0 otherwise; from the state entering the chunk to token i it is
/// `exp(gamma[i])` when `seg[i] == 0` and 0 otherwise. Indices are flat `[B, T, HV]` ones.
#[derive(Clone, Debug)]
pub struct Gamma64 {
    /// Cumulative log decay within the chunk and reset segment.
    pub gamma: Vec<f64>,
    /// Hard resets so far in the chunk.
    pub seg: Vec<f32>,
}

impl Gamma64 {
    /// A device's [`crate::Gamma`] (downloaded), read as its contract says: `gamma + lo` is the
    /// sum.
    pub fn from_stage(gamma: &[f32], lo: &[f32], seg: &[f32]) -> Gamma64 {
        Gamma64 {
            gamma: gamma
                .iter()
                .zip(lo)
                .map(|(&g, &l)| g as f64 + l as f64)
                .collect(),
            seg: seg.to_vec(),
        }
    }

    /// The decay from token j to token i of the same chunk (j <= i).
    pub fn decay(&self, i: usize, j: usize) -> f64 {
        if self.seg[i] == self.seg[j] {
            (self.gamma[i] - self.gamma[j]).exp()
        } else {
            0.0
        }
    }

    /// The decay from the state entering the chunk to token i.
    pub fn decay0(&self, i: usize) -> f64 {
        if self.seg[i] == 0.0 {
            self.gamma[i].exp()
        } else {
            0.0
        }
    }
}

/// The definition of the chunk_local_cumsum stage on the effective gates `g` (`[B, T, HV]`).
pub fn chunk_local_cumsum<T: Real>(p: &Problem, g: &[T]) -> Gamma64 {
    let hv = p.v_heads();
    let mut out = Gamma64 {
        gamma: vec![0.0; g.len()],
        seg: vec![0.0; g.len()],
    };
    for c in p.chunks() {
        for j in 0..hv {
            let (mut acc, mut resets) = (0f64, 0f32);
            for t in c.start..c.start + c.len {
                let x: f64 = g[t * hv + j].into();
                if x < RESET_LOG_DECAY as f64 {
                    acc = 0.0;
                    resets += 1.0;
                } else {
                    acc += x;
                }
                out.gamma[t * hv + j] = acc;
                out.seg[t * hv + j] = resets;
            }
        }
    }
    out
}

/// Calls `f(chunk, j, index)` for every chunk and value head, with `index(i, l)` the flat
/// position of row i, column l of that block in a `[B, T, HV, BT]` matrix.
fn for_blocks(p: &Problem, mut f: impl FnMut(&Chunk, usize, &dyn Fn(usize, usize) -> usize)) {
    let (hv, bt) = (p.v_heads(), p.chunk_size());
    for c in p.chunks() {
        for j in 0..hv {
            let at = |i: usize, l: usize| ((c.start + i) * hv + j) * bt + l;
            f(c, j, &at);
        }
    }
}

/// Row t of key head `kh` of a `[B, T, H, K]` tensor.
fn key_row<'a, T>(x: &'a [T], p: &Problem, t: usize, kh: usize) -> &'a [T] {
    &x[(t * p.heads() + kh) * p.dk()..][..p.dk()]
}

fn dot<T: Real>(a: &[T], b: &[T]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x.into() * y.into()).sum()
}

/// The definition of `A_strict` (chunk_scaled_dot_kkt), `[B, T, HV, BT]`: within each chunk,
/// `A[i, l] = beta_i (k_i . k_l) decay(i, l)` for l < i, zero elsewhere.
pub fn a_strict<T: Real>(p: &Problem, k: &[T], beta: &[T], gamma: &Gamma64) -> Vec<f64> {
    let hv = p.v_heads();
    let mut a = vec![0f64; p.tokens() * hv * p.chunk_size()];
    for_blocks(p, |c, j, at| {
        let kh = p.qk_head(j);
        for i in 1..c.len {
            let ti = (c.start + i) * hv + j;
            let ki = key_row(k, p, c.start + i, kh);
            for l in 0..i {
                let tl = (c.start + l) * hv + j;
                a[at(i, l)] =
                    beta[ti].into() * dot(ki, key_row(k, p, c.start + l, kh)) * gamma.decay(ti, tl);
            }
        }
    });
    a
}

/// The definition of `A_inv` (solve_tril): `(I + A_strict)^-1` of every block, by forward
/// substitution; zero past a short chunk.
pub fn a_inv<T: Real>(p: &Problem, a_strict: &[T]) -> Vec<f64> {
    let mut x = vec![0f64; a_strict.len()];
    for_blocks(p, |c, _, at| {
        for i in 0..c.len {
            for l in 0..=i {
                let id = if i == l { 1.0 } else { 0.0 };
                let s: f64 = (l..i)
                    .map(|m| a_strict[at(i, m)].into() * x[at(m, l)])
                    .sum();
                x[at(i, l)] = id - s;
            }
        }
    });
    x
}

/// How far a computed `A_inv` is from inverting `I + A_strict`.
#[derive(Clone, Copy, Debug)]
pub struct InverseResidual {
    /// The largest `|((I + A_strict) A_inv - I)[i, l]|` over every block.
    pub max_abs: f64,
    /// The largest `|A_inv[i, l]|` (at least 1), to make `max_abs` relative.
    pub max_entry: f64,
    /// The largest `|A_inv[i, l]|` where it must be zero: above the diagonal or past a short
    /// chunk.
    pub outside: f64,
}

/// Measures `a_inv` against `(I + a_strict) a_inv = I`.
pub fn inverse_residual(p: &Problem, a_strict: &[f32], a_inv: &[f32]) -> InverseResidual {
    let bt = p.chunk_size();
    let mut r = InverseResidual {
        max_abs: 0.0,
        max_entry: 1.0,
        outside: 0.0,
    };
    for_blocks(p, |c, _, at| {
        for i in 0..c.len {
            for l in 0..bt {
                let x = a_inv[at(i, l)] as f64;
                if l > i || l >= c.len {
                    r.outside = r.outside.max(x.abs());
                    continue;
                }
                r.max_entry = r.max_entry.max(x.abs());
                let prod = x
                    + (0..i)
                        .map(|m| a_strict[at(i, m)] as f64 * a_inv[at(m, l)] as f64)
                        .sum::<f64>();
                let id = if i == l { 1.0 } else { 0.0 };
                r.max_abs = r.max_abs.max((prod - id).abs());
            }
        }
    });
    r
}

/// The definition of recompute_w_u: `w = A_inv diag(beta decay0) K` (`[B, T, HV, K]`) and
/// `u = A_inv diag(beta) V` (`[B, T, HV, V]`), block by block.
pub fn w_u<T: Real>(
    p: &Problem,
    k: &[T],
    v: &[T],
    beta: &[T],
    gamma: &Gamma64,
    a_inv: &[T],
) -> Wy<Vec<f64>> {
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let mut w = vec![0f64; p.tokens() * hv * dk];
    let mut u = vec![0f64; p.tokens() * hv * dv];
    for_blocks(p, |c, j, at| {
        let kh = p.qk_head(j);
        for i in 0..c.len {
            let ti = (c.start + i) * hv + j;
            for l in 0..=i {
                let tl = (c.start + l) * hv + j;
                let x = a_inv[at(i, l)].into() * beta[tl].into();
                if x == 0.0 {
                    continue;
                }
                let e = gamma.decay0(tl);
                let kl = key_row(k, p, c.start + l, kh);
                for (o, &kv) in w[ti * dk..][..dk].iter_mut().zip(kl) {
                    *o += x * e * kv.into();
                }
                for (o, &vv) in u[ti * dv..][..dv].iter_mut().zip(&v[tl * dv..][..dv]) {
                    *o += x * vv.into();
                }
            }
        }
    });
    Wy { w, u }
}

/// `v_new = u - w h` for the tokens of chunk `ci`, value head j, given the state `h` entering
/// it (K-major `[K, V]`).
fn v_new_block<T: Real, H: Real>(
    p: &Problem,
    ci: usize,
    j: usize,
    wy: &Wy<Vec<T>>,
    h: &[H],
    out: &mut [f64],
) {
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let c = p.chunks()[ci];
    for t in c.start..c.start + c.len {
        let tj = t * hv + j;
        for col in 0..dv {
            let wh: f64 = (0..dk)
                .map(|r| wy.w[tj * dk + r].into() * h[r * dv + col].into())
                .sum();
            out[tj * dv + col] = wy.u[tj * dv + col].into() - wh;
        }
    }
}

/// The definition of `v_new = u - w h` (`[B, T, HV, V]`), with `h` the state entering every
/// chunk (`[chunks, HV, K, V]`).
pub fn v_new<T: Real>(p: &Problem, wy: &Wy<Vec<T>>, h: &[T]) -> Vec<f64> {
    let (hv, kv) = (p.v_heads(), p.dk() * p.dv());
    let mut out = vec![0f64; p.tokens() * hv * p.dv()];
    for ci in 0..p.chunks().len() {
        for j in 0..hv {
            v_new_block(p, ci, j, wy, &h[(ci * hv + j) * kv..][..kv], &mut out);
        }
    }
    out
}

/// The definition of chunk_state: per sequence and value head, from `h0` (`[N, HV, K, V]`,
/// zeros without one), each chunk's `v_new = u - w h` and then
/// `h <- decay0(last) h + sum_i decay(last, i) k_i v_new_i^T`.
pub fn chunk_state<T: Real>(
    p: &Problem,
    k: &[T],
    wy: &Wy<Vec<T>>,
    gamma: &Gamma64,
    h0: Option<&[T]>,
) -> ChunkStates<Vec<f64>> {
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let mut out = ChunkStates {
        h: vec![0f64; p.chunks().len() * hv * kv],
        v_new: vec![0f64; p.tokens() * hv * dv],
        final_state: vec![0f64; p.num_seqs() * hv * kv],
    };
    for n in 0..p.num_seqs() {
        for j in 0..hv {
            let kh = p.qk_head(j);
            let mut h = match h0 {
                Some(h0) => widen(&h0[(n * hv + j) * kv..][..kv]),
                None => vec![0f64; kv],
            };
            for ci in p.seq_chunks(n) {
                let c = p.chunks()[ci];
                out.h[(ci * hv + j) * kv..][..kv].copy_from_slice(&h);
                v_new_block(p, ci, j, wy, &h, &mut out.v_new);
                let tj = |i: usize| (c.start + i) * hv + j;
                let last = tj(c.len - 1);
                let d_last = gamma.decay0(last);
                h.iter_mut().for_each(|x| *x *= d_last);
                for i in 0..c.len {
                    let d = gamma.decay(last, tj(i));
                    let ki = key_row(k, p, c.start + i, kh);
                    let vi = &out.v_new[tj(i) * dv..][..dv];
                    for (r, &kr) in ki.iter().enumerate() {
                        let kr = d * kr.into();
                        for (x, &vc) in h[r * dv..][..dv].iter_mut().zip(vi) {
                            *x += kr * vc;
                        }
                    }
                }
            }
            out.final_state[(n * hv + j) * kv..][..kv].copy_from_slice(&h);
        }
    }
    out
}

/// The definition of chunk_output (`[B, T, HV, V]`):
/// `o_i = scale (decay0(i) q_i^T h + sum_{l <= i} decay(i, l) (q_i . k_l) v_new_l)`, with `h` the
/// state entering the chunk (`[chunks, HV, K, V]`).
pub fn chunk_output<X: Real, Y: Real>(
    p: &Problem,
    q: &[X],
    k: &[X],
    v_new: &[Y],
    h: &[Y],
    gamma: &Gamma64,
    scale: f64,
) -> Vec<f64> {
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let mut o = vec![0f64; p.tokens() * hv * dv];
    for (ci, c) in p.chunks().iter().enumerate() {
        for j in 0..hv {
            let kh = p.qk_head(j);
            let hs = &h[(ci * hv + j) * kv..][..kv];
            for i in 0..c.len {
                let ti = (c.start + i) * hv + j;
                let qi = key_row(q, p, c.start + i, kh);
                let out = &mut o[ti * dv..][..dv];
                let d0 = gamma.decay0(ti);
                if d0 != 0.0 {
                    for (col, o) in out.iter_mut().enumerate() {
                        let qh: f64 = (0..dk)
                            .map(|r| qi[r].into() * hs[r * dv + col].into())
                            .sum();
                        *o += d0 * qh;
                    }
                }
                for l in 0..=i {
                    let tl = (c.start + l) * hv + j;
                    let d = gamma.decay(ti, tl);
                    if d == 0.0 {
                        continue;
                    }
                    let qk = dot(qi, key_row(k, p, c.start + l, kh));
                    for (o, &vv) in out.iter_mut().zip(&v_new[tl * dv..][..dv]) {
                        *o += qk * d * vv.into();
                    }
                }
                out.iter_mut().for_each(|x| *x *= scale);
            }
        }
    }
    o
}

/// The chunked forward composed of the stage definitions above, all in float64. It equals
/// [`super::reference()`] up to float64 rounding; `h` is [`ChunkStates::h`].
pub fn chunked(x: &Inputs<'_>, opts: &Options) -> Result<Reference> {
    let p = Problem::from_inputs(x, opts)?;
    let a = activate(x, opts)?;
    let gamma = chunk_local_cumsum(&p, &a.g);
    let a_s = a_strict(&p, &a.k, &a.beta, &gamma);
    let a_i = a_inv(&p, &a_s);
    let wy = w_u(&p, &a.k, &a.v, &a.beta, &gamma, &a_i);
    let h0 = initial_state_k_major(x, &p, opts.state_v_first);
    let st = chunk_state(&p, &a.k, &wy, &gamma, Some(&h0));
    let scale = opts
        .scale
        .map(|s| s as f64)
        .unwrap_or(1.0 / (p.dk() as f64).sqrt());
    let o = chunk_output(&p, &a.q, &a.k, &st.v_new, &st.h, &gamma, scale);
    Ok(Reference {
        o,
        final_state: states_to_caller(&st.final_state, p.dk(), p.dv(), opts.state_v_first),
        h: st.h,
    })
}
