//! Problem files: safetensors inputs read through a memory map (no copy of aligned tensors), the
//! options carried in their metadata, and outputs written atomically.
//!
//! Tensor names follow FLA's arguments: `q`, `k`, `v`, `g`, `beta`, and optionally
//! `initial_state`, `cu_seqlens` (I64 or I32), `A_log`, `dt_bias`, plus the float64 answers
//! `o_ref` and `final_state_ref` of conformance vectors. Every metadata value is JSON; the keys
//! [`OPTION_KEYS`] set [`Options`], other keys (such as `case`) are ignored.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::dtype::{DType, Tensor};
use crate::error::{Error, Result};
use crate::options::{HeadMap, Options, CHUNK_SIZES};
use crate::problem::{Inputs, Problem};

/// The tensors an input file may hold: FLA's argument names, and the vector files' answers.
pub const TENSOR_NAMES: [&str; 13] = [
    "q",
    "k",
    "v",
    "g",
    "beta",
    "initial_state",
    "cu_seqlens",
    "A_log",
    "dt_bias",
    "o_ref",
    "final_state_ref",
    "o_fla",
    "final_state_fla",
];

/// The metadata keys read as options.
pub const OPTION_KEYS: [&str; 8] = [
    "scale",
    "use_qk_l2norm",
    "beta_is_logits",
    "allow_neg_eigval",
    "gate_in_kernel",
    "chunk_size",
    "head_map",
    "state_v_first",
];

/// An input file mapped into memory. Tensors parsed from it borrow the map.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps the file at `path` read-only.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::file(path, format!("cannot stat: {e}")))?;
        if !meta.is_file() {
            return Err(Error::file(path, "not a regular file"));
        }
        if meta.len() == 0 {
            return Err(Error::file(
                path,
                "expected a safetensors file, got an empty file",
            ));
        }
        // SAFETY: the map is read-only and only ever read through bounds-checked slices. If
        // another process truncates the file while it is mapped, reads could fault; that is
        // the usual contract of memory-mapped input and the reason it is documented here.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::file(path, format!("cannot map: {e}")))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            map,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Parses the mapped bytes (see [`parse`]).
    pub fn parse(&self) -> Result<ProblemFile<'_>> {
        parse(&self.map, &self.path)
    }
}

/// What a problem file holds.
#[derive(Clone, Debug)]
pub struct ProblemFile<'a> {
    /// The inputs, borrowing the file's bytes where aligned.
    pub inputs: Inputs<'a>,
    /// The options its metadata sets, on top of `Options::default()`.
    pub options: Options,
    /// The exact output `[B, T, HV, V]`, when the file carries it.
    pub o_ref: Option<Vec<f64>>,
    /// The exact final state, when the file carries it.
    pub final_state_ref: Option<Vec<f64>>,
    /// The raw metadata.
    pub metadata: HashMap<String, String>,
}

fn st_error(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => {
            "expected a safetensors file, got fewer than 8 bytes (empty or truncated)".into()
        }
        E::HeaderTooLarge | E::InvalidHeaderLength => {
            "expected a safetensors file, got a header length past the end of the file (not safetensors, or truncated)".into()
        }
        E::InvalidHeader(_) | E::InvalidHeaderStart | E::InvalidHeaderDeserialization(_) => {
            format!("expected a safetensors file, got an unreadable JSON header ({e})")
        }
        E::MetadataIncompleteBuffer => {
            "header's tensor sizes do not match the data (truncated or padded file)".into()
        }
        other => format!("invalid safetensors header: {other}"),
    }
}

fn dtype_of(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        _ => None,
    }
}

fn float_tensor<'a>(
    st: &SafeTensors<'a>,
    path: &Path,
    name: &str,
    required: bool,
) -> Result<Option<Tensor<'a>>> {
    let t = match st.tensor(name) {
        Ok(t) => t,
        Err(_) if !required => return Ok(None),
        Err(_) => {
            return Err(Error::file(
                path,
                format!("tensor {name}: expected it in the file, got none"),
            ))
        }
    };
    let dtype = dtype_of(t.dtype()).ok_or_else(|| {
        Error::file(
            path,
            format!(
                "tensor {name}: expected dtype F32, BF16 or F16, got {:?}",
                t.dtype()
            ),
        )
    })?;
    Tensor::from_bytes(dtype, t.data(), t.shape().to_vec())
        .map(Some)
        .map_err(|e| Error::file(path, format!("tensor {name}: {e}")))
}

fn f64_tensor(st: &SafeTensors<'_>, path: &Path, name: &str) -> Result<Option<Vec<f64>>> {
    let Ok(t) = st.tensor(name) else {
        return Ok(None);
    };
    if t.dtype() != Dtype::F64 {
        return Err(Error::file(
            path,
            format!("tensor {name}: expected dtype F64, got {:?}", t.dtype()),
        ));
    }
    Ok(Some(
        t.data()
            .chunks_exact(8)
            .map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                f64::from_le_bytes(a)
            })
            .collect(),
    ))
}

fn cu_seqlens(st: &SafeTensors<'_>, path: &Path) -> Result<Option<Vec<i64>>> {
    let Ok(t) = st.tensor("cu_seqlens") else {
        return Ok(None);
    };
    if t.shape().len() != 1 {
        return Err(Error::file(
            path,
            format!(
                "tensor cu_seqlens: expected rank 1 [N + 1], got shape {:?}",
                t.shape()
            ),
        ));
    }
    let d = t.data();
    let v = match t.dtype() {
        Dtype::I64 => d
            .chunks_exact(8)
            .map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                i64::from_le_bytes(a)
            })
            .collect(),
        Dtype::I32 => d
            .chunks_exact(4)
            .map(|b| {
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                i32::from_le_bytes(a) as i64
            })
            .collect(),
        other => {
            return Err(Error::file(
                path,
                format!("tensor cu_seqlens: expected dtype I64 or I32, got {other:?}"),
            ))
        }
    };
    Ok(Some(v))
}

/// Sets one option from its JSON text, as in a file's metadata or on the command line.
/// Errors name the key and say what was expected.
pub fn set_option(opts: &mut Options, key: &str, json: &str) -> Result<()> {
    let value: Value = serde_json::from_str(json.trim()).map_err(|_| {
        Error::invalid(
            option_name(key),
            expected_for(key),
            format!("{json:?} (not JSON)"),
        )
    })?;
    let bad = || Error::invalid(option_name(key), expected_for(key), json);
    let flag = |v: &Value| match v {
        Value::Bool(b) => Ok(*b),
        Value::Null => Ok(false),
        _ => Err(bad()),
    };
    match key {
        "scale" => {
            opts.scale = match &value {
                Value::Null => None,
                Value::Number(n) => {
                    let s = n.as_f64().ok_or_else(bad)? as f32;
                    if !s.is_finite() {
                        return Err(bad());
                    }
                    Some(s)
                }
                _ => return Err(bad()),
            }
        }
        "use_qk_l2norm" => opts.use_qk_l2norm = flag(&value)?,
        "beta_is_logits" => opts.beta_is_logits = flag(&value)?,
        "allow_neg_eigval" => opts.allow_neg_eigval = flag(&value)?,
        "gate_in_kernel" => opts.gate_in_kernel = flag(&value)?,
        "state_v_first" => opts.state_v_first = flag(&value)?,
        "chunk_size" => {
            opts.chunk_size = match &value {
                Value::Null => 64,
                Value::Number(n) => match n.as_u64() {
                    Some(c) if CHUNK_SIZES.contains(&(c as usize)) => c as usize,
                    _ => return Err(bad()),
                },
                _ => return Err(bad()),
            }
        }
        "head_map" => {
            opts.head_map = match &value {
                Value::Null => HeadMap::Grouped,
                Value::String(s) => s.parse().map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        _ => {}
    }
    Ok(())
}

fn option_name(key: &str) -> &'static str {
    OPTION_KEYS
        .iter()
        .find(|&&k| k == key)
        .copied()
        .unwrap_or("option")
}

fn expected_for(key: &str) -> &'static str {
    match key {
        "scale" => "a finite JSON number or null",
        "chunk_size" => "16, 32 or 64",
        "head_map" => "\"grouped\" or \"tiled\"",
        _ => "true, false or null",
    }
}

/// Parses a safetensors problem file held in `bytes` (named `path` in errors): the tensors, the
/// options in the metadata and the reference answers if present. Shapes are checked against each
/// other by [`Problem::from_inputs`] afterwards, once command-line overrides are applied (see
/// [`ProblemFile::problem`]).
pub fn parse<'a>(bytes: &'a [u8], path: &Path) -> Result<ProblemFile<'a>> {
    if bytes.is_empty() {
        return Err(Error::file(
            path,
            "expected a safetensors file, got an empty file",
        ));
    }
    let (_, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| Error::file(path, st_error(e)))?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| Error::file(path, st_error(e)))?;
    // A misspelt tensor (`initial_states`) would otherwise be silently left out.
    if let Some(name) = st.names().into_iter().find(|n| !TENSOR_NAMES.contains(n)) {
        return Err(Error::file(
            path,
            format!(
                "tensor {name}: expected one of {}, got an unknown name",
                TENSOR_NAMES.join(", ")
            ),
        ));
    }
    let metadata = meta.metadata().clone().unwrap_or_default();
    let mut options = Options::default();
    for key in OPTION_KEYS {
        if let Some(v) = metadata.get(key) {
            set_option(&mut options, key, v)
                .map_err(|e| Error::file(path, format!("metadata {e}")))?;
        }
    }
    let req = |n| -> Result<Tensor<'a>> {
        float_tensor(&st, path, n, true)?
            .ok_or_else(|| Error::file(path, format!("tensor {n}: missing")))
    };
    let inputs = Inputs {
        q: req("q")?,
        k: req("k")?,
        v: req("v")?,
        g: req("g")?,
        beta: req("beta")?,
        initial_state: float_tensor(&st, path, "initial_state", false)?,
        cu_seqlens: cu_seqlens(&st, path)?,
        a_log: float_tensor(&st, path, "A_log", false)?,
        dt_bias: float_tensor(&st, path, "dt_bias", false)?,
    };
    Ok(ProblemFile {
        inputs,
        options,
        o_ref: f64_tensor(&st, path, "o_ref")?,
        final_state_ref: f64_tensor(&st, path, "final_state_ref")?,
        metadata,
    })
}

impl ProblemFile<'_> {
    /// Validates the inputs against `opts` (the file's options, possibly overridden); errors
    /// name the file.
    pub fn problem(&self, path: &Path, opts: &Options) -> Result<Problem> {
        let p = Problem::from_inputs(&self.inputs, opts).map_err(|e| Error::in_file(path, e))?;
        for (name, r, want) in [
            ("o_ref", &self.o_ref, p.tokens() * p.v_heads() * p.dv()),
            (
                "final_state_ref",
                &self.final_state_ref,
                p.num_seqs() * p.v_heads() * p.state_len(),
            ),
        ] {
            if let Some(r) = r {
                if r.len() != want {
                    return Err(Error::file(
                        path,
                        format!("tensor {name}: expected {want} elements, got {}", r.len()),
                    ));
                }
            }
        }
        Ok(p)
    }
}

/// Bytes of host memory the forward of `p` needs beyond its inputs, roughly: the f32 copies of
/// the inputs, the per-token intermediates, the chunk states and the outputs.
pub fn forward_bytes(p: &Problem, opts: &Options) -> u128 {
    let tokens = p.tokens() as u128;
    let (h, hv, k, v, bt) = (
        p.heads() as u128,
        p.v_heads() as u128,
        p.dk() as u128,
        p.dv() as u128,
        p.chunk_size() as u128,
    );
    let states = (p.num_seqs() as u128) * hv * k * v;
    let per_token = 4 * h * k + hv * (3 * v + k + 2 * bt + 8);
    let chunk_states = (p.chunks().len() as u128) * hv * k * v;
    let extra = if opts.output_chunk_states {
        chunk_states
    } else {
        0
    };
    4 * (tokens * per_token + chunk_states + extra + 3 * states)
}

/// The memory this machine can give now (`MemAvailable`), when it can be read.
pub fn available_memory() -> Option<u128> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u128 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Fails with a clear error, instead of an allocation abort, when the forward of `p` would need
/// more memory than is available.
pub fn check_memory(path: &Path, p: &Problem, opts: &Options) -> Result<()> {
    let need = forward_bytes(p, opts);
    if let Some(avail) = available_memory() {
        if need > avail {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            return Err(Error::file(
                path,
                format!(
                    "shapes too large to allocate: B={} T={} H={} HV={} K={} V={} need about {:.1} GiB, {:.1} GiB available",
                    p.batch(), p.seq_len(), p.heads(), p.v_heads(), p.dk(), p.dv(), gib(need), gib(avail)
                ),
            ));
        }
    }
    Ok(())
}

/// Fails with a clear error when the initial and final states of every sequence of `p` would not
/// fit in the memory available.
pub fn check_states(path: &Path, p: &Problem) -> Result<()> {
    let need = 2 * 4 * (p.num_seqs() as u128) * (p.v_heads() as u128) * (p.state_len() as u128);
    match available_memory() {
        Some(avail) if need > avail => {
            let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
            Err(Error::file(
                path,
                format!(
                    "states too large to allocate: N={} HV={} K={} V={} need about {:.1} GiB, {:.1} GiB available",
                    p.num_seqs(), p.v_heads(), p.dk(), p.dv(), gib(need), gib(avail)
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Temporary files being written now, for [`remove_pending_temporaries`].
static PENDING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn pending() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes every temporary file still being written: for a signal handler, so an interrupted
/// run leaves nothing behind either.
pub fn remove_pending_temporaries() {
    for p in pending().drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Removes the temporary file unless the write completed.
struct TempGuard(Option<PathBuf>);

impl TempGuard {
    fn new(path: PathBuf) -> Self {
        pending().push(path.clone());
        TempGuard(Some(path))
    }

    /// The file was renamed into place: nothing to remove any more.
    fn commit(&mut self) {
        if let Some(p) = self.0.take() {
            pending().retain(|q| q != &p);
        }
    }
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            pending().retain(|q| q != &p);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Creates a file at `path` atomically: `write` fills a new temporary file in the same folder,
/// which is flushed to disk and only then renamed over `path`. If `write` (or anything else)
/// fails, the temporary file is removed and `path` is left as it was: a failed run never leaves
/// a partial output nor clobbers an existing one.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let ctx = |what: &str, e: &dyn std::fmt::Display| Error::file(path, format!("{what}: {e}"));
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::file(path, "expected a file name for the output, got none"))?;
    if path.is_dir() {
        return Err(Error::file(
            path,
            "expected an output file path, got a directory",
        ));
    }
    // A unique name in the same folder (so the rename stays on one filesystem), opened with
    // create_new so an existing file is never reused.
    let mut attempt = 0u32;
    let (tmp, mut file) = loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = dir.join(format!(
            ".{}.{}-{nanos}-{attempt}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                attempt += 1
            }
            Err(e) => return Err(ctx("cannot create a temporary file beside it", &e)),
        }
    };
    let mut guard = TempGuard::new(tmp.clone());
    write(&mut file)?;
    file.sync_all().map_err(|e| ctx("cannot write", &e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| ctx("cannot rename the temporary file over it", &e))?;
    guard.commit();
    // Make the rename itself durable; failure here cannot undo it, so it is best effort.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// One sequence's part of a segment: flat tokens `lo..hi` of sequence `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The sequence.
    pub n: usize,
    /// First flat token.
    pub lo: usize,
    /// One past the last flat token.
    pub hi: usize,
}

/// Splits the tokens of `p` into segments of at most `max_tokens` tokens (rounded down to a
/// multiple of the chunk size, at least one chunk) for [`forward_to_file`]. A sequence longer
/// than the room left is cut only at multiples of the chunk size from its start, so every
/// segment's chunks are exactly chunks of the whole problem and the result is the same
/// computation, carried across segments through the state.
pub fn plan_segments(p: &Problem, max_tokens: usize) -> Vec<Vec<Piece>> {
    let bt = p.chunk_size();
    let m = (max_tokens / bt).max(1) * bt;
    let (mut segs, mut cur, mut used) = (Vec::new(), Vec::new(), 0usize);
    for (n, &(s, e)) in p.seqs().iter().enumerate() {
        if s == e {
            cur.push(Piece { n, lo: s, hi: s });
            continue;
        }
        let mut lo = s;
        while lo < e {
            let room = m - used;
            let take = if e - lo <= room {
                e - lo
            } else {
                room / bt * bt
            };
            if take == 0 {
                segs.push(std::mem::take(&mut cur));
                used = 0;
                continue;
            }
            cur.push(Piece {
                n,
                lo,
                hi: lo + take,
            });
            used += take;
            lo += take;
            if used == m {
                segs.push(std::mem::take(&mut cur));
                used = 0;
            }
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

/// Tokens per forward call that keep the forward's working memory near `budget` bytes.
pub fn segment_tokens(p: &Problem, opts: &Options, budget: u128) -> usize {
    let per_token = forward_bytes(p, opts) / (p.tokens().max(1) as u128) + 1;
    let t = (budget / per_token).min(usize::MAX as u128) as usize;
    t.max(p.chunk_size())
}

/// The flat tokens `lo..hi` of a `[B, T, ...]` tensor as a `[1, hi - lo, ...]` view (no copy).
fn token_rows<'b>(t: &'b Tensor<'_>, tokens: usize, lo: usize, hi: usize) -> Result<Tensor<'b>> {
    use crate::dtype::Data;
    use std::borrow::Cow;
    let per = t.numel() / tokens.max(1);
    let (a, b) = (lo * per, hi * per);
    let data = match t.data() {
        Data::F32(d) => Data::F32(Cow::Borrowed(&d[a..b])),
        Data::BF16(d) => Data::BF16(Cow::Borrowed(&d[a..b])),
        Data::F16(d) => Data::F16(Cow::Borrowed(&d[a..b])),
    };
    let mut shape = vec![1, hi - lo];
    shape.extend_from_slice(&t.shape()[2..]);
    Tensor::new(data, shape)
}

/// Validates `x` against `opts`, runs its forward on `device` and writes `o`, `final_state` and,
/// with `opts.output_chunk_states`, `chunk_states` to `path` atomically, computing at most
/// `max_tokens` tokens per call (see [`plan_segments`]) and writing each part of the output
/// straight to the file. Memory stays bounded by one segment's work whatever the input's size;
/// the input itself is only read (a memory map stays file-backed). `on_segment` hears how many
/// tokens each finished segment held, for progress.
pub fn forward_to_file(
    device: &crate::Device,
    x: &Inputs<'_>,
    opts: &Options,
    max_tokens: usize,
    path: &Path,
    metadata: HashMap<String, String>,
    on_segment: &mut dyn FnMut(usize),
) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let p = &Problem::from_inputs(x, opts).map_err(|e| Error::in_file(path, e))?;
    let out_dtype = opts.out_dtype.unwrap_or(x.q.dtype());
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    let state_bytes = (hv * kv * 4) as u64;
    let tokens = p.tokens();
    let state_shape = p.state_shape(opts.state_v_first);
    let fs_len = p.num_seqs() as u64 * state_bytes;
    let cs_len = if opts.output_chunk_states {
        p.chunks().len() as u64 * state_bytes
    } else {
        0
    };
    let o_len = (tokens * hv * dv * out_dtype.size()) as u64;
    // f32 tensors first, so every tensor is aligned for its element type.
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let m: serde_json::Map<String, Value> = metadata
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let st_name = |d: DType| match d {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
    };
    header.insert(
        "final_state".into(),
        serde_json::json!({"dtype": "F32", "shape": state_shape, "data_offsets": [0, fs_len]}),
    );
    if opts.output_chunk_states {
        header.insert(
            "chunk_states".into(),
            serde_json::json!({"dtype": "F32", "shape": [p.chunks().len(), hv, dk, dv],
                "data_offsets": [fs_len, fs_len + cs_len]}),
        );
    }
    header.insert(
        "o".into(),
        serde_json::json!({"dtype": st_name(out_dtype), "shape": [p.batch(), p.seq_len(), hv, dv],
            "data_offsets": [fs_len + cs_len, fs_len + cs_len + o_len]}),
    );
    let mut hbytes = serde_json::to_vec(&Value::Object(header))
        .map_err(|e| Error::file(path, format!("cannot write: {e}")))?;
    hbytes.resize(hbytes.len().next_multiple_of(8), b' ');
    let base = 8 + hbytes.len() as u64;
    let (fs_off, cs_off, o_off) = (base, base + fs_len, base + fs_len + cs_len);

    let h0 = x.initial_state.as_ref().map(|t| t.to_f32());
    let seqs = p.seqs();
    let segments = plan_segments(p, max_tokens);
    write_atomic_with(path, |file| {
        let io = |e: std::io::Error| Error::file(path, format!("cannot write: {e}"));
        let mut put = |off: u64, bytes: &[u8]| -> Result<()> {
            file.seek(SeekFrom::Start(off)).map_err(io)?;
            file.write_all(bytes).map_err(io)
        };
        put(0, &(hbytes.len() as u64).to_le_bytes())?;
        put(8, &hbytes)?;
        let state_of = |n: usize| -> Vec<f32> {
            match &h0 {
                Some(h) => h[n * hv * kv..(n + 1) * hv * kv].to_vec(),
                None => vec![0f32; hv * kv],
            }
        };
        let mut carry: Option<Vec<f32>> = None;
        for seg in &segments {
            let (lo, hi) = match (seg.first(), seg.last()) {
                (Some(a), Some(b)) => (a.lo, b.hi),
                _ => continue,
            };
            // Each piece's state entering the segment: carried from the previous segment when
            // it continues a sequence, else the sequence's initial state.
            let fresh_zero = h0.is_none() && seg.iter().all(|pc| pc.lo == seqs[pc.n].0);
            let mut init = Vec::new();
            if !fresh_zero {
                init.reserve(seg.len() * hv * kv);
                for pc in seg {
                    if pc.lo > seqs[pc.n].0 {
                        match carry.take() {
                            Some(c) => init.extend_from_slice(&c),
                            None => {
                                return Err(Error::internal("a segment lost its carried state"))
                            }
                        }
                    } else {
                        init.extend_from_slice(&state_of(pc.n));
                    }
                }
            }
            let finals: Vec<f32> = if lo == hi {
                // Only empty sequences: their final state is their initial state.
                if fresh_zero {
                    vec![0f32; seg.len() * hv * kv]
                } else {
                    init
                }
            } else {
                let mut cu = vec![0i64];
                for pc in seg {
                    cu.push((pc.hi - lo) as i64);
                }
                let mut shape = vec![seg.len()];
                shape.extend_from_slice(&state_shape[1..]);
                let xs = Inputs {
                    q: token_rows(&x.q, tokens, lo, hi)?,
                    k: token_rows(&x.k, tokens, lo, hi)?,
                    v: token_rows(&x.v, tokens, lo, hi)?,
                    g: token_rows(&x.g, tokens, lo, hi)?,
                    beta: token_rows(&x.beta, tokens, lo, hi)?,
                    initial_state: if fresh_zero {
                        None
                    } else {
                        Some(Tensor::from_f32(init, shape)?)
                    },
                    cu_seqlens: Some(cu),
                    a_log: x.a_log.clone(),
                    dt_bias: x.dt_bias.clone(),
                };
                let sopts = Options {
                    output_final_state: true,
                    ..opts.clone()
                };
                let out = crate::forward(device, &xs, &sopts)?;
                put(
                    o_off + (lo * hv * dv * out_dtype.size()) as u64,
                    out.o.as_bytes(),
                )?;
                if let Some(cs) = &out.chunk_states {
                    let first = p.chunks().partition_point(|c| c.start < lo) as u64;
                    put(cs_off + first * state_bytes, cs.as_bytes())?;
                }
                match out.final_state {
                    Some(s) => s.to_f32().into_owned(),
                    None => return Err(Error::internal("a segment returned no final state")),
                }
            };
            for (i, pc) in seg.iter().enumerate() {
                let s = &finals[i * hv * kv..(i + 1) * hv * kv];
                if pc.hi == seqs[pc.n].1 {
                    put(fs_off + pc.n as u64 * state_bytes, bytemuck::cast_slice(s))?;
                } else {
                    carry = Some(s.to_vec());
                }
            }
            on_segment(hi - lo);
        }
        file.set_len(o_off + o_len).map_err(io)
    })
}
