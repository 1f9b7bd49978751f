//! The interface for inference engines: the forward and the recurrent (decode) step on the
//! engine's stream, reading and writing the engine's device buffers, with intermediates in a
//! workspace the engine provides. The hot path ([`Plan::forward`], [`Plan::recurrent_step`])
//! allocates nothing, uploads nothing and never waits for the host, so it can be captured in a
//! CUDA graph.
//!
//! A [`Plan`] is made once per problem shape (a [`Problem`] and [`Options`]) and input dtype:
//! it validates them, compiles and loads every kernel it may launch, and uploads the problem's
//! chunk and sequence tables into device memory it owns. The forward and the step then only
//! queue work on the device's stream.
//!
//! ```no_run
//! # fn main() -> deltanet::Result<()> {
//! use std::sync::Arc;
//! use cudarc::driver::CudaSlice;
//! use deltanet::cuda::{CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, TokenInputs, Workspace};
//! use deltanet::{DType, Dims, Options, Problem};
//! # let stream: Arc<cudarc::driver::CudaStream> = unimplemented!();
//! # let (q, k, v, mut o): (CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>, CudaSlice<u16>) = unimplemented!();
//! # let (g, beta, mut state): (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>) = unimplemented!();
//! let dev = Arc::new(CudaDevice::from_stream(stream.clone())?);
//! let dims = Dims { batch: 1, seq_len: 128, heads: 2, v_heads: 4, dk: 64, dv: 64 };
//! let opts = Options::default();
//! let plan = Plan::new(dev, &Problem::new(dims, None, &opts)?, &opts, DType::BF16)?;
//! let mut ws = stream.alloc_zeros::<u8>(plan.forward_workspace_bytes()).unwrap();
//! let inputs = TokenInputs::new(
//!     DeviceRef::new(&q, DType::BF16)?,
//!     DeviceRef::new(&k, DType::BF16)?,
//!     DeviceRef::new(&v, DType::BF16)?,
//!     DeviceRef::new(&g, DType::F32)?,
//!     DeviceRef::new(&beta, DType::F32)?,
//! );
//! let io = ForwardIo::new(inputs, DeviceMut::new(&mut o, DType::BF16)?, DeviceMut::new(&mut state, DType::F32)?);
//! plan.forward(io, Workspace::new(&mut ws))?;
//! # Ok(())
//! # }
//! ```
//!
//! Memory rules: every buffer lives in the device's CUDA context; the work is queued on the
//! device's stream and ordered only by it, so buffers written on other streams must be ready
//! before (as for any kernel an engine queues). Outputs must not overlap inputs or each other,
//! except that `final_state` may be `initial_state` itself (the state is then advanced in
//! place). The workspace must not be used by anything else until the queued work is done.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use super::registry::Kernel;
use super::stages::{
    cast, chunk_output, chunk_state, cumsum, gate, kkt, l2norm, launch_per_chunk, recurrent,
    solve_tril, wy, Ctx, GammaPtrs,
};
use super::{decode, fused, CudaDevice, Tables};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// Alignment of every workspace region, and of the workspace itself, in bytes (what
/// `cuMemAlloc` and PyTorch's allocator give).
pub const WORKSPACE_ALIGN: usize = 256;

/// A read-only view of `len` elements of `dtype` in device memory the caller owns.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRef<'a> {
    ptr: CUdeviceptr,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a ()>,
}

/// A writable view of `len` elements of `dtype` in device memory the caller owns.
#[derive(Debug)]
pub struct DeviceMut<'a> {
    ptr: CUdeviceptr,
    len: usize,
    dtype: DType,
    _borrow: PhantomData<&'a mut ()>,
}

fn element_size<T>(dtype: DType) -> Result<()> {
    if std::mem::size_of::<T>() != dtype.size() {
        return Err(Error::invalid(
            "dtype",
            format!(
                "{dtype} ({} bytes, the buffer's element size)",
                dtype.size()
            ),
            format!("elements of {} bytes", std::mem::size_of::<T>()),
        ));
    }
    Ok(())
}

/// What both view types share.
macro_rules! view {
    ($view:ident) => {
        impl $view<'_> {
            /// Memory of another runtime (`tensor.data_ptr()`, `tensor.numel()`).
            ///
            /// # Safety
            /// `ptr` addresses `len` elements of `dtype` in the device's context that stay
            /// allocated, and are not used by others, while the work queued with the view runs.
            pub unsafe fn from_raw(ptr: CUdeviceptr, len: usize, dtype: DType) -> Self {
                $view {
                    ptr,
                    len,
                    dtype,
                    _borrow: PhantomData,
                }
            }
            /// The device address.
            pub fn ptr(&self) -> CUdeviceptr {
                self.ptr
            }
            /// Elements.
            pub fn len(&self) -> usize {
                self.len
            }
            /// Whether the view has no elements.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
            /// The element type.
            pub fn dtype(&self) -> DType {
                self.dtype
            }
        }
    };
}
view!(DeviceRef);
view!(DeviceMut);

impl<'a> DeviceRef<'a> {
    /// A cudarc buffer or view read as elements of `dtype` (`f32` as F32; `u16` or `half` types
    /// as BF16 or F16); `Err` when the element sizes differ. The address is taken now: where the
    /// context tracks events, make views before a graph capture begins.
    pub fn new<T, S: DevicePtr<T>>(s: &'a S, dtype: DType) -> Result<Self> {
        element_size::<T>(dtype)?;
        let (ptr, _) = s.device_ptr(s.stream());
        // SAFETY: the buffer holds s.len() elements of the same size and is borrowed for 'a.
        Ok(unsafe { DeviceRef::from_raw(ptr, s.len(), dtype) })
    }
}

impl<'a> DeviceMut<'a> {
    /// A cudarc buffer or mutable view written as elements of `dtype` (see [`DeviceRef::new`]).
    pub fn new<T, S: DevicePtrMut<T>>(s: &'a mut S, dtype: DType) -> Result<Self> {
        element_size::<T>(dtype)?;
        let (len, stream) = (s.len(), s.stream().clone());
        let (ptr, _) = s.device_ptr_mut(&stream);
        // SAFETY: the buffer holds len elements of the same size and is borrowed for 'a.
        Ok(unsafe { DeviceMut::from_raw(ptr, len, dtype) })
    }
}

/// Scratch device memory for the intermediates of one call, `bytes` long, aligned to
/// [`WORKSPACE_ALIGN`].
#[derive(Debug)]
pub struct Workspace<'a> {
    ptr: CUdeviceptr,
    bytes: usize,
    _borrow: PhantomData<&'a mut ()>,
}

impl<'a> Workspace<'a> {
    /// A cudarc byte buffer as the workspace.
    pub fn new(s: &'a mut CudaSlice<u8>) -> Self {
        let (bytes, stream) = (s.len(), s.stream().clone());
        let (ptr, _) = s.device_ptr_mut(&stream);
        Workspace {
            ptr,
            bytes,
            _borrow: PhantomData,
        }
    }

    /// Memory of another runtime (a `torch.empty(n, dtype=torch.uint8)` tensor).
    ///
    /// # Safety
    /// `ptr` addresses `bytes` bytes in the device's context that stay allocated, and are not
    /// used by others, while the work queued with this workspace runs.
    pub unsafe fn from_raw(ptr: CUdeviceptr, bytes: usize) -> Self {
        Workspace {
            ptr,
            bytes,
            _borrow: PhantomData,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The per-token inputs of both calls, FLA's layouts (`B, T` the call's tokens).
#[derive(Clone, Copy, Debug)]
pub struct TokenInputs<'a> {
    /// `[B, T, H, K]`, in the plan's dtype.
    pub q: DeviceRef<'a>,
    /// `[B, T, H, K]`, in the plan's dtype.
    pub k: DeviceRef<'a>,
    /// `[B, T, HV, V]`, in the plan's dtype.
    pub v: DeviceRef<'a>,
    /// `[B, T, HV]` f32 (the raw gate input with `gate_in_kernel`).
    pub g: DeviceRef<'a>,
    /// `[B, T, HV]` f32 (logits with `beta_is_logits`).
    pub beta: DeviceRef<'a>,
    /// `[HV]` f32, with `gate_in_kernel` only.
    pub a_log: Option<DeviceRef<'a>>,
    /// `[HV]` f32, with `gate_in_kernel` only.
    pub dt_bias: Option<DeviceRef<'a>>,
}

impl<'a> TokenInputs<'a> {
    /// The five per-token tensors, without gate parameters.
    pub fn new(
        q: DeviceRef<'a>,
        k: DeviceRef<'a>,
        v: DeviceRef<'a>,
        g: DeviceRef<'a>,
        beta: DeviceRef<'a>,
    ) -> Self {
        TokenInputs {
            q,
            k,
            v,
            g,
            beta,
            a_log: None,
            dt_bias: None,
        }
    }
}

/// The forward's buffers (`N` sequences, `chunks` as in [`Problem::chunks`]).
#[derive(Debug)]
pub struct ForwardIo<'a> {
    /// q, k, v, g, beta and the gate parameters.
    pub inputs: TokenInputs<'a>,
    /// `[N, HV, K, V]` f32, or `None` for zero states.
    pub initial_state: Option<DeviceRef<'a>>,
    /// `[B, T, HV, V]`, written, in `Options::out_dtype` or the plan's dtype.
    pub o: DeviceMut<'a>,
    /// `[N, HV, K, V]` f32, written (always, whatever `output_final_state` says). May be the
    /// memory of `initial_state`.
    pub final_state: DeviceMut<'a>,
    /// `[chunks, HV, K, V]` f32, written: required with `output_chunk_states`, refused without.
    pub chunk_states: Option<DeviceMut<'a>>,
}

impl<'a> ForwardIo<'a> {
    /// From zero states, without chunk states.
    pub fn new(inputs: TokenInputs<'a>, o: DeviceMut<'a>, final_state: DeviceMut<'a>) -> Self {
        ForwardIo {
            inputs,
            initial_state: None,
            o,
            final_state,
            chunk_states: None,
        }
    }
}

/// The recurrent step's buffers.
#[derive(Debug)]
pub struct StepIo<'a> {
    /// q, k, v, g, beta and the gate parameters.
    pub inputs: TokenInputs<'a>,
    /// `[N, HV, K, V]` f32 (`[N, HV, V, K]` with `state_v_first`), advanced in place.
    pub state: DeviceMut<'a>,
    /// `[B, T, HV, V]`, written, in `Options::out_dtype` or the plan's dtype.
    pub o: DeviceMut<'a>,
}

/// One region of the workspace: `bytes` bytes at `offset` from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Region {
    pub offset: usize,
    pub bytes: usize,
}

impl Region {
    fn at(self, base: CUdeviceptr) -> CUdeviceptr {
        base + self.offset as u64
    }
}

/// Lays regions out one after the other, each aligned to [`WORKSPACE_ALIGN`].
#[derive(Default)]
struct Carver {
    end: usize,
}

impl Carver {
    /// A region of `n` f32 (empty, and taking no room, when `n` is 0).
    fn f32s(&mut self, n: usize) -> Region {
        let r = Region {
            offset: self.end,
            bytes: n * 4,
        };
        self.end += (n * 4).next_multiple_of(WORKSPACE_ALIGN);
        r
    }
}

/// Where both calls keep q, k, v in f32, normalised q and k, the effective gate and beta, and o
/// in f32. Regions a configuration does not need are empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Prologue {
    /// q, k, v widened to f32 (16-bit inputs only).
    pub q32: Region,
    pub k32: Region,
    pub v32: Region,
    /// q, k normalised (`use_qk_l2norm` only).
    pub qn: Region,
    pub kn: Region,
    /// The effective gate and beta.
    pub g: Region,
    pub beta: Region,
    /// o in f32 (16-bit outputs only).
    pub o32: Region,
}

impl Prologue {
    fn carve(c: &mut Carver, p: &Problem, opts: &Options, dtype: DType) -> Prologue {
        let n = p.tokens() * p.v_heads();
        let qk = p.tokens() * p.heads() * p.dk();
        let wide = |len: usize| if dtype == DType::F32 { 0 } else { len };
        let norm = |len: usize| if opts.use_qk_l2norm { len } else { 0 };
        let narrow = if out_dtype(opts, dtype) == DType::F32 {
            0
        } else {
            n * p.dv()
        };
        Prologue {
            q32: c.f32s(wide(qk)),
            k32: c.f32s(wide(qk)),
            v32: c.f32s(wide(n * p.dv())),
            qn: c.f32s(norm(qk)),
            kn: c.f32s(norm(qk)),
            g: c.f32s(n),
            beta: c.f32s(n),
            o32: c.f32s(narrow),
        }
    }
}

/// Where the stage path of the forward keeps its intermediates (all f32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ForwardLayout {
    pub prologue: Prologue,
    pub gamma: Region,
    pub lo: Region,
    pub seg: Region,
    pub a_strict: Region,
    pub a_inv: Region,
    pub w: Region,
    pub u: Region,
    /// The chunk states (unless the caller asks for them in `chunk_states`).
    pub h: Region,
    pub v_new: Region,
    /// Total bytes.
    pub bytes: usize,
}

/// Where the recurrent step keeps its intermediates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepLayout {
    pub prologue: Prologue,
    pub bytes: usize,
}

fn out_dtype(opts: &Options, dtype: DType) -> DType {
    opts.out_dtype.unwrap_or(dtype)
}

pub(crate) fn forward_layout(p: &Problem, opts: &Options, dtype: DType) -> ForwardLayout {
    let n = p.tokens() * p.v_heads();
    let mut c = Carver::default();
    let mut l = ForwardLayout {
        prologue: Prologue::carve(&mut c, p, opts, dtype),
        gamma: c.f32s(n),
        lo: c.f32s(n),
        seg: c.f32s(n),
        a_strict: c.f32s(n * p.chunk_size()),
        a_inv: c.f32s(n * p.chunk_size()),
        w: c.f32s(n * p.dk()),
        u: c.f32s(n * p.dv()),
        h: c.f32s(if opts.output_chunk_states {
            0
        } else {
            p.chunks().len() * p.v_heads() * p.state_len()
        }),
        v_new: c.f32s(n * p.dv()),
        bytes: 0,
    };
    l.bytes = c.end;
    l
}

pub(crate) fn step_layout(p: &Problem, opts: &Options, dtype: DType) -> StepLayout {
    let mut c = Carver::default();
    let prologue = Prologue::carve(&mut c, p, opts, dtype);
    StepLayout {
        prologue,
        bytes: c.end,
    }
}

/// Where the fused forward keeps its intermediates: its own workspace (its kernels write `o` in
/// the output dtype themselves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FusedLayout {
    pub fused: Region,
    pub bytes: usize,
}

pub(crate) fn fused_layout(p: &Problem) -> FusedLayout {
    let mut c = Carver::default();
    let fused = c.f32s(fused::workspace_bytes(p) / 4);
    FusedLayout {
        fused,
        bytes: c.end,
    }
}

/// Workspace bytes [`Plan::forward`] needs for this problem, options and input dtype (q, k, v)
/// on any device and at any alignment of q, k and v: enough for the stage path and for the
/// fused one. [`Plan::forward_workspace_bytes`] is the (often much smaller) need of the path a
/// plan takes.
pub fn forward_workspace_bytes(p: &Problem, opts: &Options, dtype: DType) -> usize {
    let stages = forward_layout(p, opts, dtype).bytes;
    if fused::shaped_for(p, opts) {
        stages.max(fused_layout(p).bytes)
    } else {
        stages
    }
}

/// Workspace bytes [`Plan::recurrent_step`] needs for this problem, options and input dtype.
pub fn step_workspace_bytes(p: &Problem, opts: &Options, dtype: DType) -> usize {
    step_layout(p, opts, dtype).bytes
}

/// Checks one view: its dtype, its length, a non-null address when non-empty, and alignment to
/// its element size.
fn check_view(
    arg: &'static str,
    (ptr, len, dtype): (CUdeviceptr, usize, DType),
    want_dtype: DType,
    want_len: usize,
) -> Result<()> {
    if dtype != want_dtype {
        return Err(Error::invalid(
            arg,
            format!("dtype {want_dtype}"),
            format!("dtype {dtype}"),
        ));
    }
    crate::error::check_len(arg, len, want_len)?;
    if len > 0 && ptr == 0 {
        return Err(Error::invalid(arg, "a device address", "a null pointer"));
    }
    if ptr % dtype.size() as u64 != 0 {
        return Err(Error::invalid(
            arg,
            format!("an address aligned to {} bytes", dtype.size()),
            format!("{ptr:#x}"),
        ));
    }
    Ok(())
}

fn check_ref(arg: &'static str, v: &DeviceRef<'_>, dtype: DType, len: usize) -> Result<()> {
    check_view(arg, (v.ptr, v.len, v.dtype), dtype, len)
}

fn check_mut(arg: &'static str, v: &DeviceMut<'_>, dtype: DType, len: usize) -> Result<()> {
    check_view(arg, (v.ptr, v.len, v.dtype), dtype, len)
}

/// The inputs and the output every call has: q, k, v in `dtype`, g and beta f32, the gate
/// parameters exactly when `gate_in_kernel` is on, `o` in the output dtype, and the workspace.
fn check_common(
    p: &Problem,
    opts: &Options,
    dtype: DType,
    (x, o): (&TokenInputs<'_>, &DeviceMut<'_>),
    (ws, ws_bytes): (&Workspace<'_>, usize),
) -> Result<()> {
    let n = p.tokens() * p.v_heads();
    let qk = p.tokens() * p.heads() * p.dk();
    check_ref("q", &x.q, dtype, qk)?;
    check_ref("k", &x.k, dtype, qk)?;
    check_ref("v", &x.v, dtype, n * p.dv())?;
    check_ref("g", &x.g, DType::F32, n)?;
    check_ref("beta", &x.beta, DType::F32, n)?;
    for (arg, t) in [("A_log", &x.a_log), ("dt_bias", &x.dt_bias)] {
        match (t, opts.gate_in_kernel) {
            (Some(_), false) => {
                return Err(Error::invalid(
                    arg,
                    "none unless gate_in_kernel is on",
                    "a buffer",
                ))
            }
            (None, true) => {
                return Err(Error::invalid(
                    arg,
                    format!(
                        "a [HV] = [{}] f32 buffer (gate_in_kernel is on)",
                        p.v_heads()
                    ),
                    "none",
                ))
            }
            (Some(t), true) => check_ref(arg, t, DType::F32, p.v_heads())?,
            (None, false) => {}
        }
    }
    check_mut("o", o, out_dtype(opts, dtype), n * p.dv())?;
    if ws.bytes < ws_bytes {
        return Err(Error::invalid(
            "workspace",
            format!("at least {ws_bytes} bytes"),
            format!("{} bytes", ws.bytes),
        ));
    }
    if ws_bytes > 0 && ws.ptr == 0 {
        return Err(Error::invalid(
            "workspace",
            "a device address",
            "a null pointer",
        ));
    }
    if ws.ptr % WORKSPACE_ALIGN as u64 != 0 {
        return Err(Error::invalid(
            "workspace",
            format!("an address aligned to {WORKSPACE_ALIGN} bytes"),
            format!("{:#x}", ws.ptr),
        ));
    }
    Ok(())
}

/// Validates a forward call against the problem, options and dtype, before anything is queued.
pub(crate) fn check_forward(
    p: &Problem,
    opts: &Options,
    dtype: DType,
    io: &ForwardIo<'_>,
    ws: &Workspace<'_>,
    ws_bytes: usize,
) -> Result<()> {
    if opts.state_v_first {
        return Err(Error::invalid(
            "state_v_first",
            "false: the device-resident forward keeps states [N, HV, K, V]",
            "true",
        ));
    }
    check_common(p, opts, dtype, (&io.inputs, &io.o), (ws, ws_bytes))?;
    let states = p.num_seqs() * p.v_heads() * p.state_len();
    if let Some(s) = &io.initial_state {
        check_ref("initial_state", s, DType::F32, states)?;
    }
    check_mut("final_state", &io.final_state, DType::F32, states)?;
    match (&io.chunk_states, opts.output_chunk_states) {
        (Some(h), true) => {
            let len = p.chunks().len() * p.v_heads() * p.state_len();
            check_mut("chunk_states", h, DType::F32, len)
        }
        (None, true) => Err(Error::invalid(
            "chunk_states",
            "a [chunks, HV, K, V] f32 buffer (output_chunk_states is on)",
            "none",
        )),
        (Some(_), false) => Err(Error::invalid(
            "chunk_states",
            "none unless output_chunk_states is on",
            "a buffer",
        )),
        (None, false) => Ok(()),
    }
}

/// Validates a recurrent step against the problem, options and dtype.
pub(crate) fn check_step(
    p: &Problem,
    opts: &Options,
    dtype: DType,
    io: &StepIo<'_>,
    ws: &Workspace<'_>,
) -> Result<()> {
    let ws_bytes = step_workspace_bytes(p, opts, dtype);
    check_common(p, opts, dtype, (&io.inputs, &io.o), (ws, ws_bytes))?;
    let states = p.num_seqs() * p.v_heads() * p.state_len();
    check_mut("state", &io.state, DType::F32, states)
}

/// A problem shape made ready for the device: validated, its kernels loaded, its tables in
/// device memory the plan owns. Make one per (problem, options, input dtype), outside the hot
/// path and outside any graph capture; then [`Plan::forward`] and [`Plan::recurrent_step`] only
/// queue work.
pub struct Plan {
    dev: Arc<CudaDevice>,
    p: Problem,
    opts: Options,
    dtype: DType,
    tables: Tables,
    forward: ForwardLayout,
    step: StepLayout,
    /// Whether [`Plan::forward`] takes the fused kernels (`fused::supported` when the plan was
    /// made), given q, k and v aligned to 16 bytes.
    fused: bool,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("device", &self.dev.name())
            .field("dims", &self.p.dims())
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Prepares `p` and `opts` with q, k, v in `dtype` on `dev`: compiles and loads the kernels
    /// (NVRTC on first use in the process), and uploads the chunk and sequence tables (a
    /// host-to-device copy on the device's stream).
    pub fn new(dev: Arc<CudaDevice>, p: &Problem, opts: &Options, dtype: DType) -> Result<Plan> {
        opts.validate()?;
        if p.chunk_size() != opts.chunk_size || p.head_map() != opts.head_map {
            return Err(Error::invalid(
                "opts",
                format!(
                    "the options the problem was built with (chunk_size {}, head_map {:?})",
                    p.chunk_size(),
                    p.head_map()
                ),
                format!(
                    "chunk_size {}, head_map {:?}",
                    opts.chunk_size, opts.head_map
                ),
            ));
        }
        // K too large for this GPU's shared memory is refused here, not in the hot path.
        chunk_state::tiling(p, dev.max_shared_per_block())?;
        for kernel in Kernel::ALL {
            dev.function(kernel, Some(p.chunk_size()))?;
        }
        fused::prepare(
            &dev,
            p,
            opts,
            dtype,
            out_dtype(opts, dtype),
            &fused::Tuning::from_env(),
        )?;
        let tables = dev.upload_tables(p)?;
        Ok(Plan {
            fused: fused::supported(&dev, p, opts),
            forward: forward_layout(p, opts, dtype),
            step: step_layout(p, opts, dtype),
            dev,
            p: p.clone(),
            opts: opts.clone(),
            dtype,
            tables,
        })
    }

    /// The device the plan queues work on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The problem the plan is for.
    pub fn problem(&self) -> &Problem {
        &self.p
    }

    /// Workspace bytes [`Plan::forward`] needs with q, k and v aligned to 16 bytes (as every
    /// allocation is): what the path this plan takes on its device uses, the fused kernels'
    /// workspace where they apply (at T = 524288, HV = 32, K = V = 128: 13 GB, where the stage
    /// path's intermediates take 78 GB).
    pub fn forward_workspace_bytes(&self) -> usize {
        if self.fused {
            fused_layout(&self.p).bytes
        } else {
            self.forward.bytes
        }
    }

    /// Workspace bytes [`Plan::forward`] needs whatever the alignment of q, k and v: views not
    /// aligned to 16 bytes take the stage path, whose intermediates are larger. The same as
    /// the free [`forward_workspace_bytes`].
    pub fn forward_workspace_bytes_any_alignment(&self) -> usize {
        forward_workspace_bytes(&self.p, &self.opts, self.dtype)
    }

    /// Workspace bytes [`Plan::recurrent_step`] needs.
    pub fn step_workspace_bytes(&self) -> usize {
        self.step.bytes
    }

    /// What both calls start with: q, k, v as f32 (widened into the workspace when 16-bit),
    /// normalised with `use_qk_l2norm`, and the effective gate and beta. Returns the addresses
    /// of q, k, v, g, beta the next stages read.
    ///
    /// # Safety
    /// `x` and the workspace at `base` were validated against the plan; `l` is its layout.
    unsafe fn prologue(
        &self,
        x: &TokenInputs<'_>,
        base: CUdeviceptr,
        l: &Prologue,
    ) -> Result<[CUdeviceptr; 5]> {
        let (dev, p) = (&*self.dev, &self.p);
        let widen = |x: &DeviceRef<'_>, r: Region| -> Result<CUdeviceptr> {
            if self.dtype == DType::F32 {
                return Ok(x.ptr);
            }
            // SAFETY: x holds x.len elements of the plan's dtype; r holds as many f32.
            unsafe { cast::convert(dev, self.dtype, DType::F32, x.ptr, r.at(base), x.len) }?;
            Ok(r.at(base))
        };
        let (mut q, mut k, v) = (
            widen(&x.q, l.q32)?,
            widen(&x.k, l.k32)?,
            widen(&x.v, l.v32)?,
        );
        if self.opts.use_qk_l2norm {
            let rows = p.tokens() * p.heads();
            // SAFETY: q, k and the regions hold rows * K f32.
            unsafe {
                l2norm::launch(dev, q, l.qn.at(base), rows, p.dk())?;
                l2norm::launch(dev, k, l.kn.at(base), rows, p.dk())?;
            }
            (q, k) = (l.qn.at(base), l.kn.at(base));
        }
        let (g, beta) = (l.g.at(base), l.beta.at(base));
        let params = gate::Params {
            g: x.g.ptr,
            beta: x.beta.ptr,
            a_log: x.a_log.map_or(0, |a| a.ptr),
            dt_bias: x.dt_bias.map_or(0, |d| d.ptr),
            g_out: g,
            beta_out: beta,
            ..Default::default()
        };
        // SAFETY: validated lengths; A_log and dt_bias present exactly with gate_in_kernel.
        unsafe { gate::launch(dev, p, &self.opts, &params) }?;
        Ok([q, k, v, g, beta])
    }

    /// Where `o` is computed in f32: the caller's `o` itself, or the workspace when it is 16-bit
    /// (then [`Plan::epilogue`] narrows it).
    fn o32(&self, o: &DeviceMut<'_>, base: CUdeviceptr, l: &Prologue) -> CUdeviceptr {
        if o.dtype == DType::F32 {
            o.ptr
        } else {
            l.o32.at(base)
        }
    }

    /// Narrows the f32 output at `o32` into a 16-bit `o`.
    ///
    /// # Safety
    /// As [`Plan::prologue`]; `o32` is [`Plan::o32`]'s answer.
    unsafe fn epilogue(&self, o32: CUdeviceptr, o: &DeviceMut<'_>) -> Result<()> {
        // SAFETY: both hold o.len elements (the call was validated); equal addresses only for
        // an f32 o, where nothing is queued.
        unsafe { cast::convert(&self.dev, DType::F32, o.dtype, o32, o.ptr, o.len) }
    }

    /// [`Plan::forward`] on the fused kernels (the caller checked `fused::supported` and the
    /// 16-byte alignment of q, k and v they read with vector loads).
    fn forward_fused(&self, io: &ForwardIo<'_>, workspace: &Workspace<'_>) -> Result<()> {
        let l = fused_layout(&self.p);
        let base = workspace.ptr;
        let x = &io.inputs;
        let fio = fused::FusedIo {
            dtype: self.dtype,
            q: x.q.ptr,
            k: x.k.ptr,
            v: x.v.ptr,
            g: x.g.ptr,
            beta: x.beta.ptr,
            a_log: x.a_log.map_or(0, |a| a.ptr),
            dt_bias: x.dt_bias.map_or(0, |d| d.ptr),
            h0: io.initial_state.as_ref().map_or(0, |h| h.ptr),
            o: io.o.ptr,
            o_dtype: io.o.dtype,
            final_state: io.final_state.ptr,
            chunk_states: io.chunk_states.as_ref().map_or(0, |h| h.ptr),
            workspace: l.fused.at(base),
        };
        let tuning = fused::Tuning::from_env();
        fused::forward_with_tables(
            &self.dev,
            &self.p,
            &self.opts,
            &fio,
            &tuning,
            self.tables.ptrs(),
        )
    }

    /// The decode kernel's view of a step, where it takes it: every sequence `T` tokens long (no
    /// varlen), head dimensions it is compiled for, and the 16-byte alignment of the buffers it
    /// moves in vectors.
    fn decode_shape(&self, io: &StepIo<'_>) -> Option<decode::DecodeShape> {
        let p = &self.p;
        let x = &io.inputs;
        let dense = p.seq_len() > 0
            && p.num_seqs() == p.batch()
            && p.seqs().iter().all(|&(a, b)| b - a == p.seq_len());
        let aligned = [x.q.ptr, x.k.ptr, x.v.ptr, io.o.ptr, io.state.ptr]
            .iter()
            .all(|a| a % 16 == 0);
        (dense && aligned && decode::check_dims(p.dk(), p.dv()).is_ok()).then(|| {
            decode::DecodeShape {
                n: p.batch(),
                t: p.seq_len(),
                h: p.heads(),
                hv: p.v_heads(),
                dk: p.dk(),
                dv: p.dv(),
                pool: p.batch(),
            }
        })
    }

    /// [`Plan::recurrent_step`] as one launch of the decode kernel (activation, l2norm and the
    /// narrowing of `o` inside it), the states a pool of `N` rows in sequence order.
    fn step_decode(&self, shape: &decode::DecodeShape, io: &StepIo<'_>) -> Result<()> {
        let raw = |v: &DeviceRef<'_>| decode::RawArray {
            ptr: v.ptr,
            len: v.len,
            dtype: v.dtype,
        };
        let raw_mut = |v: &DeviceMut<'_>| decode::RawArray {
            ptr: v.ptr,
            len: v.len,
            dtype: v.dtype,
        };
        let x = &io.inputs;
        let b = decode::DecodeBuffers {
            q: raw(&x.q),
            k: raw(&x.k),
            v: raw(&x.v),
            g: raw(&x.g),
            beta: raw(&x.beta),
            a_log: x.a_log.as_ref().map(raw),
            dt_bias: x.dt_bias.as_ref().map(raw),
            pool: raw_mut(&io.state),
            o: raw_mut(&io.o),
            read: None,
            write: None,
            per_token: None,
            token_states: None,
        };
        // SAFETY: every view was validated against the plan (lengths, dtypes, this context);
        // without index arrays each sequence owns its own pool row.
        unsafe { decode::decode_raw(&self.dev, shape, &b, &self.opts) }
    }

    /// The chunked forward: reads `io`'s inputs, writes `o`, `final_state` and, with
    /// `output_chunk_states`, `chunk_states`; intermediates live in `workspace` (at least
    /// [`Plan::forward_workspace_bytes`]). Every argument is checked first (`Err` naming it);
    /// then the work is queued on the device's stream and the call returns without waiting.
    /// States are K-major (`state_v_first` is refused).
    pub fn forward(&self, io: ForwardIo<'_>, workspace: Workspace<'_>) -> Result<()> {
        let (p, opts, dev) = (&self.p, &self.opts, &*self.dev);
        let unaligned = [
            ("q", io.inputs.q.ptr),
            ("k", io.inputs.k.ptr),
            ("v", io.inputs.v.ptr),
        ]
        .into_iter()
        .find(|(_, a)| a % 16 != 0);
        let fused = self.fused && unaligned.is_none();
        let ws_bytes = if fused {
            fused_layout(p).bytes
        } else {
            self.forward.bytes
        };
        // A workspace sized for the fused path, with a view the fused kernels cannot read:
        // name the view, which is what changed the path.
        if let Some((arg, ptr)) = unaligned.filter(|_| self.fused && workspace.bytes < ws_bytes) {
            return Err(Error::invalid(
                arg,
                format!(
                    "an address aligned to 16 bytes (or a workspace of {ws_bytes} bytes, \
                     Plan::forward_workspace_bytes_any_alignment, for the stage path)"
                ),
                format!("{ptr:#x} with a workspace of {} bytes", workspace.bytes),
            ));
        }
        check_forward(p, opts, self.dtype, &io, &workspace, ws_bytes)?;
        if fused {
            return self.forward_fused(&io, &workspace);
        }
        let (base, l) = (workspace.ptr, &self.forward);
        let ctx = Ctx {
            dev,
            p,
            t: self.tables.ptrs(),
        };
        // SAFETY (every block below): each address is a validated caller view or a region of the
        // validated workspace laid out for this plan; `ctx.t` are the plan's tables.
        let [q, k, v, g, beta] = unsafe { self.prologue(&io.inputs, base, &l.prologue) }?;
        let gamma = GammaPtrs {
            gamma: l.gamma.at(base),
            lo: l.lo.at(base),
            seg: l.seg.at(base),
        };
        let (a_strict, a_inv) = (l.a_strict.at(base), l.a_inv.at(base));
        let (w, u, v_new) = (l.w.at(base), l.u.at(base), l.v_new.at(base));
        let h = io.chunk_states.as_ref().map_or(l.h.at(base), |h| h.ptr);
        let o32 = self.o32(&io.o, base, &l.prologue);
        unsafe {
            let params = cumsum::Params {
                g,
                gamma,
                ..Default::default()
            };
            cumsum::launch(&ctx, &params)?;
            let params = kkt::Params {
                k,
                beta,
                gamma,
                a_strict,
                ..Default::default()
            };
            kkt::launch(&ctx, &params)?;
            let params = solve_tril::Params {
                a_strict,
                a_inv,
                ..Default::default()
            };
            solve_tril::launch(&ctx, &params)?;
            let params = wy::Params {
                k,
                v,
                beta,
                gamma,
                a_inv,
                w,
                u,
                ..Default::default()
            };
            launch_per_chunk(&ctx, &params)?;
            let params = chunk_state::Params {
                k,
                w,
                u,
                gamma,
                h0: io.initial_state.map_or(0, |s| s.ptr),
                h,
                v_new,
                final_state: io.final_state.ptr,
                ..Default::default()
            };
            chunk_state::launch(&ctx, &params)?;
            let params = chunk_output::Params {
                q,
                k,
                v_new,
                h,
                gamma,
                o: o32,
                scale: opts.scale_for(p.dk()),
                ..Default::default()
            };
            launch_per_chunk(&ctx, &params)?;
            self.epilogue(o32, &io.o)
        }
    }

    /// The recurrent (decode) step: advances `io.state` in place through the tokens of `io`
    /// and writes `o`; intermediates live in `workspace` (at least
    /// [`Plan::step_workspace_bytes`]). Checked first, then queued without waiting.
    pub fn recurrent_step(&self, io: StepIo<'_>, workspace: Workspace<'_>) -> Result<()> {
        let (p, opts) = (&self.p, &self.opts);
        check_step(p, opts, self.dtype, &io, &workspace)?;
        if let Some(shape) = self.decode_shape(&io) {
            return self.step_decode(&shape, &io);
        }
        let (base, l) = (workspace.ptr, &self.step.prologue);
        // SAFETY (every block below): as in `forward`.
        let [q, k, v, g, beta] = unsafe { self.prologue(&io.inputs, base, l) }?;
        let o32 = self.o32(&io.o, base, l);
        let params = recurrent::Params {
            q,
            k,
            v,
            g,
            beta,
            state: io.state.ptr,
            o: o32,
            scale: opts.scale_for(p.dk()),
            ..Default::default()
        };
        let ctx = Ctx {
            dev: &self.dev,
            p,
            t: self.tables.ptrs(),
        };
        unsafe {
            recurrent::launch(&ctx, opts.state_v_first, &params)?;
            self.epilogue(o32, &io.o)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Dims;

    fn problem(opts: &Options) -> Problem {
        let dims = Dims {
            batch: 1,
            seq_len: 5,
            heads: 1,
            v_heads: 2,
            dk: 4,
            dv: 3,
        };
        Problem::new(dims, None, opts).unwrap()
    }

    fn small() -> Options {
        Options {
            chunk_size: 16,
            ..Options::default()
        }
    }

    /// The regions of a layout, in order.
    fn regions(l: &ForwardLayout) -> Vec<Region> {
        let x = &l.prologue;
        vec![
            x.q32, x.k32, x.v32, x.qn, x.kn, x.g, x.beta, x.o32, l.gamma, l.lo, l.seg, l.a_strict,
            l.a_inv, l.w, l.u, l.h, l.v_new,
        ]
    }

    #[test]
    fn forward_workspace_by_hand() {
        // T = 5 tokens, HV = 2: n = 10 (token, value head) pairs; BT = 16, K = 4, V = 3, one
        // chunk. g, beta, gamma, lo, seg: 40 bytes each, one 256-byte slot each; A_strict and
        // A_inv: 160 floats = 640 bytes, 768 each; w 160 bytes, u 120, h 1 * 2 * 12 * 4 = 96,
        // v_new 120: one slot each.
        let opts = small();
        let p = problem(&opts);
        assert_eq!(
            forward_workspace_bytes(&p, &opts, DType::F32),
            5 * 256 + 2 * 768 + 4 * 256
        );
        // bf16 inputs add q, k (20 floats) and v (30) in f32, and o (30) in f32 for the bf16
        // output: four more slots.
        assert_eq!(
            forward_workspace_bytes(&p, &opts, DType::BF16),
            5 * 256 + 2 * 768 + 4 * 256 + 4 * 256
        );
        // An f32 output of bf16 inputs needs no o32; l2norm adds two slots.
        let o = Options {
            out_dtype: Some(DType::F32),
            use_qk_l2norm: true,
            ..small()
        };
        assert_eq!(
            forward_workspace_bytes(&p, &o, DType::BF16),
            5 * 256 + 2 * 768 + 4 * 256 + 3 * 256 + 2 * 256
        );
        // With output_chunk_states the caller holds h.
        let o = Options {
            output_chunk_states: true,
            ..small()
        };
        assert_eq!(
            forward_workspace_bytes(&p, &o, DType::F32),
            5 * 256 + 2 * 768 + 3 * 256
        );
    }

    #[test]
    fn step_workspace_by_hand() {
        let opts = small();
        let p = problem(&opts);
        // g and beta only.
        assert_eq!(step_workspace_bytes(&p, &opts, DType::F32), 2 * 256);
        // f16: q, k, v and o widened; l2norm: qn, kn.
        let o = Options {
            use_qk_l2norm: true,
            ..small()
        };
        assert_eq!(step_workspace_bytes(&p, &o, DType::F16), 8 * 256);
    }

    #[test]
    fn regions_are_aligned_disjoint_and_within_the_total() {
        for dtype in [DType::F32, DType::BF16] {
            for l2 in [false, true] {
                let opts = Options {
                    use_qk_l2norm: l2,
                    chunk_size: 64,
                    ..Options::default()
                };
                let dims = Dims {
                    batch: 3,
                    seq_len: 77,
                    heads: 2,
                    v_heads: 6,
                    dk: 40,
                    dv: 24,
                };
                let p = Problem::new(dims, None, &opts).unwrap();
                let l = forward_layout(&p, &opts, dtype);
                let mut end = 0;
                for r in regions(&l) {
                    assert_eq!(r.offset % WORKSPACE_ALIGN, 0);
                    assert!(r.offset >= end, "{l:?}");
                    end = r.offset + r.bytes;
                }
                assert!(end <= l.bytes);
                let n = p.tokens() * p.v_heads();
                assert_eq!(l.a_inv.bytes, n * 64 * 4);
                assert_eq!(l.h.bytes, p.chunks().len() * 6 * 40 * 24 * 4);
                assert_eq!(l.prologue.q32.bytes > 0, dtype != DType::F32);
                assert_eq!(l.prologue.kn.bytes > 0, l2);
            }
        }
    }

    /// Views at made-up addresses: only the checks read them.
    fn view(ptr: u64, len: usize, dtype: DType) -> DeviceRef<'static> {
        // SAFETY: never dereferenced (the checks compare numbers).
        unsafe { DeviceRef::from_raw(ptr, len, dtype) }
    }

    fn view_mut(ptr: u64, len: usize, dtype: DType) -> DeviceMut<'static> {
        // SAFETY: as `view`.
        unsafe { DeviceMut::from_raw(ptr, len, dtype) }
    }

    fn io(p: &Problem, dtype: DType) -> ForwardIo<'static> {
        let n = p.tokens() * p.v_heads();
        let qk = p.tokens() * p.heads() * p.dk();
        let states = p.num_seqs() * p.v_heads() * p.state_len();
        let inputs = TokenInputs::new(
            view(0x1000, qk, dtype),
            view(0x2000, qk, dtype),
            view(0x3000, n * p.dv(), dtype),
            view(0x4000, n, DType::F32),
            view(0x5000, n, DType::F32),
        );
        ForwardIo {
            initial_state: Some(view(0x6000, states, DType::F32)),
            ..ForwardIo::new(
                inputs,
                view_mut(0x7000, n * p.dv(), dtype),
                view_mut(0x6000, states, DType::F32),
            )
        }
    }

    fn ws(bytes: usize) -> Workspace<'static> {
        // SAFETY: as `view`.
        unsafe { Workspace::from_raw(0x10_0000, bytes) }
    }

    /// The argument an `Err` names.
    fn arg(r: Result<()>) -> &'static str {
        match r {
            Err(Error::Invalid { arg, .. }) => arg,
            other => panic!("expected an invalid-argument error, got {other:?}"),
        }
    }

    #[test]
    fn forward_checks_name_the_argument() {
        let opts = small();
        let p = problem(&opts);
        let bytes = forward_workspace_bytes(&p, &opts, DType::BF16);
        let check = |x: &ForwardIo<'_>, ws: &Workspace<'_>| {
            check_forward(&p, &opts, DType::BF16, x, ws, bytes)
        };
        // A valid call (final_state may be initial_state's memory).
        check(&io(&p, DType::BF16), &ws(bytes)).unwrap();
        type Spoil = fn(&mut ForwardIo<'static>);
        let spoilt: [(&str, Spoil); 10] = [
            ("q", |x| x.inputs.q = view(0x1000, 19, DType::BF16)),
            ("k", |x| x.inputs.k = view(0x2000, 20, DType::F16)),
            ("v", |x| x.inputs.v = view(0, 30, DType::BF16)),
            ("g", |x| x.inputs.g = view(0x4000, 10, DType::BF16)),
            ("beta", |x| x.inputs.beta = view(0x5001, 10, DType::F32)),
            ("A_log", |x| {
                x.inputs.a_log = Some(view(0x8000, 2, DType::F32))
            }),
            ("o", |x| x.o = view_mut(0x7000, 30, DType::F32)),
            ("initial_state", |x| {
                x.initial_state = Some(view(0x6000, 23, DType::F32))
            }),
            ("final_state", |x| {
                x.final_state = view_mut(0x6000, 25, DType::F32)
            }),
            ("chunk_states", |x| {
                x.chunk_states = Some(view_mut(0xa000, 24, DType::F32))
            }),
        ];
        for (name, spoil) in spoilt {
            let mut x = io(&p, DType::BF16);
            spoil(&mut x);
            assert_eq!(arg(check(&x, &ws(bytes))), name);
        }
        let mut x = io(&p, DType::BF16);
        x.inputs.k = view(0x2000, 20, DType::F16);
        let e = check(&x, &ws(bytes)).unwrap_err();
        assert_eq!(e.to_string(), "k: expected dtype bf16, got dtype f16");
        let x = io(&p, DType::BF16);
        let e = check(&x, &ws(bytes - 1)).unwrap_err();
        assert!(
            e.to_string().starts_with("workspace: expected at least"),
            "{e}"
        );
        // SAFETY: as `view`.
        let misaligned = unsafe { Workspace::from_raw(0x10_0010, bytes) };
        assert_eq!(arg(check(&x, &misaligned)), "workspace");
    }

    #[test]
    fn forward_checks_follow_the_options() {
        let gate = Options {
            gate_in_kernel: true,
            ..small()
        };
        let p = problem(&gate);
        let bytes = forward_workspace_bytes(&p, &gate, DType::F32);
        let x = io(&p, DType::F32);
        assert_eq!(
            arg(check_forward(&p, &gate, DType::F32, &x, &ws(bytes), bytes)),
            "A_log"
        );
        let mut x = io(&p, DType::F32);
        x.inputs.a_log = Some(view(0x8000, 2, DType::F32));
        x.inputs.dt_bias = Some(view(0x9000, 3, DType::F32));
        assert_eq!(
            arg(check_forward(&p, &gate, DType::F32, &x, &ws(bytes), bytes)),
            "dt_bias"
        );
        x.inputs.dt_bias = Some(view(0x9000, 2, DType::F32));
        check_forward(&p, &gate, DType::F32, &x, &ws(bytes), bytes).unwrap();

        let h = Options {
            output_chunk_states: true,
            ..small()
        };
        let bytes = forward_workspace_bytes(&p, &h, DType::F32);
        let mut x = io(&p, DType::F32);
        assert_eq!(
            arg(check_forward(&p, &h, DType::F32, &x, &ws(bytes), bytes)),
            "chunk_states"
        );
        x.chunk_states = Some(view_mut(0xa000, 24, DType::F32));
        check_forward(&p, &h, DType::F32, &x, &ws(bytes), bytes).unwrap();
        assert_eq!(
            arg(check_forward(
                &p,
                &small(),
                DType::F32,
                &x,
                &ws(bytes * 2),
                bytes
            )),
            "chunk_states"
        );

        let vk = Options {
            state_v_first: true,
            ..small()
        };
        let x = io(&p, DType::F32);
        assert_eq!(
            arg(check_forward(
                &p,
                &vk,
                DType::F32,
                &x,
                &ws(bytes * 2),
                bytes
            )),
            "state_v_first"
        );
    }

    #[test]
    fn step_checks_name_the_argument() {
        let opts = Options {
            state_v_first: true,
            out_dtype: Some(DType::F32),
            ..small()
        };
        let p = problem(&opts);
        let bytes = step_workspace_bytes(&p, &opts, DType::F16);
        let step = |state_len: usize, o_dtype: DType| StepIo {
            inputs: TokenInputs::new(
                view(0x1000, 20, DType::F16),
                view(0x2000, 20, DType::F16),
                view(0x3000, 30, DType::F16),
                view(0x4000, 10, DType::F32),
                view(0x5000, 10, DType::F32),
            ),
            state: view_mut(0x6000, state_len, DType::F32),
            o: view_mut(0x7000, 30, o_dtype),
        };
        check_step(&p, &opts, DType::F16, &step(24, DType::F32), &ws(bytes)).unwrap();
        assert_eq!(
            arg(check_step(
                &p,
                &opts,
                DType::F16,
                &step(12, DType::F32),
                &ws(bytes)
            )),
            "state"
        );
        assert_eq!(
            arg(check_step(
                &p,
                &opts,
                DType::F16,
                &step(24, DType::F16),
                &ws(bytes)
            )),
            "o"
        );
        assert_eq!(
            arg(check_step(
                &p,
                &opts,
                DType::BF16,
                &step(24, DType::F32),
                &ws(bytes)
            )),
            "q"
        );
    }
}
