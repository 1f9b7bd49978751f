//! The one generator of test problems: a deterministic random number generator, random
//! [`Spec`]s that respect the option rules, the inputs they describe, and realistic layer inputs
//! for `demo` and `bench`.

use crate::dtype::{DType, Data, Tensor};
use crate::error::Result;
use crate::options::{HeadMap, Options, CHUNK_SIZES};
use crate::problem::Inputs;
use std::borrow::Cow;

/// A small deterministic generator (SplitMix64): the same seed gives the same problems on every
/// machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.uniform()
    }
    /// Uniform integer in [lo, hi] (`lo` when `hi < lo`).
    pub fn int(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f32) -> bool {
        self.uniform() < p
    }
    /// `n` standard normal values times `std`.
    pub fn normal(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1 = self.uniform().max(1e-7);
                let u2 = self.uniform();
                std * (-2.0f32 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
            })
            .collect()
    }
}

/// Rows of `dim` scaled to unit length (the recurrence is only stable for `|k| <= 1`).
pub fn unit_rows(mut x: Vec<f32>, dim: usize) -> Vec<f32> {
    for row in x.chunks_exact_mut(dim) {
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        row.iter_mut().for_each(|v| *v /= n);
    }
    x
}

/// Realistic inputs of the given shape and dtype: unit-norm k (or raw k with l2norm on), beta in
/// [0, 1), g like `-softplus` of noise; no varlen, no initial state. The `demo` and `bench`
/// commands use it.
pub fn layer_inputs(
    rng: &mut Rng,
    shape: [usize; 6],
    dtype: DType,
    l2norm: bool,
) -> Result<Inputs<'static>> {
    layer_inputs_periodic(rng, shape, dtype, l2norm, usize::MAX)
}

/// [`layer_inputs`] whose values repeat every `period` tokens of the packed `B x T` tokens (only
/// the first `period` are drawn): `bench` uses it at long T, where drawing every value would take
/// minutes while the kernels' time does not depend on the values.
pub fn layer_inputs_periodic(
    rng: &mut Rng,
    shape: [usize; 6],
    dtype: DType,
    l2norm: bool,
    period: usize,
) -> Result<Inputs<'static>> {
    let [b, t, h, hv, dk, dv] = shape;
    let nq = crate::error::checked_numel("q", &[b, t, h, dk])?;
    let nv = crate::error::checked_numel("v", &[b, t, hv, dv])?;
    let ng = crate::error::checked_numel("g", &[b, t, hv])?;
    let drawn = crate::error::checked_numel("T", &[b, t])?.min(period.max(1));
    let q = rng.normal(drawn * h * dk, 1.0);
    let k = rng.normal(drawn * h * dk, 1.0);
    let k = if l2norm { k } else { unit_rows(k, dk) };
    let q = if l2norm { q } else { unit_rows(q, dk) };
    let v = rng.normal(drawn * hv * dv, 1.0);
    let g: Vec<f32> = (0..drawn * hv)
        .map(|_| -softplus32(rng.range(-5.0, 1.0)) * 0.5)
        .collect();
    let beta: Vec<f32> = (0..drawn * hv).map(|_| rng.range(0.0, 1.0)).collect();
    Ok(Inputs::new(
        cycled(&q, nq, vec![b, t, h, dk], dtype)?,
        cycled(&k, nq, vec![b, t, h, dk], dtype)?,
        cycled(&v, nv, vec![b, t, hv, dv], dtype)?,
        cycled(&g, ng, vec![b, t, hv], DType::F32)?,
        cycled(&beta, ng, vec![b, t, hv], DType::F32)?,
    ))
}

/// `x` rounded to `dtype` once, then repeated to `n` elements: long inputs (half a million
/// tokens are gigabytes) cost one copy, not a rounding per element.
fn cycled(x: &[f32], n: usize, shape: Vec<usize>, dtype: DType) -> Result<Tensor<'static>> {
    fn repeat<T: Copy>(x: &[T], n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let take = (n - out.len()).min(x.len());
            out.extend_from_slice(&x[..take]);
        }
        out
    }
    if n > 0 && x.is_empty() {
        return Err(crate::Error::invalid(
            "period",
            "at least one token",
            "none",
        ));
    }
    let data = match Tensor::cast_from_f32(x, vec![x.len()], dtype)?.data() {
        Data::F32(d) => Data::F32(Cow::Owned(repeat(d, n))),
        Data::BF16(d) => Data::BF16(Cow::Owned(repeat(d, n))),
        Data::F16(d) => Data::F16(Cow::Owned(repeat(d, n))),
    };
    Tensor::new(data, shape)
}

fn softplus32(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// A generated problem.
#[derive(Clone, Debug)]
pub struct Case {
    /// A short description of the shape and options.
    pub name: String,
    /// The inputs.
    pub inputs: Inputs<'static>,
    /// The options (output requested in f32).
    pub opts: Options,
}

/// The random choices of one test problem: its shape, dtype, options and a seed for the values.
/// The test suite draws these through proptest (so failures shrink); [`Spec::random`] draws
/// them from an [`Rng`] for `deltanet selftest` and the GPU tests. [`Spec::build`] turns one into
/// inputs that respect every option rule.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Batch size (1 with `varlen`).
    pub b: usize,
    /// Tokens per batch row.
    pub t: usize,
    /// q/k heads.
    pub h: usize,
    /// Value heads per q/k head.
    pub ratio: usize,
    /// Key dimension.
    pub k: usize,
    /// Value dimension.
    pub v: usize,
    /// One of [`CHUNK_SIZES`].
    pub chunk_size: usize,
    /// Split the tokens into sequences by `cu_seqlens` (empty and one-token ones likely).
    pub varlen: bool,
    /// The dtype of q, k and v.
    pub dtype: DType,
    /// Seeds the values.
    pub seed: u64,
    /// Bits picking the options and value profiles: 0 `use_qk_l2norm`, 1 `beta_is_logits`,
    /// 2 `allow_neg_eigval` (with bit 1 only: alone it means nothing), 3 `gate_in_kernel` (with
    /// `A_log` and `dt_bias`), 4 `state_v_first`, 5 the tiled head map, 6 a scale of 0.3, 7 an
    /// initial state, 8 hard resets (3% of the gates -inf or -1e4), 9 runs of gates just above
    /// the hard-reset threshold (a chunk's sum past -1000), 10 strong decays
    /// (`g = -8 softplus(U(-6, 1.5))`, within-chunk sums in the hundreds), 11 beta in [0, 2)
    /// without logits (negative eigenvalues of the transition).
    pub flags: u16,
}

impl Spec {
    /// Whether flag bit `i` is set.
    pub fn flag(&self, i: u32) -> bool {
        self.flags >> i & 1 == 1
    }

    /// A random spec: T 1..=300 (often 1..=20), B 1..=3, H 1..=3, HV/H 1..=4, K and V
    /// 1..=160 (often 1..=40), any chunk size, varlen, both head maps, every option and value
    /// profile, f32/bf16/f16 inputs.
    pub fn random(rng: &mut Rng) -> Spec {
        let varlen = rng.chance(0.3);
        let b = if varlen { 1 } else { rng.int(1, 3) };
        let t = if rng.chance(0.2) {
            rng.int(1, 20)
        } else {
            rng.int(1, 300)
        };
        let (h, ratio) = (rng.int(1, 3), rng.int(1, 4));
        let mut dim = || {
            if rng.chance(0.5) {
                rng.int(1, 160)
            } else {
                rng.int(1, 40)
            }
        };
        let (k, v) = (dim(), dim());
        let chunk_size = CHUNK_SIZES[rng.int(0, CHUNK_SIZES.len() - 1)];
        let dtype = [DType::F32, DType::BF16, DType::F16][rng.int(0, 2)];
        let odds = [0.4, 0.3, 0.5, 0.25, 0.3, 0.5, 0.3, 0.5, 0.3, 0.15, 0.2, 0.2];
        let flags = odds.iter().enumerate().fold(
            0u16,
            |f, (i, &p)| if rng.chance(p) { f | 1 << i } else { f },
        );
        Spec {
            b,
            t,
            h,
            ratio,
            k,
            v,
            chunk_size,
            varlen,
            dtype,
            seed: rng.next_u64(),
            flags,
        }
    }

    /// The options this spec picks (output in f32, final state on).
    pub fn options(&self) -> Options {
        Options {
            use_qk_l2norm: self.flag(0),
            beta_is_logits: self.flag(1),
            allow_neg_eigval: self.flag(1) && self.flag(2),
            gate_in_kernel: self.flag(3),
            state_v_first: self.flag(4),
            head_map: if self.flag(5) {
                HeadMap::Tiled
            } else {
                HeadMap::Grouped
            },
            scale: if self.flag(6) { Some(0.3) } else { None },
            chunk_size: self.chunk_size,
            out_dtype: Some(DType::F32),
            ..Options::default()
        }
    }

    /// Inputs and options for this spec: realistic magnitudes (unit-norm keys unless l2norm is
    /// on, beta in [0, 1) or logits, negative gates), with the hard resets, gate runs, strong
    /// decays and wide beta its flags ask for, and varlen splits that include empty and
    /// one-token sequences.
    pub fn build(&self) -> Result<Case> {
        let s = self;
        let mut rng = Rng::new(s.seed);
        let (b, t, h, hv, k, v) = (s.b, s.t, s.h, s.h * s.ratio, s.k, s.v);
        let opts = s.options();
        let nq = crate::error::checked_numel("q", &[b, t, h, k])?;
        let nv = crate::error::checked_numel("v", &[b, t, hv, v])?;
        let n_tok = crate::error::checked_numel("g", &[b, t, hv])?;
        let q = rng.normal(nq, 1.0);
        let kk = rng.normal(nq, 1.0);
        let (q, kk) = if opts.use_qk_l2norm {
            (q, kk)
        } else {
            (unit_rows(q, k), unit_rows(kk, k))
        };
        let vv = rng.normal(nv, 1.0);
        let (mut burst, mut resets) = (0, 0usize);
        let g: Vec<f32> = (0..n_tok)
            .map(|_| {
                // Bit 9: runs of gates near the hard-reset threshold.
                if s.flag(9) && burst == 0 && rng.uniform() < 0.02 {
                    burst = rng.int(1, 40);
                }
                if burst > 0 {
                    burst -= 1;
                    return [-39.9, -40.1, -40.0, -30.0, rng.range(-40.0, -10.0)][rng.int(0, 4)];
                }
                if opts.gate_in_kernel {
                    rng.range(-4.0, 4.0)
                } else if s.flag(8) && rng.uniform() < 0.03 {
                    resets += 1;
                    if rng.uniform() < 0.5 {
                        f32::NEG_INFINITY
                    } else {
                        -1e4
                    }
                } else if s.flag(10) {
                    -8.0 * softplus32(rng.range(-6.0, 1.5))
                } else {
                    -rng.range(0.0, 0.3)
                }
            })
            .collect();
        let beta: Vec<f32> = (0..n_tok)
            .map(|_| {
                if opts.beta_is_logits {
                    rng.range(-4.0, 4.0)
                } else if s.flag(11) {
                    rng.range(0.0, 1.99)
                } else {
                    rng.range(0.0, 1.0)
                }
            })
            .collect();
        let cu_seqlens = s.varlen.then(|| {
            let n = rng.int(1, 5);
            let mut cuts: Vec<i64> = (0..n - 1).map(|_| rng.int(0, t) as i64).collect();
            // Make empty and one-token sequences likely.
            if n > 2 {
                cuts[0] = cuts[1];
            }
            if n > 4 {
                cuts[2] = (cuts[3] + 1).min(t as i64);
            }
            cuts.push(0);
            cuts.push(t as i64);
            cuts.sort();
            cuts
        });
        let n_seqs = cu_seqlens.as_ref().map_or(b, |c| c.len() - 1);
        let state_shape = if opts.state_v_first {
            vec![n_seqs, hv, v, k]
        } else {
            vec![n_seqs, hv, k, v]
        };
        let initial_state = match s.flag(7) {
            true => Some(Tensor::from_f32(
                rng.normal(n_seqs * hv * k * v, 0.3),
                state_shape,
            )?),
            false => None,
        };
        let (a_log, dt_bias) = if opts.gate_in_kernel {
            let a: Vec<f32> = (0..hv).map(|_| rng.range(-3.0, 1.0)).collect();
            (
                Some(Tensor::from_f32(a, vec![hv])?),
                Some(Tensor::from_f32(rng.normal(hv, 1.0), vec![hv])?),
            )
        } else {
            (None, None)
        };
        let name = self.name(&opts, cu_seqlens.as_deref(), resets);
        let inputs = Inputs {
            q: Tensor::cast_from_f32(&q, vec![b, t, h, k], s.dtype)?,
            k: Tensor::cast_from_f32(&kk, vec![b, t, h, k], s.dtype)?,
            v: Tensor::cast_from_f32(&vv, vec![b, t, hv, v], s.dtype)?,
            g: Tensor::from_f32(g, vec![b, t, hv])?,
            beta: Tensor::from_f32(beta, vec![b, t, hv])?,
            initial_state,
            cu_seqlens,
            a_log,
            dt_bias,
        };
        Ok(Case { name, inputs, opts })
    }

    /// `[B=1 T=77 H=1 HV=2 K=16 V=12 f32 BT=64 tiled cu=[..] l2norm logits+neg gate v_first h0
    /// resets=3 scale=0.300 ...]`, naming what is not the default.
    fn name(&self, opts: &Options, cu: Option<&[i64]>, resets: usize) -> String {
        let s = self;
        let mut name = format!(
            "[B={} T={} H={} HV={} K={} V={} {} BT={}",
            s.b,
            s.t,
            s.h,
            s.h * s.ratio,
            s.k,
            s.v,
            s.dtype,
            s.chunk_size
        );
        let beta = match (opts.beta_is_logits, opts.allow_neg_eigval) {
            (true, true) => " logits+neg",
            (true, false) => " logits",
            _ => "",
        };
        let words = [
            (opts.head_map == HeadMap::Tiled, " tiled".to_string()),
            (cu.is_some(), format!(" cu={:?}", cu.unwrap_or_default())),
            (opts.use_qk_l2norm, " l2norm".into()),
            (true, beta.into()),
            (opts.gate_in_kernel, " gate".into()),
            (opts.state_v_first, " v_first".into()),
            (s.flag(7), " h0".into()),
            (resets > 0, format!(" resets={resets}")),
            (
                opts.scale.is_some(),
                format!(" scale={:.3}", opts.scale.unwrap_or_default()),
            ),
            (s.flag(9), " bursts".into()),
            (s.flag(10), " strong-decay".into()),
            (s.flag(11), " wide-beta".into()),
        ];
        for (on, w) in words {
            if on {
                name.push_str(&w);
            }
        }
        name.push(']');
        name
    }
}

/// A random problem ([`Spec::random`], then [`Spec::build`]).
pub fn random_case(rng: &mut Rng) -> Result<Case> {
    Spec::random(rng).build()
}

/// Tokens `lo..hi` of every batch row of `x` (no `cu_seqlens`), in the same dtypes, with the
/// same initial state and gate parameters.
pub fn token_range(x: &Inputs<'_>, lo: usize, hi: usize) -> Result<Inputs<'static>> {
    let (b, t) = (x.q.shape()[0], x.q.shape()[1]);
    let cut = |x: &Tensor<'_>| -> Result<Tensor<'static>> {
        let per = x.numel() / (b * t).max(1);
        let v = x.to_f32();
        let mut out = Vec::with_capacity(b * (hi - lo) * per);
        for bi in 0..b {
            out.extend_from_slice(&v[(bi * t + lo) * per..(bi * t + hi) * per]);
        }
        let mut shape = x.shape().to_vec();
        shape[1] = hi - lo;
        // Values came from this dtype, so the round trip through f32 is exact.
        Tensor::cast_from_f32(&out, shape, x.dtype())
    };
    Ok(Inputs {
        initial_state: x.initial_state.clone().map(Tensor::into_owned),
        a_log: x.a_log.clone().map(Tensor::into_owned),
        dt_bias: x.dt_bias.clone().map(Tensor::into_owned),
        ..Inputs::new(
            cut(&x.q)?,
            cut(&x.k)?,
            cut(&x.v)?,
            cut(&x.g)?,
            cut(&x.beta)?,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_inputs_repeat_the_first_period_and_start_as_the_plain_ones() {
        let shape = [2, 5, 2, 4, 8, 6];
        let plain = layer_inputs(&mut Rng::new(3), shape, DType::F32, false).unwrap();
        // A period longer than the tokens changes nothing.
        let long = layer_inputs_periodic(&mut Rng::new(3), shape, DType::F32, false, 100).unwrap();
        for (a, b) in [
            (&plain.q, &long.q),
            (&plain.k, &long.k),
            (&plain.v, &long.v),
            (&plain.g, &long.g),
            (&plain.beta, &long.beta),
        ] {
            assert_eq!(a.as_bytes(), b.as_bytes());
        }
        // Period 3 over the 10 packed tokens: token t holds token t % 3's values.
        let rep = layer_inputs_periodic(&mut Rng::new(3), shape, DType::BF16, false, 3).unwrap();
        for (x, width) in [
            (&rep.q, 2 * 8),
            (&rep.k, 2 * 8),
            (&rep.v, 4 * 6),
            (&rep.g, 4),
        ] {
            let x = x.to_f32();
            assert_eq!(x.len(), 10 * width);
            for t in 3..10 {
                assert_eq!(
                    x[t * width..(t + 1) * width],
                    x[(t % 3) * width..(t % 3 + 1) * width]
                );
            }
            // The first period differs from token to token (drawn, not copied).
            assert_ne!(x[..width], x[width..2 * width]);
        }
    }
}
