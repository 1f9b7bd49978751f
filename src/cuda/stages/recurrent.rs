//! The gated delta rule token by token (kernels/recurrent.cu).

use cudarc::driver::sys::CUdeviceptr;

use super::{cfg, i, kernel_params, Ctx, Shape};
use crate::cuda::registry::{Kernel, Source};
use crate::error::Result;

/// State columns per block with K-major states (one thread each).
const COLS_PER_BLOCK: usize = 128;
/// State rows per block with V-major states (one warp each).
const ROWS_PER_BLOCK: usize = 8;

/// Mirrors `RecurrentParams` in kernels/recurrent.cu: `q`, `k` `[B, T, H, K]`, `v`
/// `[B, T, HV, V]`, `g` and `beta` (effective) `[B, T, HV]`, `state` `[N, HV, K, V]`
/// (`[N, HV, V, K]` with `v_first`) updated in place; written: `o` `[B, T, HV, V]`; all f32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub q: CUdeviceptr,
    pub k: CUdeviceptr,
    pub v: CUdeviceptr,
    pub g: CUdeviceptr,
    pub beta: CUdeviceptr,
    pub state: CUdeviceptr,
    pub o: CUdeviceptr,
    pub seq_start: CUdeviceptr,
    pub shape: Shape,
    pub seqs: i64,
    pub scale: f32,
}
kernel_params!(Params, Source::Recurrent);

/// # Safety
/// Every pointer of `params` holds its documented layout of `ctx.p`, and `ctx.t` are its
/// tables, on the device's context.
pub(crate) unsafe fn launch(ctx: &Ctx<'_>, v_first: bool, params: &Params) -> Result<()> {
    let p = ctx.p;
    let (hv, dv) = (p.v_heads(), p.dv());
    if p.tokens() * hv == 0 {
        return Ok(());
    }
    let params = Params {
        seq_start: ctx.t.seq_start,
        shape: Shape::of(p),
        seqs: i(p.num_seqs()),
        ..*params
    };
    let (kernel, threads, items) = if v_first {
        let items = p.num_seqs() * hv * dv.div_ceil(ROWS_PER_BLOCK);
        (Kernel::RecurrentVk, 32 * ROWS_PER_BLOCK, items)
    } else {
        let threads = dv.next_multiple_of(32).min(COLS_PER_BLOCK);
        let items = p.num_seqs() * hv * dv.div_ceil(threads);
        (Kernel::RecurrentKv, threads, items)
    };
    // SAFETY: the caller's.
    unsafe {
        ctx.dev
            .launch(kernel, None, cfg(items, threads as u32, 0), &params)
    }
}
