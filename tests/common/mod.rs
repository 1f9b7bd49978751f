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

/// A small deterministic generator (SplitMix64) for test data; proptest picks the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
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
    /// Uniform integer in [lo, hi].
    pub fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    /// Standard normal values times `std`.
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

/// Rows of `dim` scaled to unit length.
pub fn unit_rows(mut x: Vec<f32>, dim: usize) -> Vec<f32> {
    for row in x.chunks_exact_mut(dim) {
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        row.iter_mut().for_each(|v| *v /= n);
    }
    x
}

pub fn rounded(x: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => x.to_vec(),
        DType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        DType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
    }
}
