//! Bad input is an `Err` naming the argument, with what was expected and what was given.

use deltanet::{forward, recurrent_step, DType, Device, Dims, Error, Inputs, Options, Tensor};

fn dims(batch: usize, seq_len: usize, heads: usize, v_heads: usize, dk: usize, dv: usize) -> Dims {
    Dims::from([batch, seq_len, heads, v_heads, dk, dv])
}

fn t(shape: &[usize]) -> Tensor<'static> {
    Tensor::from_f32(vec![0.1; shape.iter().product()], shape.to_vec()).unwrap()
}

/// Gates (log-decays) of -0.1.
fn gates(shape: &[usize]) -> Tensor<'static> {
    Tensor::from_f32(vec![-0.1; shape.iter().product()], shape.to_vec()).unwrap()
}

/// A valid problem: B=2, T=10, H=2, HV=4, K=8, V=6.
fn good() -> Inputs<'static> {
    Inputs::new(
        t(&[2, 10, 2, 8]),
        t(&[2, 10, 2, 8]),
        t(&[2, 10, 4, 6]),
        gates(&[2, 10, 4]),
        t(&[2, 10, 4]),
    )
}

#[track_caller]
fn expect_err(x: &Inputs<'_>, opts: &Options, arg: &str, fragment: &str) {
    let err = forward(&Device::Cpu, x, opts).expect_err("bad input was accepted");
    let msg = err.to_string();
    match &err {
        Error::Invalid { arg: a, .. } | Error::Overflow { arg: a, .. } => {
            assert_eq!(*a, arg, "{msg}")
        }
        other => panic!("unexpected error kind: {other:?}"),
    }
    assert!(msg.contains(fragment), "message {msg:?} lacks {fragment:?}");
}

#[test]
fn good_input_is_accepted() {
    forward(&Device::Cpu, &good(), &Options::default()).unwrap();
}

#[test]
fn wrong_rank() {
    let x = Inputs {
        q: t(&[2, 10, 16]),
        ..good()
    };
    expect_err(&x, &Options::default(), "q", "rank 4");
}

#[test]
fn k_shape_differs_from_q() {
    let x = Inputs {
        k: t(&[2, 10, 2, 7]),
        ..good()
    };
    expect_err(&x, &Options::default(), "k", "[2, 10, 2, 7]");
}

#[test]
fn v_batch_mismatch() {
    let x = Inputs {
        v: t(&[1, 10, 4, 6]),
        ..good()
    };
    expect_err(&x, &Options::default(), "v", "B = 2");
}

#[test]
fn g_and_beta_shapes() {
    let x = Inputs {
        g: t(&[2, 10, 3]),
        ..good()
    };
    expect_err(&x, &Options::default(), "g", "[2, 10, 4]");
    let x = Inputs {
        beta: t(&[2, 9, 4]),
        ..good()
    };
    expect_err(&x, &Options::default(), "beta", "[2, 10, 4]");
}

#[test]
fn hv_not_multiple_of_h() {
    let x = Inputs {
        v: t(&[2, 10, 3, 6]),
        g: t(&[2, 10, 3]),
        beta: t(&[2, 10, 3]),
        ..good()
    };
    expect_err(
        &x,
        &Options::default(),
        "v",
        "multiple of H (q.shape[2]) = 2",
    );
}

#[test]
fn zero_dims() {
    let x = Inputs {
        q: t(&[2, 10, 2, 0]),
        k: t(&[2, 10, 2, 0]),
        ..good()
    };
    expect_err(&x, &Options::default(), "q", "K (q.shape[3]) >= 1");
    let x = Inputs {
        v: t(&[2, 10, 4, 0]),
        ..good()
    };
    expect_err(&x, &Options::default(), "v", "V (v.shape[3]) >= 1");
    let x = Inputs {
        q: t(&[2, 10, 0, 8]),
        k: t(&[2, 10, 0, 8]),
        ..good()
    };
    expect_err(&x, &Options::default(), "q", "H (q.shape[2]) >= 1");
}

#[test]
fn zero_batch() {
    let x = Inputs::new(
        t(&[0, 10, 2, 8]),
        t(&[0, 10, 2, 8]),
        t(&[0, 10, 4, 6]),
        gates(&[0, 10, 4]),
        t(&[0, 10, 4]),
    );
    expect_err(&x, &Options::default(), "q", "B (q.shape[0]) >= 1");
}

#[test]
fn empty_sequences_are_fine() {
    // T = 0: no tokens; the final state is the initial state.
    let mut x = Inputs::new(
        t(&[1, 0, 1, 4]),
        t(&[1, 0, 1, 4]),
        t(&[1, 0, 1, 3]),
        gates(&[1, 0, 1]),
        t(&[1, 0, 1]),
    );
    x.initial_state = Some(t(&[1, 1, 4, 3]));
    let out = forward(&Device::Cpu, &x, &Options::default()).unwrap();
    assert_eq!(out.o.shape(), &[1, 0, 1, 3]);
    assert_eq!(out.final_state.unwrap().to_f32().as_ref(), &[0.1f32; 12]);
}

#[test]
fn chunk_size_not_supported() {
    let opts = Options {
        chunk_size: 48,
        ..Options::default()
    };
    expect_err(&good(), &opts, "chunk_size", "16, 32 or 64");
}

#[test]
fn scale_not_finite() {
    let opts = Options {
        scale: Some(f32::NAN),
        ..Options::default()
    };
    expect_err(&good(), &opts, "scale", "finite");
}

fn varlen(cu: Vec<i64>) -> Inputs<'static> {
    Inputs {
        cu_seqlens: Some(cu),
        ..Inputs::new(
            t(&[1, 10, 2, 8]),
            t(&[1, 10, 2, 8]),
            t(&[1, 10, 4, 6]),
            gates(&[1, 10, 4]),
            t(&[1, 10, 4]),
        )
    }
}

#[test]
fn cu_seqlens_checks() {
    let o = Options::default();
    forward(&Device::Cpu, &varlen(vec![0, 0, 3, 3, 10]), &o).unwrap();
    expect_err(
        &varlen(vec![1, 3, 10]),
        &o,
        "cu_seqlens",
        "cu_seqlens[0] = 0",
    );
    expect_err(
        &varlen(vec![0, 5, 3, 10]),
        &o,
        "cu_seqlens",
        "non-decreasing",
    );
    expect_err(&varlen(vec![0, 3, 9]), &o, "cu_seqlens", "T = 10");
    expect_err(&varlen(vec![0, 3, 11]), &o, "cu_seqlens", "T = 10");
    expect_err(&varlen(vec![0]), &o, "cu_seqlens", "at least 2");
    let x = Inputs {
        cu_seqlens: Some(vec![0, 10]),
        ..good()
    };
    expect_err(&x, &o, "cu_seqlens", "B = 1");
}

#[test]
fn initial_state_checks() {
    let x = Inputs {
        initial_state: Some(t(&[2, 4, 6, 8])),
        ..good()
    };
    expect_err(
        &x,
        &Options::default(),
        "initial_state",
        "[N, HV, K, V] = [2, 4, 8, 6]",
    );
    // The same tensor is right for the V-first layout.
    forward(
        &Device::Cpu,
        &x,
        &Options {
            state_v_first: true,
            ..Options::default()
        },
    )
    .unwrap();
    let bf = Tensor::cast_from_f32(&[0.0; 2 * 4 * 8 * 6], vec![2, 4, 8, 6], DType::BF16).unwrap();
    let x = Inputs {
        initial_state: Some(bf),
        ..good()
    };
    expect_err(&x, &Options::default(), "initial_state", "dtype f32");
    let x = Inputs {
        cu_seqlens: Some(vec![0, 4, 10]),
        initial_state: Some(t(&[1, 4, 8, 6])),
        ..varlen(vec![])
    };
    expect_err(&x, &Options::default(), "initial_state", "[2, 4, 8, 6]");
}

#[test]
fn gate_in_kernel_needs_a_log_and_dt_bias() {
    let opts = Options {
        gate_in_kernel: true,
        ..Options::default()
    };
    expect_err(&good(), &opts, "A_log", "[HV]");
    let x = Inputs {
        a_log: Some(t(&[4])),
        ..good()
    };
    expect_err(&x, &opts, "dt_bias", "[HV]");
    let x = Inputs {
        a_log: Some(t(&[4])),
        dt_bias: Some(t(&[3])),
        ..good()
    };
    expect_err(&x, &opts, "dt_bias", "[4]");
    let x = Inputs {
        a_log: Some(t(&[4])),
        dt_bias: Some(t(&[4])),
        ..good()
    };
    forward(&Device::Cpu, &x, &opts).unwrap();
}

#[test]
fn contradictory_options() {
    let opts = Options {
        allow_neg_eigval: true,
        ..Options::default()
    };
    expect_err(&good(), &opts, "allow_neg_eigval", "beta_is_logits = true");
    let x = Inputs {
        a_log: Some(t(&[4])),
        ..good()
    };
    expect_err(&x, &Options::default(), "A_log", "gate_in_kernel");
    let x = Inputs {
        dt_bias: Some(t(&[4])),
        ..good()
    };
    expect_err(&x, &Options::default(), "dt_bias", "gate_in_kernel");
}

#[test]
fn many_empty_sequences_cannot_overflow_the_state() {
    // T = 0 with 1023 empty sequences: every input is empty, but N * HV * K * V overflows.
    let x = Inputs {
        cu_seqlens: Some(vec![0; 1 << 10]),
        ..Inputs::new(
            t(&[1, 0, 1, 1 << 25]),
            t(&[1, 0, 1, 1 << 25]),
            t(&[1, 0, 1, 1 << 30]),
            gates(&[1, 0, 1]),
            t(&[1, 0, 1]),
        )
    };
    let err = forward(&Device::Cpu, &x, &Options::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Overflow {
                arg: "initial_state",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn dtype_mismatch_between_q_k_v() {
    let k = Tensor::cast_from_f32(&[0.1; 2 * 10 * 2 * 8], vec![2, 10, 2, 8], DType::BF16).unwrap();
    let x = Inputs { k, ..good() };
    expect_err(&x, &Options::default(), "k", "dtype f32");
}

#[test]
fn unsupported_dtype_name() {
    let err = "f64".parse::<DType>().unwrap_err();
    assert!(
        err.to_string()
            .contains("dtype: expected one of f32, bf16, f16, got f64"),
        "{err}"
    );
}

#[test]
fn tensor_data_and_shape_disagree() {
    let err = Tensor::from_f32(vec![0.0; 5], vec![2, 3]).unwrap_err();
    assert!(err.to_string().contains("6 elements"), "{err}");
    let err = Tensor::from_bytes(DType::F32, &[0u8; 7], vec![2]).unwrap_err();
    assert!(err.to_string().contains("multiple of 4 bytes"), "{err}");
}

#[test]
fn sizes_that_overflow() {
    let err = Tensor::from_f32(vec![], vec![usize::MAX, 2, 0])
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err}");
    // Dimensions whose product overflows, checked before anything is allocated.
    let opts = Options::default();
    let err = deltanet::Problem::new(dims(1 << 40, 1 << 30, 1, 1, 1, 1), None, &opts).unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err}");
    let err = deltanet::Problem::new(dims(1, 1 << 20, 1, 1 << 20, 1 << 12, 1 << 12), None, &opts)
        .unwrap_err();
    assert!(matches!(err, Error::Overflow { .. }), "{err}");
}

#[test]
fn recurrent_step_checks_its_state() {
    let x = Inputs::new(
        t(&[2, 1, 2, 8]),
        t(&[2, 1, 2, 8]),
        t(&[2, 1, 4, 6]),
        gates(&[2, 1, 4]),
        t(&[2, 1, 4]),
    );
    let mut state = vec![0f32; 2 * 4 * 8 * 6 - 1];
    let err = recurrent_step(&Device::Cpu, &x, &mut state, &Options::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("state: expected 384 elements, got 383"),
        "{err}"
    );
    let mut state = vec![0f32; 2 * 4 * 8 * 6];
    let with_h0 = Inputs {
        initial_state: Some(t(&[2, 4, 8, 6])),
        ..x.clone()
    };
    let err = recurrent_step(&Device::Cpu, &with_h0, &mut state, &Options::default()).unwrap_err();
    assert!(err.to_string().starts_with("initial_state:"), "{err}");
    recurrent_step(&Device::Cpu, &x, &mut state, &Options::default()).unwrap();
}

#[test]
fn stage_functions_check_buffer_lengths() {
    let p = deltanet::Problem::new(dims(1, 10, 1, 2, 4, 3), None, &Options::default()).unwrap();
    let err = deltanet::cpu::solve_tril(&p, &[0.0; 10]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("A_strict: expected 1280 elements, got 10"),
        "{err}"
    );
    let err = deltanet::cpu::chunk_local_cumsum(&p, &[0.0; 3]).unwrap_err();
    assert!(
        err.to_string().starts_with("g: expected 20 elements"),
        "{err}"
    );
}

#[test]
fn device_names() {
    let err = Device::parse("tpu").unwrap_err();
    assert!(
        err.to_string().contains("auto, cpu, cuda or cuda:N"),
        "{err}"
    );
    assert!(matches!(Device::parse("cpu").unwrap(), Device::Cpu));
}

#[test]
fn internal_errors_are_not_attributed_to_a_file() {
    let err = Error::in_file(std::path::Path::new("in.safetensors"), Error::internal("x"));
    assert!(matches!(err, Error::Internal(_)), "{err}");
    assert!(err.to_string().contains("a bug in deltanet"), "{err}");
    let err = Error::in_file(
        std::path::Path::new("in.safetensors"),
        Error::invalid("q", "rank 4", "rank 3"),
    );
    assert!(
        matches!(&err, Error::File { path, .. } if path == "in.safetensors"),
        "{err}"
    );
}

#[test]
fn forward_into_checks_its_buffers() {
    let x = good();
    let opts = Options::default();
    let p = deltanet::Problem::from_inputs(&x, &opts).unwrap();
    let (n_o, n_s) = (
        p.tokens() * p.v_heads() * p.dv(),
        p.num_seqs() * p.v_heads() * p.state_len(),
    );
    let (mut o, mut s) = (vec![0f32; n_o], vec![0f32; n_s]);
    deltanet::cpu::forward_into(&x, &opts, &mut o, &mut s).unwrap();
    let mut short = vec![0f32; n_o - 1];
    let arg_of = |e: Error| match e {
        Error::Invalid { arg, .. } => arg,
        other => panic!("unexpected error kind: {other:?}"),
    };
    let err = deltanet::cpu::forward_into(&x, &opts, &mut short, &mut s).unwrap_err();
    assert!(
        err.to_string().contains(&format!("{n_o} elements")),
        "{err}"
    );
    assert_eq!(arg_of(err), "o");
    let mut long = vec![0f32; n_s + 1];
    let err = deltanet::cpu::forward_into(&x, &opts, &mut o, &mut long).unwrap_err();
    assert_eq!(arg_of(err), "final_state");
    let with_h = Options {
        output_chunk_states: true,
        ..Options::default()
    };
    let err = deltanet::cpu::forward_into(&x, &with_h, &mut o, &mut s).unwrap_err();
    assert_eq!(arg_of(err), "opts.output_chunk_states");
}

/// g holds log-decays: a finite positive gate is refused by name and place (the chunked form
/// would grow its rounding errors as e^(64 g)); 0, -inf (a hard reset) and +inf or NaN (the
/// non-finite rules) are not; with `gate_in_kernel` g is the raw gate input, of any sign.
#[test]
fn positive_gates_are_refused() {
    let mut g = vec![-0.1f32; 80];
    g[(10 + 3) * 4 + 2] = 0.3;
    let x = Inputs {
        g: Tensor::from_f32(g.clone(), vec![2, 10, 4]).unwrap(),
        ..good()
    };
    expect_err(&x, &Options::default(), "g", "g[1, 3, 2] = 0.3");
    let mut state = vec![0f32; 2 * 4 * 8 * 6];
    let e = recurrent_step(&Device::Cpu, &x, &mut state, &Options::default()).unwrap_err();
    assert!(e.to_string().starts_with("g:"), "{e}");
    for v in [0.0, f32::NEG_INFINITY, f32::INFINITY, f32::NAN] {
        g[(10 + 3) * 4 + 2] = v;
        let x = Inputs {
            g: Tensor::from_f32(g.clone(), vec![2, 10, 4]).unwrap(),
            ..good()
        };
        forward(&Device::Cpu, &x, &Options::default()).unwrap();
    }
    let opts = Options {
        gate_in_kernel: true,
        ..Options::default()
    };
    let x = Inputs {
        g: t(&[2, 10, 4]),
        a_log: Some(t(&[4])),
        dt_bias: Some(t(&[4])),
        ..good()
    };
    forward(&Device::Cpu, &x, &opts).unwrap();
}

/// A problem whose outputs cannot be allocated (here a 1 TiB final state with no tokens) is an
/// error naming the output, not an aborted process.
#[test]
fn outputs_too_large_to_allocate_are_an_error() {
    // Where the kernel grants any allocation (overcommit mode 1) the memory would be granted
    // and then run out as it is written: nothing to test there.
    if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "1") {
        eprintln!("SKIPPED: vm.overcommit_memory = 1 grants every allocation");
        return;
    }
    let (k, v) = (1usize << 34, 16);
    let empty = |shape: &[usize]| Tensor::from_f32(Vec::new(), shape.to_vec()).unwrap();
    let x = Inputs::new(
        empty(&[1, 0, 1, k]),
        empty(&[1, 0, 1, k]),
        empty(&[1, 0, 1, v]),
        empty(&[1, 0, 1]),
        empty(&[1, 0, 1]),
    );
    let e = forward(&Device::Cpu, &x, &Options::default()).unwrap_err();
    assert!(
        e.to_string().starts_with("final_state: size overflows"),
        "{e}"
    );
}
