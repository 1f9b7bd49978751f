//! The oracle: the gated delta rule defined in float64, slow and obviously right. Every test and
//! `deltanet selftest` compare against these definitions and define nothing of their own.
//!
//! - [`reference()`]: the per-token recurrence with every option, the answer the whole forward and
//!   the recurrent step must give.
//! - The stages of the chunked form, each a function of its own inputs (f32 as a device produced
//!   them, or f64 from the stage before): [`l2norm`], [`gate`] and [`beta_activation`],
//!   [`chunk_local_cumsum`] with its decay rule ([`Gamma64`]), [`a_strict`], [`a_inv`], [`w_u`],
//!   [`chunk_state`] (h, [`v_new`], final state) and [`chunk_output`]. [`chunked`] composes them;
//!   that it equals [`reference()`] is what makes them the definitions of the stages.
//!
//! Layouts are the [`crate::Backend`] stages': per-token rows `[B, T, H or HV, ...]` flattened,
//! block matrices `[B, T, HV, BT]`, states `[chunks or N, HV, K, V]` (K-major).

use crate::problem::Inputs;

mod recurrence;
mod stages;

pub use recurrence::{reference, Reference};
pub use stages::{
    a_inv, a_strict, activate, beta_activation, chunk_local_cumsum, chunk_output, chunk_state,
    chunked, gate, inverse_residual, l2norm, softplus, v_new, w_u, Activated64, Gamma64,
    InverseResidual,
};

/// A number the definitions take as input: f32 as a device produced it, or f64.
pub trait Real: Copy + Into<f64> {}
impl<T: Copy + Into<f64>> Real for T {}

/// `x` widened to f64.
pub fn widen<T: Real>(x: &[T]) -> Vec<f64> {
    x.iter().map(|&v| v.into()).collect()
}

fn tensor_f64(t: &crate::Tensor<'_>) -> Vec<f64> {
    widen(&t.to_f32())
}

/// The initial state of `x` in f64, K-major (`[N, HV, K, V]`) whatever `state_v_first` says;
/// zeros without one.
fn initial_state_k_major(x: &Inputs<'_>, p: &crate::Problem, v_first: bool) -> Vec<f64> {
    match &x.initial_state {
        Some(h0) => states_k_major(&tensor_f64(h0), p.dk(), p.dv(), v_first),
        None => vec![0f64; p.num_seqs() * p.v_heads() * p.dk() * p.dv()],
    }
}

/// Index of state element (key r, value c) in one head's state, in the caller's layout.
fn state_index(v_first: bool, dk: usize, dv: usize, r: usize, c: usize) -> usize {
    if v_first {
        c * dk + r
    } else {
        r * dv + c
    }
}

/// K-major states (`[N, HV, K, V]`) in the caller's layout.
fn states_to_caller(s: &[f64], dk: usize, dv: usize, v_first: bool) -> Vec<f64> {
    // With v_first both directions transpose each block: states_k_major with K and V swapped.
    states_k_major(s, dv, dk, v_first)
}

/// States `[N, HV, K, V]` in the caller's layout (`[N, HV, V, K]` with `v_first`) in K-major
/// layout, as the chunk_state stage keeps them.
pub fn states_k_major(s: &[f64], dk: usize, dv: usize, v_first: bool) -> Vec<f64> {
    let kv = dk * dv;
    let mut out = vec![0f64; s.len()];
    for (dst, src) in out.chunks_exact_mut(kv).zip(s.chunks_exact(kv)) {
        for r in 0..dk {
            for c in 0..dv {
                dst[r * dv + c] = src[state_index(v_first, dk, dv, r, c)];
            }
        }
    }
    out
}

/// `||out - ref|| / ||ref||` over whole tensors (0 when both are zero; infinite on a length
/// mismatch or a non-finite output).
pub fn rel_l2(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&a, &b) in out.iter().zip(reference) {
        let d = a as f64 - b;
        num += d * d;
        den += b * b;
    }
    if !num.is_finite() {
        return f64::INFINITY;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}
