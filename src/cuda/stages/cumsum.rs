//! `gamma = cumsum(g)` within each chunk (kernels/cumsum.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params, ChunkTable, Ctx, GammaPtrs};
use crate::backend::RESET_LOG_DECAY;
use crate::cuda::registry::{Kernel, Source};
use crate::error::Result;

const THREADS: usize = 128;

/// Mirrors `CumsumParams` in kernels/cumsum.cu: `g` (the effective gate) and the three outputs
/// are `[B, T, HV]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub g: CUdeviceptr,
    pub gamma: GammaPtrs,
    pub chunks: ChunkTable,
    pub hv: i64,
    pub reset: f32,
}
kernel_params!(Params, Source::Cumsum);

/// # Safety
/// Every pointer of `params` holds `[B, T, HV]` f32 of `ctx.p` and `ctx.t` are its tables, on
/// the device's context.
pub(crate) unsafe fn launch(ctx: &Ctx<'_>, params: &Params) -> Result<()> {
    let items = ctx.p.chunks().len() * ctx.p.v_heads();
    if items == 0 {
        return Ok(());
    }
    let params = Params {
        chunks: ctx.t.chunks,
        hv: i(ctx.p.v_heads()),
        reset: RESET_LOG_DECAY,
        ..*params
    };
    let launch = cfg(items.div_ceil(THREADS), THREADS as u32, 0);
    // SAFETY: the caller's.
    unsafe {
        ctx.dev
            .launch(Kernel::ChunkLocalCumsum, None, launch, &params)
    }
}
