//! The definition of the gated delta rule: the float64 recurrence, token by token.

use rayon::prelude::*;

use super::stages::{activate, Activated64};
use super::{initial_state_k_major, states_to_caller};
use crate::error::Result;
use crate::options::Options;
use crate::problem::{Inputs, Problem};

/// The exact answer in float64.
#[derive(Clone, Debug)]
pub struct Reference {
    /// `[B, T, HV, V]`.
    pub o: Vec<f64>,
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`).
    pub final_state: Vec<f64>,
    /// The state entering every chunk of `opts.chunk_size` tokens, `[chunks, HV, K, V]`
    /// (K-major whatever `state_v_first` says): what the chunk_state stage must produce.
    pub h: Vec<f64>,
}

/// Runs the definition on `x` with `opts`:
/// per sequence and value head j, `S <- e^g S; u = beta (v - S^T k); S <- S + k u^T;
/// o = S^T (scale q)`, after the optional l2norm, beta and gate activations.
pub fn reference(x: &Inputs<'_>, opts: &Options) -> Result<Reference> {
    let p = Problem::from_inputs(x, opts)?;
    let a = activate(x, opts)?;
    let h0 = initial_state_k_major(x, &p, opts.state_v_first);
    let scale = opts
        .scale
        .map(|s| s as f64)
        .unwrap_or(1.0 / (p.dk() as f64).sqrt());
    let (hv, dk, dv) = (p.v_heads(), p.dk(), p.dv());
    let kv = dk * dv;
    let heads: Vec<Head> = (0..p.num_seqs() * hv)
        .into_par_iter()
        .map(|task| {
            let (n, j) = (task / hv, task % hv);
            run_head(&p, &a, n, j, &h0[task * kv..][..kv], scale)
        })
        .collect();

    let mut o = vec![0f64; p.tokens() * hv * dv];
    let mut h = vec![0f64; p.chunks().len() * hv * kv];
    let mut fin = vec![0f64; p.num_seqs() * hv * kv];
    for (task, head) in heads.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let t0 = p.seqs()[n].0;
        for (i, row) in head.o.chunks_exact(dv).enumerate() {
            o[((t0 + i) * hv + j) * dv..][..dv].copy_from_slice(row);
        }
        for (ci, s) in p.seq_chunks(n).zip(head.h.chunks_exact(kv)) {
            h[(ci * hv + j) * kv..][..kv].copy_from_slice(s);
        }
        fin[task * kv..][..kv].copy_from_slice(&head.state);
    }
    Ok(Reference {
        o,
        final_state: states_to_caller(&fin, dk, dv, opts.state_v_first),
        h,
    })
}

/// One (sequence, value head)'s outputs `[len, V]`, the states entering its chunks and its final
/// state, K-major.
struct Head {
    o: Vec<f64>,
    h: Vec<f64>,
    state: Vec<f64>,
}

fn run_head(p: &Problem, a: &Activated64, n: usize, j: usize, h0: &[f64], scale: f64) -> Head {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kh = p.qk_head(j);
    // s[r * dv + c]: key r, value c.
    let mut s = h0.to_vec();
    let (t0, t1) = p.seqs()[n];
    let mut o = vec![0f64; (t1 - t0) * dv];
    let mut h = Vec::with_capacity(p.seq_chunks(n).len() * s.len());
    let chunk_starts: Vec<usize> = p.seq_chunks(n).map(|ci| p.chunks()[ci].start).collect();
    for t in t0..t1 {
        if chunk_starts.binary_search(&t).is_ok() {
            h.extend_from_slice(&s);
        }
        let tj = t * hv + j;
        let decay = a.g[tj].exp();
        s.iter_mut().for_each(|x| *x *= decay);
        let kt = &a.k[(t * nh + kh) * dk..][..dk];
        let qt = &a.q[(t * nh + kh) * dk..][..dk];
        for c in 0..dv {
            let sk: f64 = (0..dk).map(|r| s[r * dv + c] * kt[r]).sum();
            let u = a.beta[tj] * (a.v[tj * dv + c] - sk);
            for r in 0..dk {
                s[r * dv + c] += kt[r] * u;
            }
            o[(t - t0) * dv + c] = scale * (0..dk).map(|r| s[r * dv + c] * qt[r]).sum::<f64>();
        }
    }
    Head { o, h, state: s }
}
