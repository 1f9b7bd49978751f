//! The CUDA backend (being written).
#![allow(missing_docs, unused_variables)]

use crate::backend::{Backend, ChunkStates, Gamma, Wy};
use crate::error::{Error, Result};
use crate::options::Options;
use crate::problem::Problem;

#[derive(Debug)]
pub struct CudaDevice;

fn todo_err<T>() -> Result<T> {
    Err(Error::CudaUnavailable(
        "the CUDA backend is not built yet".into(),
    ))
}

impl CudaDevice {
    pub fn new(_ordinal: usize) -> Result<Self> {
        todo_err()
    }
    pub fn name(&self) -> String {
        "cuda".into()
    }
}

#[derive(Clone, Debug)]
pub struct Buf;

impl Backend for CudaDevice {
    type Buf = Buf;
    fn l2norm(&self, x: &Buf, rows: usize, dim: usize) -> Result<Buf> {
        todo_err()
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
        todo_err()
    }
    fn chunk_local_cumsum(&self, p: &Problem, g: &Buf) -> Result<Gamma<Buf>> {
        todo_err()
    }
    fn chunk_scaled_dot_kkt(
        &self,
        p: &Problem,
        k: &Buf,
        beta: &Buf,
        gamma: &Gamma<Buf>,
    ) -> Result<Buf> {
        todo_err()
    }
    fn solve_tril(&self, p: &Problem, a: &Buf) -> Result<Buf> {
        todo_err()
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
        todo_err()
    }
    fn chunk_state(
        &self,
        p: &Problem,
        k: &Buf,
        wy: &Wy<Buf>,
        gamma: &Gamma<Buf>,
        h0: Option<&Buf>,
    ) -> Result<ChunkStates<Buf>> {
        todo_err()
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
        todo_err()
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
        todo_err()
    }
}

impl crate::HostIo for CudaDevice {
    fn upload(&self, data: &[f32]) -> Result<Buf> {
        todo_err()
    }
    fn download(&self, buf: &Buf) -> Result<Vec<f32>> {
        todo_err()
    }
    fn synchronize(&self) -> Result<()> {
        todo_err()
    }
    fn time_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        todo_err()
    }
}
