//! # deltanet
//!
//! Gated DeltaNet (the gated delta rule) linear attention, the token mixer of Qwen3-Next and
//! Qwen3.5, computed exactly on the CPU and on NVIDIA GPUs, with FLA's names and layouts.
//!
//! Per sequence and value head j, a state S (K x V, f32) evolves token by token:
//! `S <- exp(g_t) S; u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = S^T (scale q_t)`.
//! [`forward`] computes it in chunks of 64 tokens through public stages (see [`Backend`]);
//! [`recurrent_step`] advances a state buffer in place for decoding; [`reference::reference`]
//! is the float64 oracle both are tested against.
//!
//! ```
//! use deltanet::{forward, Device, Inputs, Options, Tensor};
//! let (b, t, h, hv, k, v) = (1, 5, 1, 2, 4, 3);
//! let q = Tensor::from_f32(vec![0.1; b * t * h * k], vec![b, t, h, k])?;
//! let kk = Tensor::from_f32(vec![0.5; b * t * h * k], vec![b, t, h, k])?;
//! let vv = Tensor::from_f32(vec![1.0; b * t * hv * v], vec![b, t, hv, v])?;
//! let g = Tensor::from_f32(vec![-0.1; b * t * hv], vec![b, t, hv])?;
//! let beta = Tensor::from_f32(vec![0.5; b * t * hv], vec![b, t, hv])?;
//! let out = forward(&Device::Cpu, &Inputs::new(q, kk, vv, g, beta), &Options::default())?;
//! assert_eq!(out.o.shape(), &[1, 5, 2, 3]);
//! assert_eq!(out.final_state.unwrap().shape(), &[1, 2, 4, 3]);
//! # Ok::<(), deltanet::Error>(())
//! ```

#![warn(missing_docs)]

// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod backend;
pub mod cpu;
pub mod cuda;
mod dtype;
mod error;
mod forward;
pub mod io;
mod options;
mod problem;
pub mod reference;
pub mod selftest;

pub use backend::{Backend, ChunkStates, Gamma, StageInputs, Wy, RESET_LOG_DECAY};
pub use dtype::{DType, Data, Tensor};
pub use error::{Error, Result};
pub use forward::{activate, chunk_forward, Activated, ForwardOut};
pub use options::{HeadMap, Options, CHUNK_SIZES};
pub use problem::{Chunk, Dims, Inputs, Problem};

/// Where the computation runs.
#[derive(Clone, Debug)]
pub enum Device {
    /// This machine's cores, through rayon.
    Cpu,
    /// An NVIDIA GPU, through the CUDA driver and NVRTC, loaded at run time.
    Cuda(std::sync::Arc<cuda::CudaDevice>),
}

impl Device {
    /// The GPU with this ordinal; `Err` when there is no driver, no NVRTC or no such GPU.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Ok(Device::Cuda(std::sync::Arc::new(cuda::CudaDevice::new(
            ordinal,
        )?)))
    }

    /// The first GPU if one can be used, else the CPU.
    pub fn auto() -> Device {
        Device::cuda(0).unwrap_or(Device::Cpu)
    }

    /// Parses `auto`, `cpu`, `cuda` or `cuda:N` and opens that device.
    pub fn parse(s: &str) -> Result<Device> {
        match s {
            "auto" => Ok(Device::auto()),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Device::cuda(0),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Device::cuda(n),
                _ => Err(Error::invalid(
                    "device",
                    "auto, cpu, cuda or cuda:N",
                    format!("{s:?}"),
                )),
            },
        }
    }

    /// A one-line description (`cpu (2 threads)`, `cuda:0 NVIDIA H200 (sm_90)`).
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
            Device::Cuda(d) => d.name(),
        }
    }
}

/// The forward's results, on the host.
#[derive(Clone, Debug)]
pub struct Output {
    /// `[B, T, HV, V]`, in `Options::out_dtype` or the input's dtype.
    pub o: Tensor<'static>,
    /// `[N, HV, K, V]` f32 (`[N, HV, V, K]` with `state_v_first`), with `output_final_state`.
    pub final_state: Option<Tensor<'static>>,
    /// The state entering every chunk, `[chunks, HV, K, V]` f32, with `output_chunk_states`.
    pub chunk_states: Option<Tensor<'static>>,
}

/// Transposes each K x V state to V x K (`to_v_first`) or back.
pub(crate) fn transpose_states(s: &[f32], dk: usize, dv: usize, to_v_first: bool) -> Vec<f32> {
    let (rows, cols) = if to_v_first { (dk, dv) } else { (dv, dk) };
    let mut out = vec![0f32; s.len()];
    for (src, dst) in s.chunks_exact(dk * dv).zip(out.chunks_exact_mut(dk * dv)) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// Runs the chunked forward on `device`: validates `x` against `opts`, computes `o` and the
/// states asked for.
pub fn forward(device: &Device, x: &Inputs<'_>, opts: &Options) -> Result<Output> {
    let p = Problem::from_inputs(x, opts)?;
    match device {
        Device::Cpu => {
            let f = cpu::fused::fused(&p, x, opts)?;
            host_output(&p, x, opts, f.o, Some(f.final_state), f.h)
        }
        Device::Cuda(d) => host_forward(d.as_ref(), &p, x, opts),
    }
}

/// A device that can take host data: the glue between host tensors and a [`Backend`].
pub trait HostIo: Backend {
    /// Copies host f32 data to a new device buffer.
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    /// Copies a device buffer to the host (waiting for the work that writes it).
    fn download(&self, buf: &Self::Buf) -> Result<Vec<f32>>;
    /// Waits until all work queued on the device is done.
    fn synchronize(&self) -> Result<()>;
    /// Milliseconds the device spends on the work `f` queues (device events on a GPU, wall
    /// clock on the CPU).
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64>;
}

impl HostIo for cpu::Cpu {
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let t = std::time::Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// Uploads validated host inputs as f32 device buffers (states K-major).
pub fn upload_inputs<D: HostIo>(
    dev: &D,
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
) -> Result<StageInputs<D::Buf>> {
    let up = |t: &Tensor<'_>| dev.upload(&t.to_f32());
    let h0 = match &x.initial_state {
        Some(s) if opts.state_v_first => {
            Some(dev.upload(&transpose_states(&s.to_f32(), p.dk(), p.dv(), false))?)
        }
        Some(s) => Some(up(s)?),
        None => None,
    };
    Ok(StageInputs {
        q: up(&x.q)?,
        k: up(&x.k)?,
        v: up(&x.v)?,
        g: up(&x.g)?,
        beta: up(&x.beta)?,
        h0,
        a_log: x.a_log.as_ref().map(up).transpose()?,
        dt_bias: x.dt_bias.as_ref().map(up).transpose()?,
    })
}

fn host_forward<D: HostIo>(dev: &D, p: &Problem, x: &Inputs<'_>, opts: &Options) -> Result<Output> {
    let si = upload_inputs(dev, p, x, opts)?;
    let out = dev.forward(p, opts, &si)?;
    let final_state = if opts.output_final_state {
        Some(dev.download(&out.final_state)?)
    } else {
        None
    };
    let h = out.h.as_ref().map(|h| dev.download(h)).transpose()?;
    host_output(p, x, opts, dev.download(&out.o)?, final_state, h)
}

/// Host tensors of the forward's results, in the layouts and dtypes the options ask for.
fn host_output(
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
    o: Vec<f32>,
    final_state: Option<Vec<f32>>,
    h: Option<Vec<f32>>,
) -> Result<Output> {
    let shape = vec![p.batch(), p.seq_len(), p.v_heads(), p.dv()];
    // f32 output takes the buffer as it is: no second copy of what can be gigabytes.
    let o = match opts.out_dtype.unwrap_or(x.q.dtype()) {
        DType::F32 => Tensor::from_f32(o, shape)?,
        dtype => Tensor::cast_from_f32(&o, shape, dtype)?,
    };
    let final_state = match final_state {
        Some(s) if opts.output_final_state => {
            let s = if opts.state_v_first {
                transpose_states(&s, p.dk(), p.dv(), true)
            } else {
                s
            };
            Some(Tensor::from_f32(
                s,
                p.state_shape(opts.state_v_first).to_vec(),
            )?)
        }
        _ => None,
    };
    let chunk_states = match h {
        Some(h) if opts.output_chunk_states => Some(Tensor::from_f32(
            h,
            vec![p.chunks().len(), p.v_heads(), p.dk(), p.dv()],
        )?),
        _ => None,
    };
    Ok(Output {
        o,
        final_state,
        chunk_states,
    })
}

/// The recurrent (decode) step: advances `state` (`[N, HV, K, V]` f32, or `[N, HV, V, K]` with
/// `state_v_first`) in place through the tokens of `x` and returns `o` `[B, T, HV, V]`.
/// `x.initial_state` must be `None`: the state is `state`.
pub fn recurrent_step(
    device: &Device,
    x: &Inputs<'_>,
    state: &mut [f32],
    opts: &Options,
) -> Result<Tensor<'static>> {
    if x.initial_state.is_some() {
        return Err(Error::invalid(
            "initial_state",
            "none (recurrent_step updates `state` in place)",
            "a tensor",
        ));
    }
    let p = Problem::from_inputs(x, opts)?;
    let want = p.num_seqs() * p.v_heads() * p.state_len();
    error::check_len("state", state.len(), want)?;
    let scale = opts.scale_for(p.dk());
    let o = match device {
        Device::Cpu => {
            let si = upload_inputs(&cpu::Cpu, &p, x, opts)?;
            let a = activate(&cpu::Cpu, &p, opts, &si)?;
            // The state is updated where it lies: no copy of what can be gigabytes.
            cpu::recurrent(
                &p,
                a.q(),
                a.k(),
                &si.v,
                &a.g,
                &a.beta,
                state,
                opts.state_v_first,
                scale,
            )?
        }
        Device::Cuda(d) => {
            let d = d.as_ref();
            let si = upload_inputs(d, &p, x, opts)?;
            let a = activate(d, &p, opts, &si)?;
            let mut s = d.upload(state)?;
            let o = d.recurrent(
                &p,
                a.q(),
                a.k(),
                &si.v,
                &a.g,
                &a.beta,
                &mut s,
                opts.state_v_first,
                scale,
            )?;
            state.copy_from_slice(&d.download(&s)?);
            d.download(&o)?
        }
    };
    Tensor::cast_from_f32(
        &o,
        vec![p.batch(), p.seq_len(), p.v_heads(), p.dv()],
        opts.out_dtype.unwrap_or(x.q.dtype()),
    )
}
