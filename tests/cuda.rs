//! The CUDA backend. The NVRTC test compiles every kernel source without a GPU (it fails in CI,
//! where NVRTC is installed, if the library cannot be loaded); the GPU tests compare every stage
//! with the CPU backend and the forward and recurrent step with the float64 oracle, and skip,
//! saying so, where no GPU can be used.

use deltanet::cuda::registry;

#[test]
fn kernels_compile_with_nvrtc() {
    if !registry::nvrtc_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but libnvrtc cannot be loaded: install nvidia-cuda-nvrtc"
        );
        eprintln!("skipped: libnvrtc cannot be loaded on this machine");
        return;
    }
    for arch in ["sm_90", "sm_80"] {
        match registry::compile_all(arch) {
            Ok(n) => eprintln!("{arch}: {n} modules compiled"),
            Err(e) => panic!("{e}"),
        }
    }
}
