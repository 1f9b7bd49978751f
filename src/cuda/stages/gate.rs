//! The effective gate and beta (kernels/gate.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params};
use crate::cuda::registry::{Kernel, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::options::Options;
use crate::problem::Problem;

const THREADS: usize = 256;

/// Mirrors `GateParams` in kernels/gate.cu. `g`, `beta` and the outputs are `[B, T, HV]` f32;
/// `a_log` and `dt_bias` `[HV]` f32, read only with `gate_in_kernel` (null otherwise).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub g: CUdeviceptr,
    pub beta: CUdeviceptr,
    pub a_log: CUdeviceptr,
    pub dt_bias: CUdeviceptr,
    pub g_out: CUdeviceptr,
    pub beta_out: CUdeviceptr,
    pub n: i64,
    pub hv: i64,
    pub gate_in_kernel: i32,
    pub beta_is_logits: i32,
    /// 2 with `allow_neg_eigval`, else 1.
    pub beta_mult: f32,
}
kernel_params!(Params, Source::Gate);

/// Queues the gate over `params`' buffers, with `p`'s sizes and `opts`' activations.
///
/// # Safety
/// Every pointer of `params` is valid for the lengths its doc states, on the device's context.
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    params: &Params,
) -> Result<()> {
    let n = p.tokens() * p.v_heads();
    if n == 0 {
        return Ok(());
    }
    let params = Params {
        n: i(n),
        hv: i(p.v_heads()),
        gate_in_kernel: i32::from(opts.gate_in_kernel),
        beta_is_logits: i32::from(opts.beta_is_logits),
        beta_mult: if opts.allow_neg_eigval { 2.0 } else { 1.0 },
        ..*params
    };
    let launch = cfg(n.div_ceil(THREADS), THREADS as u32, 0);
    // SAFETY: the caller's.
    unsafe { dev.launch(Kernel::Gate, None, launch, &params) }
}
