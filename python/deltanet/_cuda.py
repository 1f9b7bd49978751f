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


def _qkv(b: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The sizes ``(B, T, H, HV, K, V)`` q, k, v imply, checked (``b`` names the first one), and
    their common dtype's name."""
    _rank("q", q, 4)
    B, T, H, K = q.shape
    _shape("k", k, (B, T, H, K), f"[{b}, T, H, K]")
    _rank("v", v, 4)
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"v: expected shape [{b}, T, HV, V] with {b} = {B}, T = {T}, got {list(v.shape)}")
    dtype = _dtype_name("q", q)
    for arg, x in (("k", k), ("v", v)):
        if _dtype_name(arg, x) != dtype:
            raise ValueError(f"{arg}: expected dtype {dtype} (as q), got {_dtype_name(arg, x)}")
    return (B, T, H, v.shape[2], K, v.shape[3]), dtype


def _gate_params(a_log: Any, dt_bias: Any, HV: int, device: torch.device, gate_in_kernel: bool):
    """A_log and dt_bias as dense f32 ``[HV]`` tensors on ``device`` (dt_bias zeros where FLA's
    optional one is None) with the gate in the kernel; without it both must be None."""
    if not gate_in_kernel:
        for arg, x in (("A_log", a_log), ("dt_bias", dt_bias)):
            if x is not None:
                raise ValueError(f"{arg}: expected none unless use_gate_in_kernel is on, got a tensor")
        return None, None
    if a_log is None:
        raise ValueError(f"A_log: expected a [HV] = [{HV}] tensor (use_gate_in_kernel is on), got none")
    a_log = _on("A_log", a_log, device)
    if dt_bias is None:  # FLA's dt_bias is optional (no bias)
        dt_bias = torch.zeros(HV, dtype=torch.float32, device=device)
    dt_bias = _on("dt_bias", dt_bias, device)
    for arg, x in (("A_log", a_log), ("dt_bias", dt_bias)):
        _dtype_name(arg, x)
        _shape(arg, x, (HV,), "[HV]")
    return a_log.float().contiguous(), dt_bias.float().contiguous()


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
    (B, T, H, HV, K, V), dtype = _qkv("B", q, k, v)
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

    a_log, dt_bias = _gate_params(a_log, dt_bias, HV, device, options["gate_in_kernel"])

    # The engine reads q, k, v in their dtype and g, beta, states and gate parameters in f32,
    # all dense; these are no-ops for tensors that already are.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    # The fused kernels read q, k and v with 16-byte loads, and the plan's workspace is theirs: a
    # view at an odd offset is copied (torch's allocations are aligned) rather than sent to the
    # stage path, whose workspace is several times larger.
    q, k, v = (x if x.data_ptr() % 16 == 0 else x.clone() for x in (q, k, v))
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


def _host_rows(arg: str, x: Any, shape: Tuple[int, ...]) -> Optional[list]:
    """Indices given on the host (list, array, CPU tensor) as a flat list of ints; None for
    None or for a tensor already on a GPU (left there, unchecked)."""
    if x is None or (isinstance(x, torch.Tensor) and x.device.type == "cuda"):
        return None
    from . import _index_list

    return _index_list(arg, x, shape)


def _check_sharing(n: int, t: int, read: Optional[list], write: Optional[list],
                   per_token: Optional[list], write_given: bool) -> None:
    """The decode step's rule, for indices on the host (the CPU path's library checks the same):
    a row written by one sequence is neither read nor written by another."""
    owner: dict = {}

    def claim(arg: str, row: int, seq: int) -> None:
        if row >= 0 and owner.setdefault(row, seq) != seq:
            raise ValueError(
                f"{arg}: expected rows written by one sequence only, got row {row} written by "
                f"sequences {owner[row]} and {seq}"
            )

    for s in range(n):
        r = s if read is None else read[s]
        if r < 0:
            continue
        if write_given:
            if write is not None:
                claim("out_state_indices", write[s], s)
        else:
            claim("state_indices", r, s)
        if per_token is not None:
            for j in range(t):
                claim("token_state_indices", per_token[s * t + j], s)
    for s in range(n):
        r = s if read is None else read[s]
        if r >= 0 and owner.get(r, s) != s:
            raise ValueError(
                f"state_indices: expected no row read by one sequence and written by another, got "
                f"row {r} read by sequence {s} and written by sequence {owner[r]}"
            )


def _device_rows(arg: str, x: Any, device: torch.device, shape: Tuple[int, ...]):
    """Indices as a contiguous i32/i64 tensor on ``device`` and its ``(ptr, count, is_i64)``."""
    if x is None:
        return None, None
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x if not hasattr(x, "__array__") else x.__array__())
    if x.dtype not in (torch.int32, torch.int64):
        if x.numel() and x.is_floating_point():
            raise ValueError(f"{arg}: expected integer pool rows, got dtype {x.dtype}")
        x = x.to(torch.int64)
    if tuple(x.shape) != shape:
        dims = "[N]" if len(shape) == 1 else "[N, T]"
        raise ValueError(f"{arg}: expected shape {dims} = {list(shape)}, got {list(x.shape)}")
    x = x.to(device).contiguous()
    return x, (x.data_ptr(), x.numel(), x.dtype == torch.int64)


def decode(q, k, v, g, beta, pool, state_indices, out_state_indices, token_state_indices,
           token_states: bool, a_log, dt_bias, options: dict):
    """``deltanet.decode_step`` on the GPU: checks, outputs allocated by torch, one launch on
    torch's current stream. Returns ``(o, token_states or None)``; the pool is updated in place."""
    device = v.device
    q, k, v, g, beta = (_on(a, x, device) for a, x in zip(("q", "k", "v", "g", "beta"), (q, k, v, g, beta)))
    (N, T, H, HV, K, V), dtype = _qkv("N", q, k, v)
    for arg, x in (("g", g), ("beta", beta)):
        _dtype_name(arg, x)
        _shape(arg, x, (N, T, HV), "[N, T, HV]")
    pool = _on("state_pool", pool, device)
    v_first = options["state_v_first"]
    if pool.dtype != torch.float32 or not pool.is_contiguous() or pool.dim() != 4:
        raise ValueError(
            "state_pool: expected a contiguous float32 [P, HV, K, V] tensor (updated in place), "
            f"got dtype {pool.dtype}, shape {list(pool.shape)}, contiguous {pool.is_contiguous()}"
        )
    row = (HV, V, K) if v_first else (HV, K, V)
    if tuple(pool.shape[1:]) != row:
        names = "[P, HV, V, K]" if v_first else "[P, HV, K, V]"
        raise ValueError(f"state_pool: expected shape {names} with rows {list(row)}, got {list(pool.shape)}")
    host = [_host_rows(a, x, s) for a, x, s in (
        ("state_indices", state_indices, (N,)), ("out_state_indices", out_state_indices, (N,)),
        ("token_state_indices", token_state_indices, (N, T)))]
    on_host = all(x is None or not (isinstance(x, torch.Tensor) and x.device.type == "cuda")
                  for x in (state_indices, out_state_indices, token_state_indices))
    if on_host:
        _check_sharing(N, T, host[0], host[1], host[2], out_state_indices is not None)
    read, read_raw = _device_rows("state_indices", state_indices, device, (N,))
    write, write_raw = _device_rows("out_state_indices", out_state_indices, device, (N,))
    per_token, per_token_raw = _device_rows("token_state_indices", token_state_indices, device, (N, T))
    a_log, dt_bias = _gate_params(a_log, dt_bias, HV, device, options["gate_in_kernel"])
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    # The fused kernels read q, k and v with 16-byte loads, and the plan's workspace is theirs: a
    # view at an odd offset is copied (torch's allocations are aligned) rather than sent to the
    # stage path, whose workspace is several times larger.
    q, k, v = (x if x.data_ptr() % 16 == 0 else x.clone() for x in (q, k, v))
    g, beta = g.float().contiguous(), beta.float().contiguous()
    o = torch.empty((N, T, HV, V), dtype=v.dtype, device=device)
    ts = None
    if token_states:
        ts = torch.empty((N, T) + row, dtype=torch.float32, device=device)
    stream = torch.cuda.current_stream(device)
    _native.decode_cuda(
        device.index, stream.cuda_stream, (N, T, H, HV, K, V, pool.shape[0]), options,
        _raw("q", q), _raw("k", k), _raw("v", v), _raw("g", g), _raw("beta", beta),
        _raw("A_log", a_log), _raw("dt_bias", dt_bias), _raw("state_pool", pool), _raw("o", o),
        read_raw, write_raw, per_token_raw, _raw("token_states", ts),
    )
    # The index tensors made here are freed on return; torch's allocator reuses them only for
    # work queued after this launch on the same stream.
    del read, write, per_token
    return o, ts
