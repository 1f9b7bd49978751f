//! `deltanet bench`: repeated timings of the prefill, the decode step and solve_tril.

use std::path::PathBuf;
use std::process::ExitCode;

use deltanet::selftest::{layer_inputs, Rng};
use deltanet::{activate, cpu, upload_inputs, DType, Device, HostIo, Options, Problem};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::{device_arg, open_device, CmdResult, Failure};

/// What to time.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// The chunked forward over B x T tokens (inputs already on the device).
    Prefill,
    /// One decode step of B sequences with --tokens tokens each, states in a pool (--pool).
    Decode,
    /// The tri-solve invert of every chunk block.
    #[value(name = "solve_tril", alias = "solve-tril")]
    SolveTril,
    /// All of the above.
    All,
}

/// Time the prefill, the decode step and solve_tril on a device.
///
/// Warm-up runs, then --repeats timed runs of each piece of work (device events on a GPU, wall
/// clock on the CPU), with inputs already on the device. Prints median, min and max, tokens/s
/// for the prefill and decode, and effective bytes/s (bytes read + written) for decode and
/// solve_tril; --json writes the same for harnesses.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// auto (a GPU if one can be used, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = device_arg)]
    device: String,
    /// B,T,H,HV,K,V (decode uses B sequences of one token).
    #[arg(long, default_value = "1,4096,16,32,128,128", value_parser = parse_shape)]
    shape: Shape,
    /// Element type of q, k, v.
    #[arg(long, default_value = "bf16", value_parser = crate::parse_dtype)]
    dtype: DType,
    /// What to time.
    #[arg(long, value_enum, default_value = "all")]
    work: Work,
    /// Timed runs of each piece of work.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    repeats: u64,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Chunk size of the prefill and solve_tril.
    #[arg(long, default_value_t = 64, value_parser = crate::parse_chunk)]
    chunk_size: usize,
    /// Tokens per sequence of the decode step (speculative decoding verifies several).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    tokens: u64,
    /// Rows of the decode step's state pool; the B sequences use random distinct rows of it.
    /// Default: B rows, sequence n in row n.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pool: Option<u64>,
    /// Decode states stored [.., V, K] (llama.cpp's and FlashInfer's layout).
    #[arg(long)]
    state_v_first: bool,
}

/// B, T, H, HV, K, V.
#[derive(Clone, Copy, Debug)]
pub struct Shape([usize; 6]);

fn parse_shape(s: &str) -> Result<Shape, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let bad = || {
        format!("expected six positive integers B,T,H,HV,K,V with HV a multiple of H, got {s:?}")
    };
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut d = [0usize; 6];
    for (x, p) in d.iter_mut().zip(&parts) {
        *x = p.parse().map_err(|_| bad())?;
        if *x == 0 {
            return Err(bad());
        }
    }
    if d[3] % d[2] != 0 {
        return Err(bad());
    }
    Ok(Shape(d))
}

/// One piece of work's timings.
struct Row {
    work: &'static str,
    times_ms: Vec<f64>,
    tokens: Option<usize>,
    bytes: Option<u128>,
}

impl Row {
    fn sorted(&self) -> Vec<f64> {
        let mut t = self.times_ms.clone();
        t.sort_by(f64::total_cmp);
        t
    }
    fn median(&self) -> f64 {
        let t = self.sorted();
        let n = t.len();
        if n == 0 {
            return f64::NAN;
        }
        if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2.0
        }
    }
    fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }
    fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
    fn tokens_per_s(&self) -> Option<f64> {
        self.tokens.map(|t| t as f64 / (self.median() / 1e3))
    }
    fn bytes_per_s(&self) -> Option<f64> {
        self.bytes.map(|b| b as f64 / (self.median() / 1e3))
    }
}

fn si(x: f64) -> String {
    let units = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (s, u) in units {
        if x >= s {
            return format!("{:.2} {u}", x / s);
        }
    }
    format!("{x:.2} ")
}

pub fn main(a: Args) -> CmdResult {
    let device = open_device(&a.device)?;
    let [b, t, h, hv, k, v] = a.shape.0;
    let works: Vec<Work> = match a.work {
        Work::All => vec![Work::Prefill, Work::Decode, Work::SolveTril],
        w => vec![w],
    };
    let opts = Options {
        chunk_size: a.chunk_size,
        ..Options::default()
    };
    // Refuse shapes this machine cannot hold before allocating anything.
    crate::layer_problem("--shape", [b, t, h, hv, k, v], &opts)?;

    let total = (a.warmup + a.repeats) * works.len() as u64;
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:<12} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let others: Vec<Work> = works
        .iter()
        .copied()
        .filter(|&w| w != Work::Decode)
        .collect();
    let rows = match &device {
        Device::Cpu => bench_on(&cpu::Cpu, &a, &others, &opts, &bar),
        Device::Cuda(d) => bench_on(d.as_ref(), &a, &others, &opts, &bar),
    };
    let mut rows = rows?;
    if works.contains(&Work::Decode) {
        let d = crate::bench_decode::DecodeBench {
            shape: a.shape.0,
            dtype: a.dtype,
            tokens: a.tokens as usize,
            pool: a.pool.map(|p| p as usize),
            warmup: a.warmup,
            repeats: a.repeats,
            state_v_first: a.state_v_first,
        };
        rows.extend(
            crate::bench_decode::run(&device, &d, &bar)?
                .into_iter()
                .map(|r| Row {
                    work: r.work,
                    times_ms: r.times_ms,
                    tokens: r.tokens,
                    bytes: r.bytes,
                }),
        );
    }
    bar.finish_and_clear();

    println!(
        "device {}  shape B={b} T={t} H={h} HV={hv} K={k} V={v}  {}  chunk {}  {} warm-up + {} timed runs",
        device.name(),
        a.dtype,
        a.chunk_size,
        a.warmup,
        a.repeats
    );
    println!(
        "{:<11} {:>11} {:>11} {:>11}  throughput",
        "work", "median ms", "min ms", "max ms"
    );
    for r in &rows {
        let mut thr = Vec::new();
        if let Some(x) = r.tokens_per_s() {
            thr.push(format!("{}tokens/s", si(x)));
        }
        if let Some(x) = r.bytes_per_s() {
            thr.push(format!("{}B/s", si(x)));
        }
        println!(
            "{:<11} {:>11.3} {:>11.3} {:>11.3}  {}",
            r.work,
            r.median(),
            r.min(),
            r.max(),
            thr.join(", ")
        );
    }
    if let Some(path) = &a.json {
        let results: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "work": r.work,
                    "median_ms": r.median(),
                    "min_ms": r.min(),
                    "max_ms": r.max(),
                    "times_ms": r.times_ms,
                    "tokens": r.tokens,
                    "tokens_per_s": r.tokens_per_s(),
                    "bytes": r.bytes.map(|b| b as f64),
                    "bytes_per_s": r.bytes_per_s(),
                })
            })
            .collect();
        let doc = json!({
            "device": device.name(),
            "shape": {"B": b, "T": t, "H": h, "HV": hv, "K": k, "V": v},
            "dtype": a.dtype.name(),
            "chunk_size": a.chunk_size,
            "warmup": a.warmup,
            "repeats": a.repeats,
            "results": results,
        });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| Failure::data(format!("--json: {e}")))?;
        deltanet::io::write_atomic_with(path, |f| {
            use std::io::Write;
            f.write_all(text.as_bytes())
                .and_then(|()| f.write_all(b"\n"))
                .map_err(|e| deltanet::Error::file(path, format!("cannot write: {e}")))
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

fn time_n<D: HostIo>(
    dev: &D,
    a: &Args,
    bar: &ProgressBar,
    name: &str,
    f: &mut dyn FnMut() -> deltanet::Result<()>,
) -> deltanet::Result<Vec<f64>> {
    bar.set_message(name.to_string());
    for _ in 0..a.warmup {
        f()?;
        dev.synchronize()?;
        bar.inc(1);
    }
    let mut times = Vec::with_capacity(a.repeats as usize);
    for _ in 0..a.repeats {
        times.push(dev.time_ms(f)?);
        bar.inc(1);
    }
    Ok(times)
}

fn bench_on<D: HostIo>(
    dev: &D,
    a: &Args,
    works: &[Work],
    opts: &Options,
    bar: &ProgressBar,
) -> Result<Vec<Row>, Failure> {
    let [b, t, h, hv, k, v] = a.shape.0;
    let mut rng = Rng::new(0);
    let mut rows = Vec::new();
    let f4 = 4u128;
    if works.contains(&Work::Prefill) || works.contains(&Work::SolveTril) {
        let x = layer_inputs(&mut rng, [b, t, h, hv, k, v], a.dtype, false)?;
        let p = Problem::from_inputs(&x, opts)?;
        let s = upload_inputs(dev, &p, &x, opts)?;
        dev.synchronize()?;
        if works.contains(&Work::Prefill) {
            let times = time_n(dev, a, bar, "prefill", &mut || {
                dev.forward(&p, opts, &s).map(|_| ())
            })?;
            rows.push(Row {
                work: "prefill",
                times_ms: times,
                tokens: Some(p.tokens()),
                bytes: None,
            });
        }
        if works.contains(&Work::SolveTril) {
            let act = activate(dev, &p, opts, &s)?;
            let gamma = dev.chunk_local_cumsum(&p, &act.g)?;
            let a_strict = dev.chunk_scaled_dot_kkt(&p, act.k(), &act.beta, &gamma)?;
            dev.synchronize()?;
            let times = time_n(dev, a, bar, "solve_tril", &mut || {
                dev.solve_tril(&p, &a_strict).map(|_| ())
            })?;
            // Reads A_strict, writes A_inv: both [B, T, HV, BT] f32.
            let bytes = 2 * f4 * (p.tokens() * hv * p.chunk_size()) as u128;
            rows.push(Row {
                work: "solve_tril",
                times_ms: times,
                tokens: None,
                bytes: Some(bytes),
            });
        }
    }
    Ok(rows)
}
