//! Decode steps over a pool of states, as inference engines keep them.
//!
//! An engine holds the recurrent states of all its sequences in one pool `[P, HV, K, V]` f32
//! (`[P, HV, V, K]` with `state_v_first`). A step takes N sequences of T tokens each (T = 1 for
//! plain decoding, T > 1 to verify speculative draft tokens) and, for each sequence n:
//!
//! - starts from pool row `read[n]` (row n when no indices are given); a negative index marks a
//!   padding slot: nothing is read or written and its outputs are zeros;
//! - advances that state through its T tokens by the gated delta rule (with the same options as
//!   [`crate::forward`]: l2norm of q and k, beta logits, gate in kernel, head map, scale);
//! - writes the final state to row `write[n]` (by default back to `read[n]`, in place; a
//!   negative index writes nothing), and, if asked, the state after every token: to rows
//!   `per_token[n, t]` of the pool and/or into a dense `[N, T, HV, K, V]` tensor, so an engine
//!   can roll back to the last accepted draft token.
//!
//! No pool row written by one sequence may be read or written by another; sequences may share a
//! row they only read (a common prefix forked into several new rows). [`decode_step`] checks all
//! of this and refuses repeated indices with an `Err` naming the argument.
//!
//! On the CPU the step is plain f32 code; on CUDA it is one kernel launch
//! ([`crate::cuda::decode::decode_raw`], which engines call directly with device-resident
//! buffers and indices).

use rayon::prelude::*;

use crate::cpu::{Rows, RowsMut};
use crate::dtype::{DType, Tensor};
use crate::error::{check_len, Error, Result};
use crate::options::Options;
use crate::problem::{Inputs, Problem};
use crate::Device;

/// Pool-row indices on the host, i32 or i64 as engines keep them.
#[derive(Clone, Copy, Debug)]
pub enum Indices<'a> {
    /// 32-bit indices.
    I32(&'a [i32]),
    /// 64-bit indices.
    I64(&'a [i64]),
}

impl Indices<'_> {
    /// How many indices.
    pub fn len(&self) -> usize {
        match self {
            Indices::I32(x) => x.len(),
            Indices::I64(x) => x.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Index `i`, widened.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Indices::I32(x) => i64::from(x[i]),
            Indices::I64(x) => x[i],
        }
    }
}

/// Where a decode step reads and writes states in the pool (see the module documentation).
/// `StateIndices::default()` is the plain batch: sequence n reads and updates row n.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateIndices<'a> {
    /// `state_indices` `[N]`: the row sequence n starts from; negative marks a padding slot.
    /// `None`: row n (the pool then needs at least N rows).
    pub read: Option<Indices<'a>>,
    /// `out_state_indices` `[N]`: the row receiving sequence n's final state; negative writes
    /// none. `None`: the read row (in place).
    pub write: Option<Indices<'a>>,
    /// `token_state_indices` `[N, T]`: the row receiving the state after token t of sequence
    /// n; negative writes none.
    pub per_token: Option<Indices<'a>>,
}

/// What a decode step returns (the pool itself is updated in place).
#[derive(Clone, Debug)]
pub struct DecodeOutput {
    /// `[N, T, HV, V]` in `Options::out_dtype` or q's dtype; zeros for padding slots.
    pub o: Tensor<'static>,
    /// With `token_states`: `[N, T, HV, K, V]` f32 (`[N, T, HV, V, K]` with `state_v_first`),
    /// the state after every token; zeros for padding slots.
    pub token_states: Option<Tensor<'static>>,
}

/// The validated sizes and resolved rows of one step.
struct Plan {
    n: usize,
    t: usize,
    pool_rows: usize,
    /// Per sequence: the row read (negative: padding).
    read: Vec<i64>,
}

fn resolve(
    arg: &'static str,
    idx: &Option<Indices<'_>>,
    len: usize,
    pool_rows: usize,
) -> Result<()> {
    let Some(idx) = idx else { return Ok(()) };
    check_len(arg, idx.len(), len)?;
    for i in 0..len {
        let r = idx.get(i);
        if r >= pool_rows as i64 {
            return Err(Error::invalid(
                arg,
                format!("indices below the pool's {pool_rows} rows (negative for none)"),
                format!("{arg}[{i}] = {r}"),
            ));
        }
    }
    Ok(())
}

/// Checks shapes, indices and the no-sharing rule; returns the plan.
fn plan(x: &Inputs<'_>, pool_len: usize, idx: &StateIndices<'_>, opts: &Options) -> Result<Plan> {
    if x.cu_seqlens.is_some() {
        return Err(Error::invalid(
            "cu_seqlens",
            "none (every sequence of a decode step has T tokens: q is [N, T, H, K])",
            "offsets",
        ));
    }
    if x.initial_state.is_some() {
        return Err(Error::invalid(
            "initial_state",
            "none (the states are the pool's rows)",
            "a tensor",
        ));
    }
    let p = Problem::from_inputs(x, opts)?;
    let (n, t) = (p.batch(), p.seq_len());
    let row_len = p.v_heads() * p.state_len();
    if pool_len == 0 || pool_len % row_len != 0 {
        return Err(Error::invalid(
            "state",
            format!(
                "a pool of P >= 1 rows of HV * K * V = {row_len} f32 ({})",
                if opts.state_v_first {
                    "[P, HV, V, K]"
                } else {
                    "[P, HV, K, V]"
                }
            ),
            format!("{pool_len} elements"),
        ));
    }
    let pool_rows = pool_len / row_len;
    resolve("state_indices", &idx.read, n, pool_rows)?;
    resolve("out_state_indices", &idx.write, n, pool_rows)?;
    resolve("token_state_indices", &idx.per_token, n * t, pool_rows)?;
    let read: Vec<i64> = match &idx.read {
        Some(r) => (0..n).map(|i| r.get(i)).collect(),
        None => {
            if pool_rows < n {
                return Err(Error::invalid(
                    "state",
                    format!("at least N = {n} rows without state_indices"),
                    format!("{pool_rows} rows"),
                ));
            }
            (0..n as i64).collect()
        }
    };
    // Which sequence writes each row: a row written by one sequence must not be written or
    // read by another (their order inside one launch is undefined).
    let mut writer: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    let mut claim = |arg: &'static str, row: i64, seq: usize| -> Result<()> {
        if row < 0 {
            return Ok(());
        }
        match writer.insert(row, seq) {
            Some(other) if other != seq => Err(Error::invalid(
                arg,
                "distinct rows: no row written by two sequences",
                format!("row {row} written by sequences {other} and {seq}"),
            )),
            _ => Ok(()),
        }
    };
    for (seq, &r) in read.iter().enumerate() {
        if r < 0 {
            continue;
        }
        let w = idx.write.map_or(r, |w| w.get(seq));
        claim(
            if idx.write.is_some() {
                "out_state_indices"
            } else {
                "state_indices"
            },
            w,
            seq,
        )?;
        if let Some(pt) = &idx.per_token {
            for k in 0..t {
                claim("token_state_indices", pt.get(seq * t + k), seq)?;
            }
        }
    }
    for (seq, &r) in read.iter().enumerate() {
        if r < 0 {
            continue;
        }
        if let Some(&other) = writer.get(&r) {
            if other != seq {
                return Err(Error::invalid(
                    "state_indices",
                    "no row read by one sequence and written by another",
                    format!("row {r} read by sequence {seq} and written by sequence {other}"),
                ));
            }
        }
    }
    Ok(Plan {
        n,
        t,
        pool_rows,
        read,
    })
}

/// One decode step of N sequences with T tokens each over a pool of states, updated in place
/// (see the module documentation for the indices). `x` holds q, k `[N, T, H, K]`, v
/// `[N, T, HV, V]`, g and beta `[N, T, HV]` (and `A_log`, `dt_bias` with `gate_in_kernel`), no
/// `cu_seqlens` and no `initial_state`; `pool` is `[P, HV, K, V]` f32 (`[P, HV, V, K]` with
/// `state_v_first`). With `token_states`, the state after every token is returned too.
///
/// Bad input (shapes, an index past the pool, a row written by two sequences or read by one and
/// written by another) is an `Err` naming the argument; the pool is untouched then.
///
/// ```
/// use deltanet::decode::{decode_step, Indices, StateIndices};
/// use deltanet::{Device, Inputs, Options, Tensor};
/// let (n, t, h, hv, k, v, pool_rows) = (2, 1, 1, 2, 4, 4, 3);
/// let x = Inputs::new(
///     Tensor::from_f32(vec![0.5; n * t * h * k], vec![n, t, h, k])?,
///     Tensor::from_f32(vec![0.5; n * t * h * k], vec![n, t, h, k])?,
///     Tensor::from_f32(vec![1.0; n * t * hv * v], vec![n, t, hv, v])?,
///     Tensor::from_f32(vec![-0.1; n * t * hv], vec![n, t, hv])?,
///     Tensor::from_f32(vec![0.5; n * t * hv], vec![n, t, hv])?,
/// );
/// let mut pool = vec![0.0f32; pool_rows * hv * k * v];
/// // Sequence 0 lives in row 2; slot 1 is padding.
/// let read = [2i32, -1];
/// let idx = StateIndices { read: Some(Indices::I32(&read)), ..Default::default() };
/// let out = decode_step(&Device::Cpu, &x, &mut pool, &idx, false, &Options::default())?;
/// assert_eq!(out.o.shape(), &[2, 1, 2, 4]);
/// assert!(pool[2 * hv * k * v..].iter().any(|&s| s != 0.0));
/// assert!(out.o.to_f32()[hv * v..].iter().all(|&o| o == 0.0));
/// # Ok::<(), deltanet::Error>(())
/// ```
pub fn decode_step(
    device: &Device,
    x: &Inputs<'_>,
    pool: &mut [f32],
    idx: &StateIndices<'_>,
    token_states: bool,
    opts: &Options,
) -> Result<DecodeOutput> {
    let step = Step::new(x, pool.len(), idx, token_states, opts)?;
    let (p, plan) = (&step.p, &step.plan);
    let (n, t, hv, dk, dv) = (plan.n, plan.t, p.v_heads(), p.dk(), p.dv());
    let out_dtype = opts.out_dtype.unwrap_or(x.q.dtype());
    let state_shape = |v_first: bool| {
        if v_first {
            vec![n, t, hv, dv, dk]
        } else {
            vec![n, t, hv, dk, dv]
        }
    };
    if n * t == 0 {
        return Ok(DecodeOutput {
            o: Tensor::cast_from_f32(&[], vec![n, t, hv, dv], out_dtype)?,
            token_states: token_states
                .then(|| Tensor::from_f32(Vec::new(), state_shape(opts.state_v_first)))
                .transpose()?,
        });
    }
    match device {
        Device::Cpu => {
            let mut o = vec![0f32; n * t * hv * dv];
            let ts = cpu_decode(&step, pool, &mut o)?;
            Ok(DecodeOutput {
                o: Tensor::cast_from_f32(&o, vec![n, t, hv, dv], out_dtype)?,
                token_states: ts
                    .map(|s| Tensor::from_f32(s, state_shape(opts.state_v_first)))
                    .transpose()?,
            })
        }
        Device::Cuda(d) => {
            let mut launch = cuda_host::new(d.clone(), &step, pool)?;
            launch.launch()?;
            let (o, pool_after, ts) = launch.download()?;
            pool.copy_from_slice(&pool_after);
            Ok(DecodeOutput {
                o,
                token_states: ts
                    .map(|s| Tensor::from_f32(s, state_shape(opts.state_v_first)))
                    .transpose()?,
            })
        }
    }
}

/// [`decode_step`] on the CPU into the caller's `o` (`[N, T, HV, V]`, f32 whatever
/// `opts.out_dtype`; every element written, zeros for padding slots), as an engine calls it
/// between tokens. With f32 inputs, the state written in place (K-major) and no per-token rows,
/// the step allocates nothing of the size of its output or the pool, so a caller that keeps `o`
/// pays no page faults for a fresh one each step (16-bit inputs are widened into a buffer of
/// `v`'s size; the other cases take [`decode_step`]'s general path). The per-token states are
/// not written here (ask [`decode_step`] for them); per-token pool rows (`idx.per_token`) are.
/// A pool that starts on a 64-byte boundary (as PyTorch's and ggml's allocators give) steps
/// about 1.1x as fast as one 16 bytes off (`Vec<f32>`'s) on an AVX2 CPU: no vector store then
/// straddles a cache line.
///
/// ```
/// use deltanet::decode::{decode_into, StateIndices};
/// use deltanet::{Inputs, Options, Tensor};
/// let (n, h, hv, k, v) = (2, 1, 2, 8, 8);
/// let wave = |len: usize, a: f32| (0..len).map(|i| (i as f32 * a).sin()).collect::<Vec<f32>>();
/// let x = Inputs::new(
///     Tensor::from_f32(wave(n * h * k, 0.37), vec![n, 1, h, k])?,
///     Tensor::from_f32(wave(n * h * k, 0.53), vec![n, 1, h, k])?,
///     Tensor::from_f32(wave(n * hv * v, 0.71), vec![n, 1, hv, v])?,
///     Tensor::from_f32(vec![-0.1; n * hv], vec![n, 1, hv])?,
///     Tensor::from_f32(vec![0.5; n * hv], vec![n, 1, hv])?,
/// );
/// let opts = Options { use_qk_l2norm: true, ..Options::default() };
/// let mut pool = wave(n * hv * k * v, 0.11);
/// let mut same_pool = pool.clone();
/// // Kept by the engine from step to step.
/// let mut o = vec![0f32; n * hv * v];
/// decode_into(&x, &mut pool, &StateIndices::default(), &opts, &mut o)?;
/// let cpu = deltanet::Device::Cpu;
/// let out = deltanet::decode::decode_step(&cpu, &x, &mut same_pool, &StateIndices::default(), false, &opts)?;
/// assert_eq!(o, out.o.to_f32().into_owned());
/// assert_eq!(pool, same_pool);
/// # Ok::<(), deltanet::Error>(())
/// ```
pub fn decode_into(
    x: &Inputs<'_>,
    pool: &mut [f32],
    idx: &StateIndices<'_>,
    opts: &Options,
    o: &mut [f32],
) -> Result<()> {
    let step = Step::new(x, pool.len(), idx, false, opts)?;
    let (p, plan) = (&step.p, &step.plan);
    check_len("o", o.len(), plan.n * plan.t * p.v_heads() * p.dv())?;
    if plan.n * plan.t == 0 {
        return Ok(());
    }
    cpu_decode(&step, pool, o).map(|_| ())
}

/// Whether [`crate::recurrent_step`] on CUDA runs as one decode launch: no varlen and head
/// dimensions the kernel takes.
pub(crate) fn kernel_takes(x: &Inputs<'_>, p: &Problem) -> bool {
    x.cu_seqlens.is_none() && crate::cuda::decode::check_dims(p.dk(), p.dv()).is_ok()
}

/// One validated step: its problem, the plan of its indices, and the call's arguments.
struct Step<'a> {
    p: Problem,
    plan: Plan,
    x: &'a Inputs<'a>,
    idx: &'a StateIndices<'a>,
    token_states: bool,
    opts: &'a Options,
}

impl<'a> Step<'a> {
    fn new(
        x: &'a Inputs<'a>,
        pool_len: usize,
        idx: &'a StateIndices<'a>,
        token_states: bool,
        opts: &'a Options,
    ) -> Result<Step<'a>> {
        Ok(Step {
            plan: plan(x, pool_len, idx, opts)?,
            p: Problem::from_inputs(x, opts)?,
            x,
            idx,
            token_states,
            opts,
        })
    }
}

/// A pointer the parallel tasks of [`cpu_decode_in_pool`] share.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: the tasks write disjoint elements through it (see its uses) while the buffer outlives
// them.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// The step's inputs after l2norm and gate, f32.
struct Activated<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
}

/// What both in-pool steps start from: how many tiles of V (each a multiple of 16 columns) each
/// (sequence, value head) state is cut into, halving until there are a few tasks per thread, and
/// their width; `o`'s padding slots zeroed (every element of `o` is written).
fn in_pool_tiles(plan: &Plan, hv: usize, dv: usize, o: &mut [f32]) -> (usize, usize) {
    let (n, t) = (plan.n, plan.t);
    debug_assert_eq!(o.len(), n * t * hv * dv);
    for seq in (0..n).filter(|&seq| plan.read[seq] < 0) {
        o[seq * t * hv * dv..][..t * hv * dv].fill(0.0);
    }
    let mut tiles = 1;
    while n * hv * tiles < 4 * rayon::current_num_threads()
        && dv % (2 * tiles) == 0
        && dv / (2 * tiles) >= 16
        && (dv / (2 * tiles)) % 16 == 0
    {
        tiles *= 2;
    }
    (tiles, dv / tiles)
}

/// [`cpu_decode_in_pool`] for V-major states (`state_v_first`, `[.., V, K]`): each task, one
/// (sequence, value head, tile of V rows), steps its rows token by token with
/// [`crate::cpu::v_tile_step`] (one pass over each row a token), reading and writing the pool
/// in its own layout.
fn cpu_decode_in_pool_v_first(
    p: &Problem,
    plan: &Plan,
    idx: &StateIndices<'_>,
    pool: &mut [f32],
    x: Activated<'_>,
    scale: f32,
    o: &mut [f32],
) {
    let Activated { q, k, v, g, beta } = x;
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let (n, t) = (plan.n, plan.t);
    let kv = dk * dv;
    let (tiles, tw) = in_pool_tiles(plan, hv, dv, o);
    let (o_ptr, pool_ptr) = (Shared(o.as_mut_ptr()), Shared(pool.as_mut_ptr()));
    let pool_len = pool.len();
    let tasks = n * hv * tiles;
    let share = crate::cpu::step_share(tasks);
    // Where task `task`'s rows lie in pool row `row`.
    let offset = |task: usize, row: i64| {
        let (j, tile) = (task / tiles % hv, task % tiles);
        let off = (row as usize * hv + j) * kv + tile * tw * dk;
        debug_assert!(off + tw * dk <= pool_len);
        off
    };
    crate::cpu::for_each_task(tasks, true, |task| {
        let (o_ptr, pool_ptr) = (o_ptr, pool_ptr);
        let (seq, j, tile) = (task / (hv * tiles), task / tiles % hv, task % tiles);
        let row = plan.read[seq];
        if row < 0 {
            return;
        }
        let w = idx.write.map_or(row, |w| w.get(seq));
        let at = |row: i64| offset(task, row);
        // The next task's rows, fetched during this one's last token (not past the end of this
        // thread's share: see `cpu_decode_in_pool`). Only an address is formed here.
        let next = (task + 1 < tasks && (task + 1) % share != 0)
            .then(|| plan.read[(task + 1) / (hv * tiles)])
            .filter(|&r| r >= 0)
            .map(|r| pool_ptr.0.wrapping_add(offset(task + 1, r)) as *const f32);
        // SAFETY: as in `cpu_decode_in_pool`: `plan` checked every row against the pool, that no
        // row is written by two sequences and that no row one sequence writes is read by
        // another, so this task's rows (its head's, its tile's: `tw * dk` consecutive values)
        // are touched by no other task while the step runs; the read and write rows differ
        // where both are taken here.
        let mut scratch = Vec::new();
        let (rows, mut src): (&mut [f32], Option<&[f32]>) = unsafe {
            let rows_at =
                |row: i64| std::slice::from_raw_parts_mut(pool_ptr.0.add(at(row)), tw * dk);
            let read = |row: i64| std::slice::from_raw_parts(pool_ptr.0.add(at(row)), tw * dk);
            if w == row {
                (rows_at(row), None)
            } else if w < 0 {
                scratch.extend_from_slice(read(row));
                (&mut scratch[..], None)
            } else {
                (rows_at(w), Some(read(row)))
            }
        };
        let mut o_row = vec![0f32; tw];
        for tok in 0..t {
            let ti = seq * t + tok;
            let tj = ti * hv + j;
            let qk = (ti * nh + p.qk_head(j)) * dk;
            crate::cpu::v_tile_step(&mut crate::cpu::VTile {
                rows: &mut *rows,
                src,
                k: &k[qk..][..dk],
                q: &q[qk..][..dk],
                v: &v[tj * dv + tile * tw..][..tw],
                decay: g[tj].exp(),
                beta: beta[tj],
                scale,
                o: &mut o_row,
                next: next.filter(|_| tok + 1 == t),
            });
            // After the first token the state is read where it was written.
            src = None;
            // SAFETY: element (token, head j, rows of the tile) of `o` belongs to this task
            // alone, and `o` outlives the tasks.
            unsafe {
                std::ptr::copy_nonoverlapping(o_row.as_ptr(), o_ptr.0.add(tj * dv + tile * tw), tw)
            };
        }
    });
}

/// The step on the CPU when only the final states are wanted, K-major: each task, one (sequence,
/// value head, V-tile), reads its state where it lies in the pool and writes the new one to the
/// row it goes to, one [`crate::cpu::token_step`] per token. Columns of the state are
/// independent, so tiles of V keep many threads busy without changing any result.
fn cpu_decode_in_pool(
    p: &Problem,
    plan: &Plan,
    idx: &StateIndices<'_>,
    pool: &mut [f32],
    x: Activated<'_>,
    scale: f32,
    o: &mut [f32],
) {
    let Activated { q, k, v, g, beta } = x;
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let (n, t) = (plan.n, plan.t);
    let kv = dk * dv;
    let (tiles, tw) = in_pool_tiles(plan, hv, dv, o);
    let (o_ptr, pool_ptr) = (Shared(o.as_mut_ptr()), Shared(pool.as_mut_ptr()));
    let pool_len = pool.len();
    // Each next state fetched during the step before it, where the states do not stay in the
    // last-level cache from one step to the next (there it saves a third of the step; where
    // they stay, it costs a tenth: NOTES-CPU.md).
    let fetch = 4 * n * hv * kv > crate::cpu::last_level_cache() / 2;
    // With one token a step, tasks go in runs of consecutive ones (about eight runs per thread,
    // at most 16 tasks a run), each run stepped software-pipelined (`token_steps`: each state's
    // update beside the next one's sums); with more, one task at a time, its tokens in turn.
    // Not with the AVX-512 step where the states (over a few MiB) fit in about one last-level
    // cache: there each task of a run alone, its two passes back to back and the next task's
    // state fetched during them (`token_step` with `next`), measured faster on an AVX-512 host
    // (32 MiB L3; N=16, 32 MiB of states: 1.10-1.44 -> 0.74-0.88 ms at 2 threads, 2.13-2.34 ->
    // 1.31-1.51 at 1; N=64 and N=1 slower so), and slower with the AVX2 step on a Zen 3 host
    // (N=16 at 2 threads: 2.36 -> 2.69 ms, medians of eight interleaved rounds); runs of one
    // task there cost 3 % more than runs of several (each run's vectors): NOTES-CPU.md.
    let tasks = n * hv * tiles;
    let states = 4 * n * hv * kv;
    let fits_cache = crate::cpu::use_avx512()
        && states > 8 << 20
        && 2 * states <= 3 * crate::cpu::last_level_cache();
    let per_run = if t == 1 {
        (tasks / (8 * rayon::current_num_threads())).clamp(1, 16)
    } else {
        1
    };
    // A step of a loop called back to back: shared by the calling thread and the polling
    // helpers (`for_each_task`), whatever its size.
    let runs = tasks.div_ceil(per_run);
    let share = crate::cpu::step_share(runs);
    crate::cpu::for_each_task(runs, true, |run| {
        let (o_ptr, pool_ptr) = (o_ptr, pool_ptr);
        let ids: Vec<usize> = (run * per_run..tasks.min((run + 1) * per_run))
            .filter(|&task| plan.read[task / (hv * tiles)] >= 0)
            .collect();
        let Some(&last) = ids.last() else {
            return;
        };
        let mut scratch: Vec<Vec<f32>> = vec![Vec::new(); ids.len()];
        // The task's rows: columns c0..c0 + tw of each of its head's K rows, `dv` apart.
        // SAFETY: `plan` checked that every row index lies inside the pool, that no row is
        // written by two sequences and that no row one sequence writes is read by another; so
        // the columns a task reads and writes (its head's, its tile's) are touched by no other
        // task while the step runs. `state` is its write row (a scratch copy when the step writes
        // no state); `src` its read row where that differs.
        let mut rows: Vec<(RowsMut<'_>, Option<Rows<'_>>)> = ids
            .iter()
            .zip(scratch.iter_mut())
            .map(|(&task, scratch)| unsafe {
                let (seq, j, tile) = (task / (hv * tiles), task / tiles % hv, task % tiles);
                let row = plan.read[seq];
                let w = idx.write.map_or(row, |w| w.get(seq));
                let at = |row: i64| {
                    let off = (row as usize * hv + j) * kv + tile * tw;
                    debug_assert!(off + dk.saturating_sub(1) * dv + tw <= pool_len);
                    pool_ptr.0.add(off)
                };
                if w == row {
                    (RowsMut::from_raw(at(row), dv, tw, dk), None)
                } else {
                    let read = Rows::from_raw(at(row), dv, tw, dk);
                    if w < 0 {
                        (0..dk).for_each(|r| scratch.extend_from_slice(read.row(r)));
                        (RowsMut::new(scratch, tw, tw, dk), None)
                    } else {
                        (RowsMut::from_raw(at(w), dv, tw, dk), Some(read))
                    }
                }
            })
            .collect();
        let mut u = vec![0f32; ids.len() * tw];
        let mut o_rows = vec![0f32; ids.len() * tw];
        // The state of task `nt`, fetched towards the cache during the last token of the task
        // before it (the next run's first task after this run's last: usually the next on this
        // thread).
        let prefetch_of = |nt: usize| {
            (nt < tasks)
                .then(|| {
                    let row = plan.read[nt / (hv * tiles)];
                    let off = (row.max(0) as usize * hv + nt / tiles % hv) * kv + nt % tiles * tw;
                    // SAFETY: `plan` checked every read row against the pool; only an address is
                    // formed here (for prefetching), nothing is read through it.
                    (row >= 0).then(|| (unsafe { pool_ptr.0.add(off) } as *const f32, dv))
                })
                .flatten()
        };
        // Not across the end of this thread's share: that state is another thread's, which it
        // writes in its cache, and pulling it here makes its next step's writes wait for this
        // core to give the lines back (N=1 at two threads: 0.064 -> 0.043 ms, NOTES-CPU.md).
        let next = if (run + 1) % share == 0 {
            None
        } else {
            prefetch_of(last + 1)
        };
        let token = |task: usize, tok: usize| {
            let (seq, j, tile) = (task / (hv * tiles), task / tiles % hv, task % tiles);
            let (ti, c0) = (seq * t + tok, tile * tw);
            let tj = ti * hv + j;
            let kh = p.qk_head(j);
            let qk = (ti * nh + kh) * dk;
            (tj, c0, qk, g[tj].exp(), beta[tj])
        };
        // SAFETY (each copy below): element (token, head j, columns of the tile) of `o` belongs
        // to this task alone, and `o` outlives the tasks.
        let put = |tj: usize, c0: usize, o_row: &[f32]| unsafe {
            std::ptr::copy_nonoverlapping(o_row.as_ptr(), o_ptr.0.add(tj * dv + c0), tw);
        };
        if t == 1 {
            let mut tokens: Vec<crate::cpu::Token<'_, '_>> = ids
                .iter()
                .zip(rows)
                .zip(u.chunks_exact_mut(tw).zip(o_rows.chunks_exact_mut(tw)))
                .map(|((&task, (state, src)), (u, o_row))| {
                    let (tj, c0, qk, decay, beta) = token(task, 0);
                    crate::cpu::Token {
                        state,
                        src,
                        k: &k[qk..][..dk],
                        q: &q[qk..][..dk],
                        v: &v[tj * dv + c0..][..tw],
                        decay,
                        beta,
                        scale,
                        u,
                        o: o_row,
                        next: if task == last {
                            next
                        } else if fits_cache {
                            prefetch_of(task + 1)
                        } else {
                            None
                        },
                    }
                })
                .collect();
            if fits_cache {
                tokens.iter_mut().for_each(crate::cpu::token_step);
            } else {
                crate::cpu::token_steps(&mut tokens, fetch);
            }
            drop(tokens);
            for (&task, o_row) in ids.iter().zip(o_rows.chunks_exact(tw)) {
                let (tj, c0, ..) = token(task, 0);
                put(tj, c0, o_row);
            }
        } else {
            // Several tokens: each task's tokens in turn, its state hot between them.
            for (ii, &task) in ids.iter().enumerate() {
                let (state, src) = &mut rows[ii];
                let mut src = *src;
                let (u, o_row) = (&mut u[ii * tw..][..tw], &mut o_rows[ii * tw..][..tw]);
                for tok in 0..t {
                    let (tj, c0, qk, decay, beta) = token(task, tok);
                    crate::cpu::token_step(&mut crate::cpu::Token {
                        state: state.reborrow(),
                        src,
                        k: &k[qk..][..dk],
                        q: &q[qk..][..dk],
                        v: &v[tj * dv + c0..][..tw],
                        decay,
                        beta,
                        scale,
                        u,
                        o: o_row,
                        next: if tok + 1 == t && task == last {
                            next
                        } else {
                            None
                        },
                    });
                    // After the first token the state is read where it was written.
                    src = None;
                    put(tj, c0, o_row);
                }
            }
        }
    });
}

/// The step on the CPU in f32: per (sequence, value head) the recurrence token by token, then
/// the pool writes. Writes `o_out` and returns the dense per-token states (when asked).
fn cpu_decode(step: &Step<'_>, pool: &mut [f32], o_out: &mut [f32]) -> Result<Option<Vec<f32>>> {
    let (p, plan, x, idx, opts) = (&step.p, &step.plan, step.x, step.idx, step.opts);
    let token_states = step.token_states;
    let (nh, hv, dk, dv) = (p.heads(), p.v_heads(), p.dk(), p.dv());
    let (n, t) = (plan.n, plan.t);
    let kv = dk * dv;
    let v_first = opts.state_v_first;
    let mut q = x.q.to_f32().into_owned();
    let mut k = x.k.to_f32().into_owned();
    if opts.use_qk_l2norm && dk > 0 {
        // A few rows per step: normalised here, where a parallel pass would cost more in
        // waking threads than it saves.
        q.chunks_exact_mut(dk).for_each(crate::cpu::l2norm_row);
        k.chunks_exact_mut(dk).for_each(crate::cpu::l2norm_row);
    }
    let v = x.v.to_f32();
    let a_log = x.a_log.as_ref().map(|a| a.to_f32().into_owned());
    let dt_bias = x.dt_bias.as_ref().map(|a| a.to_f32().into_owned());
    let (g, beta) = crate::cpu::gate(
        p,
        opts,
        &x.g.to_f32(),
        &x.beta.to_f32(),
        a_log.as_deref(),
        dt_bias.as_deref(),
    )?;
    let scale = opts.scale_for(dk);
    let keep_all = token_states || idx.per_token.is_some();
    if !keep_all {
        let x = Activated {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        if v_first {
            cpu_decode_in_pool_v_first(p, plan, idx, pool, x, scale, o_out);
        } else {
            cpu_decode_in_pool(p, plan, idx, pool, x, scale, o_out);
        }
        return Ok(None);
    }
    let pool_ro: &[f32] = pool;

    // Per task (n, j): o [T, V], and the state after every token (or only the last), in the
    // pool's layout.
    let results: Vec<Option<(Vec<f32>, Vec<f32>)>> = (0..n * hv)
        .into_par_iter()
        .map(|task| {
            let (seq, j) = (task / hv, task % hv);
            let row = plan.read[seq];
            if row < 0 {
                return None;
            }
            let kh = p.qk_head(j);
            let src = &pool_ro[(row as usize * hv + j) * kv..][..kv];
            let mut s = src.to_vec();
            let mut o = vec![0f32; t * dv];
            let mut states = Vec::with_capacity(if keep_all { t * kv } else { kv });
            let mut u = vec![0f32; dv];
            for tok in 0..t {
                let ti = seq * t + tok;
                let tj = ti * hv + j;
                let (k, q) = (
                    &k[(ti * nh + kh) * dk..][..dk],
                    &q[(ti * nh + kh) * dk..][..dk],
                );
                let (v, o) = (&v[tj * dv..][..dv], &mut o[tok * dv..][..dv]);
                let (decay, beta) = (g[tj].exp(), beta[tj]);
                // The same token steps as the in-pool paths, so both give the same bits.
                if v_first {
                    crate::cpu::v_tile_step(&mut crate::cpu::VTile {
                        rows: &mut s,
                        src: None,
                        k,
                        q,
                        v,
                        decay,
                        beta,
                        scale,
                        o,
                        next: None,
                    });
                } else {
                    crate::cpu::token_step(&mut crate::cpu::Token {
                        state: RowsMut::new(&mut s, dv, dv, dk),
                        src: None,
                        k,
                        q,
                        v,
                        decay,
                        beta,
                        scale,
                        u: &mut u,
                        o,
                        next: None,
                    });
                }
                if keep_all || tok + 1 == t {
                    states.extend_from_slice(&s);
                }
            }
            Some((o, states))
        })
        .collect();

    let o = o_out;
    o.fill(0.0);
    let mut dense = token_states.then(|| vec![0f32; n * t * hv * kv]);
    for (task, res) in results.into_iter().enumerate() {
        let Some((ot, states)) = res else { continue };
        let (seq, j) = (task / hv, task % hv);
        for tok in 0..t {
            let tj = (seq * t + tok) * hv + j;
            o[tj * dv..][..dv].copy_from_slice(&ot[tok * dv..][..dv]);
        }
        let after = |tok: usize| -> &[f32] {
            if keep_all {
                &states[tok * kv..][..kv]
            } else {
                &states[..kv]
            }
        };
        if let Some(d) = dense.as_mut() {
            for tok in 0..t {
                let tj = (seq * t + tok) * hv + j;
                d[tj * kv..][..kv].copy_from_slice(after(tok));
            }
        }
        // Per-token rows first, then the final row: the order the kernel writes in.
        if let Some(pt) = &idx.per_token {
            for tok in 0..t {
                let w = pt.get(seq * t + tok);
                if w >= 0 {
                    pool[(w as usize * hv + j) * kv..][..kv].copy_from_slice(after(tok));
                }
            }
        }
        let w = idx.write.map_or(plan.read[seq], |w| w.get(seq));
        if w >= 0 {
            pool[(w as usize * hv + j) * kv..][..kv].copy_from_slice(after(t - 1));
        }
    }
    debug_assert!(plan.pool_rows * hv * kv == pool.len());
    Ok(dense)
}

/// A decode step whose inputs, pool and outputs live on a GPU, made once from host data and
/// launched any number of times (each launch advances the pool again): what benchmarks and
/// tests time, and the CUDA half of [`decode_step`].
pub struct CudaStep {
    dev: std::sync::Arc<crate::cuda::CudaDevice>,
    shape: crate::cuda::decode::DecodeShape,
    opts: Options,
    out_dtype: DType,
    inputs: Vec<cudarc::driver::CudaSlice<u8>>,
    dtypes: Vec<DType>,
    pool: cudarc::driver::CudaSlice<f32>,
    o: cudarc::driver::CudaSlice<u8>,
    token_states: Option<cudarc::driver::CudaSlice<f32>>,
    indices: [Option<cuda_host::DevIdx>; 3],
}

impl std::fmt::Debug for CudaStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaStep {:?} on {}", self.shape, self.dev.name())
    }
}

impl CudaStep {
    /// Validates the step as [`decode_step`] does (indices included) and copies everything to
    /// the GPU. `Err` also when the kernel does not take the head dimensions (see
    /// [`crate::cuda::decode::check_dims`]).
    pub fn new(
        dev: std::sync::Arc<crate::cuda::CudaDevice>,
        x: &Inputs<'_>,
        pool: &[f32],
        idx: &StateIndices<'_>,
        token_states: bool,
        opts: &Options,
    ) -> Result<CudaStep> {
        cuda_host::new(
            dev,
            &Step::new(x, pool.len(), idx, token_states, opts)?,
            pool,
        )
    }

    /// Queues one launch on the device's stream (no waiting, no allocation).
    pub fn launch(&mut self) -> Result<()> {
        let bufs = cuda_host::buffers(self);
        // SAFETY: every buffer is owned by `self`, made on the device's stream with the lengths
        // `bufs` states; the indices were checked on the host against the pool and the
        // no-sharing rule when `self` was made.
        unsafe { crate::cuda::decode::decode_raw(&self.dev, &self.shape, &bufs, &self.opts) }
    }

    /// The sizes of the step.
    pub fn shape(&self) -> crate::cuda::decode::DecodeShape {
        self.shape
    }

    /// Bytes one launch must move at the least: the state rows of non-padding sequences read
    /// and written (the per-token states too), q, k, v, g and beta read, o written.
    pub fn min_bytes(&self, active_sequences: usize) -> u128 {
        let s = self.shape;
        let row = (s.hv * s.dk * s.dv * 4) as u128;
        let active = active_sequences as u128;
        let per_token_rows = self.indices[2].as_ref().map_or(0, |_| s.t as u128)
            + self.token_states.as_ref().map_or(0, |_| s.t as u128);
        let inputs: u128 = self.inputs[..5].iter().map(|b| b.len() as u128).sum();
        (2 + per_token_rows) * active * row + inputs + self.o.len() as u128
    }

    /// Waits for the queued work and copies the results back: o, the pool, the per-token
    /// states (if asked for).
    pub fn download(&self) -> Result<(Tensor<'static>, Vec<f32>, Option<Vec<f32>>)> {
        cuda_host::download(self)
    }
}

/// The CUDA side of [`CudaStep`]: uploads, the kernel's buffer table, downloads.
mod cuda_host {
    use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

    use super::*;
    use crate::cuda::decode::{DecodeBuffers, DecodeShape, RawArray, RawIndices};
    use crate::cuda::{cuda_err, CudaDevice};

    fn up<T: DeviceRepr>(dev: &CudaDevice, data: &[T], what: &str) -> Result<CudaSlice<T>> {
        dev.stream()
            .clone_htod(data)
            .map_err(cuda_err(format!("uploading {what}")))
    }

    fn alloc<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        dev: &CudaDevice,
        len: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        dev.stream()
            .alloc_zeros(len)
            .map_err(cuda_err(format!("allocating {what}")))
    }

    fn ptr<T>(s: &CudaSlice<T>) -> u64 {
        let (p, _sync) = s.device_ptr(s.stream());
        p
    }

    pub(super) enum DevIdx {
        I32(CudaSlice<i32>),
        I64(CudaSlice<i64>),
    }

    fn indices(dev: &CudaDevice, i: &Option<Indices<'_>>) -> Result<Option<DevIdx>> {
        Ok(match i {
            None => None,
            Some(Indices::I32(x)) => Some(DevIdx::I32(up(dev, x, "indices")?)),
            Some(Indices::I64(x)) => Some(DevIdx::I64(up(dev, x, "indices")?)),
        })
    }

    fn raw_idx(i: &Option<DevIdx>) -> Option<RawIndices> {
        i.as_ref().map(|i| match i {
            DevIdx::I32(s) => RawIndices {
                ptr: ptr(s),
                len: s.len(),
                wide: false,
            },
            DevIdx::I64(s) => RawIndices {
                ptr: ptr(s),
                len: s.len(),
                wide: true,
            },
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        dev: std::sync::Arc<CudaDevice>,
        step: &Step<'_>,
        pool: &[f32],
    ) -> Result<CudaStep> {
        let (p, plan, x, idx, opts) = (&step.p, &step.plan, step.x, step.idx, step.opts);
        let token_states = step.token_states;
        let (n, t, hv, dk, dv) = (plan.n, plan.t, p.v_heads(), p.dk(), p.dv());
        crate::cuda::decode::check_dims(dk, dv)?;
        let d = dev.as_ref();
        let out_dtype = opts.out_dtype.unwrap_or(x.q.dtype());
        // q, k, v, g, beta, then A_log and dt_bias with gate_in_kernel, as bytes.
        let mut tensors = vec![&x.q, &x.k, &x.v, &x.g, &x.beta];
        tensors.extend(x.a_log.iter().chain(x.dt_bias.iter()));
        let inputs = tensors
            .iter()
            .map(|t| up(d, t.as_bytes(), "an input"))
            .collect::<Result<Vec<_>>>()?;
        let dtypes = tensors.iter().map(|t| t.dtype()).collect();
        let o_len = n * t * hv * dv;
        Ok(CudaStep {
            shape: DecodeShape {
                n,
                t,
                h: p.heads(),
                hv,
                dk,
                dv,
                pool: plan.pool_rows,
            },
            opts: opts.clone(),
            out_dtype,
            inputs,
            dtypes,
            pool: up(d, pool, "the state pool")?,
            o: alloc(d, o_len * out_dtype.size(), "o")?,
            token_states: if token_states {
                Some(alloc(d, n * t * hv * dk * dv, "token_states")?)
            } else {
                None
            },
            indices: [
                indices(d, &idx.read)?,
                indices(d, &idx.write)?,
                indices(d, &idx.per_token)?,
            ],
            dev,
        })
    }

    pub(super) fn buffers(s: &CudaStep) -> DecodeBuffers {
        let raw = |i: usize| RawArray {
            ptr: ptr(&s.inputs[i]),
            len: s.inputs[i].len() / s.dtypes[i].size(),
            dtype: s.dtypes[i],
        };
        let gate = s.inputs.len() == 7;
        DecodeBuffers {
            q: raw(0),
            k: raw(1),
            v: raw(2),
            g: raw(3),
            beta: raw(4),
            a_log: gate.then(|| raw(5)),
            dt_bias: gate.then(|| raw(6)),
            pool: RawArray {
                ptr: ptr(&s.pool),
                len: s.pool.len(),
                dtype: DType::F32,
            },
            o: RawArray {
                ptr: ptr(&s.o),
                len: s.o.len() / s.out_dtype.size(),
                dtype: s.out_dtype,
            },
            read: raw_idx(&s.indices[0]),
            write: raw_idx(&s.indices[1]),
            per_token: raw_idx(&s.indices[2]),
            token_states: s.token_states.as_ref().map(|b| RawArray {
                ptr: ptr(b),
                len: b.len(),
                dtype: DType::F32,
            }),
        }
    }

    pub(super) fn download(s: &CudaStep) -> Result<(Tensor<'static>, Vec<f32>, Option<Vec<f32>>)> {
        let st = s.dev.stream();
        let o = st.clone_dtoh(&s.o).map_err(cuda_err("downloading o"))?;
        let pool = st
            .clone_dtoh(&s.pool)
            .map_err(cuda_err("downloading the state pool"))?;
        let ts = s
            .token_states
            .as_ref()
            .map(|b| {
                st.clone_dtoh(b)
                    .map_err(cuda_err("downloading token_states"))
            })
            .transpose()?;
        let sh = s.shape;
        let o = Tensor::from_bytes(s.out_dtype, &o, vec![sh.n, sh.t, sh.hv, sh.dv])?.into_owned();
        Ok((o, pool, ts))
    }
}
