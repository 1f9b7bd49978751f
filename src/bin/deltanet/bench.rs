//! `deltanet bench`: repeated timings of the prefill, the decode step and solve_tril.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use deltanet::selftest::{layer_inputs_periodic, Rng};
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use deltanet::cuda::{CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, TokenInputs, Workspace};
use deltanet::{
    activate, cpu, upload_inputs, DType, Data, Device, Error, HostIo, Inputs, Options, Problem,
    Tensor,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::{device_arg, open_device, CmdResult, Failure};

/// Tokens after which the prefill's inputs repeat (see `layer_inputs_periodic`).
const PERIOD: usize = 8192;

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
/// and FLOP/s (of the chunked algorithm) for the prefill, tokens/s for decode, and effective
/// bytes/s (bytes read + written) for decode and solve_tril; --json writes the same for
/// harnesses. --varlen N packs the T tokens of --shape (B = 1) into N sequences.
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
    /// Pack the T tokens of --shape (which must have B = 1) into N sequences for the prefill and
    /// solve_tril, with ../shared/gpu/anchors.py's lengths: weights w_i = 1 + (37 i mod 64),
    /// length_i = floor(T w_i / sum w) for i < N - 1, the last sequence takes the rest.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    varlen: Option<u64>,
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
    /// exact (products to f32 rounding) or fast (bf16 operands where the fused GPU kernel for
    /// bf16 inputs runs).
    #[arg(long, default_value = "exact", value_parser = crate::parse_precision)]
    precision: deltanet::Precision,
    /// Also time the prefill with its tokens split among N ranks (context parallelism; B = 1):
    /// one process drives the devices, a thread per rank (GPUs cuda:0..N-1 where there are
    /// that many, else the ranks share --device), the ranks' summaries exchanged through host
    /// memory. Timed end to end from host tensors, beside the plain forward timed the same
    /// way; prints the speed-up and the exchange's share.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..=64))]
    ranks: Option<u64>,
    /// How the ranks of --ranks trade their summaries: `host` (host memory, the ranks' threads
    /// sharing it) or `nccl` (NCCL all-gathers between the GPUs, as between processes; one GPU
    /// per rank, --device cuda; libnccl.so loaded at run time).
    #[arg(long, default_value = "host", value_parser = ["host", "nccl"])]
    exchange: String,
    /// Share of the value heads (every k-th one, from head 0) whose gate is -0.001 a token for
    /// the prefill: the slow decay of the longest-memory heads of a trained Qwen3-Next layer,
    /// which the GPU's segmented prefill cannot cut (the others keep the usual
    /// -softplus(U(-5, 1)) / 2).
    #[arg(long, default_value_t = 0.0, value_parser = parse_share)]
    slow_heads: f64,
}

/// The sequence offsets of `n` sequences sharing `t` tokens by the anchors' rule (see
/// `Args::varlen`).
fn varlen_cu_seqlens(n: usize, t: usize) -> Vec<i64> {
    let w: Vec<u128> = (0..n as u128).map(|i| 1 + (37 * i) % 64).collect();
    let sum: u128 = w.iter().sum();
    let mut cu = vec![0i64];
    for &wi in &w[..n - 1] {
        let len = (t as u128 * wi / sum) as i64;
        cu.push(cu[cu.len() - 1] + len);
    }
    cu.push(t as i64);
    cu
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
    flops: Option<f64>,
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
    fn flops_per_s(&self) -> Option<f64> {
        self.flops.map(|f| f / (self.median() / 1e3))
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
    let [b, t, h, hv, k, v] = a.shape.0;
    if let Some(n) = a.varlen {
        if b != 1 {
            return Err(Failure::usage(format!(
                "--varlen: expected --shape with B = 1 (the N sequences share its T tokens), got B = {b}"
            )));
        }
        if n > t as u64 {
            return Err(Failure::usage(format!(
                "--varlen: expected at most T = {t} sequences, got {n}"
            )));
        }
    }
    // Before any work: a results file that cannot be written fails now, not after the benchmark.
    if let Some(path) = &a.json {
        deltanet::io::check_output_path(path)?;
    }
    if a.ranks.is_some() && b != 1 {
        return Err(Failure::usage(format!(
            "--ranks: expected --shape with B = 1 (the ranks split one packed batch), got B = {b}"
        )));
    }
    if a.ranks.is_some() && !matches!(a.work, Work::Prefill | Work::All) {
        return Err(Failure::usage(
            "--ranks: expected --work prefill or all (the ranks split the prefill)",
        ));
    }
    if a.exchange == "nccl" && (a.ranks.is_none() || !a.device.starts_with("cuda")) {
        return Err(Failure::usage(
            "--exchange nccl: expected --ranks N and --device cuda (one GPU per rank)",
        ));
    }
    let device = open_device(&a.device)?;
    let works: Vec<Work> = match a.work {
        Work::All => vec![Work::Prefill, Work::Decode, Work::SolveTril],
        w => vec![w],
    };
    let opts = Options {
        chunk_size: a.chunk_size,
        precision: a.precision,
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
        Device::Cpu => bench_on(&cpu::Cpu, &a, &others, &opts, &bar, None),
        Device::Cuda(d) => bench_on(d.as_ref(), &a, &others, &opts, &bar, Some(d)),
    };
    let mut rows = rows?;
    let mut ranks_note = None;
    if let Some(n) = a.ranks {
        let (devices, note) = rank_devices(&device, n as usize);
        let r = bench_ranks(&devices, &a, &opts, &bar)?;
        let med = |w: &str| {
            r.iter()
                .find(|x| x.work == w)
                .map(|x| x.sorted()[x.times_ms.len() / 2])
        };
        if let (Some(one), Some(many), Some(ex)) = (
            med("prefill host"),
            med("prefill ranks"),
            med("rank exchange"),
        ) {
            ranks_note = Some(format!(
                "{n} ranks on {note}: {:.2}x the plain forward (efficiency {:.0} %), the exchange (waits included) {:.1} % of the time",
                one / many,
                100.0 * one / many / n as f64,
                100.0 * ex / many
            ));
        }
        rows.extend(r);
    }
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
                    flops: None,
                }),
        );
    }
    bar.finish_and_clear();

    // The results file first: a closed stdout (`| head`) ends the process at the next print.
    if let Some(path) = &a.json {
        write_json(path, &a, &device, &rows)?;
    }
    let varlen = match a.varlen {
        Some(1) => " in 1 sequence".to_string(),
        Some(n) => format!(" in {n} sequences"),
        None => String::new(),
    };
    let runs = if a.repeats == 1 { "run" } else { "runs" };
    if b * t > PERIOD && a.work != Work::Decode {
        println!("inputs repeat every {PERIOD} tokens (drawing them all would take minutes)");
    }
    println!(
        "device {}  shape B={b} T={t}{varlen} H={h} HV={hv} K={k} V={v}  {}  chunk {}  {} warm-up + {} timed {runs}",
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
    if let Some(note) = &ranks_note {
        println!("{note}");
    }
    for r in &rows {
        let mut thr = Vec::new();
        if let Some(x) = r.tokens_per_s() {
            thr.push(format!("{}tokens/s", si(x)));
        }
        if let Some(x) = r.flops_per_s() {
            thr.push(format!("{}FLOP/s", si(x)));
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
    Ok(ExitCode::SUCCESS)
}

/// Writes the results as JSON to `path`, atomically.
fn write_json(path: &Path, a: &Args, device: &Device, rows: &[Row]) -> Result<(), Failure> {
    let [b, t, h, hv, k, v] = a.shape.0;
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
                "flops": r.flops,
                "flops_per_s": r.flops_per_s(),
                "bytes": r.bytes.map(|b| b as f64),
                "bytes_per_s": r.bytes_per_s(),
            })
        })
        .collect();
    let doc = json!({
        "device": device.name(),
        "shape": {"B": b, "T": t, "H": h, "HV": hv, "K": k, "V": v},
        "varlen": a.varlen,
        "dtype": a.dtype.name(),
        "precision": format!("{:?}", a.precision).to_lowercase(),
        "slow_heads": a.slow_heads,
        "chunk_size": a.chunk_size,
        "warmup": a.warmup,
        "repeats": a.repeats,
        "results": results,
    });
    let mut text =
        serde_json::to_string_pretty(&doc).map_err(|e| Failure::data(format!("--json: {e}")))?;
    text.push('\n');
    crate::lifecycle::write_output(path, |mut out| {
        use std::io::Write;
        out.file()?
            .write_all(text.as_bytes())
            .map_err(|e| deltanet::Error::file(path, format!("cannot write: {e}")))?;
        out.commit()
    })?;
    Ok(())
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

/// `gpu`: time the prefill through the engine API on it (see [`prefill_engine`]).
fn bench_on<D: HostIo>(
    dev: &D,
    a: &Args,
    works: &[Work],
    opts: &Options,
    bar: &ProgressBar,
    gpu: Option<&Arc<CudaDevice>>,
) -> Result<Vec<Row>, Failure> {
    let hv = a.shape.0[3];
    let mut rows = Vec::new();
    let f4 = 4u128;
    if works.contains(&Work::Prefill) || works.contains(&Work::SolveTril) {
        let x = prefill_inputs(a)?;
        let p = Problem::from_inputs(&x, opts)?;
        if works.contains(&Work::Prefill) {
            let times = match gpu {
                Some(d) => prefill_engine(d, a, bar, &p, &x, opts)?,
                // The CPU as an engine calls it: into buffers kept from call to call, the
                // inputs read in place (as llama.cpp's op is timed, with its graph allocated).
                None => {
                    let kv = p.dk() * p.dv();
                    let mut o = vec![0f32; p.tokens() * hv * p.dv()];
                    let mut fin = vec![0f32; p.num_seqs() * hv * kv];
                    time_n(dev, a, bar, "prefill", &mut || {
                        deltanet::cpu::forward_into(&x, opts, &mut o, &mut fin)
                    })?
                }
            };
            // The operations of the chunking computed: the CPU may take smaller chunks.
            let flops = match gpu {
                Some(_) => p.prefill_flops(),
                None => p.prefill_flops_at(deltanet::cpu::computed_chunk_size(&p, opts)),
            };
            rows.push(Row {
                work: "prefill",
                times_ms: times,
                tokens: Some(p.tokens()),
                bytes: None,
                flops: Some(flops),
            });
        }
        if works.contains(&Work::SolveTril) {
            let s = upload_inputs(dev, &p, &x, opts)?;
            dev.synchronize()?;
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
                flops: None,
            });
        }
    }
    Ok(rows)
}

/// The devices of `n` ranks: GPUs 0..n where they exist (else the ones that do, shared), or
/// `device` itself for the CPU; and a few words saying which.
fn rank_devices(device: &Device, n: usize) -> (Vec<Device>, String) {
    match device {
        Device::Cpu => (vec![Device::Cpu], "the CPU (threads, shared)".to_string()),
        Device::Cuda(_) => {
            let mut gpus: Vec<Device> = Vec::new();
            for i in 0..n {
                match Device::cuda(i) {
                    Ok(d) => gpus.push(d),
                    Err(_) => break,
                }
            }
            if gpus.is_empty() {
                gpus.push(device.clone());
            }
            let note = if gpus.len() == n {
                format!("{n} GPUs")
            } else {
                format!("{} GPU(s), shared", gpus.len())
            };
            (gpus, note)
        }
    }
}

/// The prefill's inputs of `--shape` and `--dtype` (seed 0; packed by `--varlen`).
fn prefill_inputs(a: &Args) -> deltanet::Result<Inputs<'static>> {
    let [b, t, h, hv, k, v] = a.shape.0;
    let mut x = layer_inputs_periodic(
        &mut Rng::new(0),
        [b, t, h, hv, k, v],
        a.dtype,
        false,
        PERIOD,
    )?;
    if let Some(n) = a.varlen {
        x.cu_seqlens = Some(varlen_cu_seqlens(n as usize, t));
    }
    let slow = (a.slow_heads * hv as f64).round() as usize;
    if let Some(every) = hv.checked_div(slow) {
        let mut g = x.g.to_f32().into_owned();
        for (i, x) in g.iter_mut().enumerate() {
            let j = i % hv;
            if j % every == 0 && j / every < slow {
                *x = -0.001;
            }
        }
        x.g = Tensor::from_f32(g, vec![b, t, hv])?;
    }
    Ok(x)
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("expected a share in [0, 1], got {s:?}")),
    }
}

/// The plain forward and the forward over ranks (see `Args::ranks`), host tensors in and out,
/// wall clock; and each run's longest exchange.
fn bench_ranks(
    devices: &[Device],
    a: &Args,
    opts: &Options,
    bar: &ProgressBar,
) -> Result<Vec<Row>, Failure> {
    let t = a.shape.0[1];
    let n = a.ranks.unwrap_or(1) as usize;
    let x = prefill_inputs(a)?;
    let p = Problem::from_inputs(&x, opts)?;
    let cuts: Vec<usize> = (0..=n).map(|r| r * t / n).collect();
    let (mut one, mut many, mut exchange) = (Vec::new(), Vec::new(), Vec::new());
    // The NCCL communicators are made once, as an engine would.
    #[cfg(feature = "nccl")]
    let nccl = if a.exchange == "nccl" {
        if devices.len() != n {
            return Err(Failure::usage(format!(
                "--exchange nccl: expected {n} GPUs (one per rank), found {}",
                devices.len()
            )));
        }
        Some(deltanet::cuda::nccl::Nccl::new(devices)?)
    } else {
        None
    };
    #[cfg(not(feature = "nccl"))]
    let nccl: Option<deltanet::cp::InProcess> = if a.exchange == "nccl" {
        return Err(Failure::usage(
            "--exchange nccl: this deltanet was built without the `nccl` feature",
        ));
    } else {
        None
    };
    bar.set_message("ranks");
    for i in 0..a.warmup + a.repeats {
        let start = std::time::Instant::now();
        deltanet::forward(&devices[0], &x, opts)?;
        let t1 = start.elapsed().as_secs_f64() * 1e3;
        let start = std::time::Instant::now();
        let outs = match &nccl {
            Some(ex) => deltanet::cp::forward_ranks_with(devices, &x, opts, &cuts, ex)?,
            None => deltanet::cp::forward_ranks_on(devices, &x, opts, &cuts)?,
        };
        let t2 = start.elapsed().as_secs_f64() * 1e3;
        if i >= a.warmup {
            one.push(t1);
            many.push(t2);
            exchange.push(outs.iter().map(|o| o.exchange_s * 1e3).fold(0.0, f64::max));
        }
    }
    let row = |work, times_ms, tokens: bool| Row {
        work,
        times_ms,
        tokens: tokens.then(|| p.tokens()),
        bytes: None,
        flops: tokens.then(|| p.prefill_flops()),
    };
    Ok(vec![
        row("prefill host", one, true),
        row("prefill ranks", many, true),
        row("rank exchange", exchange, false),
    ])
}

/// The prefill on a GPU as an engine runs it ([`Plan::forward`]): q, k, v in their own dtype
/// on the device, `o` written in that dtype, the final state in f32, the intermediates in a
/// workspace allocated once.
fn prefill_engine(
    dev: &Arc<CudaDevice>,
    a: &Args,
    bar: &ProgressBar,
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
) -> deltanet::Result<Vec<f64>> {
    let stream = dev.stream().clone();
    let cuda = |what: &'static str| {
        move |e: cudarc::driver::DriverError| Error::Cuda {
            context: what.to_string(),
            message: e.to_string(),
        }
    };
    let up16 = |t: &Tensor<'_>| -> deltanet::Result<CudaSlice<u16>> {
        let bits: &[u16] = match t.data() {
            Data::BF16(d) => bytemuck::cast_slice(d),
            Data::F16(d) => bytemuck::cast_slice(d),
            Data::F32(_) => &[],
        };
        stream.clone_htod(bits).map_err(cuda("uploading q, k, v"))
    };
    let up32 = |t: &Tensor<'_>| {
        stream
            .clone_htod(t.to_f32().as_ref())
            .map_err(cuda("uploading"))
    };
    let plan = Plan::new(dev.clone(), p, opts, a.dtype)?;
    let (g, beta) = (up32(&x.g)?, up32(&x.beta)?);
    let n_o = p.tokens() * p.v_heads() * p.dv();
    let n_s = p.num_seqs() * p.v_heads() * p.dk() * p.dv();
    let mut state = stream.alloc_zeros::<f32>(n_s).map_err(cuda("allocating"))?;
    let mut ws = stream
        .alloc_zeros::<u8>(plan.forward_workspace_bytes())
        .map_err(cuda("allocating the workspace"))?;
    // f32 inputs in f32 buffers, 16-bit ones in u16 buffers (the views check element sizes).
    enum Qkv {
        Wide([CudaSlice<f32>; 3], CudaSlice<f32>),
        Narrow([CudaSlice<u16>; 3], CudaSlice<u16>),
    }
    let mut qkv = if a.dtype == DType::F32 {
        Qkv::Wide(
            [up32(&x.q)?, up32(&x.k)?, up32(&x.v)?],
            stream
                .alloc_zeros::<f32>(n_o)
                .map_err(cuda("allocating o"))?,
        )
    } else {
        Qkv::Narrow(
            [up16(&x.q)?, up16(&x.k)?, up16(&x.v)?],
            stream
                .alloc_zeros::<u16>(n_o)
                .map_err(cuda("allocating o"))?,
        )
    };
    dev.synchronize()?;
    let dt = a.dtype;
    let mut run = || -> deltanet::Result<()> {
        let (inputs, o) = match &mut qkv {
            Qkv::Wide([q, k, v], o) => (
                [
                    DeviceRef::new(q, dt)?,
                    DeviceRef::new(k, dt)?,
                    DeviceRef::new(v, dt)?,
                ],
                DeviceMut::new(o, dt)?,
            ),
            Qkv::Narrow([q, k, v], o) => (
                [
                    DeviceRef::new(q, dt)?,
                    DeviceRef::new(k, dt)?,
                    DeviceRef::new(v, dt)?,
                ],
                DeviceMut::new(o, dt)?,
            ),
        };
        let [q, k, v] = inputs;
        let t = TokenInputs::new(
            q,
            k,
            v,
            DeviceRef::new(&g, DType::F32)?,
            DeviceRef::new(&beta, DType::F32)?,
        );
        let io = ForwardIo::new(t, o, DeviceMut::new(&mut state, DType::F32)?);
        plan.forward(io, Workspace::new(&mut ws))
    };
    time_n(dev.as_ref(), a, bar, "prefill", &mut run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varlen_lengths_follow_the_anchors_rule() {
        // w = [1, 38, 11], sum 50: floor(100 / 50), floor(3800 / 50), and the rest.
        assert_eq!(varlen_cu_seqlens(3, 100), vec![0, 2, 78, 100]);
        assert_eq!(varlen_cu_seqlens(1, 77), vec![0, 77]);
        // The weights repeat every 64 sequences; the offsets always end at T and never fall.
        let cu = varlen_cu_seqlens(64, 65536);
        assert_eq!(cu.len(), 65);
        assert_eq!(cu[64], 65536);
        assert!(cu.windows(2).all(|w| w[0] <= w[1]));
        // w_0 = 1 and the 64 weights are 1..=64 in some order (37 is odd), summing to 2080.
        assert_eq!(cu[1], 31);
    }

    #[test]
    fn prefill_flops_sum_over_chunks_and_heads() {
        let opts = Options::default();
        // T = 100 in chunks of 64 and 36; HV = 2, K = 4, V = 8.
        let dims = deltanet::Dims {
            batch: 1,
            seq_len: 100,
            heads: 1,
            v_heads: 2,
            dk: 4,
            dv: 8,
        };
        let p = Problem::new(dims, None, &opts).expect("problem");
        let chunk = |c: f64| {
            let (k, v) = (4.0, 8.0);
            2.0 * c * c * k // A_strict
                + c * c * c / 3.0 // A_inv
                + 2.0 * c * c * k + 2.0 * c * c * v // w, u
                + 2.0 * c * k * v + 2.0 * c * k * v // v_new, h
                + 2.0 * c * k * v + 2.0 * c * c * k + 2.0 * c * c * v // o
        };
        let want = 2.0 * (chunk(64.0) + chunk(36.0));
        assert!((p.prefill_flops() - want).abs() <= 1e-9 * want);
    }
}
