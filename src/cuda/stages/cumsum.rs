//! `gamma = cumsum(g)` within each chunk (kernels/cumsum.cu).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::DeviceRepr;

use super::{cfg, i, ChunkTable, GammaPtrs, TablePtrs};
use crate::backend::RESET_LOG_DECAY;
use crate::cuda::registry::{Kernel, KernelParams, Source};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::problem::Problem;

const THREADS: usize = 128;

/// Mirrors `CumsumParams` in kernels/cumsum.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    /// `[B, T, HV]` f32, the effective gate.
    pub g: CUdeviceptr,
    /// `[B, T, HV]` f32 each, written.
    pub gamma: GammaPtrs,
    pub chunks: ChunkTable,
    pub hv: i64,
    pub reset: f32,
}
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}
// SAFETY: the struct of kernels/cumsum.cu.
unsafe impl KernelParams for Params {
    const SOURCE: Source = Source::Cumsum;
}

impl Params {
    /// The dimensions of `p` and its tables, every array pointer null.
    pub(crate) fn dims(p: &Problem, t: &TablePtrs) -> Params {
        Params {
            chunks: t.chunks,
            hv: i(p.v_heads()),
            reset: RESET_LOG_DECAY,
            ..Params::default()
        }
    }
}

/// # Safety
/// Every pointer of `params` holds `[B, T, HV]` f32 and the tables are `p`'s, on the device's
/// context.
pub(crate) unsafe fn launch(dev: &CudaDevice, p: &Problem, params: &Params) -> Result<()> {
    let items = p.chunks().len() * p.v_heads();
    if items == 0 {
        return Ok(());
    }
    dev.launch(
        Kernel::ChunkLocalCumsum,
        None,
        cfg(items.div_ceil(THREADS), THREADS as u32, 0),
        params,
    )
}
