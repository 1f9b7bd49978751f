"""The CUDA path: torch tensors on a GPU, computed by deltanet's device-resident engine API
(``deltanet::cuda::Plan``) on torch's current stream, into outputs torch allocates. Nothing is
copied to the host but ``cu_seqlens`` (the plan's sequence tables are built on the host, as FLA
does too), and nothing waits for the GPU: the work is queued in order with torch's own.

Imported only when a CUDA tensor is passed. CI has no GPU, so this path is tested only where
torch sees one (``tests/test_cuda.py``, skipped elsewhere).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from . import _native

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _dtype_name(arg: str, x: torch.Tensor) -> str:
    try:
        return _DTYPES[x.dtype]
    except KeyError:
        name = str(x.dtype).replace("torch.", "")
        raise ValueError(f"{arg}: expected dtype float32, float16 or bfloat16, got {name}") from None


def _on(arg: str, x: Any, device: torch.device) -> torch.Tensor:
    """``x`` as a tensor on ``device`` (v's), detached (no autograd)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{arg}: expected a torch tensor on {device} (as v), got {type(x).__qualname__}")
    if x.device != device:
        raise ValueError(f"{arg}: expected a tensor on {device} (as v), got one on {x.device}")
    return x.detach()


def _rank(arg: str, x: torch.Tensor, rank: int) -> None:
    if x.dim() != rank:
        raise ValueError(f"{arg}: expected rank {rank}, got rank {x.dim()} (shape {list(x.shape)})")


def _shape(arg: str, x: torch.Tensor, want: Tuple[int, ...], names: str) -> None:
    if tuple(x.shape) != tuple(want):
        raise ValueError(f"{arg}: expected shape {names} = {list(want)}, got {list(x.shape)}")


def _raw(arg: str, x: Optional[torch.Tensor]):
    """What ``CudaPlan.run`` reads: address, element count and dtype of a contiguous tensor."""
    if x is None:
        return None
    return (x.data_ptr(), x.numel(), _dtype_name(arg, x))


def run(
    mode: str,
    q: Any,
    k: Any,
    v: torch.Tensor,
    g: Any,
    beta: Any,
    initial_state: Any,
    cu_seqlens: Optional[list],
    a_log: Any,
    dt_bias: Any,
    options: dict,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Checks the shapes (naming the argument, as the CPU path's messages do), prepares a plan
    on torch's current stream and queues ``mode`` on it. Returns ``(o, final_state)``."""
    device = v.device
    v_first = options["state_v_first"]
    q, k, v, g, beta = (_on(a, x, device) for a, x in zip(("q", "k", "v", "g", "beta"), (q, k, v, g, beta)))
    _rank("q", q, 4)
    B, T, H, K = q.shape
    _shape("k", k, (B, T, H, K), "[B, T, H, K]")
    _rank("v", v, 4)
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [B, T, HV, V] with B = {B}, T = {T}, got {list(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    dtype = _dtype_name("q", q)
    for arg, x in (("k", k), ("v", v)):
        if _dtype_name(arg, x) != dtype:
            raise ValueError(f"{arg}: expected dtype {dtype} (as q), got {_dtype_name(arg, x)}")
    # The plan validates the sizes, options and cu_seqlens (the library's checks and messages)
    # before the other tensors are looked at, in the CPU path's order.
    stream = torch.cuda.current_stream(device)
    if mode == "chunk":
        # The engine's forward keeps states K-major; a V-major state is transposed here, on the
        # GPU, on the way in and out.
        options = dict(options, state_v_first=False)
    plan = _native.CudaPlan(
        mode, device.index, stream.cuda_stream, (B, T, H, HV, K, V), cu_seqlens, options, dtype
    )
    for arg, x in (("g", g), ("beta", beta)):
        _dtype_name(arg, x)
        _shape(arg, x, (B, T, HV), "[B, T, HV]")

    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    state_shape = (N, HV, V, K) if v_first else (N, HV, K, V)
    h0 = None
    if initial_state is not None:
        h0 = _on("initial_state", initial_state, device)
        _dtype_name("initial_state", h0)
        _shape("initial_state", h0, state_shape, "[N, HV, V, K]" if v_first else "[N, HV, K, V]")
        h0 = h0.float()

    if options["gate_in_kernel"]:
        if a_log is None:
            raise ValueError(f"A_log: expected a [HV] = [{HV}] tensor (use_gate_in_kernel is on), got none")
        a_log = _on("A_log", a_log, device)
        if dt_bias is None:  # FLA's dt_bias is optional (no bias)
            dt_bias = torch.zeros(HV, dtype=torch.float32, device=device)
        dt_bias = _on("dt_bias", dt_bias, device)
        for arg, x in (("A_log", a_log), ("dt_bias", dt_bias)):
            _dtype_name(arg, x)
            _shape(arg, x, (HV,), "[HV]")
        a_log, dt_bias = a_log.float().contiguous(), dt_bias.float().contiguous()
    else:
        for arg, x in (("A_log", a_log), ("dt_bias", dt_bias)):
            if x is not None:
                raise ValueError(f"{arg}: expected none unless use_gate_in_kernel is on, got a tensor")

    # The engine reads q, k, v in their dtype and g, beta, states and gate parameters in f32,
    # all dense; these are no-ops for tensors that already are.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g, beta = g.float().contiguous(), beta.float().contiguous()
    o = torch.empty((B, T, HV, V), dtype=v.dtype, device=device)

    # torch's allocator aligns blocks to 512 bytes, more than the 256 the workspace needs.
    workspace = torch.empty(max(plan.workspace_bytes, 1), dtype=torch.uint8, device=device)
    tensors = [_raw(a, x) for a, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))]
    if mode == "chunk":
        if h0 is not None:
            h0 = (h0.transpose(-1, -2) if v_first else h0).contiguous()
        final_state = torch.empty((N, HV, K, V), dtype=torch.float32, device=device)
        plan.run(*tensors, _raw("initial_state", h0), _raw("A_log", a_log), _raw("dt_bias", dt_bias),
                 _raw("o", o), _raw("final_state", final_state), (workspace.data_ptr(), workspace.numel()))
        if v_first:
            final_state = final_state.transpose(-1, -2).contiguous()
    else:
        # The step advances its state in place: a copy, so that the caller's initial_state is
        # left as it was (as FLA leaves it).
        if h0 is None:
            final_state = torch.zeros(state_shape, dtype=torch.float32, device=device)
        else:
            final_state = h0.clone(memory_format=torch.contiguous_format)
        plan.run(*tensors, None, _raw("A_log", a_log), _raw("dt_bias", dt_bias),
                 _raw("o", o), _raw("initial_state", final_state), (workspace.data_ptr(), workspace.numel()))
    # Temporaries (the workspace, contiguous copies) are freed when this returns: torch's
    # allocator reuses them only for work queued after ours on the same stream.
    return o, final_state
