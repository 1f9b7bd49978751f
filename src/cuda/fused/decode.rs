//! The decode kernel (`kernels/fused/decode.cu`): one launch advances N sequences by T tokens,
//! with the l2norm of q and k, the gate and the beta activation in the kernel, and the states in
//! rows of a pool picked by index arrays.
//!
//! Why a kernel of its own: a decode step reads and writes every sequence's state once (64 KiB
//! per head at K = V = 128, f32) and does little arithmetic on it, so it is bound by memory
//! bandwidth. The kernel keeps each state block in registers across the T tokens, moves it in
//! 16-byte vectors, requests every vector of a block at once, and gives every warp one
//! (sequence, value head, tile of `2048 / K` columns), so a single sequence still spreads over
//! many multiprocessors.
//!
//! [`decode_raw`] launches it on the device's stream over caller buffers given by address: no
//! allocation, no host synchronisation (CUDA-graph capturable). [`crate::decode::decode_step`] is
//! the host-level front door.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use crate::cuda::registry::Kernel;
use crate::cuda::{cuda_err, dtype_code, CudaDevice};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::{HeadMap, Options};

/// Warps per block for large launches; one warp per block below [`SMALL_LAUNCH_WARPS`] work
/// items, so that a handful of sequences still reaches every multiprocessor.
const WARPS_PER_BLOCK: usize = 4;
const SMALL_LAUNCH_WARPS: usize = 2048;
/// State rows and columns a lane holds (mirrors ROWS and COLS in the kernel).
const LANE_ROWS: usize = 16;
const LANE_COLS: usize = 4;

/// Mirrors `DecodeParams` in kernels/fused/decode.cu; device pointers as u64.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    a_log: u64,
    dt_bias: u64,
    state: u64,
    o: u64,
    read_idx: u64,
    write_idx: u64,
    token_idx: u64,
    token_states: u64,
    n: i64,
    t: i64,
    h: i64,
    hv: i64,
    dk: i64,
    dv: i64,
    pool: i64,
    scale: f32,
    qkv_dtype: i32,
    g_dtype: i32,
    beta_dtype: i32,
    a_log_dtype: i32,
    dt_bias_dtype: i32,
    out_dtype: i32,
    read_i64: i32,
    write_i64: i32,
    token_i64: i32,
    tiled: i32,
    use_qk_l2norm: i32,
    beta_is_logits: i32,
    allow_neg_eigval: i32,
    gate_in_kernel: i32,
    cache_hints: i32,
}
/// Whether the state vectors are streamed with cache hints (see `ld_state` in decode.cu): on
/// unless `DELTANET_DECODE_HINTS=0` (measured on the H200: N=256 0.337 -> 0.292 ms back to
/// back, NOTES-DECODE.md).
fn cache_hints() -> i32 {
    match std::env::var("DELTANET_DECODE_HINTS").as_deref() {
        Ok("0") => 0,
        _ => 1,
    }
}

/// Whether K = V = 128 steps take `decode_kv_k128_v128` (the head sizes as compile-time
/// constants: a third fewer instructions in its SASS, 168 registers, no spills). Measured on an
/// H200 (NOTES-DECODE.md, call AD): N=256 0.304 -> 0.288 ms, N=1 0.011 -> 0.009, N=64 T=4 0.155
/// -> 0.139; so the default, `DELTANET_DECODE_CONST=0` takes the generic kernel.
fn const_dims() -> bool {
    std::env::var("DELTANET_DECODE_CONST").map_or(true, |v| v != "0")
}

/// The size the kernel's `static_assert` checks.
pub(crate) const PARAMS_BYTES: usize = 224;
const _: () = assert!(std::mem::size_of::<Params>() == PARAMS_BYTES);
// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for Params {}

/// The sizes of one decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences N (slots of the batch, padding included).
    pub n: usize,
    /// Tokens per sequence T.
    pub t: usize,
    /// q/k heads H.
    pub h: usize,
    /// Value heads HV, a multiple of H.
    pub hv: usize,
    /// Key dimension K.
    pub dk: usize,
    /// Value dimension V.
    pub dv: usize,
    /// Rows of the state pool P.
    pub pool: usize,
}

impl DecodeShape {
    /// Elements of one pool row (`HV * K * V`).
    pub fn row_len(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}

/// The kernels' PTX for `arch` (`sm_90`), compiled by NVRTC; needs libnvrtc only, no GPU.
pub fn ptx(arch: &str) -> Result<String> {
    let key = crate::cuda::registry::Key {
        source: crate::cuda::registry::Source::Decode,
        arch: arch.to_string(),
        bt: None,
    };
    Ok(crate::cuda::registry::ptx(&key)?.to_src())
}

/// Whether the kernel handles these head dimensions: K a power of two from 16 to 256, V a
/// multiple of 4. `Err` names the argument otherwise.
pub fn check_dims(dk: usize, dv: usize) -> Result<()> {
    if !(16..=256).contains(&dk) || !dk.is_power_of_two() {
        return Err(Error::invalid(
            "k",
            "K (k.shape[3]) a power of two from 16 to 256 for the CUDA decode kernel",
            format!("K = {dk}"),
        ));
    }
    if dv == 0 || dv % LANE_COLS != 0 {
        return Err(Error::invalid(
            "v",
            "V (v.shape[3]) a multiple of 4 for the CUDA decode kernel",
            format!("V = {dv}"),
        ));
    }
    Ok(())
}

/// A device array given by address: its first element, its length in elements and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawArray {
    /// Device address (`CUdeviceptr`) of the first element.
    pub ptr: u64,
    /// Elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
}

/// A device array of pool-row indices, i32 or i64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawIndices {
    /// Device address of the first index.
    pub ptr: u64,
    /// Indices.
    pub len: usize,
    /// i64 (true) or i32 (false).
    pub wide: bool,
}

/// The buffers of one decode step on the device, by address (see [`decode_raw`]).
#[derive(Clone, Copy, Debug)]
pub struct DecodeBuffers {
    /// `[N, T, H, K]`, f32, bf16 or f16.
    pub q: RawArray,
    /// `[N, T, H, K]`, q's dtype.
    pub k: RawArray,
    /// `[N, T, HV, V]`, q's dtype.
    pub v: RawArray,
    /// `[N, T, HV]`, any dtype: the log decay, or the raw gate input with `gate_in_kernel`.
    pub g: RawArray,
    /// `[N, T, HV]`, any dtype: beta, or its logits with `beta_is_logits`.
    pub beta: RawArray,
    /// `[HV]`, with `gate_in_kernel`.
    pub a_log: Option<RawArray>,
    /// `[HV]`, with `gate_in_kernel`.
    pub dt_bias: Option<RawArray>,
    /// The state pool `[P, HV, K, V]` f32 (`[P, HV, V, K]` with `state_v_first`), read and
    /// written in place.
    pub pool: RawArray,
    /// `[N, T, HV, V]`, written, in any dtype.
    pub o: RawArray,
    /// `[N]`: the row sequence n starts from, negative for a padding slot; `None`: row n.
    pub read: Option<RawIndices>,
    /// `[N]`: the row receiving sequence n's final state, negative for none; `None`: the read row.
    pub write: Option<RawIndices>,
    /// `[N, T]`: the row receiving the state after token t, negative for none.
    pub per_token: Option<RawIndices>,
    /// `[N, T, HV, K, V]` f32 (`[N, T, HV, V, K]` with `state_v_first`): the state after every
    /// token, written.
    pub token_states: Option<RawArray>,
}

fn check_array(arg: &'static str, a: &RawArray, len: usize, dtype: Option<DType>) -> Result<()> {
    crate::error::check_len(arg, a.len, len)?;
    if let Some(d) = dtype {
        if a.dtype != d {
            return Err(Error::invalid(arg, format!("dtype {d}"), a.dtype));
        }
    }
    if len > 0 && a.ptr == 0 {
        return Err(Error::invalid(arg, "a device address", "null"));
    }
    // q, k, v, o and the states are moved in 16-byte vectors (8 bytes for 16-bit types).
    if a.ptr % 16 != 0 {
        return Err(Error::invalid(
            arg,
            "an address aligned to 16 bytes",
            format!("{:#x}", a.ptr),
        ));
    }
    Ok(())
}

fn check_indices(arg: &'static str, a: &Option<RawIndices>, len: usize) -> Result<()> {
    if let Some(a) = a {
        crate::error::check_len(arg, a.len, len)?;
        let align = if a.wide { 8 } else { 4 };
        if len > 0 && (a.ptr == 0 || a.ptr % align != 0) {
            return Err(Error::invalid(
                arg,
                format!("a device address aligned to {align} bytes"),
                format!("{:#x}", a.ptr),
            ));
        }
    }
    Ok(())
}

/// Launches one decode step on `dev`'s stream: every sequence n with `read[n] >= 0` advances
/// its state by its T tokens (see [`DecodeBuffers`] for where states come from and go), and `o`
/// is written for every token (zeros for padding slots). Validates every length, dtype and
/// alignment (an `Err` names the argument); queues the kernel and returns without waiting.
///
/// Options used: `scale`, `use_qk_l2norm`, `beta_is_logits`, `allow_neg_eigval`,
/// `gate_in_kernel`, `state_v_first`, `head_map`.
///
/// # Safety
/// Every address points to device memory of `dev`'s context holding at least the stated
/// elements, valid until the kernel has run; indices lie in `-inf..P`; and no pool row written by
/// one sequence (its write row or read row, its per-token rows) is read or written by another
/// sequence. [`crate::decode::decode_step`] checks the indices on the host; with indices on the
/// device this is the caller's precondition, and breaking it gives undefined results.
pub unsafe fn decode_raw(
    dev: &CudaDevice,
    s: &DecodeShape,
    b: &DecodeBuffers,
    opts: &Options,
) -> Result<()> {
    opts.validate()?;
    check_dims(s.dk, s.dv)?;
    if s.h == 0 || s.hv % s.h != 0 {
        return Err(Error::invalid(
            "v",
            format!("HV a multiple of H = {}", s.h),
            format!("HV = {}", s.hv),
        ));
    }
    let tokens = crate::error::checked_numel("q", &[s.n, s.t])?;
    let qk_len = crate::error::checked_numel("q", &[tokens, s.h, s.dk])?;
    let v_len = crate::error::checked_numel("v", &[tokens, s.hv, s.dv])?;
    let gb_len = crate::error::checked_numel("g", &[tokens, s.hv])?;
    let pool_len = crate::error::checked_numel("state", &[s.pool, s.hv, s.dk, s.dv])?;
    let qkv = b.q.dtype;
    check_array("q", &b.q, qk_len, None)?;
    check_array("k", &b.k, qk_len, Some(qkv))?;
    check_array("v", &b.v, v_len, Some(qkv))?;
    check_array("g", &b.g, gb_len, None)?;
    check_array("beta", &b.beta, gb_len, None)?;
    check_array("state", &b.pool, pool_len, Some(DType::F32))?;
    check_array("o", &b.o, v_len, None)?;
    if opts.gate_in_kernel {
        for (arg, a) in [("A_log", &b.a_log), ("dt_bias", &b.dt_bias)] {
            match a {
                Some(a) => check_array(arg, a, s.hv, None)?,
                None => {
                    return Err(Error::invalid(
                        arg,
                        "a [HV] array (gate_in_kernel is on)",
                        "none",
                    ))
                }
            }
        }
    }
    check_indices("state_indices", &b.read, s.n)?;
    check_indices("out_state_indices", &b.write, s.n)?;
    check_indices("token_state_indices", &b.per_token, tokens)?;
    if b.read.is_none() && s.pool < s.n {
        return Err(Error::invalid(
            "state",
            format!("at least N = {} rows without state_indices", s.n),
            format!("{} rows", s.pool),
        ));
    }
    if let Some(ts) = &b.token_states {
        let len = crate::error::checked_numel("token_states", &[tokens, s.hv, s.dk, s.dv])?;
        check_array("token_states", ts, len, Some(DType::F32))?;
    }
    let items = s.n * s.hv * s.dv.div_ceil(2048 / s.dk);
    if items == 0 || s.t == 0 {
        return Ok(());
    }
    let p = Params {
        q: b.q.ptr,
        k: b.k.ptr,
        v: b.v.ptr,
        g: b.g.ptr,
        beta: b.beta.ptr,
        a_log: b.a_log.map_or(0, |a| a.ptr),
        dt_bias: b.dt_bias.map_or(0, |a| a.ptr),
        state: b.pool.ptr,
        o: b.o.ptr,
        read_idx: b.read.map_or(0, |a| a.ptr),
        write_idx: b.write.map_or(0, |a| a.ptr),
        token_idx: b.per_token.map_or(0, |a| a.ptr),
        token_states: b.token_states.map_or(0, |a| a.ptr),
        n: s.n as i64,
        t: s.t as i64,
        h: s.h as i64,
        hv: s.hv as i64,
        dk: s.dk as i64,
        dv: s.dv as i64,
        pool: s.pool as i64,
        scale: opts.scale_for(s.dk),
        qkv_dtype: dtype_code(qkv),
        g_dtype: dtype_code(b.g.dtype),
        beta_dtype: dtype_code(b.beta.dtype),
        a_log_dtype: b.a_log.map_or(0, |a| dtype_code(a.dtype)),
        dt_bias_dtype: b.dt_bias.map_or(0, |a| dtype_code(a.dtype)),
        out_dtype: dtype_code(b.o.dtype),
        read_i64: b.read.map_or(0, |a| i32::from(a.wide)),
        write_i64: b.write.map_or(0, |a| i32::from(a.wide)),
        token_i64: b.per_token.map_or(0, |a| i32::from(a.wide)),
        tiled: i32::from(opts.head_map == HeadMap::Tiled),
        use_qk_l2norm: i32::from(opts.use_qk_l2norm),
        beta_is_logits: i32::from(opts.beta_is_logits),
        allow_neg_eigval: i32::from(opts.allow_neg_eigval),
        gate_in_kernel: i32::from(opts.gate_in_kernel),
        cache_hints: cache_hints(),
    };
    let kernel = if opts.state_v_first {
        Kernel::DecodeVk
    } else if s.dk == 128 && s.dv == 128 && const_dims() {
        Kernel::DecodeKv128
    } else {
        Kernel::DecodeKv
    };
    let f = dev.function(kernel, None)?;
    let warps = if items < SMALL_LAUNCH_WARPS {
        1
    } else {
        WARPS_PER_BLOCK
    };
    // Two buffers of q and k (K floats each) per warp.
    let shared = warps * 4 * s.dk * 4;
    let cfg = LaunchConfig {
        grid_dim: (items.div_ceil(warps).min(1 << 22) as u32, 1, 1),
        block_dim: ((32 * warps) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    debug_assert_eq!(LANE_ROWS * 32 * LANE_COLS, 2048);
    // SAFETY: the params struct matches the kernel's; the caller vouches for the addresses.
    unsafe { dev.stream().launch_builder(&f).arg(&p).launch(cfg) }
        .map_err(cuda_err(format!("launching {}", kernel.name())))?;
    Ok(())
}
