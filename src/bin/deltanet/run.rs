//! `deltanet run`: the forward on the inputs of a safetensors file, written atomically.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use deltanet::io::{self, MappedFile, SegmentHooks};
use deltanet::{DType, Device, HeadMap, Inputs, Options};

use crate::{device_arg, open_device, CmdResult, Failure};

/// Compute o and the final state for the inputs in a safetensors file.
///
/// Reads `q`, `k`, `v`, `g`, `beta` and optionally `initial_state`, `cu_seqlens` (I64 or I32),
/// `A_log`, `dt_bias` (FLA's names and layouts) from a memory map of the input. Options come
/// from the file's metadata (JSON values under the keys scale, use_qk_l2norm, beta_is_logits,
/// allow_neg_eigval, gate_in_kernel, chunk_size, head_map, state_v_first); the flags below
/// override them. Writes `o` and `final_state` (f32), plus `chunk_states` with
/// --intermediate-states, to a temporary file beside OUTPUT that is renamed over it only once
/// complete: a failed run leaves no output and never clobbers an existing file. Inputs holding
/// NaN or infinity (but for g = -inf, a hard reset) are refused, naming the tensor and the first
/// bad element, unless --allow-non-finite.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example: deltanet run --input ../shared/vectors/basic_f32.safetensors \
                        --output out.safetensors --out-dtype f32"
)]
pub struct Args {
    /// The input safetensors file.
    #[arg(long, short, value_name = "IN.safetensors")]
    input: PathBuf,
    /// Where to write `o`, `final_state` (and `chunk_states`).
    #[arg(long, short, value_name = "OUT.safetensors")]
    output: PathBuf,
    /// auto (a GPU if one can be used, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = device_arg)]
    device: String,
    /// The element type of `o` (default: the input's, as FLA does).
    #[arg(long, value_name = "f32|bf16|f16", value_parser = crate::parse_dtype)]
    out_dtype: Option<DType>,
    /// Also write `chunk_states`, the state entering every chunk, `[chunks, HV, K, V]` f32.
    #[arg(long)]
    intermediate_states: bool,
    /// Multiplies q: a number, or null for 1/sqrt(K).
    #[arg(long, value_name = "NUMBER|null", allow_hyphen_values = true)]
    scale: Option<String>,
    /// Normalise q and k over K first.
    #[arg(long, alias = "use_qk_l2norm", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    use_qk_l2norm: Option<bool>,
    /// beta holds logits: use sigmoid(beta).
    #[arg(long, alias = "beta_is_logits", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    beta_is_logits: Option<bool>,
    /// With beta_is_logits, beta = 2 sigmoid(beta).
    #[arg(long, alias = "allow_neg_eigval", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    allow_neg_eigval: Option<bool>,
    /// g is the raw gate: use -exp(A_log) softplus(g + dt_bias) (needs A_log and dt_bias).
    #[arg(long, alias = "gate_in_kernel", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    gate_in_kernel: Option<bool>,
    /// States are stored [N, HV, V, K] instead of [N, HV, K, V].
    #[arg(long, alias = "state_v_first", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    state_v_first: Option<bool>,
    /// Tokens per chunk: 16, 32 or 64.
    #[arg(long, alias = "chunk_size", value_parser = crate::parse_chunk)]
    chunk_size: Option<usize>,
    /// How value heads map to q/k heads: grouped (FLA) or tiled (llama.cpp's Qwen3.5).
    #[arg(long, alias = "head_map", value_parser = parse_head_map)]
    head_map: Option<HeadMap>,
    /// exact (the default: products to f32 rounding) or fast (bf16 operands where the fused GPU
    /// kernel for bf16 inputs runs; about FLA's error).
    #[arg(long, value_parser = crate::parse_precision)]
    precision: Option<deltanet::Precision>,
    /// Tokens per forward call (rounded down to a multiple of the chunk size). Long inputs are
    /// computed in segments, carrying each sequence's state across, so memory stays bounded;
    /// by default a segment's working memory is about 1 GiB.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    segment_tokens: Option<u64>,
    /// Skip the check that every input value is finite (NaN and infinities are refused by
    /// default, naming the tensor and the first bad element).
    #[arg(long)]
    allow_non_finite: bool,
}

/// The default working memory of one forward call.
const SEGMENT_BUDGET: u128 = 1 << 30;

fn parse_head_map(s: &str) -> Result<HeadMap, String> {
    s.parse()
        .map_err(|_| "expected grouped or tiled".to_string())
}

fn json_bool(b: bool) -> String {
    if b { "true" } else { "false" }.to_string()
}

/// The options as metadata of the output, so the file says how it was made.
fn options_metadata(o: &Options) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "scale".into(),
        o.scale.map_or("null".into(), |s| format!("{s}")),
    );
    m.insert("use_qk_l2norm".into(), json_bool(o.use_qk_l2norm));
    m.insert("beta_is_logits".into(), json_bool(o.beta_is_logits));
    m.insert("allow_neg_eigval".into(), json_bool(o.allow_neg_eigval));
    m.insert("gate_in_kernel".into(), json_bool(o.gate_in_kernel));
    m.insert("state_v_first".into(), json_bool(o.state_v_first));
    m.insert("chunk_size".into(), o.chunk_size.to_string());
    m.insert(
        "head_map".into(),
        match o.head_map {
            HeadMap::Grouped => "\"grouped\"",
            HeadMap::Tiled => "\"tiled\"",
        }
        .into(),
    );
    m
}

/// The tensors split by token: name, axes for messages, and whether minus infinity is a valid
/// value (a gate `g = -inf` is a hard reset of the state).
const PER_TOKEN: [(&str, &str, bool); 5] = [
    ("q", "b, t, h, d", false),
    ("k", "b, t, h, d", false),
    ("v", "b, t, h, d", false),
    ("g", "b, t, h", true),
    ("beta", "b, t, h", false),
];

/// `check_finite`'s error, with the flag that skips the check.
fn with_hint(e: deltanet::Error) -> deltanet::Error {
    match e {
        deltanet::Error::File { path, message } => deltanet::Error::File {
            path,
            message: format!("{message} (--allow-non-finite skips this check)"),
        },
        other => other,
    }
}

/// Between segments: the input is still what was mapped, the next segment's inputs are finite,
/// and the progress bar moves.
struct RunHooks<'a> {
    file: &'a MappedFile,
    inputs: &'a Inputs<'a>,
    tokens: usize,
    check_finite: bool,
    bar: &'a indicatif::ProgressBar,
}

impl SegmentHooks for RunHooks<'_> {
    fn before(&mut self, tokens: Range<usize>) -> deltanet::Result<()> {
        // A truncated input faults (SIGBUS, handled in `lifecycle`) when its lost pages are
        // read; a change seen here, before the next segment is read, is a plain error.
        self.file.check_unchanged()?;
        if self.check_finite {
            let x = self.inputs;
            for (&(name, axes, neg_inf), t) in
                PER_TOKEN.iter().zip([&x.q, &x.k, &x.v, &x.g, &x.beta])
            {
                let per = t.numel() / self.tokens.max(1);
                io::check_finite(
                    self.file.path(),
                    name,
                    axes,
                    t,
                    tokens.start * per..tokens.end * per,
                    neg_inf,
                )
                .map_err(with_hint)?;
            }
        }
        Ok(())
    }

    fn after(&mut self, tokens: Range<usize>) {
        self.bar.inc(tokens.len() as u64);
    }
}

/// Refuses non-finite values in the tensors that are not split by token (checked once).
fn check_whole_tensors(path: &Path, x: &Inputs<'_>, state_v_first: bool) -> deltanet::Result<()> {
    let state_axes = if state_v_first {
        "n, h, v, k"
    } else {
        "n, h, k, v"
    };
    for (name, axes, t) in [
        ("initial_state", state_axes, &x.initial_state),
        ("A_log", "h", &x.a_log),
        ("dt_bias", "h", &x.dt_bias),
    ] {
        if let Some(t) = t {
            io::check_finite(path, name, axes, t, 0..t.numel(), false).map_err(with_hint)?;
        }
    }
    Ok(())
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub fn main(a: Args) -> CmdResult {
    let mut overrides = Options::default();
    if let Some(s) = &a.scale {
        io::set_option(&mut overrides, "scale", s).map_err(|e| Failure::usage(format!("--{e}")))?;
    }
    // The rename that makes the write atomic would replace a FIFO or device node with a regular
    // file, and writing over the input would destroy it: refuse both.
    if let Ok(out_meta) = std::fs::metadata(&a.output) {
        use std::os::unix::fs::MetadataExt;
        if !out_meta.is_file() && !out_meta.is_dir() {
            return Err(Failure::usage(format!(
                "--output {}: expected a regular file path, got a special file (FIFO, device or socket)",
                a.output.display()
            )));
        }
        if let Ok(in_meta) = std::fs::metadata(&a.input) {
            if (in_meta.dev(), in_meta.ino()) == (out_meta.dev(), out_meta.ino()) {
                return Err(Failure::usage(format!(
                    "--output {}: expected a file other than the input, got the input itself",
                    a.output.display()
                )));
            }
        }
    }
    // Fail before any work when the output cannot be placed.
    io::check_output_path(&a.output)?;

    let file = MappedFile::open(&a.input)?;
    let pf = file.parse()?;
    let mut opts = pf.options.clone();
    if a.scale.is_some() {
        opts.scale = overrides.scale;
    }
    for (flag, slot) in [
        (a.use_qk_l2norm, &mut opts.use_qk_l2norm),
        (a.beta_is_logits, &mut opts.beta_is_logits),
        (a.allow_neg_eigval, &mut opts.allow_neg_eigval),
        (a.gate_in_kernel, &mut opts.gate_in_kernel),
        (a.state_v_first, &mut opts.state_v_first),
    ] {
        if let Some(v) = flag {
            *slot = v;
        }
    }
    if let Some(c) = a.chunk_size {
        opts.chunk_size = c;
    }
    if let Some(h) = a.head_map {
        opts.head_map = h;
    }
    if let Some(pr) = a.precision {
        opts.precision = pr;
    }
    opts.out_dtype = a.out_dtype;
    opts.output_final_state = true;
    opts.output_chunk_states = a.intermediate_states;

    let p = pf.problem(&a.input, &opts)?;
    // Every sequence's initial and final state is held at once, whatever the segmenting (many
    // empty sequences cost no tokens but still a state each).
    io::check_states(&a.input, &p)?;
    if !a.allow_non_finite {
        check_whole_tensors(&a.input, &pf.inputs, opts.state_v_first)?;
    }
    let seg = match a.segment_tokens {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => io::segment_tokens(&p, &opts, SEGMENT_BUDGET),
    };
    let seg = io::segment_cap(&p, seg.max(1));
    // The memory one segment needs, checked up front so an impossible shape is an error rather
    // than an allocation failure.
    let seg_problem = deltanet::Problem::new(
        deltanet::Dims {
            batch: 1,
            seq_len: seg.min(p.tokens()).max(1),
            ..p.dims()
        },
        None,
        &opts,
    )
    .map_err(|e| deltanet::Error::in_file(&a.input, e))?;
    io::check_memory(&a.input, &seg_problem, &opts)?;
    let device = open_device(&a.device)?;
    let mut meta = options_metadata(&opts);
    // The device's kind only: the file is a function of its inputs, not of a thread count or a
    // card's index.
    let kind = match &device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
    };
    meta.insert(
        "device".into(),
        serde_json::Value::String(kind.into()).to_string(),
    );
    let segments = io::plan_segments(&p, seg).len();
    let t0 = std::time::Instant::now();
    // Progress for long inputs (several segments); indicatif draws only on a terminal.
    let bar = if segments > 1 {
        indicatif::ProgressBar::new(p.tokens() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} tokens, {elapsed} ({eta} left)",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut hooks = RunHooks {
        file: &file,
        inputs: &pf.inputs,
        tokens: p.tokens(),
        check_finite: !a.allow_non_finite,
        bar: &bar,
    };
    let done = crate::lifecycle::write_output(&a.output, |out| {
        io::forward_to_file(&device, &pf.inputs, &opts, seg, out, &meta, &mut hooks)
    });
    bar.finish_and_clear();
    done.map_err(|e| match e {
        deltanet::Error::File { .. } | deltanet::Error::Internal(_) => Failure::from(e),
        other => Failure::data(format!("{}: {other}", a.input.display())),
    })?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "{}: B={} T={} H={} HV={} K={} V={} ({}, {}) on {} in {ms:.1} ms -> {} (o {})",
        a.input.display(),
        p.batch(),
        p.seq_len(),
        p.heads(),
        p.v_heads(),
        p.dk(),
        p.dv(),
        plural(p.num_seqs(), "sequence", "sequences"),
        plural(segments, "segment", "segments"),
        device.name(),
        a.output.display(),
        opts.out_dtype.unwrap_or(pf.inputs.q.dtype()),
    );
    Ok(ExitCode::SUCCESS)
}
