//! The conformance vector files: one loader (the one `deltanet run` uses, so every metadata key
//! counts) for `deltanet selftest` and the test suite.

use std::path::{Path, PathBuf};

use super::{forward_and_recurrent_checks, forward_tolerance, to_check, Check, Measured};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Inputs;
use crate::Device;

/// A conformance case: inputs and options from a vector file and its float64 answers.
#[derive(Clone, Debug)]
pub struct VectorCase {
    /// The file's stem (`varlen_f32`).
    pub name: String,
    /// The inputs, copied out of the file.
    pub inputs: Inputs<'static>,
    /// The options its metadata sets, with the output in f32.
    pub opts: Options,
    /// The exact output `[B, T, HV, V]`.
    pub o_ref: Vec<f64>,
    /// The exact final state, in the layout the options say.
    pub final_state_ref: Vec<f64>,
}

/// The `*.safetensors` files in `dir`, sorted.
pub fn vector_files(dir: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read the folder: {e}"))?;
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err("expected *.safetensors files, found none".into());
    }
    Ok(files)
}

/// Reads a vector file through [`crate::io`] (as `deltanet run` does) and checks that it
/// describes a valid problem and carries `o_ref` and `final_state_ref`.
pub fn load_vector(path: &Path) -> Result<VectorCase> {
    let file = crate::io::MappedFile::open(path)?;
    let pf = file.parse()?;
    let opts = Options {
        out_dtype: Some(DType::F32),
        ..pf.options.clone()
    };
    pf.problem(path, &opts)?;
    let (Some(o_ref), Some(final_state_ref)) = (pf.o_ref.clone(), pf.final_state_ref.clone())
    else {
        return Err(Error::file(
            path,
            "expected tensors o_ref and final_state_ref, got none",
        ));
    };
    let x = pf.inputs;
    let own = |t: crate::Tensor<'_>| t.into_owned();
    let inputs = Inputs {
        initial_state: x.initial_state.map(own),
        cu_seqlens: x.cu_seqlens,
        a_log: x.a_log.map(own),
        dt_bias: x.dt_bias.map(own),
        ..Inputs::new(own(x.q), own(x.k), own(x.v), own(x.g), own(x.beta))
    };
    Ok(VectorCase {
        name: path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        inputs,
        opts,
        o_ref,
        final_state_ref,
    })
}

/// Checks a conformance vector file: the forward (output in f32, in `precision`) and the
/// recurrent step against its `o_ref` and `final_state_ref`.
pub fn check_vector_file(device: &Device, path: &Path, precision: crate::Precision) -> Vec<Check> {
    let prefix = format!(
        "vector {}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string())
    );
    let mut case = match load_vector(path) {
        Ok(c) => c,
        Err(e) => {
            return vec![Check {
                name: prefix,
                passed: false,
                detail: format!("error: {e}"),
            }]
        }
    };
    case.opts.precision = precision;
    let tol = forward_tolerance(device, case.inputs.q.dtype());
    let mut out = Vec::new();
    let mut report = |name: &str, m: Measured| out.push(to_check(&prefix, name, m));
    forward_and_recurrent_checks(
        device,
        &case.inputs,
        &case.opts,
        &case.o_ref,
        &case.final_state_ref,
        tol,
        &mut report,
    );
    out
}
