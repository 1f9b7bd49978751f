//! The CPU device, [`Cpu`]: a [`Backend`] and a [`HostIo`] whose memory is the host's.
//!
//! `stages/` holds one file per stage (the tested reference path; each stage is public here as
//! a function on flat f32 buffers), `fused.rs` the forward that [`crate::forward`] runs, and
//! `blocks.rs` the per-chunk pieces both share. Everything is f32, parallel over chunks or
//! (sequence, head) with rayon; each task's arithmetic is fixed by the problem alone, so results
//! are bitwise identical for any thread count.

mod blocks;
mod fused;
mod helpers;
// Compiled only where the AVX-512 intrinsics are stable (see build.rs), whatever the crate's
// rust-version.
#[cfg(all(target_arch = "x86_64", deltanet_avx512))]
#[clippy::msrv = "1.89"]
pub(crate) mod kernel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod kernel_avx2;
mod stages;

pub(crate) use blocks::{
    axpy, causal_dots, chunk_blocks, dot, gather_rows, gather_scalars, gemm, gemm_causal,
    scatter_rows, transpose, with_scaled_rows, with_scratch, Decays,
};
pub use fused::{computed_chunk_size, forward_into, fused_forward, FusedOut};
pub use stages::chunk_output::chunk_output;
pub use stages::chunk_state::chunk_state;
pub use stages::cumsum::chunk_local_cumsum;
pub use stages::gate::gate;
pub use stages::kkt::chunk_scaled_dot_kkt;
pub use stages::l2norm::l2norm;
pub(crate) use stages::l2norm::l2norm_row;
pub use stages::recurrent::recurrent;
pub(crate) use stages::recurrent::{
    token_step, token_steps, v_tile_step, Rows, RowsMut, Token, VTile,
};
pub use stages::solve_tril::solve_tril;
pub use stages::wy::recompute_w_u;

use rayon::prelude::*;

use crate::backend::{Backend, ChunkStates, Gamma, StageInputs, Wy};
use crate::error::Result;
use crate::forward::{activate, ForwardOut};
use crate::host::HostIo;
use crate::options::Options;
use crate::problem::{Inputs, Problem};

/// The instruction sets the CPU kernels are written for, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust (the compiler's own vectorisation; `mul_add` where the target has FMA).
    Portable,
    /// x86-64 AVX2 with FMA.
    Avx2,
    /// x86-64 AVX-512F (where the compiler has its intrinsics).
    Avx512,
}

impl Isa {
    /// `portable`, `avx2` or `avx512`: the names `DELTANET_CPU_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The instruction set the CPU kernels take in this process: the widest this build and CPU
/// have, lowered to `DELTANET_CPU_ISA` (`avx2` or `portable`) where that is set (read once; a
/// value naming a wider set than the CPU has, or an unknown one, lowers nothing).
///
/// Lowering it runs the kernels a CPU without the wider set would run (every path stays
/// exact; the AVX2 and AVX-512 ones give the same bits where their docs say so), so that one
/// machine can test and time them all.
///
/// ```
/// let isa = deltanet::cpu::instruction_set();
/// assert!(isa >= deltanet::cpu::Isa::Portable);
/// println!("the CPU kernels take {}", isa.name());
/// ```
pub fn instruction_set() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = match std::env::var("DELTANET_CPU_ISA").as_deref() {
            Ok("portable") => Isa::Portable,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        detected_isa().min(cap)
    })
}

/// The widest instruction set this build and CPU have.
fn detected_isa() -> Isa {
    #[cfg(all(target_arch = "x86_64", deltanet_avx512))]
    if kernel::have_avx512() {
        return Isa::Avx512;
    }
    #[cfg(target_arch = "x86_64")]
    if kernel_avx2::have_avx2_fma() {
        return Isa::Avx2;
    }
    Isa::Portable
}

/// Whether the AVX-512 kernels are taken ([`instruction_set`]).
#[inline]
pub(crate) fn use_avx512() -> bool {
    instruction_set() == Isa::Avx512
}

/// Whether the AVX2 + FMA kernels (or wider) may be taken ([`instruction_set`]).
#[inline]
pub(crate) fn use_avx2() -> bool {
    instruction_set() >= Isa::Avx2
}

/// Runs `f(task)` for every task in `0..n`: on rayon's pool, or for a `step` (one of a loop's
/// calls back to back, as a model's decode steps) on the calling thread and the helper threads
/// that poll between steps ([`helpers`]; the calling thread alone with a pool of one thread).
/// Handing a step to the pool costs the wake-ups of sleeping threads each time, and the calling
/// thread waits idle: a one-thread N=1 step went from 0.21-0.25 ms to 0.13-0.14 ms on the
/// calling thread; at two threads an N=16 step (32 MiB of states) from 0.98-1.04 ms on the pool
/// to 0.84-0.89 ms with a helper, N=64 from 5.6-5.8 to 5.3-5.5 (NOTES-CPU.md). Each task's
/// arithmetic does not depend on where it runs.
pub(crate) fn for_each_task(n: usize, step: bool, f: impl Fn(usize) + Sync + Send) {
    let threads = rayon::current_num_threads();
    let outside = rayon::current_thread_index().is_none();
    if n < 2 || (step && threads <= 1 && outside) {
        (0..n).for_each(f)
    } else if step && outside {
        // The calling thread takes the first share and `threads - 1` helpers the others, nobody
        // sleeping inside the step; where another caller holds the helpers, rayon.
        if !helpers::Helpers::get(threads - 1).run(n, &f) {
            (0..n).into_par_iter().for_each(f)
        }
    } else {
        (0..n).into_par_iter().for_each(f)
    }
}

/// How many consecutive tasks of `n` each thread takes in [`for_each_task`]'s `step` form (the
/// last share may be shorter): work that reaches ahead to the next task (prefetching its data)
/// stops at the end of a share, whose next task another thread runs.
pub(crate) fn step_share(n: usize) -> usize {
    n.div_ceil(rayon::current_num_threads().max(1)).max(1)
}

/// The size of the last-level data cache in bytes, as Linux's sysfs gives it for cpu0 (the
/// highest level that is not an instruction cache); 32 MiB where it cannot be read.
/// `DELTANET_CPU_LLC` (`32M`, `32768K` or bytes; read once) sets it instead: a virtual machine
/// may report its host's whole cache, of which it gets only a share, and a machine can so time
/// the choices a smaller cache makes.
pub(crate) fn last_level_cache() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        if let Some(b) = std::env::var("DELTANET_CPU_LLC")
            .ok()
            .and_then(|s| cache_size(&s))
        {
            return b;
        }
        let read = |i: usize, what: &str| {
            std::fs::read_to_string(format!(
                "/sys/devices/system/cpu/cpu0/cache/index{i}/{what}"
            ))
            .ok()
            .map(|s| s.trim().to_string())
        };
        (0..16)
            .filter_map(|i| {
                let level: u32 = read(i, "level")?.parse().ok()?;
                (read(i, "type")? != "Instruction")
                    .then(|| Some((level, cache_size(&read(i, "size")?)?)))
                    .flatten()
            })
            .max_by_key(|&(level, _)| level)
            .map_or(32 << 20, |(_, bytes)| bytes)
    })
}

/// A cache size as sysfs writes it (`32768K`, `1M`, or bytes).
fn cache_size(text: &str) -> Option<usize> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale: usize = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    digits.parse::<usize>().ok()?.checked_mul(scale)
}

/// The CPU device. Buffers are `Vec<f32>`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Buf = Vec<f32>;

    fn l2norm(&self, x: &Vec<f32>, rows: usize, dim: usize) -> Result<Vec<f32>> {
        l2norm(x, rows, dim)
    }
    fn gate(
        &self,
        p: &Problem,
        opts: &Options,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        a_log: Option<&Vec<f32>>,
        dt_bias: Option<&Vec<f32>>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        gate(
            p,
            opts,
            g,
            beta,
            a_log.map(|x| &x[..]),
            dt_bias.map(|x| &x[..]),
        )
    }
    fn chunk_local_cumsum(&self, p: &Problem, g: &Vec<f32>) -> Result<Gamma<Vec<f32>>> {
        chunk_local_cumsum(p, g)
    }
    fn chunk_scaled_dot_kkt(
        &self,
        p: &Problem,
        k: &Vec<f32>,
        beta: &Vec<f32>,
        gamma: &Gamma<Vec<f32>>,
    ) -> Result<Vec<f32>> {
        chunk_scaled_dot_kkt(p, k, beta, gamma)
    }
    fn solve_tril(&self, p: &Problem, a_strict: &Vec<f32>) -> Result<Vec<f32>> {
        solve_tril(p, a_strict)
    }
    fn recompute_w_u(
        &self,
        p: &Problem,
        k: &Vec<f32>,
        v: &Vec<f32>,
        beta: &Vec<f32>,
        gamma: &Gamma<Vec<f32>>,
        a_inv: &Vec<f32>,
    ) -> Result<Wy<Vec<f32>>> {
        recompute_w_u(p, k, v, beta, gamma, a_inv)
    }
    fn chunk_state(
        &self,
        p: &Problem,
        k: &Vec<f32>,
        wy: &Wy<Vec<f32>>,
        gamma: &Gamma<Vec<f32>>,
        h0: Option<&Vec<f32>>,
    ) -> Result<ChunkStates<Vec<f32>>> {
        chunk_state(p, k, wy, gamma, h0.map(|x| &x[..]))
    }
    fn chunk_output(
        &self,
        p: &Problem,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v_new: &Vec<f32>,
        h: &Vec<f32>,
        gamma: &Gamma<Vec<f32>>,
        scale: f32,
    ) -> Result<Vec<f32>> {
        chunk_output(p, q, k, v_new, h, gamma, scale)
    }
    /// The fused forward on f32 buffers: the stages' computation up to rounding (`v_new` formed
    /// without `w` and `u`, see `fused.rs`), and what [`crate::forward`] runs (reading host
    /// tensors in place, see [`HostIo::forward_host`]).
    fn forward(
        &self,
        p: &Problem,
        opts: &Options,
        x: &StageInputs<Vec<f32>>,
    ) -> Result<ForwardOut<Vec<f32>>> {
        fused::fused_staged(p, opts, x)
    }
    fn recurrent(
        &self,
        p: &Problem,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        state: &mut Vec<f32>,
        v_first: bool,
        scale: f32,
    ) -> Result<Vec<f32>> {
        recurrent(p, q, k, v, g, beta, state, v_first, scale)
    }
}

/// The CPU's memory is the host's: uploads and downloads are copies (or hand-overs), and the
/// host-facing forward and recurrent step work on the caller's memory in place.
impl HostIo for Cpu {
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }
    fn download_owned(&self, buf: Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let t = std::time::Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
    /// The fused forward reading `x` in place, in its own dtype: no copy of the inputs.
    fn forward_host(
        &self,
        p: &Problem,
        x: &Inputs<'_>,
        opts: &Options,
    ) -> Result<ForwardOut<Vec<f32>>> {
        fused::fused_host(p, x, opts)
    }
    /// The state is advanced where it lies: no copy of what can be gigabytes.
    fn recurrent_host(
        &self,
        p: &Problem,
        opts: &Options,
        x: &StageInputs<Vec<f32>>,
        state: &mut [f32],
    ) -> Result<Vec<f32>> {
        let a = activate(self, p, opts, x)?;
        recurrent(
            p,
            a.q(),
            a.k(),
            &x.v,
            &a.g,
            &a.beta,
            state,
            opts.state_v_first,
            opts.scale_for(p.dk()),
        )
    }
}

/// Checks a vector `e^x` (16 lanes at a time) against float64: within 2 ulp, inf, zero and NaN
/// where `f32::exp` gives them.
#[cfg(test)]
pub(crate) fn check_exp(exp_lanes: impl Fn(&[f32; 16]) -> [f32; 16]) {
    let mut x = -110.0f32;
    while x < 92.0 {
        let xs: [f32; 16] = std::array::from_fn(|i| x + i as f32 * 1.37e-3);
        for (&xi, &e) in xs.iter().zip(&exp_lanes(&xs)) {
            let want = (xi as f64).exp();
            if want > f32::MAX as f64 {
                assert_eq!(e, f32::INFINITY, "e^{xi}");
            } else if want < f32::MIN_POSITIVE as f64 {
                assert!(
                    (e as f64 - want).abs() <= 2.0 * 1.4e-45,
                    "e^{xi}: {e} vs {want}"
                );
            } else {
                let ulp = (want as f32).to_bits().abs_diff(e.to_bits());
                assert!(ulp <= 2, "e^{xi}: {e} vs {want} ({ulp} ulp)");
            }
        }
        x += 0.0219;
    }
    let special = exp_lanes(&[
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1.0,
        -1.0,
        88.0,
        89.0,
        -103.0,
        -150.0,
        1e30,
        -1e30,
        0.5,
        -0.5,
        2.0,
    ]);
    assert!(special[0].is_nan());
    assert_eq!(special[1], f32::INFINITY);
    assert_eq!(special[2], 0.0);
    assert_eq!(special[3], 1.0);
    assert_eq!(special[4], 1.0);
    assert_eq!(special[8], f32::INFINITY);
    assert_eq!(special[10], 0.0);
    assert_eq!(special[11], f32::INFINITY);
    assert_eq!(special[12], 0.0);
}

#[cfg(test)]
mod cache_tests {
    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(super::cache_size("32768K"), Some(32 << 20));
        assert_eq!(super::cache_size("1M"), Some(1 << 20));
        assert_eq!(super::cache_size("2G"), Some(2 << 30));
        assert_eq!(super::cache_size("4096"), Some(4096));
        assert_eq!(super::cache_size("12 K"), None);
        assert_eq!(super::cache_size("K"), None);
        assert_eq!(super::cache_size("99999999999999999999G"), None);
        assert!(super::last_level_cache() > 0);
    }
}

#[cfg(test)]
mod task_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every task runs exactly once, on the pool or on the calling thread (a one-thread pool,
    /// where a step runs inline, included).
    #[test]
    fn for_each_task_runs_every_task_once() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for n in [0, 1, 2, 7, 64] {
            for step in [false, true] {
                let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                super::for_each_task(n, step, |t| {
                    runs[t].fetch_add(1, Ordering::Relaxed);
                });
                one.install(|| {
                    super::for_each_task(n, step, |t| {
                        runs[t].fetch_add(1, Ordering::Relaxed);
                    })
                });
                assert!(
                    runs.iter().all(|r| r.load(Ordering::Relaxed) == 2),
                    "n {n} step {step}"
                );
            }
        }
    }

    /// Callers on several threads at once (the helpers serve one; the others go to rayon), many
    /// steps back to back: every task of every step runs exactly once.
    #[test]
    fn steps_from_many_callers() {
        std::thread::scope(|s| {
            for caller in 0..4 {
                s.spawn(move || {
                    for step in 0..500 {
                        let n = 1 + (caller * 7 + step) % 40;
                        let runs: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        super::for_each_task(n, true, |t| {
                            runs[t].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    /// A task that panics, wherever it runs, panics the caller once every thread has left the
    /// step; the next step runs normally.
    #[test]
    fn a_panicking_task_reaches_the_caller() {
        for bad in [0, 15] {
            let r = std::panic::catch_unwind(|| {
                super::for_each_task(16, true, |t| assert_ne!(t, bad, "task {t}"));
            });
            assert!(r.is_err(), "task {bad}");
            let runs: Vec<AtomicUsize> = (0..16).map(|_| AtomicUsize::new(0)).collect();
            super::for_each_task(16, true, |t| {
                runs[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        }
    }
}
