//! The stage-by-stage path behind [`Backend`]: each method checks its buffers, allocates its
//! outputs, and queues the stage's launcher from `stages/` over their addresses.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use super::stages::{
    cast, chunk_output, chunk_state, cumsum, gate, kkt, l2norm, launch_per_chunk, recurrent,
    solve_tril, wy, Ctx, GammaPtrs,
};
use super::{cuda_err, Buf, CudaDevice, Tables};
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

/// The lengths of one problem's buffers, by name (see [`Backend`]).
struct Lens {
    /// `[B, T, H, K]`: q, k.
    qk: usize,
    /// `[B, T, HV]`: g, beta, gamma.
    n: usize,
    /// `[B, T, HV, K]`: w.
    nk: usize,
    /// `[B, T, HV, V]`: v, u, v_new, o.
    nv: usize,
    /// `[B, T, HV, BT]`: A_strict, A_inv.
    nbt: usize,
    /// `[N, HV, K, V]`: states.
    states: usize,
}

impl Lens {
    fn of(p: &Problem) -> Lens {
        let n = p.tokens() * p.v_heads();
        Lens {
            qk: p.tokens() * p.heads() * p.dk(),
            n,
            nk: n * p.dk(),
            nv: n * p.dv(),
            nbt: n * p.chunk_size(),
            states: p.num_seqs() * p.v_heads() * p.state_len(),
        }
    }
}

impl CudaDevice {
    /// [`CudaDevice::check`] for each (name, buffer, length).
    fn check_all(&self, bufs: &[(&'static str, &Buf, usize)]) -> Result<()> {
        bufs.iter()
            .try_for_each(|&(arg, b, len)| self.check(arg, b, len))
    }

    /// [`CudaDevice::check`] for the three buffers of a [`Gamma`], `n` elements each.
    fn check_gamma(&self, g: &Gamma<Buf>, n: usize) -> Result<()> {
        self.check_all(&[("gamma", &g.gamma, n), ("lo", &g.lo, n), ("seg", &g.seg, n)])
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

// SAFETY (every launch below): each buffer was checked against the problem's layouts or
// allocated with them, and the tables are the problem's; the Access guards live until the
// launch is queued.
impl Backend for CudaDevice {
    type Buf = Buf;

    /// The fused kernels where [`super::fused::supported`], else the stages one after the other.
    fn forward(
        &self,
        p: &Problem,
        opts: &Options,
        x: &crate::StageInputs<Buf>,
    ) -> Result<crate::ForwardOut<Buf>> {
        if super::fused::supported(self, p, opts) {
            return super::fused::forward_bufs(self, p, opts, x);
        }
        crate::chunk_forward(self, p, opts, x)
    }

    fn l2norm(&self, x: &Buf, rows: usize, dim: usize) -> Result<Buf> {
        self.check("x", x, rows.saturating_mul(dim))?;
        let mut y = self.uninit(x.len(), "l2norm output")?;
        let mut a = Access::new(self);
        let (xp, yp) = (a.r(x), a.w(&mut y));
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
        let (n, hv) = (Lens::of(p).n, p.v_heads());
        self.check_all(&[("g", g, n), ("beta", beta, n)])?;
        let gate_params = if opts.gate_in_kernel {
            let [a_log, dt_bias] = [("A_log", a_log), ("dt_bias", dt_bias)].map(|(arg, b)| {
                let b = b.ok_or_else(|| {
                    Error::invalid(arg, "a [HV] tensor (gate_in_kernel is on)", "none")
                })?;
                self.check(arg, b, hv).map(|()| b)
            });
            Some((a_log?, dt_bias?))
        } else {
            None
        };
        let mut g_out = self.uninit(n, "g")?;
        let mut beta_out = self.uninit(n, "beta")?;
        let mut a = Access::new(self);
        // Without gate_in_kernel the kernel reads no gate parameters.
        let (a_log, dt_bias) = gate_params.map_or((0, 0), |(x, y)| (a.r(x), a.r(y)));
        let params = gate::Params {
            g: a.r(g),
            beta: a.r(beta),
            a_log,
            dt_bias,
            g_out: a.w(&mut g_out),
            beta_out: a.w(&mut beta_out),
            ..Default::default()
        };
        unsafe { gate::launch(self, p, opts, &params) }?;
        drop(a);
        Ok((g_out, beta_out))
    }

    fn chunk_local_cumsum(&self, p: &Problem, g: &Buf) -> Result<Gamma<Buf>> {
        let n = Lens::of(p).n;
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
        unsafe { cumsum::launch(&self.ctx(p, &t), &params) }?;
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
        let l = Lens::of(p);
        self.check_all(&[("k", k, l.qk), ("beta", beta, l.n)])?;
        self.check_gamma(gamma, l.n)?;
        let t = self.tables(p)?;
        let mut a_strict = self.uninit(l.nbt, "A_strict")?;
        let mut a = Access::new(self);
        let params = kkt::Params {
            k: a.r(k),
            beta: a.r(beta),
            gamma: a.gamma(gamma),
            a_strict: a.w(&mut a_strict),
            ..Default::default()
        };
        unsafe { kkt::launch(&self.ctx(p, &t), &params) }?;
        drop(a);
        Ok(a_strict)
    }

    fn solve_tril(&self, p: &Problem, a_strict: &Buf) -> Result<Buf> {
        let len = Lens::of(p).nbt;
        self.check("A_strict", a_strict, len)?;
        let t = self.tables(p)?;
        let mut a_inv = self.uninit(len, "A_inv")?;
        let mut a = Access::new(self);
        let params = solve_tril::Params {
            a_strict: a.r(a_strict),
            a_inv: a.w(&mut a_inv),
            ..Default::default()
        };
        unsafe { solve_tril::launch(&self.ctx(p, &t), &params) }?;
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
        let l = Lens::of(p);
        self.check_all(&[
            ("k", k, l.qk),
            ("v", v, l.nv),
            ("beta", beta, l.n),
            ("A_inv", a_inv, l.nbt),
        ])?;
        self.check_gamma(gamma, l.n)?;
        let t = self.tables(p)?;
        let (mut w, mut u) = (self.uninit(l.nk, "w")?, self.uninit(l.nv, "u")?);
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
        unsafe { launch_per_chunk(&self.ctx(p, &t), &params) }?;
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
        let l = Lens::of(p);
        self.check_all(&[("k", k, l.qk), ("w", &wy.w, l.nk), ("u", &wy.u, l.nv)])?;
        self.check_gamma(gamma, l.n)?;
        if let Some(h0) = h0 {
            self.check("initial_state", h0, l.states)?;
        }
        // Fails before anything is allocated when K is too large for this GPU.
        chunk_state::tiling(p, self.max_shared_per_block())?;
        let t = self.tables(p)?;
        let mut h = self.uninit(p.chunks().len() * p.v_heads() * p.state_len(), "h")?;
        let mut v_new = self.uninit(l.nv, "v_new")?;
        let mut final_state = self.uninit(l.states, "final_state")?;
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
        unsafe { chunk_state::launch(&self.ctx(p, &t), &params) }?;
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
        let l = Lens::of(p);
        let hs = p.chunks().len() * p.v_heads() * p.state_len();
        self.check_all(&[
            ("q", q, l.qk),
            ("k", k, l.qk),
            ("v_new", v_new, l.nv),
            ("h", h, hs),
        ])?;
        self.check_gamma(gamma, l.n)?;
        let t = self.tables(p)?;
        let mut o = self.uninit(l.nv, "o")?;
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
        unsafe { launch_per_chunk(&self.ctx(p, &t), &params) }?;
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
        let l = Lens::of(p);
        self.check_all(&[
            ("q", q, l.qk),
            ("k", k, l.qk),
            ("v", v, l.nv),
            ("g", g, l.n),
            ("beta", beta, l.n),
            ("state", state, l.states),
        ])?;
        let t = self.tables(p)?;
        let mut o = self.uninit(l.nv, "o")?;
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
        unsafe { recurrent::launch(&self.ctx(p, &t), v_first, &params) }?;
        drop(a);
        Ok(o)
    }
}

impl CudaDevice {
    /// The stage context of `p` with its cached tables `t`.
    fn ctx<'a>(&'a self, p: &'a Problem, t: &Tables) -> Ctx<'a> {
        Ctx {
            dev: self,
            p,
            t: t.ptrs(),
        }
    }
}

impl crate::HostIo for CudaDevice {
    /// Where [`super::fused::supported`]: q, k and v uploaded in their own dtype (no widening
    /// pass) and the fused forward; else the default (f32 uploads, [`Backend::forward`]).
    fn forward_host(
        &self,
        p: &Problem,
        x: &crate::Inputs<'_>,
        opts: &Options,
    ) -> Result<crate::ForwardOut<Buf>> {
        if super::fused::supported(self, p, opts) {
            return super::fused::forward_host(self, p, x, opts);
        }
        self.forward(p, opts, &crate::host::upload_inputs(self, p, x, opts)?)
    }
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
