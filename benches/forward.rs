//! Criterion benches of the CPU forward and decode step at Qwen3-Next's layer shape.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deltanet::{forward, recurrent_step, Device, Inputs, Options, Problem, Tensor};

/// Deterministic pseudo-random values in [-0.5, 0.5) (no RNG dependency needed for a bench).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

fn inputs(b: usize, t: usize, h: usize, hv: usize, k: usize, v: usize) -> Inputs<'static> {
    let ten = |x: Vec<f32>, s: Vec<usize>| Tensor::from_f32(x, s).unwrap();
    let g = values(b * t * hv, 4)
        .iter()
        .map(|x| -0.05 - 0.1 * x.abs())
        .collect();
    let beta = values(b * t * hv, 5).iter().map(|x| 0.5 + x).collect();
    Inputs::new(
        ten(values(b * t * h * k, 1), vec![b, t, h, k]),
        ten(values(b * t * h * k, 2), vec![b, t, h, k]),
        ten(values(b * t * hv * v, 3), vec![b, t, hv, v]),
        ten(g, vec![b, t, hv]),
        ten(beta, vec![b, t, hv]),
    )
}

fn prefill(c: &mut Criterion) {
    let (b, t, h, hv, k, v) = (1, 4096, 16, 32, 128, 128);
    let x = inputs(b, t, h, hv, k, v);
    let opts = Options {
        use_qk_l2norm: true,
        ..Options::default()
    };
    let mut group = c.benchmark_group("prefill_f32_B1_T4096_H16_HV32_K128_V128");
    group.sample_size(10);
    group.throughput(Throughput::Elements((b * t) as u64));
    group.bench_function("cpu_chunked", |bench| {
        bench.iter(|| forward(&Device::Cpu, &x, &opts).unwrap())
    });
    group.finish();
    // The same forward with the chunked algorithm's FLOPs as criterion's elements: its
    // "elem/s" are FLOP/s (`Problem::prefill_flops_at` the chunk size the CPU computes in),
    // beside the tokens/s above.
    let p = Problem::from_inputs(&x, &opts).unwrap();
    let flops = p.prefill_flops_at(deltanet::cpu::computed_chunk_size(&p, &opts));
    let mut group = c.benchmark_group("prefill_f32_B1_T4096_H16_HV32_K128_V128_flops");
    group.sample_size(10);
    group.throughput(Throughput::Elements(flops as u64));
    group.bench_function("cpu_chunked", |bench| {
        bench.iter(|| forward(&Device::Cpu, &x, &opts).unwrap())
    });
    group.finish();
}

fn decode(c: &mut Criterion) {
    let (n, h, hv, k, v) = (64, 16, 32, 128, 128);
    let x = inputs(n, 1, h, hv, k, v);
    let opts = Options {
        use_qk_l2norm: true,
        ..Options::default()
    };
    let mut state = vec![0f32; n * hv * k * v];
    let mut group = c.benchmark_group("decode_f32_N64_HV32_K128_V128");
    group.sample_size(20);
    group.throughput(Throughput::Elements(n as u64));
    group.bench_function("cpu_recurrent", |bench| {
        bench.iter(|| recurrent_step(&Device::Cpu, &x, &mut state, &opts).unwrap())
    });
    group.finish();
}

criterion_group!(benches, prefill, decode);
criterion_main!(benches);
