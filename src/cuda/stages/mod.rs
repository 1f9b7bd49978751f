//! The stage-by-stage GPU path: one kernel per stage, the same stages and file names as the
//! CPU's. It is the reference the fused kernels are tested against.
//!
//! Each stage has a `#[repr(C)]` params struct mirrored field by field in its source under
//! `src/cuda/kernels/` (pointers are [`CUdeviceptr`]s), and an `unsafe fn launch` that completes
//! the dimensions from the [`Problem`] and queues the kernel on the device's stream. Launchers
//! read and write raw device memory only, so the same code serves the [`crate::Backend`] impl
//! (which allocates the outputs first) and the engine API (which carves them from a caller's
//! workspace). Nothing here allocates or waits for the host.

pub(crate) mod cast;
pub(crate) mod chunk_output;
pub(crate) mod chunk_state;
pub(crate) mod cumsum;
pub(crate) mod gate;
pub(crate) mod kkt;
pub(crate) mod l2norm;
pub(crate) mod recurrent;
pub(crate) mod solve_tril;
pub(crate) mod wy;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::LaunchConfig;

use super::registry::{Kernel, KernelParams};
use super::CudaDevice;
use crate::error::Result;
use crate::options::HeadMap;
use crate::problem::Problem;

/// Blocks per launch at most; kernels loop over the work items beyond it, so no item count hits
/// a grid limit (the x dimension alone is used).
pub(crate) const MAX_BLOCKS: usize = 1 << 22;

/// Implements the traits of a kernel's params struct, mirrored in `$source`; with `per_chunk`,
/// also [`PerChunk`] for a struct with `chunks` and `shape` fields.
macro_rules! kernel_params {
    ($t:ty, $source:expr) => {
        // SAFETY: plain old data (#[repr(C)]: device addresses and numbers), laid out as the
        // struct the source's kernels take; the source checks the size when it compiles.
        unsafe impl cudarc::driver::DeviceRepr for $t {}
        // SAFETY: as above.
        unsafe impl crate::cuda::registry::KernelParams for $t {
            const SOURCE: crate::cuda::registry::Source = $source;
        }
    };
    ($t:ty, $source:expr, per_chunk: $kernel:expr, $threads:expr) => {
        kernel_params!($t, $source);
        impl super::PerChunk for $t {
            const KERNEL: crate::cuda::registry::Kernel = $kernel;
            const THREADS: u32 = $threads as u32;
            fn with(self, chunks: super::ChunkTable, shape: super::Shape) -> Self {
                Self {
                    chunks,
                    shape,
                    ..self
                }
            }
        }
    };
}
pub(crate) use kernel_params;

/// The three arrays of a [`crate::Gamma`] (`GammaIn` in `common.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GammaPtrs {
    pub gamma: CUdeviceptr,
    pub lo: CUdeviceptr,
    pub seg: CUdeviceptr,
}

/// The chunk table (`Chunks` in `common.cuh`): chunk c covers the flat tokens
/// `start[c] .. start[c] + len[c]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChunkTable {
    pub start: CUdeviceptr,
    pub len: CUdeviceptr,
    pub count: i64,
}

/// The dimensions most kernels take (`Shape` in `common.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    pub heads: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
    /// 1 for the tiled head map, 0 for grouped.
    pub tiled: i32,
}

impl Shape {
    pub(crate) fn of(p: &Problem) -> Shape {
        Shape {
            heads: i(p.heads()),
            hv: i(p.v_heads()),
            dk: i(p.dk()),
            dv: i(p.dv()),
            tiled: i32::from(p.head_map() == HeadMap::Tiled),
        }
    }
}

/// A problem's tables on the device (i64 arrays), by address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TablePtrs {
    pub chunks: ChunkTable,
    /// Index of each sequence's first chunk, plus the total (`N + 1` entries).
    pub seq_first_chunk: CUdeviceptr,
    /// First flat token of each sequence, plus the total (`N + 1` entries).
    pub seq_start: CUdeviceptr,
    /// The sequences by decreasing chunk count, ties in order (`N` entries): the order in
    /// which the fused recurrent kernels take them (longest first, so short ones end a launch).
    pub seq_order: CUdeviceptr,
}

/// A 1-D launch of `blocks` blocks (clamped to `1..=MAX_BLOCKS`) of `threads` threads.
pub(crate) fn cfg(blocks: usize, threads: u32, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes,
    }
}

/// Where a stage runs and for what: the device, the problem and its tables on the device.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub dev: &'a CudaDevice,
    pub p: &'a Problem,
    pub t: TablePtrs,
}

/// The params of a kernel run as one block per (chunk, value head) that reads the chunk table
/// and the [`Shape`].
pub(crate) trait PerChunk: KernelParams {
    /// The kernel.
    const KERNEL: Kernel;
    /// Threads per block.
    const THREADS: u32;
    /// The params with the chunk table and shape filled in.
    fn with(self, chunks: ChunkTable, shape: Shape) -> Self;
}

/// Queues a [`PerChunk`] kernel (compiled for the problem's chunk size) over `params`' buffers;
/// nothing when there are no chunks.
///
/// # Safety
/// Every pointer of `params` holds its documented layout of `ctx.p`, and `ctx.t` are its
/// tables, on the device's context.
pub(crate) unsafe fn launch_per_chunk<P: PerChunk>(ctx: &Ctx<'_>, params: &P) -> Result<()> {
    let items = ctx.p.chunks().len() * ctx.p.v_heads();
    if items == 0 {
        return Ok(());
    }
    let params = params.with(ctx.t.chunks, Shape::of(ctx.p));
    let launch = cfg(items, P::THREADS, 0);
    // SAFETY: the caller's.
    unsafe {
        ctx.dev
            .launch(P::KERNEL, Some(ctx.p.chunk_size()), launch, &params)
    }
}

/// i64 of a size (every size fits: [`Problem`] bounds element counts by `isize::MAX / 8`).
pub(crate) fn i(x: usize) -> i64 {
    x as i64
}
