//! The conformance suite, runnable on any device: random problems with every option, each stage
//! of the chunked forward checked against its definition computed in float64, the whole forward
//! and the recurrent step against the oracle ([`crate::reference::reference`]), prefill plus
//! decode against a longer prefill, run-to-run bitwise equality, and the conformance vector
//! files. The `deltanet selftest` command and the test suite both use it; on a GPU machine it is
//! how a device is checked without cargo.

use std::path::Path;

use crate::dtype::{DType, Tensor};
use crate::error::Result;
use crate::options::{HeadMap, Options, CHUNK_SIZES};
use crate::problem::{Inputs, Problem};
use crate::reference::{reference, rel_l2, Activated64};
use crate::{activate, cpu, forward, recurrent_step, upload_inputs, Device, HostIo};

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked (`random#3 [B=1 T=77 ...]: solve_tril`).
    pub name: String,
    /// Whether it met its bound.
    pub passed: bool,
    /// The measured error and the bound, or the error message.
    pub detail: String,
}

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

/// Realistic inputs of the given shape and dtype: unit-norm k (or raw k with l2norm on), beta in
/// [0, 1), g like `-softplus` of noise; no varlen, no initial state. The `demo` and `bench`
/// commands use it.
pub fn layer_inputs(
    rng: &mut Rng,
    shape: [usize; 6],
    dtype: DType,
    l2norm: bool,
) -> Result<Inputs<'static>> {
    let [b, t, h, hv, dk, dv] = shape;
    let nq = crate::error::checked_numel("q", &[b, t, h, dk])?;
    let nv = crate::error::checked_numel("v", &[b, t, hv, dv])?;
    let ng = crate::error::checked_numel("g", &[b, t, hv])?;
    let q = rng.normal(nq, 1.0);
    let k = rng.normal(nq, 1.0);
    let k = if l2norm { k } else { unit_rows(k, dk) };
    let q = if l2norm { q } else { unit_rows(q, dk) };
    let v = rng.normal(nv, 1.0);
    let g: Vec<f32> = (0..ng)
        .map(|_| -softplus32(rng.range(-5.0, 1.0)) * 0.5)
        .collect();
    let beta: Vec<f32> = (0..ng).map(|_| rng.range(0.0, 1.0)).collect();
    Ok(Inputs::new(
        Tensor::cast_from_f32(&q, vec![b, t, h, dk], dtype)?,
        Tensor::cast_from_f32(&k, vec![b, t, h, dk], dtype)?,
        Tensor::cast_from_f32(&v, vec![b, t, hv, dv], dtype)?,
        Tensor::from_f32(g, vec![b, t, hv])?,
        Tensor::from_f32(beta, vec![b, t, hv])?,
    ))
}

fn softplus32(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// A random problem: T 1..=300, B 1..=3, H 1..=3, HV/H 1..=4, K and V 1..=160, any chunk size,
/// varlen with empty and one-token sequences, both head maps, every option, f32/bf16/f16 inputs,
/// occasional hard resets (g = -inf or -1e4).
pub fn random_case(rng: &mut Rng) -> Result<Case> {
    let varlen = rng.chance(0.3);
    let b = if varlen { 1 } else { rng.int(1, 3) };
    let t = if rng.chance(0.2) {
        rng.int(1, 20)
    } else {
        rng.int(1, 300)
    };
    let h = rng.int(1, 3);
    let hv = h * rng.int(1, 4);
    let dk = if rng.chance(0.5) {
        rng.int(1, 160)
    } else {
        rng.int(1, 40)
    };
    let dv = if rng.chance(0.5) {
        rng.int(1, 160)
    } else {
        rng.int(1, 40)
    };
    let dtype = [DType::F32, DType::BF16, DType::F16][rng.int(0, 2)];
    let beta_is_logits = rng.chance(0.3);
    // allow_neg_eigval only means something (and is only accepted) with beta_is_logits.
    let allow_neg_eigval = rng.chance(0.5) && beta_is_logits;
    let opts = Options {
        scale: if rng.chance(0.3) {
            Some(rng.range(0.05, 1.0))
        } else {
            None
        },
        use_qk_l2norm: rng.chance(0.4),
        beta_is_logits,
        allow_neg_eigval,
        gate_in_kernel: rng.chance(0.25),
        state_v_first: rng.chance(0.3),
        chunk_size: CHUNK_SIZES[rng.int(0, 2)],
        head_map: if rng.chance(0.5) {
            HeadMap::Grouped
        } else {
            HeadMap::Tiled
        },
        output_final_state: true,
        output_chunk_states: false,
        out_dtype: Some(DType::F32),
    };
    let cu_seqlens = if varlen {
        let n = rng.int(1, 5);
        let mut cuts: Vec<i64> = (0..n.saturating_sub(1))
            .map(|_| {
                // Cuts at the ends and next to each other make empty and one-token sequences.
                match rng.int(0, 4) {
                    0 => 0,
                    1 => t as i64,
                    _ => rng.int(0, t) as i64,
                }
            })
            .collect();
        cuts.push(0);
        cuts.push(t as i64);
        cuts.sort_unstable();
        Some(cuts)
    } else {
        None
    };
    let n_seqs = cu_seqlens.as_ref().map_or(b, |c| c.len() - 1);
    let tok = b * t;
    let mut q = rng.normal(tok * h * dk, 1.0);
    let mut k = rng.normal(tok * h * dk, 1.0);
    if !opts.use_qk_l2norm {
        k = unit_rows(k, dk);
        q = unit_rows(q, dk);
    }
    let v = rng.normal(tok * hv * dv, 1.0);
    // Sometimes strong decays, whose within-chunk sums reach the hundreds: there f32 running
    // sums lose the small differences unless their rounding error is carried (`Gamma::lo`).
    let strength = if rng.chance(0.2) && !opts.gate_in_kernel {
        8.0
    } else {
        1.0
    };
    let mut g: Vec<f32> = if opts.gate_in_kernel {
        rng.normal(tok * hv, 1.5)
    } else {
        (0..tok * hv)
            .map(|_| -strength * softplus32(rng.range(-6.0, 1.5)))
            .collect()
    };
    let mut resets = 0usize;
    if !opts.gate_in_kernel && rng.chance(0.3) {
        for x in g.iter_mut() {
            if rng.chance(0.02) {
                *x = if rng.chance(0.5) {
                    f32::NEG_INFINITY
                } else {
                    -1e4
                };
                resets += 1;
            }
        }
    }
    let beta: Vec<f32> = if opts.beta_is_logits {
        rng.normal(tok * hv, 2.0)
    } else {
        (0..tok * hv).map(|_| rng.range(0.0, 1.0)).collect()
    };
    let state_shape = if opts.state_v_first {
        vec![n_seqs, hv, dv, dk]
    } else {
        vec![n_seqs, hv, dk, dv]
    };
    let initial_state = if rng.chance(0.5) {
        Some(Tensor::from_f32(
            rng.normal(n_seqs * hv * dk * dv, 0.3),
            state_shape,
        )?)
    } else {
        None
    };
    let (a_log, dt_bias) = if opts.gate_in_kernel {
        let a: Vec<f32> = (0..hv).map(|_| rng.range(-2.0, 1.0)).collect();
        (
            Some(Tensor::from_f32(a, vec![hv])?),
            Some(Tensor::from_f32(rng.normal(hv, 1.0), vec![hv])?),
        )
    } else {
        (None, None)
    };
    let name = format!(
        "[B={b} T={t} H={h} HV={hv} K={dk} V={dv} {dtype} BT={}{}{}{}{}{}{}{}{}{}]",
        opts.chunk_size,
        if opts.head_map == HeadMap::Tiled {
            " tiled"
        } else {
            ""
        },
        match &cu_seqlens {
            Some(c) => format!(" cu={c:?}"),
            None => String::new(),
        },
        if opts.use_qk_l2norm { " l2norm" } else { "" },
        if opts.beta_is_logits {
            if opts.allow_neg_eigval {
                " logits+neg"
            } else {
                " logits"
            }
        } else {
            ""
        },
        if opts.gate_in_kernel { " gate" } else { "" },
        if opts.state_v_first { " v_first" } else { "" },
        if initial_state.is_some() { " h0" } else { "" },
        if resets > 0 {
            format!(" resets={resets}")
        } else {
            String::new()
        },
        match opts.scale {
            Some(s) => format!(" scale={s:.3}"),
            None => String::new(),
        },
    );
    let name = if strength > 1.0 {
        format!("{} strong-decay]", name.trim_end_matches(']'))
    } else {
        name
    };
    let inputs = Inputs {
        q: Tensor::cast_from_f32(&q, vec![b, t, h, dk], dtype)?,
        k: Tensor::cast_from_f32(&k, vec![b, t, h, dk], dtype)?,
        v: Tensor::cast_from_f32(&v, vec![b, t, hv, dv], dtype)?,
        g: Tensor::from_f32(g, vec![b, t, hv])?,
        beta: Tensor::from_f32(beta, vec![b, t, hv])?,
        initial_state,
        cu_seqlens,
        a_log,
        dt_bias,
    };
    Ok(Case { name, inputs, opts })
}

/// The relative L2 bound for whole-forward results on `device` with inputs of `dtype` (output
/// in f32): 1e-5 on the CPU; on a GPU 1e-4 for f32 inputs and 5e-3 for half-precision ones.
pub fn forward_tolerance(device: &Device, dtype: DType) -> f64 {
    match (device, dtype) {
        (Device::Cpu, _) => 1e-5,
        (Device::Cuda(_), DType::F32) => 1e-4,
        (Device::Cuda(_), _) => 5e-3,
    }
}

/// Runs `count` random problems from `seed` and every `*.safetensors` file in `vectors`, on
/// `device`; calls `on_check` as each check completes and returns them all.
pub fn run(
    device: &Device,
    seed: u64,
    count: usize,
    vectors: Option<&Path>,
    on_check: &mut dyn FnMut(&Check),
) -> Vec<Check> {
    let mut all = Vec::new();
    let mut emit = |c: Check, all: &mut Vec<Check>| {
        on_check(&c);
        all.push(c);
    };
    let mut rng = Rng::new(seed);
    for i in 0..count {
        match random_case(&mut rng) {
            Ok(case) => {
                let prefix = format!("random#{i} {}", case.name);
                let mut checks = Vec::new();
                check_case(device, &case, &mut rng, &mut |name, r| {
                    checks.push(to_check(&prefix, name, r))
                });
                for c in checks {
                    emit(c, &mut all);
                }
            }
            Err(e) => emit(
                Check {
                    name: format!("random#{i}"),
                    passed: false,
                    detail: format!("could not build the problem: {e}"),
                },
                &mut all,
            ),
        }
    }
    if let Some(dir) = vectors {
        match vector_files(dir) {
            Ok(files) => {
                for f in files {
                    for c in check_vector_file(device, &f) {
                        emit(c, &mut all);
                    }
                }
            }
            Err(e) => emit(
                Check {
                    name: format!("vectors {}", dir.display()),
                    passed: false,
                    detail: e,
                },
                &mut all,
            ),
        }
    }
    all
}

/// The `*.safetensors` files in `dir`, sorted.
pub fn vector_files(dir: &Path) -> std::result::Result<Vec<std::path::PathBuf>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read the folder: {e}"))?;
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err("expected *.safetensors files, found none".into());
    }
    Ok(files)
}

/// One measured error against its bound: Ok((error, bound)) or the device's error.
type Measured = Result<(f64, f64)>;

fn to_check(prefix: &str, name: &str, r: Measured) -> Check {
    let full = format!("{prefix}: {name}");
    match r {
        Ok((err, bound)) => Check {
            name: full,
            passed: err <= bound,
            detail: format!("error {err:.2e} (bound {bound:.0e})"),
        },
        Err(e) => Check {
            name: full,
            passed: false,
            detail: format!("error: {e}"),
        },
    }
}

/// Checks a conformance vector file: the forward (output in f32) and the recurrent step against
/// its `o_ref` and `final_state_ref`.
pub fn check_vector_file(device: &Device, path: &Path) -> Vec<Check> {
    let prefix = format!(
        "vector {}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string())
    );
    let mut out = Vec::new();
    let r = (|| -> Result<Vec<(&'static str, Measured)>> {
        let file = crate::io::MappedFile::open(path)?;
        let pf = file.parse()?;
        let opts = Options {
            out_dtype: Some(DType::F32),
            ..pf.options.clone()
        };
        let p = pf.problem(path, &opts)?;
        let (o_ref, s_ref) = match (&pf.o_ref, &pf.final_state_ref) {
            (Some(o), Some(s)) => (o, s),
            _ => {
                return Err(crate::Error::file(
                    path,
                    "expected tensors o_ref and final_state_ref, got none",
                ))
            }
        };
        let tol = forward_tolerance(device, pf.inputs.q.dtype());
        let mut res = Vec::new();
        let fwd = forward(device, &pf.inputs, &opts).map(|out| {
            let eo = rel_l2(&out.o.to_f32(), o_ref);
            let es = out
                .final_state
                .as_ref()
                .map_or(f64::INFINITY, |s| rel_l2(&s.to_f32(), s_ref));
            (eo, es)
        });
        match fwd {
            Ok((eo, es)) => {
                res.push(("forward o", Ok((eo, tol))));
                res.push(("forward final_state", Ok((es, tol))));
            }
            Err(e) => res.push(("forward", Err(e))),
        }
        let mut state = match &pf.inputs.initial_state {
            Some(s) => s.to_f32().into_owned(),
            None => vec![0f32; p.num_seqs() * p.v_heads() * p.state_len()],
        };
        let x = Inputs {
            initial_state: None,
            ..pf.inputs.clone()
        };
        match recurrent_step(device, &x, &mut state, &opts) {
            Ok(o) => {
                res.push(("recurrent o", Ok((rel_l2(&o.to_f32(), o_ref), tol))));
                res.push(("recurrent final_state", Ok((rel_l2(&state, s_ref), tol))));
            }
            Err(e) => res.push(("recurrent", Err(e))),
        }
        Ok(res)
    })();
    match r {
        Ok(res) => {
            for (name, m) in res {
                out.push(to_check(&prefix, name, m));
            }
        }
        Err(e) => out.push(Check {
            name: prefix,
            passed: false,
            detail: format!("error: {e}"),
        }),
    }
    out
}

/// Runs every check on one problem, reporting each through `report`.
pub fn check_case(
    device: &Device,
    case: &Case,
    rng: &mut Rng,
    report: &mut dyn FnMut(&str, Measured),
) {
    let tol = forward_tolerance(device, case.inputs.q.dtype());
    let p = match Problem::from_inputs(&case.inputs, &case.opts) {
        Ok(p) => p,
        Err(e) => return report("problem", Err(e)),
    };
    let oracle = reference(&case.inputs, &case.opts);
    let act = match crate::reference::activate(&case.inputs, &case.opts) {
        Ok(a) => a,
        Err(e) => return report("activate", Err(e)),
    };
    let walk = oracle_walk(&p, &act, &case.inputs, &case.opts);
    let stage_tol = match device {
        Device::Cpu => 1e-5,
        Device::Cuda(_) => tol,
    };
    match device {
        Device::Cpu => stage_checks(&cpu::Cpu, &p, case, &act, &walk, stage_tol, report),
        Device::Cuda(d) => stage_checks(d.as_ref(), &p, case, &act, &walk, stage_tol, report),
    }
    let oracle = match oracle {
        Ok(o) => o,
        Err(e) => return report("oracle", Err(e)),
    };

    // The whole forward against the oracle, and run-to-run bitwise equality.
    match forward(device, &case.inputs, &case.opts) {
        Ok(out) => {
            report("forward o", Ok((rel_l2(&out.o.to_f32(), &oracle.o), tol)));
            let fs = out.final_state.as_ref().map(|s| s.to_f32().into_owned());
            report(
                "forward final_state",
                Ok((
                    fs.as_ref()
                        .map_or(f64::INFINITY, |s| rel_l2(s, &oracle.final_state)),
                    tol,
                )),
            );
            let again = forward(device, &case.inputs, &case.opts).map(|o2| {
                let same = o2.o.as_bytes() == out.o.as_bytes()
                    && o2.final_state.as_ref().map(|s| s.as_bytes())
                        == out.final_state.as_ref().map(|s| s.as_bytes());
                if same {
                    0.0
                } else {
                    1.0
                }
            });
            report("two runs bitwise equal", again.map(|d| (d, 0.0)));
        }
        Err(e) => report("forward", Err(e)),
    }

    // The recurrent step from the same initial state.
    let mut state = match &case.inputs.initial_state {
        Some(s) => s.to_f32().into_owned(),
        None => vec![0f32; p.num_seqs() * p.v_heads() * p.state_len()],
    };
    let x = Inputs {
        initial_state: None,
        ..case.inputs.clone()
    };
    match recurrent_step(device, &x, &mut state, &case.opts) {
        Ok(o) => {
            report("recurrent o", Ok((rel_l2(&o.to_f32(), &oracle.o), tol)));
            report(
                "recurrent final_state",
                Ok((rel_l2(&state, &oracle.final_state), tol)),
            );
        }
        Err(e) => report("recurrent", Err(e)),
    }

    // Prefill of T - r tokens then r recurrent steps equals the prefill of T tokens.
    if case.inputs.cu_seqlens.is_none() && p.seq_len() >= 2 {
        let r = rng.int(1, p.seq_len().min(4) - 1);
        report(
            &format!(
                "prefill {} + {r} steps == prefill {}",
                p.seq_len() - r,
                p.seq_len()
            ),
            prefill_then_decode(device, case, &p, r, &oracle.o, &oracle.final_state, tol),
        );
    }
}

fn prefill_then_decode(
    device: &Device,
    case: &Case,
    p: &Problem,
    r: usize,
    o_ref: &[f64],
    s_ref: &[f64],
    tol: f64,
) -> Measured {
    let (b, t) = (p.batch(), p.seq_len());
    let t1 = t - r;
    let x = &case.inputs;
    let part = |lo: usize, hi: usize, h0: Option<Tensor<'static>>| -> Result<Inputs<'static>> {
        Ok(Inputs {
            q: slice_t(&x.q, b, t, lo, hi)?,
            k: slice_t(&x.k, b, t, lo, hi)?,
            v: slice_t(&x.v, b, t, lo, hi)?,
            g: slice_t(&x.g, b, t, lo, hi)?,
            beta: slice_t(&x.beta, b, t, lo, hi)?,
            initial_state: h0,
            cu_seqlens: None,
            a_log: x.a_log.clone().map(Tensor::into_owned),
            dt_bias: x.dt_bias.clone().map(Tensor::into_owned),
        })
    };
    let first = part(0, t1, x.initial_state.clone().map(Tensor::into_owned))?;
    let out = forward(device, &first, &case.opts)?;
    let mut state = match &out.final_state {
        Some(s) => s.to_f32().into_owned(),
        None => return Ok((f64::INFINITY, tol)),
    };
    let rest = part(t1, t, None)?;
    let o2 = recurrent_step(device, &rest, &mut state, &case.opts)?;
    // Interleave the two outputs back into [B, T, HV, V].
    let row = p.v_heads() * p.dv();
    let (o1, o2) = (out.o.to_f32(), o2.to_f32());
    let mut o = Vec::with_capacity(b * t * row);
    for bi in 0..b {
        o.extend_from_slice(&o1[bi * t1 * row..(bi + 1) * t1 * row]);
        o.extend_from_slice(&o2[bi * r * row..(bi + 1) * r * row]);
    }
    Ok((rel_l2(&o, o_ref).max(rel_l2(&state, s_ref)), tol))
}

/// Tokens `lo..hi` of every batch row of a `[B, T, ...]` tensor.
fn slice_t(x: &Tensor<'_>, b: usize, t: usize, lo: usize, hi: usize) -> Result<Tensor<'static>> {
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
}

fn f64s(t: &Tensor<'_>) -> Vec<f64> {
    t.to_f32().iter().map(|&x| x as f64).collect()
}

/// The float64 recurrence's state entering every chunk (`[chunks, HV, K, V]`) and after every
/// sequence (`[N, HV, K, V]`), K-major.
struct Walk {
    h: Vec<f64>,
    final_state: Vec<f64>,
}

fn oracle_walk(p: &Problem, a: &Activated64, x: &Inputs<'_>, opts: &Options) -> Walk {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let h0 = x.initial_state.as_ref().map(f64s);
    let mut h = vec![0f64; p.chunks().len() * hv * kv];
    let mut fin = vec![0f64; p.num_seqs() * hv * kv];
    for n in 0..p.num_seqs() {
        for j in 0..hv {
            let kh = p.qk_head(j);
            let mut s = vec![0f64; kv];
            if let Some(h0) = &h0 {
                for r in 0..dk {
                    for c in 0..dv {
                        let at = if opts.state_v_first {
                            c * dk + r
                        } else {
                            r * dv + c
                        };
                        s[r * dv + c] = h0[(n * hv + j) * kv + at];
                    }
                }
            }
            for ci in p.seq_chunks(n) {
                let c = p.chunks()[ci];
                h[(ci * hv + j) * kv..][..kv].copy_from_slice(&s);
                for t in c.start..c.start + c.len {
                    let tj = t * hv + j;
                    let d = a.g[tj].exp();
                    s.iter_mut().for_each(|x| *x *= d);
                    let kt = &a.k[(t * nh + kh) * dk..][..dk];
                    for col in 0..dv {
                        let sk: f64 = (0..dk).map(|r| s[r * dv + col] * kt[r]).sum();
                        let u = a.beta[tj] * (a.v[tj * dv + col] - sk);
                        for r in 0..dk {
                            s[r * dv + col] += kt[r] * u;
                        }
                    }
                }
            }
            fin[(n * hv + j) * kv..][..kv].copy_from_slice(&s);
        }
    }
    Walk {
        h,
        final_state: fin,
    }
}

/// A device's [`crate::Gamma`], downloaded, with the decays its contract defines.
struct HostGamma {
    gamma: Vec<f32>,
    lo: Vec<f32>,
    seg: Vec<f32>,
}

impl HostGamma {
    /// The decay from token j to token i of one chunk (j <= i).
    fn decay(&self, i: usize, j: usize) -> f64 {
        if self.seg[i] == self.seg[j] {
            ((self.gamma[i] as f64 - self.gamma[j] as f64)
                + (self.lo[i] as f64 - self.lo[j] as f64))
                .exp()
        } else {
            0.0
        }
    }

    /// The decay from the state entering the chunk to token i.
    fn decay0(&self, i: usize) -> f64 {
        if self.seg[i] == 0.0 {
            (self.gamma[i] as f64 + self.lo[i] as f64).exp()
        } else {
            0.0
        }
    }
}

/// The error of a decay relative to the exact one; decays below about 1e-12 (a hard reset's
/// e^-40 among them) count as absolute, far below anything a state can resolve.
fn decay_err(got: f64, exact: f64) -> f64 {
    let e = (got - exact).abs() / (exact + 1e-12);
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// The largest elementwise error `|a - b| / (1 + |b|)`; equal infinities count as exact.
fn max_err(a: &[f32], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let x = x as f64;
            if x == y {
                0.0
            } else {
                let e = (x - y).abs() / (1.0 + y.abs());
                if e.is_nan() {
                    f64::INFINITY
                } else {
                    e
                }
            }
        })
        .fold(0.0, f64::max)
}

fn rel_l2_64(a: &[f32], b: &[f64]) -> f64 {
    rel_l2(a, b)
}

#[allow(clippy::too_many_arguments)]
fn stage_checks<D: HostIo>(
    dev: &D,
    p: &Problem,
    case: &Case,
    act: &Activated64,
    walk: &Walk,
    tol: f64,
    report: &mut dyn FnMut(&str, Measured),
) {
    let r = (|| -> Result<()> {
        let (nh, hv, dk, dv, bt) = (p.heads(), p.v_heads(), p.dk(), p.dv(), p.chunk_size());
        let si = upload_inputs(dev, p, &case.inputs, &case.opts)?;
        let a = activate(dev, p, &case.opts, &si)?;
        let q = dev.download(a.q())?;
        let k = dev.download(a.k())?;
        let g = dev.download(&a.g)?;
        let beta = dev.download(&a.beta)?;
        let v = dev.download(&si.v)?;
        if case.opts.use_qk_l2norm {
            report(
                "l2norm",
                Ok((rel_l2_64(&q, &act.q).max(rel_l2_64(&k, &act.k)), tol)),
            );
        }
        report(
            "gate (g, beta)",
            Ok((max_err(&g, &act.g).max(max_err(&beta, &act.beta)), tol)),
        );

        // cumsum: every decay it implies against the running product of exp(g), in f64.
        let gamma = dev.chunk_local_cumsum(p, &a.g)?;
        let gh = HostGamma {
            gamma: dev.download(&gamma.gamma)?,
            lo: dev.download(&gamma.lo)?,
            seg: dev.download(&gamma.seg)?,
        };
        let mut err = 0f64;
        for c in p.chunks() {
            for j in 0..hv {
                let idx = |i: usize| (c.start + i) * hv + j;
                for i in 0..c.len {
                    let mut acc = 0f64;
                    for l in (0..=i).rev() {
                        let d = gh.decay(idx(i), idx(l));
                        err = err.max(decay_err(d, acc.exp()));
                        acc += g[idx(l)] as f64;
                    }
                    err = err.max(decay_err(gh.decay0(idx(i)), acc.exp()));
                }
            }
        }
        report("chunk_local_cumsum decays (relative)", Ok((err, tol)));

        // kkt against its formula, with exact decays.
        let a_strict = dev.chunk_scaled_dot_kkt(p, a.k(), &a.beta, &gamma)?;
        let a_host = dev.download(&a_strict)?;
        let mut want = vec![0f64; p.tokens() * hv * bt];
        for c in p.chunks() {
            for j in 0..hv {
                let kh = p.qk_head(j);
                let krow = |i: usize| &k[((c.start + i) * nh + kh) * dk..][..dk];
                for i in 1..c.len {
                    let ti = (c.start + i) * hv + j;
                    let mut acc = 0f64;
                    for l in (0..i).rev() {
                        acc += g[(c.start + l + 1) * hv + j] as f64;
                        let dot: f64 = krow(i)
                            .iter()
                            .zip(krow(l))
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum();
                        want[ti * bt + l] = beta[ti] as f64 * dot * acc.exp();
                    }
                }
            }
        }
        report("chunk_scaled_dot_kkt", Ok((rel_l2_64(&a_host, &want), tol)));

        // solve_tril: (I + A_strict) A_inv = I for every block.
        let a_inv = dev.solve_tril(p, &a_strict)?;
        let inv = dev.download(&a_inv)?;
        let mut err = 0f64;
        for c in p.chunks() {
            for j in 0..hv {
                let at =
                    |m: &[f32], i: usize, l: usize| m[((c.start + i) * hv + j) * bt + l] as f64;
                let big = (0..c.len)
                    .flat_map(|i| (0..c.len).map(move |l| (i, l)))
                    .map(|(i, l)| at(&inv, i, l).abs())
                    .fold(1.0, f64::max);
                for i in 0..c.len {
                    for l in 0..c.len {
                        let mut s = at(&inv, i, l);
                        for m in 0..i {
                            s += at(&a_host, i, m) * at(&inv, m, l);
                        }
                        let id = if i == l { 1.0 } else { 0.0 };
                        err = err.max((s - id).abs() / big);
                    }
                    // Columns past a short chunk must stay zero.
                    for l in c.len..bt {
                        err = err.max(at(&inv, i, l).abs());
                    }
                }
            }
        }
        report("solve_tril (I + A) A_inv = I", Ok((err, tol)));

        // w, u = A_inv times the formula.
        let wy = dev.recompute_w_u(p, a.k(), &si.v, &a.beta, &gamma, &a_inv)?;
        let (w, u) = (dev.download(&wy.w)?, dev.download(&wy.u)?);
        let mut ww = vec![0f64; p.tokens() * hv * dk];
        let mut uu = vec![0f64; p.tokens() * hv * dv];
        for c in p.chunks() {
            for j in 0..hv {
                let kh = p.qk_head(j);
                for i in 0..c.len {
                    let ti = (c.start + i) * hv + j;
                    for l in 0..=i {
                        let tl = (c.start + l) * hv + j;
                        let x = inv[ti * bt + l] as f64 * beta[tl] as f64;
                        if x == 0.0 {
                            continue;
                        }
                        let e = gh.decay0(tl);
                        let kr = &k[((c.start + l) * nh + kh) * dk..][..dk];
                        for (o, &kv) in ww[ti * dk..][..dk].iter_mut().zip(kr) {
                            *o += x * e * kv as f64;
                        }
                        for (o, &vv) in uu[ti * dv..][..dv].iter_mut().zip(&v[tl * dv..][..dv]) {
                            *o += x * vv as f64;
                        }
                    }
                }
            }
        }
        report(
            "recompute_w_u",
            Ok((rel_l2_64(&w, &ww).max(rel_l2_64(&u, &uu)), tol)),
        );

        // chunk_state: states against the f64 recurrence, v_new against u - w h.
        let cs = dev.chunk_state(p, a.k(), &wy, &gamma, si.h0.as_ref())?;
        let h = dev.download(&cs.h)?;
        let v_new = dev.download(&cs.v_new)?;
        let fin = dev.download(&cs.final_state)?;
        report(
            "chunk_state h, final_state vs oracle",
            Ok((
                rel_l2_64(&h, &walk.h).max(rel_l2_64(&fin, &walk.final_state)),
                tol,
            )),
        );
        let kv = dk * dv;
        let mut vn = vec![0f64; p.tokens() * hv * dv];
        for (ci, c) in p.chunks().iter().enumerate() {
            for j in 0..hv {
                let hs = &h[(ci * hv + j) * kv..][..kv];
                for i in 0..c.len {
                    let ti = (c.start + i) * hv + j;
                    for col in 0..dv {
                        let wh: f64 = (0..dk)
                            .map(|r| w[ti * dk + r] as f64 * hs[r * dv + col] as f64)
                            .sum();
                        vn[ti * dv + col] = u[ti * dv + col] as f64 - wh;
                    }
                }
            }
        }
        report(
            "chunk_state v_new = u - w h",
            Ok((rel_l2_64(&v_new, &vn), tol)),
        );

        // chunk_output against its formula on the device's own intermediates.
        let scale = case.opts.scale_for(dk);
        let o = dev.chunk_output(p, a.q(), a.k(), &cs.v_new, &cs.h, &gamma, scale)?;
        let o = dev.download(&o)?;
        let oo = chunk_output64(p, &q, &k, &v_new, &h, &gh, scale as f64);
        report("chunk_output", Ok((rel_l2_64(&o, &oo), tol)));
        Ok(())
    })();
    if let Err(e) = r {
        report("stages", Err(e));
    }
}

#[allow(clippy::too_many_arguments)]
fn chunk_output64(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v_new: &[f32],
    h: &[f32],
    gh: &HostGamma,
    scale: f64,
) -> Vec<f64> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let mut o = vec![0f64; p.tokens() * hv * dv];
    for (ci, c) in p.chunks().iter().enumerate() {
        for j in 0..hv {
            let kh = p.qk_head(j);
            let hs = &h[(ci * hv + j) * kv..][..kv];
            for i in 0..c.len {
                let ti = (c.start + i) * hv + j;
                let qi = &q[((c.start + i) * nh + kh) * dk..][..dk];
                let out = &mut o[ti * dv..][..dv];
                let d0 = gh.decay0(ti);
                if d0 != 0.0 {
                    for (col, o) in out.iter_mut().enumerate() {
                        let qh: f64 = (0..dk)
                            .map(|r| qi[r] as f64 * hs[r * dv + col] as f64)
                            .sum();
                        *o += d0 * qh;
                    }
                }
                for l in 0..=i {
                    let tl = (c.start + l) * hv + j;
                    let d = gh.decay(ti, tl);
                    if d == 0.0 {
                        continue;
                    }
                    let kl = &k[((c.start + l) * nh + kh) * dk..][..dk];
                    let qk: f64 = qi.iter().zip(kl).map(|(&a, &b)| a as f64 * b as f64).sum();
                    for (o, &vv) in out.iter_mut().zip(&v_new[tl * dv..][..dv]) {
                        *o += qk * d * vv as f64;
                    }
                }
                out.iter_mut().for_each(|x| *x *= scale);
            }
        }
    }
    o
}
