//! The glue between host tensors and a device: uploads, downloads, timing, and the shaping of
//! results into the layouts and dtypes the options ask for.

use crate::backend::{Backend, StageInputs};
use crate::dtype::{DType, Tensor};
use crate::error::Result;
use crate::options::Options;
use crate::problem::{Inputs, Problem};
use crate::{cpu, Output};

/// Transposes each K x V state to V x K (`to_v_first`) or back.
pub(crate) fn transpose_states(s: &[f32], dk: usize, dv: usize, to_v_first: bool) -> Vec<f32> {
    let (rows, cols) = if to_v_first { (dk, dv) } else { (dv, dk) };
    let mut out = vec![0f32; s.len()];
    for (src, dst) in s.chunks_exact(dk * dv).zip(out.chunks_exact_mut(dk * dv)) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// A device that can take host data: the glue between host tensors and a [`Backend`].
pub trait HostIo: Backend {
    /// Copies host f32 data to a new device buffer.
    fn upload(&self, data: &[f32]) -> Result<Self::Buf>;
    /// Copies a host tensor of any dtype to a new f32 device buffer. By default widened on the
    /// host; a device may send fewer bytes and widen there.
    fn upload_tensor(&self, t: &Tensor<'_>) -> Result<Self::Buf> {
        self.upload(&t.to_f32())
    }
    /// Copies a device buffer to the host (waiting for the work that writes it).
    fn download(&self, buf: &Self::Buf) -> Result<Vec<f32>>;
    /// Waits until all work queued on the device is done.
    fn synchronize(&self) -> Result<()>;
    /// Milliseconds the device spends on the work `f` queues (device events on a GPU, wall
    /// clock on the CPU).
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64>;
}

impl HostIo for cpu::Cpu {
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let t = std::time::Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// Uploads validated host inputs as f32 device buffers (states K-major).
pub fn upload_inputs<D: HostIo>(
    dev: &D,
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
) -> Result<StageInputs<D::Buf>> {
    let up = |t: &Tensor<'_>| dev.upload_tensor(t);
    let h0 = match &x.initial_state {
        Some(s) if opts.state_v_first => {
            Some(dev.upload(&transpose_states(&s.to_f32(), p.dk(), p.dv(), false))?)
        }
        Some(s) => Some(up(s)?),
        None => None,
    };
    Ok(StageInputs {
        q: up(&x.q)?,
        k: up(&x.k)?,
        v: up(&x.v)?,
        g: up(&x.g)?,
        beta: up(&x.beta)?,
        h0,
        a_log: x.a_log.as_ref().map(up).transpose()?,
        dt_bias: x.dt_bias.as_ref().map(up).transpose()?,
    })
}

pub(crate) fn host_forward<D: HostIo>(
    dev: &D,
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
) -> Result<Output> {
    let si = upload_inputs(dev, p, x, opts)?;
    let out = dev.forward(p, opts, &si)?;
    let final_state = if opts.output_final_state {
        Some(dev.download(&out.final_state)?)
    } else {
        None
    };
    let h = out.h.as_ref().map(|h| dev.download(h)).transpose()?;
    host_output(p, x, opts, dev.download(&out.o)?, final_state, h)
}

/// Host tensors of the forward's results, in the layouts and dtypes the options ask for.
pub(crate) fn host_output(
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
    o: Vec<f32>,
    final_state: Option<Vec<f32>>,
    h: Option<Vec<f32>>,
) -> Result<Output> {
    let shape = vec![p.batch(), p.seq_len(), p.v_heads(), p.dv()];
    // f32 output takes the buffer as it is: no second copy of what can be gigabytes.
    let o = match opts.out_dtype.unwrap_or(x.q.dtype()) {
        DType::F32 => Tensor::from_f32(o, shape)?,
        dtype => Tensor::cast_from_f32(&o, shape, dtype)?,
    };
    let final_state = match final_state {
        Some(s) if opts.output_final_state => {
            let s = if opts.state_v_first {
                transpose_states(&s, p.dk(), p.dv(), true)
            } else {
                s
            };
            Some(Tensor::from_f32(
                s,
                p.state_shape(opts.state_v_first).to_vec(),
            )?)
        }
        _ => None,
    };
    let chunk_states = match h {
        Some(h) if opts.output_chunk_states => Some(Tensor::from_f32(
            h,
            vec![p.chunks().len(), p.v_heads(), p.dk(), p.dv()],
        )?),
        _ => None,
    };
    Ok(Output {
        o,
        final_state,
        chunk_states,
    })
}
