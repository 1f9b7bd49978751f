//! Each CPU stage on its own, against its definition evaluated in float64 on the stage's own
//! inputs.

mod common;

use common::{as_f32, make_case, spec_strategy, Spec};
use deltanet::cpu;
use deltanet::reference::rel_l2;
use deltanet::{Gamma, Options, Problem, RESET_LOG_DECAY};
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

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Decay between tokens of one chunk in f64, from the stage's (gamma, seg).
fn decay(gm: &Gamma<Vec<f32>>, i: usize, j: usize) -> f64 {
    if gm.seg[i] == gm.seg[j] {
        (gm.gamma[i] as f64 + gm.lo[i] as f64 - gm.gamma[j] as f64 - gm.lo[j] as f64).exp()
    } else {
        0.0
    }
}

fn decay0(gm: &Gamma<Vec<f32>>, i: usize) -> f64 {
    if gm.seg[i] == 0.0 {
        (gm.gamma[i] as f64 + gm.lo[i] as f64).exp()
    } else {
        0.0
    }
}

fn kdot(s: &Staged, a: usize, b: usize, j: usize, x: &[f32], y: &[f32]) -> f64 {
    let (h, dk) = (s.p.heads(), s.p.dk());
    let kh = s.p.qk_head(j);
    (0..dk)
        .map(|r| x[(a * h + kh) * dk + r] as f64 * y[(b * h + kh) * dk + r] as f64)
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, rng_seed: RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    #[test]
    fn l2norm_and_gate_follow_their_formulas(spec in spec_strategy(80, 64)) {
        let (x, opts) = make_case(&spec);
        let s = staged(&spec);
        let dk = s.p.dk();
        let raw = as_f32(&x.k);
        let want: Vec<f64> = raw.chunks_exact(dk).flat_map(|row| {
            let n = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
            row.iter().map(move |&v| v as f64 / n).collect::<Vec<_>>()
        }).collect();
        if opts.use_qk_l2norm {
            prop_assert!(rel_l2(&s.k, &want) <= 1e-6);
        }
        let hv = s.p.v_heads();
        let (g_in, b_in) = (as_f32(&x.g), as_f32(&x.beta));
        for (i, (&g, &b)) in s.g.iter().zip(&s.beta).enumerate() {
            let gw = if opts.gate_in_kernel {
                let a = as_f32(x.a_log.as_ref().unwrap())[i % hv] as f64;
                let d = as_f32(x.dt_bias.as_ref().unwrap())[i % hv] as f64;
                let z = g_in[i] as f64 + d;
                -a.exp() * if z > 20.0 { z } else { z.exp().ln_1p() }
            } else {
                g_in[i] as f64
            };
            let bw = if opts.beta_is_logits {
                (if opts.allow_neg_eigval { 2.0 } else { 1.0 }) / (1.0 + (-(b_in[i] as f64)).exp())
            } else {
                b_in[i] as f64
            };
            prop_assert!((g as f64 - gw).abs() <= 1e-5 * (1.0 + gw.abs()) || (g == gw as f32), "g[{}] = {} want {}", i, g, gw);
            prop_assert!((b as f64 - bw).abs() <= 1e-6 * (1.0 + bw.abs()), "beta[{}] = {} want {}", i, b, bw);
        }
    }

    #[test]
    fn cumsum_is_the_running_sum_within_chunks(mut spec in spec_strategy(300, 8)) {
        spec.flags |= 1 << 9;
        let s = staged(&spec);
        let gm = cpu::chunk_local_cumsum(&s.p, &s.g).unwrap();
        let hv = s.p.v_heads();
        for c in s.p.chunks() {
            for j in 0..hv {
                let (mut acc, mut resets) = (0f64, 0f32);
                for i in c.start..c.start + c.len {
                    let g = s.g[i * hv + j];
                    if g < RESET_LOG_DECAY { acc = 0.0; resets += 1.0; } else { acc += g as f64; }
                    // gamma alone is FLA's f32 running sum; with its error term it is the exact
                    // sum, to an absolute (not relative) tolerance.
                    let (hi, lo) = (gm.gamma[i * hv + j] as f64, gm.lo[i * hv + j] as f64);
                    prop_assert!((hi - acc).abs() <= 1e-6 * (1.0 + acc.abs()), "gamma {} vs {}", hi, acc);
                    prop_assert!((hi + lo - acc).abs() <= 1e-6, "gamma + lo {} vs {}", hi + lo, acc);
                    prop_assert_eq!(gm.seg[i * hv + j], resets);
                }
            }
        }
    }

    #[test]
    fn kkt_solve_tril_and_wy_follow_their_definitions(spec in spec_strategy(200, 48)) {
        let s = staged(&spec);
        let p = &s.p;
        let (hv, bt, dk, dv) = (p.v_heads(), p.chunk_size(), p.dk(), p.dv());
        let gm = cpu::chunk_local_cumsum(p, &s.g).unwrap();
        let a = cpu::chunk_scaled_dot_kkt(p, &s.k, &s.beta, &gm).unwrap();
        let a_inv = cpu::solve_tril(p, &a).unwrap();
        let wy = cpu::recompute_w_u(p, &s.k, &s.v, &s.beta, &gm, &a_inv).unwrap();

        let mut a_want = vec![0f64; a.len()];
        let (mut w_want, mut u_want) = (vec![0f64; wy.w.len()], vec![0f64; wy.u.len()]);
        for c in p.chunks() {
            for j in 0..hv {
                let at = |i: usize, col: usize| ((c.start + i) * hv + j) * bt + col;
                let tj = |i: usize| (c.start + i) * hv + j;
                for i in 0..c.len {
                    for l in 0..i {
                        a_want[at(i, l)] = s.beta[tj(i)] as f64
                            * kdot(&s, c.start + i, c.start + l, j, &s.k, &s.k)
                            * decay(&gm, tj(i), tj(l));
                    }
                }
                // (I + A_strict) A_inv = I on the block, and nothing outside it.
                let mut err = 0f64;
                for i in 0..c.len {
                    for col in 0..bt {
                        let x = a_inv[at(i, col)] as f64;
                        if col >= c.len || col > i { prop_assert_eq!(x, 0.0); continue; }
                        let prod: f64 = x + (0..i).map(|l| a[at(i, l)] as f64 * a_inv[at(l, col)] as f64).sum::<f64>();
                        let want = if col == i { 1.0 } else { 0.0 };
                        err = err.max((prod - want).abs());
                    }
                }
                prop_assert!(err <= 1e-5, "(I + A) A_inv - I: max abs {:e}", err);
                let kh = p.qk_head(j);
                for i in 0..c.len {
                    for l in 0..=i {
                        let coef = a_inv[at(i, l)] as f64 * s.beta[tj(l)] as f64;
                        for r in 0..dk {
                            w_want[tj(i) * dk + r] += coef * decay0(&gm, tj(l)) * s.k[((c.start + l) * p.heads() + kh) * dk + r] as f64;
                        }
                        for col in 0..dv {
                            u_want[tj(i) * dv + col] += coef * s.v[tj(l) * dv + col] as f64;
                        }
                    }
                }
            }
        }
        prop_assert!(rel_l2(&a, &a_want) <= 1e-5, "A_strict rel err {:e}", rel_l2(&a, &a_want));
        prop_assert!(rel_l2(&wy.w, &w_want) <= 1e-5, "w rel err {:e}", rel_l2(&wy.w, &w_want));
        prop_assert!(rel_l2(&wy.u, &u_want) <= 1e-5, "u rel err {:e}", rel_l2(&wy.u, &u_want));
    }

    #[test]
    fn chunk_state_and_output_follow_their_definitions(spec in spec_strategy(200, 48)) {
        let s = staged(&spec);
        let p = &s.p;
        let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
        let kv = dk * dv;
        let gm = cpu::chunk_local_cumsum(p, &s.g).unwrap();
        let a = cpu::chunk_scaled_dot_kkt(p, &s.k, &s.beta, &gm).unwrap();
        let a_inv = cpu::solve_tril(p, &a).unwrap();
        let wy = cpu::recompute_w_u(p, &s.k, &s.v, &s.beta, &gm, &a_inv).unwrap();
        let mut rng = common::Rng::new(spec.seed ^ 1);
        let h0 = rng.normal(p.num_seqs() * hv * kv, 0.3);
        let st = cpu::chunk_state(p, &s.k, &wy, &gm, Some(&h0)).unwrap();
        let scale = s.opts.scale_for(dk);
        let o = cpu::chunk_output(p, &s.q, &s.k, &st.v_new, &st.h, &gm, scale).unwrap();

        let mut h_want = vec![0f64; st.h.len()];
        let mut v_new_want = vec![0f64; st.v_new.len()];
        let mut fin_want = vec![0f64; st.final_state.len()];
        let mut o_want = vec![0f64; o.len()];
        for n in 0..p.num_seqs() {
            for j in 0..hv {
                let kh = p.qk_head(j);
                let mut h = f64s(&h0[(n * hv + j) * kv..][..kv]);
                for ci in p.seq_chunks(n) {
                    let c = p.chunks()[ci];
                    h_want[(ci * hv + j) * kv..][..kv].copy_from_slice(&h);
                    let tj = |i: usize| (c.start + i) * hv + j;
                    let krow = |i: usize| &s.k[((c.start + i) * nh + kh) * dk..][..dk];
                    for i in 0..c.len {
                        for col in 0..dv {
                            v_new_want[tj(i) * dv + col] = wy.u[tj(i) * dv + col] as f64
                                - (0..dk).map(|r| wy.w[tj(i) * dk + r] as f64 * h[r * dv + col]).sum::<f64>();
                        }
                    }
                    for i in 0..c.len {
                        let qi = c.start + i;
                        for col in 0..dv {
                            let inter: f64 = (0..dk).map(|r| s.q[(qi * nh + kh) * dk + r] as f64 * h[r * dv + col]).sum();
                            let intra: f64 = (0..=i).map(|l| decay(&gm, tj(i), tj(l)) * kdot(&s, qi, c.start + l, j, &s.q, &s.k) * v_new_want[tj(l) * dv + col]).sum();
                            o_want[tj(i) * dv + col] = scale as f64 * (decay0(&gm, tj(i)) * inter + intra);
                        }
                    }
                    let last = c.len - 1;
                    let d_last = decay0(&gm, tj(last));
                    h.iter_mut().for_each(|x| *x *= d_last);
                    for i in 0..c.len {
                        let d = decay(&gm, tj(last), tj(i));
                        for r in 0..dk {
                            for col in 0..dv {
                                h[r * dv + col] += d * krow(i)[r] as f64 * v_new_want[tj(i) * dv + col];
                            }
                        }
                    }
                }
                fin_want[(n * hv + j) * kv..][..kv].copy_from_slice(&h);
            }
        }
        for (name, got, want) in [("h", &st.h, &h_want), ("v_new", &st.v_new, &v_new_want), ("final_state", &st.final_state, &fin_want), ("o", &o, &o_want)] {
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
