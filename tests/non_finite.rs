//! Non-finite inputs: a NaN or an infinity in q, k, v, g or beta at token t of a (sequence, value
//! head) must leave every earlier token of it, and every other (sequence, value head), as the
//! per-token definition leaves them: finite, equal to the float64 oracle, and equal to the run
//! where that value is finite. Checked on the CPU's forward (fused) and on its stage-by-stage
//! path, on random shapes: varlen, chunk sizes 16/32/64, grouped and tiled value heads.

use deltanet::cpu::Cpu;
use deltanet::reference::reference;
use deltanet::{
    chunk_forward, forward, upload_inputs, DType, Device, HeadMap, Inputs, Options, Problem,
    Tensor, CHUNK_SIZES,
};

/// The library's generator, with the two draws these tests use.
struct Rng(deltanet::selftest::Rng);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0.int(0, n.saturating_sub(1))
    }
    fn values(&mut self, n: usize, f: impl Fn(f32) -> f32) -> Vec<f32> {
        (0..n).map(|_| f(self.0.uniform())).collect()
    }
}

/// Which input holds the non-finite value, and where.
#[derive(Clone, Copy, Debug)]
enum Tensor5 {
    Q,
    K,
    V,
    G,
    Beta,
}

#[derive(Clone, Debug)]
struct Poison {
    tensor: Tensor5,
    /// Flat token index into the `B * T` tokens.
    token: usize,
    /// The q/k head (q, k) or the value head (v, g, beta).
    head: usize,
    /// Element within the row (q, k, v).
    elem: usize,
    value: f32,
}

struct Case {
    f32s: [Vec<f32>; 5],
    shapes: [Vec<usize>; 5],
    h0: Option<(Vec<f32>, Vec<usize>)>,
    cu_seqlens: Option<Vec<i64>>,
    opts: Options,
}

impl Case {
    fn inputs(&self) -> Inputs<'static> {
        let t = |i: usize| Tensor::from_f32(self.f32s[i].clone(), self.shapes[i].clone()).unwrap();
        let mut x = Inputs::new(t(0), t(1), t(2), t(3), t(4));
        x.initial_state = self
            .h0
            .as_ref()
            .map(|(s, shape)| Tensor::from_f32(s.clone(), shape.clone()).unwrap());
        x.cu_seqlens = self.cu_seqlens.clone();
        x
    }

    /// The inputs with `p.value` written where `p` says.
    fn poisoned(&self, p: &Poison) -> Inputs<'static> {
        let mut c = Case {
            f32s: self.f32s.clone(),
            shapes: self.shapes.clone(),
            h0: self.h0.clone(),
            cu_seqlens: self.cu_seqlens.clone(),
            opts: self.opts.clone(),
        };
        let (i, width, heads) = match p.tensor {
            Tensor5::Q => (0, self.shapes[0][3], self.shapes[0][2]),
            Tensor5::K => (1, self.shapes[1][3], self.shapes[1][2]),
            Tensor5::V => (2, self.shapes[2][3], self.shapes[2][2]),
            Tensor5::G => (3, 1, self.shapes[3][2]),
            Tensor5::Beta => (4, 1, self.shapes[4][2]),
        };
        c.f32s[i][(p.token * heads + p.head) * width + p.elem] = p.value;
        c.inputs()
    }
}

fn random_case(rng: &mut Rng) -> Case {
    let chunk_size = CHUNK_SIZES[rng.below(CHUNK_SIZES.len())];
    let h = 1 + rng.below(2);
    let hv = h * (1 + rng.below(3));
    let (dk, dv) = ([8, 16, 24][rng.below(3)], [8, 12, 16][rng.below(3)]);
    let (b, t, cu_seqlens, n) = if rng.below(2) == 0 {
        let n = 1 + rng.below(3);
        let mut cu = vec![0i64];
        for _ in 0..n {
            let len = rng.below(2 * chunk_size + 20) as i64;
            cu.push(cu.last().unwrap() + len);
        }
        let t = *cu.last().unwrap() as usize;
        (1, t, Some(cu), n)
    } else {
        let b = 1 + rng.below(2);
        (b, 1 + rng.below(2 * chunk_size + 20), None, b)
    };
    let sym = |u: f32| 2.0 * u - 1.0;
    let f32s = [
        rng.values(b * t * h * dk, sym),
        rng.values(b * t * h * dk, sym),
        rng.values(b * t * hv * dv, sym),
        rng.values(b * t * hv, |u| -0.02 - 0.3 * u),
        rng.values(b * t * hv, |u| 0.1 + 0.8 * u),
    ];
    let shapes = [
        vec![b, t, h, dk],
        vec![b, t, h, dk],
        vec![b, t, hv, dv],
        vec![b, t, hv],
        vec![b, t, hv],
    ];
    let h0 = (rng.below(2) == 0).then(|| {
        (
            rng.values(n * hv * dk * dv, |u| 0.2 * sym(u)),
            vec![n, hv, dk, dv],
        )
    });
    let opts = Options {
        use_qk_l2norm: true,
        chunk_size,
        head_map: if rng.below(2) == 0 {
            HeadMap::Grouped
        } else {
            HeadMap::Tiled
        },
        output_final_state: true,
        output_chunk_states: true,
        out_dtype: Some(DType::F32),
        ..Options::default()
    };
    Case {
        f32s,
        shapes,
        h0,
        cu_seqlens,
        opts,
    }
}

fn random_poison(rng: &mut Rng, c: &Case) -> Option<Poison> {
    let [b, t, h, dk] = c.shapes[0][..] else {
        unreachable!()
    };
    let (hv, dv) = (c.shapes[2][2], c.shapes[2][3]);
    if b * t == 0 {
        return None;
    }
    let tensor = [
        Tensor5::Q,
        Tensor5::K,
        Tensor5::V,
        Tensor5::G,
        Tensor5::Beta,
    ][rng.below(5)];
    // A g of -inf is a hard reset, not an error: only NaN and +inf poison g.
    let values: &[f32] = match tensor {
        Tensor5::G => &[f32::NAN, f32::INFINITY],
        _ => &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY],
    };
    let (head, elem) = match tensor {
        Tensor5::Q | Tensor5::K => (rng.below(h), rng.below(dk)),
        Tensor5::V => (rng.below(hv), rng.below(dv)),
        Tensor5::G | Tensor5::Beta => (rng.below(hv), 0),
    };
    Some(Poison {
        tensor,
        token: rng.below(b * t),
        head,
        elem,
        value: values[rng.below(values.len())],
    })
}

/// The first poisoned token of each (sequence, value head), `usize::MAX` where there is none.
fn first_bad(p: &Problem, poison: &Poison) -> Vec<usize> {
    let hv = p.v_heads();
    (0..p.num_seqs() * hv)
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            let (s0, s1) = p.seqs()[n];
            let head_hit = match poison.tensor {
                Tensor5::Q | Tensor5::K => p.qk_head(j) == poison.head,
                _ => j == poison.head,
            };
            if head_hit && (s0..s1).contains(&poison.token) {
                poison.token
            } else {
                usize::MAX
            }
        })
        .collect()
}

/// The fused and staged paths round differently (the fused one never forms `w` and `u`): equal
/// within the oracle's tolerance, relative to the larger norm.
fn close(a: &[f32], b: &[f32]) -> bool {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let n: f64 = a.iter().chain(b).map(|&x| (x as f64).powi(2)).sum::<f64>() / 2.0;
    a.len() == b.len() && d <= 1e-10 * n.max(f64::MIN_POSITIVE)
}

fn f32s(t: &Tensor<'_>) -> Vec<f32> {
    t.to_f32().into_owned()
}

/// One poisoned case: every guarantee of `forward`'s documentation, on the fused forward and on
/// the stage-by-stage path. Returns the squared error and squared norm of the checked outputs
/// against the oracle.
fn check(c: &Case, poison: &Poison, what: &str) -> (f64, f64) {
    let opts = &c.opts;
    let x = c.poisoned(poison);
    let p = Problem::from_inputs(&x, opts).unwrap();
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let bad = first_bad(&p, poison);

    let out = forward(&Device::Cpu, &x, opts).unwrap();
    let clean = forward(&Device::Cpu, &c.inputs(), opts).unwrap();
    let oracle = reference(&x, opts).unwrap();
    let si = upload_inputs(&Cpu, &p, &x, opts).unwrap();
    let staged = chunk_forward(&Cpu, &p, opts, &si).unwrap();

    let o = f32s(&out.o);
    let o_clean = f32s(&clean.o);
    let fin = f32s(out.final_state.as_ref().unwrap());
    let fin_clean = f32s(clean.final_state.as_ref().unwrap());
    let h = f32s(out.chunk_states.as_ref().unwrap());
    let h_clean = f32s(clean.chunk_states.as_ref().unwrap());
    let (mut err, mut norm) = (0f64, 0f64);
    for (task, &bad) in bad.iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let (s0, s1) = p.seqs()[n];
        for t in s0..s1.min(bad) {
            let row = (t * hv + j) * dv..(t * hv + j + 1) * dv;
            let (fused, stage) = (&o[row.clone()], &staged.o[row.clone()]);
            assert!(
                fused.iter().chain(stage).all(|v| v.is_finite()),
                "{what}: o of token {t} (before the poisoned token {bad}), value head {j}: \
                 fused {fused:?}, staged {stage:?}"
            );
            assert_eq!(
                fused,
                &o_clean[row.clone()],
                "{what}: o of token {t}, value head {j} depends on a later token"
            );
            assert!(
                close(fused, stage),
                "{what}: fused and staged o differ at token {t}: {fused:?} vs {stage:?}"
            );
            for (&a, &r) in fused.iter().zip(&oracle.o[row]) {
                err += (a as f64 - r) * (a as f64 - r);
                norm += r * r;
            }
        }
        for ci in p.seq_chunks(n) {
            if p.chunks()[ci].start <= bad {
                let at = (ci * hv + j) * kv..(ci * hv + j + 1) * kv;
                assert!(
                    h[at.clone()].iter().all(|v| v.is_finite()),
                    "{what}: chunk state {ci}"
                );
                assert_eq!(
                    h[at.clone()],
                    h_clean[at],
                    "{what}: chunk state {ci}, head {j}"
                );
            }
        }
        if bad == usize::MAX {
            let at = task * kv..(task + 1) * kv;
            assert!(
                fin[at.clone()].iter().all(|v| v.is_finite()),
                "{what}: final state"
            );
            assert_eq!(
                fin[at.clone()],
                fin_clean[at.clone()],
                "{what}: final state"
            );
            assert!(
                close(&fin[at.clone()], &staged.final_state[at]),
                "{what}: final state, fused vs staged"
            );
        }
    }
    (err, norm)
}

#[test]
fn nan_in_k_keeps_earlier_tokens_of_its_chunk_finite() {
    // One sequence of one chunk; the NaN sits in its middle.
    let mut rng = Rng(deltanet::selftest::Rng::new(7));
    let (t, dk, dv) = (64, 16, 16);
    let sym = |u: f32| 2.0 * u - 1.0;
    let c = Case {
        f32s: [
            rng.values(t * dk, sym),
            rng.values(t * dk, sym),
            rng.values(t * dv, sym),
            rng.values(t, |u| -0.1 * u),
            rng.values(t, |u| 0.1 + 0.8 * u),
        ],
        shapes: [
            vec![1, t, 1, dk],
            vec![1, t, 1, dk],
            vec![1, t, 1, dv],
            vec![1, t, 1],
            vec![1, t, 1],
        ],
        h0: None,
        cu_seqlens: None,
        opts: Options {
            use_qk_l2norm: true,
            output_chunk_states: true,
            out_dtype: Some(DType::F32),
            ..Options::default()
        },
    };
    let poison = Poison {
        tensor: Tensor5::K,
        token: 40,
        head: 0,
        elem: 3,
        value: f32::NAN,
    };
    let (err, norm) = check(&c, &poison, "NaN in k at token 40");
    assert!(
        (err / norm).sqrt() < 1e-5,
        "rel err {}",
        (err / norm).sqrt()
    );
}

#[test]
fn non_finite_inputs_leave_earlier_tokens_and_other_heads_as_the_definition_does() {
    let mut rng = Rng(deltanet::selftest::Rng::new(0x5eed_0001));
    let (mut err, mut norm, mut checked) = (0f64, 0f64, 0);
    for case in 0..300 {
        let c = random_case(&mut rng);
        let Some(poison) = random_poison(&mut rng, &c) else {
            continue;
        };
        let what = format!(
            "case {case} ({:?} B,T,H,K={:?} HV,V={:?}, cu_seqlens {:?}, chunk {}, {:?}): {poison:?}",
            c.opts.head_map,
            c.shapes[0],
            &c.shapes[2][2..],
            c.cu_seqlens,
            c.opts.chunk_size,
            poison.tensor
        );
        let (e, n) = check(&c, &poison, &what);
        err += e;
        norm += n;
        checked += 1;
    }
    assert!(checked > 250, "only {checked} cases had tokens");
    let rel = (err / norm).sqrt();
    assert!(
        rel < 1e-5,
        "outputs before the poisoned tokens vs the oracle: rel err {rel:.2e}"
    );
}
