//! The gated delta rule token by token (kernels/recurrent.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, tiled, TablePtrs};
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

/// State columns per block with K-major states (one thread each).
const COLS_PER_BLOCK: usize = 128;
/// State rows per block with V-major states (one warp each).
const ROWS_PER_BLOCK: usize = 8;

/// Mirrors `RecurrentParams` in kernels/recurrent.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, H, K]` f32.
    pub q: CUdeviceptr,
    /// `[B, T, H, K]` f32.
    pub k: CUdeviceptr,
    /// `[B, T, HV, V]` f32.
    pub v: CUdeviceptr,
    /// `[B, T, HV]` f32, effective.
    pub g: CUdeviceptr,
    /// `[B, T, HV]` f32, effective.
    pub beta: CUdeviceptr,
    /// `[N, HV, K, V]` f32 (`[N, HV, V, K]` with `v_first`), updated in place.
    pub state: CUdeviceptr,
    /// `[B, T, HV, V]` f32, written.
    pub o: CUdeviceptr,
    /// `[N + 1]` i64.
    pub seq_start: CUdeviceptr,
    pub seqs: i64,
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
    pub scale: f32,
    pub tiled: i32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/recurrent.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Recurrent;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs, scale: f32) -> Params {
        Params {
            seq_start: t.seq_start,
            seqs: i(p.num_seqs()),
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            dv: i(p.dv()),
            scale,
            tiled: tiled(p),
            ..Params::default()
        }
    }
}

/// The kernel for the state layout.
pub(crate) fn kernel(v_first: bool) -> Kernel {
    if v_first {
        Kernel::RecurrentVk
    } else {
        Kernel::RecurrentKv
    }
}

/// # Safety
/// Every pointer of `params` holds its documented layout of `p`, and the tables are `p`'s, on
/// the device's context.
pub(crate) unsafe fn launch(
    dev: &CudaDevice,
    p: &Problem,
    v_first: bool,
    params: &Params,
) -> Result<()> {
    let (hv, dv) = (p.v_heads(), p.dv());
    if p.tokens() * hv == 0 {
        return Ok(());
    }
    let (threads, items) = if v_first {
        (
            32 * ROWS_PER_BLOCK,
            p.num_seqs() * hv * dv.div_ceil(ROWS_PER_BLOCK),
        )
    } else {
        let threads = dv.next_multiple_of(32).min(COLS_PER_BLOCK);
        (threads, p.num_seqs() * hv * dv.div_ceil(threads))
    };
    dev.launch(kernel(v_first), None, cfg(items, threads as u32, 0), params)
}
