//! The kernel registry: every kernel source of the backend, compiled at run time by NVRTC for one
//! GPU architecture, once per process for each (kernel, architecture, compile-time constants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::error::{Error, Result};
use crate::options::CHUNK_SIZES;

/// Declarations every kernel source starts with (prepended at compile time).
const COMMON: &str = include_str!("kernels/common.cuh");

/// One kernel source file: its name, its text, and whether it needs the chunk size `BT` as a
/// compile-time constant (it sizes shared-memory arrays).
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// The stage's name, also the file's stem under `src/cuda/kernels/`.
    pub name: &'static str,
    /// The CUDA C++ text (no toolkit headers).
    pub text: &'static str,
    /// Compiled once per chunk size, with `-DBT=<chunk size>`.
    pub needs_bt: bool,
}

/// Every kernel source of the backend.
pub const SOURCES: [Source; 11] = [
    Source {
        name: "cast",
        text: include_str!("kernels/cast.cu"),
        needs_bt: false,
    },
    Source {
        name: "l2norm",
        text: include_str!("kernels/l2norm.cu"),
        needs_bt: false,
    },
    Source {
        name: "gate",
        text: include_str!("kernels/gate.cu"),
        needs_bt: false,
    },
    Source {
        name: "cumsum",
        text: include_str!("kernels/cumsum.cu"),
        needs_bt: false,
    },
    Source {
        name: "kkt",
        text: include_str!("kernels/kkt.cu"),
        needs_bt: true,
    },
    Source {
        name: "solve_tril",
        text: include_str!("kernels/solve_tril.cu"),
        needs_bt: true,
    },
    Source {
        name: "wy",
        text: include_str!("kernels/wy.cu"),
        needs_bt: true,
    },
    Source {
        name: "chunk_state",
        text: include_str!("kernels/chunk_state.cu"),
        needs_bt: true,
    },
    Source {
        name: "chunk_output",
        text: include_str!("kernels/chunk_output.cu"),
        needs_bt: true,
    },
    Source {
        name: "recurrent",
        text: include_str!("kernels/recurrent.cu"),
        needs_bt: false,
    },
    Source {
        name: "decode",
        text: include_str!("kernels/fused/decode.cu"),
        needs_bt: false,
    },
];

/// What identifies one compiled module: the source, the target (`sm_90`) and the compile-time
/// constants (`BT`, or none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The source's name (see [`SOURCES`]).
    pub kernel: &'static str,
    /// The target architecture, `sm_XY`.
    pub arch: String,
    /// The chunk size `BT` for sources that need it.
    pub bt: Option<usize>,
}

fn source(kernel: &str) -> Result<&'static Source> {
    SOURCES
        .iter()
        .find(|s| s.name == kernel)
        .ok_or_else(|| Error::invalid("kernel", "a kernel source of the CUDA backend", kernel))
}

/// Whether libnvrtc can be loaded on this machine (checked before any NVRTC call, since cudarc
/// panics on a missing library).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the shared library; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn compile_error(key: &Key, e: CompileError) -> Error {
    let log = match e {
        CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    };
    Error::Compile {
        kernel: key.kernel.to_string(),
        arch: key.arch.clone(),
        log,
    }
}

/// Compiles one module to PTX (no GPU needed, only libnvrtc).
fn compile_uncached(key: &Key) -> Result<String> {
    if !nvrtc_available() {
        return Err(Error::CudaUnavailable("libnvrtc cannot be loaded".into()));
    }
    let src = source(key.kernel)?;
    let mut options = vec![
        format!("--gpu-architecture={}", key.arch),
        "--std=c++17".to_string(),
        // Plain f32 arithmetic with fused multiply-adds; no approximate division or root.
        "--fmad=true".to_string(),
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
    ];
    match (src.needs_bt, key.bt) {
        (true, Some(bt)) => options.push(format!("-DBT={bt}")),
        (true, None) => {
            return Err(Error::invalid(
                "BT",
                format!("a chunk size for kernel {}", key.kernel),
                "none",
            ))
        }
        _ => {}
    }
    let text = format!("{COMMON}\n{}", src.text);
    let opts = CompileOptions {
        options,
        name: Some(format!("{}.cu", key.kernel)),
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
    for src in SOURCES.iter() {
        let bts: Vec<Option<usize>> = if src.needs_bt {
            CHUNK_SIZES.iter().map(|&b| Some(b)).collect()
        } else {
            vec![None]
        };
        for bt in bts {
            compile_uncached(&Key {
                kernel: src.name,
                arch: arch.to_string(),
                bt,
            })?;
            n += 1;
        }
    }
    Ok(n)
}
