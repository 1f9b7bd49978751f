//! The stages of the chunked forward, as a trait every device implements. Buffers are flat f32
//! arrays in FLA's layouts; the [`Problem`] gives their dimensions.

use crate::error::Result;
use crate::options::Options;
use crate::problem::Problem;

/// A gate with exp(g) below e^-40 is treated as a hard reset of the state (exactly zero decay).
///
/// Why: the chunked form exponentiates differences of the within-chunk cumulative sum `gamma`.
/// After g = -inf that difference would be -inf - -inf = NaN, and after g = -1e4 the sum is so
/// large that the small gates after it vanish in its rounding. Restarting the sum at such a token
/// and remembering that a reset happened keeps every difference defined and small.
///
/// What it changes: e^-40 is about 4e-18, so zeroing the decay moves a result by at most that
/// times the state's magnitude: below f32's rounding wherever the tokens after the gate write
/// anything within about 1e-10 of the state's size, but all of the answer where nothing is
/// written after it (beta = 0 there) and only the decayed state remains. The per-token paths
/// ([`crate::recurrent_step`], [`crate::decode`]) multiply by exp(g) as it is, so in that case
/// they and the chunked forward differ (by e^-40 of the state at most).
pub const RESET_LOG_DECAY: f32 = -40.0;

/// The within-chunk cumulative gate, as FLA's `gamma = cumsum(g)` plus what makes its
/// differences exact.
///
/// - `gamma[t]`: the sum of g over the chunk's tokens up to t, restarted after every hard reset
///   (see [`RESET_LOG_DECAY`]).
/// - `lo[t]`: the rounding error of that f32 running sum, accumulated exactly (TwoSum), so that
///   `gamma + lo` is the sum to about f32 precision *of the differences*. Without it, a chunk
///   whose gates add up to -500 resolves later decays only to about 3e-5.
/// - `seg[t]`: the resets in the chunk up to and including t (small integers, stored as f32 to
///   share the buffer type).
///
/// The decay from token j to token i of one chunk (j <= i) is
/// `exp((gamma[i] - gamma[j]) + (lo[i] - lo[j]))` when `seg[i] == seg[j]` and 0 otherwise; from
/// the state entering the chunk to token i it is `exp(gamma[i] + lo[i])` when `seg[i] == 0` and 0
/// otherwise. Layout `[B, T, HV]` for all three.
#[derive(Clone, Debug)]
pub struct Gamma<B> {
    /// Cumulative log decay within the chunk (and within the reset segment).
    pub gamma: B,
    /// Accumulated rounding error of `gamma`.
    pub lo: B,
    /// Hard resets so far in the chunk.
    pub seg: B,
}

/// The WY representation of a chunk: `w = A_inv (beta e^gamma k)`, `u = A_inv (beta v)`.
#[derive(Clone, Debug)]
pub struct Wy<B> {
    /// `[B, T, HV, K]`.
    pub w: B,
    /// `[B, T, HV, V]`.
    pub u: B,
}

/// What the sequential pass over chunks produces.
#[derive(Clone, Debug)]
pub struct ChunkStates<B> {
    /// The state entering each chunk, `[chunks, HV, K, V]`.
    pub h: B,
    /// The corrected values `v_new = u - w h`, `[B, T, HV, V]`.
    pub v_new: B,
    /// The state after each sequence, `[N, HV, K, V]`.
    pub final_state: B,
}

/// The forward's inputs on a device, all f32, states K-major (`[N, HV, K, V]`).
#[derive(Clone, Debug)]
pub struct StageInputs<B> {
    /// `[B, T, H, K]`.
    pub q: B,
    /// `[B, T, H, K]`.
    pub k: B,
    /// `[B, T, HV, V]`.
    pub v: B,
    /// `[B, T, HV]`, before activation.
    pub g: B,
    /// `[B, T, HV]`, before activation.
    pub beta: B,
    /// `[N, HV, K, V]` or none (zeros).
    pub h0: Option<B>,
    /// `[HV]`, with `gate_in_kernel`.
    pub a_log: Option<B>,
    /// `[HV]`, with `gate_in_kernel`.
    pub dt_bias: Option<B>,
}

/// One device's implementation of every stage. Each method validates its buffers' lengths
/// against the problem and returns new buffers; none synchronises with the host unless it
/// returns host data.
pub trait Backend {
    /// A flat f32 buffer on this device.
    type Buf;

    /// `x / sqrt(sum x^2 + 1e-6)` over each row of `dim` elements (`rows * dim` elements).
    fn l2norm(&self, x: &Self::Buf, rows: usize, dim: usize) -> Result<Self::Buf>;

    /// The effective gate and beta: `g`, or `-exp(A_log) softplus(g + dt_bias)` with
    /// `gate_in_kernel`; `beta`, or `sigmoid(beta)` (times 2 with `allow_neg_eigval`) with
    /// `beta_is_logits`.
    fn gate(
        &self,
        p: &Problem,
        opts: &Options,
        g: &Self::Buf,
        beta: &Self::Buf,
        a_log: Option<&Self::Buf>,
        dt_bias: Option<&Self::Buf>,
    ) -> Result<(Self::Buf, Self::Buf)>;

    /// `gamma = cumsum(g)` within each chunk, with its error term and reset count (see
    /// [`Gamma`]).
    fn chunk_local_cumsum(&self, p: &Problem, g: &Self::Buf) -> Result<Gamma<Self::Buf>>;

    /// `A_strict[i, j] = beta_i (k_i . k_j) exp(gamma_i - gamma_j)` for i > j in one chunk, zero
    /// elsewhere; layout `[B, T, HV, BT]`.
    fn chunk_scaled_dot_kkt(
        &self,
        p: &Problem,
        k: &Self::Buf,
        beta: &Self::Buf,
        gamma: &Gamma<Self::Buf>,
    ) -> Result<Self::Buf>;

    /// `A_inv = (I + A_strict)^-1` for every chunk block, on layout `[B, T, HV, BT]`.
    fn solve_tril(&self, p: &Problem, a_strict: &Self::Buf) -> Result<Self::Buf>;

    /// `w = A_inv (beta e^gamma k)`, `u = A_inv (beta v)`.
    fn recompute_w_u(
        &self,
        p: &Problem,
        k: &Self::Buf,
        v: &Self::Buf,
        beta: &Self::Buf,
        gamma: &Gamma<Self::Buf>,
        a_inv: &Self::Buf,
    ) -> Result<Wy<Self::Buf>>;

    /// The sequential pass over each sequence's chunks, carrying the state from `h0` (or zero).
    fn chunk_state(
        &self,
        p: &Problem,
        k: &Self::Buf,
        wy: &Wy<Self::Buf>,
        gamma: &Gamma<Self::Buf>,
        h0: Option<&Self::Buf>,
    ) -> Result<ChunkStates<Self::Buf>>;

    /// `o = scale (e^gamma (q h) + causal(q k^T e^(gamma_i - gamma_j)) v_new)`, diagonal included.
    #[allow(clippy::too_many_arguments)]
    fn chunk_output(
        &self,
        p: &Problem,
        q: &Self::Buf,
        k: &Self::Buf,
        v_new: &Self::Buf,
        h: &Self::Buf,
        gamma: &Gamma<Self::Buf>,
        scale: f32,
    ) -> Result<Self::Buf>;

    /// The whole chunked forward. By default the stages one after the other
    /// ([`crate::chunk_forward`]); a device may run them fused, with the same results up to
    /// rounding.
    fn forward(
        &self,
        p: &Problem,
        opts: &Options,
        x: &StageInputs<Self::Buf>,
    ) -> Result<crate::ForwardOut<Self::Buf>>
    where
        Self: Sized,
    {
        crate::chunk_forward(self, p, opts, x)
    }

    /// The recurrence token by token, updating `state` (`[N, HV, K, V]`, or `[N, HV, V, K]` with
    /// `v_first`) in place and returning `o` `[B, T, HV, V]`. `g` and `beta` are already
    /// activated, q and k already normalised.
    #[allow(clippy::too_many_arguments)]
    fn recurrent(
        &self,
        p: &Problem,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        state: &mut Self::Buf,
        v_first: bool,
        scale: f32,
    ) -> Result<Self::Buf>;
}
