//! `deltanet selftest`: the conformance suite on a chosen device.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::{device_arg, open_device, CmdResult};

/// Check a device against the float64 oracle.
///
/// Random problems (every option, odd shapes, varlen, hard resets, f32/bf16/f16) check each
/// stage against its definition, the forward and the recurrent step against the oracle, prefill
/// plus decode against a longer prefill, and run-to-run bitwise equality; then every
/// `*.safetensors` file in --vectors is checked against its `o_ref` and `final_state_ref`.
/// Prints one line per check and `N passed, M failed`; exits 1 on any failure.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// auto (a GPU if one can be used, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = device_arg)]
    device: String,
    /// A folder of conformance vector files (`*.safetensors` with `o_ref`, `final_state_ref`).
    #[arg(long, value_name = "DIR")]
    vectors: Option<PathBuf>,
    /// Seed of the random problems (the same seed gives the same problems everywhere).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of random problems.
    #[arg(long, default_value_t = 50)]
    count: usize,
    /// exact (every product to f32 rounding) or fast (bf16 operands where a GPU's fused kernel
    /// reads bf16 inputs; checked at the same bounds, 5e-3 for those).
    #[arg(long, default_value = "exact", value_parser = crate::parse_precision)]
    precision: deltanet::Precision,
}

pub fn main(a: Args) -> CmdResult {
    if a.count == 0 && a.vectors.is_none() {
        return Err(crate::Failure::usage(
            "--count: expected at least 1 random problem (or a --vectors folder), got 0: nothing would be checked",
        ));
    }
    let device = open_device(&a.device)?;
    println!(
        "selftest on {}, {} precision: seed {}, {} random problem{}{}",
        device.name(),
        format!("{:?}", a.precision).to_lowercase(),
        a.seed,
        a.count,
        if a.count == 1 { "" } else { "s" },
        a.vectors
            .as_ref()
            .map(|d| format!(", vectors in {}", d.display()))
            .unwrap_or_default()
    );
    let mut out = std::io::stdout().lock();
    let checks = deltanet::selftest::run(
        &device,
        a.seed,
        a.count,
        a.vectors.as_deref(),
        a.precision,
        &mut |c| {
            let tag = if c.passed { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "{tag} {}: {}", c.name, c.detail);
            let _ = out.flush();
        },
    );
    let failed = checks.iter().filter(|c| !c.passed).count();
    let passed = checks.len() - failed;
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
