//! Decode steps over a state pool (`deltanet::decode`). On the CPU: every option and both state
//! layouts against the float64 oracle, with pool indices, padding, separate output rows and
//! per-token states; T tokens at once against T single steps; bad input refused. On a GPU: the
//! kernel against the oracle and the CPU (skipped, saying so, where no GPU can be used). The
//! kernel's source compiles through NVRTC without a GPU.

mod common;

use std::sync::{Arc, OnceLock};

use deltanet::cuda::CudaDevice;
use deltanet::decode::{decode_into, decode_step, DecodeOutput, Indices, StateIndices};
use deltanet::reference::{reference, rel_l2};
use deltanet::selftest::Rng;
use deltanet::{recurrent_step, DType, Device, Error, HeadMap, Inputs, Options, Tensor};

/// The sizes of one random step.
#[derive(Clone, Copy, Debug)]
struct Shape {
    n: usize,
    t: usize,
    h: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    pool: usize,
}

/// A [`Shape`]: N sequences of T tokens, H and HV heads, K, V, pool rows.
const fn sh(n: usize, t: usize, h: usize, hv: usize, dk: usize, dv: usize, pool: usize) -> Shape {
    Shape {
        n,
        t,
        h,
        hv,
        dk,
        dv,
        pool,
    }
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Random inputs matching `opts` (raw gate and logits where the options activate them).
fn inputs(rng: &mut Rng, s: Shape, dtype: DType, opts: &Options) -> Inputs<'static> {
    let Shape {
        n,
        t,
        h,
        hv,
        dk,
        dv,
        ..
    } = s;
    let unit = |mut x: Vec<f32>| {
        if !opts.use_qk_l2norm {
            for r in x.chunks_mut(dk) {
                let norm = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-3);
                r.iter_mut().for_each(|v| *v /= norm);
            }
        }
        x
    };
    let q = unit(rng.normal(n * t * h * dk, 1.0));
    let k = unit(rng.normal(n * t * h * dk, 1.0));
    let v = rng.normal(n * t * hv * dv, 1.0);
    let g: Vec<f32> = (0..n * t * hv)
        .map(|_| {
            if opts.gate_in_kernel {
                rng.range(-3.0, 3.0)
            } else {
                -softplus(rng.range(-5.0, 1.0)) * 0.5
            }
        })
        .collect();
    let beta: Vec<f32> = (0..n * t * hv)
        .map(|_| {
            if opts.beta_is_logits {
                rng.range(-4.0, 4.0)
            } else {
                rng.range(0.0, 1.0)
            }
        })
        .collect();
    let mut x = Inputs::new(
        Tensor::cast_from_f32(&q, vec![n, t, h, dk], dtype).unwrap(),
        Tensor::cast_from_f32(&k, vec![n, t, h, dk], dtype).unwrap(),
        Tensor::cast_from_f32(&v, vec![n, t, hv, dv], dtype).unwrap(),
        Tensor::from_f32(g, vec![n, t, hv]).unwrap(),
        Tensor::cast_from_f32(&beta, vec![n, t, hv], dtype).unwrap(),
    );
    if opts.gate_in_kernel {
        let a: Vec<f32> = (0..hv).map(|_| rng.range(-2.0, 1.0)).collect();
        let d: Vec<f32> = (0..hv).map(|_| rng.range(-1.0, 1.0)).collect();
        x.a_log = Some(Tensor::from_f32(a, vec![hv]).unwrap());
        x.dt_bias = Some(Tensor::from_f32(d, vec![hv]).unwrap());
    }
    x
}

/// Sequence `n`'s first `len` tokens as a batch of one (the caller sets its initial state).
fn one_sequence(x: &Inputs<'static>, s: Shape, n: usize, len: usize) -> Inputs<'static> {
    let cut = |t: &Tensor<'_>, per_token: usize| {
        let all = t.to_f32();
        let from = n * s.t * per_token;
        let mut shape = t.shape().to_vec();
        shape[0] = 1;
        shape[1] = len;
        Tensor::from_f32(all[from..from + len * per_token].to_vec(), shape).unwrap()
    };
    map_tokens(x, s, cut)
}

/// `x` with each of its five token tensors through `f(tensor, values per token)`, and its gate
/// parameters.
fn map_tokens(
    x: &Inputs<'static>,
    s: Shape,
    f: impl Fn(&Tensor<'static>, usize) -> Tensor<'static>,
) -> Inputs<'static> {
    let mut y = Inputs::new(
        f(&x.q, s.h * s.dk),
        f(&x.k, s.h * s.dk),
        f(&x.v, s.hv * s.dv),
        f(&x.g, s.hv),
        f(&x.beta, s.hv),
    );
    y.a_log = x.a_log.clone();
    y.dt_bias = x.dt_bias.clone();
    y
}

/// What the oracle says a step does: o, the pool after it, and the state after every token,
/// all in float64.
struct Expected {
    o: Vec<f64>,
    pool: Vec<f64>,
    token_states: Vec<f64>,
}

fn oracle(
    x: &Inputs<'static>,
    s: Shape,
    pool: &[f32],
    idx: &StateIndices<'_>,
    opts: &Options,
) -> Expected {
    let row = s.hv * s.dk * s.dv;
    let state_shape = if opts.state_v_first {
        vec![1, s.hv, s.dv, s.dk]
    } else {
        vec![1, s.hv, s.dk, s.dv]
    };
    let mut o = vec![0f64; s.n * s.t * s.hv * s.dv];
    let mut out_pool: Vec<f64> = pool.iter().map(|&v| v as f64).collect();
    let mut token_states = vec![0f64; s.n * s.t * row];
    let mut writes: Vec<(i64, Vec<f64>)> = Vec::new();
    let o_tok = s.hv * s.dv;
    for n in 0..s.n {
        let r = idx.read.map_or(n as i64, |i| i.get(n));
        if r < 0 {
            continue;
        }
        let init = &pool[r as usize * row..][..row];
        let mut after = Vec::new();
        for len in 1..=s.t {
            let mut one = one_sequence(x, s, n, len);
            one.initial_state = Some(Tensor::from_f32(init.to_vec(), state_shape.clone()).unwrap());
            let re = reference(&one, opts).unwrap();
            if len == s.t {
                o[n * s.t * o_tok..][..s.t * o_tok].copy_from_slice(&re.o);
            }
            token_states[(n * s.t + len - 1) * row..][..row].copy_from_slice(&re.final_state);
            after.push(re.final_state);
        }
        if let Some(pt) = &idx.per_token {
            for (t, st) in after.iter().enumerate() {
                writes.push((pt.get(n * s.t + t), st.clone()));
            }
        }
        let w = idx.write.map_or(r, |i| i.get(n));
        writes.push((w, after[s.t - 1].clone()));
    }
    for (w, st) in writes {
        if w >= 0 {
            out_pool[w as usize * row..][..row].copy_from_slice(&st);
        }
    }
    Expected {
        o,
        pool: out_pool,
        token_states,
    }
}

/// Every option combination worth telling apart, with both layouts and head maps.
fn option_sets() -> Vec<Options> {
    let mut v = Vec::new();
    for (l2, logits, neg, gate) in [
        (false, false, false, false),
        (true, false, false, false),
        (true, true, false, true),
        (false, true, true, false),
        (true, true, true, true),
    ] {
        for v_first in [false, true] {
            for head_map in [HeadMap::Grouped, HeadMap::Tiled] {
                v.push(Options {
                    use_qk_l2norm: l2,
                    beta_is_logits: logits,
                    allow_neg_eigval: neg,
                    gate_in_kernel: gate,
                    state_v_first: v_first,
                    head_map,
                    out_dtype: Some(DType::F32),
                    scale: if gate { Some(0.3) } else { None },
                    ..Options::default()
                });
            }
        }
    }
    v
}

/// A random index plan over a pool of `s.pool` rows: distinct read rows (some padding), and
/// optionally separate write rows and per-token rows, none shared between sequences.
struct IndexPlan {
    read: Vec<i64>,
    write: Option<Vec<i64>>,
    per_token: Option<Vec<i64>>,
}

/// Distinct random pool rows for the reads, the separate writes and the per-token states (some
/// slots padding): the pool must hold a row for every slot that may ask for one.
fn index_plan(rng: &mut Rng, s: Shape, separate_write: bool, per_token: bool) -> IndexPlan {
    let slots = s.n * (1 + usize::from(separate_write) + if per_token { s.t } else { 0 });
    assert!(
        s.pool >= slots,
        "a pool of {} rows cannot give distinct rows to the {slots} slots of {s:?}",
        s.pool
    );
    let mut rows: Vec<i64> = (0..s.pool as i64).collect();
    for i in (1..rows.len()).rev() {
        rows.swap(i, rng.int(0, i));
    }
    let mut next = rows.into_iter();
    let read: Vec<i64> = (0..s.n)
        .map(|_| {
            if rng.chance(0.25) {
                -1
            } else {
                next.next().expect("pool too small")
            }
        })
        .collect();
    let write = separate_write.then(|| {
        (0..s.n)
            .map(|_| {
                if rng.chance(0.2) {
                    -1
                } else {
                    next.next().expect("pool too small")
                }
            })
            .collect()
    });
    let per_token = per_token.then(|| {
        (0..s.n * s.t)
            .map(|_| {
                if rng.chance(0.3) {
                    -1
                } else {
                    next.next().expect("pool too small")
                }
            })
            .collect()
    });
    IndexPlan {
        read,
        write,
        per_token,
    }
}

/// Borrowed indices in i32 or i64.
struct Owned {
    i32s: [Option<Vec<i32>>; 3],
    i64s: [Option<Vec<i64>>; 3],
}

impl Owned {
    fn new(p: &IndexPlan, wide: bool) -> Owned {
        let all = [Some(p.read.clone()), p.write.clone(), p.per_token.clone()];
        if wide {
            Owned {
                i32s: [None, None, None],
                i64s: all,
            }
        } else {
            Owned {
                i32s: all.map(|o| o.map(|v| v.iter().map(|&x| x as i32).collect())),
                i64s: [None, None, None],
            }
        }
    }
    fn get(&self, i: usize) -> Option<Indices<'_>> {
        match (&self.i32s[i], &self.i64s[i]) {
            (Some(v), _) => Some(Indices::I32(v)),
            (_, Some(v)) => Some(Indices::I64(v)),
            _ => None,
        }
    }
    fn indices(&self) -> StateIndices<'_> {
        StateIndices {
            read: self.get(0),
            write: self.get(1),
            per_token: self.get(2),
        }
    }
}

fn check_against(what: &str, out: &DecodeOutput, pool: &[f32], e: &Expected, tol: f64) {
    let o = out.o.to_f32();
    let err_o = rel_l2(&o, &e.o);
    let err_pool = rel_l2(pool, &e.pool);
    assert!(err_o < tol, "{what}: o rel err {err_o:e}");
    assert!(err_pool < tol, "{what}: pool rel err {err_pool:e}");
    if let Some(ts) = &out.token_states {
        let err = rel_l2(&ts.to_f32(), &e.token_states);
        assert!(err < tol, "{what}: token states rel err {err:e}");
    }
}

/// One random step on `device` against the oracle, for every option set.
fn pool_cases(device: &Device, shapes: &[Shape], seed: u64) {
    let mut rng = Rng::new(seed);
    let mut cases = 0;
    for &s in shapes {
        for (i, opts) in option_sets().into_iter().enumerate() {
            let dtype = [DType::F32, DType::BF16, DType::F16][i % 3];
            let wide = i % 2 == 0;
            let separate_write = i % 3 != 1;
            let per_token = s.t > 1 && i % 2 == 1;
            let dense = i % 4 != 2;
            let x = inputs(&mut rng, s, dtype, &opts);
            let plan = index_plan(&mut rng, s, separate_write, per_token);
            let owned = Owned::new(&plan, wide);
            let idx = owned.indices();
            let mut pool = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
            let e = oracle(&x, s, &pool, &idx, &opts);
            let out = decode_step(device, &x, &mut pool, &idx, dense, &opts).unwrap();
            let what = format!("{} {s:?} {dtype} {opts:?} wide={wide}", device.name());
            assert_eq!(out.token_states.is_some(), dense);
            check_against(&what, &out, &pool, &e, 1e-5);
            // Padding slots: zeros everywhere.
            let o = out.o.to_f32();
            for (n, &r) in plan.read.iter().enumerate() {
                if r < 0 {
                    let per = s.t * s.hv * s.dv;
                    assert!(o[n * per..][..per].iter().all(|&v| v == 0.0), "{what}");
                }
            }
            cases += 1;
        }
    }
    eprintln!("{}: {cases} pool cases against the oracle", device.name());
}

const CPU_SHAPES: [Shape; 3] = [
    sh(3, 1, 1, 2, 5, 3, 16),
    sh(4, 3, 2, 4, 8, 6, 40),
    sh(2, 8, 1, 2, 16, 8, 40),
];

#[test]
fn cpu_pool_steps_match_the_oracle_for_every_option() {
    pool_cases(&Device::Cpu, &CPU_SHAPES, 1);
}

/// T tokens in one step equal T steps of one token, output and per-token states alike.
fn multi_token_equals_single_steps(device: &Device, s: Shape, exact: bool) {
    let mut rng = Rng::new(7);
    for opts in option_sets() {
        let x = inputs(&mut rng, s, DType::BF16, &opts);
        let plan = index_plan(&mut rng, s, false, false);
        let owned = Owned::new(&plan, true);
        let idx = owned.indices();
        let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
        let mut pool_multi = pool0.clone();
        let multi = decode_step(device, &x, &mut pool_multi, &idx, true, &opts).unwrap();
        let mut pool_single = pool0.clone();
        let one = Shape { t: 1, ..s };
        let row = s.hv * s.dk * s.dv;
        let o_multi = multi.o.to_f32();
        let ts_multi = multi.token_states.as_ref().unwrap().to_f32();
        for t in 0..s.t {
            let pick = |tensor: &Tensor<'_>, per: usize| {
                let all = tensor.to_f32();
                let mut v = Vec::new();
                for n in 0..s.n {
                    v.extend_from_slice(&all[(n * s.t + t) * per..][..per]);
                }
                let mut shape = tensor.shape().to_vec();
                shape[1] = 1;
                Tensor::from_f32(v, shape).unwrap()
            };
            let xt = map_tokens(&x, s, pick);
            let single = decode_step(device, &xt, &mut pool_single, &idx, true, &opts).unwrap();
            let o1 = single.o.to_f32();
            let ts1 = single.token_states.unwrap();
            let ts1 = ts1.to_f32();
            let _ = one;
            for n in 0..s.n {
                let per = s.hv * s.dv;
                let a = &o_multi[(n * s.t + t) * per..][..per];
                let b = &o1[n * per..][..per];
                let sa = &ts_multi[(n * s.t + t) * row..][..row];
                let sb = &ts1[n * row..][..row];
                if exact {
                    assert_eq!(a, b, "o, token {t}, sequence {n}, {opts:?}");
                    assert_eq!(sa, sb, "state, token {t}, sequence {n}, {opts:?}");
                } else {
                    let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
                    assert!(rel_l2(a, &wide(b)) < 1e-5, "o, token {t}, {opts:?}");
                    assert!(rel_l2(sa, &wide(sb)) < 1e-5, "state, token {t}, {opts:?}");
                }
            }
        }
        let wide: Vec<f64> = pool_single.iter().map(|&x| x as f64).collect();
        if exact {
            assert_eq!(pool_multi, pool_single, "{opts:?}");
        } else {
            assert!(rel_l2(&pool_multi, &wide) < 1e-5, "{opts:?}");
        }
    }
}

#[test]
fn cpu_multi_token_step_equals_single_steps_bitwise() {
    multi_token_equals_single_steps(&Device::Cpu, sh(3, 5, 2, 4, 8, 4, 7), true);
}

/// The CPU step that writes only the final states (in place in the pool) and the one that also
/// keeps every token's state take the same arithmetic: the same bits in o and in the pool.
#[test]
fn cpu_step_gives_the_same_bits_with_and_without_token_states() {
    let s = sh(3, 4, 2, 4, 8, 12, 7);
    let mut rng = Rng::new(11);
    for opts in option_sets() {
        let x = inputs(&mut rng, s, DType::BF16, &opts);
        let plan = index_plan(&mut rng, s, false, false);
        let owned = Owned::new(&plan, false);
        let idx = owned.indices();
        let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
        let (mut pool_a, mut pool_b) = (pool0.clone(), pool0);
        let a = decode_step(&Device::Cpu, &x, &mut pool_a, &idx, false, &opts).unwrap();
        let b = decode_step(&Device::Cpu, &x, &mut pool_b, &idx, true, &opts).unwrap();
        assert!(a.token_states.is_none() && b.token_states.is_some());
        assert_eq!(a.o.to_f32(), b.o.to_f32(), "o, {opts:?}");
        assert_eq!(pool_a, pool_b, "pool, {opts:?}");
    }
}

/// One token a step over 128 x 128 states, many (sequence, head) tasks: the CPU steps them in
/// software-pipelined runs (each state's update beside the next one's sums), which must give
/// the bits of the plain per-token step (the dense path), in pools of 1 and 2 threads.
#[test]
fn cpu_pipelined_step_gives_the_bits_of_the_plain_one() {
    let s = sh(10, 1, 2, 4, 128, 128, 23);
    let mut rng = Rng::new(13);
    for opts in option_sets().into_iter().filter(|o| !o.state_v_first) {
        let x = inputs(&mut rng, s, DType::BF16, &opts);
        let plan = index_plan(&mut rng, s, true, false);
        let owned = Owned::new(&plan, false);
        let idx = owned.indices();
        let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut pool_a, mut pool_b) = (pool0.clone(), pool0.clone());
            let (a, b) = pool.install(|| {
                (
                    decode_step(&Device::Cpu, &x, &mut pool_a, &idx, false, &opts).unwrap(),
                    decode_step(&Device::Cpu, &x, &mut pool_b, &idx, true, &opts).unwrap(),
                )
            });
            assert_eq!(a.o.to_f32(), b.o.to_f32(), "o, {threads} threads, {opts:?}");
            assert_eq!(pool_a, pool_b, "pool, {threads} threads, {opts:?}");
        }
    }
}

#[test]
fn cpu_decode_into_writes_every_element_as_decode_step() {
    // Padding slots, separate write rows and per-token rows, both layouts, one and two tokens,
    // V tiles (N = 3 at HV = 2 leaves few tasks per thread); `o` poisoned with NaN first.
    let mut rng = Rng::new(31);
    for (i, opts) in option_sets().into_iter().enumerate() {
        let t = 1 + i % 2;
        let s = sh(3, t, 1, 2, 16, 64, 3 * (2 + t));
        let x = inputs(&mut rng, s, DType::BF16, &opts);
        let mut plan = index_plan(&mut rng, s, i % 3 != 0, i % 2 == 1);
        // A padding slot in every case, a live one beside it.
        (plan.read[1], plan.read[2]) = (-1, plan.read[1].max(plan.read[2]));
        let owned = Owned::new(&plan, i % 2 == 0);
        let idx = owned.indices();
        let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut pool_a, mut pool_b) = (pool0.clone(), pool0.clone());
            let mut o = vec![f32::NAN; s.n * t * s.hv * s.dv];
            let f32_out = Options {
                out_dtype: Some(DType::F32),
                ..opts.clone()
            };
            let want = pool.install(|| {
                decode_into(&x, &mut pool_a, &idx, &opts, &mut o).unwrap();
                decode_step(&Device::Cpu, &x, &mut pool_b, &idx, false, &f32_out).unwrap()
            });
            let want_o = want.o.to_f32();
            assert!(
                o.iter()
                    .zip(want_o.iter())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "o, {threads} threads, {opts:?}"
            );
            assert_eq!(pool_a, pool_b, "pool, {threads} threads, {opts:?}");
            let padding = &o[t * s.hv * s.dv..][..t * s.hv * s.dv];
            assert!(padding.iter().all(|&x| x == 0.0), "padding o, {opts:?}");
        }
        let mut short = vec![0f32; s.n * t * s.hv * s.dv - 1];
        match decode_into(&x, &mut pool0.clone(), &idx, &opts, &mut short) {
            Err(Error::Invalid { arg: "o", .. }) => {}
            other => panic!("a short o: expected an Err naming o, got {other:?}"),
        }
    }
}

fn small_inputs(n: usize, t: usize) -> (Inputs<'static>, Shape) {
    let s = Shape {
        n,
        t,
        h: 1,
        hv: 2,
        dk: 4,
        dv: 4,
        pool: 6,
    };
    let mut rng = Rng::new(3);
    (inputs(&mut rng, s, DType::F32, &Options::default()), s)
}

fn expect_err(r: deltanet::Result<DecodeOutput>, arg: &str) {
    match r {
        Err(Error::Invalid { arg: a, .. }) if a == arg => {}
        other => panic!("expected an Err naming {arg}, got {other:?}"),
    }
}

#[test]
fn bad_indices_and_shapes_are_refused_and_leave_the_pool() {
    let (x, s) = small_inputs(3, 2);
    let opts = Options::default();
    let mut rng = Rng::new(9);
    let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 1.0);
    let mut pool = pool0.clone();
    let run = |pool: &mut Vec<f32>, idx: StateIndices<'_>| {
        decode_step(&Device::Cpu, &x, pool, &idx, false, &opts)
    };
    let i32s = |v: &'static [i32]| Some(Indices::I32(v));
    // (read, write, per-token rows; an empty list is none) and the argument named.
    type Rows = &'static [i32];
    let refused: [(Rows, Rows, Rows, &str); 7] = [
        // Two sequences updating one row in place.
        (&[0, 4, 0], &[], &[], "state_indices"),
        // Two sequences writing one row.
        (&[0, 1, 2], &[3, 3, 5], &[], "out_state_indices"),
        // A row written by one sequence and read by another.
        (&[0, 1, 2], &[1, 3, 4], &[], "state_indices"),
        // Per-token rows colliding with another sequence's final row.
        (
            &[0, 1, 2],
            &[],
            &[-1, 5, -1, -1, -1, 5],
            "token_state_indices",
        ),
        // Past the pool, wrong lengths.
        (&[0, 6, 1], &[], &[], "state_indices"),
        (&[0, 1], &[], &[], "state_indices"),
        (&[0, 1, 2], &[], &[3, 4, 5], "token_state_indices"),
    ];
    let some = |rows: &'static [i32]| (!rows.is_empty()).then_some(Indices::I32(rows));
    for (read, write, per_token, arg) in refused {
        let idx = StateIndices {
            read: some(read),
            write: some(write),
            per_token: some(per_token),
        };
        expect_err(run(&mut pool, idx), arg);
    }
    assert_eq!(pool, pool0, "a refused step must leave the pool untouched");
    // A pool that is not whole rows; varlen; an initial state.
    let mut short = vec![0f32; s.hv * s.dk * s.dv * 2 + 1];
    expect_err(run(&mut short, StateIndices::default()), "state");
    let mut two_rows = vec![0f32; s.hv * s.dk * s.dv * 2];
    expect_err(run(&mut two_rows, StateIndices::default()), "state");
    let mut xv = x.clone();
    xv.cu_seqlens = Some(vec![0, 2]);
    expect_err(
        decode_step(
            &Device::Cpu,
            &xv,
            &mut pool,
            &StateIndices::default(),
            false,
            &opts,
        ),
        "cu_seqlens",
    );
    // Sharing a row that is only read is allowed: two forks of one prefix.
    let before = pool[..s.hv * s.dk * s.dv].to_vec();
    run(
        &mut pool,
        StateIndices {
            read: i32s(&[0, 0, -1]),
            write: i32s(&[1, 2, 2]),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(&pool[..before.len()], &before[..], "row 0 was only read");
}

#[test]
fn recurrent_step_on_the_cpu_equals_a_decode_step() {
    let (x, s) = small_inputs(3, 4);
    let opts = Options::default();
    let mut rng = Rng::new(5);
    let mut a = rng.normal(s.n * s.hv * s.dk * s.dv, 1.0);
    let mut b = a.clone();
    let o1 = recurrent_step(&Device::Cpu, &x, &mut a, &opts).unwrap();
    let o2 = decode_step(
        &Device::Cpu,
        &x,
        &mut b,
        &StateIndices::default(),
        false,
        &opts,
    )
    .unwrap()
    .o;
    assert_eq!(o1.to_f32(), o2.to_f32());
    assert_eq!(a, b);
}

// ---------------------------------------------------------------------------------------------
// The kernel.

#[test]
fn decode_kernel_compiles_with_nvrtc_and_moves_16_byte_vectors() {
    if !deltanet::cuda::registry::nvrtc_available() {
        eprintln!("skipped: libnvrtc cannot be loaded on this machine");
        return;
    }
    for arch in ["sm_90", "sm_80"] {
        let ptx = deltanet::cuda::decode::ptx(arch).unwrap();
        for f in ["decode_kv", "decode_vk", "decode_kv_k128_v128"] {
            assert!(ptx.contains(&format!(".entry {f}")), "{arch}: no {f}");
        }
        assert!(
            ptx.contains("ld.global.v4.f32"),
            "{arch}: no 16-byte state loads"
        );
        assert!(
            ptx.contains("st.global.v4.f32"),
            "{arch}: no 16-byte state stores"
        );
        assert!(
            !ptx.contains(".local"),
            "{arch}: local memory in the decode kernel"
        );
    }
}

/// The kernel's CUDA source run on the CPU (lanes as threads, see dev/decode_emulate.py)
/// against a float64 reference: every layout, K from 16 to 256, partial column tiles, every
/// option and index kind, and warps looping over several items.
#[test]
fn decode_kernel_source_runs_correctly_under_host_emulation() {
    common::host_emulation_passes("decode_emulate.py", 40);
}

fn gpu() -> Option<Device> {
    static DEV: OnceLock<Option<Arc<CudaDevice>>> = OnceLock::new();
    DEV.get_or_init(|| match CudaDevice::new(0) {
        Ok(d) => {
            eprintln!("GPU tests run on {}", d.name());
            Some(Arc::new(d))
        }
        Err(e) => {
            eprintln!("skipped: no usable GPU ({e})");
            None
        }
    })
    .clone()
    .map(Device::Cuda)
}

const GPU_SHAPES: [Shape; 5] = [
    sh(3, 1, 2, 4, 128, 128, 16),
    sh(4, 3, 1, 2, 64, 36, 40),
    sh(2, 8, 1, 2, 16, 132, 40),
    sh(3, 2, 1, 1, 256, 12, 20),
    sh(5, 1, 1, 3, 32, 200, 16),
];

#[test]
fn gpu_pool_steps_match_the_oracle_for_every_option() {
    let Some(dev) = gpu() else {
        eprintln!("skipped: gpu_pool_steps_match_the_oracle_for_every_option (no GPU)");
        return;
    };
    pool_cases(&dev, &GPU_SHAPES, 11);
}

/// Launches of more than one wave of 4-warp blocks (thousands of items), pools with padding.
#[test]
fn gpu_large_launches_match_the_oracle() {
    let Some(dev) = gpu() else {
        eprintln!("skipped: gpu_large_launches_match_the_oracle (no GPU)");
        return;
    };
    let shapes = [
        sh(40, 2, 2, 8, 128, 128, 170),
        sh(48, 1, 1, 16, 64, 120, 120),
    ];
    pool_cases(&dev, &shapes, 12);
}

#[test]
fn gpu_multi_token_step_equals_single_steps() {
    let Some(dev) = gpu() else {
        eprintln!("skipped: gpu_multi_token_step_equals_single_steps (no GPU)");
        return;
    };
    multi_token_equals_single_steps(&dev, sh(3, 6, 2, 4, 128, 128, 7), false);
}

#[test]
fn gpu_matches_the_cpu_and_recurrent_step_uses_the_kernel() {
    let Some(dev) = gpu() else {
        eprintln!("skipped: gpu_matches_the_cpu_and_recurrent_step_uses_the_kernel (no GPU)");
        return;
    };
    let mut rng = Rng::new(21);
    let s = sh(6, 4, 2, 4, 128, 128, 40);
    for opts in option_sets() {
        let x = inputs(&mut rng, s, DType::BF16, &opts);
        let plan = index_plan(&mut rng, s, true, true);
        let owned = Owned::new(&plan, false);
        let idx = owned.indices();
        let pool0 = rng.normal(s.pool * s.hv * s.dk * s.dv, 0.3);
        let (mut pc, mut pg) = (pool0.clone(), pool0.clone());
        let c = decode_step(&Device::Cpu, &x, &mut pc, &idx, true, &opts).unwrap();
        let g = decode_step(&dev, &x, &mut pg, &idx, true, &opts).unwrap();
        let wide = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        assert!(
            rel_l2(&g.o.to_f32(), &wide(&c.o.to_f32())) < 1e-5,
            "{opts:?}"
        );
        assert!(rel_l2(&pg, &wide(&pc)) < 1e-5, "{opts:?}");
        let (tc, tg) = (c.token_states.unwrap(), g.token_states.unwrap());
        assert!(rel_l2(&tg.to_f32(), &wide(&tc.to_f32())) < 1e-5, "{opts:?}");
        // Rows no index names are untouched, bitwise.
        let row = s.hv * s.dk * s.dv;
        let mut named = vec![false; s.pool];
        for v in [
            Some(&plan.read),
            plan.write.as_ref(),
            plan.per_token.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            v.iter()
                .filter(|&&r| r >= 0)
                .for_each(|&r| named[r as usize] = true);
        }
        for (r, _) in named.iter().enumerate().filter(|(_, &n)| !n) {
            assert_eq!(&pg[r * row..][..row], &pool0[r * row..][..row], "row {r}");
        }

        // recurrent_step (a pool of N rows, in place) on the GPU against the oracle.
        let mut state = rng.normal(s.n * row, 0.3);
        let e = oracle(
            &x,
            Shape { pool: s.n, ..s },
            &state,
            &StateIndices::default(),
            &opts,
        );
        let o = recurrent_step(&dev, &x, &mut state, &opts).unwrap();
        assert!(rel_l2(&o.to_f32(), &e.o) < 1e-5, "recurrent_step {opts:?}");
        assert!(rel_l2(&state, &e.pool) < 1e-5, "recurrent_step {opts:?}");
    }
}
