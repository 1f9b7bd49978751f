//! Helpers shared by the integration tests: random inputs and the shared conformance vectors.
#![allow(dead_code, unused_imports)]

use deltanet::{DType, Inputs, Options, Tensor};
use half::{bf16, f16};

/// Where the conformance vectors live (`../shared/vectors` beside the checkout).
pub fn vectors_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vectors")
}

/// One conformance case, read by the library's loader (the one `deltanet run` uses).
pub use deltanet::selftest::VectorCase as Case;

pub fn load_case(path: &std::path::Path) -> Case {
    deltanet::selftest::load_vector(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn all_cases() -> Vec<Case> {
    let paths = deltanet::selftest::vector_files(&vectors_dir())
        .unwrap_or_else(|e| panic!("../shared/vectors must hold the vector files: {e}"));
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

/// The library's random problem description, shared with `deltanet selftest` and the GPU tests.
pub use deltanet::selftest::Spec;

/// proptest draws [`Spec`]s, so failures shrink.
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
            prop::sample::select(deltanet::CHUNK_SIZES.to_vec()),
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

/// Inputs and options for `spec` (see [`Spec::build`]).
pub fn make_case(s: &Spec) -> (Inputs<'static>, Options) {
    let c = s.build().unwrap();
    (c.inputs, c.opts)
}

/// Runs a kernel's host emulation (`dev/<script>`: its CUDA source compiled by g++ with lanes as
/// threads, against a float64 reference) on `cases` random cases and asserts that none fails;
/// skipped, saying so, without g++ or python3.
pub fn host_emulation_passes(script: &str, cases: usize) {
    host_emulation_passes_with(script, cases, &[]);
}

/// As [`host_emulation_passes`], with the script's environment knobs set (`EMU_CONFS` keeps
/// only some configurations' cases: every case run must pass, and at least one must run).
pub fn host_emulation_passes_with(script: &str, cases: usize, env: &[(&str, &str)]) {
    let have = |cmd: &str| {
        std::process::Command::new(cmd)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("g++") || !have("python3") {
        eprintln!("skipped: the host emulation needs g++ and python3");
        return;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("dev")
        .join(script);
    assert!(path.exists(), "{} not found", path.display());
    let out = std::process::Command::new("python3")
        .arg(path)
        .arg(cases.to_string())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}", log.lines().last().unwrap_or(""));
    assert!(
        out.status.success(),
        "{log}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = log
        .lines()
        .rev()
        .find(|l| l.ends_with("cases failed"))
        .unwrap_or("");
    let run: usize = last
        .strip_prefix("0/")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let filtered = env.iter().any(|(k, _)| *k == "EMU_CONFS");
    assert!(
        run > 0 && (run == cases || filtered && run < cases),
        "{log}"
    );
}
