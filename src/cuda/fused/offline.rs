//! Every kernel of the backend (the stage sources at each chunk size and the fused kernels in
//! their standard configurations) as PTX and CUBIN for one architecture, through NVRTC alone:
//! no GPU needed, so register use, spills and SASS can be read offline (`deltanet kernels`).

use std::ffi::{c_char, CString};

use cudarc::nvrtc::{result, sys};

use super::{standard_configs, COMMON, MMA};
use crate::cuda::registry::{self, nvrtc_available, Key, Source};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::CHUNK_SIZES;

/// One compiled kernel module.
#[derive(Clone, Debug)]
pub struct Module {
    /// A file stem naming the source and its compile-time constants.
    pub name: String,
    /// The PTX text.
    pub ptx: String,
    /// The CUBIN (ELF) for the architecture.
    pub cubin: Vec<u8>,
}

/// The options the fused launcher compiles with: the registry's, and `extra`.
pub(super) fn options(arch: &str, extra: &[String]) -> Vec<String> {
    let mut o = registry::base_options(arch);
    o.extend_from_slice(extra);
    o
}

fn fail(name: &str, arch: &str, log: String) -> Error {
    Error::Compile {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log,
    }
}

/// Compiles `text` with `options` to PTX and CUBIN. `arch` must name a real architecture (`sm_90`, not
/// `compute_90`) for NVRTC to produce a CUBIN.
fn compile(name: &str, text: &str, arch: &str, options: &[String]) -> Result<Module> {
    if !nvrtc_available() {
        return Err(Error::CudaUnavailable("libnvrtc cannot be loaded".into()));
    }
    let src =
        CString::new(text).map_err(|_| fail(name, arch, "a NUL byte in the source".into()))?;
    let cname = CString::new(format!("{name}.cu")).expect("kernel names have no NUL");
    let prog = result::create_program(&src, Some(&cname))
        .map_err(|e| fail(name, arch, format!("{e:?}")))?;
    let out = (|| {
        // SAFETY: `prog` was created above and is destroyed once, below.
        unsafe { result::compile_program(prog, options) }.map_err(|e| {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| {
                    let bytes: Vec<u8> =
                        l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            fail(name, arch, format!("{e:?}: {log}"))
        })?;
        // SAFETY: as above; the program compiled.
        let ptx =
            unsafe { result::get_ptx(prog) }.map_err(|e| fail(name, arch, format!("{e:?}")))?;
        let ptx: Vec<u8> = ptx
            .iter()
            .map(|&c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        let mut size = 0usize;
        // SAFETY: as above; `size` receives the CUBIN's length, then the buffer is filled.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size).result() }.map_err(|e| {
            fail(
                name,
                arch,
                format!("no CUBIN ({e:?}); name an sm_XY target"),
            )
        })?;
        let mut cubin = vec![0u8; size];
        // SAFETY: as above; `cubin` holds `size` bytes.
        unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char).result() }
            .map_err(|e| fail(name, arch, format!("{e:?}")))?;
        Ok(Module {
            name: name.to_string(),
            ptx: String::from_utf8_lossy(&ptx).into_owned(),
            cubin,
        })
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Every kernel module of the backend for `arch` (`sm_90`): the stage sources (at each chunk
/// size where they take one) and the fused kernels in [`standard_configs`].
pub fn all_modules(arch: &str) -> Result<Vec<Module>> {
    let mut out = Vec::new();
    for source in Source::ALL {
        let bts: Vec<Option<usize>> = if source.needs_bt() {
            CHUNK_SIZES.iter().map(|&b| Some(b)).collect()
        } else {
            vec![None]
        };
        for bt in bts {
            let key = Key {
                source,
                arch: arch.to_string(),
                bt,
            };
            let name = match bt {
                Some(b) => format!("{}_bt{b}", source.name()),
                None => source.name().to_string(),
            };
            let text = format!("{}\n{}", registry::COMMON, source.text());
            out.push(compile(&name, &text, arch, &registry::options(&key)?)?);
        }
    }
    // The warpgroup products exist on sm_90 (as sm_90a) alone.
    for cfg in standard_configs()
        .into_iter()
        .filter(|c| !c.wgmma || arch == "sm_90")
    {
        for kernel in cfg.kernels() {
            let name = format!(
                "fused_{}_k{}_v{}_vt{}_{}{}{}{}{}{}{}{}{}{}{}{}{}{}",
                kernel.name(),
                cfg.dk,
                cfg.dv,
                cfg.vt,
                cfg.dtype.name(),
                if cfg.wide { "_wide" } else { "" },
                if cfg.regs {
                    format!("_pieces{}", cfg.pieces)
                } else {
                    String::new()
                },
                match (cfg.split, cfg.ksplit, cfg.hbuf) {
                    (true, true, false) => "_split_ksplit",
                    (true, true, true) => "_split_ksplit_hbuf",
                    (true, false, false) => "_split",
                    (true, false, true) => "_split_hbuf",
                    _ => "",
                },
                if cfg.late_planes { "_late" } else { "" },
                if cfg.row_skip { "_rowskip" } else { "" },
                match (cfg.wgmma, cfg.wg_tri) {
                    (true, true) => "_wgmma_tri",
                    (true, false) => "_wgmma",
                    _ => "",
                },
                if cfg.out == DType::F32 {
                    String::new()
                } else {
                    format!("_o{}", cfg.out.name())
                },
                if cfg.intra_diag { "_diag" } else { "" },
                if cfg.intra_doubling { "_doubling" } else { "" },
                if cfg.intra_doubling_mma { "_mma" } else { "" },
                if cfg.p_in_rec { "_pinrec" } else { "" },
                if cfg.intra_blocks == super::INTRA_BLOCKS {
                    String::new()
                } else {
                    format!("_ib{}", cfg.intra_blocks)
                },
                if cfg.rec_regs == 0 {
                    String::new()
                } else {
                    format!("_regs{}", cfg.rec_regs)
                },
            );
            let text = format!("{}{COMMON}\n{MMA}\n{}", cfg.defines(), kernel.text());
            let target = cfg.target(arch);
            out.push(compile(&name, &text, &target, &options(&target, &[]))?);
        }
    }
    Ok(out)
}
