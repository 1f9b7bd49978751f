//! The one place where shapes are validated. A [`Problem`] is built once from the inputs and the
//! options; every stage takes it and trusts its dimensions, sequence table and chunk table.

use crate::dtype::{DType, Tensor};
use crate::error::{check_len, checked_numel, Error, Result};
use crate::options::{HeadMap, Options};

/// The forward's inputs, by FLA's names and layouts.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// Queries `[B, T, H, K]`.
    pub q: Tensor<'a>,
    /// Keys `[B, T, H, K]`.
    pub k: Tensor<'a>,
    /// Values `[B, T, HV, V]`.
    pub v: Tensor<'a>,
    /// Log-space decay `[B, T, HV]` (the raw gate input with `gate_in_kernel`).
    pub g: Tensor<'a>,
    /// Write strength `[B, T, HV]` (logits with `beta_is_logits`).
    pub beta: Tensor<'a>,
    /// State before each sequence, `[N, HV, K, V]` f32 (`[N, HV, V, K]` with `state_v_first`).
    pub initial_state: Option<Tensor<'a>>,
    /// Varlen offsets `[N + 1]`: sequence n is tokens `cu[n]..cu[n+1]`; needs B = 1.
    pub cu_seqlens: Option<Vec<i64>>,
    /// `[HV]`, for `gate_in_kernel`.
    pub a_log: Option<Tensor<'a>>,
    /// `[HV]`, for `gate_in_kernel`.
    pub dt_bias: Option<Tensor<'a>>,
}

impl<'a> Inputs<'a> {
    /// The five required tensors, with no initial state, varlen or gate parameters.
    pub fn new(
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        g: Tensor<'a>,
        beta: Tensor<'a>,
    ) -> Self {
        Inputs {
            q,
            k,
            v,
            g,
            beta,
            initial_state: None,
            cu_seqlens: None,
            a_log: None,
            dt_bias: None,
        }
    }
}

/// One chunk of the chunked forward: `len` tokens starting at flat token `start`, in sequence
/// `seq`. Chunks never cross sequences, so the last chunk of a sequence may be short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence this chunk belongs to.
    pub seq: usize,
    /// The first token, as an index into the flattened `B * T` tokens.
    pub start: usize,
    /// Tokens in the chunk, `1..=chunk_size`.
    pub len: usize,
}

/// The sizes of one problem, by FLA's letters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dims {
    /// Batch size B.
    pub batch: usize,
    /// Tokens per batch row T.
    pub seq_len: usize,
    /// q/k heads H.
    pub heads: usize,
    /// Value heads HV, a multiple of H.
    pub v_heads: usize,
    /// Key dimension K.
    pub dk: usize,
    /// Value dimension V.
    pub dv: usize,
}

/// Validated dimensions, sequence table and chunk table of one forward call. Built only by
/// [`Problem::new`] or [`Problem::from_inputs`] and read-only afterwards, so every stage can
/// trust it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    dims: Dims,
    chunk_size: usize,
    head_map: HeadMap,
    seqs: Vec<(usize, usize)>,
    chunks: Vec<Chunk>,
}

/// An empty table with room for `n` rows, or an `Err` (not an abort) when the shapes ask for
/// more than memory can hold.
fn table<T>(arg: &'static str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Overflow {
        arg,
        detail: format!("a table of {n} sequences or chunks cannot be allocated"),
    })?;
    Ok(v)
}

/// The chunks of `bt` tokens of each sequence in order (a sequence's last chunk may be shorter;
/// an empty sequence has none).
fn chunk_table(seqs: &[(usize, usize)], tokens: usize, bt: usize) -> Result<Vec<Chunk>> {
    let mut chunks = table("q", tokens / bt + seqs.len())?;
    for (seq, &(s, e)) in seqs.iter().enumerate() {
        let mut start = s;
        while start < e {
            let len = bt.min(e - start);
            chunks.push(Chunk { seq, start, len });
            start += len;
        }
    }
    Ok(chunks)
}

fn dims_of(arg: &'static str, t: &Tensor<'_>, rank: usize) -> Result<Vec<usize>> {
    if t.shape().len() != rank {
        return Err(Error::invalid(
            arg,
            format!("rank {rank}"),
            format!("rank {} (shape {:?})", t.shape().len(), t.shape()),
        ));
    }
    Ok(t.shape().to_vec())
}

/// Varlen offsets: at least two, from 0, never falling.
pub(crate) fn check_offsets(cu: &[i64]) -> Result<()> {
    if cu.len() < 2 {
        return Err(Error::invalid("cu_seqlens", "at least 2 offsets", cu.len()));
    }
    if cu[0] != 0 {
        return Err(Error::invalid("cu_seqlens", "cu_seqlens[0] = 0", cu[0]));
    }
    if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
        return Err(Error::invalid(
            "cu_seqlens",
            "non-decreasing offsets",
            format!(
                "cu_seqlens[{}] = {} < cu_seqlens[{}] = {}",
                i,
                cu[i],
                i - 1,
                cu[i - 1]
            ),
        ));
    }
    Ok(())
}

/// g `[B, T, HV]` as log-decays: no finite value above 0. The chunked forward takes
/// exponentials of sums of g over up to a chunk of tokens, which a positive gate makes grow as
/// `e^(64 g)`, and with them its rounding errors (g = 1 leaves nothing of the answer), where the
/// per-token recurrence multiplies by `e^g` once a token. A gate is a decay in (0, 1] by
/// construction (`-exp(A_log) softplus(..)`, a log-sigmoid); infinities and NaN keep the
/// non-finite rules of [`crate::forward`].
fn check_log_decays(g: &Tensor<'_>, t: usize, hv: usize) -> Result<()> {
    let values = g.to_f32();
    match values.iter().position(|&x| x > 0.0 && x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            "g",
            "log-decays <= 0 (a decay exp(g) in (0, 1])",
            format!(
                "g[{}, {}, {}] = {}",
                i / (t * hv).max(1),
                i / hv.max(1) % t.max(1),
                i % hv.max(1),
                values[i]
            ),
        )),
    }
}

fn expect_shape(arg: &'static str, t: &Tensor<'_>, want: &[usize], names: &str) -> Result<()> {
    if t.shape() != want {
        return Err(Error::invalid(
            arg,
            format!("shape {names} = {want:?}"),
            format!("{:?}", t.shape()),
        ));
    }
    Ok(())
}

impl From<[usize; 6]> for Dims {
    /// `[B, T, H, HV, K, V]`, the order of the command line's `--shape`.
    fn from(d: [usize; 6]) -> Dims {
        Dims {
            batch: d[0],
            seq_len: d[1],
            heads: d[2],
            v_heads: d[3],
            dk: d[4],
            dv: d[5],
        }
    }
}

impl Problem {
    /// Builds the sequence and chunk tables for `dims.batch` rows of `dims.seq_len` tokens, or
    /// for the varlen offsets `cu_seqlens` (which need `batch == 1`).
    pub fn new(dims: Dims, cu_seqlens: Option<&[i64]>, opts: &Options) -> Result<Problem> {
        let Dims {
            batch,
            seq_len,
            heads,
            v_heads,
            dk,
            dv,
        } = dims;
        opts.validate()?;
        for (arg, name, d) in [
            ("q", "B (q.shape[0])", batch),
            ("q", "H (q.shape[2])", heads),
            ("q", "K (q.shape[3])", dk),
            ("v", "HV (v.shape[2])", v_heads),
            ("v", "V (v.shape[3])", dv),
        ] {
            if d == 0 {
                return Err(Error::invalid(
                    arg,
                    format!("{name} >= 1"),
                    format!("{name} = 0"),
                ));
            }
        }
        if v_heads % heads != 0 {
            return Err(Error::invalid(
                "v",
                format!("HV (v.shape[2]) a multiple of H (q.shape[2]) = {heads}"),
                format!("HV = {v_heads}"),
            ));
        }
        let tokens = checked_numel("q", &[batch, seq_len])?;
        // Every buffer the forward makes must be addressable: the largest are [tokens, HV, max(K,V,BT)]
        // and the per-chunk states [chunks, HV, K, V] (chunks <= tokens).
        checked_numel("v", &[tokens, v_heads, dk.max(dv).max(opts.chunk_size)])?;
        checked_numel("initial_state", &[tokens.max(batch), v_heads, dk, dv])?;

        let seqs: Vec<(usize, usize)> = match cu_seqlens {
            None => {
                let mut seqs = table("q", batch)?;
                seqs.extend((0..batch).map(|b| (b * seq_len, (b + 1) * seq_len)));
                seqs
            }
            Some(cu) => {
                if batch != 1 {
                    return Err(Error::invalid(
                        "cu_seqlens",
                        "B = 1 with cu_seqlens",
                        format!("B = {batch}"),
                    ));
                }
                check_offsets(cu)?;
                let last = cu[cu.len() - 1];
                if last != seq_len as i64 {
                    return Err(Error::invalid(
                        "cu_seqlens",
                        format!("last offset = T = {seq_len}"),
                        last,
                    ));
                }
                cu.windows(2)
                    .map(|w| (w[0] as usize, w[1] as usize))
                    .collect()
            }
        };
        // With varlen, empty sequences make N exceed the tokens: size the states by N itself.
        checked_numel("initial_state", &[seqs.len(), v_heads, dk, dv])?;
        let bt = opts.chunk_size;
        let chunks = chunk_table(&seqs, tokens, bt)?;
        Ok(Problem {
            dims,
            chunk_size: bt,
            head_map: opts.head_map,
            seqs,
            chunks,
        })
    }

    /// The same problem cut into chunks of `bt` tokens (`bt` at most the problem's own chunk
    /// size, so every buffer sized for it still fits): for a backend that computes in smaller
    /// chunks than the caller's.
    pub(crate) fn rechunked(&self, bt: usize) -> Result<Problem> {
        debug_assert!(bt >= 1 && bt <= self.chunk_size);
        Ok(Problem {
            chunk_size: bt,
            chunks: chunk_table(&self.seqs, self.tokens(), bt)?,
            ..self.clone()
        })
    }

    /// Validates every input tensor against the others and the options, and builds the tables.
    /// Values are not checked but for g, which must hold log-decays (no finite value above 0)
    /// unless `gate_in_kernel` takes it as the raw gate input.
    pub fn from_inputs(x: &Inputs<'_>, opts: &Options) -> Result<Problem> {
        let q = dims_of("q", &x.q, 4)?;
        let (b, t, h, dk) = (q[0], q[1], q[2], q[3]);
        expect_shape("k", &x.k, &q, "[B, T, H, K]")?;
        let v = dims_of("v", &x.v, 4)?;
        if v[0] != b || v[1] != t {
            return Err(Error::invalid(
                "v",
                format!("shape [B, T, HV, V] with B = {b}, T = {t}"),
                format!("{v:?}"),
            ));
        }
        let (hv, dv) = (v[2], v[3]);
        let dims = Dims {
            batch: b,
            seq_len: t,
            heads: h,
            v_heads: hv,
            dk,
            dv,
        };
        let p = Problem::new(dims, x.cu_seqlens.as_deref(), opts)?;
        if x.k.dtype() != x.q.dtype() {
            return Err(Error::invalid(
                "k",
                format!("dtype {} (as q)", x.q.dtype()),
                x.k.dtype(),
            ));
        }
        if x.v.dtype() != x.q.dtype() {
            return Err(Error::invalid(
                "v",
                format!("dtype {} (as q)", x.q.dtype()),
                x.v.dtype(),
            ));
        }
        expect_shape("g", &x.g, &[b, t, hv], "[B, T, HV]")?;
        expect_shape("beta", &x.beta, &[b, t, hv], "[B, T, HV]")?;
        if let Some(s) = &x.initial_state {
            expect_shape(
                "initial_state",
                s,
                &p.state_shape(opts.state_v_first),
                p.state_dims_name(opts.state_v_first),
            )?;
            if s.dtype() != DType::F32 {
                return Err(Error::invalid("initial_state", "dtype f32", s.dtype()));
            }
        }
        for (arg, t) in [("A_log", &x.a_log), ("dt_bias", &x.dt_bias)] {
            // Gate parameters without gate_in_kernel would be silently ignored: refuse them.
            if t.is_some() && !opts.gate_in_kernel {
                return Err(Error::invalid(
                    arg,
                    "none unless gate_in_kernel is on",
                    "a tensor",
                ));
            }
        }
        if opts.gate_in_kernel {
            for (arg, t) in [("A_log", &x.a_log), ("dt_bias", &x.dt_bias)] {
                match t {
                    None => {
                        return Err(Error::invalid(
                            arg,
                            format!("a [HV] = [{hv}] tensor (gate_in_kernel is on)"),
                            "none",
                        ))
                    }
                    Some(t) => expect_shape(arg, t, &[hv], "[HV]")?,
                }
            }
        } else {
            check_log_decays(&x.g, t, hv)?;
        }
        Ok(p)
    }

    /// The sizes.
    pub fn dims(&self) -> Dims {
        self.dims
    }

    /// Batch size B.
    pub fn batch(&self) -> usize {
        self.dims.batch
    }

    /// Tokens per batch row T.
    pub fn seq_len(&self) -> usize {
        self.dims.seq_len
    }

    /// q/k heads H.
    pub fn heads(&self) -> usize {
        self.dims.heads
    }

    /// Value heads HV.
    pub fn v_heads(&self) -> usize {
        self.dims.v_heads
    }

    /// Key dimension K.
    pub fn dk(&self) -> usize {
        self.dims.dk
    }

    /// Value dimension V.
    pub fn dv(&self) -> usize {
        self.dims.dv
    }

    /// Tokens per chunk BT.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// Value head to q/k head map.
    pub fn head_map(&self) -> HeadMap {
        self.head_map
    }

    /// Total tokens, `B * T`.
    pub fn tokens(&self) -> usize {
        self.dims.batch * self.dims.seq_len
    }

    /// Number of sequences N: B, or `len(cu_seqlens) - 1`.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Flat token ranges `[start, end)` of the sequences.
    pub fn seqs(&self) -> &[(usize, usize)] {
        &self.seqs
    }

    /// Floating-point operations of the chunked forward, counting the block products as the
    /// chunked algorithm computes them (dense, masked halves included; a multiply-add is 2), per
    /// value head and chunk of c tokens, with K = dk and V = dv:
    ///
    /// ```text
    /// A_strict = beta K K^T                      2 c^2 K
    /// A_inv    = (I + A_strict)^-1               c^3 / 3   (unit lower-triangular inverse)
    /// w        = A_inv (beta exp(gamma) K)       2 c^2 K
    /// u        = A_inv (beta V)                  2 c^2 V
    /// v_new    = u - w h                         2 c K V
    /// h       <- exp(gamma_c) h + K^T v_new      2 c K V
    /// o        = Q h + (Q K^T, masked) v_new     2 c K V + 2 c^2 K + 2 c^2 V
    /// total      6 c^2 K + 4 c^2 V + 6 c K V + c^3 / 3
    /// ```
    ///
    /// Elementwise work (gates, cumulative sums, l2norm, scales) is linear in c and left out.
    /// The benchmarks' GFLOP/s divide this by the time.
    ///
    /// ```
    /// use deltanet::{Dims, Options, Problem};
    /// let dims = Dims { batch: 1, seq_len: 4096, heads: 16, v_heads: 32, dk: 128, dv: 128 };
    /// let p = Problem::new(dims, None, &Options::default())?;
    /// // 64 chunks of 64 tokens, 32 value heads: 2.38e10.
    /// assert!((p.prefill_flops() - 2.3801e10).abs() < 1e7);
    /// # Ok::<(), deltanet::Error>(())
    /// ```
    pub fn prefill_flops(&self) -> f64 {
        self.prefill_flops_at(self.chunk_size)
    }

    /// [`Problem::prefill_flops`] of the same tokens cut into chunks of `bt` tokens (a backend
    /// may compute in smaller chunks than `chunk_size`: see `Options::chunk_size`).
    ///
    /// ```
    /// use deltanet::{Dims, Options, Problem};
    /// let dims = Dims { batch: 1, seq_len: 4096, heads: 16, v_heads: 32, dk: 128, dv: 128 };
    /// let p = Problem::new(dims, None, &Options::default())?;
    /// assert_eq!(p.prefill_flops_at(64), p.prefill_flops());
    /// // Chunks of 32: the chunk's own products shrink, the state's stay.
    /// assert!((p.prefill_flops_at(32) - 1.8298e10).abs() < 1e7);
    /// # Ok::<(), deltanet::Error>(())
    /// ```
    pub fn prefill_flops_at(&self, bt: usize) -> f64 {
        let (k, v) = (self.dk() as f64, self.dv() as f64);
        let chunk = |c: f64| 6.0 * c * c * k + 4.0 * c * c * v + 6.0 * c * k * v + c * c * c / 3.0;
        let bt = bt.max(1);
        let per_head: f64 = self
            .seqs
            .iter()
            .map(|&(s, e)| {
                let len = e - s;
                (len / bt) as f64 * chunk(bt as f64) + chunk((len % bt) as f64)
            })
            .sum();
        per_head * self.v_heads() as f64
    }

    /// All chunks, sequence by sequence.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The chunks of sequence `n`, as a range of indices into [`Problem::chunks`].
    pub fn seq_chunks(&self, n: usize) -> std::ops::Range<usize> {
        let lo = self.chunks.partition_point(|c| c.seq < n);
        let hi = self.chunks.partition_point(|c| c.seq <= n);
        lo..hi
    }

    /// The q/k head read by value head `j`.
    pub fn qk_head(&self, j: usize) -> usize {
        match self.head_map {
            HeadMap::Grouped => j / (self.dims.v_heads / self.dims.heads),
            HeadMap::Tiled => j % self.dims.heads,
        }
    }

    /// The shape of initial and final states.
    pub fn state_shape(&self, v_first: bool) -> [usize; 4] {
        if v_first {
            [
                self.num_seqs(),
                self.dims.v_heads,
                self.dims.dv,
                self.dims.dk,
            ]
        } else {
            [
                self.num_seqs(),
                self.dims.v_heads,
                self.dims.dk,
                self.dims.dv,
            ]
        }
    }

    fn state_dims_name(&self, v_first: bool) -> &'static str {
        if v_first {
            "[N, HV, V, K]"
        } else {
            "[N, HV, K, V]"
        }
    }

    /// Elements of one K x V state.
    pub fn state_len(&self) -> usize {
        self.dims.dk * self.dims.dv
    }

    /// Checks that a flat f32 buffer given to a stage has the length its layout implies.
    pub(crate) fn check(&self, arg: &'static str, got: usize, per_token_head: usize) -> Result<()> {
        check_len(arg, got, self.tokens() * self.dims.v_heads * per_token_head)
    }

    /// Checks that q and k hold `[tokens, H, K]` values each.
    pub(crate) fn check_qk(&self, q: &[f32], k: &[f32]) -> Result<()> {
        let n = self.tokens() * self.dims.heads * self.dims.dk;
        check_len("q", q.len(), n)?;
        check_len("k", k.len(), n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A problem cut again into smaller chunks has the chunk table it would have been built
    /// with: chunks never cross sequences, empty sequences have none, last chunks are partial.
    #[test]
    fn rechunked_equals_a_problem_built_with_that_chunk_size() {
        let dims = Dims::from([1, 300, 2, 4, 16, 8]);
        let cu = [0i64, 0, 70, 70, 199, 300];
        let at = |bt| {
            let opts = Options {
                chunk_size: bt,
                ..Options::default()
            };
            Problem::new(dims, Some(&cu), &opts).unwrap()
        };
        let p64 = at(64);
        for bt in [64, 32, 16] {
            let p = p64.rechunked(bt).unwrap();
            assert_eq!(p, at(bt));
            assert!(p.chunks().iter().all(|c| c.len <= bt));
        }
        assert_ne!(p64.rechunked(32).unwrap().chunks(), p64.chunks());
    }

    /// The operation count at another chunk size is the count of the problem cut so.
    #[test]
    fn prefill_flops_at_counts_the_rechunked_problem() {
        let cu = [0i64, 0, 70, 70, 199, 300];
        let opts = Options::default();
        let p = Problem::new(Dims::from([1, 300, 2, 4, 16, 8]), Some(&cu), &opts).unwrap();
        for bt in [64, 32, 16] {
            let want = p.rechunked(bt).unwrap().prefill_flops();
            assert!(
                (p.prefill_flops_at(bt) - want).abs() <= 1e-12 * want,
                "bt = {bt}"
            );
        }
        assert!(p.prefill_flops_at(32) < p.prefill_flops());
    }
}
