//! The fused GPU prefill: two kernels per forward instead of seven stages, with the products on
//! the tensor cores and the arithmetic still exact to f32 rounding (TF32 hi/lo splits, see
//! `kernels/fused/mma.cuh`).
//!
//! - `chunk_intra` (one block per chunk and value head): gate, cumsum, l2norm as row scalings,
//!   `A_strict`, its inverse, the masked and decayed `q k^T` block, and the row scalings the
//!   second kernel needs. It writes 132 f32 per token and value head into the workspace.
//! - `chunk_recurrent` (one block per sequence, value head and tile of state columns): the state
//!   tile stays on chip across the sequence's chunks; per chunk `v_new`, the output and the
//!   state update.
//!
//! Non-finite inputs keep [`crate::forward`]'s promise: the first token of a chunk whose k, v,
//! g or beta is not finite ends the part of the chunk computed as usual; the outputs from it on
//! and the state leaving the chunk are NaN (see the kernels' headers).
//!
//! Environment knobs (for measurements): `DELTANET_FUSED=0` takes the stage path, the
//! [`Tuning`] variables choose kernel variants, `DELTANET_FUSED_ONLY=intra|recurrent` launches
//! one kernel alone (to split the time; results then wrong).
//!
//! The stage path (`crate::chunk_forward`) stays the reference; [`supported`] says when this
//! one applies, and [`crate::Backend::forward`] of [`CudaDevice`] takes it then.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaFunction, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::registry::{lock, nvrtc_available};
use super::{cuda_err, dtype_code, Buf, CudaDevice};
use crate::backend::StageInputs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::forward::ForwardOut;
use crate::options::Options;
use crate::problem::Problem;
use crate::RESET_LOG_DECAY;

pub mod offline;

/// The chunk size the fused kernels are written for.
pub const CHUNK: usize = 64;
/// The largest key and value dimensions compiled (as constants) into the fused kernels.
pub const MAX_DIM: usize = 256;
const THREADS: u32 = 256;
/// 4-byte words per token and value head in the workspace: `a_inv` and `p` rows (64 f32 each,
/// or three bf16 planes of 64 each) and four f32 row scalings.
const WS_PER_ROW: usize = 2 * (3 * CHUNK / 2) + 4;

use super::registry::COMMON;
const MMA: &str = include_str!("../kernels/fused/mma.cuh");
const INTRA: &str = include_str!("../kernels/fused/chunk_intra.cu");
const RECURRENT: &str = include_str!("../kernels/fused/chunk_recurrent.cu");
const RECURRENT_REGS: &str = include_str!("../kernels/fused/chunk_recurrent_regs.cu");

/// The fused kernels: `chunk_intra` and one of the two recurrent kernels per forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `chunk_intra.cu`.
    ChunkIntra,
    /// `chunk_recurrent.cu`: the state tile in shared memory, TF32 products; every input dtype
    /// and K up to 256.
    ChunkRecurrent,
    /// `chunk_recurrent_regs.cu`: the state in registers, bf16 products on split operands; bf16
    /// inputs with K up to 128.
    ChunkRecurrentRegs,
}

impl Kernel {
    /// Every fused kernel.
    pub const ALL: [Kernel; 3] = [
        Kernel::ChunkIntra,
        Kernel::ChunkRecurrent,
        Kernel::ChunkRecurrentRegs,
    ];

    /// The function's (and the source file's) name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::ChunkIntra => "chunk_intra",
            Kernel::ChunkRecurrent => "chunk_recurrent",
            Kernel::ChunkRecurrentRegs => "chunk_recurrent_regs",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Kernel::ChunkIntra => INTRA,
            Kernel::ChunkRecurrent => RECURRENT,
            Kernel::ChunkRecurrentRegs => RECURRENT_REGS,
        }
    }
}

/// The compile-time constants of one fused module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// Key dimension K.
    pub dk: usize,
    /// Value dimension V.
    pub dv: usize,
    /// State columns per block of the recurrent kernel: 16 or 32 (`chunk_recurrent`), 16 per
    /// warp up to 128 (`chunk_recurrent_regs`).
    pub vt: usize,
    /// The dtype q, k and v are read in.
    pub dtype: DType,
    /// Tensor cores (true) or the same tile products in plain f32 FMA (a cross-check).
    pub mma: bool,
    /// Stage buffers of `chunk_recurrent`: 2 overlaps the next chunk's loads with this one's
    /// products, where shared memory allows.
    pub nbuf: usize,
    /// `chunk_recurrent` with 16 warps, shared state fragments and two accumulator chains
    /// (needs `vt == 32`).
    pub wide: bool,
    /// `chunk_recurrent_regs` (and `chunk_intra` writing split `a_inv` and `p` for it) instead
    /// of `chunk_recurrent`: bf16 inputs, K <= 128 only.
    pub regs: bool,
    /// bf16 pieces per f32 operand in `chunk_recurrent_regs` (and the `a_inv`, `p` planes):
    /// 3 exact, 1 or 2 fast.
    pub pieces: usize,
    /// `chunk_recurrent_regs` with a second warp per 16 columns forming the output beside the
    /// state warp (`SPLIT_OUT`).
    pub split: bool,
    /// The element type the recurrent kernel writes `o` in.
    pub out: DType,
    /// With `split`: two state warps per 16 columns, each over half of K (`KSPLIT = 2`).
    pub ksplit: bool,
    /// With `split`: the state in two shared-memory buffers (`HBUF = 2`), so that the state
    /// warps' update need not wait for the output warps' Q H^T.
    pub hbuf: bool,
    /// The plain `chunk_recurrent_regs` with two stage buffers of every row but the `a_inv`
    /// and `p` planes, which have one, refilled once the chunk's output is formed
    /// (`LATE_PLANES`): how the exact 128-column kernel double-buffers in the shared memory.
    pub late_planes: bool,
    /// `chunk_recurrent_regs` skipping, in a chunk shorter than 64 rows, the 16-row blocks
    /// past its end (`ROW_SKIP`: the chunk step built a second time, for the short last chunk).
    pub row_skip: bool,
    /// The plain `chunk_recurrent_regs` with K H^T, Q H^T and the update as warpgroup products
    /// (`WGMMA`: wgmma, compiled for `sm_90a`; Hopper only).
    pub wgmma: bool,
    /// With `wgmma`: the triangular products (`a_inv`, `p`) as warpgroup products too (`WG_TRI`).
    pub wg_tri: bool,
    /// `chunk_intra` takes the row norms from the diagonals of `K K^T` and `Q Q^T` on the
    /// tensor cores instead of a phase of element-wise sums (`INTRA_DIAG`; with `regs` only:
    /// where it writes f32 rows, its 64 registers would spill).
    pub intra_diag: bool,
    /// `chunk_intra` forms the blocks of `A_inv` below the diagonal by doubling (16 x 16, then
    /// 32 x 32 halves) instead of block rows (`INTRA_DOUBLING`; with `regs` only, as above).
    pub intra_doubling: bool,
    /// With `intra_doubling`: the doubling's products on the tensor cores (three TF32 passes)
    /// instead of f32 FMAs (`INTRA_DOUBLING_MMA`).
    pub intra_doubling_mma: bool,
    /// With `wg_tri` and `intra_diag`: `p` formed in the recurrent kernel from the q and k it
    /// stages (a warpgroup product), not by `chunk_intra` through the workspace (`P_IN_REC`):
    /// q is read once a forward, and `chunk_intra` forms no `Q K^T`.
    pub p_in_rec: bool,
    /// `chunk_intra`'s blocks an SM that its register budget is compiled for
    /// (`__launch_bounds__(256, INTRA_BLOCKS)`: 64 registers a thread at 4).
    pub intra_blocks: u32,
    /// `chunk_recurrent_regs`'s registers a thread at most (`__maxnreg__(REC_REGS)`), or 0 for
    /// the compiler's choice under `__launch_bounds__(threads, 1)` (up to 255).
    pub rec_regs: u32,
}

impl Config {
    fn defines(&self) -> String {
        let in_t = dtype_code(self.dtype);
        format!(
            "#define DK {}\n#define DV {}\n#define VT {}\n#define IN_T {}\n#define FUSED_MMA {}\n\
             #define NBUF {}\n#define FUSED_WIDE {}\n#define RTHREADS {}\n#define PLANES {}\n#define PIECES {}\n\
             #define SPLIT_OUT {}\n#define OUT_T {}\n#define KSPLIT {}\n#define HBUF {}\n#define LATE_PLANES {}\n\
             #define ROW_SKIP {}\n#define WGMMA {}\n#define WG_TRI {}\n#define INTRA_DIAG {}\n\
             #define INTRA_DOUBLING {}\n#define INTRA_DOUBLING_MMA {}\n#define P_IN_REC {}\n#define INTRA_BLOCKS {}\n#define REC_REGS {}\n",
            self.dk,
            self.dv,
            self.vt,
            in_t,
            i32::from(self.mma),
            self.nbuf,
            i32::from(self.wide),
            self.threads(Kernel::ChunkRecurrent),
            i32::from(self.regs),
            self.pieces,
            i32::from(self.split),
            dtype_code(self.out),
            if self.ksplit { 2 } else { 1 },
            if self.hbuf { 2 } else { 1 },
            i32::from(self.late_planes),
            i32::from(self.row_skip),
            i32::from(self.wgmma),
            i32::from(self.wg_tri),
            i32::from(self.intra_diag),
            i32::from(self.intra_doubling),
            i32::from(self.intra_doubling_mma),
            i32::from(self.p_in_rec),
            self.intra_blocks,
            self.rec_regs,
        )
    }

    /// The target its kernels compile for on a GPU of `arch` (`sm_90`): `sm_90a` with `wgmma`.
    pub fn target(&self, arch: &str) -> String {
        if self.wgmma {
            format!("{arch}a")
        } else {
            arch.to_string()
        }
    }

    /// The recurrent kernel this configuration runs.
    pub fn recurrent(&self) -> Kernel {
        if self.regs {
            Kernel::ChunkRecurrentRegs
        } else {
            Kernel::ChunkRecurrent
        }
    }

    /// The two kernels of a forward with this configuration.
    pub fn kernels(&self) -> [Kernel; 2] {
        [Kernel::ChunkIntra, self.recurrent()]
    }

    /// Bytes of one `a_inv` (or `p`) row in the workspace: 64 f32, or three bf16 planes of 64.
    fn row_bytes(&self) -> usize {
        if self.regs {
            self.pieces * CHUNK * 2
        } else {
            CHUNK * 4
        }
    }

    /// Threads per block of `kernel`.
    pub fn threads(&self, kernel: Kernel) -> u32 {
        match kernel {
            Kernel::ChunkRecurrent if self.wide => 512,
            Kernel::ChunkRecurrentRegs => {
                2 * self.vt as u32 * (u32::from(self.split) + if self.ksplit { 2 } else { 1 })
            }
            _ => THREADS,
        }
    }

    fn in_bytes(&self) -> usize {
        self.dtype.size()
    }

    /// Dynamic shared memory of `kernel`, in bytes (mirrors the carving in the `.cu` files).
    pub fn shared_bytes(&self, kernel: Kernel) -> usize {
        let sk = self.dk + if self.in_bytes() == 4 { 4 } else { 8 };
        let sc = CHUNK + 4;
        let qk = 2 * CHUNK * sk * self.in_bytes();
        match kernel {
            // The 16 bytes: the first non-finite row's slot (and the rows' 16-byte alignment).
            // A_strict and A_inv share the memory of the staged q and k rows.
            Kernel::ChunkIntra => (3 * 256 + 7 * CHUNK) * 4 + 16 + qk.max(2 * CHUNK * sc * 4),
            Kernel::ChunkRecurrent => {
                let sv = self.vt + 8;
                let stage = qk + 2 * CHUNK * sc * 4 + CHUNK * sv * self.in_bytes() + CHUNK * 16;
                (self.dk * sv + 2 * CHUNK * sv) * 4 + 16 + self.nbuf * stage
            }
            Kernel::ChunkRecurrentRegs => {
                // With `wgmma` the K and Q rows are unpadded (the swizzle spreads the banks).
                let sk = self.dk + if self.wgmma { 0 } else { 8 };
                let (spl, svr) = (self.pieces * CHUNK + 8, self.vt + 8);
                // With `wg_tri` the planes are unpadded swizzled atoms (8 KB each).
                let planes = if self.wg_tri {
                    2 * self.pieces * 8192
                } else {
                    2 * CHUNK * spl * 2
                };
                let rows = (2 * CHUNK * sk + CHUNK * svr) * 2 + CHUNK * 16;
                // With `p_in_rec`: four more scalings and scale rq a row, the buffer a
                // multiple of 1024 bytes (the swizzled K of the next one follows).
                let rows = if self.p_in_rec {
                    (rows + CHUNK * 20).next_multiple_of(1024)
                } else {
                    rows
                };
                let stages = if self.late_planes {
                    planes + self.nbuf * rows
                } else {
                    self.nbuf * (planes + rows)
                };
                // Each group's K x 16 f32 state slice after the stage buffers; when split, its
                // v_new^T (64 x 16 f32) and first bad row after those.
                let groups = self.vt / 16;
                let split = if self.split {
                    groups * (CHUNK * 16 * 4 + 4)
                } else {
                    0
                };
                // With the K split, the two halves of KH^T of each group.
                let split = split
                    + if self.ksplit {
                        groups * 2 * CHUNK * 16 * 4
                    } else {
                        0
                    };
                let hbufs = if self.hbuf { 2 } else { 1 };
                stages + hbufs * groups * self.dk * 16 * 4 + split
            }
        }
    }
}

/// Compiles one fused kernel to PTX for `arch` (`sm_90`); needs libnvrtc only, no GPU.
pub fn compile_ptx(kernel: Kernel, arch: &str, cfg: &Config) -> Result<String> {
    compile(kernel, arch, cfg).map(|p| p.to_src())
}

fn compile(kernel: Kernel, arch: &str, cfg: &Config) -> Result<Ptx> {
    if !nvrtc_available() {
        return Err(Error::CudaUnavailable("libnvrtc cannot be loaded".into()));
    }
    let text = format!("{}{COMMON}\n{MMA}\n{}", cfg.defines(), kernel.text());
    let arch = &cfg.target(arch);
    let opts = CompileOptions {
        options: offline::options(arch, &[]),
        name: Some(format!("{}.cu", kernel.name())),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(text, opts).map_err(|e| {
        let log = match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        };
        Error::Compile {
            kernel: kernel.name().to_string(),
            arch: arch.to_string(),
            log,
        }
    })
}

/// The configurations `deltanet kernels` and the compilation test build: K = V = 128 in every
/// input dtype, the widest (256) and a narrow (64) one in f32 and bf16, both state tile widths.
pub fn standard_configs() -> Vec<Config> {
    let config = |dk, dv, vt, dtype, nbuf, wide| Config {
        dk,
        dv,
        vt,
        dtype,
        mma: true,
        nbuf,
        wide,
        regs: false,
        pieces: 3,
        split: false,
        out: DType::F32,
        ksplit: false,
        hbuf: false,
        late_planes: false,
        row_skip: false,
        wgmma: false,
        wg_tri: false,
        intra_diag: false,
        intra_doubling: false,
        intra_doubling_mma: false,
        p_in_rec: false,
        intra_blocks: INTRA_BLOCKS,
        rec_regs: 0,
    };
    let mut v = Vec::new();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let nbuf = if dtype == DType::F32 { 1 } else { 2 };
        v.push(config(128, 128, 16, dtype, nbuf, false));
        v.push(config(128, 128, 32, dtype, nbuf, false));
        v.push(config(128, 128, 32, dtype, nbuf, true));
    }
    for (dk, dv) in [(256, 256), (64, 64)] {
        for dtype in [DType::F32, DType::BF16] {
            v.push(config(dk, dv, 32, dtype, 1, false));
        }
    }
    for (dk, vt, pieces, split) in [
        (128, 32, 3, false),
        (128, 128, 3, false),
        (64, 64, 3, false),
        (128, 32, 1, false),
        (128, 128, 1, false),
        (128, 32, 3, true),
        (128, 64, 3, true),
    ] {
        v.push(Config {
            regs: true,
            pieces,
            split,
            ..config(dk, 128, vt, DType::BF16, 2, false)
        });
    }
    // The exact 128-column plain kernel as it runs: one buffer of the planes, two of the rest;
    // and with short chunks' row blocks skipped, as both precisions run varlen.
    for row_skip in [false, true] {
        v.push(Config {
            regs: true,
            late_planes: true,
            row_skip,
            ..config(128, 128, 128, DType::BF16, 2, false)
        });
    }
    v.push(Config {
        regs: true,
        pieces: 1,
        row_skip: true,
        ..config(128, 128, 128, DType::BF16, 2, false)
    });
    // The warpgroup products (sm_90 only: `offline::all_modules` leaves them out elsewhere), in
    // both precisions, with the triangular products on them (as they run) and on mma.sync.
    for wg_tri in [false, true] {
        v.push(Config {
            regs: true,
            late_planes: true,
            wgmma: true,
            wg_tri,
            out: DType::BF16,
            ..config(128, 128, 128, DType::BF16, 2, false)
        });
        v.push(Config {
            regs: true,
            pieces: 1,
            wgmma: true,
            wg_tri,
            out: DType::BF16,
            ..config(128, 128, 128, DType::BF16, 2, false)
        });
    }
    // chunk_intra with the row norms from the products' diagonals and the inverse by doubling
    // (where it writes planes): both precisions as they run, the doubling's products on FMAs and
    // on the tensor cores, and p formed in the recurrent kernel (with two warpgroups, 128
    // columns, and with one); then K = 64.
    for (pieces, vt, intra_doubling_mma, p_in_rec) in [
        (1, 128, false, false),
        (1, 128, true, false),
        (3, 128, false, false),
        (3, 128, true, false),
        (1, 128, true, true),
        (3, 128, true, true),
        (1, 64, true, true),
    ] {
        v.push(Config {
            regs: true,
            pieces,
            late_planes: pieces == 3,
            wgmma: true,
            wg_tri: true,
            out: DType::BF16,
            intra_diag: true,
            intra_doubling: true,
            intra_doubling_mma,
            p_in_rec,
            ..config(128, 128, vt, DType::BF16, 2, false)
        });
    }
    v.push(Config {
        regs: true,
        intra_diag: true,
        intra_doubling: true,
        ..config(64, 128, 64, DType::BF16, 2, false)
    });
    // Both precisions' 128-column kernels capped at 192 registers a thread (`rec_regs`), and
    // chunk_intra compiled for five blocks an SM (`intra_blocks`): the tunings whose registers
    // and spills the offline modules show.
    for pieces in [1, 3] {
        v.push(Config {
            regs: true,
            pieces,
            late_planes: true,
            wgmma: true,
            wg_tri: true,
            out: DType::BF16,
            intra_diag: true,
            intra_doubling: true,
            intra_doubling_mma: true,
            p_in_rec: pieces == 3,
            intra_blocks: 5,
            rec_regs: 192,
            ..config(128, 128, 128, DType::BF16, 2, false)
        });
    }
    // o written in bf16 by both recurrent kernels.
    v.push(Config {
        out: DType::BF16,
        ..config(128, 128, 32, DType::BF16, 2, true)
    });
    v.push(Config {
        regs: true,
        split: true,
        out: DType::BF16,
        ..config(128, 128, 32, DType::BF16, 2, false)
    });
    v.push(Config {
        regs: true,
        split: true,
        ksplit: true,
        ..config(128, 128, 32, DType::BF16, 2, false)
    });
    // Two state buffers (fast: one piece; exact with the K split needs one stage buffer).
    v.push(Config {
        regs: true,
        split: true,
        pieces: 1,
        hbuf: true,
        ..config(128, 128, 32, DType::BF16, 2, false)
    });
    v.push(Config {
        regs: true,
        split: true,
        ksplit: true,
        hbuf: true,
        ..config(128, 128, 32, DType::BF16, 1, false)
    });
    v
}

/// Whether the fused path computes this problem (else the stage path does): chunk size 64,
/// K and V multiples of 16 up to 256, and shared memory for both kernels on this GPU.
pub fn supported(dev: &CudaDevice, p: &Problem, opts: &Options) -> bool {
    if std::env::var("DELTANET_FUSED").is_ok_and(|v| v == "0") {
        return false;
    }
    if !shaped_for(p, opts) {
        return false;
    }
    // f32 inputs need the most shared memory; every tuning falls back to what fits there.
    let cfg = config(dev, p, opts, DType::F32, &Tuning::default());
    cfg.kernels()
        .iter()
        .all(|&k| cfg.shared_bytes(k) <= dev.max_shared_per_block())
}

/// [`supported`], as an error naming what the fused path needs.
fn require_supported(dev: &CudaDevice, p: &Problem, opts: &Options) -> Result<()> {
    if supported(dev, p, opts) {
        return Ok(());
    }
    Err(Error::invalid(
        "options",
        "a problem the fused path supports (chunk size 64, K and V multiples of 16 up to 256)",
        format!(
            "chunk size {}, K = {}, V = {}",
            opts.chunk_size,
            p.dk(),
            p.dv()
        ),
    ))
}

/// The device-independent part of [`supported`]: chunk size 64, K and V multiples of 16 up to
/// 256.
pub fn shaped_for(p: &Problem, opts: &Options) -> bool {
    let (dk, dv) = (p.dk(), p.dv());
    opts.chunk_size == CHUNK && dk % 16 == 0 && dv % 16 == 0 && dk <= MAX_DIM && dv <= MAX_DIM
}

/// Workspace of [`forward`], in bytes: per token and value head, `a_inv` and `p` rows (64 f32
/// each, or 192 bf16 each for `chunk_recurrent_regs`) and four f32 row scalings; per chunk and
/// value head, one f32 (its total log-decay, for segments); per sequence, segment, value head
/// and state column, two i32 (non-finite marks of a segment's leaving state).
pub fn workspace_bytes(p: &Problem) -> usize {
    let marks = p.num_seqs().min(MAX_SEGMENTED_SEQS) * MAX_SEGMENTS * 2 * p.dv();
    (p.tokens() * WS_PER_ROW + p.chunks().len() + marks) * p.v_heads() * 4
}

/// Choices of the fused kernels that change their speed, not their results (beyond rounding).
/// The default chooses automatically; a choice that does not apply to the problem (a tile width
/// that does not divide V, two buffers that do not fit) is ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// State columns per `chunk_recurrent` block: 16 or 32.
    pub vt: Option<usize>,
    /// Stage buffers of `chunk_recurrent`: 1 or 2.
    pub nbuf: Option<usize>,
    /// The 16-warp `chunk_recurrent` (32 state columns); by default taken with 32 columns.
    pub wide: Option<bool>,
    /// The tile products in plain f32 FMA instead of the tensor cores (a cross-check).
    pub fma: bool,
    /// `chunk_recurrent_regs` where it applies (bf16 inputs, K <= 128); by default taken there
    /// in both precisions.
    pub regs: Option<bool>,
    /// bf16 pieces per f32 operand there (1..=3); by default 3, or 1 with
    /// [`crate::Precision::Fast`].
    pub pieces: Option<usize>,
    /// The split `chunk_recurrent_regs` (an output warp beside each state warp); by default
    /// taken where the plain kernel's blocks would hold fewer than 128 columns.
    pub split: Option<bool>,
    /// With the split kernel, two state warps per 16 columns over halves of K (K a multiple of
    /// 32); off by default.
    pub ksplit: Option<bool>,
    /// With the split kernel, the state in two shared-memory buffers (no wait of the state
    /// warps for the output warps' Q H^T); off by default (measured on an H200, NOTES-GPU.md
    /// call AR: 0.6 % faster in fast, 1.6 % in exact without the K split, which the exact
    /// default does not use), and ignored where it does not fit beside the stage buffers.
    pub hbuf: Option<bool>,
    /// Segments per sequence in `chunk_recurrent_regs` (context parallelism inside the card):
    /// 0 or 1 never; n forces up to n segments of at least one chunk wherever the kernel
    /// applies (a test knob). By default chosen from the SM count where the blocks of whole
    /// sequences would not fill the GPU, with segments of at least 16 chunks.
    pub segments: Option<usize>,
    /// The plain `chunk_recurrent_regs` with one buffer of the `a_inv` and `p` planes and two
    /// of the other rows. By default where two whole stage buffers do not fit (the exact
    /// 128-column kernel); `Some(false)` gives one buffer of everything there instead.
    pub late_planes: Option<bool>,
    /// At most this many blocks a launch (a test knob): each block then runs several items,
    /// which one block an item never does.
    pub max_blocks: Option<usize>,
    /// `chunk_recurrent_regs` with short chunks (a sequence's last) skipping their empty row
    /// blocks; by default in the plain kernel where 2 % or more of the chunks are short.
    pub row_skip: Option<bool>,
    /// The plain `chunk_recurrent_regs` on warpgroup products (wgmma) where it applies (an
    /// sm_90 GPU, K a multiple of 64, 64 or 128 columns a block); by default there.
    pub wgmma: Option<bool>,
    /// With the warpgroup products: the triangular ones (`a_inv`, `p`) on them too; by default
    /// (as fast as on `mma.sync` within 0.2 % on an H100, and the exact kernel without the
    /// register spills it has otherwise: NOTES-GPU.md, call BR).
    pub wg_tri: Option<bool>,
    /// `chunk_intra`'s row norms from the products' diagonals (`Config::intra_diag`); by
    /// default (NOTES-GPU.md, calls BV and CA).
    pub intra_diag: Option<bool>,
    /// `chunk_intra`'s inverse below the diagonal by doubling (`Config::intra_doubling`); by
    /// default.
    pub intra_doubling: Option<bool>,
    /// With the doubling: its products on the tensor cores (`Config::intra_doubling_mma`); by
    /// default (NOTES-GPU.md, call CA: chunk_intra 11 % faster in the fast precision, 3 % in
    /// the exact one, on an H100).
    pub intra_doubling_mma: Option<bool>,
    /// `p` formed in the recurrent kernel (`Config::p_in_rec`) where the warpgroup products run
    /// (every recurrent launch of the forward on them); by default in the exact precision.
    pub p_in_rec: Option<bool>,
    /// `chunk_intra`'s blocks an SM compiled for (`Config::intra_blocks`: 3 to 5); by default 4.
    pub intra_blocks: Option<u32>,
    /// `chunk_recurrent_regs`'s registers a thread at most (`Config::rec_regs`: 128 to 255); by
    /// default the compiler's choice.
    pub rec_regs: Option<u32>,
    /// Groups of sequences pipelined over two streams (2..=8; off by default): chunk_intra of
    /// group g + 1 beside the recurrent kernel of group g, where their blocks can share the SMs
    /// (see [`pipeline_groups`]; whole sequences only, not with segments). It sets both
    /// kernels' preferred shared-memory carve-out to the largest, which their later launches
    /// in the process keep.
    pub groups: Option<usize>,
}

impl Tuning {
    /// From the environment: `DELTANET_FUSED_VT`, `DELTANET_FUSED_NBUF`,
    /// `DELTANET_FUSED_WIDE=0|1`, `DELTANET_FUSED_MMA=0`, `DELTANET_FUSED_REGS=0|1`,
    /// `DELTANET_FUSED_PIECES`, `DELTANET_FUSED_SPLIT=0|1`, `DELTANET_FUSED_KSPLIT=0|1`,
    /// `DELTANET_FUSED_HBUF=0|1`, `DELTANET_FUSED_SEGMENTS`, `DELTANET_FUSED_LATE=0|1`,
    /// `DELTANET_FUSED_BLOCKS`, `DELTANET_FUSED_ROWSKIP=0|1`, `DELTANET_FUSED_WGMMA=0|1`,
    /// `DELTANET_FUSED_WGTRI=0|1`, `DELTANET_FUSED_INTRADIAG=0|1`, `DELTANET_FUSED_DOUBLING=0|1`,
    /// `DELTANET_FUSED_DOUBLINGMMA=0|1`, `DELTANET_FUSED_PINREC=0|1`,
    /// `DELTANET_FUSED_INTRABLOCKS`, `DELTANET_FUSED_RECREGS`, `DELTANET_FUSED_GROUPS`.
    pub fn from_env() -> Tuning {
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
        let flag = |k: &str| {
            std::env::var(k).ok().and_then(|v| match v.as_str() {
                "0" => Some(false),
                "1" => Some(true),
                _ => None,
            })
        };
        Tuning {
            vt: num("DELTANET_FUSED_VT"),
            nbuf: num("DELTANET_FUSED_NBUF"),
            wide: flag("DELTANET_FUSED_WIDE"),
            fma: std::env::var("DELTANET_FUSED_MMA").is_ok_and(|v| v == "0"),
            regs: flag("DELTANET_FUSED_REGS"),
            pieces: num("DELTANET_FUSED_PIECES"),
            split: flag("DELTANET_FUSED_SPLIT"),
            ksplit: flag("DELTANET_FUSED_KSPLIT"),
            hbuf: flag("DELTANET_FUSED_HBUF"),
            segments: num("DELTANET_FUSED_SEGMENTS"),
            late_planes: flag("DELTANET_FUSED_LATE"),
            max_blocks: num("DELTANET_FUSED_BLOCKS"),
            row_skip: flag("DELTANET_FUSED_ROWSKIP"),
            wgmma: flag("DELTANET_FUSED_WGMMA"),
            wg_tri: flag("DELTANET_FUSED_WGTRI"),
            intra_diag: flag("DELTANET_FUSED_INTRADIAG"),
            intra_doubling: flag("DELTANET_FUSED_DOUBLING"),
            intra_doubling_mma: flag("DELTANET_FUSED_DOUBLINGMMA"),
            p_in_rec: flag("DELTANET_FUSED_PINREC"),
            intra_blocks: num("DELTANET_FUSED_INTRABLOCKS")
                .and_then(|b: usize| u32::try_from(b).ok()),
            rec_regs: num("DELTANET_FUSED_RECREGS").and_then(|b: usize| u32::try_from(b).ok()),
            groups: num("DELTANET_FUSED_GROUPS"),
        }
    }
}

fn config(dev: &CudaDevice, p: &Problem, opts: &Options, dtype: DType, tuning: &Tuning) -> Config {
    if let Some(cfg) = regs_config(dev, p, opts, dtype, tuning) {
        return cfg;
    }
    let dv = p.dv();
    let fits = |vt: usize| dv % vt == 0;
    // Measured on an H200 (NOTES-GPU.md): a chunk step of one block takes ~8 us with 16
    // columns, ~12 us with 32 on 8 warps and ~12 us on 16 warps (the wide kernel). So 16-column
    // tiles win while their blocks fit in one wave, and the wide kernel from there on (it beat
    // every other variant at T=2048..65536, B=1 and 8, HV=32).
    let narrow_fits_one_wave = p.num_seqs() * p.v_heads() * (dv / 16) <= sm_count(dev);
    let mut vt = if fits(32) && !narrow_fits_one_wave {
        32
    } else {
        16
    };
    match tuning.vt {
        Some(t @ (16 | 32)) if fits(t) => vt = t,
        _ => {}
    }
    let wide = fits(32) && tuning.wide.unwrap_or(vt == 32);
    if wide {
        vt = 32;
    }
    let mut cfg = Config {
        dk: p.dk(),
        dv,
        vt,
        dtype,
        mma: !tuning.fma,
        nbuf: if tuning.nbuf == Some(1) { 1 } else { 2 },
        wide,
        regs: false,
        pieces: 3,
        split: false,
        out: DType::F32,
        ksplit: false,
        hbuf: false,
        late_planes: false,
        row_skip: false,
        wgmma: false,
        wg_tri: false,
        intra_diag: false,
        intra_doubling: false,
        intra_doubling_mma: false,
        p_in_rec: false,
        intra_blocks: intra_blocks(tuning),
        rec_regs: 0,
    };
    // Fit the recurrent kernel's shared memory: one stage buffer first, then 16-column tiles.
    if cfg.shared_bytes(Kernel::ChunkRecurrent) > dev.max_shared_per_block() {
        cfg.nbuf = 1;
    }
    if cfg.shared_bytes(Kernel::ChunkRecurrent) > dev.max_shared_per_block() && cfg.vt == 32 {
        cfg.vt = 16;
        cfg.wide = false;
    }
    cfg
}

/// The `chunk_recurrent_regs` configuration where it applies and is not turned off: bf16
/// inputs, K <= 128, tensor cores. Columns per block: 16 per warp, the most warps (up to 8)
/// whose blocks still number about one per SM or more (its shared memory holds one block per
/// SM; fewer, wider blocks share each chunk's staged rows among more warps).
fn regs_config(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    dtype: DType,
    tuning: &Tuning,
) -> Option<Config> {
    regs_config_for(dev, p, p.num_seqs(), opts, dtype, tuning)
}

/// [`regs_config`] for blocks over `seqs` runs of chunks (the problem's sequences, or their
/// segments).
fn regs_config_for(
    dev: &CudaDevice,
    p: &Problem,
    seqs: usize,
    opts: &Options,
    dtype: DType,
    tuning: &Tuning,
) -> Option<Config> {
    let (dk, dv) = (p.dk(), p.dv());
    if dtype != DType::BF16 || dk > 128 || tuning.fma || tuning.regs == Some(false) {
        return None;
    }
    let fits = |vt: usize| vt % 16 == 0 && vt <= 128 && dv % vt == 0;
    let sms = sm_count(dev);
    // The widest tile (up to `widest` columns) whose blocks still number about one per SM.
    let pick = |widest: usize| {
        [128, 64, 32, 16]
            .into_iter()
            .find(|&vt| vt <= widest && fits(vt) && 10 * seqs * p.v_heads() * (dv / vt) >= 9 * sms)
            .unwrap_or(16)
    };
    // Measured on an H200 (NOTES-GPU.md, versions 7 and 8): with blocks of 8 warps (B=8 HV=32,
    // 128 columns) the plain kernel is fastest (exact 6.35 ms at T=8192; split 7.16); with
    // fewer sequences (B=1 HV=32: 32 columns, two warps per block) the split kernel is (exact
    // 4.91 ms at T=32768 against 6.77 plain and 5.5 for chunk_recurrent; fast 3.05 against
    // 3.87). So the split kernel is taken where the plain one's blocks would be narrower than
    // 128 columns. Its blocks have two warps per 16 columns: at most 64 columns (8 warps) keep
    // 255 registers a thread.
    let mut vt = pick(128);
    let split = tuning.split.unwrap_or(vt < 128);
    let pieces = match tuning.pieces {
        Some(n @ 1..=3) => n,
        _ if opts.precision == crate::Precision::Fast => 1,
        _ => 3,
    };
    // The K split (two state warps over halves of K: K a multiple of 32) makes blocks of three
    // warps per 16 columns: at most 32 columns keep 255 registers a thread. Measured on an H200
    // (NOTES-GPU.md, calls AA and AB): exact 1.7-2 % faster at B=1 before segments took those
    // shapes (T=32768 3.44 -> 3.38 ms), fast 15 % slower. Off unless asked for: compute-sanitizer
    // racecheck reports hazards in it (and in no other configuration) that the code's barriers
    // appear to order but that are not explained (NOTES-GPU.md, call BG).
    let ksplit = split && dk % 32 == 0 && tuning.ksplit.unwrap_or(false);
    let widest = match (split, ksplit) {
        (_, true) => 32,
        (true, false) => 64,
        _ => 128,
    };
    if split {
        vt = pick(widest);
    }
    if let Some(t) = tuning.vt.filter(|&t| fits(t) && t <= widest) {
        vt = t;
    }
    let mut cfg = Config {
        dk,
        dv,
        vt,
        dtype,
        mma: true,
        nbuf: if tuning.nbuf == Some(1) { 1 } else { 2 },
        wide: false,
        regs: true,
        pieces,
        split,
        out: DType::F32,
        ksplit,
        hbuf: false,
        late_planes: false,
        row_skip: tuning
            .row_skip
            .unwrap_or_else(|| !split && short_chunks_share(p) >= ROW_SKIP_SHARE),
        wgmma: false,
        wg_tri: false,
        // chunk_intra's variants by default in both precisions. Measured on an H100, chunk_intra
        // alone at B=8 T=8192 (NOTES-GPU.md, calls BV and CA): fast 0.99 -> 0.885 ms with the
        // diagonals and the doubling on FMAs, 0.79 with the doubling's products on the tensor
        // cores (the forward 5-6 % faster again on the issue shapes); exact 1.149 -> 1.11 with
        // all three (the forward 1.2-2.3 % faster), where without the tensor-core doubling the
        // variants were no faster (1.151 -> 1.164).
        intra_diag: tuning.intra_diag.unwrap_or(true),
        intra_doubling: tuning.intra_doubling.unwrap_or(true),
        intra_doubling_mma: false,
        p_in_rec: false,
        intra_blocks: intra_blocks(tuning),
        rec_regs: tuning
            .rec_regs
            .filter(|r| (128..=255).contains(r))
            .unwrap_or(0),
    };
    cfg.intra_doubling_mma = cfg.intra_doubling && tuning.intra_doubling_mma.unwrap_or(true);
    // The warpgroup products wherever they apply (the plain kernel on an sm_90 GPU; whole
    // chunks: no row skip there). Measured on an H100 (NOTES-GPU.md, call BO): the recurrent
    // kernel 13 % (exact) and 16 % (fast) faster at B=8 T=8192, the forward 8-10 % on the issue
    // shapes it runs, varlen included (where it replaces the row skip). The triangular products
    // on them too: the same speed (call BR, H100: exact B=8 and varlen summed over two rounds
    // 13.343 ms against 13.365) with no spills in the exact kernel (254 registers against 255
    // and 96 bytes of spill stores on mma.sync).
    if tuning.wgmma.unwrap_or(true)
        && !split
        && dev.arch() == "sm_90"
        && dk % 64 == 0
        && (vt == 64 || vt == 128)
    {
        cfg.wgmma = true;
        cfg.row_skip = false;
        cfg.wg_tri = tuning.wg_tri.unwrap_or(true);
    }
    // p formed in the recurrent kernel: measured on an H100 (NOTES-GPU.md, call CD), exact B=8
    // T=8192 3.05 -> 2.96 ms and varlen 3.11 -> 3.08 (chunk_intra writes three planes of p
    // less); fast 1.81 -> 1.91 (chunk_intra alone 0.77 -> 0.64, the recurrent kernel 1.04 ->
    // 1.26: the P epilogue's instructions on each warp's chain), so the exact precision only.
    cfg.p_in_rec = cfg.wg_tri && cfg.intra_diag && tuning.p_in_rec.unwrap_or(pieces == 3);
    let max = dev.max_shared_per_block();
    // Where two whole stage buffers do not fit beside the plain kernel's state (the exact
    // 128-column one), two of every row but the planes, one buffer of those (NOTES-GPU.md, call
    // BC: faster than one buffer of everything); `Tuning::late_planes` forces either. Else one
    // stage buffer where two whole ones do not fit.
    if !split && cfg.nbuf == 2 {
        let whole_fit = cfg.shared_bytes(Kernel::ChunkRecurrentRegs) <= max;
        cfg.late_planes = tuning.late_planes.unwrap_or(!whole_fit);
    }
    if cfg.shared_bytes(Kernel::ChunkRecurrentRegs) > max {
        cfg.nbuf = 1;
        cfg.late_planes = false;
    }
    while cfg.shared_bytes(Kernel::ChunkRecurrentRegs) > max && cfg.vt > 16 {
        cfg.vt /= 2;
    }
    // Two state buffers where asked for and they fit as the rest was chosen.
    if split && tuning.hbuf == Some(true) {
        let with = Config { hbuf: true, ..cfg };
        if with.shared_bytes(Kernel::ChunkRecurrentRegs) <= max {
            cfg = with;
        }
    }
    (cfg.shared_bytes(Kernel::ChunkRecurrentRegs) <= max).then_some(cfg)
}

/// `chunk_intra`'s blocks an SM (its register budget): [`INTRA_BLOCKS`] unless tuned to 3..=5.
fn intra_blocks(tuning: &Tuning) -> u32 {
    tuning
        .intra_blocks
        .filter(|b| (3..=5).contains(b))
        .unwrap_or(INTRA_BLOCKS)
}

/// `chunk_intra`'s blocks an SM by default: 64 registers a thread, no spills; its shared
/// memory would allow five.
pub(crate) const INTRA_BLOCKS: u32 = 4;

/// Share of short chunks (a sequence's last, under 64 rows) from which the plain recurrent
/// kernel skips their empty row blocks by default. Measured on an H100 (NOTES-GPU.md, call BM:
/// varlen 64 sequences, 6 % short chunks): fast 1.5 % faster, exact unchanged; whole chunks run
/// the same code either way. The split kernel's build with the skip is unmeasured: off there.
const ROW_SKIP_SHARE: f64 = 0.02;

/// Share of the problem's chunks shorter than [`CHUNK`] rows.
fn short_chunks_share(p: &Problem) -> f64 {
    let chunks = p.chunks();
    let short = chunks.iter().filter(|c| c.len < CHUNK).count();
    short as f64 / chunks.len().max(1) as f64
}

/// Chunks a segment holds at least by default: its warm-up (a chunk or two where the gates decay
/// fast) is then a few percent of its work.
const MIN_SEG_CHUNKS: usize = 16;
/// Warm-up chunks before a segment at most; a value head that would need more runs whole
/// sequences (by the other launch).
const WARM_MAX_CHUNKS: i64 = 48;
/// The summed log-decay that ends a warm-up: what it leaves out of a segment's entering state is
/// scaled by at most e^-50 (2e-22; see chunk_recurrent_regs.cu).
const WARM_LOG: f32 = -50.0;
/// Segments a sequence at most.
const MAX_SEGMENTS: usize = 8;
/// Sequences a segmented forward holds at most (the workspace keeps marks for that many: more,
/// shorter sequences fill the GPU without segments).
const MAX_SEGMENTED_SEQS: usize = 64;

/// The segmented launch of `chunk_recurrent_regs` where it applies (beside `cfg`, the one over
/// whole sequences): its configuration, the most segments a sequence, the fewest chunks a
/// segment. By default where blocks of 128 columns over whole sequences would leave SMs idle
/// and the segments' blocks are at least 4x wider than `cfg`'s; never with chunk states asked
/// for or over more than [`MAX_SEGMENTED_SEQS`] sequences.
fn segmenting(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    tuning: &Tuning,
    cfg: &Config,
    chunk_states: bool,
) -> Option<(Config, usize, usize)> {
    if !cfg.regs || chunk_states || p.num_seqs() > MAX_SEGMENTED_SEQS {
        return None;
    }
    let longest = (0..p.num_seqs())
        .map(|n| p.seq_chunks(n).len())
        .max()
        .unwrap_or(0);
    let (segments, min_seg) = match tuning.segments {
        Some(0 | 1) => return None,
        Some(n) => (n.min(MAX_SEGMENTS), 1),
        None => {
            let blocks = p.num_seqs() * p.v_heads() * p.dv().div_ceil(128);
            let fill = sm_count(dev) / blocks.max(1);
            (
                fill.min(longest / MIN_SEG_CHUNKS).min(MAX_SEGMENTS),
                MIN_SEG_CHUNKS,
            )
        }
    };
    if segments < 2 || longest < 2 * min_seg {
        return None;
    }
    let seg = regs_config_for(dev, p, p.num_seqs() * segments, opts, cfg.dtype, tuning)?;
    // Measured on an H200 (NOTES-GPU.md, call AV): 128 columns a block in segments against 32
    // over whole sequences gain 10-30 %; 64 against 32 (fast, T=2048) and 128 against 64 (fast,
    // B=2) lose 5 %.
    if tuning.segments.is_none() && seg.vt < 4 * cfg.vt {
        return None;
    }
    Some((
        Config {
            out: cfg.out,
            ..seg
        },
        segments,
        min_seg,
    ))
}

/// Device pointers of one fused forward (`0` for an absent optional one). Inputs in FLA's
/// layouts; q, k, v in `dtype`, every other tensor f32; states K-major `[N, HV, K, V]`.
#[derive(Clone, Copy, Debug)]
pub struct FusedIo {
    /// Element type of q, k, v.
    pub dtype: DType,
    /// `[B, T, H, K]`.
    pub q: u64,
    /// `[B, T, H, K]`.
    pub k: u64,
    /// `[B, T, HV, V]`.
    pub v: u64,
    /// `[B, T, HV]` before activation.
    pub g: u64,
    /// `[B, T, HV]` before activation.
    pub beta: u64,
    /// `[HV]` with `gate_in_kernel`.
    pub a_log: u64,
    /// `[HV]` with `gate_in_kernel`.
    pub dt_bias: u64,
    /// `[N, HV, K, V]` or 0 (zeros).
    pub h0: u64,
    /// `[B, T, HV, V]`, written in `o_dtype`.
    pub o: u64,
    /// Element type of `o` (f32, bf16 or f16; narrowed as it is stored, rounding to nearest).
    pub o_dtype: DType,
    /// `[N, HV, K, V]` or 0, written.
    pub final_state: u64,
    /// `[chunks, HV, K, V]` or 0, written.
    pub chunk_states: u64,
    /// [`workspace_bytes`] bytes.
    pub workspace: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct IntraParams {
    q: u64,
    k: u64,
    g: u64,
    beta: u64,
    a_log: u64,
    dt_bias: u64,
    a_inv: u64,
    p: u64,
    scal: u64,
    chunk_start: u64,
    chunk_len: u64,
    chunk_decay: u64,
    chunks: i64,
    h: i64,
    hv: i64,
    scale: f32,
    beta_mult: f32,
    reset: f32,
    tiled: i32,
    l2norm: i32,
    gate_in_kernel: i32,
    beta_is_logits: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RecParams {
    q: u64,
    k: u64,
    v: u64,
    a_inv: u64,
    p: u64,
    scal: u64,
    h0: u64,
    o: u64,
    final_state: u64,
    chunk_states: u64,
    chunk_start: u64,
    chunk_len: u64,
    seq_first_chunk: u64,
    seqs: i64,
    h: i64,
    hv: i64,
    tiled: i32,
    part: i32,
    chunk_decay: u64,
    nan_cols: u64,
    segments: i64,
    min_seg: i64,
    warm_max: i64,
    warm_log: f32,
    seq_order: u64,
    scale: f32,
    l2norm: i32,
}

// SAFETY: plain #[repr(C)] data mirrored field by field in the .cu files, passed by value.
unsafe impl DeviceRepr for IntraParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for RecParams {}

type FnKey = (usize, &'static str, String, Config);

/// The loaded function for `kernel` in this device's context, compiled on first use. The cache
/// holds the module (and so the context) alive, so a context's address identifies it.
fn function(dev: &CudaDevice, kernel: Kernel, cfg: &Config) -> Result<CudaFunction> {
    static CACHE: OnceLock<Mutex<HashMap<FnKey, CudaFunction>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let ctx = dev.stream().context();
    let key = (
        Arc::as_ptr(ctx) as usize,
        kernel.name(),
        dev.arch().to_string(),
        *cfg,
    );
    if let Some(f) = lock(cache)?.get(&key) {
        return Ok(f.clone());
    }
    let ptx = compile(kernel, dev.arch(), cfg)?;
    let module = ctx
        .load_module(ptx)
        .map_err(cuda_err(format!("loading module {}", kernel.name())))?;
    let f = module
        .load_function(kernel.name())
        .map_err(cuda_err(format!("loading function {}", kernel.name())))?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        i32::try_from(dev.max_shared_per_block()).unwrap_or(i32::MAX),
    )
    .map_err(cuda_err(format!(
        "setting {}'s shared memory",
        kernel.name()
    )))?;
    lock(cache)?.insert(key, f.clone());
    Ok(f)
}

/// One block per item, at most `max_blocks` (a test knob: the kernels' loops over items then
/// give blocks several).
fn grid(items: usize, threads: u32, shared: usize, max_blocks: Option<usize>) -> LaunchConfig {
    let max = max_blocks
        .unwrap_or(super::stages::MAX_BLOCKS)
        .clamp(1, super::stages::MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (items.clamp(1, max) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// The fused forward over device pointers, queued on the device's stream: allocates nothing
/// but the problem's chunk tables (cached per problem), never synchronises. The caller checks
/// [`supported`] and that every pointer holds its tensor.
pub fn forward(dev: &CudaDevice, p: &Problem, opts: &Options, io: &FusedIo) -> Result<()> {
    forward_tuned(dev, p, opts, io, &Tuning::from_env())
}

/// Compiles and loads the kernels [`forward_tuned`] launches for `p` with q, k, v in `dtype` and
/// `o` in `out` (a no-op where the fused path does not take the problem), so that the first
/// forward loads nothing (an engine's [`crate::cuda::Plan`] calls it: the forward may be
/// captured in a CUDA graph).
pub(crate) fn prepare(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    dtype: DType,
    out: DType,
    tuning: &Tuning,
) -> Result<()> {
    if !supported(dev, p, opts) || p.num_seqs() == 0 {
        return Ok(());
    }
    let cfg = Config {
        out,
        ..config(dev, p, opts, dtype, tuning)
    };
    for kernel in cfg.kernels() {
        function(dev, kernel, &cfg)?;
    }
    // The segmented launch where the forward takes it (never with chunk states asked for).
    if let Some((seg_cfg, _, _)) = segmenting(dev, p, opts, tuning, &cfg, false) {
        function(dev, seg_cfg.recurrent(), &seg_cfg)?;
    }
    Ok(())
}

/// [`forward`] with explicit [`Tuning`].
pub fn forward_tuned(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    io: &FusedIo,
    tuning: &Tuning,
) -> Result<()> {
    if p.num_seqs() == 0 {
        return Ok(());
    }
    let t = dev.tables(p)?;
    forward_with_tables(dev, p, opts, io, tuning, t.ptrs())
}

/// [`forward_tuned`] over chunk tables the caller holds (an engine's plan uploads them once, so
/// that a captured forward touches no cache).
pub(crate) fn forward_with_tables(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    io: &FusedIo,
    tuning: &Tuning,
    t: super::stages::TablePtrs,
) -> Result<()> {
    require_supported(dev, p, opts)?;
    // The kernels stage rows with 16-byte copies.
    for (arg, ptr) in [
        ("q", io.q),
        ("k", io.k),
        ("v", io.v),
        ("workspace", io.workspace),
    ] {
        if ptr % 16 != 0 {
            return Err(Error::invalid(
                arg,
                "a device pointer aligned to 16 bytes",
                format!("{ptr:#x}"),
            ));
        }
    }
    let mut cfg = Config {
        out: io.o_dtype,
        ..config(dev, p, opts, io.dtype, tuning)
    };
    let hv = p.v_heads();
    let tokens = p.tokens();
    let chunks = p.chunks().len();
    if p.num_seqs() == 0 {
        return Ok(());
    }
    let stream = dev.stream();
    let rows = (tokens * hv) as u64;
    let a_inv = io.workspace;
    let pbuf = a_inv + rows * cfg.row_bytes() as u64;
    let scal4 = pbuf + rows * cfg.row_bytes() as u64;
    let mut seg = segmenting(dev, p, opts, tuning, &cfg, io.chunk_states != 0);
    // chunk_intra writes p, or its eight scalings a row for p formed later, for every
    // recurrent launch of the forward alike.
    let p_in_rec = cfg.p_in_rec && seg.as_ref().is_none_or(|s| s.0.p_in_rec);
    cfg.p_in_rec = p_in_rec;
    if let Some(s) = seg.as_mut() {
        s.0.p_in_rec = p_in_rec;
    }
    // With p formed later, the scalings' rows (32 bytes) where the p rows would be.
    let scal = if p_in_rec { pbuf } else { scal4 };
    let chunk_decay = if seg.is_some() { scal4 + rows * 16 } else { 0 };
    let nan_cols = if seg.is_some() {
        chunk_decay + (chunks * hv * 4) as u64
    } else {
        0
    };
    // Timing knob: DELTANET_FUSED_ONLY=intra or =recurrent launches one kernel alone (results
    // then wrong), to split the forward's time between the two.
    let only = std::env::var("DELTANET_FUSED_ONLY").unwrap_or_default();
    // The pipelined form (a tuning): groups of sequences, each group's chunk_intra on this
    // stream and its recurrent launch on the second one after it, so that the next group's
    // chunk_intra runs beside it.
    let pipe = tuning
        .groups
        .filter(|g| (2..=8).contains(g) && seg.is_none() && only.is_empty() && chunks > 0)
        .and_then(|g| pipeline_groups(p, g));
    let intra_fn = function(dev, Kernel::ChunkIntra, &cfg)?;
    if pipe.is_some() {
        // Both kernels with the largest shared-memory carve-out, so that an SM running one can
        // take a block of the other (an SM's carve-out changes only when it is idle).
        let rec_fn = function(dev, cfg.recurrent(), &cfg)?;
        for f in [&intra_fn, &rec_fn] {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )
            .map_err(cuda_err("setting the shared-memory carve-out"))?;
        }
    }
    // chunk_intra over `count` chunks of the table from chunk `first`.
    let launch_intra = |first: usize, count: usize| -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let ip = IntraParams {
            q: io.q,
            k: io.k,
            g: io.g,
            beta: io.beta,
            a_log: io.a_log,
            dt_bias: io.dt_bias,
            a_inv,
            p: pbuf,
            scal,
            chunk_start: t.chunks.start + 8 * first as u64,
            chunk_len: t.chunks.len + 8 * first as u64,
            chunk_decay,
            chunks: count as i64,
            h: p.heads() as i64,
            hv: hv as i64,
            scale: opts.scale_for(p.dk()),
            beta_mult: if opts.allow_neg_eigval { 2.0 } else { 1.0 },
            reset: RESET_LOG_DECAY,
            tiled: i32::from(p.head_map() == crate::HeadMap::Tiled),
            l2norm: i32::from(opts.use_qk_l2norm),
            gate_in_kernel: i32::from(opts.gate_in_kernel),
            beta_is_logits: i32::from(opts.beta_is_logits),
        };
        let shared = cfg.shared_bytes(Kernel::ChunkIntra);
        // SAFETY: one by-value argument mirrored in chunk_intra.cu; every pointer holds its
        // tensor (the caller's contract), the chunk table `first + count` entries at least;
        // the shared memory is what the kernel carves.
        unsafe {
            stream.launch_builder(&intra_fn).arg(&ip).launch(grid(
                count * hv,
                THREADS,
                shared,
                tuning.max_blocks,
            ))
        }
        .map(|_| ())
        .map_err(cuda_err("launching chunk_intra"))
    };
    if chunks > 0 && only != "recurrent" && pipe.is_none() {
        launch_intra(0, chunks)?;
    }
    let rp = RecParams {
        q: io.q,
        k: io.k,
        v: io.v,
        a_inv,
        p: pbuf,
        scal,
        h0: io.h0,
        o: io.o,
        final_state: io.final_state,
        chunk_states: io.chunk_states,
        chunk_start: t.chunks.start,
        chunk_len: t.chunks.len,
        seq_first_chunk: t.seq_first_chunk,
        seqs: p.num_seqs() as i64,
        h: p.heads() as i64,
        hv: hv as i64,
        tiled: i32::from(p.head_map() == crate::HeadMap::Tiled),
        part: 0,
        chunk_decay,
        nan_cols,
        segments: 1,
        min_seg: 1,
        warm_max: WARM_MAX_CHUNKS,
        warm_log: WARM_LOG,
        seq_order: t.seq_order,
        scale: opts.scale_for(p.dk()),
        l2norm: i32::from(opts.use_qk_l2norm),
    };
    if only == "intra" {
        return Ok(());
    }
    // items: blocks' work items; shared: false for part 3 (no shared memory); side: on the
    // second stream.
    let launch = |cfg: &Config, rp: &RecParams, items: usize, shared: bool, side: bool| {
        let rec = cfg.recurrent();
        let f = function(dev, rec, cfg)?;
        let shared = if shared { cfg.shared_bytes(rec) } else { 0 };
        let lc = grid(items, cfg.threads(rec), shared, tuning.max_blocks);
        // SAFETY: as for chunk_intra (both recurrent kernels take the same parameters).
        unsafe {
            if side {
                dev.side_stream().launch(&f, lc, rp)
            } else {
                stream
                    .launch_builder(&f)
                    .arg(rp)
                    .launch(lc)
                    .map(|_| ())
                    .map_err(cuda_err(format!("launching {}", rec.name())))
            }
        }
    };
    let (seqs, tiles) = (p.num_seqs(), |c: &Config| p.dv() / c.vt);
    if let Some(groups) = pipe {
        let side = dev.side_stream();
        for g in &groups {
            launch_intra(g.first_chunk, g.chunks)?;
            side.fork_from(stream)?;
            let rp = RecParams {
                seq_order: t.seq_order + 8 * g.first as u64,
                seqs: g.seqs as i64,
                ..rp
            };
            launch(&cfg, &rp, g.seqs * hv * tiles(&cfg), true, true)?;
        }
        return side.join_into(stream);
    }
    match seg {
        None => launch(&cfg, &rp, seqs * hv * tiles(&cfg), true, false),
        Some((seg_cfg, segments, min_seg)) => {
            let rp = RecParams {
                segments: segments as i64,
                min_seg: min_seg as i64,
                ..rp
            };
            // The value heads that run in segments (then their non-finite columns handed on),
            // and beside them, on the second stream, every other one over whole sequences:
            // their blocks share the SMs.
            let side = dev.side_stream();
            side.fork_from(stream)?;
            let items = seqs * segments * hv * tiles(&seg_cfg);
            launch(&seg_cfg, &RecParams { part: 1, ..rp }, items, true, false)?;
            launch(
                &cfg,
                &RecParams { part: 2, ..rp },
                seqs * hv * tiles(&cfg),
                true,
                true,
            )?;
            launch(
                &seg_cfg,
                &RecParams { part: 3, ..rp },
                seqs * segments * hv,
                false,
                false,
            )?;
            side.join_into(stream)
        }
    }
}

/// One group of the pipelined forward ([`pipeline_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    /// Its first entry in the recurrent kernel's sequence order (`TablePtrs::seq_order`).
    pub first: usize,
    /// Its sequences (consecutive in that order and in the problem's).
    pub seqs: usize,
    /// Its first chunk in the chunk table.
    pub first_chunk: usize,
    /// Its chunks (consecutive in the chunk table).
    pub chunks: usize,
}

/// The pipelined forward's groups: `g` runs of the recurrent kernel's sequence order (longest
/// first, ties in order, as `upload_tables` makes it) with about equal chunk counts, each also a
/// run of consecutive sequences (so its chunks are a run of the chunk table, which chunk_intra
/// takes); `None` where the order does not allow that (sequences of several lengths out of
/// order) or fewer than two groups would hold chunks.
pub(crate) fn pipeline_groups(p: &Problem, g: usize) -> Option<Vec<Group>> {
    let n = p.num_seqs();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(p.seq_chunks(s).len()));
    let total: usize = (0..n).map(|s| p.seq_chunks(s).len()).sum();
    let mut groups = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, &s) in order.iter().enumerate() {
        acc += p.seq_chunks(s).len();
        let cut = (groups.len() + 1) * total;
        if acc * g >= cut || i + 1 == n {
            let run = &order[start..=i];
            if run.windows(2).any(|w| w[1] != w[0] + 1) {
                return None;
            }
            let chunks = p.seq_chunks(run[0]).start..p.seq_chunks(run[run.len() - 1]).end;
            groups.push(Group {
                first: start,
                seqs: run.len(),
                first_chunk: chunks.start,
                chunks: chunks.len(),
            });
            start = i + 1;
        }
    }
    (groups.iter().filter(|g| g.chunks > 0).count() >= 2).then_some(groups)
}

/// [`forward`] on f32 device buffers (the [`crate::Backend`] path), allocating the outputs and
/// the workspace.
pub(crate) fn forward_bufs(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    x: &StageInputs<Buf>,
) -> Result<ForwardOut<Buf>> {
    forward_bufs_tuned(dev, p, opts, x, &Tuning::from_env())
}

/// The fused forward on f32 device buffers (as [`crate::Backend::forward`] takes it where
/// [`supported`]) with explicit [`Tuning`], allocating the outputs and the workspace.
pub fn forward_bufs_tuned(
    dev: &CudaDevice,
    p: &Problem,
    opts: &Options,
    x: &StageInputs<Buf>,
    tuning: &Tuning,
) -> Result<ForwardOut<Buf>> {
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let n = p.tokens();
    dev.check("q", &x.q, n * p.heads() * dk)?;
    dev.check("k", &x.k, n * p.heads() * dk)?;
    dev.check("v", &x.v, n * hv * dv)?;
    dev.check("g", &x.g, n * hv)?;
    dev.check("beta", &x.beta, n * hv)?;
    if let Some(h0) = &x.h0 {
        dev.check("initial_state", h0, p.num_seqs() * hv * dk * dv)?;
    }
    if opts.gate_in_kernel {
        let (Some(a), Some(d)) = (&x.a_log, &x.dt_bias) else {
            return Err(Error::invalid(
                "a_log",
                "A_log and dt_bias with gate_in_kernel",
                "none",
            ));
        };
        dev.check("a_log", a, hv)?;
        dev.check("dt_bias", d, hv)?;
    }
    let o = dev.uninit(n * hv * dv, "o")?;
    let final_state = dev.uninit(p.num_seqs() * hv * dk * dv, "final_state")?;
    let h = if opts.output_chunk_states {
        Some(dev.uninit(p.chunks().len() * hv * dk * dv, "h")?)
    } else {
        None
    };
    let ws = dev.uninit(workspace_bytes(p) / 4, "the fused workspace")?;
    let stream = dev.stream();
    let ptr = |b: &Buf| {
        if b.is_empty() {
            0
        } else {
            b.device_ptr(stream).0
        }
    };
    // NaN in every f32 and bf16 of the workspace: chunk_intra leaves the blocks of the a_inv and
    // p planes above the diagonal unwritten (no kernel reads them), so a read of one shows in
    // the results of every test that runs through here. A memset, in this allocating path only.
    // SAFETY: `ws` holds workspace_bytes(p) bytes rounded down to whole f32, on this device.
    unsafe { dev.fill_bytes(ptr(&ws), 0xff, ws.len() * 4, "the fused workspace")? };
    let opt = |b: &Option<Buf>| b.as_ref().map_or(0, ptr);
    let io = FusedIo {
        dtype: DType::F32,
        q: ptr(&x.q),
        k: ptr(&x.k),
        v: ptr(&x.v),
        g: ptr(&x.g),
        beta: ptr(&x.beta),
        a_log: opt(&x.a_log),
        dt_bias: opt(&x.dt_bias),
        h0: opt(&x.h0),
        o: ptr(&o),
        o_dtype: DType::F32,
        final_state: ptr(&final_state),
        chunk_states: opt(&h),
        workspace: ptr(&ws),
    };
    forward_tuned(dev, p, opts, &io, tuning)?;
    Ok(ForwardOut { o, h, final_state })
}

/// Multiprocessor count attribute (for the tile-width choice).
pub(crate) fn sm_count(dev: &CudaDevice) -> usize {
    dev.stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_or(132, |n| usize::try_from(n).unwrap_or(132))
}

/// `o` f32, the final state K-major, and the chunk states if asked for.
pub type HostResults = (Vec<f32>, Vec<f32>, Option<Vec<f32>>);

/// A forward's inputs resident on the GPU in their own dtype (q, k, v as 16-bit where given so:
/// no widening pass), with its outputs and workspace: what an engine holds between calls.
/// [`Resident::run`] queues the fused forward only.
pub struct Resident {
    dev: Arc<CudaDevice>,
    p: Problem,
    opts: Options,
    dtype: DType,
    inputs: Vec<cudarc::driver::CudaSlice<u8>>,
    o: Buf,
    final_state: Buf,
    h: Option<Buf>,
    ws: cudarc::driver::CudaSlice<u8>,
    /// The kernel choices [`Resident::run`] uses (from the environment at construction).
    pub tuning: Tuning,
}

impl Resident {
    /// Validates `x`, uploads it (states K-major) and allocates the outputs; `Err` when the
    /// problem is not [`supported`].
    pub fn new(dev: Arc<CudaDevice>, x: &crate::Inputs<'_>, opts: &Options) -> Result<Self> {
        let p = Problem::from_inputs(x, opts)?;
        let (dtype, inputs) = upload_native(&dev, &p, x, opts)?;
        let (o, final_state, h) = outputs(&dev, &p, opts)?;
        let ws = dev.zeros::<u8>(workspace_bytes(&p), "the fused workspace")?;
        Ok(Resident {
            dev,
            p,
            opts: opts.clone(),
            dtype,
            inputs,
            o,
            final_state,
            h,
            ws,
            tuning: Tuning::from_env(),
        })
    }

    /// Queues the fused forward on the device's stream.
    pub fn run(&mut self) -> Result<()> {
        let io = native_io(
            &self.dev,
            self.dtype,
            &self.inputs,
            &self.o,
            &self.final_state,
            self.h.as_ref(),
            &self.ws,
        );
        forward_tuned(&self.dev, &self.p, &self.opts, &io, &self.tuning)
    }

    /// Milliseconds of device time of one [`Resident::run`] (events on the stream).
    pub fn time_ms(&mut self) -> Result<f64> {
        use crate::HostIo;
        let dev = self.dev.clone();
        dev.time_ms(&mut || self.run())
    }

    /// The results of the last run, on the host (waits for it): `o` f32, the final state
    /// K-major, the chunk states if asked for.
    pub fn outputs(&self) -> Result<HostResults> {
        use crate::HostIo;
        Ok((
            self.dev.download(&self.o)?,
            self.dev.download(&self.final_state)?,
            self.h.as_ref().map(|h| self.dev.download(h)).transpose()?,
        ))
    }

    /// The validated problem.
    pub fn problem(&self) -> &Problem {
        &self.p
    }
}

/// `x` uploaded for the fused kernels: q, k, v in their own dtype (which it returns), then g,
/// beta, A_log, dt_bias and the initial state (K-major) as f32; an absent tensor is empty.
fn upload_native(
    dev: &CudaDevice,
    p: &Problem,
    x: &crate::Inputs<'_>,
    opts: &Options,
) -> Result<(DType, Vec<cudarc::driver::CudaSlice<u8>>)> {
    require_supported(dev, p, opts)?;
    let stream = dev.stream().clone();
    let up = |bytes: &[u8], what: &str| -> Result<cudarc::driver::CudaSlice<u8>> {
        if bytes.is_empty() {
            return dev.zeros(0, what);
        }
        stream
            .clone_htod(bytes)
            .map_err(cuda_err(format!("uploading {what}")))
    };
    let raw = |t: &crate::Tensor<'_>, what: &str| -> Result<cudarc::driver::CudaSlice<u8>> {
        match t.data() {
            crate::Data::F32(d) => up(bytemuck::cast_slice(d), what),
            crate::Data::BF16(d) => up(bytemuck::cast_slice(d), what),
            crate::Data::F16(d) => up(bytemuck::cast_slice(d), what),
        }
    };
    let f32s = |t: &crate::Tensor<'_>, what: &str| up(bytemuck::cast_slice(&t.to_f32()), what);
    let dtype = x.q.dtype();
    if x.k.dtype() != dtype || x.v.dtype() != dtype {
        return Err(Error::invalid(
            "k",
            format!("q, k and v of one dtype ({dtype})"),
            format!("k {}, v {}", x.k.dtype(), x.v.dtype()),
        ));
    }
    let mut inputs = vec![
        raw(&x.q, "q")?,
        raw(&x.k, "k")?,
        raw(&x.v, "v")?,
        f32s(&x.g, "g")?,
        f32s(&x.beta, "beta")?,
    ];
    let absent = dev.zeros::<u8>(0, "nothing")?;
    inputs.push(match &x.a_log {
        Some(t) => f32s(t, "A_log")?,
        None => absent.clone(),
    });
    inputs.push(match &x.dt_bias {
        Some(t) => f32s(t, "dt_bias")?,
        None => absent.clone(),
    });
    inputs.push(match &x.initial_state {
        Some(s) if opts.state_v_first => up(
            bytemuck::cast_slice(&crate::host::transpose_states(
                &s.to_f32(),
                p.dk(),
                p.dv(),
                false,
            )),
            "initial_state",
        )?,
        Some(s) => f32s(s, "initial_state")?,
        None => absent,
    });
    Ok((dtype, inputs))
}

/// Device buffers for `o`, the final state and (with `output_chunk_states`) the chunk states.
fn outputs(dev: &CudaDevice, p: &Problem, opts: &Options) -> Result<(Buf, Buf, Option<Buf>)> {
    let (hv, kv) = (p.v_heads(), p.dk() * p.dv());
    let o = dev.uninit(p.tokens() * hv * p.dv(), "o")?;
    let final_state = dev.uninit(p.num_seqs() * hv * kv, "final_state")?;
    let h = if opts.output_chunk_states {
        Some(dev.uninit(p.chunks().len() * hv * kv, "h")?)
    } else {
        None
    };
    Ok((o, final_state, h))
}

/// The addresses of [`upload_native`]'s inputs and of the outputs and workspace (0 where empty).
fn native_io(
    dev: &CudaDevice,
    dtype: DType,
    inputs: &[cudarc::driver::CudaSlice<u8>],
    o: &Buf,
    final_state: &Buf,
    h: Option<&Buf>,
    ws: &cudarc::driver::CudaSlice<u8>,
) -> FusedIo {
    let stream = dev.stream();
    let ptr8 = |b: &cudarc::driver::CudaSlice<u8>| {
        if b.is_empty() {
            0
        } else {
            b.device_ptr(stream).0
        }
    };
    let ptr = |b: &Buf| {
        if b.is_empty() {
            0
        } else {
            b.device_ptr(stream).0
        }
    };
    FusedIo {
        dtype,
        q: ptr8(&inputs[0]),
        k: ptr8(&inputs[1]),
        v: ptr8(&inputs[2]),
        g: ptr8(&inputs[3]),
        beta: ptr8(&inputs[4]),
        a_log: ptr8(&inputs[5]),
        dt_bias: ptr8(&inputs[6]),
        h0: ptr8(&inputs[7]),
        o: ptr(o),
        o_dtype: DType::F32,
        final_state: ptr(final_state),
        chunk_states: h.map_or(0, ptr),
        workspace: ptr8(ws),
    }
}

/// What `crate::forward` runs on a GPU where [`supported`]: inputs uploaded in their own dtype,
/// the fused forward, results left on the device.
pub(crate) fn forward_host(
    dev: &CudaDevice,
    p: &Problem,
    x: &crate::Inputs<'_>,
    opts: &Options,
) -> Result<ForwardOut<Buf>> {
    let (dtype, inputs) = upload_native(dev, p, x, opts)?;
    let (o, final_state, h) = outputs(dev, p, opts)?;
    let ws = dev.zeros::<u8>(workspace_bytes(p), "the fused workspace")?;
    let io = native_io(dev, dtype, &inputs, &o, &final_state, h.as_ref(), &ws);
    forward(dev, p, opts, &io)?;
    Ok(ForwardOut { o, h, final_state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dims, Options};

    /// The pipelined forward's groups cover every sequence once, in the recurrent kernel's
    /// order, each a run of the chunk table; none where lengths are out of order.
    #[test]
    fn pipeline_groups_cover_the_sequences_as_runs_of_the_chunk_table() {
        let opts = Options::default();
        // B = 8 equal sequences of 8192 tokens: two groups of four, four of two.
        let p = Problem::new(Dims::from([8, 8192, 2, 4, 16, 16]), None, &opts).unwrap();
        for g in [2, 4, 8] {
            let groups = pipeline_groups(&p, g).unwrap();
            assert_eq!(groups.len(), g);
            let (mut seq, mut chunk) = (0, 0);
            for gr in &groups {
                assert_eq!((gr.first, gr.first_chunk), (seq, chunk));
                assert_eq!(gr.seqs, 8 / g);
                assert_eq!(gr.chunks, 128 * 8 / g);
                seq += gr.seqs;
                chunk += gr.chunks;
            }
            assert_eq!((seq, chunk), (8, p.chunks().len()));
        }
        // Varlen with lengths decreasing (the order is the problem's): groups; with an empty
        // sequence last, it joins the last group.
        let cu = [0i64, 700, 1300, 1800, 2100, 2100];
        let p = Problem::new(Dims::from([1, 2100, 2, 4, 16, 16]), Some(&cu), &opts).unwrap();
        let groups = pipeline_groups(&p, 2).unwrap();
        assert_eq!(groups.iter().map(|g| g.seqs).sum::<usize>(), 5);
        assert_eq!(
            groups.iter().map(|g| g.chunks).sum::<usize>(),
            p.chunks().len()
        );
        // Lengths out of order: the longest-first order is not the problem's.
        let cu = [0i64, 100, 1300, 1400];
        let p = Problem::new(Dims::from([1, 1400, 2, 4, 16, 16]), Some(&cu), &opts).unwrap();
        assert_eq!(pipeline_groups(&p, 2), None);
        // One sequence: no two groups with chunks.
        let p = Problem::new(Dims::from([1, 4096, 2, 4, 16, 16]), None, &opts).unwrap();
        assert_eq!(pipeline_groups(&p, 2), None);
    }
}
