use rayon::prelude::*;

use crate::cpu::{axpy, dot};
use crate::error::{check_len, Result};
use crate::problem::Problem;

/// One token of the gated delta rule on some columns of one head's K-major state, given as its
/// `K = k.len()` rows (`w = u.len()` columns each): with `S` the state decayed by `decay`,
/// `u = beta (v - S^T k)`, then `S <- S + k u^T` and `o = scale S^T q`. The state is read from
/// `src` (`None`: from `state`) and written to `state`; `v`, `u` and `o` hold `w` values.
///
/// Two passes over the state, the decayed state never stored: the first reads it for `S^T k`,
/// the second reads it again (from L1/L2) and writes the new one and `o`. Each element sees the
/// same operations in the same order as decaying, updating and reading the state in separate
/// passes would, so the result is that of the plain recurrence. Compiled for AVX-512 and for
/// AVX2 as well, chosen at run time; with no FMA contraction every variant rounds alike.
#[allow(clippy::too_many_arguments)]
pub(crate) fn token_step(
    state: &mut [&mut [f32]],
    src: Option<&[&[f32]]>,
    k: &[f32],
    q: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    u: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if crate::cpu::kernel::have_avx512() {
        // SAFETY: AVX-512F was just detected.
        return unsafe { token_step_avx512(state, src, k, q, v, decay, beta, scale, u, o) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just detected.
            return unsafe { token_step_avx2(state, src, k, q, v, decay, beta, scale, u, o) };
        }
    }
    token_step_plain::<64>(state, src, k, q, v, decay, beta, scale, u, o)
}

/// [`token_step`] compiled for AVX-512.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(all(target_arch = "x86_64", deltanet_avx512))]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn token_step_avx512(
    state: &mut [&mut [f32]],
    src: Option<&[&[f32]]>,
    k: &[f32],
    q: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    u: &mut [f32],
    o: &mut [f32],
) {
    token_step_plain::<128>(state, src, k, q, v, decay, beta, scale, u, o)
}

/// [`token_step`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn token_step_avx2(
    state: &mut [&mut [f32]],
    src: Option<&[&[f32]]>,
    k: &[f32],
    q: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    u: &mut [f32],
    o: &mut [f32],
) {
    token_step_plain::<64>(state, src, k, q, v, decay, beta, scale, u, o)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn token_step_plain<const WIDE: usize>(
    state: &mut [&mut [f32]],
    src: Option<&[&[f32]]>,
    k: &[f32],
    q: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    u: &mut [f32],
    o: &mut [f32],
) {
    // Blocks of WIDE columns (then 16, then single ones): a block's sums stay in registers while
    // the rows pass, so only the state itself goes through memory, and a whole row of 128 is
    // one block where 32 registers hold it.
    let w = u.len();
    let mut c0 = 0;
    while c0 < w {
        let step = match w - c0 {
            r if r >= WIDE => columns::<WIDE>(state, src, c0, k, q, v, decay, beta, scale, u, o),
            r if r >= 16 => columns::<16>(state, src, c0, k, q, v, decay, beta, scale, u, o),
            _ => columns::<1>(state, src, c0, k, q, v, decay, beta, scale, u, o),
        };
        c0 += step;
    }
}

/// [`token_step`] on columns `c0..c0 + B`; returns `B`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn columns<const B: usize>(
    state: &mut [&mut [f32]],
    src: Option<&[&[f32]]>,
    c0: usize,
    k: &[f32],
    q: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    scale: f32,
    u: &mut [f32],
    o: &mut [f32],
) -> usize {
    let mut acc = [0f32; B];
    for (r, &kr) in k.iter().enumerate() {
        let s_in: &[f32] = match src {
            Some(src) => src[r],
            None => state[r],
        };
        for (a, &s) in acc.iter_mut().zip(&s_in[c0..c0 + B]) {
            *a += kr * (s * decay);
        }
    }
    let mut ub = [0f32; B];
    for ((ub, &a), &vc) in ub.iter_mut().zip(&acc).zip(&v[c0..c0 + B]) {
        *ub = beta * (vc - a);
    }
    u[c0..c0 + B].copy_from_slice(&ub);
    let mut ob = [0f32; B];
    for (r, (&kr, &qr)) in k.iter().zip(q).enumerate() {
        let qr = scale * qr;
        let row = &mut state[r][c0..c0 + B];
        match src {
            Some(src) => {
                for (((out, &s), &uc), oc) in row
                    .iter_mut()
                    .zip(&src[r][c0..c0 + B])
                    .zip(&ub)
                    .zip(&mut ob)
                {
                    let s = s * decay + kr * uc;
                    *out = s;
                    *oc += qr * s;
                }
            }
            None => {
                for ((out, &uc), oc) in row.iter_mut().zip(&ub).zip(&mut ob) {
                    let s = *out * decay + kr * uc;
                    *out = s;
                    *oc += qr * s;
                }
            }
        }
    }
    o[c0..c0 + B].copy_from_slice(&ob);
    B
}

/// The gated delta rule token by token, updating `state` in place (`[N, HV, K, V]`, or
/// `[N, HV, V, K]` with `v_first`); returns `o` `[B, T, HV, V]`. `g` and `beta` are the
/// effective (activated) values.
#[allow(clippy::too_many_arguments)]
pub fn recurrent(
    p: &Problem,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    v_first: bool,
    scale: f32,
) -> Result<Vec<f32>> {
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let kv = p.state_len();
    check_len("q", q.len(), p.tokens() * nh * dk)?;
    check_len("k", k.len(), p.tokens() * nh * dk)?;
    p.check("v", v.len(), dv)?;
    p.check("g", g.len(), 1)?;
    p.check("beta", beta.len(), 1)?;
    check_len("state", state.len(), p.num_seqs() * hv * kv)?;

    let outs: Vec<Vec<f32>> = state
        .par_chunks_mut(kv)
        .enumerate()
        .map(|(task, s)| {
            let (n, j) = (task / hv, task % hv);
            let kh = p.qk_head(j);
            let (t0, t1) = p.seqs()[n];
            let mut o = vec![0f32; (t1 - t0) * dv];
            let token = |t: usize| {
                let tj = t * hv + j;
                (
                    tj,
                    g[tj].exp(),
                    &k[(t * nh + kh) * dk..][..dk],
                    &q[(t * nh + kh) * dk..][..dk],
                    &v[tj * dv..][..dv],
                )
            };
            if v_first {
                for t in t0..t1 {
                    let (tj, decay, k_row, q_row, v_row) = token(t);
                    let o_row = &mut o[(t - t0) * dv..][..dv];
                    for c in 0..dv {
                        let row = &mut s[c * dk..][..dk];
                        row.iter_mut().for_each(|x| *x *= decay);
                        let uc = beta[tj] * (v_row[c] - dot(row, k_row));
                        axpy(row, uc, k_row);
                        o_row[c] = scale * dot(row, q_row);
                    }
                }
            } else {
                let mut u = vec![0f32; dv];
                let mut rows: Vec<&mut [f32]> = s.chunks_exact_mut(dv).collect();
                for t in t0..t1 {
                    let (tj, decay, k_row, q_row, v_row) = token(t);
                    let o_row = &mut o[(t - t0) * dv..][..dv];
                    token_step(
                        &mut rows, None, k_row, q_row, v_row, decay, beta[tj], scale, &mut u, o_row,
                    );
                }
            }
            o
        })
        .collect();

    let mut o = vec![0f32; p.tokens() * hv * dv];
    for (task, out) in outs.into_iter().enumerate() {
        let (n, j) = (task / hv, task % hv);
        let t0 = p.seqs()[n].0;
        crate::cpu::scatter_rows(&mut o, &out, t0, hv, j, dv);
    }
    Ok(o)
}
