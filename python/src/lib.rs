//! `deltanet._native`: the compiled half of the `deltanet` Python package.
//!
//! The Python half (`deltanet/__init__.py`) parses FLA's keyword arguments, turns numpy arrays and
//! CPU torch tensors into plain `(bytes, shape, dtype)` triples and back, and calls [`run`] here.
//! This module builds the library's [`Inputs`] and [`Options`] from them, runs the chunked forward
//! or the per-token recurrence on the CPU with the GIL released, and maps every
//! [`deltanet::Error`] to a Python exception: nothing panics across the boundary.
//!
//! CUDA torch tensors take a separate path (`deltanet/_cuda.py` and [`CudaPlan`] here): the
//! library's device-resident engine API on torch's current stream, over torch's memory, given
//! as raw device pointers.
//!
//! Bytes rather than numpy objects cross the boundary so that the module needs neither numpy's C
//! API nor the buffer protocol, and builds as one abi3 wheel per platform.

use std::panic::{catch_unwind, AssertUnwindSafe};

use deltanet::{
    decode_step, forward, recurrent_step, DType, Device, Error, HeadMap, Indices, Inputs, Options,
    Problem, StateIndices, Tensor,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

/// One tensor as the Python layer passes it: its elements as little-endian bytes in row-major
/// order, its shape, and its dtype name (`f32`, `bf16` or `f16`).
type RawTensor<'py> = (Bound<'py, PyBytes>, Vec<usize>, String);

/// A result tensor handed back to Python: its bytes (a `bytearray`, so the array numpy or torch
/// builds over it is writable), its shape and its dtype name.
type OutTensor = (Py<PyByteArray>, Vec<usize>, String);

/// The tensors of one call, by FLA's names (`A_log` is `a_log` here): as the Python layer
/// passes them (`Tensors<RawTensor>`, from its dict) or borrowed from those (`Tensors<View>`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Tensors<T> {
    q: T,
    k: T,
    v: T,
    g: T,
    beta: T,
    initial_state: Option<T>,
    a_log: Option<T>,
    dt_bias: Option<T>,
}

impl<T> Tensors<T> {
    /// Each tensor through `f`.
    fn map<'s, U>(&'s self, f: impl Fn(&'s T) -> U) -> Tensors<U> {
        Tensors {
            q: f(&self.q),
            k: f(&self.k),
            v: f(&self.v),
            g: f(&self.g),
            beta: f(&self.beta),
            initial_state: self.initial_state.as_ref().map(&f),
            a_log: self.a_log.as_ref().map(&f),
            dt_bias: self.dt_bias.as_ref().map(&f),
        }
    }
}

/// The options of one call, already translated from FLA's keyword names by the Python layer.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct RawOptions {
    scale: Option<f32>,
    use_qk_l2norm: bool,
    beta_is_logits: bool,
    allow_neg_eigval: bool,
    gate_in_kernel: bool,
    state_v_first: bool,
    chunk_size: usize,
    head_map: String,
    precision: String,
    output_final_state: bool,
}

/// Maps the library's typed error to the Python exception a caller expects: bad arguments
/// (shapes, values, sizes) are `ValueError`s whose message starts with the argument's name;
/// anything else (a device failure, a bug) is a `RuntimeError`.
fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::Invalid { .. } | Error::Overflow { .. } | Error::File { .. } => {
            PyValueError::new_err(e.to_string())
        }
        _ => PyRuntimeError::new_err(e.to_string()),
    }
}

/// Renames the argument of an error raised by a generic constructor (`Tensor::from_bytes` says
/// `tensor`, `DType::from_str` says `dtype`) to the argument the caller knows.
fn named(arg: &'static str, e: Error) -> Error {
    match e {
        Error::Invalid { expected, got, .. } => Error::Invalid { arg, expected, got },
        Error::Overflow { detail, .. } => Error::Overflow { arg, detail },
        other => other,
    }
}

/// The library tensor over a raw tensor's bytes: borrowed (a `bytes` object is immutable, and
/// CPython aligns its data for f32), or copied by `Tensor::from_bytes` were it ever unaligned.
fn tensor<'a>(
    arg: &'static str,
    bytes: &'a [u8],
    shape: &[usize],
    dtype: &str,
) -> Result<Tensor<'a>, Error> {
    let dtype: DType = dtype.parse().map_err(|e| named(arg, e))?;
    Tensor::from_bytes(dtype, bytes, shape.to_vec()).map_err(|e| named(arg, e))
}

/// A raw tensor's parts with the bytes borrowed, so that they can be read with the GIL released.
struct View<'a> {
    bytes: &'a [u8],
    shape: &'a [usize],
    dtype: &'a str,
}

impl<'a> View<'a> {
    fn of(raw: &'a RawTensor<'_>) -> Self {
        View {
            bytes: raw.0.as_bytes(),
            shape: &raw.1,
            dtype: &raw.2,
        }
    }

    fn tensor(&self, arg: &'static str) -> Result<Tensor<'a>, Error> {
        tensor(arg, self.bytes, self.shape, self.dtype)
    }
}

/// What a computation returns before it is turned into Python objects.
struct Computed {
    o: Tensor<'static>,
    final_state: Option<Tensor<'static>>,
}

/// Which algorithm runs: the chunked forward (prefill) or the token-by-token recurrence (decode).
#[derive(Clone, Copy)]
enum Mode {
    Chunk,
    Recurrent,
}

/// The library's inputs over the call's tensors (all but the initial state).
fn inputs<'a>(
    views: &Tensors<View<'a>>,
    cu_seqlens: Option<Vec<i64>>,
) -> Result<Inputs<'a>, Error> {
    let mut x = Inputs::new(
        views.q.tensor("q")?,
        views.k.tensor("k")?,
        views.v.tensor("v")?,
        views.g.tensor("g")?,
        views.beta.tensor("beta")?,
    );
    x.cu_seqlens = cu_seqlens;
    x.a_log = views
        .a_log
        .as_ref()
        .map(|t| t.tensor("A_log"))
        .transpose()?;
    x.dt_bias = views
        .dt_bias
        .as_ref()
        .map(|t| t.tensor("dt_bias"))
        .transpose()?;
    Ok(x)
}

/// Builds the inputs and options and runs the computation. Runs without the GIL: it sees only
/// borrowed bytes and plain Rust values.
fn compute(
    mode: Mode,
    views: Tensors<View<'_>>,
    cu_seqlens: Option<Vec<i64>>,
    opts: &RawOptions,
) -> Result<Computed, Error> {
    let options = library_options(opts)?;
    let mut x = inputs(&views, cu_seqlens)?;
    // FLA accepts a half-precision initial state and computes in f32; the library takes f32.
    let h0 = match views.initial_state {
        None => None,
        Some(t) => {
            let t = t.tensor("initial_state")?;
            let shape = t.shape().to_vec();
            Some(Tensor::from_f32(t.to_f32().into_owned(), shape)?)
        }
    };
    match mode {
        Mode::Chunk => {
            x.initial_state = h0;
            let out = forward(&Device::Cpu, &x, &options)?;
            Ok(Computed {
                o: out.o,
                final_state: out.final_state,
            })
        }
        Mode::Recurrent => {
            // The recurrence advances a state buffer in place: the initial state, or zeros of
            // the shape the problem implies (N sequences, from B or cu_seqlens).
            let shape = Problem::from_inputs(&x, &options)?
                .state_shape(options.state_v_first)
                .to_vec();
            let mut state = match h0 {
                Some(t) => {
                    // Shape errors name initial_state, as the chunked path's do.
                    if t.shape() != shape.as_slice() {
                        return Err(Error::invalid(
                            "initial_state",
                            format!("shape {shape:?}"),
                            format!("{:?}", t.shape()),
                        ));
                    }
                    t.to_f32().into_owned()
                }
                None => vec![0.0; shape.iter().product()],
            };
            let o = recurrent_step(&Device::Cpu, &x, &mut state, &options)?;
            Ok(Computed {
                o,
                final_state: match opts.output_final_state {
                    true => Some(Tensor::from_f32(state, shape)?),
                    false => None,
                },
            })
        }
    }
}

/// Runs the gated delta rule on the CPU.
///
/// `mode` is `"chunk"` (the chunked forward, FLA's `chunk_gated_delta_rule`) or `"recurrent"`
/// (the per-token recurrence, FLA's `fused_recurrent_gated_delta_rule`). `tensors` is a dict of
/// `(bytes, shape, dtype)` triples by FLA's names (`q`, `k`, `v`, `g`, `beta`, `initial_state`,
/// `a_log`, `dt_bias`; the last three may be None) plus `cu_seqlens` (a list of ints or None);
/// `options` a dict of the library's option names. Returns `(o, final_state)`, each a
/// `(bytearray, shape, dtype)` triple, `final_state` None unless `output_final_state`.
///
/// Raises `ValueError` (message starting with the argument's name) for bad arguments and
/// `RuntimeError` for anything else.
#[pyfunction]
fn run(
    py: Python<'_>,
    mode: &str,
    tensors: &Bound<'_, PyAny>,
    options: &Bound<'_, PyAny>,
) -> PyResult<(OutTensor, Option<OutTensor>)> {
    let mode = match mode {
        "chunk" => Mode::Chunk,
        "recurrent" => Mode::Recurrent,
        _ => {
            return Err(PyValueError::new_err(format!(
                "mode: expected \"chunk\" or \"recurrent\", got {mode:?}"
            )))
        }
    };
    let raw: Tensors<RawTensor<'_>> = tensors.extract()?;
    let cu: Option<Vec<i64>> = tensors.get_item("cu_seqlens")?.extract()?;
    let opts: RawOptions = options.extract()?;
    let views = raw.map(|t| View::of(t));
    // The computation holds no Python object, so other Python threads run meanwhile. A panic
    // (a bug) is caught here and raised as a RuntimeError rather than unwinding into Python.
    let result = py.detach(|| {
        catch_unwind(AssertUnwindSafe(|| compute(mode, views, cu, &opts))).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            Err(Error::internal(what))
        })
    });
    let out = result.map_err(to_py_err)?;
    Ok((to_out(py, &out.o), out.final_state.map(|s| to_out(py, &s))))
}

/// The pool-row indices of one decode step, as the Python layer passes them (lists of ints,
/// or None; see [`deltanet::StateIndices`]).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct RawIndices {
    state_indices: Option<Vec<i64>>,
    out_state_indices: Option<Vec<i64>>,
    token_state_indices: Option<Vec<i64>>,
}

/// One decode step over a state pool on the CPU ([`deltanet::decode_step`]): `tensors` as in
/// [`run`] (N sequences of T tokens as B and T; `initial_state` None), `pool` the address and
/// element count of the caller's `[P, HV, K, V]` f32 pool (`[P, HV, V, K]` with
/// `state_v_first`), updated where it lies; `indices` a dict of `state_indices`,
/// `out_state_indices` and `token_state_indices` (lists or None). Every argument is checked
/// before the pool is touched. Returns `(o, token_states)`.
///
/// The pool is memory of a numpy array the Python layer checked to be a writable, aligned,
/// C-contiguous float32 array of that many elements, alive for the call; only the package's
/// Python layer calls this.
#[pyfunction]
fn decode(
    py: Python<'_>,
    tensors: &Bound<'_, PyAny>,
    pool: (usize, usize),
    indices: &Bound<'_, PyAny>,
    token_states: bool,
    options: &Bound<'_, PyAny>,
) -> PyResult<(OutTensor, Option<OutTensor>)> {
    let raw: Tensors<RawTensor<'_>> = tensors.extract()?;
    let idx: RawIndices = indices.extract()?;
    let opts: RawOptions = options.extract()?;
    let views = raw.map(|t| View::of(t));
    let (addr, len) = pool;
    if len > 0 && (addr == 0 || addr % std::mem::align_of::<f32>() != 0) {
        return Err(to_py_err(Error::invalid(
            "state_pool",
            "an aligned float32 buffer",
            format!("address {addr:#x}"),
        )));
    }
    let step = || -> Result<_, Error> {
        let options = library_options(&opts)?;
        let x = inputs(&views, None)?;
        // SAFETY: the Python layer's promise above: `len` f32 at `addr`, writable, aligned,
        // alive for this call, and touched by nothing else while it runs.
        let rows: &mut [f32] = if len == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, len) }
        };
        let si = StateIndices {
            read: idx.state_indices.as_deref().map(Indices::I64),
            write: idx.out_state_indices.as_deref().map(Indices::I64),
            per_token: idx.token_state_indices.as_deref().map(Indices::I64),
        };
        let out = decode_step(&Device::Cpu, &x, rows, &si, token_states, &options)?;
        Ok((out.o, out.token_states))
    };
    let (o, ts) = py
        .detach(|| {
            catch_unwind(AssertUnwindSafe(step))
                .unwrap_or_else(|_| Err(Error::internal("a panic in the decode step")))
        })
        .map_err(to_py_err)?;
    Ok((to_out(py, &o), ts.map(|t| to_out(py, &t))))
}

/// A result tensor as the Python layer reads it (its bytes copied into a new `bytearray`).
fn to_out(py: Python<'_>, t: &Tensor<'_>) -> OutTensor {
    (
        PyByteArray::new(py, t.as_bytes()).unbind(),
        t.shape().to_vec(),
        t.dtype().name().to_string(),
    )
}

/// The library's [`Options`] from the Python layer's option dict.
fn library_options(opts: &RawOptions) -> Result<Options, Error> {
    Ok(Options {
        scale: opts.scale,
        use_qk_l2norm: opts.use_qk_l2norm,
        beta_is_logits: opts.beta_is_logits,
        allow_neg_eigval: opts.allow_neg_eigval,
        gate_in_kernel: opts.gate_in_kernel,
        state_v_first: opts.state_v_first,
        chunk_size: opts.chunk_size,
        head_map: opts.head_map.parse::<HeadMap>()?,
        precision: opts.precision.parse()?,
        output_final_state: opts.output_final_state,
        output_chunk_states: false,
        // FLA's convention: o in the inputs' dtype.
        out_dtype: None,
    })
}

// ------------------------------------------------------------------------------------------------
// CUDA torch tensors: the library's device-resident engine API on torch's current stream.

/// One CUDA tensor as the Python layer passes it: its data pointer, its element count and its
/// dtype name. The tensor is contiguous and on the plan's GPU (the Python layer makes it so).
type RawDevice = (u64, usize, String);

/// A plan of the device-resident forward or recurrent step for one call's shapes and options,
/// on torch's current stream (`deltanet.cuda_plan` in Python terms; the package makes one per
/// call). Holds the library's [`deltanet::cuda::Plan`]: kernels loaded, tables uploaded.
///
/// Unsendable: it holds a borrowed stream handle, valid only on the thread and during the call
/// that made it.
#[pyclass(unsendable)]
struct CudaPlan {
    plan: deltanet::cuda::Plan,
    mode: Mode,
}

/// A device view over a raw tensor.
///
/// # Safety
/// `raw.0` addresses `raw.1` elements of `raw.2` in device memory of the plan's context, alive
/// and not written by anything else while the queued work runs.
unsafe fn device_ref<'a>(
    arg: &'static str,
    raw: &RawDevice,
) -> Result<deltanet::cuda::DeviceRef<'a>, Error> {
    let dtype: DType = raw.2.parse().map_err(|e| named(arg, e))?;
    // SAFETY: the caller's promise.
    Ok(unsafe { deltanet::cuda::DeviceRef::from_raw(raw.0, raw.1, dtype) })
}

/// A writable device view over a raw tensor.
///
/// # Safety
/// As [`device_ref`], and nothing else reads or writes the memory while the queued work runs.
unsafe fn device_mut<'a>(
    arg: &'static str,
    raw: &RawDevice,
) -> Result<deltanet::cuda::DeviceMut<'a>, Error> {
    let dtype: DType = raw.2.parse().map_err(|e| named(arg, e))?;
    // SAFETY: the caller's promise.
    Ok(unsafe { deltanet::cuda::DeviceMut::from_raw(raw.0, raw.1, dtype) })
}

#[pymethods]
impl CudaPlan {
    /// Validates the shapes and options and prepares the plan: `mode` as in [`run`], `ordinal`
    /// the GPU, `stream` torch's `current_stream().cuda_stream` (of that GPU's primary context,
    /// which is the one torch uses), `dims` `(B, T, H, HV, K, V)`, `dtype` q's dtype name.
    #[new]
    fn new(
        mode: &str,
        ordinal: usize,
        stream: usize,
        dims: (usize, usize, usize, usize, usize, usize),
        cu_seqlens: Option<Vec<i64>>,
        options: &Bound<'_, PyAny>,
        dtype: &str,
    ) -> PyResult<Self> {
        let mode = match mode {
            "chunk" => Mode::Chunk,
            "recurrent" => Mode::Recurrent,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "mode: expected \"chunk\" or \"recurrent\", got {mode:?}"
                )))
            }
        };
        let opts: RawOptions = options.extract()?;
        let make = || -> Result<deltanet::cuda::Plan, Error> {
            let options = library_options(&opts)?;
            let (batch, seq_len, heads, v_heads, dk, dv) = dims;
            let dims = deltanet::Dims::from([batch, seq_len, heads, v_heads, dk, dv]);
            let p = Problem::new(dims, cu_seqlens.as_deref(), &options)?;
            let dtype: DType = dtype.parse().map_err(|e| named("q", e))?;
            // SAFETY: the Python layer passes torch's current stream of GPU `ordinal`, which
            // outlives this plan (the plan is dropped at the end of the call that made it).
            let dev =
                unsafe { deltanet::cuda::CudaDevice::from_raw_stream(ordinal, stream as *mut _)? };
            deltanet::cuda::Plan::new(std::sync::Arc::new(dev), &p, &options, dtype)
        };
        let plan = catch_unwind(AssertUnwindSafe(make))
            .unwrap_or_else(|_| Err(Error::internal("a panic while making a CUDA plan")))
            .map_err(to_py_err)?;
        Ok(CudaPlan { plan, mode })
    }

    /// The workspace bytes the call needs (256-byte aligned memory).
    #[getter]
    fn workspace_bytes(&self) -> usize {
        match self.mode {
            Mode::Chunk => self.plan.forward_workspace_bytes(),
            Mode::Recurrent => self.plan.step_workspace_bytes(),
        }
    }

    /// Queues the call on the plan's stream; returns without waiting for it. `state` is the
    /// final state written by the forward (`initial_state` may be the same memory) or the state
    /// the recurrent step advances in place (then `initial_state` must be None).
    ///
    /// Every argument is a `(data_ptr, numel, dtype)` triple of a contiguous tensor on the
    /// plan's GPU, kept alive by the caller until the queued work is done (torch's allocator
    /// orders reuse on the same stream). Wrong pointers corrupt memory: only the package's
    /// Python layer calls this.
    #[allow(clippy::too_many_arguments)] // one per tensor of FLA's call
    #[pyo3(signature = (q, k, v, g, beta, initial_state, a_log, dt_bias, o, state, workspace))]
    fn run(
        &self,
        q: RawDevice,
        k: RawDevice,
        v: RawDevice,
        g: RawDevice,
        beta: RawDevice,
        initial_state: Option<RawDevice>,
        a_log: Option<RawDevice>,
        dt_bias: Option<RawDevice>,
        o: RawDevice,
        state: RawDevice,
        workspace: (u64, usize),
    ) -> PyResult<()> {
        let queue = || -> Result<(), Error> {
            // SAFETY: the Python layer's promise, documented above.
            unsafe {
                let mut inputs = deltanet::cuda::TokenInputs::new(
                    device_ref("q", &q)?,
                    device_ref("k", &k)?,
                    device_ref("v", &v)?,
                    device_ref("g", &g)?,
                    device_ref("beta", &beta)?,
                );
                inputs.a_log = a_log.as_ref().map(|t| device_ref("A_log", t)).transpose()?;
                inputs.dt_bias = dt_bias
                    .as_ref()
                    .map(|t| device_ref("dt_bias", t))
                    .transpose()?;
                let o = device_mut("o", &o)?;
                let ws = deltanet::cuda::Workspace::from_raw(workspace.0, workspace.1);
                match self.mode {
                    Mode::Chunk => {
                        let mut io = deltanet::cuda::ForwardIo::new(
                            inputs,
                            o,
                            device_mut("final_state", &state)?,
                        );
                        io.initial_state = initial_state
                            .as_ref()
                            .map(|t| device_ref("initial_state", t))
                            .transpose()?;
                        self.plan.forward(io, ws)
                    }
                    Mode::Recurrent => {
                        if initial_state.is_some() {
                            return Err(Error::internal(
                                "the recurrent step takes its state in `state`",
                            ));
                        }
                        let io = deltanet::cuda::StepIo {
                            inputs,
                            state: device_mut("initial_state", &state)?,
                            o,
                        };
                        self.plan.recurrent_step(io, ws)
                    }
                }
            }
        };
        catch_unwind(AssertUnwindSafe(queue))
            .unwrap_or_else(|_| Err(Error::internal("a panic while queueing CUDA work")))
            .map_err(to_py_err)
    }
}

/// A device array of pool-row indices as the Python layer passes it: address, count, and
/// whether they are i64 (else i32).
type RawDeviceIndices = (u64, usize, bool);

/// One decode step over a device-resident state pool, queued on torch's current stream
/// ([`deltanet::cuda::decode::decode_raw`]): `dims` `(N, T, H, HV, K, V, P)`; every tensor a
/// `(data_ptr, numel, dtype)` triple as for [`CudaPlan::run`], the pool `[P, HV, K, V]` f32
/// updated in place; indices `(data_ptr, count, is_i64)` or None. Returns without waiting.
/// Repeated rows are not detected here (the indices stay on the device): the Python layer
/// checks indices it was given on the host.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // one per buffer of the step
#[pyo3(signature = (ordinal, stream, dims, options, q, k, v, g, beta, a_log, dt_bias, pool, o, read, write, per_token, token_states))]
fn decode_cuda(
    ordinal: usize,
    stream: usize,
    dims: (usize, usize, usize, usize, usize, usize, usize),
    options: &Bound<'_, PyAny>,
    q: RawDevice,
    k: RawDevice,
    v: RawDevice,
    g: RawDevice,
    beta: RawDevice,
    a_log: Option<RawDevice>,
    dt_bias: Option<RawDevice>,
    pool: RawDevice,
    o: RawDevice,
    read: Option<RawDeviceIndices>,
    write: Option<RawDeviceIndices>,
    per_token: Option<RawDeviceIndices>,
    token_states: Option<RawDevice>,
) -> PyResult<()> {
    use deltanet::cuda::decode::{decode_raw, DecodeBuffers, DecodeShape, RawArray};
    let opts: RawOptions = options.extract()?;
    let queue = || -> Result<(), Error> {
        let options = library_options(&opts)?;
        let array = |arg: &'static str, t: &RawDevice| -> Result<RawArray, Error> {
            let dtype: DType = t.2.parse().map_err(|e| named(arg, e))?;
            Ok(RawArray {
                ptr: t.0,
                len: t.1,
                dtype,
            })
        };
        let index = |t: &Option<RawDeviceIndices>| {
            t.map(|(ptr, len, wide)| deltanet::cuda::decode::RawIndices { ptr, len, wide })
        };
        let (n, t, h, hv, dk, dv, rows) = dims;
        let shape = DecodeShape {
            n,
            t,
            h,
            hv,
            dk,
            dv,
            pool: rows,
        };
        let b = DecodeBuffers {
            q: array("q", &q)?,
            k: array("k", &k)?,
            v: array("v", &v)?,
            g: array("g", &g)?,
            beta: array("beta", &beta)?,
            a_log: a_log.as_ref().map(|t| array("A_log", t)).transpose()?,
            dt_bias: dt_bias.as_ref().map(|t| array("dt_bias", t)).transpose()?,
            pool: array("state_pool", &pool)?,
            o: array("o", &o)?,
            read: index(&read),
            write: index(&write),
            per_token: index(&per_token),
            token_states: token_states
                .as_ref()
                .map(|t| array("token_states", t))
                .transpose()?,
        };
        // SAFETY: the Python layer passes torch's current stream of GPU `ordinal` and live,
        // contiguous tensors of that GPU for every buffer (its promise, as for CudaPlan).
        unsafe {
            let dev = deltanet::cuda::CudaDevice::from_raw_stream(ordinal, stream as *mut _)?;
            decode_raw(&dev, &shape, &b, &options)
        }
    };
    catch_unwind(AssertUnwindSafe(queue))
        .unwrap_or_else(|_| Err(Error::internal("a panic while queueing the decode step")))
        .map_err(to_py_err)
}

/// `deltanet._native`: see the crate documentation.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(decode_cuda, m)?)?;
    m.add_class::<CudaPlan>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
