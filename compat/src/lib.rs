//! Type-checks deltanet's engine API against the cudarc an engine links: the stream and buffers
//! an engine owns go straight in.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use deltanet::cuda::{CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, TokenInputs, Workspace};
use deltanet::{DType, Options, Problem};

/// One forward on the engine's stream, over the engine's bf16 buffers.
#[allow(clippy::too_many_arguments)]
pub fn forward_on_engine_stream(
    stream: Arc<CudaStream>,
    p: &Problem,
    opts: &Options,
    q: &CudaSlice<half::bf16>,
    k: &CudaSlice<half::bf16>,
    v: &CudaSlice<half::bf16>,
    g: &CudaSlice<f32>,
    beta: &CudaSlice<f32>,
    o: &mut CudaSlice<half::bf16>,
    final_state: &mut CudaSlice<f32>,
    workspace: &mut CudaSlice<u8>,
) -> deltanet::Result<()> {
    let dev = Arc::new(CudaDevice::from_stream(stream)?);
    let plan = Plan::new(dev, p, opts, DType::BF16)?;
    let inputs = TokenInputs::new(
        DeviceRef::new(q, DType::BF16)?,
        DeviceRef::new(k, DType::BF16)?,
        DeviceRef::new(v, DType::BF16)?,
        DeviceRef::new(g, DType::F32)?,
        DeviceRef::new(beta, DType::F32)?,
    );
    let io = ForwardIo::new(
        inputs,
        DeviceMut::new(o, DType::BF16)?,
        DeviceMut::new(final_state, DType::F32)?,
    );
    plan.forward(io, Workspace::new(workspace))
}
