//! `deltanet run`: the forward on the inputs of a safetensors file, written atomically.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use deltanet::io::{self, MappedFile};
use deltanet::{DType, HeadMap, Options};

use crate::{device_arg, open_device, CmdResult, Failure};

/// Compute o and the final state for the inputs in a safetensors file.
///
/// Reads `q`, `k`, `v`, `g`, `beta` and optionally `initial_state`, `cu_seqlens` (I64 or I32),
/// `A_log`, `dt_bias` (FLA's names and layouts) from a memory map of the input. Options come
/// from the file's metadata (JSON values under the keys scale, use_qk_l2norm, beta_is_logits,
/// allow_neg_eigval, gate_in_kernel, chunk_size, head_map, state_v_first); the flags below
/// override them. Writes `o` and `final_state` (f32), plus `chunk_states` with
/// --intermediate-states, to a temporary file beside OUTPUT that is renamed over it only once
/// complete: a failed run leaves no output and never clobbers an existing file.
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
    /// Tokens per forward call (rounded down to a multiple of the chunk size). Long inputs are
    /// computed in segments, carrying each sequence's state across, so memory stays bounded;
    /// by default a segment's working memory is about 1 GiB.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    segment_tokens: Option<u64>,
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
fn options_metadata(o: &Options) -> HashMap<String, String> {
    let mut m = HashMap::new();
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

pub fn main(a: Args) -> CmdResult {
    let mut overrides = Options::default();
    if let Some(s) = &a.scale {
        io::set_option(&mut overrides, "scale", s).map_err(|e| Failure::usage(format!("--{e}")))?;
    }
    // Fail before any work when the output cannot be placed.
    let parent = match a.output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(Failure::data(format!(
            "{}: expected an existing folder for the output, got none",
            parent.display()
        )));
    }
    if a.output.is_dir() {
        return Err(Failure::data(format!(
            "{}: expected an output file path, got a directory",
            a.output.display()
        )));
    }
    // The rename that makes the write atomic would replace a FIFO or device node with a regular
    // file, and writing over the input would destroy it: refuse both.
    if let Ok(out_meta) = std::fs::metadata(&a.output) {
        use std::os::unix::fs::MetadataExt;
        if !out_meta.is_file() {
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
    opts.out_dtype = a.out_dtype;
    opts.output_final_state = true;
    opts.output_chunk_states = a.intermediate_states;

    let p = pf.problem(&a.input, &opts)?;
    // Every sequence's initial and final state is held at once, whatever the segmenting (many
    // empty sequences cost no tokens but still a state each).
    io::check_states(&a.input, &p)?;
    let seg = match a.segment_tokens {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => io::segment_tokens(&p, &opts, SEGMENT_BUDGET),
    };
    let seg = seg.min(p.tokens()).max(1);
    // The memory one segment needs, checked up front so an impossible shape is an error rather
    // than an allocation failure.
    let seg_problem = deltanet::Problem::new(
        deltanet::Dims {
            batch: 1,
            seq_len: seg,
            ..p.dims()
        },
        None,
        &opts,
    )
    .map_err(|e| deltanet::Error::in_file(&a.input, e))?;
    io::check_memory(&a.input, &seg_problem, &opts)?;
    let device = open_device(&a.device)?;
    let mut meta = options_metadata(&opts);
    meta.insert(
        "device".into(),
        serde_json::Value::String(device.name()).to_string(),
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
    let mut on_segment = |tokens: usize| bar.inc(tokens as u64);
    let done = io::forward_to_file(
        &device,
        &pf.inputs,
        &opts,
        seg,
        &a.output,
        meta,
        &mut on_segment,
    );
    bar.finish_and_clear();
    done.map_err(|e| match e {
        deltanet::Error::File { .. } => Failure::from(e),
        other => Failure::data(format!("{}: {other}", a.input.display())),
    })?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "{}: B={} T={} H={} HV={} K={} V={} ({} sequences, {segments} segment(s)) on {} in {ms:.1} ms -> {} (o {})",
        a.input.display(),
        p.batch(),
        p.seq_len(),
        p.heads(),
        p.v_heads(),
        p.dk(),
        p.dv(),
        p.num_seqs(),
        device.name(),
        a.output.display(),
        opts.out_dtype.unwrap_or(pf.inputs.q.dtype()),
    );
    Ok(ExitCode::SUCCESS)
}
