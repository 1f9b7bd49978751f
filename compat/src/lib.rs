//! Type-checks deltanet's engine API against the cudarc an engine links: the stream and buffers
//! an engine owns go straight in.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use deltanet::cuda::{CudaDevice, DeviceMut, DeviceRef, ForwardIo, Plan, Workspace};
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
    plan.forward(
        ForwardIo {
            q: DeviceRef::new(q, DType::BF16)?,
            k: DeviceRef::new(k, DType::BF16)?,
            v: DeviceRef::new(v, DType::BF16)?,
            g: DeviceRef::new(g, DType::F32)?,
            beta: DeviceRef::new(beta, DType::F32)?,
            initial_state: None,
            a_log: None,
            dt_bias: None,
            o: DeviceMut::new(o, DType::BF16)?,
            final_state: DeviceMut::new(final_state, DType::F32)?,
            chunk_states: None,
        },
        Workspace::new(workspace),
    )
}
