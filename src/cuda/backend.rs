//! The stage-by-stage path behind [`Backend`]: each method checks its buffers, allocates its
//! outputs, and queues the stage's launcher from `stages/` over their addresses.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::stages::{
    cast, chunk_output, chunk_state, cumsum, gate, kkt, l2norm, recurrent, solve_tril, wy,
    GammaPtrs,
};
use super::{cuda_err, Buf, CudaDevice};
use crate::backend::{Backend, ChunkStates, Gamma, Wy};
use crate::dtype::{DType, Data, Tensor};
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Problem;

/// The addresses of the buffers of one launch. Holding cudarc's guards until the launch is
/// queued keeps its cross-stream ordering where the context tracks events: the stream waits for
/// a buffer's pending writes, and the buffer's later users wait for this launch.
struct Access<'a> {
    stream: &'a CudaStream,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Access<'a> {
    fn new(dev: &'a CudaDevice) -> Self {
        Access {
            stream: dev.stream(),
            guards: Vec::new(),
        }
    }

    /// The address of a buffer the launch reads.
    fn r<T>(&mut self, b: &'a CudaSlice<T>) -> CUdeviceptr {
        let (p, g) = b.device_ptr(self.stream);
        self.guards.push(g);
        p
    }

    /// The address of a buffer the launch writes.
    fn w<T>(&mut self, b: &'a mut CudaSlice<T>) -> CUdeviceptr {
        let (p, g) = b.device_ptr_mut(self.stream);
        self.guards.push(g);
        p
    }

    fn gamma(&mut self, g: &'a Gamma<Buf>) -> GammaPtrs {
        GammaPtrs {
            gamma: self.r(&g.gamma),
            lo: self.r(&g.lo),
            seg: self.r(&g.seg),
        }
    }
}

impl CudaDevice {
    /// [`CudaDevice::check`] for the three buffers of a [`Gamma`], `n` elements each.
    fn check_gamma(&self, gamma: &Gamma<Buf>, n: usize) -> Result<()> {
        self.check("gamma", &gamma.gamma, n)?;
        self.check("lo", &gamma.lo, n)?;
        self.check("seg", &gamma.seg, n)
    }

    /// A host tensor on the device as f32: f32 is copied as it is; bf16 and f16 travel as their
    /// 16 bits and are widened on the device (exactly), halving the bytes sent.
    fn upload_any(&self, t: &Tensor<'_>) -> Result<Buf> {
        let bits: &[u16] = match t.data() {
            Data::F32(d) => return crate::HostIo::upload(self, d),
            Data::BF16(d) => bytemuck::cast_slice(d),
            Data::F16(d) => bytemuck::cast_slice(d),
        };
        let mut y = self.uninit(bits.len(), "an upload")?;
        if bits.is_empty() {
            return Ok(y);
        }
        let x = self.stream().clone_htod(bits).map_err(cuda_err(format!(
            "uploading {} {} elements",
            bits.len(),
            t.dtype()
        )))?;
        let mut a = Access::new(self);
        let (xp, yp) = (a.r(&x), a.w(&mut y));
        // SAFETY: x holds bits.len() 16-bit values, y as many f32, both of this device.
        unsafe { cast::convert(self, t.dtype(), DType::F32, xp, yp, bits.len()) }?;
        drop(a);
        Ok(y)
    }
}

impl Backend for CudaDevice {
    type Buf = Buf;

    fn l2norm(&self, x: &Buf, rows: usize, dim: usize) -> Result<Buf> {
        self.check("x", x, rows.saturating_mul(dim))?;
        let mut y = self.uninit(x.len(), "l2norm output")?;
        let mut a = Access::new(self);
        let (xp, yp) = (a.r(x), a.w(&mut y));
        // SAFETY: x and y hold rows * dim elements of this device (checked, allocated).
        unsafe { l2norm::launch(self, xp, yp, rows, dim) }?;
        drop(a);
        Ok(y)
    }

    fn gate(
        &self,
        p: &Problem,
        opts: &Options,
        g: &Buf,
        beta: &Buf,
        a_log: Option<&Buf>,
        dt_bias: Option<&Buf>,
    ) -> Result<(Buf, Buf)> {
        let hv = p.v_heads();
        let n = p.tokens() * hv;
        self.check("g", g, n)?;
        self.check("beta", beta, n)?;
        let mut g_out = self.uninit(n, "g")?;
        let mut beta_out = self.uninit(n, "beta")?;
        let mut a = Access::new(self);
        let (a_log, dt_bias) = if opts.gate_in_kernel {
            let a_log = a_log.ok_or_else(|| {
                Error::invalid("A_log", "a [HV] tensor (gate_in_kernel is on)", "none")
            })?;
            let dt_bias = dt_bias.ok_or_else(|| {
                Error::invalid("dt_bias", "a [HV] tensor (gate_in_kernel is on)", "none")
            })?;
            self.check("A_log", a_log, hv)?;
            self.check("dt_bias", dt_bias, hv)?;
            (a.r(a_log), a.r(dt_bias))
        } else {
            // Not read without gate_in_kernel.
            (0, 0)
        };
        let params = gate::Params {
            g: a.r(g),
            beta: a.r(beta),
            a_log,
            dt_bias,
            g_out: a.w(&mut g_out),
            beta_out: a.w(&mut beta_out),
            ..Default::default()
        };
        // SAFETY: every buffer holds n elements (A_log and dt_bias HV, with gate_in_kernel).
        unsafe { gate::launch(self, p, opts, &params) }?;
        drop(a);
        Ok((g_out, beta_out))
    }

    fn chunk_local_cumsum(&self, p: &Problem, g: &Buf) -> Result<Gamma<Buf>> {
        let n = p.tokens() * p.v_heads();
        self.check("g", g, n)?;
        let t = self.tables(p)?;
        let mut gamma = self.uninit(n, "gamma")?;
        let mut lo = self.uninit(n, "lo")?;
        let mut seg = self.uninit(n, "seg")?;
        let mut a = Access::new(self);
        let params = cumsum::Params {
            g: a.r(g),
            gamma: GammaPtrs {
                gamma: a.w(&mut gamma),
                lo: a.w(&mut lo),
                seg: a.w(&mut seg),
            },
            ..Default::default()
        };
        // SAFETY: all four buffers hold [B, T, HV] elements; the tables are p's.
        unsafe { cumsum::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(Gamma { gamma, lo, seg })
    }

    fn chunk_scaled_dot_kkt(
        &self,
        p: &Problem,
        k: &Buf,
        beta: &Buf,
        gamma: &Gamma<Buf>,
    ) -> Result<Buf> {
        let n = p.tokens() * p.v_heads();
        self.check("k", k, p.tokens() * p.heads() * p.dk())?;
        self.check("beta", beta, n)?;
        self.check_gamma(gamma, n)?;
        let t = self.tables(p)?;
        let mut a_strict = self.uninit(n * p.chunk_size(), "A_strict")?;
        let mut a = Access::new(self);
        let params = kkt::Params {
            k: a.r(k),
            beta: a.r(beta),
            gamma: a.gamma(gamma),
            a_strict: a.w(&mut a_strict),
            ..Default::default()
        };
        // SAFETY: the buffers have the layouts of p (checked, allocated); the tables are p's.
        unsafe { kkt::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(a_strict)
    }

    fn solve_tril(&self, p: &Problem, a_strict: &Buf) -> Result<Buf> {
        let len = p.tokens() * p.v_heads() * p.chunk_size();
        self.check("A_strict", a_strict, len)?;
        let t = self.tables(p)?;
        let mut a_inv = self.uninit(len, "A_inv")?;
        let mut a = Access::new(self);
        let params = solve_tril::Params {
            a_strict: a.r(a_strict),
            a_inv: a.w(&mut a_inv),
            ..Default::default()
        };
        // SAFETY: both buffers hold [B, T, HV, BT]; the tables are p's.
        unsafe { solve_tril::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(a_inv)
    }

    fn recompute_w_u(
        &self,
        p: &Problem,
        k: &Buf,
        v: &Buf,
        beta: &Buf,
        gamma: &Gamma<Buf>,
        a_inv: &Buf,
    ) -> Result<Wy<Buf>> {
        let n = p.tokens() * p.v_heads();
        self.check("k", k, p.tokens() * p.heads() * p.dk())?;
        self.check("v", v, n * p.dv())?;
        self.check("beta", beta, n)?;
        self.check_gamma(gamma, n)?;
        self.check("A_inv", a_inv, n * p.chunk_size())?;
        let t = self.tables(p)?;
        let mut w = self.uninit(n * p.dk(), "w")?;
        let mut u = self.uninit(n * p.dv(), "u")?;
        let mut a = Access::new(self);
        let params = wy::Params {
            k: a.r(k),
            v: a.r(v),
            beta: a.r(beta),
            gamma: a.gamma(gamma),
            a_inv: a.r(a_inv),
            w: a.w(&mut w),
            u: a.w(&mut u),
            ..Default::default()
        };
        // SAFETY: the buffers have the layouts of p (checked, allocated); the tables are p's.
        unsafe { wy::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(Wy { w, u })
    }

    fn chunk_state(
        &self,
        p: &Problem,
        k: &Buf,
        wy: &Wy<Buf>,
        gamma: &Gamma<Buf>,
        h0: Option<&Buf>,
    ) -> Result<ChunkStates<Buf>> {
        let n = p.tokens() * p.v_heads();
        let kv = p.state_len();
        self.check("k", k, p.tokens() * p.heads() * p.dk())?;
        self.check("w", &wy.w, n * p.dk())?;
        self.check("u", &wy.u, n * p.dv())?;
        self.check_gamma(gamma, n)?;
        if let Some(h0) = h0 {
            self.check("initial_state", h0, p.num_seqs() * p.v_heads() * kv)?;
        }
        // Fails before anything is allocated when K is too large for this GPU.
        chunk_state::tiling(p, self.max_shared_per_block())?;
        let t = self.tables(p)?;
        let mut h = self.uninit(p.chunks().len() * p.v_heads() * kv, "h")?;
        let mut v_new = self.uninit(n * p.dv(), "v_new")?;
        let mut final_state = self.uninit(p.num_seqs() * p.v_heads() * kv, "final_state")?;
        let mut a = Access::new(self);
        let params = chunk_state::Params {
            k: a.r(k),
            w: a.r(&wy.w),
            u: a.r(&wy.u),
            gamma: a.gamma(gamma),
            h0: h0.map_or(0, |b| a.r(b)),
            h: a.w(&mut h),
            v_new: a.w(&mut v_new),
            final_state: a.w(&mut final_state),
            ..Default::default()
        };
        // SAFETY: the buffers have the layouts of p (checked, allocated); the tables are p's.
        unsafe { chunk_state::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(ChunkStates {
            h,
            v_new,
            final_state,
        })
    }

    fn chunk_output(
        &self,
        p: &Problem,
        q: &Buf,
        k: &Buf,
        v_new: &Buf,
        h: &Buf,
        gamma: &Gamma<Buf>,
        scale: f32,
    ) -> Result<Buf> {
        let n = p.tokens() * p.v_heads();
        let qk = p.tokens() * p.heads() * p.dk();
        self.check("q", q, qk)?;
        self.check("k", k, qk)?;
        self.check("v_new", v_new, n * p.dv())?;
        self.check("h", h, p.chunks().len() * p.v_heads() * p.state_len())?;
        self.check_gamma(gamma, n)?;
        let t = self.tables(p)?;
        let mut o = self.uninit(n * p.dv(), "o")?;
        let mut a = Access::new(self);
        let params = chunk_output::Params {
            q: a.r(q),
            k: a.r(k),
            v_new: a.r(v_new),
            h: a.r(h),
            gamma: a.gamma(gamma),
            o: a.w(&mut o),
            scale,
            ..Default::default()
        };
        // SAFETY: the buffers have the layouts of p (checked, allocated); the tables are p's.
        unsafe { chunk_output::launch(self, p, &t.ptrs(), &params) }?;
        drop(a);
        Ok(o)
    }

    fn recurrent(
        &self,
        p: &Problem,
        q: &Buf,
        k: &Buf,
        v: &Buf,
        g: &Buf,
        beta: &Buf,
        state: &mut Buf,
        v_first: bool,
        scale: f32,
    ) -> Result<Buf> {
        let n = p.tokens() * p.v_heads();
        let qk = p.tokens() * p.heads() * p.dk();
        self.check("q", q, qk)?;
        self.check("k", k, qk)?;
        self.check("v", v, n * p.dv())?;
        self.check("g", g, n)?;
        self.check("beta", beta, n)?;
        self.check("state", state, p.num_seqs() * p.v_heads() * p.state_len())?;
        let t = self.tables(p)?;
        let mut o = self.uninit(n * p.dv(), "o")?;
        let mut a = Access::new(self);
        let params = recurrent::Params {
            q: a.r(q),
            k: a.r(k),
            v: a.r(v),
            g: a.r(g),
            beta: a.r(beta),
            state: a.w(state),
            o: a.w(&mut o),
            scale,
            ..Default::default()
        };
        // SAFETY: the buffers have the layouts of p (checked, allocated); the tables are p's.
        unsafe { recurrent::launch(self, p, &t.ptrs(), v_first, &params) }?;
        drop(a);
        Ok(o)
    }
}

impl crate::HostIo for CudaDevice {
    fn upload(&self, data: &[f32]) -> Result<Buf> {
        if data.is_empty() {
            return self.zeros(0, "an upload");
        }
        self.stream()
            .clone_htod(data)
            .map_err(cuda_err(format!("uploading {} elements", data.len())))
    }
    fn upload_tensor(&self, t: &Tensor<'_>) -> Result<Buf> {
        self.upload_any(t)
    }
    fn download(&self, buf: &Buf) -> Result<Vec<f32>> {
        self.check("buffer", buf, buf.len())?;
        if buf.is_empty() {
            return Ok(Vec::new());
        }
        self.stream()
            .clone_dtoh(buf)
            .map_err(cuda_err(format!("downloading {} elements", buf.len())))
    }
    fn synchronize(&self) -> Result<()> {
        self.stream()
            .synchronize()
            .map_err(cuda_err("synchronizing"))?;
        // Errors of asynchronous frees are parked in the context by cudarc's destructors.
        self.ctx
            .check_err()
            .map_err(cuda_err("an earlier asynchronous operation"))
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self
            .ctx
            .new_event(flags)
            .map_err(cuda_err("creating an event"))?;
        let end = self
            .ctx
            .new_event(flags)
            .map_err(cuda_err("creating an event"))?;
        start
            .record(self.stream())
            .map_err(cuda_err("recording an event"))?;
        f()?;
        end.record(self.stream())
            .map_err(cuda_err("recording an event"))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(cuda_err("timing with events"))?;
        Ok(f64::from(ms))
    }
}
