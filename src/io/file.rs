//! Problem files: safetensors inputs read through a memory map (no copy of aligned tensors) and
//! the options carried in their metadata.
//!
//! Tensor names follow FLA's arguments: `q`, `k`, `v`, `g`, `beta`, and optionally
//! `initial_state`, `cu_seqlens` (I64 or I32), `A_log`, `dt_bias`, plus the float64 answers
//! `o_ref` and `final_state_ref` of conformance vectors. Every metadata value is JSON; the keys
//! [`OPTION_KEYS`] set [`Options`], other keys (such as `case`) are ignored.

use std::collections::HashMap;
use std::fs::File;
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
///
/// A memory map is only as stable as the file under it: if another process truncates the file
/// while it is mapped, reading the lost pages raises `SIGBUS`. [`MappedFile::check_unchanged`]
/// detects a change between reads; the command line also turns the signal into a clean exit.
#[derive(Debug)]
pub struct MappedFile {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<std::time::SystemTime>,
    map: memmap2::Mmap,
}

/// What kind of file system entry `t` is, for messages.
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device node";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

impl MappedFile {
    /// Maps the file at `path` read-only. Anything but a regular file is refused before it is
    /// opened, so a FIFO or a device node never blocks the open.
    pub fn open(path: &Path) -> Result<MappedFile> {
        let not_regular = |t: std::fs::FileType| {
            Error::file(path, format!("expected a regular file, got {}", kind_of(t)))
        };
        // stat does not open the file: it cannot block on a FIFO.
        let meta =
            std::fs::metadata(path).map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
        if !meta.is_file() {
            return Err(not_regular(meta.file_type()));
        }
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true);
        // Non-blocking, in case the path was replaced by a FIFO since the stat.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut oo, libc::O_NONBLOCK);
        let file = oo
            .open(path)
            .map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::file(path, format!("cannot stat: {e}")))?;
        if !meta.is_file() {
            return Err(not_regular(meta.file_type()));
        }
        if meta.len() == 0 {
            return Err(Error::file(
                path,
                "expected a safetensors file, got an empty file",
            ));
        }
        // SAFETY: the map is read-only and only ever read through bounds-checked slices. A
        // truncation by another process can still make a read fault (see the type's doc).
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::file(path, format!("cannot map: {e}")))?;
        Ok(MappedFile {
            path: path.to_path_buf(),
            len: meta.len(),
            modified: meta.modified().ok(),
            file,
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

    /// Fails when the mapped file's length or modification time differ from when it was mapped:
    /// its bytes may have changed under the map, or be gone.
    pub fn check_unchanged(&self) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::file(&self.path, format!("cannot stat: {e}")))?;
        if meta.len() != self.len {
            return Err(Error::file(
                &self.path,
                format!(
                    "changed while being read: expected {} bytes, got {} (truncated or rewritten by another process); no output written",
                    self.len,
                    meta.len()
                ),
            ));
        }
        if meta.modified().ok() != self.modified {
            return Err(Error::file(
                &self.path,
                "changed while being read: its modification time moved (rewritten by another process); no output written",
            ));
        }
        Ok(())
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
        E::InvalidHeaderLength => {
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

/// The largest header safetensors reads.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The message for a header length over safetensors' limit, which it reports as too large
/// without saying by how much: the length, the limit, and whether it also runs past the end.
fn header_too_large(bytes: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    if n <= MAX_HEADER_BYTES {
        return None;
    }
    let past_end = n.saturating_add(8) > bytes.len() as u64;
    Some(if past_end {
        format!(
            "expected a safetensors header of at most 100 MB, got a header length of {n} bytes, over safetensors' limit and past the end of the {}-byte file (not safetensors, or truncated)",
            bytes.len()
        )
    } else {
        format!(
            "expected a safetensors header of at most 100 MB (safetensors' limit), got a header of {n} bytes"
        )
    })
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
    if let Some(msg) = header_too_large(bytes) {
        return Err(Error::file(path, msg));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_file_notices_a_change_of_length() {
        let dir = std::env::temp_dir().join(format!("deltanet-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("folder");
        let path = dir.join("in.st");
        std::fs::write(&path, b"0123456789abcdef").expect("write");
        let m = MappedFile::open(&path).expect("map");
        m.check_unchanged().expect("unchanged");
        // Growing keeps the mapped pages valid but is still a change of the input.
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.set_len(32).expect("grow");
        let e = m.check_unchanged().expect_err("changed").to_string();
        assert!(
            e.contains("changed while being read") && e.contains("expected 16 bytes, got 32"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // Not a regular file: refused before opening.
        let e = MappedFile::open(&std::env::temp_dir())
            .expect_err("a folder")
            .to_string();
        assert!(
            e.contains("expected a regular file, got a directory"),
            "{e}"
        );
    }

    #[test]
    fn a_header_over_the_limit_is_reported_as_such() {
        let len = |n: u64, total: usize| {
            let mut b = vec![0u8; total];
            b[..8].copy_from_slice(&n.to_le_bytes());
            b
        };
        // Within the limit: left to safetensors' own checks.
        assert_eq!(header_too_large(&len(100_000_000, 16)), None);
        let e = header_too_large(&len(100_000_001, 16)).expect("too large");
        assert!(e.contains("100 MB") && e.contains("100000001 bytes"), "{e}");
        assert!(e.contains("past the end of the 16-byte file"), "{e}");
        // Over the limit although the file holds it: only the limit is at fault. (calloc'd
        // zeros: no 150 MB are touched.)
        let e = header_too_large(&len(150_000_000, 150_000_016)).expect("too large");
        assert!(
            e.contains("safetensors' limit") && !e.contains("past the end"),
            "{e}"
        );
        let err = parse(&len(150_000_000, 150_000_016), Path::new("big.st"))
            .expect_err("refused")
            .to_string();
        assert!(
            err.starts_with("big.st: ") && err.contains("100 MB"),
            "{err}"
        );
    }
}
