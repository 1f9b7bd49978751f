//! The conformance suite as a library on the CPU, and the zero-copy reading of input files.

use std::borrow::Cow;
use std::path::PathBuf;

use deltanet::{Data, Device};

fn vectors_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/vectors"))
}

#[test]
fn selftest_suite_passes_on_cpu() {
    let mut seen = 0;
    let checks = deltanet::selftest::run(
        &Device::Cpu,
        11,
        40,
        Some(&vectors_dir()),
        deltanet::Precision::Exact,
        &mut |_| seen += 1,
    );
    assert_eq!(seen, checks.len());
    let failed: Vec<_> = checks.iter().filter(|c| !c.passed).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    // Every stage is checked, and so is every vector file.
    for stage in [
        "chunk_local_cumsum",
        "chunk_scaled_dot_kkt",
        "solve_tril",
        "recompute_w_u",
        "chunk_state h",
        "chunk_state v_new",
        "chunk_output",
        "forward o",
        "recurrent o",
        "two runs bitwise equal",
        "steps == prefill",
        "l2norm",
        "vector varlen_f32.safetensors",
        "resets=",
        " cu=",
        " gate",
        " tiled",
        " v_first",
        "bf16",
        "f16",
    ] {
        assert!(
            checks.iter().any(|c| c.name.contains(stage)),
            "no check of {stage}"
        );
    }
}

#[test]
fn input_tensors_borrow_the_memory_map() {
    let f = vectors_dir().join("bf16_qwen_like.safetensors");
    let file = deltanet::io::MappedFile::open(&f).expect("open");
    let pf = file.parse().expect("parse");
    for t in [&pf.inputs.q, &pf.inputs.k, &pf.inputs.v, &pf.inputs.g] {
        let borrowed = matches!(
            t.data(),
            Data::F32(Cow::Borrowed(_))
                | Data::BF16(Cow::Borrowed(_))
                | Data::F16(Cow::Borrowed(_))
        );
        assert!(borrowed, "a tensor was copied out of the map");
    }
}
