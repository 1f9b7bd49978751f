//! The fused GPU prefill against the stage path and the float64 oracle, on random problems of
//! every option (varlen with empty sequences, both head maps, initial state, both state layouts,
//! l2norm, beta logits with and without negative eigenvalues, gate in kernel, hard resets,
//! chunk states, f32/bf16/f16 inputs). Skips, saying so, where no GPU can be used.

mod common;

use std::sync::Arc;

use deltanet::cuda::fused;
use deltanet::cuda::CudaDevice;
use deltanet::reference::{reference, rel_l2};
use deltanet::selftest::{Rng, Spec};
use deltanet::{
    chunk_forward, forward, upload_inputs, DType, Device, HostIo, Inputs, Options, Problem, Tensor,
};

fn pick<T: Copy>(r: &mut Rng, xs: &[T]) -> T {
    xs[r.int(0, xs.len() - 1)]
}

/// A random problem the fused path supports: the library's generator ([`Spec::random`], every
/// option and value profile), with chunk size 64, K and V multiples of 16 up to 256, T up to
/// 400, and chunk states asked for now and then.
fn case(seed: u64) -> (String, Inputs<'static>, Options) {
    let mut r = Rng::new(seed);
    let mut spec = Spec::random(&mut r);
    spec.k = pick(&mut r, &[16, 32, 64, 128, 128, 256]);
    spec.v = pick(&mut r, &[16, 32, 48, 64, 128, 128, 256]);
    spec.chunk_size = 64;
    if r.chance(0.5) {
        spec.t = r.int(1, 400);
    }
    let c = spec.build().unwrap();
    let opts = Options {
        output_chunk_states: r.chance(0.3),
        ..c.opts
    };
    (format!("seed {seed}: {}", c.name), c.inputs, opts)
}

/// The automatic choice and every explicit kernel variant.
fn tunings() -> Vec<fused::Tuning> {
    use fused::Tuning;
    vec![
        Tuning::default(),
        Tuning {
            vt: Some(32),
            wide: Some(false),
            ..Tuning::default()
        },
        Tuning {
            vt: Some(16),
            nbuf: Some(1),
            ..Tuning::default()
        },
        Tuning {
            wide: Some(true),
            ..Tuning::default()
        },
        Tuning {
            fma: true,
            wide: Some(false),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(false),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(16),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(128),
            nbuf: Some(1),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            ksplit: Some(false),
            vt: Some(32),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            vt: Some(16),
            nbuf: Some(1),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            ksplit: Some(true),
            vt: Some(32),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            ksplit: Some(false),
            hbuf: Some(true),
            vt: Some(32),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            ksplit: Some(true),
            hbuf: Some(true),
            nbuf: Some(1),
            vt: Some(32),
            ..Tuning::default()
        },
        // Few blocks, each running several items (chunks, sequences, segments) one after the
        // other: the state a block carries from one item to the next.
        Tuning {
            max_blocks: Some(5),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            segments: Some(3),
            vt: Some(16),
            max_blocks: Some(3),
            ..Tuning::default()
        },
        // Blocks running several items: the plain kernel with its planes in one buffer, the
        // split one with one buffer of everything.
        Tuning {
            regs: Some(true),
            vt: Some(128),
            late_planes: Some(true),
            max_blocks: Some(2),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            vt: Some(16),
            nbuf: Some(1),
            max_blocks: Some(2),
            ..Tuning::default()
        },
        // Short chunks run as whole ones (the skip of their empty row blocks, the default where
        // they are common, off), and with the skip in the split kernel over segments.
        Tuning {
            row_skip: Some(false),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            split: Some(true),
            vt: Some(16),
            row_skip: Some(true),
            segments: Some(2),
            ..Tuning::default()
        },
        // Segments (warm-ups before each, the value heads that cannot have them by the second
        // launch) forced on problems of a few chunks.
        Tuning {
            segments: Some(3),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            segments: Some(2),
            vt: Some(128),
            ..Tuning::default()
        },
        // The plain kernel with its planes in one buffer (opt-in), also where two whole stage
        // buffers would fit; on mma.sync alone (as on GPUs before sm_90).
        Tuning {
            regs: Some(true),
            vt: Some(128),
            late_planes: Some(true),
            wgmma: Some(false),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(32),
            split: Some(false),
            late_planes: Some(true),
            segments: Some(2),
            ..Tuning::default()
        },
        // The warpgroup products (Hopper; elsewhere the same tunings without them), 128 and 64
        // columns, with the planes in one buffer, and in segments.
        Tuning {
            regs: Some(true),
            vt: Some(128),
            wgmma: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(64),
            split: Some(false),
            wgmma: Some(true),
            late_planes: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(128),
            wgmma: Some(true),
            segments: Some(2),
            ..Tuning::default()
        },
        // The triangular products on mma.sync beside the warpgroup products (the default
        // puts them on warpgroup products too).
        Tuning {
            regs: Some(true),
            vt: Some(128),
            wgmma: Some(true),
            wg_tri: Some(false),
            ..Tuning::default()
        },
        // chunk_intra's row norms from the products' diagonals and its inverse by doubling,
        // together and each alone, in segments (the chunk decays' beta |k|^2 check) too.
        Tuning {
            regs: Some(true),
            vt: Some(128),
            intra_diag: Some(true),
            intra_doubling: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(32),
            split: Some(true),
            intra_diag: Some(true),
            segments: Some(2),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(64),
            intra_doubling: Some(true),
            ..Tuning::default()
        },
        // The doubling's products on the tensor cores, with the diagonals' norms, whole and
        // in segments.
        Tuning {
            regs: Some(true),
            vt: Some(128),
            intra_diag: Some(true),
            intra_doubling: Some(true),
            intra_doubling_mma: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(32),
            split: Some(true),
            intra_doubling: Some(true),
            intra_doubling_mma: Some(true),
            segments: Some(2),
            ..Tuning::default()
        },
        // p formed in the recurrent kernel (the exact precision's default): two warpgroups,
        // one (with the planes in one buffer), and in segments.
        Tuning {
            regs: Some(true),
            vt: Some(128),
            p_in_rec: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(64),
            split: Some(false),
            late_planes: Some(true),
            p_in_rec: Some(true),
            ..Tuning::default()
        },
        Tuning {
            regs: Some(true),
            vt: Some(128),
            segments: Some(2),
            p_in_rec: Some(true),
            ..Tuning::default()
        },
        // chunk_intra compiled for three and five blocks an SM (other register budgets).
        Tuning {
            intra_blocks: Some(3),
            ..Tuning::default()
        },
        Tuning {
            intra_blocks: Some(5),
            ..Tuning::default()
        },
        // The recurrent kernel capped at 192 registers a thread.
        Tuning {
            rec_regs: Some(192),
            ..Tuning::default()
        },
        // Groups of sequences pipelined over two streams (where the sequence order allows),
        // with the cap and one buffer of planes (the form whose blocks can share an SM).
        Tuning {
            groups: Some(2),
            ..Tuning::default()
        },
        Tuning {
            groups: Some(3),
            rec_regs: Some(192),
            late_planes: Some(true),
            ..Tuning::default()
        },
    ]
}

/// The GPU, or None after saying the test is skipped.
fn gpu() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            eprintln!("SKIPPED: no usable GPU ({e})");
            None
        }
    }
}

/// Random problems per test: DELTANET_FUSED_CASES, else `default`.
fn case_count(default: u64) -> u64 {
    std::env::var("DELTANET_FUSED_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn to64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&a| a as f64).collect()
}

#[test]
fn fused_equals_stages_and_oracle_on_every_option_or_skip_without_gpu() {
    let Some(dev) = gpu() else { return };
    let cases = case_count(60);
    let device = Device::Cuda(dev.clone());
    let mut worst = [0f64; 4];
    let mut fused_runs = 0;
    for seed in 0..cases {
        let (name, x, opts) = case(seed);
        let p = Problem::from_inputs(&x, &opts).unwrap();
        if !fused::supported(&dev, &p, &opts) {
            eprintln!("not fused (stage path): {name}");
            continue;
        }
        fused_runs += 1;
        let si = upload_inputs(dev.as_ref(), &p, &x, &opts).unwrap();
        let s = chunk_forward(dev.as_ref(), &p, &opts, &si).unwrap();
        let so = dev.download(&s.o).unwrap();
        let sf = dev.download(&s.final_state).unwrap();
        let sh = s.h.as_ref().map(|h| dev.download(h).unwrap());
        let (so64, sf64) = (to64(&so), to64(&sf));
        let sh64 = sh.as_ref().map(|h| to64(h));
        // Every kernel variant, on f32 device inputs (the Backend path) and on inputs resident
        // in their own dtype, against the stage path.
        for tuning in tunings() {
            let f = fused::forward_bufs_tuned(&dev, &p, &opts, &si, &tuning).unwrap();
            let mut r = fused::Resident::new(dev.clone(), &x, &opts).unwrap();
            r.tuning = tuning;
            r.run().unwrap();
            let (ro, rf, rh) = r.outputs().unwrap();
            let runs = [
                (
                    "f32 on device",
                    dev.download(&f.o).unwrap(),
                    dev.download(&f.final_state).unwrap(),
                    f.h.as_ref().map(|h| dev.download(h).unwrap()),
                ),
                ("own dtype", ro, rf, rh),
            ];
            for (what, fo, ff, fh) in runs {
                assert!(
                    fo.iter().all(|a| a.is_finite()),
                    "{name} {tuning:?} {what}: non-finite o"
                );
                let e_o = rel_l2(&fo, &so64);
                let e_f = rel_l2(&ff, &sf64);
                let e_h = match (&fh, &sh64) {
                    (Some(a), Some(b)) => rel_l2(a, b),
                    _ => 0.0,
                };
                for (w, e) in worst.iter_mut().zip([e_o, e_f, e_h]) {
                    *w = w.max(if e.is_nan() { f64::INFINITY } else { e });
                }
                assert!(
                    e_o <= 1e-5 && e_f <= 1e-5 && e_h <= 1e-5,
                    "{name} {tuning:?} {what}: fused vs stages o {e_o:.2e} final {e_f:.2e} \
                     chunk states {e_h:.2e}"
                );
            }
        }
        // The whole front door (uploads, fused forward, layouts) against float64.
        let out = forward(&device, &x, &opts).unwrap();
        let rf = reference(&x, &opts).unwrap();
        let e_ref = rel_l2(&out.o.to_f32(), &rf.o).max(rel_l2(
            &out.final_state.as_ref().unwrap().to_f32(),
            &rf.final_state,
        ));
        worst[3] = worst[3].max(if e_ref.is_nan() { f64::INFINITY } else { e_ref });
        assert!(
            e_ref <= 1e-5,
            "{name}: fused (own dtype) vs float64 {e_ref:.2e}"
        );
    }
    eprintln!(
        "{fused_runs} fused cases on {}: worst relative L2 fused vs stages o {:.2e} final state \
         {:.2e} chunk states {:.2e}; fused vs float64 {:.2e}",
        dev.name(),
        worst[0],
        worst[1],
        worst[2],
        worst[3]
    );
    assert!(fused_runs > cases / 2, "too few cases took the fused path");
}

/// Device time of the fused forward with inputs resident in their own dtype (what `bench`
/// cannot show: its inputs are f32 on the device). Shapes from DELTANET_FUSED_TIME
/// ("B,T,H,HV,K,V;..."), bf16 inputs, 2 warm-up and 20 timed runs, medians printed.
#[test]
#[ignore = "timing; run with --ignored on a GPU"]
fn fused_time_resident_bf16() {
    let Some(dev) = gpu() else { return };
    let shapes = std::env::var("DELTANET_FUSED_TIME").unwrap_or("1,32768,16,32,128,128".into());
    for s in shapes.split(';') {
        let d: Vec<usize> = s.split(',').map(|x| x.trim().parse().unwrap()).collect();
        let mut rng = Rng::new(1);
        let x = deltanet::selftest::layer_inputs(
            &mut rng,
            [d[0], d[1], d[2], d[3], d[4], d[5]],
            DType::BF16,
            false,
        )
        .unwrap();
        let opts = Options {
            output_final_state: true,
            ..Options::default()
        };
        let mut r = fused::Resident::new(dev.clone(), &x, &opts).unwrap();
        for _ in 0..2 {
            r.run().unwrap();
        }
        let mut t: Vec<f64> = (0..20).map(|_| r.time_ms().unwrap()).collect();
        t.sort_by(f64::total_cmp);
        let (o, f, _) = r.outputs().unwrap();
        assert!(o.iter().all(|a| a.is_finite()));
        // The same problem through the other recurrent kernel: at these sizes the float64
        // oracle is too slow, but the two kernels' products are independent roundings.
        let mut other = fused::Resident::new(dev.clone(), &x, &opts).unwrap();
        other.tuning = fused::Tuning {
            regs: Some(r.tuning.regs == Some(false)),
            ..fused::Tuning::default()
        };
        other.run().unwrap();
        let (o2, f2, _) = other.outputs().unwrap();
        let (e_o, e_f) = (rel_l2(&o, &to64(&o2)), rel_l2(&f, &to64(&f2)));
        println!(
            "fused resident bf16 {s} {:?}: median {:.3} ms (min {:.3}, max {:.3}) on {}; \
             vs the other recurrent kernel: o {e_o:.2e}, final state {e_f:.2e}",
            r.tuning,
            t[t.len() / 2],
            t[0],
            t[t.len() - 1],
            dev.name()
        );
        // Exact kernels agree to f32 rounding; the fast precision (fewer pieces) is only
        // reported here (its error against float64 is checked by the selftest and its own test).
        if r.tuning.pieces.unwrap_or(3) == 3 {
            assert!(e_o <= 1e-5 && e_f <= 1e-5);
        }
    }
}

/// A NaN or an infinity in k, v, g or beta at token t of a (sequence, value head) leaves the
/// earlier tokens of it, and every other (sequence, value head), as the clean run computes them
/// (what `forward` promises); a non-finite q reaches its own output row only; a g of -infinity
/// is a hard reset, everything finite and equal to float64.
#[test]
fn fused_keeps_non_finite_inputs_causal_or_skip_without_gpu() {
    let Some(dev) = gpu() else { return };
    let device = Device::Cuda(dev.clone());
    let cases = case_count(40);
    let mut rng = Rng::new(0x0bad);
    let (mut checked, mut worst) = (0, 0f64);
    for seed in 0..cases {
        let (name, x, opts) = case(seed);
        let p = Problem::from_inputs(&x, &opts).unwrap();
        if !fused::supported(&dev, &p, &opts) || p.tokens() == 0 {
            continue;
        }
        let (hv, dv) = (p.v_heads(), p.dv());
        let clean = forward(&device, &x, &opts).unwrap().o.to_f32().into_owned();
        let poisons = [
            ("k", f32::NAN),
            ("k", f32::INFINITY),
            ("v", f32::NAN),
            ("v", f32::NEG_INFINITY),
            ("g", f32::NAN),
            ("g", f32::INFINITY),
            ("beta", f32::INFINITY),
            ("beta", f32::NAN),
            ("q", f32::NAN),
            ("g", f32::NEG_INFINITY),
        ];
        for (tensor, value) in poisons {
            let t = rng.int(0, p.tokens() - 1);
            let mut y = x.clone();
            let target = match tensor {
                "q" => &mut y.q,
                "k" => &mut y.k,
                "v" => &mut y.v,
                "g" => &mut y.g,
                _ => &mut y.beta,
            };
            let width = target.numel() / p.tokens();
            // One head's row (q, k: a q/k head; v, g, beta: a value head), all of it for v.
            let heads = target.shape()[2];
            let head = rng.int(0, heads - 1);
            let row = width / heads;
            let mut d = target.to_f32().into_owned();
            d[t * width + head * row..][..row].fill(value);
            *target = Tensor::cast_from_f32(&d, target.shape().to_vec(), target.dtype()).unwrap();
            let got = forward(&device, &y, &opts).unwrap().o.to_f32().into_owned();
            let what = format!("{name}: {tensor} = {value} at token {t}, head {head}");
            if tensor == "g" && value == f32::NEG_INFINITY && !opts.gate_in_kernel {
                let want = reference(&y, &opts).unwrap();
                let e = rel_l2(&got, &want.o);
                assert!(e <= 1e-5, "{what}: a reset, vs float64 {e:.2e}");
                continue;
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for &(s0, s1) in p.seqs() {
                for j in 0..hv {
                    let hit = match tensor {
                        "q" | "k" => p.qk_head(j) == head,
                        _ => j == head,
                    };
                    for tok in s0..s1 {
                        let affected = hit
                            && (s0..s1).contains(&t)
                            && if tensor == "q" { tok == t } else { tok >= t };
                        if !affected {
                            let at = (tok * hv + j) * dv;
                            a.extend_from_slice(&got[at..at + dv]);
                            b.extend(clean[at..at + dv].iter().map(|&v| v as f64));
                        }
                    }
                }
            }
            assert!(
                a.iter().all(|v| v.is_finite()),
                "{what}: an unaffected output is not finite"
            );
            let e = rel_l2(&a, &b);
            worst = worst.max(e);
            assert!(e <= 1e-6, "{what}: unaffected outputs changed ({e:.2e})");
            checked += 1;
        }
    }
    eprintln!("{checked} poisoned runs; worst change of unaffected outputs {worst:.2e}");
    assert!(checked >= 2 * cases, "only {checked} poisoned runs");
}

/// The fast precision (bf16 operands, f32 accumulation) on random bf16 problems of every
/// option: finite wherever the exact path is, and near FLA's error against float64 (the shared
/// vectors hold FLA's output: about 3e-3 relative L2 for bf16 inputs); the exact path on
/// the same inputs stays within 1e-5.
#[test]
fn fused_fast_precision_within_fla_error_or_skip_without_gpu() {
    let Some(dev) = gpu() else { return };
    let device = Device::Cuda(dev.clone());
    let cases = case_count(30);
    let (mut runs, mut worst_fast, mut worst_exact) = (0, 0f64, 0f64);
    for seed in 0..cases {
        let mut r = Rng::new(0xfa57 + seed);
        let mut spec = Spec::random(&mut r);
        spec.dtype = DType::BF16;
        spec.k = pick(&mut r, &[64, 128]);
        spec.v = pick(&mut r, &[32, 64, 128]);
        spec.chunk_size = 64;
        spec.t = r.int(1, 300);
        let c = spec.build().unwrap();
        let rf = reference(&c.inputs, &c.opts).unwrap();
        for precision in [deltanet::Precision::Fast, deltanet::Precision::Exact] {
            let opts = Options {
                precision,
                ..c.opts.clone()
            };
            let out = forward(&device, &c.inputs, &opts).unwrap();
            let o = out.o.to_f32();
            assert!(o.iter().all(|a| a.is_finite()), "{}: non-finite o", c.name);
            let e = rel_l2(&o, &rf.o).max(rel_l2(
                &out.final_state.as_ref().unwrap().to_f32(),
                &rf.final_state,
            ));
            if precision == deltanet::Precision::Fast {
                worst_fast = worst_fast.max(e);
                // FLA's bf16 error on the shared vectors is 3e-3 (not measured on these
                // inputs); seen here at most 3.03e-3.
                assert!(e <= 4e-3, "{}: fast vs float64 {e:.2e}", c.name);
            } else {
                worst_exact = worst_exact.max(e);
                assert!(e <= 1e-5, "{}: exact vs float64 {e:.2e}", c.name);
            }
        }
        runs += 1;
    }
    eprintln!(
        "{runs} bf16 cases on {}: worst relative L2 against float64, fast {worst_fast:.2e}, \
         exact {worst_exact:.2e}",
        dev.name()
    );
}

/// The fused prefill kernels' CUDA source (chunk_intra, then chunk_recurrent_regs plain, split and
/// on warpgroup products) run on the CPU with lanes as threads (dev/fused_emulate.py) against a
/// float64 recurrence: a check that needs no GPU.
#[test]
fn fused_kernel_source_runs_correctly_under_host_emulation() {
    common::host_emulation_passes("fused_emulate.py", 18);
}

/// p formed in the recurrent kernel (`P_IN_REC`) under the host emulation, with one warpgroup and
/// with two, in the fast precision's one bf16 piece (the bound then FLA's) and in three.
#[test]
fn fused_p_in_recurrent_kernel_runs_correctly_under_host_emulation() {
    for pieces in ["1", "3"] {
        common::host_emulation_passes_with(
            "fused_emulate.py",
            36,
            &[
                ("EMU_PINREC", "1"),
                ("EMU_PIECES", pieces),
                ("EMU_CONFS", "15,17"),
            ],
        );
    }
}
