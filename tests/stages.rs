//! Each CPU stage on its own, against its float64 definition ([`deltanet::reference`])
//! evaluated on the stage's own inputs; and the definitions composed against the per-token
//! recurrence.

mod common;

use common::{as_f32, make_case, spec_strategy, Spec};
use deltanet::cpu;
use deltanet::reference::{self as def, rel_l2, Gamma64};
use deltanet::{Gamma, Options, Problem};
use proptest::prelude::*;
// A fixed seed: CI runs the same cases every time, and a failure reproduces with `cargo test`.
use proptest::test_runner::RngSeed;

struct Staged {
    p: Problem,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    opts: Options,
}

fn staged(spec: &Spec) -> Staged {
    let (x, opts) = make_case(spec);
    let p = Problem::from_inputs(&x, &opts).unwrap();
    let (q, k) = (as_f32(&x.q), as_f32(&x.k));
    let (q, k) = if opts.use_qk_l2norm {
        let rows = p.tokens() * p.heads();
        (
            cpu::l2norm(&q, rows, p.dk()).unwrap(),
            cpu::l2norm(&k, rows, p.dk()).unwrap(),
        )
    } else {
        (q, k)
    };
    let a_log = x.a_log.as_ref().map(as_f32);
    let dt_bias = x.dt_bias.as_ref().map(as_f32);
    let (g, beta) = cpu::gate(
        &p,
        &opts,
        &as_f32(&x.g),
        &as_f32(&x.beta),
        a_log.as_deref(),
        dt_bias.as_deref(),
    )
    .unwrap();
    Staged {
        q,
        k,
        v: as_f32(&x.v),
        g,
        beta,
        p,
        opts,
    }
}

/// The stage's decays, read as [`deltanet::Gamma`]'s contract says.
fn decays(gm: &Gamma<Vec<f32>>) -> Gamma64 {
    Gamma64::from_stage(&gm.gamma, &gm.lo, &gm.seg)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, rng_seed: RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    #[test]
    fn l2norm_and_gate_follow_their_formulas(spec in spec_strategy(80, 64)) {
        let (x, opts) = make_case(&spec);
        let s = staged(&spec);
        let dk = s.p.dk();
        let want = def::l2norm(&as_f32(&x.k), dk);
        if opts.use_qk_l2norm {
            prop_assert!(rel_l2(&s.k, &want) <= 1e-6);
        }
        let hv = s.p.v_heads();
        let (a_log, dt_bias) = (x.a_log.as_ref().map(as_f32), x.dt_bias.as_ref().map(as_f32));
        let params = a_log.as_deref().zip(dt_bias.as_deref());
        let g_want = def::gate(&as_f32(&x.g), hv, params);
        let b_want = def::beta_activation(&as_f32(&x.beta), &opts);
        for (i, (&g, &b)) in s.g.iter().zip(&s.beta).enumerate() {
            let (gw, bw) = (g_want[i], b_want[i]);
            prop_assert!((g as f64 - gw).abs() <= 1e-5 * (1.0 + gw.abs()) || (g == gw as f32), "g[{}] = {} want {}", i, g, gw);
            prop_assert!((b as f64 - bw).abs() <= 1e-6 * (1.0 + bw.abs()), "beta[{}] = {} want {}", i, b, bw);
        }
    }

    #[test]
    fn cumsum_is_the_running_sum_within_chunks(mut spec in spec_strategy(300, 8)) {
        spec.flags |= 1 << 9;
        let s = staged(&spec);
        let gm = cpu::chunk_local_cumsum(&s.p, &s.g).unwrap();
        let want = def::chunk_local_cumsum(&s.p, &s.g);
        for (i, &acc) in want.gamma.iter().enumerate() {
            // gamma alone is FLA's f32 running sum; with its error term it is the exact sum, to
            // an absolute (not relative) tolerance.
            let (hi, lo) = (gm.gamma[i] as f64, gm.lo[i] as f64);
            prop_assert!((hi - acc).abs() <= 1e-6 * (1.0 + acc.abs()), "gamma {} vs {}", hi, acc);
            prop_assert!((hi + lo - acc).abs() <= 1e-6, "gamma + lo {} vs {}", hi + lo, acc);
            prop_assert_eq!(gm.seg[i], want.seg[i]);
        }
    }

    #[test]
    fn kkt_solve_tril_and_wy_follow_their_definitions(spec in spec_strategy(200, 48)) {
        let s = staged(&spec);
        let p = &s.p;
        let gm = cpu::chunk_local_cumsum(p, &s.g).unwrap();
        let a = cpu::chunk_scaled_dot_kkt(p, &s.k, &s.beta, &gm).unwrap();
        let a_inv = cpu::solve_tril(p, &a).unwrap();
        let wy = cpu::recompute_w_u(p, &s.k, &s.v, &s.beta, &gm, &a_inv).unwrap();

        let gd = decays(&gm);
        let a_want = def::a_strict(p, &s.k, &s.beta, &gd);
        // (I + A_strict) A_inv = I on every block, and nothing outside it.
        let res = def::inverse_residual(p, &a, &a_inv);
        prop_assert_eq!(res.outside, 0.0);
        prop_assert!(res.max_abs <= 1e-5, "(I + A) A_inv - I: max abs {:e}", res.max_abs);
        let want = def::w_u(p, &s.k, &s.v, &s.beta, &gd, &a_inv);
        let (w_want, u_want) = (&want.w, &want.u);
        prop_assert!(rel_l2(&a, &a_want) <= 1e-5, "A_strict rel err {:e}", rel_l2(&a, &a_want));
        prop_assert!(rel_l2(&wy.w, w_want) <= 1e-5, "w rel err {:e}", rel_l2(&wy.w, w_want));
        prop_assert!(rel_l2(&wy.u, u_want) <= 1e-5, "u rel err {:e}", rel_l2(&wy.u, u_want));
    }

    #[test]
    fn chunk_state_and_output_follow_their_definitions(spec in spec_strategy(200, 48)) {
        let s = staged(&spec);
        let p = &s.p;
        let (hv, dk, kv) = (p.v_heads(), p.dk(), p.dk() * p.dv());
        let gm = cpu::chunk_local_cumsum(p, &s.g).unwrap();
        let a = cpu::chunk_scaled_dot_kkt(p, &s.k, &s.beta, &gm).unwrap();
        let a_inv = cpu::solve_tril(p, &a).unwrap();
        let wy = cpu::recompute_w_u(p, &s.k, &s.v, &s.beta, &gm, &a_inv).unwrap();
        let mut rng = common::Rng::new(spec.seed ^ 1);
        let h0 = rng.normal(p.num_seqs() * hv * kv, 0.3);
        let st = cpu::chunk_state(p, &s.k, &wy, &gm, Some(&h0)).unwrap();
        let scale = s.opts.scale_for(dk);
        let o = cpu::chunk_output(p, &s.q, &s.k, &st.v_new, &st.h, &gm, scale).unwrap();

        let gd = decays(&gm);
        let want = def::chunk_state(p, &s.k, &wy, &gd, Some(&h0));
        let (h_want, v_new_want, fin_want) = (&want.h, &want.v_new, &want.final_state);
        let o_want = def::chunk_output(p, &s.q, &s.k, v_new_want, h_want, &gd, scale as f64);
        for (name, got, want) in [("h", &st.h, h_want), ("v_new", &st.v_new, v_new_want), ("final_state", &st.final_state, fin_want), ("o", &o, &o_want)] {
            let e = rel_l2(got, want);
            prop_assert!(e <= 1e-5, "{} rel err {:e}", name, e);
        }
    }
}

#[test]
fn hard_resets_stay_finite_and_exact() {
    // g = -inf and g = -1e4 at several places, beta up to 2 (negative eigenvalues).
    for (gi, g_reset) in [(0usize, f32::NEG_INFINITY), (1, -1e4), (2, f32::MIN)] {
        let spec = Spec {
            b: 1,
            t: 150,
            h: 1,
            ratio: 2,
            k: 16,
            v: 12,
            chunk_size: 64,
            varlen: false,
            dtype: deltanet::DType::F32,
            seed: 3 + gi as u64,
            flags: 0b1000_0110,
        };
        let (mut x, opts) = make_case(&spec);
        let mut g = as_f32(&x.g);
        for t in [0usize, 5, 63, 64, 100, 101, 149] {
            g[t * 2] = g_reset;
        }
        x.g = deltanet::Tensor::from_f32(g, vec![1, 150, 2]).unwrap();
        let r = deltanet::reference::reference(&x, &opts).unwrap();
        let out = deltanet::forward(&deltanet::Device::Cpu, &x, &opts).unwrap();
        let o = as_f32(&out.o);
        assert!(
            o.iter().all(|v| v.is_finite()),
            "non-finite output with g = {g_reset}"
        );
        let e = rel_l2(&o, &r.o);
        assert!(e <= 1e-5, "g = {g_reset}: rel err {e:e}");
    }
}

#[test]
fn large_cumulative_gates_keep_decays_exact() {
    // 20 gates of -30 (each above the hard-reset threshold) take the chunk's running sum to
    // -600, where f32 resolves only 6e-5; the gates after them must still decay exactly.
    let spec = Spec {
        b: 1,
        t: 64,
        h: 1,
        ratio: 1,
        k: 32,
        v: 32,
        chunk_size: 64,
        varlen: false,
        dtype: deltanet::DType::F32,
        seed: 5,
        flags: 0,
    };
    let (mut x, opts) = make_case(&spec);
    let mut g = as_f32(&x.g);
    g[..20].iter_mut().for_each(|v| *v = -30.0);
    x.g = deltanet::Tensor::from_f32(g, vec![1, 64, 1]).unwrap();
    let r = deltanet::reference::reference(&x, &opts).unwrap();
    let out = deltanet::forward(&deltanet::Device::Cpu, &x, &opts).unwrap();
    let e = rel_l2(&as_f32(&out.o), &r.o);
    assert!(e <= 1e-6, "rel err {e:e}");
}

/// The largest `|a - b|` relative to the largest `|b|` (at least 1e-300).
fn rel_max(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let big = b.iter().fold(1e-300f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / big)
        .fold(0.0, f64::max)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, rng_seed: RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    /// The stage definitions composed (chunked, all in float64) give the per-token recurrence's
    /// outputs, states entering every chunk and final states: what makes them the definitions.
    #[test]
    fn stage_definitions_compose_to_the_recurrence(spec in spec_strategy(200, 48)) {
        let (x, opts) = make_case(&spec);
        let r = def::reference(&x, &opts).unwrap();
        let c = def::chunked(&x, &opts).unwrap();
        for (name, got, want) in [("o", &c.o, &r.o), ("h", &c.h, &r.h), ("final_state", &c.final_state, &r.final_state)] {
            let e = rel_max(got, want);
            prop_assert!(e <= 1e-9, "{} rel err {:e}", name, e);
        }
    }
}
