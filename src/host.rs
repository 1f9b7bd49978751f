//! The glue between host tensors and a device: uploads, downloads, timing, and the shaping of
//! results into the layouts and dtypes the options ask for.

use crate::backend::{Backend, StageInputs};
use crate::dtype::{DType, Tensor};
use crate::error::Result;
use crate::forward::{activate, ForwardOut};
use crate::options::Options;
use crate::problem::{Inputs, Problem};
use crate::Output;

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

/// A device that can take host data: the glue between host tensors and a [`Backend`], and the
/// way [`crate::forward`] and [`crate::recurrent_step`] reach every device.
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
    /// Moves a device buffer's contents to the host, consuming the buffer: a [`download`] by
    /// default; the CPU hands its buffer over without a copy.
    ///
    /// [`download`]: HostIo::download
    fn download_owned(&self, buf: Self::Buf) -> Result<Vec<f32>> {
        self.download(&buf)
    }
    /// Waits until all work queued on the device is done.
    fn synchronize(&self) -> Result<()>;
    /// Milliseconds the device spends on the work `f` queues (device events on a GPU, wall
    /// clock on the CPU).
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64>;

    /// [`Backend::forward`] on host inputs already validated into `p` with `opts`: what
    /// [`crate::forward`] runs on this device, results left on it. By default `x` is uploaded
    /// ([`upload_inputs`]) and `forward` runs on the uploaded buffers; the CPU, whose buffers
    /// are host memory, runs its same fused forward reading `x` in place, in its own dtype.
    fn forward_host(
        &self,
        p: &Problem,
        x: &Inputs<'_>,
        opts: &Options,
    ) -> Result<ForwardOut<Self::Buf>>
    where
        Self: Sized,
    {
        self.forward(p, opts, &upload_inputs(self, p, x, opts)?)
    }

    /// [`Backend::recurrent`] after [`activate`], on uploaded inputs `x` and a host `state`
    /// (`[N, HV, K, V]`, or `[N, HV, V, K]` with `state_v_first`) advanced in place: what
    /// [`crate::recurrent_step`] runs on this device. Returns `o` `[B, T, HV, V]` on the
    /// device. By default the state is uploaded, advanced and downloaded back; the CPU advances
    /// it where it lies.
    fn recurrent_host(
        &self,
        p: &Problem,
        opts: &Options,
        x: &StageInputs<Self::Buf>,
        state: &mut [f32],
    ) -> Result<Self::Buf>
    where
        Self: Sized,
    {
        let a = activate(self, p, opts, x)?;
        let mut s = self.upload(state)?;
        let o = self.recurrent(
            p,
            a.q(),
            a.k(),
            &x.v,
            &a.g,
            &a.beta,
            &mut s,
            opts.state_v_first,
            opts.scale_for(p.dk()),
        )?;
        state.copy_from_slice(&self.download(&s)?);
        Ok(o)
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

/// [`crate::forward`] on one device: [`HostIo::forward_host`], then the results as host tensors.
pub(crate) fn forward_on<D: HostIo>(
    dev: &D,
    p: &Problem,
    x: &Inputs<'_>,
    opts: &Options,
) -> Result<Output> {
    let out = dev.forward_host(p, x, opts)?;
    let final_state = if opts.output_final_state {
        Some(dev.download_owned(out.final_state)?)
    } else {
        None
    };
    let h = out.h.map(|h| dev.download_owned(h)).transpose()?;
    host_output(p, x, opts, dev.download_owned(out.o)?, final_state, h)
}

/// [`crate::recurrent_step`] on one device: [`HostIo::recurrent_host`] on the uploaded inputs,
/// `o` as a host tensor.
pub(crate) fn recurrent_on<D: HostIo>(
    dev: &D,
    p: &Problem,
    x: &Inputs<'_>,
    state: &mut [f32],
    opts: &Options,
) -> Result<Tensor<'static>> {
    let si = upload_inputs(dev, p, x, opts)?;
    let o = dev.download_owned(dev.recurrent_host(p, opts, &si, state)?)?;
    Tensor::cast_from_f32(
        &o,
        vec![p.batch(), p.seq_len(), p.v_heads(), p.dv()],
        opts.out_dtype.unwrap_or(x.q.dtype()),
    )
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
