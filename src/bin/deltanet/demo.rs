//! `deltanet demo`: the library's main job on a realistic layer, on the best device present.

use std::process::ExitCode;

use deltanet::reference::rel_l2;
use deltanet::selftest::{forward_tolerance, layer_inputs, Rng};
use deltanet::{
    cpu, forward, recurrent_step, upload_inputs, DType, Device, HostIo, Inputs, Options, Problem,
};

use crate::{device_arg, open_device, CmdResult, Failure};

/// Run one Qwen3-Next-shaped layer and check it.
///
/// Makes a random (seeded) layer input, B=1, T=4096, H=16, HV=32, K=V=128, bf16, with q/k
/// l2norm on; runs the chunked forward on the device (by default a GPU if one can be used, else
/// the CPU), then the token-by-token recurrent path on the same input, and prints the device, the
/// time, tokens/s and the relative error between the two. Exits 1 if they disagree.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// auto (a GPU if one can be used, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = device_arg)]
    device: String,
    /// Seed of the random input.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tokens (T); 4096 is the realistic prefill.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    tokens: u64,
    /// exact (every product to f32 rounding) or fast (bf16 operands where a GPU's fused kernel
    /// reads bf16 inputs, as here).
    #[arg(long, default_value = "exact", value_parser = crate::parse_precision)]
    precision: deltanet::Precision,
}

pub fn main(a: Args) -> CmdResult {
    let device = open_device(&a.device)?;
    let (b, t, h, hv, k, v) = (1, a.tokens as usize, 16, 32, 128, 128);
    println!("device:   {}", device.name());
    println!(
        "layer:    B={b} T={t} H={h} HV={hv} K={k} V={v}, bf16 inputs, q/k l2norm, seed {}, {} precision",
        a.seed,
        format!("{:?}", a.precision).to_lowercase()
    );
    crate::layer_problem("--tokens", [b, t, h, hv, k, v], &Options::default())?;
    let mut rng = Rng::new(a.seed);
    let x = layer_inputs(&mut rng, [b, t, h, hv, k, v], DType::BF16, true)?;
    let opts = Options {
        use_qk_l2norm: true,
        out_dtype: Some(DType::F32),
        precision: a.precision,
        ..Options::default()
    };

    // A short warm-up first, so one-time costs (GPU kernel compilation, thread pools) are not
    // counted as the layer's time.
    let warm = layer_inputs(
        &mut Rng::new(a.seed ^ 1),
        [b, 64.min(t), h, hv, k, v],
        DType::BF16,
        true,
    )?;
    forward(&device, &warm, &opts)?;

    let t0 = std::time::Instant::now();
    let out = forward(&device, &x, &opts)?;
    let chunk_s = t0.elapsed().as_secs_f64();
    println!(
        "chunked:  {:.1} ms, {:.0} tokens/s (host to host, including transfers)",
        chunk_s * 1e3,
        t as f64 / chunk_s
    );
    let dev_ms = match &device {
        Device::Cpu => device_ms(&cpu::Cpu, &x, &opts)?,
        Device::Cuda(d) => device_ms(d.as_ref(), &x, &opts)?,
    };
    println!(
        "          {dev_ms:.1} ms, {:.0} tokens/s on the device (inputs already there)",
        t as f64 / (dev_ms / 1e3)
    );

    let mut state = vec![0f32; b * hv * k * v];
    let xr = Inputs {
        initial_state: None,
        ..x.clone()
    };
    let t1 = std::time::Instant::now();
    let o_rec = recurrent_step(&device, &xr, &mut state, &opts)?;
    let rec_s = t1.elapsed().as_secs_f64();
    println!(
        "recurrent: {:.1} ms, {:.0} tokens/s (token by token, the reference path)",
        rec_s * 1e3,
        t as f64 / rec_s
    );

    let as64 = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let eo = rel_l2(&out.o.to_f32(), &as64(&o_rec.to_f32()));
    let es = match &out.final_state {
        Some(s) => rel_l2(&s.to_f32(), &as64(&state)),
        None => f64::INFINITY,
    };
    let bound = forward_tolerance(&device, DType::BF16);
    println!(
        "rel err:  o {eo:.2e}, final_state {es:.2e} (chunked vs recurrent, bound {bound:.0e})"
    );
    if eo <= bound && es <= bound {
        println!("ok");
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Failure::data(format!(
            "chunked and recurrent results disagree: o {eo:.2e}, final_state {es:.2e} > {bound:.0e}"
        )))
    }
}

/// The chunked forward's time on the device alone (device events on a GPU).
fn device_ms<D: HostIo>(dev: &D, x: &Inputs<'_>, opts: &Options) -> deltanet::Result<f64> {
    let p = Problem::from_inputs(x, opts)?;
    let si = upload_inputs(dev, &p, x, opts)?;
    dev.synchronize()?;
    dev.time_ms(&mut || dev.forward(&p, opts, &si).map(|_| ()))
}
