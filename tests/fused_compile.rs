//! The fused kernels compile through NVRTC for sm_90 (no GPU needed), with tensor-core
//! instructions in their PTX. Skipped, with a message, where libnvrtc cannot be loaded.

use deltanet::cuda::fused::{compile_ptx, standard_configs, Kernel};
use deltanet::cuda::registry::nvrtc_available;

#[test]
fn fused_kernels_compile_for_sm90_or_skip_without_nvrtc() {
    if !nvrtc_available() {
        eprintln!("SKIPPED: libnvrtc cannot be loaded (set LD_LIBRARY_PATH to its folder)");
        return;
    }
    let dump = std::env::var_os("DELTANET_DUMP_PTX").map(std::path::PathBuf::from);
    for cfg in standard_configs() {
        for kernel in Kernel::ALL {
            let ptx = compile_ptx(kernel, "sm_90", &cfg)
                .unwrap_or_else(|e| panic!("{} {cfg:?}: {e}", kernel.name()));
            assert!(
                ptx.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
                "{} {cfg:?}: no tensor-core product in the PTX",
                kernel.name()
            );
            assert!(ptx.contains(&format!(".entry {}", kernel.name())));
            if let Some(d) = &dump {
                let name = format!(
                    "{}_k{}_v{}_vt{}_{}{}.ptx",
                    kernel.name(),
                    cfg.dk,
                    cfg.dv,
                    cfg.vt,
                    cfg.dtype.name(),
                    if cfg.wide { "_wide" } else { "" }
                );
                std::fs::write(d.join(name), &ptx).unwrap();
            }
        }
    }
}
