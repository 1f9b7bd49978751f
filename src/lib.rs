//! # deltanet
//!
//! Gated DeltaNet (the gated delta rule) linear attention, the token mixer of Qwen3-Next and
//! Qwen3.5, computed exactly on the CPU and on NVIDIA GPUs, with FLA's names and layouts.
//!
//! Per sequence and value head j, a state S (K x V, f32) evolves token by token:
//! `S <- exp(g_t) S; u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = S^T (scale q_t)`.
//! [`forward`] computes it in chunks (64 tokens by default) through public stages (see [`Backend`]);
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
pub mod decode;
mod dtype;
mod error;
mod forward;
mod host;
pub mod io;
mod options;
mod problem;
pub mod reference;
pub mod selftest;

pub use backend::{Backend, ChunkStates, Gamma, StageInputs, Wy, RESET_LOG_DECAY};
pub use decode::{decode_step, CudaStep, DecodeOutput, Indices, StateIndices};
pub use dtype::{DType, Data, Tensor};
pub use error::{Error, Result};
pub use forward::{activate, chunk_forward, Activated, ForwardOut};
pub(crate) use host::transpose_states;
use host::{host_forward, host_output};
pub use host::{upload_inputs, HostIo};
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
        // One launch of the decode kernel, the state as a pool of N rows.
        Device::Cuda(_) if decode::kernel_takes(x, &p) => {
            return Ok(decode_step(device, x, state, &StateIndices::default(), false, opts)?.o);
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
