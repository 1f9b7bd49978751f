//! The CUDA backend: every stage as a kernel compiled at run time by NVRTC for the device's own
//! architecture (see [`registry`]), on one stream of one GPU. libcuda and libnvrtc are loaded
//! dynamically, so the crate builds and runs without them; [`CudaDevice::new`] then fails with
//! [`Error::CudaUnavailable`].
//!
//! Rooms: `stages/` is the stage-by-stage path (one kernel per stage, the reference the fast
//! paths are tested against), `kernels/` holds the `.cu` sources, [`registry`] compiles them, and
//! [`engine`] is the interface for inference engines: the forward and the decode step on the
//! caller's stream, over the caller's buffers and workspace, with nothing allocated and no host
//! synchronisation in the hot path.
//!
//! Through [`crate::Backend`] every stage allocates its outputs and queues its kernels on the
//! device's stream; nothing in the forward waits for the host. Buffers are flat f32 arrays in the
//! layouts of [`crate::Backend`].

mod backend;
#[path = "fused/decode.rs"]
pub mod decode;
pub mod engine;
pub mod fused;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod registry;
pub(crate) mod stages;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUdeviceptr, CUfunction_attribute, CUstream};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError,
    LaunchConfig, ValidAsZeroBits,
};

use crate::error::{Error, Result};
use crate::problem::Problem;
pub use engine::{
    forward_workspace_bytes, step_workspace_bytes, DeviceMut, DeviceRef, ForwardIo, Plan, StepIo,
    TokenInputs, Workspace, WORKSPACE_ALIGN,
};
use registry::{lock, Kernel, KernelParams, Key};
use stages::{ChunkTable, TablePtrs};

/// A flat f32 buffer on the GPU.
pub type Buf = CudaSlice<f32>;

/// How many problems' device tables are kept for the [`crate::Backend`] path (a forward uses
/// one; a test may alternate a few). [`Plan`]s own their tables.
const TABLE_CACHE: usize = 8;

/// A problem's chunk and sequence tables on the device, as i64 (see [`TablePtrs`]).
#[derive(Debug)]
pub(crate) struct Tables {
    /// The device memory `ptrs` points into: chunk starts, chunk lengths, each sequence's first
    /// chunk, each sequence's first token, the sequences longest first.
    _memory: [CudaSlice<i64>; 5],
    /// Their addresses.
    ptrs: TablePtrs,
}

impl Tables {
    /// The tables' addresses, valid while `self` lives.
    pub(crate) fn ptrs(&self) -> TablePtrs {
        self.ptrs
    }
}

/// One NVIDIA GPU as the backend sees it: a CUDA context, the stream all work is queued on, the
/// architecture and the kernels loaded into the context.
///
/// [`CudaDevice::new`] opens a GPU with a stream of its own; [`CudaDevice::from_stream`] and
/// [`CudaDevice::from_raw_stream`] run on a stream an engine already has (candle's, PyTorch's
/// current stream), creating and synchronising no stream of their own.
///
/// Buffers given to its [`crate::Backend`] methods must belong to its CUDA context (any stream
/// of it: buffers an engine made on the same stream are accepted). Work is queued on the
/// device's stream only; where the context tracks events (cudarc's default, as in candle) that
/// stream waits for a buffer's pending writes on other streams, and where it does not (a
/// [`CudaDevice::new`] device) ordering such writes first is the caller's job.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    arch: String,
    gpu_name: String,
    max_shared: usize,
    functions: Mutex<HashMap<(Kernel, Option<usize>), CudaFunction>>,
    tables: Mutex<Vec<(Problem, Arc<Tables>)>>,
    side: SideStream,
}

/// A second stream of the device's context (at the highest priority) and two events that order
/// it against the main stream, made with the device (never while a graph is being captured). Kept as raw driver
/// handles: a cudarc stream would switch the context to cudarc's multi-stream mode, whose
/// per-buffer events an engine's own buffers would then pay for. Only kernels over raw pointers
/// run on it, between a fork and a join, so that a captured graph holds both branches.
pub(crate) struct SideStream {
    ctx: Arc<CudaContext>,
    stream: cudarc::driver::sys::CUstream,
    fork: cudarc::driver::sys::CUevent,
    join: cudarc::driver::sys::CUevent,
}

// SAFETY: the handles are the driver's, usable from any thread with the context bound (each
// method binds it); recording and waiting on them from several threads at once only orders
// work later than asked (each wait sees a record at or after its own).
unsafe impl Send for SideStream {}
// SAFETY: as above.
unsafe impl Sync for SideStream {}

impl SideStream {
    fn new(ctx: &Arc<CudaContext>) -> std::result::Result<SideStream, cudarc::driver::DriverError> {
        use cudarc::driver::{result, sys};
        ctx.bind_to_thread()?;
        // The highest priority: what runs on it is the longer branch (whole sequences beside
        // segments), and without it the two launches overlapped in only some runs (NOTES-GPU.md,
        // calls AX and AY).
        let (_, greatest) = result::stream::get_priority_range()?;
        let stream = result::stream::create_with_priority(
            result::stream::StreamKind::NonBlocking,
            greatest,
        )?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let fork = result::event::create(flags)?;
        let join = result::event::create(flags)?;
        Ok(SideStream {
            ctx: ctx.clone(),
            stream,
            fork,
            join,
        })
    }

    /// The side stream waits for everything queued on `main` so far.
    pub(crate) fn fork_from(&self, main: &CudaStream) -> Result<()> {
        use cudarc::driver::{result, sys};
        let err = |e| cuda_err("ordering the second stream after the first")(e);
        self.ctx.bind_to_thread().map_err(&err)?;
        // SAFETY: live handles of this context (dropped only with the device).
        unsafe {
            result::event::record(self.fork, main.cu_stream()).map_err(&err)?;
            result::stream::wait_event(
                self.stream,
                self.fork,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(err)
        }
    }

    /// `main` waits for everything queued on the side stream so far.
    pub(crate) fn join_into(&self, main: &CudaStream) -> Result<()> {
        use cudarc::driver::{result, sys};
        let err = |e| cuda_err("ordering the first stream after the second")(e);
        self.ctx.bind_to_thread().map_err(&err)?;
        // SAFETY: as in fork_from.
        unsafe {
            result::event::record(self.join, self.stream).map_err(&err)?;
            result::stream::wait_event(
                main.cu_stream(),
                self.join,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(err)
        }
    }

    /// Launches `f` on the side stream with one by-value parameter.
    ///
    /// # Safety
    /// `P` must mirror the kernel's one parameter and every pointer in it hold its tensor until
    /// the work completes.
    pub(crate) unsafe fn launch<P: Copy>(
        &self,
        f: &cudarc::driver::CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        param: &P,
    ) -> Result<()> {
        let err = |e| cuda_err("launching on the second stream")(e);
        self.ctx.bind_to_thread().map_err(&err)?;
        let mut arg = *param;
        let mut params = [&mut arg as *mut P as *mut std::ffi::c_void];
        // SAFETY: the caller's contract; the driver copies the parameter before returning.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream,
                &mut params,
            )
        }
        .map_err(err)
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        use cudarc::driver::result;
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: handles made in new, not used after this. Errors cannot be reported here.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::event::destroy(self.fork);
                let _ = result::event::destroy(self.join);
                let _ = result::stream::destroy(self.stream);
            }
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Wraps a driver error with what was being done.
/// The kernels' code for an element type (the fused kernels' IN_T and OUT_T, the decode
/// kernel's dtype fields): 0 f32, 1 bf16, 2 f16.
pub(crate) fn dtype_code(d: crate::dtype::DType) -> i32 {
    use crate::dtype::DType;
    match d {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
    }
}

pub(crate) fn cuda_err(context: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
    let context = context.into();
    move |e| Error::Cuda {
        context,
        message: e.to_string(),
    }
}

fn unavailable(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::CudaUnavailable(format!("{what}: {e}"))
}

/// The device of `stream`, described.
fn on_stream(stream: Arc<CudaStream>) -> Result<CudaDevice> {
    let ctx = stream.context().clone();
    let (major, minor) = ctx
        .compute_capability()
        .map_err(unavailable("compute capability"))?;
    let gpu_name = ctx.name().map_err(unavailable("device name"))?;
    let max_shared = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(unavailable("shared memory size"))?;
    let side = SideStream::new(&ctx).map_err(unavailable("a second stream"))?;
    Ok(CudaDevice {
        side,
        ordinal: ctx.ordinal(),
        ctx,
        stream,
        arch: format!("sm_{major}{minor}"),
        gpu_name,
        max_shared: usize::try_from(max_shared).unwrap_or(0),
        functions: Mutex::new(HashMap::new()),
        tables: Mutex::new(Vec::new()),
    })
}

fn open(ordinal: usize) -> Result<CudaDevice> {
    let ctx = CudaContext::new(ordinal).map_err(unavailable("no usable GPU"))?;
    // One stream carries all work on buffers (the second, SideStream, only kernels over raw
    // pointers, ordered by events), so cudarc's per-buffer events would only add cost.
    // SAFETY: every buffer made through this context object is used on its one stream only.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
    on_stream(stream)
}

/// Runs `f`, turning a cudarc panic (a driver symbol missing: a driver older than the API it
/// binds) into [`Error::CudaUnavailable`].
fn catch_driver_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::CudaUnavailable(
            "the CUDA driver failed to initialise".into(),
        ))
    })
}

fn libraries_present() -> Result<()> {
    if !registry::driver_available() {
        return Err(Error::CudaUnavailable(
            "the CUDA driver library (libcuda) cannot be loaded".into(),
        ));
    }
    if !registry::nvrtc_available() {
        return Err(Error::CudaUnavailable(
            "the NVRTC library (libnvrtc) cannot be loaded".into(),
        ));
    }
    Ok(())
}

impl CudaDevice {
    /// Opens the GPU with this ordinal, with a stream of its own. [`Error::CudaUnavailable`]
    /// when libcuda or libnvrtc cannot be loaded, the driver fails to start, or there is no such
    /// GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        libraries_present()?;
        catch_driver_panic(|| open(ordinal))
    }

    /// Runs on `stream`, an engine's stream (candle exposes one per device): all work is queued
    /// on it, in order with the engine's own work, and no stream is created or synchronised.
    /// The stream's context is left as it is (its event tracking included).
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        if !registry::nvrtc_available() {
            return Err(Error::CudaUnavailable(
                "the NVRTC library (libnvrtc) cannot be loaded".into(),
            ));
        }
        catch_driver_panic(|| on_stream(stream))
    }

    /// Runs on a stream borrowed from another runtime (PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`), which must belong to the primary context of
    /// GPU `ordinal` (the one the CUDA runtime uses). Nothing is created or synchronised; the
    /// stream is never destroyed by this device.
    ///
    /// # Safety
    /// `stream` is a valid stream (or null, the legacy default stream) of GPU `ordinal`'s primary
    /// context, and stays valid while this device, or anything made from it, is used.
    pub unsafe fn from_raw_stream(ordinal: usize, stream: CUstream) -> Result<Self> {
        libraries_present()?;
        catch_driver_panic(|| {
            let ctx = CudaContext::new(ordinal).map_err(unavailable("no usable GPU"))?;
            if !stream.is_null() {
                let mut owner = std::ptr::null_mut();
                // SAFETY: the caller guarantees a valid stream; the driver writes one handle.
                unsafe { cudarc::driver::sys::cuStreamGetCtx(stream, &mut owner) }
                    .result()
                    .map_err(cuda_err("querying the stream's context"))?;
                if owner != ctx.cu_ctx() {
                    return Err(Error::invalid(
                        "stream",
                        format!("a stream of the primary context of GPU {ordinal}"),
                        "a stream of another context",
                    ));
                }
            }
            // SAFETY: the stream belongs to this context (checked above) and outlives the
            // device (the caller's promise).
            let stream = unsafe { ctx.wrap_borrowed_stream(stream) };
            on_stream(stream)
        })
    }

    /// `cuda:0 NVIDIA H200 (sm_90)`.
    pub fn name(&self) -> String {
        format!("cuda:{} {} ({})", self.ordinal, self.gpu_name, self.arch)
    }

    /// The GPU's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The architecture kernels are compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("querying memory"))
    }

    /// The stream all of this device's work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The second stream (see [`SideStream`]).
    pub(crate) fn side_stream(&self) -> &SideStream {
        &self.side
    }

    /// Dynamic shared memory a block may use (after opting in), in bytes.
    pub(crate) fn max_shared_per_block(&self) -> usize {
        self.max_shared
    }

    /// `kernel` (compiled with chunk size `bt` where its source needs one), compiled and loaded
    /// on first use, then looked up without a driver call.
    pub(crate) fn function(&self, kernel: Kernel, bt: Option<usize>) -> Result<CudaFunction> {
        let bt = bt.filter(|_| kernel.source().needs_bt());
        if let Some(f) = lock(&self.functions)?.get(&(kernel, bt)) {
            return Ok(f.clone());
        }
        let key = Key {
            source: kernel.source(),
            arch: self.arch.clone(),
            bt,
        };
        let ptx = registry::ptx(&key)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda_err(format!("loading module {}", key.source.name())))?;
        let f = module
            .load_function(kernel.name())
            .map_err(cuda_err(format!("loading function {}", kernel.name())))?;
        if kernel.large_shared() {
            // The device's opt-in limit, set once here: each launch asks for what it needs
            // within it, and no launch changes the function's attributes.
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                i32::try_from(self.max_shared).unwrap_or(i32::MAX),
            )
            .map_err(cuda_err(format!(
                "opting {} in to shared memory",
                kernel.name()
            )))?;
        }
        lock(&self.functions)?.insert((kernel, bt), f.clone());
        Ok(f)
    }

    /// Queues `kernel` with its one argument `params` on the device's stream.
    ///
    /// # Safety
    /// Every device pointer in `params` is valid, on this device's context, for everything the
    /// kernel reads and writes under `cfg` and `params`' dimensions.
    pub(crate) unsafe fn launch<P: KernelParams>(
        &self,
        kernel: Kernel,
        bt: Option<usize>,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<()> {
        debug_assert_eq!(
            kernel.source(),
            P::SOURCE,
            "{kernel:?} takes another struct"
        );
        let f = self.function(kernel, bt)?;
        let fail = |e: DriverError| cuda_err(format!("launching {}", kernel.name()))(e);
        self.ctx.bind_to_thread().map_err(fail)?;
        // The one kernel argument, by address (cuLaunchKernel copies it before returning).
        let mut args = [params as *const P as *mut std::ffi::c_void];
        // SAFETY: P is the struct the kernel takes (KernelParams); the caller vouches for the
        // pointers in it. Launched directly rather than through cudarc's builder: there are no
        // buffers whose events it would track, and this way a launch allocates nothing.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(fail)
    }

    /// Queues the zeroing of `bytes` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` holds `bytes` bytes on this device's context.
    pub(crate) unsafe fn memset_zero(
        &self,
        ptr: CUdeviceptr,
        bytes: usize,
        what: &str,
    ) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.fill_bytes(ptr, 0, bytes, what) }
    }

    /// Queues the setting of `bytes` bytes at `ptr` to `value`.
    ///
    /// # Safety
    /// `ptr` holds `bytes` bytes on this device's context.
    pub(crate) unsafe fn fill_bytes(
        &self,
        ptr: CUdeviceptr,
        value: u8,
        bytes: usize,
        what: &str,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let fail = |e: DriverError| cuda_err(format!("filling {what}"))(e);
        self.ctx.bind_to_thread().map_err(fail)?;
        // SAFETY: the caller vouches for the range; the operation is ordered on the stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, value, bytes, self.stream.cu_stream())
        }
        .map_err(fail)
    }

    /// Queues a copy of `n` f32 from `x` to `y` (a no-op when they are the same memory).
    ///
    /// # Safety
    /// `x` and `y` hold `n` f32 on this device's context and are equal or do not overlap.
    pub(crate) unsafe fn copy_f32(&self, x: CUdeviceptr, y: CUdeviceptr, n: usize) -> Result<()> {
        if n == 0 || x == y {
            return Ok(());
        }
        let fail = |e: DriverError| cuda_err(format!("copying {n} elements"))(e);
        self.ctx.bind_to_thread().map_err(fail)?;
        // SAFETY: the caller vouches for both ranges; the copy is ordered on the stream.
        unsafe { cudarc::driver::result::memcpy_dtod_async(y, x, n * 4, self.stream.cu_stream()) }
            .map_err(fail)
    }

    /// A zero-filled buffer of `len` elements.
    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        if len == 0 {
            return self
                .stream
                .null()
                .map_err(cuda_err(format!("allocating {what}")));
        }
        self.stream
            .alloc_zeros(len)
            .map_err(cuda_err(format!("allocating {what} ({len} elements)")))
    }

    /// A buffer of `len` elements whose contents the caller overwrites entirely.
    pub(crate) fn uninit(&self, len: usize, what: &str) -> Result<Buf> {
        if len == 0 {
            return self.zeros(0, what);
        }
        // SAFETY: every element is written by the kernel the buffer is made for before it is
        // read.
        unsafe { self.stream.alloc(len) }
            .map_err(cuda_err(format!("allocating {what} ({len} elements)")))
    }

    fn upload_i64(&self, data: &[i64], what: &str) -> Result<CudaSlice<i64>> {
        if data.is_empty() {
            return self.zeros(0, what);
        }
        self.stream
            .clone_htod(data)
            .map_err(cuda_err(format!("uploading {what}")))
    }

    /// Uploads the problem's chunk and sequence tables (a host-to-device copy: never in a hot
    /// path).
    pub(crate) fn upload_tables(&self, p: &Problem) -> Result<Tables> {
        let chunks = p.chunks();
        let starts: Vec<i64> = chunks.iter().map(|c| c.start as i64).collect();
        let lens: Vec<i64> = chunks.iter().map(|c| c.len as i64).collect();
        let mut first: Vec<i64> = (0..p.num_seqs())
            .map(|n| p.seq_chunks(n).start as i64)
            .collect();
        first.push(chunks.len() as i64);
        let mut seq_start: Vec<i64> = p.seqs().iter().map(|s| s.0 as i64).collect();
        seq_start.push(p.tokens() as i64);
        let chunk_start = self.upload_i64(&starts, "chunk table")?;
        let chunk_len = self.upload_i64(&lens, "chunk table")?;
        let seq_first_chunk = self.upload_i64(&first, "sequence table")?;
        let seq_start = self.upload_i64(&seq_start, "sequence table")?;
        let mut order: Vec<i64> = (0..p.num_seqs() as i64).collect();
        order.sort_by_key(|&n| std::cmp::Reverse(p.seq_chunks(n as usize).len()));
        let seq_order = self.upload_i64(&order, "sequence table")?;
        let ptr = |s: &CudaSlice<i64>| s.device_ptr(&self.stream).0;
        let ptrs = TablePtrs {
            chunks: ChunkTable {
                start: ptr(&chunk_start),
                len: ptr(&chunk_len),
                count: chunks.len() as i64,
            },
            seq_first_chunk: ptr(&seq_first_chunk),
            seq_start: ptr(&seq_start),
            seq_order: ptr(&seq_order),
        };
        Ok(Tables {
            _memory: [
                chunk_start,
                chunk_len,
                seq_first_chunk,
                seq_start,
                seq_order,
            ],
            ptrs,
        })
    }

    /// The problem's tables for the [`crate::Backend`] path, uploaded on first use and cached.
    pub(crate) fn tables(&self, p: &Problem) -> Result<Arc<Tables>> {
        if let Some((_, t)) = lock(&self.tables)?.iter().find(|(q, _)| q == p) {
            return Ok(t.clone());
        }
        let t = Arc::new(self.upload_tables(p)?);
        let mut cache = lock(&self.tables)?;
        if cache.len() >= TABLE_CACHE {
            cache.remove(0);
        }
        cache.push((p.clone(), t.clone()));
        Ok(t)
    }

    /// Checks that a buffer holds exactly `want` elements and belongs to this device's CUDA
    /// context (a buffer of another context or GPU would be an invalid pointer here).
    ///
    /// Buffers made on other streams of the same context are accepted: where the context
    /// tracks events (cudarc's default, as in candle), this device's stream waits for their
    /// pending writes; where it does not (a [`CudaDevice::new`] device), ordering work on other
    /// streams before this device's use is the caller's job.
    pub(crate) fn check<T>(
        &self,
        arg: &'static str,
        buf: &CudaSlice<T>,
        want: usize,
    ) -> Result<()> {
        crate::error::check_len(arg, buf.len(), want)?;
        if buf.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::invalid(
                arg,
                format!("a buffer of the CUDA context of {}", self.name()),
                "a buffer of another context or GPU",
            ));
        }
        Ok(())
    }
}
