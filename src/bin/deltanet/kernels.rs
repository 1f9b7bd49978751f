//! `deltanet kernels`: every kernel's PTX and CUBIN for one architecture, written without a GPU
//! (NVRTC alone), for reading register use, spills and SASS offline.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::{CmdResult, Failure};

/// Write every kernel's PTX and CUBIN for an architecture (no GPU needed, only libnvrtc).
///
/// One NAME.ptx and NAME.cubin per module: the stage kernels at each chunk size and the fused
/// kernels in their standard configurations (NAME says the constants). Read them with
/// `cuobjdump -sass NAME.cubin` or `ptxas -arch=sm_90 -v NAME.ptx`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Target architecture, a real one (sm_90, sm_80, ...).
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// Folder to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn main(a: Args) -> CmdResult {
    let ok = a.arch.strip_prefix("sm_").is_some_and(|n| {
        !n.is_empty() && n.trim_end_matches('a').chars().all(|c| c.is_ascii_digit())
    });
    if !ok {
        return Err(Failure::usage(format!(
            "--arch: expected a real architecture like sm_90, got {}",
            a.arch
        )));
    }
    std::fs::create_dir_all(&a.out)
        .map_err(|e| Failure::data(format!("--out {}: {e}", a.out.display())))?;
    let modules = deltanet::cuda::fused::offline::all_modules(&a.arch)?;
    for m in &modules {
        for (ext, bytes) in [("ptx", m.ptx.as_bytes()), ("cubin", m.cubin.as_slice())] {
            let path = a.out.join(format!("{}.{ext}", m.name));
            std::fs::write(&path, bytes)
                .map_err(|e| Failure::data(format!("writing {}: {e}", path.display())))?;
        }
    }
    println!(
        "{} modules for {} written to {} (.ptx and .cubin each)",
        modules.len(),
        a.arch,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
