//! Helpers shared by the integration tests: random inputs and the shared conformance vectors.
#![allow(dead_code)]

use deltanet::{DType, Inputs, Options, Tensor};
use half::{bf16, f16};

/// Where the conformance vectors live (`../shared/vectors` beside the checkout).
pub fn vectors_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors")
}

/// One conformance case read from a safetensors file.
pub struct Case {
    pub name: String,
    pub inputs: Inputs<'static>,
    pub opts: Options,
    pub o_ref: Vec<f64>,
    pub final_state_ref: Vec<f64>,
}

fn tensor(st: &safetensors::SafeTensors<'_>, name: &str) -> Option<Tensor<'static>> {
    let t = st.tensor(name).ok()?;
    let dtype = match t.dtype() {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::F16 => DType::F16,
        d => panic!("{name}: unexpected dtype {d:?}"),
    };
    Some(
        Tensor::from_bytes(dtype, t.data(), t.shape().to_vec())
            .unwrap()
            .into_owned(),
    )
}

fn f64s(st: &safetensors::SafeTensors<'_>, name: &str) -> Vec<f64> {
    let t = st.tensor(name).unwrap();
    t.data()
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

pub fn load_case(path: &std::path::Path) -> Case {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap_or_default();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let flag = |k: &str| meta.get(k).map(|v| v == "true").unwrap_or(false);
    let opts = Options {
        scale: meta.get("scale").and_then(|v| v.parse::<f32>().ok()),
        use_qk_l2norm: flag("use_qk_l2norm"),
        beta_is_logits: flag("beta_is_logits"),
        allow_neg_eigval: flag("allow_neg_eigval"),
        gate_in_kernel: flag("gate_in_kernel"),
        out_dtype: Some(DType::F32),
        ..Options::default()
    };
    let cu_seqlens = st.tensor("cu_seqlens").ok().map(|t| {
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    });
    let inputs = Inputs {
        q: tensor(&st, "q").unwrap(),
        k: tensor(&st, "k").unwrap(),
        v: tensor(&st, "v").unwrap(),
        g: tensor(&st, "g").unwrap(),
        beta: tensor(&st, "beta").unwrap(),
        initial_state: tensor(&st, "initial_state"),
        cu_seqlens,
        a_log: tensor(&st, "A_log"),
        dt_bias: tensor(&st, "dt_bias"),
    };
    Case {
        name: path.file_stem().unwrap().to_string_lossy().into_owned(),
        inputs,
        opts,
        o_ref: f64s(&st, "o_ref"),
        final_state_ref: f64s(&st, "final_state_ref"),
    }
}

pub fn all_cases() -> Vec<Case> {
    let mut paths: Vec<_> = std::fs::read_dir(vectors_dir())
        .expect("../shared/vectors must exist beside the checkout")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no vector files found");
    paths.iter().map(|p| load_case(p)).collect()
}

pub fn as_f32(t: &Tensor<'_>) -> Vec<f32> {
    t.to_f32().into_owned()
}

/// A tensor of `dtype` from f32 values (rounded).
pub fn make(values: Vec<f32>, shape: Vec<usize>, dtype: DType) -> Tensor<'static> {
    Tensor::cast_from_f32(&values, shape, dtype).unwrap()
}

/// The library's test-data generator and unit rows, shared with `deltanet selftest`.
pub use deltanet::selftest::{unit_rows, Rng};

pub fn rounded(x: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => x.to_vec(),
        DType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        DType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
    }
}

/// The random choices of one test problem; proptest draws these so failures shrink.
#[derive(Clone, Debug)]
pub struct Spec {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub ratio: usize,
    pub k: usize,
    pub v: usize,
    pub chunk_size: usize,
    pub varlen: bool,
    pub dtype: DType,
    pub seed: u64,
    /// Bits picking the options: l2norm, beta logits, neg eigval, gate in kernel, state_v_first,
    /// tiled head map, explicit scale, initial state, hard resets, runs of large negative gates.
    pub flags: u16,
}

pub fn spec_strategy(
    max_t: usize,
    max_dim: usize,
) -> impl proptest::strategy::Strategy<Value = Spec> {
    use proptest::prelude::*;
    (
        (1..=3usize, 1..=max_t, 1..=3usize, 1..=4usize),
        (
            1..=max_dim,
            1..=max_dim,
            prop::sample::select(vec![16usize, 32, 64]),
            any::<bool>(),
        ),
        (
            prop::sample::select(vec![DType::F32, DType::BF16, DType::F16]),
            any::<u64>(),
            any::<u16>(),
        ),
    )
        .prop_map(
            |((b, t, h, ratio), (k, v, chunk_size, varlen), (dtype, seed, flags))| Spec {
                b: if varlen { 1 } else { b },
                t,
                h,
                ratio,
                k,
                v,
                chunk_size,
                varlen,
                dtype,
                seed,
                flags,
            },
        )
}

impl Spec {
    pub fn flag(&self, i: u32) -> bool {
        self.flags >> i & 1 == 1
    }
}

/// Inputs and options for `spec`: realistic magnitudes (unit-norm keys unless l2norm is on,
/// beta in [0, 1) or logits, negative gates), with occasional hard resets (g = -inf, -1e4), runs
/// of gates near the reset threshold, and varlen splits that include empty and one-token sequences.
pub fn make_case(s: &Spec) -> (Inputs<'static>, Options) {
    let mut rng = Rng::new(s.seed);
    let (b, t, h, hv, k, v) = (s.b, s.t, s.h, s.h * s.ratio, s.k, s.v);
    let opts = Options {
        use_qk_l2norm: s.flag(0),
        beta_is_logits: s.flag(1),
        allow_neg_eigval: s.flag(1) && s.flag(2),
        gate_in_kernel: s.flag(3),
        state_v_first: s.flag(4),
        head_map: if s.flag(5) {
            deltanet::HeadMap::Tiled
        } else {
            deltanet::HeadMap::Grouped
        },
        scale: if s.flag(6) { Some(0.3) } else { None },
        chunk_size: s.chunk_size,
        out_dtype: Some(DType::F32),
        ..Options::default()
    };
    let q = rng.normal(b * t * h * k, 1.0);
    let kk = rng.normal(b * t * h * k, 1.0);
    let kk = if opts.use_qk_l2norm {
        kk
    } else {
        unit_rows(kk, k)
    };
    let q = if opts.use_qk_l2norm {
        q
    } else {
        unit_rows(q, k)
    };
    let vv = rng.normal(b * t * hv * v, 1.0);
    let n_tok = b * t * hv;
    let mut burst = 0;
    let g: Vec<f32> = (0..n_tok)
        .map(|_| {
            if s.flag(9) && burst == 0 && rng.uniform() < 0.02 {
                burst = rng.int(1, 40);
            }
            if burst > 0 {
                // Runs of strongly negative gates just above the hard-reset threshold push the
                // chunk's cumulative sum to -1000 and beyond: later decays must stay exact.
                burst -= 1;
                return [-39.9, -40.1, -40.0, -30.0, rng.range(-40.0, -10.0)][rng.int(0, 4)];
            }
            if opts.gate_in_kernel {
                rng.range(-4.0, 4.0)
            } else if s.flag(8) && rng.uniform() < 0.03 {
                if rng.uniform() < 0.5 {
                    f32::NEG_INFINITY
                } else {
                    -1e4
                }
            } else {
                -rng.range(0.0, 0.3)
            }
        })
        .collect();
    let beta: Vec<f32> = (0..n_tok)
        .map(|_| {
            if opts.beta_is_logits {
                rng.range(-4.0, 4.0)
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
    let initial_state = s.flag(7).then(|| {
        make(
            rng.normal(n_seqs * hv * k * v, 0.3),
            state_shape,
            DType::F32,
        )
    });
    let (a_log, dt_bias) = if opts.gate_in_kernel {
        (
            Some(make(
                (0..hv).map(|_| rng.range(-3.0, 1.0)).collect(),
                vec![hv],
                DType::F32,
            )),
            Some(make(rng.normal(hv, 1.0), vec![hv], DType::F32)),
        )
    } else {
        (None, None)
    };
    let inputs = Inputs {
        q: make(q, vec![b, t, h, k], s.dtype),
        k: make(kk, vec![b, t, h, k], s.dtype),
        v: make(vv, vec![b, t, hv, v], s.dtype),
        g: make(g, vec![b, t, hv], DType::F32),
        beta: make(beta, vec![b, t, hv], DType::F32),
        initial_state,
        cu_seqlens,
        a_log,
        dt_bias,
    };
    (inputs, opts)
}
