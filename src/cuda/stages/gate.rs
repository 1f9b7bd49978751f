//! The effective gate and beta (kernels/gate.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::options::Options;
use crate::problem::Problem;

const THREADS: usize = 256;

/// Mirrors `GateParams` in kernels/gate.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, HV]` f32.
    pub g: CUdeviceptr,
    /// `[B, T, HV]` f32.
    pub beta: CUdeviceptr,
    /// `[HV]` f32, read only with `gate_in_kernel` (null otherwise).
    pub a_log: CUdeviceptr,
    /// `[HV]` f32, read only with `gate_in_kernel` (null otherwise).
    pub dt_bias: CUdeviceptr,
    /// `[B, T, HV]` f32.
    pub g_out: CUdeviceptr,
    /// `[B, T, HV]` f32.
    pub beta_out: CUdeviceptr,
    pub n: i64,
    pub hv: i64,
    pub gate_in_kernel: i32,
    pub beta_is_logits: i32,
    /// 2 with `allow_neg_eigval`, else 1.
    pub beta_mult: f32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/gate.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Gate;
}

impl Params {
    /// The dimensions and flags of `p` and `opts`, every pointer null.
    pub(crate) fn dims(p: &Problem, opts: &Options) -> Params {
        Params {
            n: i(p.tokens() * p.v_heads()),
            hv: i(p.v_heads()),
            gate_in_kernel: i32::from(opts.gate_in_kernel),
            beta_is_logits: i32::from(opts.beta_is_logits),
            beta_mult: if opts.allow_neg_eigval { 2.0 } else { 1.0 },
            ..Params::default()
        }
    }
}

/// # Safety
/// Every pointer of `params` is valid for the lengths its doc states (`a_log` and `dt_bias` only
/// with `gate_in_kernel`), on the device's context.
pub(crate) unsafe fn launch(dev: &CudaDevice, params: &Params) -> Result<()> {
    let n = params.n as usize;
    if n == 0 {
        return Ok(());
    }
    dev.launch(
        Kernel::Gate,
        None,
        cfg(n.div_ceil(THREADS), THREADS as u32, 0),
        params,
    )
}
