//! The CUDA backend. The NVRTC test compiles every kernel source without a GPU (it fails in CI,
//! where NVRTC is installed, if the library cannot be loaded); the GPU tests compare every stage
//! with the CPU backend and the forward and recurrent step with the float64 oracle, and skip,
//! saying so in their names and in `cargo test`'s output, where no GPU can be used.

use deltanet::cuda::registry;

/// Says a test is skipped, why and which, past the test harness's output capture (one write to
/// the process's stderr), so that a skip shows in plain `cargo test` output.
fn say_skipped(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("").to_string();
    let line = format!("skipped: {why} [{test}]\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

#[test]
fn kernels_compile_with_nvrtc() {
    if !registry::nvrtc_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but libnvrtc cannot be loaded: install nvidia-cuda-nvrtc"
        );
        say_skipped("libnvrtc cannot be loaded on this machine");
        return;
    }
    for arch in ["sm_90", "sm_80"] {
        match registry::compile_all(arch) {
            Ok(n) => eprintln!("{arch}: {n} modules compiled"),
            Err(e) => panic!("{e}"),
        }
    }
}

mod common;

use std::sync::{Arc, OnceLock};

use common::{make, unit_rows, Rng};
use deltanet::cpu::Cpu;
use deltanet::cuda::CudaDevice;
use deltanet::reference::{reference, rel_l2, widen};
use deltanet::selftest::{token_range, Case, Spec};
use deltanet::{
    activate, forward, recurrent_step, upload_inputs, Backend, DType, Device, HostIo, Inputs,
    Options, Problem, Tensor, CHUNK_SIZES,
};

/// The GPU shared by the tests, or why none can be used.
fn gpu() -> Result<Arc<CudaDevice>, String> {
    static DEV: OnceLock<Result<Arc<CudaDevice>, String>> = OnceLock::new();
    DEV.get_or_init(|| match CudaDevice::new(0) {
        Ok(d) => {
            eprintln!("GPU tests run on {}", d.name());
            Ok(Arc::new(d))
        }
        Err(e) => Err(e.to_string()),
    })
    .clone()
}

/// The GPU, or returns from the test after saying `skipped: no GPU (why)`.
macro_rules! gpu_or_skip {
    () => {
        match gpu() {
            Ok(d) => d,
            Err(e) => {
                say_skipped(&format!("no GPU ({e})"));
                return;
            }
        }
    };
}

/// A random problem with random options: the library's generator, as `deltanet selftest` draws
/// them.
fn random_case(seed: u64) -> Case {
    let mut c = Spec::random(&mut Rng::new(seed)).build().unwrap();
    c.name = format!("seed {seed}: {}", c.name);
    c
}

/// GPU result against the CPU's, by relative L2 error; non-finite values (a gate of -inf) must
/// be equal and are left out of the error.
fn close(label: &str, what: &str, gpu: &[f32], cpu: &[f32], tol: f64) {
    assert_eq!(gpu.len(), cpu.len(), "{label}: {what}: length");
    let (mut g, mut c) = (gpu.to_vec(), cpu.to_vec());
    for (i, (x, y)) in g.iter_mut().zip(c.iter_mut()).enumerate() {
        if !y.is_finite() {
            assert_eq!(*x, *y, "{label}: {what}: element {i}");
            (*x, *y) = (0.0, 0.0);
        }
    }
    let e = rel_l2(&g, &widen(&c));
    assert!(e <= tol, "{label}: {what}: rel L2 {e:e} > {tol:e}");
}

/// Entries of a `[B, T, HV, BT]` block matrix that must be exactly zero: above the diagonal
/// (on it too for `A_strict`), past a short chunk, and across a hard reset (different `seg`).
fn structural_zeros(label: &str, what: &str, p: &Problem, seg: &[f32], x: &[f32], strict: bool) {
    let (hv, bt) = (p.v_heads(), p.chunk_size());
    for c in p.chunks() {
        for i in 0..c.len {
            for j in 0..hv {
                let ti = (c.start + i) * hv + j;
                for col in 0..bt {
                    let zero = col > i
                        || (strict && col == i)
                        || col >= c.len
                        || seg[ti] != seg[(c.start + col) * hv + j];
                    let v = x[ti * bt + col];
                    assert!(
                        !zero || v == 0.0,
                        "{label}: {what}: {v} at token {} head {j} column {col}",
                        c.start + i
                    );
                }
            }
        }
    }
}

const STAGE_TOL: f64 = 1e-5;

/// Every stage on the GPU against the same stage on the CPU, each fed the CPU's inputs.
fn check_stages(dev: &CudaDevice, c: &Case) {
    let (x, opts, label) = (&c.inputs, &c.opts, c.name.as_str());
    let p = Problem::from_inputs(x, opts).unwrap();
    let cpu = Cpu;
    let up = |v: &Vec<f32>| dev.upload(v).unwrap();
    let down = |b: &<CudaDevice as Backend>::Buf| dev.download(b).unwrap();
    let cx = upload_inputs(&cpu, &p, x, opts).unwrap();
    let gx = upload_inputs(dev, &p, x, opts).unwrap();
    let ca = activate(&cpu, &p, opts, &cx).unwrap();
    let ga = activate(dev, &p, opts, &gx).unwrap();
    close(label, "l2norm q", &down(ga.q()), ca.q(), STAGE_TOL);
    close(label, "l2norm k", &down(ga.k()), ca.k(), STAGE_TOL);
    close(label, "gate g", &down(&ga.g), &ca.g, STAGE_TOL);
    close(label, "gate beta", &down(&ga.beta), &ca.beta, STAGE_TOL);
    // From here each stage gets the CPU's inputs, so each is judged on its own.
    let (k, v, beta, g) = (up(ca.k()), up(&cx.v), up(&ca.beta), up(&ca.g));
    let cg = cpu.chunk_local_cumsum(&p, &ca.g).unwrap();
    let gg = dev.chunk_local_cumsum(&p, &g).unwrap();
    close(label, "gamma", &down(&gg.gamma), &cg.gamma, STAGE_TOL);
    assert_eq!(down(&gg.seg), cg.seg, "{label}: seg");
    // The same f32 additions in the same order: the error terms agree bit for bit.
    assert_eq!(down(&gg.lo), cg.lo, "{label}: lo");
    let gamma = deltanet::Gamma {
        gamma: up(&cg.gamma),
        lo: up(&cg.lo),
        seg: up(&cg.seg),
    };
    let c_a = cpu.chunk_scaled_dot_kkt(&p, ca.k(), &ca.beta, &cg).unwrap();
    let g_a = down(&dev.chunk_scaled_dot_kkt(&p, &k, &beta, &gamma).unwrap());
    close(label, "A_strict", &g_a, &c_a, STAGE_TOL);
    structural_zeros(label, "A_strict", &p, &cg.seg, &g_a, true);
    let c_inv = cpu.solve_tril(&p, &c_a).unwrap();
    let g_inv = down(&dev.solve_tril(&p, &up(&c_a)).unwrap());
    close(label, "A_inv", &g_inv, &c_inv, STAGE_TOL);
    structural_zeros(label, "A_inv", &p, &cg.seg, &g_inv, false);
    let c_wy = cpu
        .recompute_w_u(&p, ca.k(), &cx.v, &ca.beta, &cg, &c_inv)
        .unwrap();
    let g_wy = dev
        .recompute_w_u(&p, &k, &v, &beta, &gamma, &up(&c_inv))
        .unwrap();
    close(label, "w", &down(&g_wy.w), &c_wy.w, STAGE_TOL);
    close(label, "u", &down(&g_wy.u), &c_wy.u, STAGE_TOL);
    let wy = deltanet::Wy {
        w: up(&c_wy.w),
        u: up(&c_wy.u),
    };
    let c_st = cpu
        .chunk_state(&p, ca.k(), &c_wy, &cg, cx.h0.as_ref())
        .unwrap();
    let g_h0 = cx.h0.as_ref().map(up);
    let g_st = dev.chunk_state(&p, &k, &wy, &gamma, g_h0.as_ref()).unwrap();
    close(label, "h", &down(&g_st.h), &c_st.h, STAGE_TOL);
    close(label, "v_new", &down(&g_st.v_new), &c_st.v_new, STAGE_TOL);
    close(
        label,
        "final_state",
        &down(&g_st.final_state),
        &c_st.final_state,
        STAGE_TOL,
    );
    let scale = opts.scale_for(p.dk());
    let c_o = cpu
        .chunk_output(&p, ca.q(), ca.k(), &c_st.v_new, &c_st.h, &cg, scale)
        .unwrap();
    let g_o = dev
        .chunk_output(
            &p,
            &up(ca.q()),
            &k,
            &up(&c_st.v_new),
            &up(&c_st.h),
            &gamma,
            scale,
        )
        .unwrap();
    close(label, "o", &down(&g_o), &c_o, STAGE_TOL);
    // The recurrent stage, both state layouts, from a random state.
    let n_state = p.num_seqs() * p.v_heads() * p.state_len();
    let state0 = Rng::new(7).normal(n_state, 0.5);
    for v_first in [false, true] {
        let mut c_s = state0.clone();
        let c_ro = cpu
            .recurrent(
                &p,
                ca.q(),
                ca.k(),
                &cx.v,
                &ca.g,
                &ca.beta,
                &mut c_s,
                v_first,
                scale,
            )
            .unwrap();
        let mut g_s = up(&state0);
        let g_ro = dev
            .recurrent(&p, &up(ca.q()), &k, &v, &g, &beta, &mut g_s, v_first, scale)
            .unwrap();
        close(label, "recurrent o", &down(&g_ro), &c_ro, 1e-4);
        close(label, "recurrent state", &down(&g_s), &c_s, 1e-4);
    }
}

fn cases() -> usize {
    std::env::var("DELTANET_GPU_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

#[test]
fn gpu_stages_match_cpu_skips_without_gpu() {
    let dev = gpu_or_skip!();
    for seed in 0..cases() as u64 {
        check_stages(&dev, &random_case(seed));
    }
}

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F32 {
        1e-4
    } else {
        5e-3
    }
}

#[test]
fn gpu_forward_matches_oracle_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    // Largest errors seen, (vs oracle, vs CPU), for f32 and for bf16/f16 inputs.
    let mut worst = [(0f64, 0f64); 2];
    for seed in 1000..1000 + cases() as u64 {
        let c = random_case(seed);
        let r = reference(&c.inputs, &c.opts).unwrap();
        let out = forward(&device, &c.inputs, &c.opts).unwrap();
        let t = tol(c.inputs.q.dtype());
        let eo = rel_l2(&out.o.to_f32(), &r.o);
        let es = rel_l2(&out.final_state.as_ref().unwrap().to_f32(), &r.final_state);
        assert!(eo <= t && es <= t, "{}: o {eo:e} state {es:e}", c.name);
        worst[usize::from(c.inputs.q.dtype() != DType::F32)].0 = worst
            [usize::from(c.inputs.q.dtype() != DType::F32)]
        .0
        .max(eo.max(es));
        let cpu = forward(&Device::Cpu, &c.inputs, &c.opts).unwrap();
        let ec = rel_l2(&out.o.to_f32(), &widen(&cpu.o.to_f32()));
        assert!(ec <= t, "{}: GPU vs CPU o {ec:e}", c.name);
        worst[usize::from(c.inputs.q.dtype() != DType::F32)].1 = worst
            [usize::from(c.inputs.q.dtype() != DType::F32)]
        .1
        .max(ec);
        // Twice: bitwise the same.
        let again = forward(&device, &c.inputs, &c.opts).unwrap();
        assert_eq!(
            out.o.as_bytes(),
            again.o.as_bytes(),
            "{}: two runs differ (o)",
            c.name
        );
        assert_eq!(
            out.final_state.as_ref().map(|s| s.as_bytes()),
            again.final_state.as_ref().map(|s| s.as_bytes()),
            "{}: two runs differ (final_state)",
            c.name
        );
    }
    eprintln!(
        "forward, largest rel L2 (vs oracle, vs CPU): f32 {:?}, bf16/f16 {:?}",
        worst[0], worst[1]
    );
}

#[test]
fn gpu_recurrent_matches_oracle_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    for seed in 2000..2000 + cases() as u64 {
        let mut c = random_case(seed);
        let Some(h0) = c.inputs.initial_state.take() else {
            continue;
        };
        let r = {
            let mut x = c.inputs.clone();
            x.initial_state = Some(h0.clone());
            reference(&x, &c.opts).unwrap()
        };
        let mut state = h0.to_f32().into_owned();
        let o = recurrent_step(&device, &c.inputs, &mut state, &c.opts).unwrap();
        let t = tol(c.inputs.q.dtype());
        let eo = rel_l2(&o.to_f32(), &r.o);
        let es = rel_l2(&state, &r.final_state);
        assert!(eo <= t && es <= t, "{}: o {eo:e} state {es:e}", c.name);
    }
}

#[test]
fn gpu_forward_matches_vectors_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    // The vectors may be copied elsewhere (the GPU machine has no ../shared).
    let dir = std::env::var_os("DELTANET_VECTORS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(common::vectors_dir);
    let paths = match deltanet::selftest::vector_files(&dir) {
        Ok(p) => p,
        Err(e) => {
            // Asked for by path, they must be there.
            assert!(
                std::env::var_os("DELTANET_VECTORS").is_none(),
                "no conformance vectors at {dir:?}: {e}"
            );
            say_skipped(&format!("no conformance vectors at {dir:?} ({e})"));
            return;
        }
    };
    for case in paths.iter().map(|p| common::load_case(p)) {
        for chunk_size in CHUNK_SIZES {
            let opts = Options {
                chunk_size,
                ..case.opts.clone()
            };
            let out = forward(&device, &case.inputs, &opts).unwrap();
            let eo = rel_l2(&out.o.to_f32(), &case.o_ref);
            let es = rel_l2(&out.final_state.unwrap().to_f32(), &case.final_state_ref);
            let t = tol(case.inputs.q.dtype());
            assert!(
                eo <= t && es <= t,
                "{} BT={chunk_size}: o {eo:e} state {es:e}",
                case.name
            );
            eprintln!("{} BT={chunk_size}: o {eo:.2e} state {es:.2e}", case.name);
        }
    }
}

/// More sequences and chunks than a grid's y or z dimension could count (65535).
#[test]
fn gpu_many_sequences_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    let mut r = Rng::new(99);
    let n = 70_000;
    let mut cu = vec![0i64];
    for i in 0..n {
        cu.push(cu[i] + r.int(0, 3) as i64);
    }
    let t = *cu.last().unwrap() as usize;
    let (h, hv, dk, dv) = (1, 2, 8, 4);
    let x = Inputs {
        q: Tensor::from_f32(unit_rows(r.normal(t * h * dk, 1.0), dk), vec![1, t, h, dk]).unwrap(),
        k: Tensor::from_f32(unit_rows(r.normal(t * h * dk, 1.0), dk), vec![1, t, h, dk]).unwrap(),
        v: Tensor::from_f32(r.normal(t * hv * dv, 1.0), vec![1, t, hv, dv]).unwrap(),
        g: Tensor::from_f32(vec![-0.1; t * hv], vec![1, t, hv]).unwrap(),
        beta: Tensor::from_f32(vec![0.5; t * hv], vec![1, t, hv]).unwrap(),
        initial_state: Some(
            Tensor::from_f32(r.normal(n * hv * dk * dv, 0.5), vec![n, hv, dk, dv]).unwrap(),
        ),
        cu_seqlens: Some(cu),
        a_log: None,
        dt_bias: None,
    };
    for chunk_size in [16, 64] {
        let opts = Options {
            chunk_size,
            out_dtype: Some(DType::F32),
            ..Options::default()
        };
        let rf = reference(&x, &opts).unwrap();
        let out = forward(&device, &x, &opts).unwrap();
        let eo = rel_l2(&out.o.to_f32(), &rf.o);
        let es = rel_l2(&out.final_state.unwrap().to_f32(), &rf.final_state);
        assert!(eo <= 1e-4 && es <= 1e-4, "forward: o {eo:e} state {es:e}");
        let mut x1 = x.clone();
        let h0 = x1.initial_state.take().unwrap();
        let mut state = h0.to_f32().into_owned();
        let o = recurrent_step(&device, &x1, &mut state, &opts).unwrap();
        let eo = rel_l2(&o.to_f32(), &rf.o);
        let es = rel_l2(&state, &rf.final_state);
        assert!(eo <= 1e-4 && es <= 1e-4, "recurrent: o {eo:e} state {es:e}");
    }
}

/// Inputs like the anchors': q, v ~ N(0, 1), k unit rows, in `dtype`; g = logsigmoid(U(0, 1)),
/// beta = sigmoid(U(0, 1)), f32.
fn bench_inputs(seed: u64, [b, t, h, hv, dk, dv]: [usize; 6], dtype: DType) -> Inputs<'static> {
    let mut r = Rng::new(seed);
    let n = b * t * hv;
    let g = (0..n).map(|_| -(1.0 + (-r.uniform()).exp()).ln()).collect();
    let beta = (0..n).map(|_| 1.0 / (1.0 + (-r.uniform()).exp())).collect();
    Inputs::new(
        make(r.normal(b * t * h * dk, 1.0), vec![b, t, h, dk], dtype),
        make(
            unit_rows(r.normal(b * t * h * dk, 1.0), dk),
            vec![b, t, h, dk],
            dtype,
        ),
        make(r.normal(b * t * hv * dv, 1.0), vec![b, t, hv, dv], dtype),
        Tensor::from_f32(g, vec![b, t, hv]).unwrap(),
        Tensor::from_f32(beta, vec![b, t, hv]).unwrap(),
    )
}

/// Tokens `t0..t1` of a B = 1 input, with an initial state.
fn token_slice(
    x: &Inputs<'_>,
    t0: usize,
    t1: usize,
    h0: Option<Tensor<'static>>,
) -> Inputs<'static> {
    Inputs {
        initial_state: h0,
        ..token_range(x, t0, t1).unwrap()
    }
}

/// The bar's large forward (B=1, T=65536, H=16, HV=32, K=V=128, bf16): its head and its tail
/// checked against the CPU backend, the tail started from the GPU's own chunk state there.
#[test]
fn gpu_prefill_65536_bf16_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    let (t, h, hv, dk, dv) = (65536, 16, 32, 128, 128);
    let x = bench_inputs(5, [1, t, h, hv, dk, dv], DType::BF16);
    let opts = Options {
        out_dtype: Some(DType::F32),
        output_chunk_states: true,
        ..Options::default()
    };
    let start = std::time::Instant::now();
    let out = forward(&device, &x, &opts).unwrap();
    eprintln!(
        "T=65536 forward incl. transfers: {:.0} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    let o = out.o.to_f32();
    let hs = out.chunk_states.unwrap().to_f32().into_owned();
    let fin = out.final_state.unwrap().to_f32().into_owned();
    let (row, kv) = (hv * dv, hv * dk * dv);
    let span = 2048;
    // Head: tokens 0..span from a zero state; the GPU's state entering chunk span/64 is the
    // CPU's final state.
    let cpu = forward(&Device::Cpu, &token_slice(&x, 0, span, None), &opts).unwrap();
    let eo = rel_l2(&o[..span * row], &widen(&cpu.o.to_f32()));
    let ci = span / 64;
    let es = rel_l2(
        &hs[ci * kv..(ci + 1) * kv],
        &widen(&cpu.final_state.unwrap().to_f32()),
    );
    eprintln!("T=65536 head: o {eo:.2e} state {es:.2e}");
    assert!(eo <= 1e-4 && es <= 1e-4);
    // Tail: tokens t-span..t from the GPU's state entering that chunk.
    let ci = (t - span) / 64;
    let h0 = Tensor::from_f32(hs[ci * kv..(ci + 1) * kv].to_vec(), vec![1, hv, dk, dv]).unwrap();
    let cpu = forward(&Device::Cpu, &token_slice(&x, t - span, t, Some(h0)), &opts).unwrap();
    let eo = rel_l2(&o[(t - span) * row..], &widen(&cpu.o.to_f32()));
    let es = rel_l2(&fin, &widen(&cpu.final_state.unwrap().to_f32()));
    eprintln!("T=65536 tail: o {eo:.2e} final state {es:.2e}");
    assert!(eo <= 1e-4 && es <= 1e-4);
}

/// The bar's decode step (N=256, HV=32, H=16, K=V=128, bf16), against the CPU backend.
#[test]
fn gpu_decode_256_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let device = Device::Cuda(dev);
    let (n, h, hv, dk, dv) = (256, 16, 32, 128, 128);
    let x = bench_inputs(6, [n, 1, h, hv, dk, dv], DType::BF16);
    let opts = Options {
        out_dtype: Some(DType::F32),
        ..Options::default()
    };
    let s0 = Rng::new(8).normal(n * hv * dk * dv, 0.5);
    for v_first in [false, true] {
        let opts = Options {
            state_v_first: v_first,
            ..opts.clone()
        };
        let (mut sg, mut sc) = (s0.clone(), s0.clone());
        let og = recurrent_step(&device, &x, &mut sg, &opts).unwrap();
        let oc = recurrent_step(&Device::Cpu, &x, &mut sc, &opts).unwrap();
        let eo = rel_l2(&og.to_f32(), &widen(&oc.to_f32()));
        let es = rel_l2(&sg, &widen(&sc));
        eprintln!("decode N=256 v_first={v_first}: o {eo:.2e} state {es:.2e}");
        assert!(eo <= 1e-5 && es <= 1e-5);
    }
}

/// q, k and w hold more than 2^31 elements: the last sequence (the only one with data) is
/// checked against the CPU backend on that sequence alone.
#[test]
fn gpu_large_index_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let need = 48usize << 30;
    match dev.memory() {
        Ok((free, _)) if free >= need => {}
        other => {
            say_skipped(&format!(
                "needs {need} bytes of free GPU memory, have {other:?}"
            ));
            return;
        }
    }
    let device = Device::Cuda(dev);
    let (h, hv, dk, dv, tail) = (64, 64, 128, 2, 100);
    let t = 262_144 + tail;
    assert!(t * h * dk > 1 << 31);
    let small = bench_inputs(9, [1, tail, h, hv, dk, dv], DType::F32);
    let embed = |s: &Tensor<'_>, per: usize| {
        let mut full = vec![0f32; t * per];
        full[(t - tail) * per..].copy_from_slice(&s.to_f32());
        let mut shape = s.shape().to_vec();
        shape[1] = t;
        Tensor::from_f32(full, shape).unwrap()
    };
    let x = Inputs {
        q: embed(&small.q, h * dk),
        k: embed(&small.k, h * dk),
        v: embed(&small.v, hv * dv),
        g: embed(&small.g, hv),
        beta: embed(&small.beta, hv),
        initial_state: None,
        cu_seqlens: Some(vec![0, (t - tail) as i64, t as i64]),
        a_log: None,
        dt_bias: None,
    };
    let opts = Options {
        out_dtype: Some(DType::F32),
        ..Options::default()
    };
    let out = forward(&device, &x, &opts).unwrap();
    let cpu = forward(&Device::Cpu, &small, &opts).unwrap();
    let o = out.o.to_f32();
    let row = hv * dv;
    assert!(o[..(t - tail) * row].iter().all(|&v| v == 0.0));
    let eo = rel_l2(&o[(t - tail) * row..], &widen(&cpu.o.to_f32()));
    let fin = out.final_state.unwrap().to_f32().into_owned();
    let kv = hv * dk * dv;
    let es = rel_l2(&fin[kv..], &widen(&cpu.final_state.unwrap().to_f32()));
    eprintln!(
        "large index (q has {} elements): o {eo:.2e} state {es:.2e}",
        t * h * dk
    );
    assert!(eo <= 1e-4 && es <= 1e-4);
}

/// Median device time of each stage of the forward, each run on its own (10 runs).
fn stage_times(
    d: &CudaDevice,
    p: &Problem,
    opts: &Options,
    si: &deltanet::StageInputs<<CudaDevice as Backend>::Buf>,
) {
    let time = |name: &str, f: &mut dyn FnMut() -> deltanet::Result<()>| {
        let ms = median((0..10).map(|_| d.time_ms(f).unwrap()).collect());
        println!("  stage {name}: median {ms:.3} ms");
    };
    let a = activate(d, p, opts, si).unwrap();
    let (k, beta) = (a.k(), &a.beta);
    time("activate", &mut || activate(d, p, opts, si).map(|_| ()));
    let gamma = d.chunk_local_cumsum(p, &a.g).unwrap();
    time("chunk_local_cumsum", &mut || {
        d.chunk_local_cumsum(p, &a.g).map(|_| ())
    });
    let a_strict = d.chunk_scaled_dot_kkt(p, k, beta, &gamma).unwrap();
    time("chunk_scaled_dot_kkt", &mut || {
        d.chunk_scaled_dot_kkt(p, k, beta, &gamma).map(|_| ())
    });
    let a_inv = d.solve_tril(p, &a_strict).unwrap();
    time("solve_tril", &mut || d.solve_tril(p, &a_strict).map(|_| ()));
    let wy = d.recompute_w_u(p, k, &si.v, beta, &gamma, &a_inv).unwrap();
    time("recompute_w_u", &mut || {
        d.recompute_w_u(p, k, &si.v, beta, &gamma, &a_inv)
            .map(|_| ())
    });
    let st = d.chunk_state(p, k, &wy, &gamma, None).unwrap();
    time("chunk_state", &mut || {
        d.chunk_state(p, k, &wy, &gamma, None).map(|_| ())
    });
    let scale = opts.scale_for(p.dk());
    time("chunk_output", &mut || {
        d.chunk_output(p, a.q(), k, &st.v_new, &st.h, &gamma, scale)
            .map(|_| ())
    });
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median device time of `f` over 30 runs after 3 warm-ups.
fn median_of_30(d: &CudaDevice, f: &mut dyn FnMut() -> deltanet::Result<()>) -> f64 {
    for _ in 0..3 {
        d.time_ms(f).unwrap();
    }
    median((0..30).map(|_| d.time_ms(f).unwrap()).collect())
}

/// Median device times (CUDA events, 30 runs after 3 warm-ups) of the forward on the anchors'
/// shapes and of the decode step; inputs already on the device, as the anchors time them.
#[test]
#[ignore = "timing on a GPU; run with --ignored"]
fn bench_forward_and_decode() {
    let dev = gpu_or_skip!();
    let d = dev.as_ref();
    for t in [32768, 65536] {
        let (h, hv, dk, dv) = (16, 32, 128, 128);
        let x = bench_inputs(1, [1, t, h, hv, dk, dv], DType::BF16);
        let opts = Options::default();
        let p = Problem::from_inputs(&x, &opts).unwrap();
        let si = upload_inputs(d, &p, &x, &opts).unwrap();
        let ms = median_of_30(d, &mut || d.forward(&p, &opts, &si).map(|_| ()));
        println!(
            "forward B=1 T={t} H={h} HV={hv} K={dk} V={dv} bf16: median {ms:.3} ms ({:.2} Mtok/s)",
            t as f64 / ms / 1e3
        );
        stage_times(d, &p, &opts, &si);
    }
    let (n, h, hv, dk, dv) = (256, 16, 32, 128, 128);
    let x = bench_inputs(2, [n, 1, h, hv, dk, dv], DType::BF16);
    let opts = Options::default();
    let p = Problem::from_inputs(&x, &opts).unwrap();
    let si = upload_inputs(d, &p, &x, &opts).unwrap();
    let mut state = d
        .upload(&Rng::new(3).normal(n * hv * dk * dv, 0.5))
        .unwrap();
    let scale = opts.scale_for(dk);
    let ms = median_of_30(d, &mut || {
        let a = activate(d, &p, &opts, &si)?;
        d.recurrent(
            &p,
            a.q(),
            a.k(),
            &si.v,
            &a.g,
            &a.beta,
            &mut state,
            false,
            scale,
        )?;
        Ok(())
    });
    println!(
        "decode N={n} H={h} HV={hv} K={dk} V={dv}: median {ms:.3} ms ({:.2} TB/s of state read+written)",
        2.0 * (n * hv * dk * dv * 4) as f64 / ms / 1e9
    );
}

/// Runs without a GPU: every random case the GPU tests draw is a valid problem, so a GPU test
/// can fail only on the GPU's results.
#[test]
fn random_cases_are_valid_problems() {
    for seed in 0..cases() as u64 {
        let c = random_case(seed);
        if let Err(e) = Problem::from_inputs(&c.inputs, &c.opts) {
            panic!("{}: {e}", c.name);
        }
    }
}

/// bf16 and f16 inputs travel as 16 bits and are widened on the GPU: bit for bit what the host's
/// conversion gives, for every one of the 65536 patterns (zeros, subnormals, infinities, NaNs).
#[test]
fn gpu_widens_16_bit_inputs_exactly_skips_without_gpu() {
    let dev = gpu_or_skip!();
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    for dtype in [DType::BF16, DType::F16] {
        let t = deltanet::Tensor::from_bytes(dtype, bytemuck::cast_slice(&bits), vec![bits.len()])
            .unwrap();
        let got = dev.download(&dev.upload_tensor(&t).unwrap()).unwrap();
        let want = t.to_f32();
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            // NaN payloads may differ; NaN-ness may not.
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{dtype} {i:#06x}: {g} vs {w}"
            );
        }
    }
}
