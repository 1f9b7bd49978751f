//! The engine API on a GPU: the forward and the decode step queued on a stream the test owns,
//! over buffers it owns, captured in a CUDA graph and replayed; the replay must equal the
//! uncaptured run bit for bit, and both the CPU's answer within 1e-5 (relative L2). Every test
//! is named gpu_* and prints "skipped" where no GPU can be used.
//!
//! Self-contained (no tests/common), so the built binary can be carried to a GPU machine:
//! `cargo test --release --test engine --no-run` prints its path.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use deltanet::cuda::{
    CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, StepIo, TokenInputs, Workspace,
};
use deltanet::{
    forward, recurrent_step, DType, Data, Device, Dims, HeadMap, Inputs, Options, Problem, Tensor,
};

/// A stream of the test's own on GPU 0 and a device running on it, or `None` after saying why.
fn gpu() -> Option<(Arc<CudaStream>, Arc<CudaDevice>)> {
    if let Err(e) = CudaDevice::new(0) {
        eprintln!("skipped: no usable GPU ({e})");
        return None;
    }
    let ctx = CudaContext::new(0).expect("context");
    // One stream carries everything, as in an engine's decode loop: no per-buffer events, so
    // nothing captured waits on an event recorded outside the capture.
    // SAFETY: every buffer of this context object is used on `stream` only.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().expect("stream");
    let dev = Arc::new(CudaDevice::from_stream(stream.clone()).expect("device on the stream"));
    eprintln!("engine tests run on {}", dev.name());
    Some((stream, dev))
}

macro_rules! gpu_or_skip {
    () => {
        match gpu() {
            Some(x) => x,
            None => {
                eprintln!("skipped: no usable GPU");
                return;
            }
        }
    };
}

/// xorshift64*: the same numbers on every run.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi).
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| lo + (hi - lo) * self.unit()).collect()
    }
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in got.iter().zip(want) {
        num += (f64::from(a) - f64::from(b)).powi(2);
        den += f64::from(b).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A host tensor's elements on the device, as the engine would hold them.
enum Dev {
    F32(CudaSlice<f32>),
    Bits(CudaSlice<u16>, DType),
}

impl Dev {
    fn up(stream: &Arc<CudaStream>, t: &Tensor<'_>) -> Dev {
        match t.data() {
            Data::F32(d) => Dev::F32(stream.clone_htod(d.as_ref()).unwrap()),
            _ => {
                let bits: Vec<u16> = t
                    .as_bytes()
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                Dev::Bits(stream.clone_htod(&bits).unwrap(), t.dtype())
            }
        }
    }
    fn r(&self) -> DeviceRef<'_> {
        match self {
            Dev::F32(s) => DeviceRef::new(s, DType::F32).unwrap(),
            Dev::Bits(s, d) => DeviceRef::new(s, *d).unwrap(),
        }
    }
}

/// An output buffer of `len` elements of `dtype`.
enum Out {
    F32(CudaSlice<f32>),
    Bits(CudaSlice<u16>, DType),
}

impl Out {
    fn new(stream: &Arc<CudaStream>, len: usize, dtype: DType) -> Out {
        match dtype {
            DType::F32 => Out::F32(stream.alloc_zeros(len).unwrap()),
            d => Out::Bits(stream.alloc_zeros(len).unwrap(), d),
        }
    }
    fn w(&mut self) -> DeviceMut<'_> {
        match self {
            Out::F32(s) => DeviceMut::new(s, DType::F32).unwrap(),
            Out::Bits(s, d) => DeviceMut::new(s, *d).unwrap(),
        }
    }
    fn zero(&mut self, stream: &Arc<CudaStream>) {
        match self {
            Out::F32(s) => stream.memset_zeros(s).unwrap(),
            Out::Bits(s, _) => stream.memset_zeros(s).unwrap(),
        }
    }
    /// The raw bits, for bitwise comparison.
    fn bits(&self, stream: &Arc<CudaStream>) -> Vec<u32> {
        match self {
            Out::F32(s) => stream
                .clone_dtoh(s)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
            Out::Bits(s, _) => stream
                .clone_dtoh(s)
                .unwrap()
                .iter()
                .map(|&x| u32::from(x))
                .collect(),
        }
    }
    fn f32s(&self, stream: &Arc<CudaStream>) -> Vec<f32> {
        match self {
            Out::F32(s) => stream.clone_dtoh(s).unwrap(),
            Out::Bits(..) => panic!("an f32 output was expected"),
        }
    }
}

/// One problem: the host inputs of a prefill and of one decode token per sequence.
struct Case {
    name: &'static str,
    dims: Dims,
    cu_seqlens: Option<Vec<i64>>,
    opts: Options,
    dtype: DType,
    with_h0: bool,
}

struct Host {
    prefill: Inputs<'static>,
    decode: Inputs<'static>,
    /// Sequences.
    n: usize,
}

fn tensor(data: Vec<f32>, shape: Vec<usize>, dtype: DType) -> Tensor<'static> {
    Tensor::cast_from_f32(&data, shape, dtype).unwrap()
}

fn host_inputs(c: &Case, seed: u64) -> Host {
    let mut rng = Rng(seed);
    let d = c.dims;
    let (batch, seq_len, heads, v_heads) = (d.batch, d.seq_len, d.heads, d.v_heads);
    let (dk, dv) = (d.dk, d.dv);
    let n = c.cu_seqlens.as_ref().map_or(batch, |cu| cu.len() - 1);
    let o = &c.opts;
    let make = |rng: &mut Rng, b: usize, t: usize| {
        let qk = vec![b, t, heads, dk];
        let g = if o.gate_in_kernel {
            rng.vec(b * t * v_heads, -3.0, 2.0)
        } else {
            rng.vec(b * t * v_heads, -0.5, -0.02)
        };
        let beta = if o.beta_is_logits {
            rng.vec(b * t * v_heads, -3.0, 3.0)
        } else {
            rng.vec(b * t * v_heads, 0.05, 1.0)
        };
        let mut x = Inputs::new(
            tensor(rng.vec(b * t * heads * dk, -1.0, 1.0), qk.clone(), c.dtype),
            tensor(
                rng.vec(b * t * heads * dk, -1.0, 1.0)
                    .iter()
                    .map(|x| x / (dk as f32).sqrt())
                    .collect(),
                qk,
                c.dtype,
            ),
            tensor(
                rng.vec(b * t * v_heads * dv, -1.0, 1.0),
                vec![b, t, v_heads, dv],
                c.dtype,
            ),
            Tensor::from_f32(g, vec![b, t, v_heads]).unwrap(),
            Tensor::from_f32(beta, vec![b, t, v_heads]).unwrap(),
        );
        if o.gate_in_kernel {
            x.a_log = Some(Tensor::from_f32(rng.vec(v_heads, -1.0, 0.5), vec![v_heads]).unwrap());
            x.dt_bias = Some(Tensor::from_f32(rng.vec(v_heads, -0.5, 0.5), vec![v_heads]).unwrap());
        }
        x
    };
    let mut prefill = make(&mut rng, batch, seq_len);
    prefill.cu_seqlens = c.cu_seqlens.clone();
    if c.with_h0 {
        prefill.initial_state = Some(
            Tensor::from_f32(
                rng.vec(n * v_heads * dk * dv, -0.3, 0.3),
                vec![n, v_heads, dk, dv],
            )
            .unwrap(),
        );
    }
    let decode = make(&mut rng, n, 1);
    Host { prefill, decode, n }
}

/// The per-token inputs as the engine API takes them.
fn token_inputs<'a>(x: &'a [Dev; 5], gate: &'a Option<(Dev, Dev)>) -> TokenInputs<'a> {
    let [q, k, v, g, beta] = x;
    TokenInputs {
        a_log: gate.as_ref().map(|p| p.0.r()),
        dt_bias: gate.as_ref().map(|p| p.1.r()),
        ..TokenInputs::new(q.r(), k.r(), v.r(), g.r(), beta.r())
    }
}

/// Everything the engine owns for one case: inputs, outputs, workspaces and the two plans.
struct Engine {
    stream: Arc<CudaStream>,
    plan: Plan,
    step_plan: Plan,
    x: [Dev; 5],
    h0: Option<Dev>,
    gate_params: Option<(Dev, Dev)>,
    xs: [Dev; 5],
    step_gate_params: Option<(Dev, Dev)>,
    o: Out,
    final_state: Out,
    state: Out,
    o_step: Out,
    ws: CudaSlice<u8>,
    ws_step: CudaSlice<u8>,
}

impl Engine {
    fn new(stream: &Arc<CudaStream>, dev: &Arc<CudaDevice>, c: &Case, h: &Host) -> Engine {
        let p = Problem::from_inputs(&h.prefill, &c.opts).unwrap();
        let ps = Problem::from_inputs(&h.decode, &c.opts).unwrap();
        let plan = Plan::new(dev.clone(), &p, &c.opts, c.dtype).unwrap();
        let step_plan = Plan::new(dev.clone(), &ps, &c.opts, c.dtype).unwrap();
        let up = |t: &Tensor<'_>| Dev::up(stream, t);
        let five = |x: &Inputs<'_>| [up(&x.q), up(&x.k), up(&x.v), up(&x.g), up(&x.beta)];
        let gp = |x: &Inputs<'_>| {
            x.a_log
                .as_ref()
                .map(|a| (up(a), up(x.dt_bias.as_ref().unwrap())))
        };
        let out_dtype = c.opts.out_dtype.unwrap_or(c.dtype);
        let (hv, dk, dv) = (c.dims.v_heads, c.dims.dk, c.dims.dv);
        let states = h.n * hv * dk * dv;
        // Workspaces are filled with garbage: the engine must not rely on their contents.
        let garbage = |bytes: usize| stream.clone_htod(&vec![0xa5u8; bytes]).unwrap();
        Engine {
            stream: stream.clone(),
            x: five(&h.prefill),
            h0: h.prefill.initial_state.as_ref().map(up),
            gate_params: gp(&h.prefill),
            xs: five(&h.decode),
            step_gate_params: gp(&h.decode),
            o: Out::new(stream, p.tokens() * hv * dv, out_dtype),
            final_state: Out::new(stream, states, DType::F32),
            state: Out::new(stream, states, DType::F32),
            o_step: Out::new(stream, ps.tokens() * hv * dv, out_dtype),
            ws: garbage(plan.forward_workspace_bytes()),
            ws_step: garbage(step_plan.step_workspace_bytes()),
            plan,
            step_plan,
        }
    }

    /// The forward into `o` and `final_state`, with `ws` or the engine's own workspace.
    fn forward(&mut self, ws: Option<&mut CudaSlice<u8>>) -> deltanet::Result<()> {
        let io = ForwardIo {
            initial_state: self.h0.as_ref().map(Dev::r),
            ..ForwardIo::new(
                token_inputs(&self.x, &self.gate_params),
                self.o.w(),
                self.final_state.w(),
            )
        };
        let ws = ws.unwrap_or(&mut self.ws);
        self.plan.forward(io, Workspace::new(ws))
    }

    /// The forward, the final state copied into the decode state, one decode step: all queued
    /// on the stream, nothing waited for.
    fn queue(&mut self) -> deltanet::Result<()> {
        self.forward(None)?;
        let (Out::F32(fs), Out::F32(st)) = (&self.final_state, &mut self.state) else {
            unreachable!("states are f32")
        };
        self.stream.memcpy_dtod(fs, st).unwrap();
        let io = StepIo {
            inputs: token_inputs(&self.xs, &self.step_gate_params),
            state: self.state.w(),
            o: self.o_step.w(),
        };
        self.step_plan
            .recurrent_step(io, Workspace::new(&mut self.ws_step))
    }

    fn zero_outputs(&mut self) {
        let s = self.stream.clone();
        for out in [
            &mut self.o,
            &mut self.final_state,
            &mut self.state,
            &mut self.o_step,
        ] {
            out.zero(&s);
        }
    }

    /// o, final state, decode o, decode state, as bits.
    fn outputs(&self) -> [Vec<u32>; 4] {
        self.stream.synchronize().unwrap();
        [
            self.o.bits(&self.stream),
            self.final_state.bits(&self.stream),
            self.o_step.bits(&self.stream),
            self.state.bits(&self.stream),
        ]
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "f32, batch 2, initial state",
            dims: Dims {
                batch: 2,
                seq_len: 100,
                heads: 2,
                v_heads: 4,
                dk: 64,
                dv: 32,
            },
            cu_seqlens: None,
            opts: Options::default(),
            dtype: DType::F32,
            with_h0: true,
        },
        Case {
            name: "bf16 varlen with an empty sequence, every activation, tiled heads, BT 32",
            dims: Dims {
                batch: 1,
                seq_len: 150,
                heads: 2,
                v_heads: 6,
                dk: 48,
                dv: 40,
            },
            cu_seqlens: Some(vec![0, 37, 37, 150]),
            opts: Options {
                use_qk_l2norm: true,
                beta_is_logits: true,
                allow_neg_eigval: true,
                gate_in_kernel: true,
                chunk_size: 32,
                head_map: HeadMap::Tiled,
                out_dtype: Some(DType::F32),
                ..Options::default()
            },
            dtype: DType::BF16,
            with_h0: true,
        },
        Case {
            name: "f16, no initial state, BT 16",
            dims: Dims {
                batch: 3,
                seq_len: 40,
                heads: 1,
                v_heads: 2,
                dk: 128,
                dv: 128,
            },
            cu_seqlens: None,
            opts: Options {
                chunk_size: 16,
                out_dtype: Some(DType::F32),
                ..Options::default()
            },
            dtype: DType::F16,
            with_h0: false,
        },
        // The fused kernels (chunk size 64), which write a 16-bit o themselves: bf16 inputs take
        // chunk_recurrent_regs, f16 ones chunk_recurrent.
        Case {
            name: "bf16 fused, batch 2, l2norm, initial state",
            dims: Dims {
                batch: 2,
                seq_len: 130,
                heads: 2,
                v_heads: 4,
                dk: 64,
                dv: 64,
            },
            cu_seqlens: None,
            opts: Options {
                use_qk_l2norm: true,
                out_dtype: Some(DType::F32),
                ..Options::default()
            },
            dtype: DType::BF16,
            with_h0: true,
        },
        // Enough (sequence, value head) blocks for the plain recurrent kernel with 128-column
        // tiles (warpgroup products on Hopper; 16-bit o leaves through shared memory), a short
        // last chunk in each sequence.
        Case {
            name: "bf16 fused, 128 blocks of 128 columns",
            dims: Dims {
                batch: 4,
                seq_len: 130,
                heads: 16,
                v_heads: 32,
                dk: 128,
                dv: 128,
            },
            cu_seqlens: None,
            opts: Options {
                out_dtype: Some(DType::F32),
                ..Options::default()
            },
            dtype: DType::BF16,
            with_h0: true,
        },
        Case {
            name: "f16 fused, varlen",
            dims: Dims {
                batch: 1,
                seq_len: 200,
                heads: 1,
                v_heads: 2,
                dk: 32,
                dv: 48,
            },
            cu_seqlens: Some(vec![0, 70, 200]),
            opts: Options {
                out_dtype: Some(DType::F32),
                ..Options::default()
            },
            dtype: DType::F16,
            with_h0: false,
        },
    ]
}

/// The CPU's answer: prefill o and final state, decode o and state.
fn cpu_answer(c: &Case, h: &Host) -> [Vec<f32>; 4] {
    let opts = Options {
        out_dtype: Some(DType::F32),
        output_final_state: true,
        ..c.opts.clone()
    };
    let out = forward(&Device::Cpu, &h.prefill, &opts).unwrap();
    let mut state = out.final_state.unwrap().to_f32().into_owned();
    let final_state = state.clone();
    let o_step = recurrent_step(&Device::Cpu, &h.decode, &mut state, &opts).unwrap();
    [
        out.o.to_f32().into_owned(),
        final_state,
        o_step.to_f32().into_owned(),
        state,
    ]
}

const NAMES: [&str; 4] = ["o", "final_state", "decode o", "decode state"];

/// `e`'s calls captured in a graph on `stream`. Any call of this thread that a graph cannot hold
/// (an allocation, a host synchronisation, a synchronous copy, a module load) fails the
/// capture; thread-local mode keeps the other tests' threads, which allocate freely, out of it.
fn capture(stream: &Arc<CudaStream>, e: &mut Engine) -> cudarc::driver::CudaGraph {
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let queued = e.queue();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    queued.unwrap();
    graph.unwrap().expect("a graph with work in it")
}

/// `e`'s four outputs within 1e-5 (relative L2) of the CPU's answer to `c`.
fn assert_near_cpu(stream: &Arc<CudaStream>, c: &Case, h: &Host, e: &Engine) {
    let cpu = cpu_answer(c, h);
    let gpu = [
        e.o.f32s(stream),
        e.final_state.f32s(stream),
        e.o_step.f32s(stream),
        e.state.f32s(stream),
    ];
    for (k, name) in NAMES.iter().enumerate() {
        let err = rel_l2(&gpu[k], &cpu[k]);
        eprintln!("{}: {name} rel L2 vs CPU {err:.2e}", c.name);
        assert!(err < 1e-5, "{}: {name} rel L2 vs CPU {err:.2e}", c.name);
    }
}

#[test]
fn gpu_graph_replay_equals_uncaptured_and_cpu() {
    let (stream, dev) = gpu_or_skip!();
    for (i, c) in cases().iter().enumerate() {
        let h = host_inputs(c, 7 + i as u64);
        let mut e = Engine::new(&stream, &dev, c, &h);

        e.queue().unwrap();
        let plain = e.outputs();

        // The same calls captured.
        e.zero_outputs();
        let graph = capture(&stream, &mut e);
        // Capturing runs nothing: the outputs are still zero.
        let zero = e.outputs();
        assert!(
            zero.iter().flatten().all(|&b| b == 0),
            "{}: capture ran work",
            c.name
        );
        for replay in 0..2 {
            e.zero_outputs();
            graph.launch().unwrap();
            let replayed = e.outputs();
            for (k, name) in NAMES.iter().enumerate() {
                assert!(
                    replayed[k] == plain[k],
                    "{}: {name} of replay {replay} differs from the uncaptured run",
                    c.name
                );
            }
        }
        assert_near_cpu(&stream, c, &h, &e);
    }
}

#[test]
fn gpu_a_plans_first_forward_can_be_captured() {
    let (stream, dev) = gpu_or_skip!();
    // A shape no other test here uses (K = 96, V = 80: the fused path's split kernel), so that
    // no earlier call of this process has loaded its kernels: the plan must have.
    let c = Case {
        name: "bf16 varlen K=96 V=80, captured before any uncaptured run",
        dims: Dims {
            batch: 1,
            seq_len: 300,
            heads: 2,
            v_heads: 4,
            dk: 96,
            dv: 80,
        },
        cu_seqlens: Some(vec![0, 130, 300]),
        opts: Options {
            out_dtype: Some(DType::F32),
            ..Options::default()
        },
        dtype: DType::BF16,
        with_h0: false,
    };
    let h = host_inputs(&c, 5);
    let mut e = Engine::new(&stream, &dev, &c, &h);
    let graph = capture(&stream, &mut e);
    e.zero_outputs();
    graph.launch().unwrap();
    let replayed = e.outputs();
    e.zero_outputs();
    e.queue().unwrap();
    let plain = e.outputs();
    for (k, name) in NAMES.iter().enumerate() {
        assert!(
            replayed[k] == plain[k],
            "{name}: the replay differs from the uncaptured run"
        );
    }
    assert_near_cpu(&stream, &c, &h, &e);
}

#[test]
fn gpu_16_bit_output_is_the_f32_output_rounded() {
    let (stream, dev) = gpu_or_skip!();
    for c in cases().into_iter().filter(|c| c.dtype != DType::F32) {
        let h = host_inputs(&c, 11);
        let mut wide = Engine::new(&stream, &dev, &c, &h);
        wide.queue().unwrap();
        let wide_out = [wide.o.f32s(&stream), wide.o_step.f32s(&stream)];
        let narrow_case = Case {
            opts: Options {
                out_dtype: None,
                ..c.opts.clone()
            },
            ..c
        };
        let mut narrow = Engine::new(&stream, &dev, &narrow_case, &h);
        narrow.queue().unwrap();
        let narrow_out = narrow.outputs();
        for (got, want) in [
            (&narrow_out[0], &wide_out[0]),
            (&narrow_out[2], &wide_out[1]),
        ] {
            let want = Tensor::cast_from_f32(want, vec![want.len()], narrow_case.dtype).unwrap();
            let want: Vec<u32> = want
                .as_bytes()
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect();
            assert!(
                *got == want,
                "{}: the {} output is not the f32 output rounded to nearest even",
                narrow_case.name,
                narrow_case.dtype
            );
        }
    }
}

#[test]
fn gpu_raw_stream_runs_like_a_cudarc_stream() {
    let (stream, dev) = gpu_or_skip!();
    let c = &cases()[0];
    let h = host_inputs(c, 3);
    let mut e = Engine::new(&stream, &dev, c, &h);
    e.queue().unwrap();
    let want = e.outputs();
    // The same stream handle, as PyTorch would pass it.
    // SAFETY: the stream belongs to GPU 0's primary context and outlives the device.
    let raw = Arc::new(unsafe { CudaDevice::from_raw_stream(0, stream.cu_stream()) }.unwrap());
    let mut r = Engine::new(&stream, &raw, c, &h);
    r.queue().unwrap();
    assert!(
        r.outputs() == want,
        "a raw-stream device computes otherwise"
    );

    // A short workspace is refused before anything is queued, naming it.
    let mut small = stream.alloc_zeros::<u8>(16).unwrap();
    let err = e.forward(Some(&mut small)).unwrap_err();
    assert!(err.to_string().starts_with("workspace:"), "{err}");
}

#[test]
fn gpu_nonfinite_input_does_not_reach_earlier_tokens() {
    let (stream, dev) = gpu_or_skip!();
    let c = Case {
        name: "f32",
        dims: Dims {
            batch: 1,
            seq_len: 128,
            heads: 1,
            v_heads: 2,
            dk: 32,
            dv: 16,
        },
        cu_seqlens: None,
        opts: Options::default(),
        dtype: DType::F32,
        with_h0: true,
    };
    let clean = host_inputs(&c, 5);
    let mut e = Engine::new(&stream, &dev, &c, &clean);
    e.queue().unwrap();
    let want = e.o.f32s(&stream);
    let (hv, dk, dv) = (c.dims.v_heads, c.dims.dk, c.dims.dv);
    let own = Device::cuda(0).unwrap();
    for tensor in ["k", "v", "g", "beta"] {
        for bad in [f32::NAN, f32::INFINITY] {
            // Token 20 (first chunk, mid-chunk) and token 100 (second chunk).
            for t in [20usize, 100] {
                let mut h = host_inputs(&c, 5);
                let x = &mut h.prefill;
                let (target, width) = match tensor {
                    "k" => (&mut x.k, dk),
                    "v" => (&mut x.v, hv * dv),
                    "g" => (&mut x.g, hv),
                    _ => (&mut x.beta, hv),
                };
                let mut d = target.to_f32().into_owned();
                d[t * width..(t + 1) * width].fill(bad);
                *target = Tensor::from_f32(d, target.shape().to_vec()).unwrap();
                let before = t * hv * dv;

                let mut e = Engine::new(&stream, &dev, &c, &h);
                e.queue().unwrap();
                let got = e.o.f32s(&stream);
                // Through the library's own front door too (the stage path), where it takes
                // non-finite inputs at all (refusing them spreads nothing either).
                let lib = match forward(&own, &h.prefill, &c.opts) {
                    Ok(out) => out.o.to_f32().into_owned(),
                    Err(e) => {
                        eprintln!("forward refuses {tensor} = {bad}: {e}");
                        got.clone()
                    }
                };
                for (path, got) in [("engine", &got[..]), ("forward", &lib[..])] {
                    let first_bad = got[..before].iter().position(|x| !x.is_finite());
                    assert!(
                        first_bad.is_none(),
                        "{path}: {tensor} = {bad} at token {t} made o[{}] (token {}) non-finite",
                        first_bad.unwrap_or(0),
                        first_bad.unwrap_or(0) / (hv * dv)
                    );
                    let err = rel_l2(&got[..before], &want[..before]);
                    assert!(
                        err < 1e-6,
                        "{path}: {tensor} = {bad} at token {t} changed earlier outputs ({err:.2e})"
                    );
                }
            }
        }
    }
}

/// A plan on the fused kernels asks for their workspace only; a q view at an odd address (which
/// their 16-byte loads cannot read) takes the stage path, which needs the larger workspace of
/// `forward_workspace_bytes_any_alignment`: refused naming `q` with the smaller one, and equal
/// to the aligned run (within 1e-5) with the larger.
#[test]
fn gpu_unaligned_views_take_the_stage_path_and_its_workspace() {
    let (stream, dev) = gpu_or_skip!();
    let c = Case {
        name: "bf16 K = V = 64",
        dims: Dims {
            batch: 1,
            seq_len: 200,
            heads: 2,
            v_heads: 4,
            dk: 64,
            dv: 64,
        },
        cu_seqlens: None,
        opts: Options {
            out_dtype: Some(DType::F32),
            ..Options::default()
        },
        dtype: DType::BF16,
        with_h0: true,
    };
    let h = host_inputs(&c, 21);
    let mut e = Engine::new(&stream, &dev, &c, &h);
    e.forward(None).unwrap();
    let want = [e.o.f32s(&stream), e.final_state.f32s(&stream)];
    let (small, any) = (
        e.plan.forward_workspace_bytes(),
        e.plan.forward_workspace_bytes_any_alignment(),
    );
    eprintln!("workspace: {small} bytes aligned, {any} any alignment");
    assert!(small <= any);
    // q one element into a buffer of its bits: 2 bytes past an allocation's alignment.
    let Dev::Bits(q, dt) = &e.x[0] else {
        panic!("bf16 inputs are kept as bits")
    };
    let dt = *dt;
    let mut shifted = stream.alloc_zeros::<u16>(q.len() + 1).unwrap();
    stream.memcpy_dtod(q, &mut shifted.slice_mut(1..)).unwrap();
    let qv = shifted.slice(1..);
    let run = |e: &mut Engine, ws: &mut CudaSlice<u8>| -> deltanet::Result<()> {
        let [_, k, v, g, beta] = &e.x;
        let io = ForwardIo {
            initial_state: e.h0.as_ref().map(Dev::r),
            ..ForwardIo::new(
                TokenInputs::new(
                    DeviceRef::new(&qv, dt).unwrap(),
                    k.r(),
                    v.r(),
                    g.r(),
                    beta.r(),
                ),
                e.o.w(),
                e.final_state.w(),
            )
        };
        e.plan.forward(io, Workspace::new(ws))
    };
    if small < any {
        let mut ws = stream.alloc_zeros::<u8>(small).unwrap();
        let err = run(&mut e, &mut ws).unwrap_err();
        assert!(err.to_string().starts_with("q:"), "{err}");
    }
    e.zero_outputs();
    let mut ws = stream.alloc_zeros::<u8>(any).unwrap();
    run(&mut e, &mut ws).unwrap();
    let got = [e.o.f32s(&stream), e.final_state.f32s(&stream)];
    for (k, name) in ["o", "final_state"].iter().enumerate() {
        let err = rel_l2(&got[k], &want[k]);
        eprintln!("unaligned q: {name} rel L2 vs the aligned run {err:.2e}");
        assert!(err < 1e-5, "unaligned q: {name} {err:.2e}");
    }
}

/// The host half of the GPU tests, run everywhere: every case is a valid problem for the
/// prefill and the decode step, and the CPU answers they are compared with are finite.
#[test]
fn cases_are_valid_and_their_cpu_answers_finite() {
    for (i, c) in cases().iter().enumerate() {
        let h = host_inputs(c, 7 + i as u64);
        let p = Problem::from_inputs(&h.prefill, &c.opts).unwrap();
        let ps = Problem::from_inputs(&h.decode, &c.opts).unwrap();
        assert_eq!(p.num_seqs(), h.n, "{}", c.name);
        assert_eq!((ps.num_seqs(), ps.tokens()), (h.n, h.n), "{}", c.name);
        for (name, x) in NAMES.iter().zip(cpu_answer(c, &h)) {
            assert!(
                !x.is_empty() && x.iter().all(|v| v.is_finite()),
                "{}: {name}",
                c.name
            );
        }
    }
}
