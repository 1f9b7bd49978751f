//! Context parallelism: one packed batch (B = 1, varlen allowed) whose tokens are split among
//! ranks, each rank computing the outputs of its own tokens.
//!
//! The split is exact because a piece of a sequence acts on the state affinely: with `S_in` the
//! state entering the piece,
//!
//! ```text
//! S_out = M S_in + S_local,   M = prod_t e^{g_t} (I - beta_t k_t k_t^T)   (K x K),
//! ```
//!
//! where `S_local` is the piece's final state from a zero state, and `M` is the piece's final
//! state from the identity with `v = 0` (the recurrence itself computes the product, K x K
//! columns instead of V). So each rank runs, at once with the others: (1) the summary
//! `(M, S_local)` of its last piece when that sequence goes on past the rank; (2) an exchange of
//! the summaries (one per rank at most); (3) for its first piece when it continues a sequence,
//! the incoming state, folding the earlier ranks' summaries over the sequence's initial state;
//! (4) its forward with those initial states. Outputs stay where their tokens are; the final
//! state of a sequence lands on the rank holding its end.
//!
//! The exchange is the [`Exchange`] trait with two implementations: [`InProcess`] runs the ranks
//! as threads of one process over any device (how the stitching is tested without several GPUs),
//! and `cuda::nccl::Nccl` (cargo feature `nccl`) all-gathers the summaries between GPUs through
//! NCCL (`forward_ranks_nccl`).

use std::ops::Range;
use std::sync::{Barrier, Mutex};

use crate::dtype::{DType, Tensor};
use crate::error::{Error, Result};
use crate::host::transpose_states;
use crate::options::Options;
use crate::problem::Inputs;
use crate::{forward, Device};

/// How ranks trade their summaries: every rank gives one buffer and receives every rank's, in
/// rank order (an all-gather).
pub trait Exchange: Sync {
    /// Ranks taking part.
    fn ranks(&self) -> usize;
    /// Gives `mine` as rank `rank`'s buffer and returns all ranks' buffers.
    fn all_gather(&self, rank: usize, mine: Vec<f32>) -> Result<Vec<Vec<f32>>>;
}

/// The ranks as threads of this process: an all-gather through shared memory and a barrier.
pub struct InProcess {
    slots: Mutex<Vec<Vec<f32>>>,
    barrier: Barrier,
}

impl InProcess {
    /// An exchange among `ranks` threads.
    pub fn new(ranks: usize) -> InProcess {
        InProcess {
            slots: Mutex::new(vec![Vec::new(); ranks]),
            barrier: Barrier::new(ranks),
        }
    }
}

impl Exchange for InProcess {
    fn ranks(&self) -> usize {
        self.slots.lock().map_or(0, |s| s.len())
    }

    fn all_gather(&self, rank: usize, mine: Vec<f32>) -> Result<Vec<Vec<f32>>> {
        let poisoned = |_| Error::Internal("a rank panicked during the exchange".into());
        let mut slots = self.slots.lock().map_err(poisoned)?;
        let ranks = slots.len();
        *slots.get_mut(rank).ok_or_else(|| {
            Error::invalid("rank", format!("below the exchange's {ranks} ranks"), rank)
        })? = mine;
        drop(slots);
        self.barrier.wait();
        let all = self.slots.lock().map_err(poisoned)?.clone();
        // Nobody writes a slot again before everyone has read them all.
        self.barrier.wait();
        Ok(all)
    }
}

/// What one rank computes.
#[derive(Clone, Debug)]
pub struct RankOutput {
    /// The rank's tokens, in the packed batch.
    pub tokens: Range<usize>,
    /// `[1, tokens, HV, V]`, as [`crate::forward`] writes it.
    pub o: Tensor<'static>,
    /// The sequences whose final states this rank holds (those ending in its tokens, and the
    /// empty ones placed at them), in order.
    pub final_seqs: Vec<usize>,
    /// Their final states, `[final_seqs, HV, K, V]` (or `[.., V, K]`), with `output_final_state`.
    pub final_state: Option<Tensor<'static>>,
    /// Seconds this rank spent in the exchange, waiting for the other ranks included.
    pub exchange_s: f64,
}

/// One sequence's share of a rank: `seq` over the rank-local tokens `local`.
#[derive(Clone, Debug)]
struct Piece {
    seq: usize,
    local: Range<usize>,
    /// The sequence started before the rank.
    continues: bool,
    /// The sequence goes on after the rank.
    goes_on: bool,
}

/// The pieces of the rank holding `tokens` of a batch with sequence offsets `cu` (an empty
/// sequence belongs to the rank its offset falls in, or the last rank when it is at the end).
fn pieces(cu: &[i64], tokens: &Range<usize>, last_rank: bool) -> Vec<Piece> {
    let mut out = Vec::new();
    for (seq, w) in cu.windows(2).enumerate() {
        let (s0, s1) = (w[0] as usize, w[1] as usize);
        let mine = if s0 == s1 {
            tokens.contains(&s0) || (last_rank && s0 == tokens.end)
        } else {
            s0 < tokens.end && s1 > tokens.start
        };
        if mine {
            let (a, b) = (s0.max(tokens.start), s1.min(tokens.end));
            out.push(Piece {
                seq,
                local: a - tokens.start..b - tokens.start,
                continues: s0 < tokens.start,
                goes_on: s1 > tokens.end,
            });
        }
    }
    out
}

/// Rows `rows` of the leading (token) axis of a `[1, T, ..]` tensor, borrowed.
fn token_rows<'a>(t: &'a Tensor<'_>, rows: Range<usize>) -> Result<Tensor<'a>> {
    let shape = t.shape();
    let per: usize = shape[2..].iter().product::<usize>() * t.dtype().size();
    let bytes = &t.as_bytes()[rows.start * per..rows.end * per];
    let mut s = shape.to_vec();
    s[1] = rows.len();
    Tensor::from_bytes(t.dtype(), bytes, s)
}

/// A K-major state from the caller's layout.
fn k_major(x: &[f32], dk: usize, dv: usize, v_first: bool) -> Vec<f32> {
    if v_first {
        transpose_states(x, dk, dv, false)
    } else {
        x.to_vec()
    }
}

/// The caller's layout from a K-major state.
fn caller_layout(x: &[f32], dk: usize, dv: usize, v_first: bool) -> Vec<f32> {
    if v_first {
        transpose_states(x, dk, dv, true)
    } else {
        x.to_vec()
    }
}

/// `M S + S_local` per value head (K-major, float64 sums).
fn apply(m: &[f32], s: &[f32], s_local: &[f32], hv: usize, dk: usize, dv: usize) -> Vec<f32> {
    let mut out = vec![0f32; hv * dk * dv];
    for j in 0..hv {
        let (m, s) = (&m[j * dk * dk..][..dk * dk], &s[j * dk * dv..][..dk * dv]);
        for r in 0..dk {
            for c in 0..dv {
                let mut acc = s_local[(j * dk + r) * dv + c] as f64;
                for l in 0..dk {
                    acc += m[r * dk + l] as f64 * s[l * dv + c] as f64;
                }
                out[(j * dk + r) * dv + c] = acc as f32;
            }
        }
    }
    out
}

/// Rank `rank` of `ex.ranks()`: `shard` holds its tokens (`[1, tokens.len(), ..]`; its
/// `initial_state`, when given, is the whole batch's `[N, HV, K, V]`, and its `cu_seqlens` is
/// ignored), `cu_seqlens` the whole batch's sequence offsets (`[0, T]` for one sequence).
/// Every rank calls this at once; each reaches the exchange even when its own part fails, so
/// that an error on one rank is an error there, not a hang elsewhere.
pub fn forward_rank(
    device: &Device,
    shard: &Inputs<'_>,
    cu_seqlens: &[i64],
    tokens: Range<usize>,
    opts: &Options,
    rank: usize,
    ex: &dyn Exchange,
) -> Result<RankOutput> {
    if rank >= ex.ranks() {
        return Err(Error::invalid(
            "rank",
            format!("below the exchange's {} ranks", ex.ranks()),
            rank,
        ));
    }
    let last_rank = rank + 1 == ex.ranks();
    let prepared = prepare(device, shard, cu_seqlens, &tokens, opts, last_rank);
    let mine = prepared.as_ref().map_or(Vec::new(), |p| p.summary.clone());
    let start = std::time::Instant::now();
    let all = ex.all_gather(rank, mine)?;
    let exchange_s = start.elapsed().as_secs_f64();
    let p = prepared?;
    let (hv, dk, dv) = (p.hv, p.dk, p.dv);
    let (kv, v_first) = (dk * dv, opts.state_v_first);
    let state_shape = |n: usize| {
        if v_first {
            vec![n, hv, dv, dk]
        } else {
            vec![n, hv, dk, dv]
        }
    };

    // (3) The state entering each piece.
    let mut states = Vec::with_capacity(p.pieces.len() * hv * kv);
    for piece in &p.pieces {
        let mut s = p.h0_k_major(piece.seq);
        if piece.continues {
            for theirs in &all[..rank] {
                if theirs
                    .first()
                    .is_some_and(|q| q.to_bits() as usize == piece.seq)
                {
                    let (m, s_local) = theirs[1..].split_at(hv * dk * dk);
                    s = apply(m, &s, s_local, hv, dk, dv);
                }
            }
        }
        states.extend(caller_layout(&s, dk, dv, v_first));
    }
    let ends: Vec<usize> = (0..p.pieces.len())
        .filter(|&i| !p.pieces[i].goes_on)
        .collect();
    let final_seqs = ends.iter().map(|&i| p.pieces[i].seq).collect();
    let keep = |f: &[f32]| -> Result<Tensor<'static>> {
        let mut out = Vec::with_capacity(ends.len() * hv * kv);
        for &i in &ends {
            out.extend_from_slice(&f[i * hv * kv..][..hv * kv]);
        }
        Tensor::from_f32(out, state_shape(ends.len()))
    };

    // (4) The rank's forward over its pieces (none to run without tokens: its pieces, if any,
    // are empty sequences, whose final state is their initial one).
    if tokens.is_empty() {
        let out_dtype = opts.out_dtype.unwrap_or(shard.v.dtype());
        return Ok(RankOutput {
            o: Tensor::cast_from_f32(&[], vec![1, 0, hv, dv], out_dtype)?,
            final_state: if opts.output_final_state {
                Some(keep(&states)?)
            } else {
                None
            },
            final_seqs,
            tokens,
            exchange_s,
        });
    }
    let mut cu = vec![0i64];
    cu.extend(p.pieces.iter().map(|piece| piece.local.end as i64));
    let x = Inputs {
        initial_state: Some(Tensor::from_f32(states, state_shape(p.pieces.len()))?),
        cu_seqlens: Some(cu),
        ..shard.clone()
    };
    let out = forward(device, &x, opts)?;
    Ok(RankOutput {
        o: out.o,
        final_state: out.final_state.map(|f| keep(&f.to_f32())).transpose()?,
        final_seqs,
        tokens,
        exchange_s,
    })
}

/// A rank's part before the exchange: its pieces and the summary it gives.
struct Prepared {
    pieces: Vec<Piece>,
    summary: Vec<f32>,
    h0: Option<Vec<f32>>,
    hv: usize,
    dk: usize,
    dv: usize,
    v_first: bool,
}

impl Prepared {
    fn h0_k_major(&self, seq: usize) -> Vec<f32> {
        let n = self.hv * self.dk * self.dv;
        match &self.h0 {
            Some(h) => k_major(&h[seq * n..][..n], self.dk, self.dv, self.v_first),
            None => vec![0f32; n],
        }
    }
}

/// Checks the shard and computes (1): the summary `[seq, M, S_local]` of the rank's last piece
/// when its sequence goes on past the rank (empty when none does).
fn prepare(
    device: &Device,
    shard: &Inputs<'_>,
    cu_seqlens: &[i64],
    tokens: &Range<usize>,
    opts: &Options,
    last_rank: bool,
) -> Result<Prepared> {
    if opts.output_chunk_states {
        return Err(Error::invalid(
            "output_chunk_states",
            "false with context parallelism",
            true,
        ));
    }
    let shape = shard.v.shape().to_vec();
    if shape.len() != 4 || shape[0] != 1 || shape[1] != tokens.len() {
        return Err(Error::invalid(
            "v",
            format!("[1, {}, HV, V] (the rank's tokens)", tokens.len()),
            format!("{shape:?}"),
        ));
    }
    check_offsets(cu_seqlens, tokens)?;
    // The shard as a batch of its own (shapes, dtypes, gate parameters against the options);
    // its initial state is the whole batch's, checked against the offsets below.
    let local = Inputs {
        initial_state: None,
        cu_seqlens: None,
        ..shard.clone()
    };
    let lp = crate::problem::Problem::from_inputs(&local, opts)?;
    let (hv, dv, dk) = (lp.v_heads(), lp.dv(), lp.dk());
    if let Some(h0) = &shard.initial_state {
        let seqs = cu_seqlens.len() - 1;
        let want = if opts.state_v_first {
            [seqs, hv, dv, dk]
        } else {
            [seqs, hv, dk, dv]
        };
        if h0.shape() != want {
            return Err(Error::invalid(
                "initial_state",
                format!("{want:?} (the whole batch's, one per sequence of cu_seqlens)"),
                format!("{:?}", h0.shape()),
            ));
        }
        if h0.dtype() != DType::F32 {
            return Err(Error::invalid("initial_state", "dtype f32", h0.dtype()));
        }
    }
    let kv = dk * dv;
    let pieces = pieces(cu_seqlens, tokens, last_rank);
    let mut summary = Vec::new();
    if let Some(p) = pieces.last().filter(|p| p.goes_on) {
        let summary_opts = Options {
            output_final_state: true,
            output_chunk_states: false,
            state_v_first: false,
            out_dtype: Some(DType::F32),
            ..opts.clone()
        };
        // The piece's final state from `h` (`[HV, K, width]`) with values `v`.
        let run = |v: Tensor<'_>, h: Vec<f32>, width: usize| -> Result<Vec<f32>> {
            let x = Inputs {
                q: token_rows(&shard.q, p.local.clone())?,
                k: token_rows(&shard.k, p.local.clone())?,
                v,
                g: token_rows(&shard.g, p.local.clone())?,
                beta: token_rows(&shard.beta, p.local.clone())?,
                initial_state: Some(Tensor::from_f32(h, vec![1, hv, dk, width])?),
                cu_seqlens: None,
                a_log: shard.a_log.clone(),
                dt_bias: shard.dt_bias.clone(),
            };
            forward(device, &x, &summary_opts)?
                .final_state
                .map(|f| f.to_f32().into_owned())
                .ok_or_else(|| Error::Internal("the summary forward gave no state".into()))
        };
        let len = p.local.len();
        let mut identity = vec![0f32; hv * dk * dk];
        for j in 0..hv {
            for r in 0..dk {
                identity[(j * dk + r) * dk + r] = 1.0;
            }
        }
        let no_v = Tensor::cast_from_f32(
            &vec![0f32; len * hv * dk],
            vec![1, len, hv, dk],
            shard.v.dtype(),
        )?;
        let m = run(no_v, identity, dk)?;
        let s_local = run(
            token_rows(&shard.v, p.local.clone())?,
            vec![0f32; hv * kv],
            dv,
        )?;
        summary.push(f32::from_bits(u32::try_from(p.seq).map_err(|_| {
            Error::invalid("cu_seqlens", "at most 2^32 sequences", p.seq)
        })?));
        summary.extend_from_slice(&m);
        summary.extend_from_slice(&s_local);
    }
    Ok(Prepared {
        pieces,
        summary,
        h0: shard
            .initial_state
            .as_ref()
            .map(|t| t.to_f32().into_owned()),
        hv,
        dk,
        dv,
        v_first: opts.state_v_first,
    })
}

/// The whole batch's offsets: from 0, never falling, reaching past the rank's tokens.
fn check_offsets(cu: &[i64], tokens: &Range<usize>) -> Result<()> {
    crate::problem::check_offsets(cu)?;
    let total = cu[cu.len() - 1];
    if tokens.start > tokens.end || u64::try_from(total).map_or(true, |t| (tokens.end as u64) > t) {
        return Err(Error::invalid(
            "tokens",
            format!("a range within the batch's {total} tokens"),
            format!("{tokens:?}"),
        ));
    }
    Ok(())
}

/// Every rank of a packed batch `x` (B = 1) in this process, one thread each, rank r holding
/// tokens `cuts[r]..cuts[r + 1]` (`cuts` rises from 0 to T; equal cuts make empty ranks).
pub fn forward_ranks(
    device: &Device,
    x: &Inputs<'_>,
    opts: &Options,
    cuts: &[usize],
) -> Result<Vec<RankOutput>> {
    forward_ranks_on(std::slice::from_ref(device), x, opts, cuts)
}

/// [`forward_ranks`] with rank r on `devices[r % devices.len()]`: one process driving several
/// GPUs (a thread per rank), the summaries exchanged through host memory.
pub fn forward_ranks_on(
    devices: &[Device],
    x: &Inputs<'_>,
    opts: &Options,
    cuts: &[usize],
) -> Result<Vec<RankOutput>> {
    forward_ranks_with(
        devices,
        x,
        opts,
        cuts,
        &InProcess::new(cuts.len().saturating_sub(1)),
    )
}

/// [`forward_ranks_on`] with the summaries exchanged through NCCL ([`crate::cuda::nccl::Nccl`]):
/// one process, a thread per rank, rank r on GPU `devices[r]` (as many distinct GPUs as ranks).
/// The exchange goes through the GPUs as it would between processes, so this is how the NCCL
/// path is run and tested on one machine.
#[cfg(feature = "nccl")]
pub fn forward_ranks_nccl(
    devices: &[Device],
    x: &Inputs<'_>,
    opts: &Options,
    cuts: &[usize],
) -> Result<Vec<RankOutput>> {
    let ranks = cuts.len().saturating_sub(1);
    if devices.len() != ranks {
        return Err(Error::invalid(
            "devices",
            format!("one GPU per rank ({ranks})"),
            devices.len().to_string(),
        ));
    }
    let ex = crate::cuda::nccl::Nccl::new(devices)?;
    forward_ranks_with(devices, x, opts, cuts, &ex)
}

/// [`forward_ranks_on`] over any [`Exchange`] of `cuts.len() - 1` ranks.
pub fn forward_ranks_with(
    devices: &[Device],
    x: &Inputs<'_>,
    opts: &Options,
    cuts: &[usize],
    ex: &dyn Exchange,
) -> Result<Vec<RankOutput>> {
    if devices.is_empty() {
        return Err(Error::invalid("devices", "at least one device", "none"));
    }
    let shape = x.q.shape();
    let t = if shape.len() == 4 && shape[0] == 1 {
        shape[1]
    } else {
        return Err(Error::invalid(
            "q",
            "[1, T, H, K] (one packed batch)",
            format!("{shape:?}"),
        ));
    };
    if cuts.len() < 2
        || cuts[0] != 0
        || cuts[cuts.len() - 1] != t
        || cuts.windows(2).any(|w| w[0] > w[1])
    {
        return Err(Error::invalid(
            "cuts",
            format!("rising offsets from 0 to {t}"),
            format!("{cuts:?}"),
        ));
    }
    // Validates everything else once, as the plain forward would.
    crate::problem::Problem::from_inputs(x, opts)?;
    let cu = x.cu_seqlens.clone().unwrap_or(vec![0, t as i64]);
    let ranks = cuts.len() - 1;
    if ex.ranks() != ranks {
        return Err(Error::invalid(
            "exchange",
            format!("{ranks} ranks (the cuts)"),
            ex.ranks().to_string(),
        ));
    }
    let shards: Vec<Inputs<'_>> = (0..ranks)
        .map(|r| {
            let rows = cuts[r]..cuts[r + 1];
            Ok(Inputs {
                q: token_rows(&x.q, rows.clone())?,
                k: token_rows(&x.k, rows.clone())?,
                v: token_rows(&x.v, rows.clone())?,
                g: token_rows(&x.g, rows.clone())?,
                beta: token_rows(&x.beta, rows)?,
                initial_state: x.initial_state.clone(),
                cu_seqlens: None,
                a_log: x.a_log.clone(),
                dt_bias: x.dt_bias.clone(),
            })
        })
        .collect::<Result<_>>()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                let (shard, cu) = (&shards[r], &cu);
                let device = &devices[r % devices.len()];
                s.spawn(move || forward_rank(device, shard, cu, cuts[r]..cuts[r + 1], opts, r, ex))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| Error::Internal("a rank's thread panicked".into()))?
            })
            .collect()
    })
}
