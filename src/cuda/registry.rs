//! The kernel registry: every kernel source of the backend, compiled at run time by NVRTC for one
//! GPU architecture, once per process for each (source, architecture, chunk size).
//!
//! Kernels are named by [`Kernel`], sources by [`Source`]. The compile-time constants a source
//! needs are stated once, on the Rust side, and passed as `-D` flags: `BT` (the chunk size, for
//! sources that size shared arrays by it), the launch's `THREADS` where the source sizes work by
//! it, and `PARAMS_BYTES`, the size of the source's params struct, which the source checks its
//! mirror against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::DeviceRepr;
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::stages;
use crate::error::{Error, Result};
use crate::options::CHUNK_SIZES;

/// Declarations every kernel source starts with (prepended at compile time).
pub(crate) const COMMON: &str = include_str!("kernels/common.cuh");

/// A kernel's one argument: a `#[repr(C)]` struct mirrored field by field in `SOURCE`.
///
/// # Safety
/// The type's layout equals the struct the kernels of `SOURCE` take.
pub(crate) unsafe trait KernelParams: DeviceRepr + Copy {
    /// The source whose kernels take this struct.
    const SOURCE: Source;
}

/// One kernel source file under `src/cuda/kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// 16-bit floats to and from f32.
    Cast,
    /// Row normalisation of q and k.
    L2norm,
    /// The effective gate and beta.
    Gate,
    /// The within-chunk cumulative gate.
    Cumsum,
    /// `A_strict`.
    Kkt,
    /// `A_inv`.
    SolveTril,
    /// `w` and `u`.
    Wy,
    /// The sequential pass over chunks.
    ChunkState,
    /// The output.
    ChunkOutput,
    /// The token-by-token recurrence.
    Recurrent,
    /// The decode step over a pool of states (`kernels/fused/decode.cu`).
    Decode,
}

impl Source {
    /// Every source of the backend.
    pub const ALL: [Source; 11] = [
        Source::Cast,
        Source::L2norm,
        Source::Gate,
        Source::Cumsum,
        Source::Kkt,
        Source::SolveTril,
        Source::Wy,
        Source::ChunkState,
        Source::ChunkOutput,
        Source::Recurrent,
        Source::Decode,
    ];

    /// The file's stem under `src/cuda/kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Cast => "cast",
            Source::L2norm => "l2norm",
            Source::Gate => "gate",
            Source::Cumsum => "cumsum",
            Source::Kkt => "kkt",
            Source::SolveTril => "solve_tril",
            Source::Wy => "wy",
            Source::ChunkState => "chunk_state",
            Source::ChunkOutput => "chunk_output",
            Source::Recurrent => "recurrent",
            Source::Decode => "decode",
        }
    }

    /// The CUDA C++ text (no toolkit headers).
    pub fn text(self) -> &'static str {
        match self {
            Source::Cast => include_str!("kernels/cast.cu"),
            Source::L2norm => include_str!("kernels/l2norm.cu"),
            Source::Gate => include_str!("kernels/gate.cu"),
            Source::Cumsum => include_str!("kernels/cumsum.cu"),
            Source::Kkt => include_str!("kernels/kkt.cu"),
            Source::SolveTril => include_str!("kernels/solve_tril.cu"),
            Source::Wy => include_str!("kernels/wy.cu"),
            Source::ChunkState => include_str!("kernels/chunk_state.cu"),
            Source::ChunkOutput => include_str!("kernels/chunk_output.cu"),
            Source::Recurrent => include_str!("kernels/recurrent.cu"),
            Source::Decode => include_str!("kernels/fused/decode.cu"),
        }
    }

    /// Whether the source is compiled once per chunk size, with `-DBT=<chunk size>`.
    pub fn needs_bt(self) -> bool {
        matches!(
            self,
            Source::Kkt | Source::SolveTril | Source::Wy | Source::ChunkState | Source::ChunkOutput
        )
    }

    /// The size of the source's params struct (its Rust mirror).
    fn params_bytes(self) -> usize {
        use std::mem::size_of;
        match self {
            Source::Cast => size_of::<stages::cast::Params>(),
            Source::L2norm => size_of::<stages::l2norm::Params>(),
            Source::Gate => size_of::<stages::gate::Params>(),
            Source::Cumsum => size_of::<stages::cumsum::Params>(),
            Source::Kkt => size_of::<stages::kkt::Params>(),
            Source::SolveTril => size_of::<stages::solve_tril::Params>(),
            Source::Wy => size_of::<stages::wy::Params>(),
            Source::ChunkState => size_of::<stages::chunk_state::Params>(),
            Source::ChunkOutput => size_of::<stages::chunk_output::Params>(),
            Source::Recurrent => size_of::<stages::recurrent::Params>(),
            Source::Decode => size_of::<super::decode::Params>(),
        }
    }

    /// Constants besides `BT` and `PARAMS_BYTES` that the source is compiled with.
    fn defines(self) -> Vec<(&'static str, usize)> {
        match self {
            Source::Kkt => vec![("THREADS", stages::kkt::THREADS)],
            Source::ChunkOutput => vec![("THREADS", stages::chunk_output::THREADS)],
            _ => Vec::new(),
        }
    }
}

/// One kernel (an `extern "C" __global__` function) of a [`Source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// bf16 or f16 to f32, exact.
    Widen,
    /// f32 to bf16 or f16, round to nearest even.
    Narrow,
    /// Row normalisation.
    L2norm,
    /// The effective gate and beta.
    Gate,
    /// `gamma`, `lo`, `seg`.
    ChunkLocalCumsum,
    /// `A_strict`.
    ChunkScaledDotKkt,
    /// `A_inv`.
    SolveTril,
    /// `w`, `u`.
    RecomputeWU,
    /// `h`, `v_new`, the final state.
    ChunkState,
    /// `o`.
    ChunkOutput,
    /// The recurrence with K-major states.
    RecurrentKv,
    /// The recurrence with V-major states.
    RecurrentVk,
    /// The decode step with K-major states.
    DecodeKv,
    /// The decode step with V-major states.
    DecodeVk,
    /// The decode step with K-major states, K = V = 128 as compile-time constants.
    DecodeKv128,
}

impl Kernel {
    /// Every kernel of the backend.
    pub const ALL: [Kernel; 15] = [
        Kernel::Widen,
        Kernel::Narrow,
        Kernel::L2norm,
        Kernel::Gate,
        Kernel::ChunkLocalCumsum,
        Kernel::ChunkScaledDotKkt,
        Kernel::SolveTril,
        Kernel::RecomputeWU,
        Kernel::ChunkState,
        Kernel::ChunkOutput,
        Kernel::RecurrentKv,
        Kernel::RecurrentVk,
        Kernel::DecodeKv,
        Kernel::DecodeVk,
        Kernel::DecodeKv128,
    ];

    /// The source the kernel is defined in.
    pub fn source(self) -> Source {
        match self {
            Kernel::Widen | Kernel::Narrow => Source::Cast,
            Kernel::L2norm => Source::L2norm,
            Kernel::Gate => Source::Gate,
            Kernel::ChunkLocalCumsum => Source::Cumsum,
            Kernel::ChunkScaledDotKkt => Source::Kkt,
            Kernel::SolveTril => Source::SolveTril,
            Kernel::RecomputeWU => Source::Wy,
            Kernel::ChunkState => Source::ChunkState,
            Kernel::ChunkOutput => Source::ChunkOutput,
            Kernel::RecurrentKv | Kernel::RecurrentVk => Source::Recurrent,
            Kernel::DecodeKv | Kernel::DecodeVk | Kernel::DecodeKv128 => Source::Decode,
        }
    }

    /// The function's name in its source.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Widen => "widen",
            Kernel::Narrow => "narrow",
            Kernel::L2norm => "l2norm",
            Kernel::Gate => "gate",
            Kernel::ChunkLocalCumsum => "chunk_local_cumsum",
            Kernel::ChunkScaledDotKkt => "chunk_scaled_dot_kkt",
            Kernel::SolveTril => "solve_tril",
            Kernel::RecomputeWU => "recompute_w_u",
            Kernel::ChunkState => "chunk_state",
            Kernel::ChunkOutput => "chunk_output",
            Kernel::RecurrentKv => "recurrent_kv",
            Kernel::RecurrentVk => "recurrent_vk",
            Kernel::DecodeKv => "decode_kv",
            Kernel::DecodeVk => "decode_vk",
            Kernel::DecodeKv128 => "decode_kv_k128_v128",
        }
    }

    /// Whether the kernel asks for more dynamic shared memory than the default 48 KiB, so its
    /// function is opted in to the device's limit when loaded.
    pub(crate) fn large_shared(self) -> bool {
        self == Kernel::ChunkState
    }
}

/// What identifies one compiled module: the source, the target (`sm_90`) and the chunk size
/// `BT` for sources that need one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The source.
    pub source: Source,
    /// The target architecture, `sm_XY`.
    pub arch: String,
    /// The chunk size `BT` for sources that need it.
    pub bt: Option<usize>,
}

/// Whether a shared library can be opened under one of `names`.
fn library_present(names: &[&str]) -> bool {
    names.iter().any(|n| {
        // SAFETY: opening a library runs its initialisers; the CUDA libraries' are benign, and
        // cudarc opens the same libraries the same way.
        unsafe { libloading::Library::new(*n) }.is_ok()
    })
}

/// Whether libnvrtc can be loaded on this machine (checked before any NVRTC call: with dynamic
/// loading cudarc panics on a missing library). Where cudarc links the library at build time
/// (its `dynamic-linking` feature) the process cannot start without it, and the check passes.
pub fn nvrtc_available() -> bool {
    library_present(&[
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "libnvrtc.so.11",
        "nvrtc64_130_0.dll",
        "nvrtc64_120_0.dll",
        "nvrtc64_112_0.dll",
    ])
}

/// Whether the CUDA driver library can be loaded (see [`nvrtc_available`]).
pub(crate) fn driver_available() -> bool {
    library_present(&["libcuda.so", "libcuda.so.1", "nvcuda.dll"])
}

fn compile_error(key: &Key, e: CompileError) -> Error {
    let log = match e {
        CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    };
    Error::Compile {
        kernel: key.source.name().to_string(),
        arch: key.arch.clone(),
        log,
    }
}

/// The NVRTC options every kernel is compiled with, for `arch`: plain f32 arithmetic with fused
/// multiply-adds, no approximate division or root; functions without an execution space are
/// device functions (the kernels hold no host code; this lets a generic lambda be one).
///
/// `DELTANET_NVRTC_LINEINFO=1` adds source line tables (for compute-sanitizer and Nsight reports
/// that name the kernel source's lines; the code is unchanged).
pub(crate) fn base_options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--fmad=true".to_string(),
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "-default-device".to_string(),
    ];
    if std::env::var("DELTANET_NVRTC_LINEINFO").is_ok_and(|v| v == "1") {
        o.push("--generate-line-info".to_string());
    }
    o
}

/// The NVRTC options of one module: [`base_options`] and the source's constants.
pub(crate) fn options(key: &Key) -> Result<Vec<String>> {
    let src = key.source;
    let mut options = base_options(&key.arch);
    options.push(format!("-DPARAMS_BYTES={}", src.params_bytes()));
    options.extend(src.defines().iter().map(|(k, v)| format!("-D{k}={v}")));
    match (src.needs_bt(), key.bt) {
        (true, Some(bt)) => options.push(format!("-DBT={bt}")),
        (true, None) => {
            return Err(Error::invalid(
                "BT",
                format!("a chunk size for kernel source {}", src.name()),
                "none",
            ))
        }
        _ => {}
    }
    Ok(options)
}

/// Compiles one module to PTX (no GPU needed, only libnvrtc).
fn compile_uncached(key: &Key) -> Result<String> {
    if !nvrtc_available() {
        return Err(Error::CudaUnavailable("libnvrtc cannot be loaded".into()));
    }
    let src = key.source;
    let options = options(key)?;
    let text = format!("{COMMON}\n{}", src.text());
    let opts = CompileOptions {
        options,
        name: Some(format!("{}.cu", src.name())),
        ..Default::default()
    };
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(text, opts).map_err(|e| compile_error(key, e))?;
    Ok(ptx.to_src())
}

/// The PTX of one module, compiled on first use and then shared by the whole process.
pub fn ptx(key: &Key) -> Result<Ptx> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<String>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = lock(cache)?.get(key) {
        return Ok(Ptx::from_src(p.as_str()));
    }
    // Compiled outside the lock: a concurrent first use compiles twice, harmlessly.
    let p = Arc::new(compile_uncached(key)?);
    lock(cache)?.entry(key.clone()).or_insert_with(|| p.clone());
    Ok(Ptx::from_src(p.as_str()))
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| Error::Cuda {
        context: "kernel registry".into(),
        message: "a thread panicked while holding the lock".into(),
    })
}

/// Compiles every kernel source (each chunk size for those that take one) for `arch`
/// (`sm_90`, `sm_80`, ...), without a GPU: only libnvrtc is needed. Returns how many modules
/// were compiled; fails with the first [`Error::Compile`].
pub fn compile_all(arch: &str) -> Result<usize> {
    let mut n = 0;
    for src in Source::ALL {
        let bts: Vec<Option<usize>> = if src.needs_bt() {
            CHUNK_SIZES.iter().map(|&b| Some(b)).collect()
        } else {
            vec![None]
        };
        for bt in bts {
            compile_uncached(&Key {
                source: src,
                arch: arch.to_string(),
                bt,
            })?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_belongs_to_a_listed_source_and_names_are_unique() {
        let mut names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Kernel::ALL.len());
        for k in Kernel::ALL {
            assert!(Source::ALL.contains(&k.source()), "{k:?}");
            let decl = format!("void {}(", k.name());
            let decl_bounds = format!(") {}(", k.name());
            let text = k.source().text();
            assert!(
                text.contains(&decl) || text.contains(&decl_bounds),
                "{} is not defined in {}.cu",
                k.name(),
                k.source().name()
            );
        }
        for s in Source::ALL {
            assert!(s.text().contains("== PARAMS_BYTES"), "{}", s.name());
            assert!(
                Kernel::ALL.iter().any(|k| k.source() == s),
                "{} has no kernel",
                s.name()
            );
        }
    }
}
