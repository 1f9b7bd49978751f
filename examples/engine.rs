//! deltanet as an inference engine would call it: the engine owns a CUDA stream and every
//! buffer (bf16 activations, f32 gates and states, a workspace); it prefills a prompt, then
//! decodes token after token, with no host copy in between. Only at the end is anything brought
//! back, to print it.
//!
//! `cargo run --release --example engine` (exits with a message where no GPU can be used).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use deltanet::cuda::{
    CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, StepIo, TokenInputs, Workspace,
};
use deltanet::{DType, Dims, Options, Problem};

/// Qwen3-Next's layer shape, batch of 2 prompts of 512 tokens, then 32 decode steps.
const B: usize = 2;
const PROMPT: usize = 512;
const STEPS: usize = 32;
const H: usize = 16;
const HV: usize = 32;
const K: usize = 128;
const V: usize = 128;

/// Deterministic values in [-1, 1), as bf16 bits.
fn bf16_values(n: usize, seed: u32) -> Vec<u16> {
    (0..n)
        .map(|i| {
            let x = ((i as f32 + 0.5) * 0.618_034 + seed as f32 * 0.377).sin();
            half::bf16::from_f32(x).to_bits()
        })
        .collect()
}

fn main() {
    if let Err(e) = CudaDevice::new(0) {
        println!("no usable GPU, nothing to do: {e}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The engine's inputs for one call of `t` tokens per sequence.
struct Activations {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    g: CudaSlice<f32>,
    beta: CudaSlice<f32>,
}

impl Activations {
    /// The inputs as the engine API takes them.
    fn inputs(&self) -> deltanet::Result<TokenInputs<'_>> {
        Ok(TokenInputs::new(
            DeviceRef::new(&self.q, DType::BF16)?,
            DeviceRef::new(&self.k, DType::BF16)?,
            DeviceRef::new(&self.v, DType::BF16)?,
            DeviceRef::new(&self.g, DType::F32)?,
            DeviceRef::new(&self.beta, DType::F32)?,
        ))
    }

    fn new(stream: &Arc<CudaStream>, t: usize, seed: u32) -> deltanet::Result<Self> {
        let tokens = B * t;
        let err = |e: cudarc::driver::DriverError| deltanet::Error::Cuda {
            context: "the example's buffers".into(),
            message: e.to_string(),
        };
        // In an engine these are the projections' outputs, already on the device.
        let gates: Vec<f32> = (0..tokens * HV)
            .map(|i| -0.05 - 0.01 * (i % 7) as f32)
            .collect();
        Ok(Activations {
            q: stream
                .clone_htod(&bf16_values(tokens * H * K, seed))
                .map_err(err)?,
            k: stream
                .clone_htod(&bf16_values(tokens * H * K, seed + 1))
                .map_err(err)?,
            v: stream
                .clone_htod(&bf16_values(tokens * HV * V, seed + 2))
                .map_err(err)?,
            g: stream.clone_htod(&gates).map_err(err)?,
            beta: stream.clone_htod(&vec![0.5f32; tokens * HV]).map_err(err)?,
        })
    }
}

fn run() -> deltanet::Result<()> {
    let cuda = |e: cudarc::driver::DriverError| deltanet::Error::Cuda {
        context: "the example".into(),
        message: e.to_string(),
    };
    // The engine's own stream.
    let ctx = CudaContext::new(0).map_err(cuda)?;
    let stream = ctx.new_stream().map_err(cuda)?;
    let dev = Arc::new(CudaDevice::from_stream(stream.clone())?);
    println!("device: {}", dev.name());

    let opts = Options {
        use_qk_l2norm: true,
        ..Options::default()
    };
    let dims = |t| Dims {
        batch: B,
        seq_len: t,
        heads: H,
        v_heads: HV,
        dk: K,
        dv: V,
    };
    // Plans are made once per shape: kernels compiled and loaded, tables uploaded.
    let t0 = Instant::now();
    let prefill = Plan::new(
        dev.clone(),
        &Problem::new(dims(PROMPT), None, &opts)?,
        &opts,
        DType::BF16,
    )?;
    let decode = Plan::new(
        dev.clone(),
        &Problem::new(dims(1), None, &opts)?,
        &opts,
        DType::BF16,
    )?;
    println!("plans ready in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);

    let ws_bytes = prefill
        .forward_workspace_bytes()
        .max(decode.step_workspace_bytes());
    let mut workspace = stream.alloc_zeros::<u8>(ws_bytes).map_err(cuda)?;
    let mut state = stream.alloc_zeros::<f32>(B * HV * K * V).map_err(cuda)?;
    let prompt = Activations::new(&stream, PROMPT, 1)?;
    let token = Activations::new(&stream, 1, 2)?;
    let mut prompt_o = stream
        .alloc_zeros::<u16>(B * PROMPT * HV * V)
        .map_err(cuda)?;
    let mut token_o = stream.alloc_zeros::<u16>(B * HV * V).map_err(cuda)?;
    println!(
        "workspace {:.1} MiB, state {:.1} MiB",
        ws_bytes as f64 / 1048576.0,
        (B * HV * K * V * 4) as f64 / 1048576.0
    );

    // Prefill: the state comes out in `state`.
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(timing).map_err(cuda)?;
    let end = ctx.new_event(timing).map_err(cuda)?;
    start.record(&stream).map_err(cuda)?;
    let io = ForwardIo::new(
        prompt.inputs()?,
        DeviceMut::new(&mut prompt_o, DType::BF16)?,
        DeviceMut::new(&mut state, DType::F32)?,
    );
    prefill.forward(io, Workspace::new(&mut workspace))?;
    let middle = ctx.new_event(timing).map_err(cuda)?;
    middle.record(&stream).map_err(cuda)?;
    // Decode: each step advances `state` in place. An engine would write the next token's
    // q, k, v, g, beta into `token` between steps; the same buffers serve every step.
    for _ in 0..STEPS {
        let io = StepIo {
            inputs: token.inputs()?,
            state: DeviceMut::new(&mut state, DType::F32)?,
            o: DeviceMut::new(&mut token_o, DType::BF16)?,
        };
        decode.recurrent_step(io, Workspace::new(&mut workspace))?;
    }
    end.record(&stream).map_err(cuda)?;
    // The first wait for the host: everything above was only queued.
    stream.synchronize().map_err(cuda)?;
    let prefill_ms = start.elapsed_ms(&middle).map_err(cuda)?;
    let decode_ms = middle.elapsed_ms(&end).map_err(cuda)?;
    println!(
        "prefill {B} x {PROMPT} tokens: {prefill_ms:.3} ms ({:.0} tokens/s)",
        (B * PROMPT) as f64 / (f64::from(prefill_ms) * 1e-3)
    );
    println!(
        "decode {STEPS} steps of {B} tokens: {:.3} ms per step",
        decode_ms / STEPS as f32
    );

    let o: Vec<f32> = stream
        .clone_dtoh(&token_o)
        .map_err(cuda)?
        .iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect();
    let s = stream.clone_dtoh(&state).map_err(cuda)?;
    let norm = |x: &[f32]| x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
    println!(
        "last decode o: |o| = {:.4}, o[0..4] = {:?}; |state| = {:.4}; all finite: {}",
        norm(&o),
        &o[..4],
        norm(&s),
        o.iter().chain(&s).all(|v| v.is_finite())
    );
    Ok(())
}
