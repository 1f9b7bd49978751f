//! Every kernel (the stage sources and the fused kernels in their standard configurations)
//! compiles through NVRTC to PTX and CUBIN for sm_90 without a GPU, the fused ones with
//! tensor-core products. Skipped, with a message, where libnvrtc cannot be loaded (an error
//! in CI, where it is installed).

use deltanet::cuda::fused::offline::all_modules;
use deltanet::cuda::registry::nvrtc_available;

#[test]
fn all_kernels_compile_to_ptx_and_cubin_for_sm90_or_skip_without_nvrtc() {
    if !nvrtc_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but libnvrtc cannot be loaded: install nvidia-cuda-nvrtc"
        );
        eprintln!("SKIPPED: libnvrtc cannot be loaded (set LD_LIBRARY_PATH to its folder)");
        return;
    }
    let modules = all_modules("sm_90").unwrap_or_else(|e| panic!("{e}"));
    let dump = std::env::var_os("DELTANET_DUMP_PTX").map(std::path::PathBuf::from);
    let mut fused = 0;
    for m in &modules {
        assert!(
            m.ptx.contains(".target sm_90"),
            "{}: PTX for another target",
            m.name
        );
        assert_eq!(
            &m.cubin[..4],
            b"\x7fELF",
            "{}: the CUBIN is not an ELF image",
            m.name
        );
        if m.name.starts_with("fused_") {
            fused += 1;
            // bf16 products (on split operands) in chunk_recurrent_regs, wgmma's where it has them;
            // in chunk_intra m16n8k16
            // on the 16-bit inputs themselves, TF32 for f32 inputs; TF32 in chunk_recurrent.
            // Names: fused_<kernel>_k<K>_v<V>_vt<VT>_<input dtype>[_...].
            let dtype = m.name.split("_vt").nth(1).and_then(|r| r.split('_').nth(1));
            let mma = match (
                m.name.contains("chunk_recurrent_regs"),
                m.name.contains("chunk_intra"),
                dtype,
            ) {
                // On warpgroup products (sm_90a), the triangular ones too with `_tri`.
                (true, _, _) if m.name.contains("_wgmma") => {
                    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"
                }
                (true, _, _) | (_, true, Some("bf16")) => {
                    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                }
                (_, true, Some("f16")) => "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                _ => "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
            };
            assert!(
                m.ptx.contains(mma),
                "{}: no tensor-core product in the PTX",
                m.name
            );
        }
        // A register cap reaches the PTX (`rec_regs`, `Config` in the module's name).
        let cap = m
            .name
            .rsplit("_regs")
            .next()
            .and_then(|r| r.parse::<u32>().ok());
        if let Some(r) = cap {
            if m.name.starts_with("fused_chunk_recurrent_regs") {
                assert!(
                    m.ptx.contains(&format!(".maxnreg {r}")),
                    "{}: no register cap in the PTX",
                    m.name
                );
            }
        }
        if let Some(d) = &dump {
            std::fs::write(d.join(format!("{}.ptx", m.name)), &m.ptx).unwrap();
        }
    }
    assert!(fused >= 2 * 6, "{fused} fused modules");
    eprintln!("{} modules compiled ({fused} fused)", modules.len());
}
