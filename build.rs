//! Sets the cfg `deltanet_avx512` when the compiler has the AVX-512 intrinsics and target
//! feature stable (Rust 1.89): the CPU kernels in src/cpu/kernel.rs use them, and older compilers
//! within the crate's rust-version build the portable paths instead.

fn main() {
    println!("cargo:rustc-check-cfg=cfg(deltanet_avx512)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let minor = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .nth(1)?
                .split('.')
                .nth(1)?
                .parse::<u32>()
                .ok()
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=deltanet_avx512");
    }
}
