//! The chunked forward, composed from the stages; the same on every device.

use crate::backend::{Backend, ChunkStates, StageInputs};
use crate::error::Result;
use crate::options::Options;
use crate::problem::Problem;

/// What the chunked forward returns, on the device.
#[derive(Clone, Debug)]
pub struct ForwardOut<B> {
    /// `[B, T, HV, V]` f32.
    pub o: B,
    /// The state entering each chunk, `[chunks, HV, K, V]`, with `Options::output_chunk_states`.
    pub h: Option<B>,
    /// `[N, HV, K, V]`.
    pub final_state: B,
}

/// The inputs after the optional l2norm of q and k and the gate and beta activations.
#[derive(Debug)]
pub struct Activated<'a, B> {
    x: &'a StageInputs<B>,
    qk: Option<(B, B)>,
    /// The effective log decay `[B, T, HV]`.
    pub g: B,
    /// The effective beta `[B, T, HV]`.
    pub beta: B,
}

impl<B> Activated<'_, B> {
    /// `[B, T, H, K]`, normalised with `use_qk_l2norm`.
    pub fn q(&self) -> &B {
        self.qk.as_ref().map_or(&self.x.q, |qk| &qk.0)
    }
    /// `[B, T, H, K]`, normalised with `use_qk_l2norm`.
    pub fn k(&self) -> &B {
        self.qk.as_ref().map_or(&self.x.k, |qk| &qk.1)
    }
}

/// l2norm (optional) and gate: what both the chunked and the recurrent paths start with.
pub fn activate<'a, D: Backend>(
    dev: &D,
    p: &Problem,
    opts: &Options,
    x: &'a StageInputs<D::Buf>,
) -> Result<Activated<'a, D::Buf>> {
    let rows = p.tokens() * p.heads();
    let qk = if opts.use_qk_l2norm {
        Some((
            dev.l2norm(&x.q, rows, p.dk())?,
            dev.l2norm(&x.k, rows, p.dk())?,
        ))
    } else {
        None
    };
    let (g, beta) = dev.gate(p, opts, &x.g, &x.beta, x.a_log.as_ref(), x.dt_bias.as_ref())?;
    Ok(Activated { x, qk, g, beta })
}

/// activate -> cumsum -> kkt -> solve_tril -> wy -> chunk_state -> chunk_output.
pub fn chunk_forward<D: Backend>(
    dev: &D,
    p: &Problem,
    opts: &Options,
    x: &StageInputs<D::Buf>,
) -> Result<ForwardOut<D::Buf>> {
    let a = activate(dev, p, opts, x)?;
    let (q, k, beta) = (a.q(), a.k(), &a.beta);
    let gamma = dev.chunk_local_cumsum(p, &a.g)?;
    let a_strict = dev.chunk_scaled_dot_kkt(p, k, beta, &gamma)?;
    let a_inv = dev.solve_tril(p, &a_strict)?;
    let wy = dev.recompute_w_u(p, k, &x.v, beta, &gamma, &a_inv)?;
    let ChunkStates {
        h,
        v_new,
        final_state,
    } = dev.chunk_state(p, k, &wy, &gamma, x.h0.as_ref())?;
    let o = dev.chunk_output(p, q, k, &v_new, &h, &gamma, opts.scale_for(p.dk()))?;
    let h = opts.output_chunk_states.then_some(h);
    Ok(ForwardOut { o, h, final_state })
}
