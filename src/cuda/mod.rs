//! The CUDA backend: every stage as a kernel compiled at run time by NVRTC for the device's own
//! architecture (see [`registry`]), on one stream of one GPU. libcuda and libnvrtc are loaded
//! dynamically, so the crate builds and runs without them; [`CudaDevice::new`] then fails with
//! [`Error::CudaUnavailable`].
//!
//! Every stage allocates its outputs and queues its kernels on the device's stream; nothing in
//! the forward waits for the host. Buffers are flat f32 arrays in the layouts of [`Backend`].

mod cast;
mod chunk_output;
mod chunk_state;
mod cumsum;
#[path = "fused/decode.rs"]
pub mod decode;
mod gate;
mod kkt;
mod l2norm;
mod recurrent;
pub mod registry;
mod solve_tril;
mod wy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    ValidAsZeroBits,
};

use crate::backend::{Backend, ChunkStates, Gamma, Wy};
use crate::error::{Error, Result};
use crate::options::{HeadMap, Options};
use crate::problem::Problem;
use registry::{lock, Key};

/// A flat f32 buffer on the GPU.
pub type Buf = CudaSlice<f32>;

/// Blocks per launch at most; kernels loop over the work items beyond it, so no item count hits
/// a grid limit (the x dimension alone is used).
const MAX_BLOCKS: usize = 1 << 22;

/// How many problems' device tables are kept (a forward uses one; a test may alternate a few).
const TABLE_CACHE: usize = 8;

/// A problem's chunk and sequence tables on the device, as i64.
#[derive(Debug)]
pub(crate) struct Tables {
    /// First flat token of each chunk.
    pub chunk_start: CudaSlice<i64>,
    /// Tokens in each chunk.
    pub chunk_len: CudaSlice<i64>,
    /// Index of each sequence's first chunk, plus the total (`N + 1` entries).
    pub seq_first_chunk: CudaSlice<i64>,
    /// First flat token of each sequence, plus the total (`N + 1` entries).
    pub seq_start: CudaSlice<i64>,
}

/// One NVIDIA GPU: its context, the stream all work is queued on, its architecture and the
/// kernels loaded into it.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    arch: String,
    gpu_name: String,
    max_shared: usize,
    functions: Mutex<HashMap<(Key, &'static str), CudaFunction>>,
    tables: Mutex<Vec<(Problem, Arc<Tables>)>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Wraps a driver error with what was being done.
pub(crate) fn cuda_err(context: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
    let context = context.into();
    move |e| Error::Cuda {
        context,
        message: e.to_string(),
    }
}

fn open(ordinal: usize) -> Result<CudaDevice> {
    let unavailable = |what: &str, e: DriverError| Error::CudaUnavailable(format!("{what}: {e}"));
    let ctx = CudaContext::new(ordinal).map_err(|e| unavailable("no usable GPU", e))?;
    // One stream carries all work, so cudarc's per-buffer events (for cross-stream ordering)
    // would only add cost.
    // SAFETY: every buffer of this device is used on its one stream only.
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| unavailable("compute capability", e))?;
    let gpu_name = ctx.name().map_err(|e| unavailable("device name", e))?;
    let stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
    let max_shared = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(|e| unavailable("shared memory size", e))?;
    Ok(CudaDevice {
        ctx,
        stream,
        ordinal,
        arch: format!("sm_{major}{minor}"),
        gpu_name,
        max_shared: usize::try_from(max_shared).unwrap_or(0),
        functions: Mutex::new(HashMap::new()),
        tables: Mutex::new(Vec::new()),
    })
}

impl CudaDevice {
    /// Opens the GPU with this ordinal. [`Error::CudaUnavailable`] when libcuda or libnvrtc
    /// cannot be loaded, the driver fails to start, or there is no such GPU.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to open the shared libraries; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::CudaUnavailable(
                "the CUDA driver library (libcuda) cannot be loaded".into(),
            ));
        }
        if !registry::nvrtc_available() {
            return Err(Error::CudaUnavailable(
                "the NVRTC library (libnvrtc) cannot be loaded".into(),
            ));
        }
        // cudarc panics when a driver symbol is missing (a driver older than the API it binds):
        // that, too, means the GPU cannot be used.
        match std::panic::catch_unwind(|| open(ordinal)) {
            Ok(r) => r,
            Err(_) => Err(Error::CudaUnavailable(
                "the CUDA driver failed to initialise".into(),
            )),
        }
    }

    /// `cuda:0 NVIDIA H200 (sm_90)`.
    pub fn name(&self) -> String {
        format!("cuda:{} {} ({})", self.ordinal, self.gpu_name, self.arch)
    }

    /// The architecture kernels are compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(cuda_err("querying memory"))
    }

    /// Dynamic shared memory a block may use (after opting in), in bytes.
    pub(crate) fn max_shared_per_block(&self) -> usize {
        self.max_shared
    }

    /// The stream all of this device's work is queued on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernel `func` of source `kernel` (compiled with chunk size `bt` where it needs one),
    /// compiled and loaded on first use.
    pub(crate) fn function(
        &self,
        kernel: &'static str,
        bt: Option<usize>,
        func: &'static str,
    ) -> Result<CudaFunction> {
        let key = Key {
            kernel,
            arch: self.arch.clone(),
            bt,
        };
        let id = (key, func);
        if let Some(f) = lock(&self.functions)?.get(&id) {
            return Ok(f.clone());
        }
        let ptx = registry::ptx(&id.0)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda_err(format!("loading module {kernel}")))?;
        let f = module
            .load_function(func)
            .map_err(cuda_err(format!("loading function {func}")))?;
        lock(&self.functions)?.insert(id, f.clone());
        Ok(f)
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

    /// The problem's chunk and sequence tables on the device, uploaded on first use.
    pub(crate) fn tables(&self, p: &Problem) -> Result<Arc<Tables>> {
        if let Some((_, t)) = lock(&self.tables)?.iter().find(|(q, _)| q == p) {
            return Ok(t.clone());
        }
        let chunks = p.chunks();
        let starts: Vec<i64> = chunks.iter().map(|c| c.start as i64).collect();
        let lens: Vec<i64> = chunks.iter().map(|c| c.len as i64).collect();
        let mut first: Vec<i64> = (0..p.num_seqs())
            .map(|n| p.seq_chunks(n).start as i64)
            .collect();
        first.push(chunks.len() as i64);
        let mut seq_start: Vec<i64> = p.seqs().iter().map(|s| s.0 as i64).collect();
        seq_start.push(p.tokens() as i64);
        let t = Arc::new(Tables {
            chunk_start: self.upload_i64(&starts, "chunk table")?,
            chunk_len: self.upload_i64(&lens, "chunk table")?,
            seq_first_chunk: self.upload_i64(&first, "sequence table")?,
            seq_start: self.upload_i64(&seq_start, "sequence table")?,
        });
        let mut cache = lock(&self.tables)?;
        if cache.len() >= TABLE_CACHE {
            cache.remove(0);
        }
        cache.push((p.clone(), t.clone()));
        Ok(t)
    }
}

/// A 1-D launch of `blocks` blocks (clamped to `1..=MAX_BLOCKS`) of `threads` threads.
pub(crate) fn cfg(blocks: usize, threads: u32, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes,
    }
}

/// `1` for the tiled head map, `0` for grouped (the kernels' `tiled` flag).
pub(crate) fn tiled(p: &Problem) -> i32 {
    i32::from(p.head_map() == HeadMap::Tiled)
}

/// i64 of a size (every size fits: [`Problem`] bounds element counts by `isize::MAX / 8`).
pub(crate) fn i(x: usize) -> i64 {
    x as i64
}

impl CudaDevice {
    /// Checks that a buffer holds exactly `want` elements and lives on this device's stream:
    /// work is ordered by that one stream alone (no per-buffer events), so a buffer of another
    /// stream or device would race or be an invalid pointer.
    pub(crate) fn check(&self, arg: &'static str, buf: &Buf, want: usize) -> Result<()> {
        crate::error::check_len(arg, buf.len(), want)?;
        if !Arc::ptr_eq(buf.stream(), &self.stream) {
            return Err(Error::invalid(
                arg,
                "a buffer made by this CudaDevice",
                "a buffer of another stream or device",
            ));
        }
        Ok(())
    }

    /// [`CudaDevice::check`] for the three buffers of a [`Gamma`], `n` elements each.
    pub(crate) fn check_gamma(&self, gamma: &Gamma<Buf>, n: usize) -> Result<()> {
        self.check("gamma", &gamma.gamma, n)?;
        self.check("lo", &gamma.lo, n)?;
        self.check("seg", &gamma.seg, n)
    }
}

impl Backend for CudaDevice {
    type Buf = Buf;

    fn l2norm(&self, x: &Buf, rows: usize, dim: usize) -> Result<Buf> {
        l2norm::l2norm(self, x, rows, dim)
    }
    fn gate(
        &self,
        p: &Problem,
        opts: &Options,
        g: &Buf,
        beta: &Buf,
        a_log: Option<&Buf>,
        dt_bias: Option<&Buf>,
    ) -> Result<(Buf, Buf)> {
        gate::gate(self, p, opts, g, beta, a_log, dt_bias)
    }
    fn chunk_local_cumsum(&self, p: &Problem, g: &Buf) -> Result<Gamma<Buf>> {
        cumsum::chunk_local_cumsum(self, p, g)
    }
    fn chunk_scaled_dot_kkt(
        &self,
        p: &Problem,
        k: &Buf,
        beta: &Buf,
        gamma: &Gamma<Buf>,
    ) -> Result<Buf> {
        kkt::chunk_scaled_dot_kkt(self, p, k, beta, gamma)
    }
    fn solve_tril(&self, p: &Problem, a_strict: &Buf) -> Result<Buf> {
        solve_tril::solve_tril(self, p, a_strict)
    }
    fn recompute_w_u(
        &self,
        p: &Problem,
        k: &Buf,
        v: &Buf,
        beta: &Buf,
        gamma: &Gamma<Buf>,
        a_inv: &Buf,
    ) -> Result<Wy<Buf>> {
        wy::recompute_w_u(self, p, k, v, beta, gamma, a_inv)
    }
    fn chunk_state(
        &self,
        p: &Problem,
        k: &Buf,
        wy: &Wy<Buf>,
        gamma: &Gamma<Buf>,
        h0: Option<&Buf>,
    ) -> Result<ChunkStates<Buf>> {
        chunk_state::chunk_state(self, p, k, wy, gamma, h0)
    }
    fn chunk_output(
        &self,
        p: &Problem,
        q: &Buf,
        k: &Buf,
        v_new: &Buf,
        h: &Buf,
        gamma: &Gamma<Buf>,
        scale: f32,
    ) -> Result<Buf> {
        chunk_output::chunk_output(self, p, q, k, v_new, h, gamma, scale)
    }
    fn recurrent(
        &self,
        p: &Problem,
        q: &Buf,
        k: &Buf,
        v: &Buf,
        g: &Buf,
        beta: &Buf,
        state: &mut Buf,
        v_first: bool,
        scale: f32,
    ) -> Result<Buf> {
        recurrent::recurrent(self, p, q, k, v, g, beta, state, v_first, scale)
    }
}

impl crate::HostIo for CudaDevice {
    fn upload(&self, data: &[f32]) -> Result<Buf> {
        if data.is_empty() {
            return self.zeros(0, "an upload");
        }
        self.stream
            .clone_htod(data)
            .map_err(cuda_err(format!("uploading {} elements", data.len())))
    }
    fn upload_tensor(&self, t: &crate::Tensor<'_>) -> Result<Buf> {
        cast::upload_tensor(self, t)
    }
    fn download(&self, buf: &Buf) -> Result<Vec<f32>> {
        self.check("buffer", buf, buf.len())?;
        if buf.is_empty() {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(buf)
            .map_err(cuda_err(format!("downloading {} elements", buf.len())))
    }
    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("synchronizing"))?;
        // Errors of asynchronous frees are parked in the context by cudarc's destructors.
        self.ctx
            .check_err()
            .map_err(cuda_err("an earlier asynchronous operation"))
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .ctx
            .new_event(flags)
            .map_err(cuda_err("creating an event"))?;
        let end = self
            .ctx
            .new_event(flags)
            .map_err(cuda_err("creating an event"))?;
        start
            .record(&self.stream)
            .map_err(cuda_err("recording an event"))?;
        f()?;
        end.record(&self.stream)
            .map_err(cuda_err("recording an event"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(cuda_err("timing with events"))?;
        Ok(f64::from(ms))
    }
}
