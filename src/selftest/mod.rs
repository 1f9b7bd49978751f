//! The conformance suite, runnable on any device: random problems with every option, each stage
//! of the chunked forward checked against its definition computed in float64, the whole forward
//! and the recurrent step against the oracle ([`crate::reference::reference`]), prefill plus
//! decode against a longer prefill, run-to-run bitwise equality, and the conformance vector
//! files. The `deltanet selftest` command and the test suite both use it; on a GPU machine it is
//! how a device is checked without cargo.
//!
//! It also holds what every test shares: the one generator of test problems ([`gen`]: [`Rng`],
//! [`Spec`]) and the one reader of conformance vector files ([`vectors`], through
//! [`crate::io`] as `deltanet run` reads its input). The definitions it checks against are
//! [`crate::reference`]'s.

use std::path::Path;

use crate::dtype::DType;
use crate::error::Result;
use crate::options::Options;
use crate::problem::{Inputs, Problem};
use crate::reference::{reference, rel_l2};
use crate::{cpu, forward, recurrent_step, Device};

pub mod gen;
mod stages;
pub mod vectors;

pub use gen::{
    layer_inputs, layer_inputs_periodic, random_case, token_range, unit_rows, Case, Rng, Spec,
};
pub use vectors::{check_vector_file, load_vector, vector_files, VectorCase};

/// The outcome of one check.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked (`random#3 [B=1 T=77 ...]: solve_tril`).
    pub name: String,
    /// Whether it met its bound.
    pub passed: bool,
    /// The measured error and the bound, or the error message.
    pub detail: String,
}

/// The relative L2 bound for whole-forward results on `device` with inputs of `dtype` (output
/// in f32): 1e-5 on the CPU; on a GPU 1e-4 for f32 inputs and 5e-3 for half-precision ones.
pub fn forward_tolerance(device: &Device, dtype: DType) -> f64 {
    match (device, dtype) {
        (Device::Cpu, _) => 1e-5,
        (Device::Cuda(_), DType::F32) => 1e-4,
        (Device::Cuda(_), _) => 5e-3,
    }
}

/// Runs `count` random problems from `seed` and every `*.safetensors` file in `vectors`, on
/// `device`, every forward in `precision`; calls `on_check` as each check completes and returns
/// them all. (The bounds are [`forward_tolerance`]'s either way: `Precision::Fast` differs from
/// `Exact` only where a GPU's fused kernel reads bf16 inputs, whose bound is 5e-3.)
pub fn run(
    device: &Device,
    seed: u64,
    count: usize,
    vectors: Option<&Path>,
    precision: crate::Precision,
    on_check: &mut dyn FnMut(&Check),
) -> Vec<Check> {
    let mut all = Vec::new();
    let mut emit = |c: Check, all: &mut Vec<Check>| {
        on_check(&c);
        all.push(c);
    };
    let mut rng = Rng::new(seed);
    for i in 0..count {
        match random_case(&mut rng) {
            Ok(mut case) => {
                case.opts.precision = precision;
                let prefix = format!("random#{i} {}", case.name);
                let mut checks = Vec::new();
                check_case(device, &case, &mut rng, &mut |name, r| {
                    checks.push(to_check(&prefix, name, r))
                });
                for c in checks {
                    emit(c, &mut all);
                }
            }
            Err(e) => emit(
                Check {
                    name: format!("random#{i}"),
                    passed: false,
                    detail: format!("could not build the problem: {e}"),
                },
                &mut all,
            ),
        }
    }
    if let Some(dir) = vectors {
        match vector_files(dir) {
            Ok(files) => {
                for f in files {
                    for c in check_vector_file(device, &f, precision) {
                        emit(c, &mut all);
                    }
                }
            }
            Err(e) => emit(
                Check {
                    name: format!("vectors {}", dir.display()),
                    passed: false,
                    detail: e,
                },
                &mut all,
            ),
        }
    }
    all
}

/// One measured error against its bound: Ok((error, bound)) or the device's error.
type Measured = Result<(f64, f64)>;

fn to_check(prefix: &str, name: &str, r: Measured) -> Check {
    let full = format!("{prefix}: {name}");
    match r {
        Ok((err, bound)) => Check {
            name: full,
            passed: err <= bound,
            detail: format!("error {err:.2e} (bound {bound:.0e})"),
        },
        Err(e) => Check {
            name: full,
            passed: false,
            detail: format!("error: {e}"),
        },
    }
}

/// The whole forward of `x` against `o_ref` and `final_state_ref` (the state in the caller's
/// layout), then the recurrent step from the same initial state against them; `tol` bounds
/// each.
fn forward_and_recurrent_checks(
    device: &Device,
    x: &Inputs<'_>,
    opts: &Options,
    o_ref: &[f64],
    s_ref: &[f64],
    tol: f64,
    report: &mut dyn FnMut(&str, Measured),
) {
    match forward(device, x, opts) {
        Ok(out) => {
            report("forward o", Ok((rel_l2(&out.o.to_f32(), o_ref), tol)));
            let es = out
                .final_state
                .as_ref()
                .map_or(f64::INFINITY, |s| rel_l2(&s.to_f32(), s_ref));
            report("forward final_state", Ok((es, tol)));
        }
        Err(e) => report("forward", Err(e)),
    }
    let p = match Problem::from_inputs(x, opts) {
        Ok(p) => p,
        Err(e) => return report("recurrent", Err(e)),
    };
    let mut state = match &x.initial_state {
        Some(s) => s.to_f32().into_owned(),
        None => vec![0f32; p.num_seqs() * p.v_heads() * p.state_len()],
    };
    let x = Inputs {
        initial_state: None,
        ..x.clone()
    };
    match recurrent_step(device, &x, &mut state, opts) {
        Ok(o) => {
            report("recurrent o", Ok((rel_l2(&o.to_f32(), o_ref), tol)));
            report("recurrent final_state", Ok((rel_l2(&state, s_ref), tol)));
        }
        Err(e) => report("recurrent", Err(e)),
    }
}

/// Runs every check on one problem, reporting each through `report`.
pub fn check_case(
    device: &Device,
    case: &Case,
    rng: &mut Rng,
    report: &mut dyn FnMut(&str, Measured),
) {
    let tol = forward_tolerance(device, case.inputs.q.dtype());
    let p = match Problem::from_inputs(&case.inputs, &case.opts) {
        Ok(p) => p,
        Err(e) => return report("problem", Err(e)),
    };
    let oracle = match reference(&case.inputs, &case.opts) {
        Ok(o) => o,
        Err(e) => return report("oracle", Err(e)),
    };
    let act = match crate::reference::activate(&case.inputs, &case.opts) {
        Ok(a) => a,
        Err(e) => return report("activate", Err(e)),
    };
    let stage_tol = match device {
        Device::Cpu => 1e-5,
        Device::Cuda(_) => tol,
    };
    let staged = match device {
        Device::Cpu => stages::stage_checks(&cpu::Cpu, &p, case, &act, &oracle, stage_tol, report),
        Device::Cuda(d) => {
            stages::stage_checks(d.as_ref(), &p, case, &act, &oracle, stage_tol, report)
        }
    };
    if let Err(e) = staged {
        report("stages", Err(e));
    }

    // The whole forward and the recurrent step against the oracle.
    forward_and_recurrent_checks(
        device,
        &case.inputs,
        &case.opts,
        &oracle.o,
        &oracle.final_state,
        tol,
        report,
    );
    // Run-to-run bitwise equality.
    let twice = forward(device, &case.inputs, &case.opts).and_then(|a| {
        let b = forward(device, &case.inputs, &case.opts)?;
        let same = a.o.as_bytes() == b.o.as_bytes()
            && a.final_state.as_ref().map(|s| s.as_bytes())
                == b.final_state.as_ref().map(|s| s.as_bytes());
        Ok(if same { 0.0 } else { 1.0 })
    });
    report("two runs bitwise equal", twice.map(|d| (d, 0.0)));

    // Prefill of T - r tokens then r recurrent steps equals the prefill of T tokens.
    if case.inputs.cu_seqlens.is_none() && p.seq_len() >= 2 {
        let r = rng.int(1, p.seq_len().min(4) - 1);
        report(
            &format!(
                "prefill {} + {r} steps == prefill {}",
                p.seq_len() - r,
                p.seq_len()
            ),
            prefill_then_decode(device, case, &p, r, &oracle.o, &oracle.final_state, tol),
        );
    }
}

fn prefill_then_decode(
    device: &Device,
    case: &Case,
    p: &Problem,
    r: usize,
    o_ref: &[f64],
    s_ref: &[f64],
    tol: f64,
) -> Measured {
    let (b, t) = (p.batch(), p.seq_len());
    let t1 = t - r;
    let x = &case.inputs;
    let first = token_range(x, 0, t1)?;
    let out = forward(device, &first, &case.opts)?;
    let mut state = match &out.final_state {
        Some(s) => s.to_f32().into_owned(),
        None => return Ok((f64::INFINITY, tol)),
    };
    let rest = Inputs {
        initial_state: None,
        ..token_range(x, t1, t)?
    };
    let o2 = recurrent_step(device, &rest, &mut state, &case.opts)?;
    // Interleave the two outputs back into [B, T, HV, V].
    let row = p.v_heads() * p.dv();
    let (o1, o2) = (out.o.to_f32(), o2.to_f32());
    let mut o = Vec::with_capacity(b * t * row);
    for bi in 0..b {
        o.extend_from_slice(&o1[bi * t1 * row..(bi + 1) * t1 * row]);
        o.extend_from_slice(&o2[bi * r * row..(bi + 1) * r * row]);
    }
    Ok((rel_l2(&o, o_ref).max(rel_l2(&state, s_ref)), tol))
}
