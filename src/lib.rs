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
pub mod cp;
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
pub use host::{upload_inputs, HostIo};
pub use options::{HeadMap, Options, Precision, CHUNK_SIZES};
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

    /// A one-line description (`cpu (2 threads, avx512)`, `cuda:0 NVIDIA H200 (sm_90)`): the
    /// CPU's with the instruction set its kernels take ([`cpu::instruction_set`]).
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => {
                let isa = cpu::instruction_set().name();
                match rayon::current_num_threads() {
                    1 => format!("cpu (1 thread, {isa})"),
                    n => format!("cpu ({n} threads, {isa})"),
                }
            }
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
///
/// Every device is reached the same way, through [`HostIo::forward_host`] (its
/// [`Backend::forward`]: fused on the CPU, reading `x` in place).
///
/// # Non-finite inputs
///
/// Causality holds for NaN and infinity as it does in the per-token definition. For each
/// (sequence, value head), call t the first token at which q, k (of the q/k head that value
/// head reads), v, g or beta holds a NaN or an infinity:
/// - the outputs of the tokens before t, and the states entering the chunks that start at or
///   before t, are computed from the tokens before t alone: the values they have when
///   the inputs at t and after are finite (hence finite when the earlier inputs are);
/// - `o` from t on and the final state of that (sequence, value head) are what the arithmetic
///   gives, as a rule NaN or infinite (the per-token recurrence propagates them too);
/// - other sequences and value heads are unaffected.
///
/// g holds log-decays: a finite g above 0 is an error (`g`; see [`Problem::from_inputs`]). A g of
/// -infinity is no error but a hard reset of the state (see [`RESET_LOG_DECAY`]); a
/// non-finite `initial_state`, `A_log` or `dt_bias` reaches every token of the heads it belongs
/// to. Nothing is checked or reported: a caller who must know scans its inputs.
pub fn forward(device: &Device, x: &Inputs<'_>, opts: &Options) -> Result<Output> {
    let p = Problem::from_inputs(x, opts)?;
    match device {
        Device::Cpu => host::forward_on(&cpu::Cpu, &p, x, opts),
        Device::Cuda(d) => host::forward_on(d.as_ref(), &p, x, opts),
    }
}

/// The recurrent (decode) step: advances `state` (`[N, HV, K, V]` f32, or `[N, HV, V, K]` with
/// `state_v_first`) in place through the tokens of `x` and returns `o` `[B, T, HV, V]`.
/// `x.initial_state` must be `None`: the state is `state`. Every device is reached the same way,
/// through [`HostIo::recurrent_host`].
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
    match device {
        Device::Cpu => host::recurrent_on(&cpu::Cpu, &p, x, state, opts),
        // One launch of the decode kernel, the state as a pool of N rows.
        Device::Cuda(_) if decode::kernel_takes(x, &p) => {
            Ok(decode_step(device, x, state, &StateIndices::default(), false, opts)?.o)
        }
        Device::Cuda(d) => host::recurrent_on(d.as_ref(), &p, x, state, opts),
    }
}
