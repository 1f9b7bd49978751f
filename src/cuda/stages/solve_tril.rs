//! `A_inv = (I + A_strict)^-1` per chunk block (kernels/solve_tril.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params, ChunkTable, Ctx};
use crate::cuda::registry::{Kernel, Source};
use crate::error::Result;

/// Mirrors `SolveTrilParams` in kernels/solve_tril.cu: both arrays `[B, T, HV, BT]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub a_strict: CUdeviceptr,
    pub a_inv: CUdeviceptr,
    pub chunks: ChunkTable,
    pub hv: i64,
}
kernel_params!(Params, Source::SolveTril);

/// Zeroes `A_inv`, then writes the lower triangle (diagonal included) of each chunk's block; a
/// short last chunk is a smaller block and columns past it stay zero. One thread per column.
///
/// # Safety
/// Every pointer of `params` holds its documented layout of `ctx.p`, and `ctx.t` are its
/// tables, on the device's context.
pub(crate) unsafe fn launch(ctx: &Ctx<'_>, params: &Params) -> Result<()> {
    let (p, bt) = (ctx.p, ctx.p.chunk_size());
    let items = p.chunks().len() * p.v_heads();
    let params = Params {
        chunks: ctx.t.chunks,
        hv: i(p.v_heads()),
        ..*params
    };
    // SAFETY: the caller's.
    unsafe {
        ctx.dev
            .memset_zero(params.a_inv, p.tokens() * p.v_heads() * bt * 4, "A_inv")?;
        if items == 0 {
            return Ok(());
        }
        let launch = cfg(items, bt as u32, 0);
        ctx.dev.launch(Kernel::SolveTril, Some(bt), launch, &params)
    }
}
