//! Property tests: the CPU forward and recurrent step against the float64 oracle on random
//! shapes and options; prefill/decode consistency; determinism across thread counts.

mod common;

use common::{as_f32, make_case, spec_strategy};
use deltanet::reference::{reference, rel_l2, widen};
use deltanet::selftest::token_range;
use deltanet::{forward, recurrent_step, Device, Inputs, Problem};
use proptest::prelude::*;
// A fixed seed: CI runs the same cases every time, and a failure reproduces with `cargo test`.
use proptest::test_runner::RngSeed;

const TOL: f64 = 1e-5;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, rng_seed: RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    #[test]
    fn forward_matches_oracle(spec in spec_strategy(300, 160)) {
        let (x, opts) = make_case(&spec);
        let r = reference(&x, &opts).unwrap();
        let out = forward(&Device::Cpu, &x, &opts).unwrap();
        let eo = rel_l2(&as_f32(&out.o), &r.o);
        let es = rel_l2(&as_f32(out.final_state.as_ref().unwrap()), &r.final_state);
        prop_assert!(eo <= TOL, "o rel err {:e}", eo);
        prop_assert!(es <= TOL, "final_state rel err {:e}", es);
    }

    #[test]
    fn recurrent_matches_oracle(spec in spec_strategy(200, 96)) {
        let (x, opts) = make_case(&spec);
        let r = reference(&x, &opts).unwrap();
        let p = Problem::from_inputs(&x, &opts).unwrap();
        let mut state = match &x.initial_state {
            Some(s) => as_f32(s),
            None => vec![0f32; p.num_seqs() * p.v_heads() * p.state_len()],
        };
        let step = Inputs { initial_state: None, ..x.clone() };
        let o = recurrent_step(&Device::Cpu, &step, &mut state, &opts).unwrap();
        let eo = rel_l2(&as_f32(&o), &r.o);
        let es = rel_l2(&state, &r.final_state);
        prop_assert!(eo <= TOL, "o rel err {:e}", eo);
        prop_assert!(es <= TOL, "state rel err {:e}", es);
    }

    /// `cpu::forward_into` writes every element of the caller's buffers (poisoned first), the
    /// same bits as the allocating fused forward (the state in the layout the options name).
    #[test]
    fn forward_into_fills_the_callers_buffers(spec in spec_strategy(200, 64)) {
        let (x, opts) = make_case(&spec);
        let p = Problem::from_inputs(&x, &opts).unwrap();
        let fused = deltanet::cpu::fused_forward(&x, &opts).unwrap();
        let mut o = vec![f32::NAN; p.tokens() * p.v_heads() * p.dv()];
        let mut fin = vec![f32::NAN; p.num_seqs() * p.v_heads() * p.state_len()];
        deltanet::cpu::forward_into(&x, &opts, &mut o, &mut fin).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert!(bits(&o) == bits(&fused.o), "o differs");
        // `fused_forward`'s state is K-major; `forward_into` writes `state_v_first`'s layout.
        let (dk, dv) = (p.dk(), p.dv());
        let mut want = fused.final_state.clone();
        if opts.state_v_first {
            for (w, s) in want.chunks_exact_mut(dk * dv).zip(fused.final_state.chunks_exact(dk * dv)) {
                for r in 0..dk {
                    for c in 0..dv {
                        w[c * dk + r] = s[r * dv + c];
                    }
                }
            }
        }
        prop_assert!(bits(&fin) == bits(&want), "final state differs");
    }

    /// Prefill of T tokens, then r recurrent steps of one token, equals prefill of T + r.
    #[test]
    fn prefill_then_decode_equals_longer_prefill(mut spec in spec_strategy(150, 64), r in 1..=4usize) {
        spec.varlen = false;
        let (x, opts) = make_case(&spec);
        let (b, t) = (spec.b, spec.t);
        prop_assume!(t > r);
        let slice = |t0: usize, t1: usize| Inputs {
            initial_state: None,
            ..token_range(&x, t0, t1).unwrap()
        };
        let full = forward(&Device::Cpu, &x, &opts).unwrap();
        let head = token_range(&x, 0, t - r).unwrap();
        let mut state = as_f32(forward(&Device::Cpu, &head, &opts).unwrap().final_state.as_ref().unwrap());
        let full_o = as_f32(&full.o);
        let row = spec.h * spec.ratio * spec.v;
        for i in t - r..t {
            let o = as_f32(&recurrent_step(&Device::Cpu, &slice(i, i + 1), &mut state, &opts).unwrap());
            for bi in 0..b {
                let want = widen(&full_o[(bi * t + i) * row..][..row]);
                let e = rel_l2(&o[bi * row..][..row], &want);
                prop_assert!(e <= 1e-5, "token {} batch {}: rel err {:e}", i, bi, e);
            }
        }
        let want = widen(&as_f32(full.final_state.as_ref().unwrap()));
        let e = rel_l2(&state, &want);
        prop_assert!(e <= 1e-5, "final state rel err {:e}", e);
    }
}

fn run_in_pool(threads: usize, spec: &common::Spec) -> (Vec<u8>, Vec<u8>) {
    let (x, opts) = make_case(spec);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let out = forward(&Device::Cpu, &x, &opts).unwrap();
        (
            out.o.as_bytes().to_vec(),
            out.final_state.unwrap().as_bytes().to_vec(),
        )
    })
}

#[test]
fn bitwise_identical_across_runs_and_thread_counts() {
    let spec = common::Spec {
        b: 2,
        t: 333,
        h: 2,
        ratio: 2,
        k: 48,
        v: 40,
        chunk_size: 64,
        varlen: false,
        dtype: deltanet::DType::BF16,
        seed: 7,
        flags: 0b1_1000_0001,
    };
    let one = run_in_pool(1, &spec);
    assert_eq!(one, run_in_pool(1, &spec), "two runs differ");
    assert_eq!(one, run_in_pool(3, &spec), "1 thread and 3 threads differ");
    assert_eq!(one, run_in_pool(8, &spec), "1 thread and 8 threads differ");
}

/// Few heads and many threads: the forward splits V into tiles, and must still give the same
/// bits (initial state, tiled head map).
#[test]
fn bitwise_identical_when_v_is_split_across_threads() {
    let spec = common::Spec {
        b: 1,
        t: 200,
        h: 1,
        ratio: 2,
        k: 32,
        v: 64,
        chunk_size: 32,
        varlen: false,
        dtype: deltanet::DType::F32,
        seed: 11,
        flags: 0b1010_0001,
    };
    let one = run_in_pool(1, &spec);
    assert_eq!(one, run_in_pool(8, &spec), "1 thread and 8 threads differ");
    assert_eq!(
        one,
        run_in_pool(16, &spec),
        "1 thread and 16 threads differ"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, rng_seed: RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    /// The staged CPU path (each stage a separate pass over the whole problem) and the fused one
    /// (used by `forward`, which never forms `w` and `u`) differ only by rounding: within 1e-6,
    /// a fifth of the oracle's bound (both measure about 2e-7 here). Non-finite inputs are
    /// compared in tests/non_finite.rs.
    #[test]
    fn staged_and_fused_paths_agree(spec in spec_strategy(200, 64)) {
        let (x, mut opts) = make_case(&spec);
        opts.output_chunk_states = true;
        let p = Problem::from_inputs(&x, &opts).unwrap();
        let cpu = deltanet::cpu::Cpu;
        let si = deltanet::upload_inputs(&cpu, &p, &x, &opts).unwrap();
        let staged = deltanet::chunk_forward(&cpu, &p, &opts, &si).unwrap();
        let fused = deltanet::cpu::fused_forward(&x, &opts).unwrap();
        let pairs = [
            ("o", &staged.o, &fused.o),
            ("final state", &staged.final_state, &fused.final_state),
            ("chunk states", staged.h.as_ref().unwrap(), fused.h.as_ref().unwrap()),
        ];
        for (name, s, f) in pairs {
            prop_assert_eq!(s.len(), f.len(), "{} length", name);
            let e = rel_l2(f, &widen(s));
            prop_assert!(e <= 1e-6, "{} fused vs staged rel err {:e}", name, e);
        }
    }
}

/// `cpu::forward_into` in pools of 1, 8 and 16 threads (V split into tiles), into an `o` that
/// starts one float past an aligned address (rows end in partial cache lines) and a state in
/// either layout: every element written, the same bits as `forward`.
#[test]
fn forward_into_in_pools_with_an_unaligned_o_and_both_state_layouts() {
    let spec = common::Spec {
        b: 1,
        t: 200,
        h: 1,
        ratio: 2,
        k: 32,
        v: 64,
        chunk_size: 32,
        varlen: false,
        dtype: deltanet::DType::F32,
        seed: 3,
        flags: 0b1_1000_0001,
    };
    for v_first in [false, true] {
        // Flag 4: `state_v_first`, the initial state drawn in that layout.
        let spec = common::Spec {
            flags: spec.flags | (u16::from(v_first) << 4),
            ..spec.clone()
        };
        let (x, mut opts) = make_case(&spec);
        assert_eq!(opts.state_v_first, v_first);
        opts.output_final_state = true;
        let p = Problem::from_inputs(&x, &opts).unwrap();
        let want = forward(&Device::Cpu, &x, &opts).unwrap();
        let (want_o, want_s) = (as_f32(&want.o), as_f32(want.final_state.as_ref().unwrap()));
        for threads in [1, 8, 16] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut o = vec![f32::NAN; p.tokens() * p.v_heads() * p.dv() + 1];
            let mut s = vec![f32::NAN; p.num_seqs() * p.v_heads() * p.state_len()];
            pool.install(|| deltanet::cpu::forward_into(&x, &opts, &mut o[1..], &mut s))
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&o[1..]),
                bits(&want_o),
                "o, {threads} threads, v_first {v_first}"
            );
            assert_eq!(
                bits(&s),
                bits(&want_s),
                "state, {threads} threads, v_first {v_first}"
            );
        }
    }
}
