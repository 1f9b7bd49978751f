//! Each stage of a device's chunked forward against its float64 definition
//! ([`crate::reference`]), evaluated on the stage's own inputs as the device produced them.

use super::{Case, Measured};
use crate::error::Result;
use crate::problem::Problem;
use crate::reference::{self as r, rel_l2, Activated64, Gamma64, Reference};
use crate::{activate, upload_inputs, HostIo, Wy};

/// The error of a decay relative to the exact one; decays below about 1e-12 (a hard reset's
/// e^-40 among them) count as absolute, far below anything a state can resolve.
fn decay_err(got: f64, exact: f64) -> f64 {
    let e = (got - exact).abs() / (exact + 1e-12);
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// The largest elementwise error `|a - b| / (1 + |b|)`; equal infinities count as exact.
fn max_err(a: &[f32], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let x = x as f64;
            if x == y {
                0.0
            } else {
                let e = (x - y).abs() / (1.0 + y.abs());
                if e.is_nan() {
                    f64::INFINITY
                } else {
                    e
                }
            }
        })
        .fold(0.0, f64::max)
}

/// Runs every stage on `dev` and reports each against its definition (`tol` the bound), the
/// states against the oracle's (`oracle.h`, `oracle.final_state`); a device error ends the
/// checks.
pub(super) fn stage_checks<D: HostIo>(
    dev: &D,
    p: &Problem,
    case: &Case,
    act: &Activated64,
    oracle: &Reference,
    tol: f64,
    report: &mut dyn FnMut(&str, Measured),
) -> Result<()> {
    let si = upload_inputs(dev, p, &case.inputs, &case.opts)?;
    let a = activate(dev, p, &case.opts, &si)?;
    let q = dev.download(a.q())?;
    let k = dev.download(a.k())?;
    let g = dev.download(&a.g)?;
    let beta = dev.download(&a.beta)?;
    let v = dev.download(&si.v)?;
    if case.opts.use_qk_l2norm {
        report(
            "l2norm",
            Ok((rel_l2(&q, &act.q).max(rel_l2(&k, &act.k)), tol)),
        );
    }
    report(
        "gate (g, beta)",
        Ok((max_err(&g, &act.g).max(max_err(&beta, &act.beta)), tol)),
    );

    // cumsum: every decay it implies against the definition's on the same gates.
    let gamma = dev.chunk_local_cumsum(p, &a.g)?;
    let gh = Gamma64::from_stage(
        &dev.download(&gamma.gamma)?,
        &dev.download(&gamma.lo)?,
        &dev.download(&gamma.seg)?,
    );
    let exact = r::chunk_local_cumsum(p, &g);
    let hv = p.v_heads();
    let mut err = 0f64;
    for c in p.chunks() {
        for j in 0..hv {
            let idx = |i: usize| (c.start + i) * hv + j;
            for i in 0..c.len {
                for l in 0..=i {
                    err = err.max(decay_err(
                        gh.decay(idx(i), idx(l)),
                        exact.decay(idx(i), idx(l)),
                    ));
                }
                err = err.max(decay_err(gh.decay0(idx(i)), exact.decay0(idx(i))));
            }
        }
    }
    report("chunk_local_cumsum decays (relative)", Ok((err, tol)));

    // kkt against its definition, with exact decays.
    let a_strict = dev.chunk_scaled_dot_kkt(p, a.k(), &a.beta, &gamma)?;
    let a_host = dev.download(&a_strict)?;
    let want = r::a_strict(p, &k, &beta, &exact);
    report("chunk_scaled_dot_kkt", Ok((rel_l2(&a_host, &want), tol)));

    // solve_tril: (I + A_strict) A_inv = I for every block, zero outside it.
    let a_inv = dev.solve_tril(p, &a_strict)?;
    let inv = dev.download(&a_inv)?;
    let res = r::inverse_residual(p, &a_host, &inv);
    report(
        "solve_tril (I + A) A_inv = I",
        Ok(((res.max_abs / res.max_entry).max(res.outside), tol)),
    );

    // w, u = A_inv times the formula.
    let wy = dev.recompute_w_u(p, a.k(), &si.v, &a.beta, &gamma, &a_inv)?;
    let wy_host = Wy {
        w: dev.download(&wy.w)?,
        u: dev.download(&wy.u)?,
    };
    let want = r::w_u(p, &k, &v, &beta, &gh, &inv);
    report(
        "recompute_w_u",
        Ok((
            rel_l2(&wy_host.w, &want.w).max(rel_l2(&wy_host.u, &want.u)),
            tol,
        )),
    );

    // chunk_state: states against the f64 recurrence, v_new against u - w h.
    let cs = dev.chunk_state(p, a.k(), &wy, &gamma, si.h0.as_ref())?;
    let h = dev.download(&cs.h)?;
    let v_new = dev.download(&cs.v_new)?;
    let fin = dev.download(&cs.final_state)?;
    let fin_k_major =
        r::states_k_major(&oracle.final_state, p.dk(), p.dv(), case.opts.state_v_first);
    report(
        "chunk_state h, final_state vs oracle",
        Ok((rel_l2(&h, &oracle.h).max(rel_l2(&fin, &fin_k_major)), tol)),
    );
    let vn = r::v_new(p, &wy_host, &h);
    report(
        "chunk_state v_new = u - w h",
        Ok((rel_l2(&v_new, &vn), tol)),
    );

    // chunk_output against its definition on the device's own intermediates.
    let scale = case.opts.scale_for(p.dk());
    let o = dev.chunk_output(p, a.q(), a.k(), &cs.v_new, &cs.h, &gamma, scale)?;
    let o = dev.download(&o)?;
    let oo = r::chunk_output(p, &q, &k, &v_new, &h, &gh, scale as f64);
    report("chunk_output", Ok((rel_l2(&o, &oo), tol)));
    Ok(())
}
