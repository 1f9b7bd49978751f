//! `deltanet`: run the gated delta rule forward on safetensors files, demo it, benchmark it and
//! check a device for conformance, from the command line.

mod bench;
mod bench_decode;
mod demo;
mod kernels;
mod lifecycle;
mod plot;
mod run;
mod selftest;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Gated DeltaNet (gated delta rule) linear attention on the CPU and NVIDIA GPUs, with FLA's
/// semantics and layouts.
#[derive(Parser, Debug)]
#[command(name = "deltanet", version, propagate_version = true)]
#[command(
    after_help = "Exit codes: 0 success, 1 bad data or failed checks, 2 usage errors; ended by a \
                  signal: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE (output closed early)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compute o and the final state for the inputs in a safetensors file.
    Run(run::Args),
    /// Run a Qwen3-Next-shaped layer (B=1, T=4096, H=16, HV=32, K=V=128, bf16) on the best
    /// device and check the chunked forward against the recurrent path.
    Demo(demo::Args),
    /// Time the prefill, the decode step and solve_tril on a device.
    Bench(bench::Args),
    /// Check a device against the float64 oracle: random problems, every stage, the vector files.
    Selftest(selftest::Args),
    /// Write every kernel's PTX and CUBIN for an architecture, without a GPU.
    Kernels(kernels::Args),
    /// Draw prefill time per token against T (log scales, SVG) from bench and anchor JSON files.
    Plot(plot::Args),
}

/// A failure of a command: the exit code and a one-line message (printed once, by `main`).
#[derive(Debug)]
pub struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Bad data, a device error or a failed check: exit code 1.
    pub fn data(message: impl ToString) -> Self {
        Failure {
            code: 1,
            message: message.to_string(),
        }
    }
    /// A usage error (bad argument value): exit code 2.
    pub fn usage(message: impl ToString) -> Self {
        Failure {
            code: 2,
            message: message.to_string(),
        }
    }
}

impl From<deltanet::Error> for Failure {
    fn from(e: deltanet::Error) -> Self {
        Failure::data(e)
    }
}

/// What a command returns.
pub type CmdResult = Result<ExitCode, Failure>;

/// Checks the syntax of a `--device` value at parse time, so a typo is a usage error (exit 2)
/// while a device that cannot be opened is a run-time one (exit 1).
pub fn device_arg(s: &str) -> Result<String, String> {
    let ok = matches!(s, "auto" | "cpu" | "cuda")
        || s.strip_prefix("cuda:")
            .is_some_and(|n| n.parse::<usize>().is_ok());
    if ok {
        Ok(s.to_string())
    } else {
        Err("expected auto, cpu, cuda or cuda:N".into())
    }
}

/// Opens the device named by a (syntactically valid) `--device` value.
pub fn open_device(s: &str) -> Result<deltanet::Device, Failure> {
    deltanet::Device::parse(s).map_err(|e| Failure::data(format!("device {s}: {e}")))
}

/// The problem of a generated layer of sizes `[B, T, H, HV, K, V]`, refused (as a usage error
/// naming `flag`) when its shapes are invalid or its forward would not fit in memory.
pub fn layer_problem(
    flag: &str,
    d: [usize; 6],
    opts: &deltanet::Options,
) -> Result<deltanet::Problem, Failure> {
    let dims = deltanet::Dims::from(d);
    let p = deltanet::Problem::new(dims, None, opts)
        .map_err(|e| Failure::usage(format!("{flag}: {e}")))?;
    ensure_memory(flag, &p, opts)?;
    Ok(p)
}

/// Refuses, with a clear message, a problem whose forward would not fit in the memory available
/// now (an allocation failure would abort the process instead).
fn ensure_memory(
    what: &str,
    p: &deltanet::Problem,
    opts: &deltanet::Options,
) -> Result<(), Failure> {
    // The inputs themselves, generated in f32, come on top of the forward's work.
    let need = deltanet::io::forward_bytes(p, opts) * 3 / 2;
    if let Some(avail) = deltanet::io::available_memory() {
        if need > avail {
            return Err(Failure::data(format!(
                "{what}: too large to allocate: needs about {:.1} GiB, {:.1} GiB available",
                need as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            )));
        }
    }
    Ok(())
}

/// clap parser of an element type flag.
fn parse_dtype(s: &str) -> Result<deltanet::DType, String> {
    s.parse()
        .map_err(|_| "expected f32, bf16 or f16".to_string())
}

/// clap parser of a chunk size flag.
fn parse_precision(s: &str) -> Result<deltanet::Precision, String> {
    s.parse().map_err(|_| "expected exact or fast".to_string())
}

fn parse_chunk(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(c) if deltanet::CHUNK_SIZES.contains(&c) => Ok(c),
        _ => Err("expected 16, 32 or 64".into()),
    }
}

fn main() -> ExitCode {
    // No code path is meant to panic; should one anyway, report it as one line (no backtrace)
    // and exit 1 rather than 101, after unwinding has removed any temporary output.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        eprintln!("deltanet: internal error: {msg}");
    }));
    // Signals (Ctrl-C, termination, a closed pipe, a truncated input) end the process without
    // leaving temporary output.
    lifecycle::install();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, like every other error: clap's message without its usage block.
            let text = e.to_string();
            let line: Vec<&str> = text
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("deltanet: {}", line.join(" ").trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let r = std::panic::catch_unwind(|| match cli.command {
        Command::Run(a) => run::main(a),
        Command::Demo(a) => demo::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Selftest(a) => selftest::main(a),
        Command::Kernels(a) => kernels::main(a),
        Command::Plot(a) => plot::main(a),
    });
    let Ok(r) = r else {
        return ExitCode::from(1);
    };
    match r {
        Ok(code) => code,
        Err(f) => {
            eprintln!("deltanet: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
