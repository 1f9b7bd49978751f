//! `deltanet bench --work decode`: one decode step of N sequences with T tokens each, over a
//! state pool, timed with the inputs, the pool and the outputs already on the device; beside it
//! a device-to-device copy of the same number of bytes, the bandwidth ceiling the step is
//! measured against.

use deltanet::decode::{decode_into, CudaStep, Indices, StateIndices};
use deltanet::selftest::{layer_inputs, Rng};
use deltanet::{DType, Device, HostIo, Options};
use indicatif::ProgressBar;

use crate::Failure;

/// One timed piece of work: its name, per-run times, tokens and bytes moved per run.
pub struct Timed {
    pub work: &'static str,
    pub times_ms: Vec<f64>,
    pub tokens: Option<usize>,
    pub bytes: Option<u128>,
}

/// Launches timed together for the back-to-back figure (the launch gaps of a captured graph).
const BACK_TO_BACK: usize = 20;

/// What to time: `shape` is B (the sequences N), T (unused: `tokens` is the step's T), H, HV,
/// K, V; `pool` rows (default N, read in place) with random distinct indices when given.
pub struct DecodeBench {
    pub shape: [usize; 6],
    pub dtype: DType,
    pub tokens: usize,
    pub pool: Option<usize>,
    pub warmup: u64,
    pub repeats: u64,
    pub state_v_first: bool,
}

pub fn run(device: &Device, a: &DecodeBench, bar: &ProgressBar) -> Result<Vec<Timed>, Failure> {
    let [n, _, h, hv, k, v] = a.shape;
    let t = a.tokens;
    let rows = a.pool.unwrap_or(n);
    if rows < n {
        return Err(Failure::usage(format!(
            "--pool: at least N = {n} rows (one per sequence), got {rows}"
        )));
    }
    let opts = Options {
        use_qk_l2norm: true,
        state_v_first: a.state_v_first,
        ..Options::default()
    };
    // Pool rows are named by i32 indices in the bench.
    if rows > i32::MAX as usize {
        return Err(Failure::usage(format!(
            "--pool: at most {} rows (i32 indices), got {rows}",
            i32::MAX
        )));
    }
    crate::layer_problem("--shape", [n, t, h, hv, k, v], &opts)?;
    let row_len = hv * k * v;
    // The pool and its aligned copy, in f32.
    let pool_bytes = rows
        .checked_mul(row_len)
        .and_then(|e| e.checked_mul(8))
        .ok_or_else(|| Failure::data(format!("--pool: {rows} rows of {row_len} f32 overflow")))?;
    if let Some(avail) = deltanet::io::available_memory() {
        if pool_bytes as u128 > avail {
            return Err(Failure::data(format!(
                "--pool: too large to allocate: {rows} rows need about {:.1} GiB, {:.1} GiB available",
                pool_bytes as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            )));
        }
    }
    let mut rng = Rng::new(0);
    let x = layer_inputs(&mut rng, [n, t, h, hv, k, v], a.dtype, true)?;
    let pool: Vec<f32> = rng.normal(rows * row_len, 0.1);
    let read: Option<Vec<i32>> = a.pool.map(|_| {
        let mut r: Vec<i32> = (0..rows as i32).collect();
        for i in (1..r.len()).rev() {
            r.swap(i, rng.int(0, i));
        }
        r.truncate(n);
        r
    });
    let idx = StateIndices {
        read: read.as_deref().map(Indices::I32),
        ..Default::default()
    };
    bar.set_message("decode");
    let mut out = Vec::new();
    match device {
        Device::Cpu => {
            // The engine's call: `o` kept from step to step, as llama.cpp's harness keeps its
            // buffers (`decode_into`; `decode_step` allocates its output every step).
            // The pool on a 64-byte boundary, as engines allocate theirs (PyTorch's CPU tensors,
            // ggml's buffers); `Vec<f32>` alone gives 16 bytes, where the AVX2 step's vector
            // stores straddle cache lines and it takes about 1.1x as long (NOTES-CPU.md).
            let len = pool.len();
            let mut buf = vec![0f32; len + 16];
            let skip = buf.as_ptr().align_offset(64).min(16);
            buf[skip..skip + len].copy_from_slice(&pool);
            let pool = &mut buf[skip..skip + len];
            let mut o = vec![0f32; n * t * hv * v];
            let mut step = || decode_into(&x, pool, &idx, &opts, &mut o);
            for _ in 0..a.warmup {
                step()?;
                bar.inc(1);
            }
            let mut times = Vec::new();
            for _ in 0..a.repeats {
                times.push(deltanet::cpu::Cpu.time_ms(&mut step)?);
                bar.inc(1);
            }
            let bytes = 2 * (n * row_len * 4) as u128;
            out.push(Timed {
                work: "decode",
                times_ms: times,
                tokens: Some(n * t),
                bytes: Some(bytes),
            });
        }
        Device::Cuda(d) => {
            let dev = d.as_ref();
            let mut step = CudaStep::new(d.clone(), &x, &pool, &idx, false, &opts)?;
            let bytes = step.min_bytes(n);
            for _ in 0..a.warmup {
                step.launch()?;
                bar.inc(1);
            }
            dev.synchronize()?;
            let mut single = Vec::new();
            let mut b2b = Vec::new();
            for _ in 0..a.repeats {
                single.push(dev.time_ms(&mut || step.launch())?);
                let ms = dev.time_ms(&mut || (0..BACK_TO_BACK).try_for_each(|_| step.launch()))?;
                b2b.push(ms / BACK_TO_BACK as f64);
                bar.inc(1);
            }
            out.push(Timed {
                work: "decode",
                times_ms: single,
                tokens: Some(n * t),
                bytes: Some(bytes),
            });
            out.push(Timed {
                work: "decode b2b",
                times_ms: b2b,
                tokens: Some(n * t),
                bytes: Some(bytes),
            });
            // The ceiling: a device-to-device copy of the state bytes one step reads (and
            // writes).
            let src = dev.upload(&pool[..n * row_len])?;
            let mut dst = dev.upload(&pool[..n * row_len])?;
            let stream = src.stream().clone();
            let mut copy = || {
                stream
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(|e| deltanet::Error::Cuda {
                        context: "copying for the bandwidth ceiling".into(),
                        message: e.to_string(),
                    })
            };
            copy()?;
            dev.synchronize()?;
            let mut times = Vec::new();
            for _ in 0..a.repeats {
                times.push(dev.time_ms(&mut copy)?);
            }
            out.push(Timed {
                work: "d2d copy",
                times_ms: times,
                tokens: None,
                bytes: Some(2 * (n * row_len * 4) as u128),
            });
        }
    }
    Ok(out)
}
