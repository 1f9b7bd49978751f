"""Gated DeltaNet (the gated delta rule) linear attention, computed exactly.

Drop-in for flash-linear-attention's (FLA's) two forward entry points, with their argument
names, tensor layouts and return values:

- :func:`chunk_gated_delta_rule` (prefill: the chunked algorithm),
- :func:`fused_recurrent_gated_delta_rule` (decode: the per-token recurrence).

Both run on the CPU through the deltanet Rust library, in f32 arithmetic, within 1e-5 relative
L2 error of a float64 oracle. Inputs may be numpy arrays (float32, float16, and bfloat16 through
``ml_dtypes``) or CPU torch tensors; outputs are of the same kind as ``v``. CUDA torch tensors
run on the GPU, on torch's current stream, through the library's device-resident API
(``_cuda.py``; not covered by CI, which has no GPU). There is no autograd: outputs carry no
gradient.

Bad arguments raise ``ValueError`` whose message starts with the argument's name (as in
``q: expected rank 4, got rank 3 (shape [2, 3, 4])``); a value that is not an array or tensor at
all raises ``TypeError``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Optional, Tuple

import numpy as np

from . import _native

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "decode_step", "__version__"]
__version__ = _native.__version__

# The precisions deltanet implements (FLA has none to pick; the keyword is ours): "exact" (f32
# rounding) and "fast" (bf16 operands where the fused GPU kernel for bf16 inputs runs).
_PRECISIONS = ("exact", "fast")

# numpy dtype names to the library's element type names. bfloat16 is ml_dtypes' name.
_FLOAT_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, decided without importing torch (so that numpy users
    never pay for it): by the module its type is defined in."""
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "device")


def _on_cuda(x: Any) -> bool:
    """Whether ``x`` is a torch tensor on a GPU."""
    return _is_torch(x) and getattr(x.device, "type", None) == "cuda"


def _as_numpy(arg: str, x: Any) -> np.ndarray:
    """The host array behind a numpy array or CPU torch tensor (no copy where possible). A torch
    bfloat16 tensor, which numpy cannot hold, comes back as its raw 16-bit words (int16)."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(
                f"{arg}: expected a CPU tensor or numpy array (as v), got a tensor on {x.device}"
            )
        import torch  # only reached when the caller already uses torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy()
        return x.numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(
        f"{arg}: expected a numpy array or a torch tensor, got {type(x).__module__}."
        f"{type(x).__qualname__}"
    )


def _float_dtype(arg: str, x: Any, arr: np.ndarray) -> str:
    """The library's name for a tensor's element type; ``ValueError`` for any other type."""
    if _is_torch(x):
        name = str(x.dtype).replace("torch.", "")
    else:
        name = arr.dtype.name
    try:
        return _FLOAT_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"{arg}: expected dtype float32, float16 or bfloat16, got {name}"
        ) from None


def _raw(arg: str, x: Any) -> Tuple[bytes, Tuple[int, ...], str]:
    """A tensor as the compiled module reads it: row-major little-endian bytes, shape, dtype."""
    arr = _as_numpy(arg, x)
    dtype = _float_dtype(arg, x, arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr).tobytes(), tuple(int(d) for d in arr.shape), dtype


def _offsets(cu_seqlens: Any) -> Optional[list]:
    """``cu_seqlens`` as a list of ints (array, tensor, list or tuple of integers), or None."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, (list, tuple)):
        arr = np.asarray(cu_seqlens)
        if arr.size == 0:
            arr = arr.astype(np.int64)
    else:
        if _on_cuda(cu_seqlens):
            # The sequence tables are built on the host: one small copy (FLA makes it too).
            cu_seqlens = cu_seqlens.cpu()
        arr = _as_numpy("cu_seqlens", cu_seqlens)
    if arr.ndim != 1:
        raise ValueError(f"cu_seqlens: expected rank 1, got rank {arr.ndim} (shape {list(arr.shape)})")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"cu_seqlens: expected integer offsets, got dtype {arr.dtype}")
    return [int(o) for o in arr]


def _flag(arg: str, value: Any) -> bool:
    """A boolean keyword: ``True``/``False`` (numpy's too); anything else is refused rather than
    read by truthiness, so that a misplaced argument does not pass unnoticed."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{arg}: expected True or False, got {value!r}")


def _scale(scale: Any) -> Optional[float]:
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise ValueError(f"scale: expected a number or None, got {scale!r}")
    return float(scale)


def _chunk_size(value: Any) -> int:
    if value is None:
        return 64
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"chunk_size: expected 16, 32 or 64, got {value!r}")
    # Negative sizes would not fit the library's unsigned size; they are refused here by name.
    if value < 0:
        raise ValueError(f"chunk_size: expected 16, 32 or 64, got {value}")
    return int(value)


def _str_option(arg: str, value: Any, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"{arg}: expected a string, got {value!r}")
    return value


def _fla_names(message: str) -> str:
    """The library's messages with its option names replaced by the keywords of this call."""
    message = message.replace("beta_is_logits", "use_beta_sigmoid_in_kernel")
    return re.sub(r"(?<!use_)gate_in_kernel", "use_gate_in_kernel", message)


def _dtype_key(x: Any) -> Optional[str]:
    """The library's name for the element type of an array or tensor, or None for anything
    else (left to the checks that name the argument)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    name = str(dtype).replace("torch.", "") if _is_torch(x) else getattr(dtype, "name", "")
    return _FLOAT_DTYPES.get(name)


def _as_f32(x: Any) -> Any:
    """A float array or tensor as float32, of the same kind and on the same device (exact: f16
    and bf16 values are all f32 values)."""
    if _is_torch(x):
        return x.float()
    return np.asarray(x).astype(np.float32)


def _common_dtype(q: Any, k: Any, v: Any) -> Tuple[Any, Any, Any, Any]:
    """FLA lets q/k and v differ in dtype (q, k float32 with v float16, say); the library reads
    the three in one dtype. Mixed float dtypes are read as float32, which holds each of them
    exactly, so the result is the one the mixed call asks for; ``o`` is returned in v's dtype.
    Returns ``(q, k, v, o_dtype)``, ``o_dtype`` None where nothing was converted."""
    keys = [_dtype_key(x) for x in (q, k, v)]
    if None in keys or len(set(keys)) == 1:
        return q, k, v, None
    o_dtype = v.dtype
    q, k, v = (x if key == "f32" else _as_f32(x) for x, key in zip((q, k, v), keys))
    return q, k, v, o_dtype


def _cast_like(o: Any, dtype: Any) -> Any:
    """``o`` (float32) in ``dtype``, rounded once, as the kernels round an output."""
    if dtype is None:
        return o
    if _is_torch(o):
        return o.to(dtype)
    return o.astype(dtype)


def _wrap(out: Tuple[bytearray, list, str], like: Any) -> Any:
    """A result triple as an array of the caller's kind: a torch tensor when ``like`` (``v``) is
    one, else a numpy array. The result owns its memory and is writable."""
    buf, shape, dtype = out
    shape = tuple(shape)
    if _is_torch(like):
        import torch

        tdtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        if len(buf) == 0:  # torch.frombuffer refuses an empty buffer
            return torch.empty(shape, dtype=tdtype)
        return torch.frombuffer(buf, dtype=tdtype).reshape(shape)
    if dtype == "bf16":
        # A bf16 result only comes from bf16 inputs, which needed ml_dtypes already.
        import ml_dtypes

        npdtype = np.dtype(ml_dtypes.bfloat16)
    else:
        npdtype = np.dtype({"f32": np.float32, "f16": np.float16}[dtype])
    return np.frombuffer(buf, dtype=npdtype).reshape(shape)


def _options(scale: Any, use_qk_l2norm_in_kernel: Any, output_final_state: Any, kwargs: dict) -> dict:
    """The library's option dict from FLA's arguments and keywords (checked, by name)."""
    precision = _str_option("precision", kwargs.get("precision"), "exact")
    if precision not in _PRECISIONS:
        raise ValueError(
            f"precision: expected one of {', '.join(map(repr, _PRECISIONS))}, got {precision!r}"
        )
    if "transpose_state_layout" in kwargs:
        # FLA's former name of state_v_first: FLA warns and takes it, and refuses both at once.
        if kwargs.get("state_v_first", False):
            raise ValueError(
                "transpose_state_layout: the deprecated name of state_v_first; pass only state_v_first"
            )
        warnings.warn(
            "`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
            DeprecationWarning,
            stacklevel=4,
        )
        kwargs = dict(kwargs, state_v_first=kwargs["transpose_state_layout"])
    gate_in_kernel = _flag("use_gate_in_kernel", kwargs.get("use_gate_in_kernel", False))
    options = {
        "scale": _scale(scale),
        "use_qk_l2norm": _flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
        "beta_is_logits": _flag(
            "use_beta_sigmoid_in_kernel", kwargs.get("use_beta_sigmoid_in_kernel", False)
        ),
        "allow_neg_eigval": _flag("allow_neg_eigval", kwargs.get("allow_neg_eigval", False)),
        "gate_in_kernel": gate_in_kernel,
        "state_v_first": _flag("state_v_first", kwargs.get("state_v_first", False)),
        "chunk_size": _chunk_size(kwargs.get("chunk_size")),
        "head_map": _str_option("head_map", kwargs.get("head_map"), "grouped"),
        "precision": precision,
        "output_final_state": _flag("output_final_state", output_final_state),
    }
    return options


def _host_tensors(q, k, v, g, beta, initial_state, a_log, dt_bias, gate_in_kernel: bool) -> dict:
    """The call's host tensors as the compiled module reads them, by its names."""
    if gate_in_kernel and dt_bias is None and a_log is not None:
        # FLA's dt_bias is optional (no bias): the library takes an explicit [HV] of zeros.
        dt_bias = np.zeros(_as_numpy("A_log", a_log).shape, dtype=np.float32)
    return {
        "q": _raw("q", q),
        "k": _raw("k", k),
        "v": _raw("v", v),
        "g": _raw("g", g),
        "beta": _raw("beta", beta),
        "initial_state": None if initial_state is None else _raw("initial_state", initial_state),
        "a_log": None if a_log is None else _raw("A_log", a_log),
        "dt_bias": None if dt_bias is None else _raw("dt_bias", dt_bias),
    }


def _call(
    mode: str,
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Any,
    initial_state: Any,
    output_final_state: Any,
    use_qk_l2norm_in_kernel: Any,
    cu_seqlens: Any,
    kwargs: dict,
) -> Tuple[Any, Any]:
    """Translates FLA's arguments to the library's, runs ``mode``, wraps the results."""
    options = _options(scale, use_qk_l2norm_in_kernel, output_final_state, kwargs)
    gate_in_kernel, a_log, dt_bias = options["gate_in_kernel"], kwargs.get("A_log"), kwargs.get("dt_bias")
    q, k, v, o_dtype = _common_dtype(q, k, v)
    try:
        if _on_cuda(v):
            # GPU tensors stay on the GPU: the separate path of _cuda.py.
            from . import _cuda

            o, final_state = _cuda.run(
                mode, q, k, v, g, beta, initial_state, _offsets(cu_seqlens), a_log, dt_bias, options
            )
            return _cast_like(o, o_dtype), final_state if options["output_final_state"] else None
    except ValueError as e:
        raise ValueError(_fla_names(str(e))) from None
    tensors = _host_tensors(q, k, v, g, beta, initial_state, a_log, dt_bias, gate_in_kernel)
    tensors["cu_seqlens"] = _offsets(cu_seqlens)
    try:
        o, final_state = _native.run(mode, tensors, options)
    except ValueError as e:
        raise ValueError(_fla_names(str(e))) from None
    return _cast_like(_wrap(o, v), o_dtype), None if final_state is None else _wrap(final_state, v)


def chunk_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: Optional[float] = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    **kwargs: Any,
) -> Tuple[Any, Any]:
    """The gated delta rule's forward, by the chunked algorithm (FLA's prefill entry point).

    Per sequence and value head j, a state S (K x V, f32) starts at ``initial_state`` (or zero)
    and for each token t: ``S <- exp(g_t) S; u = beta_t (v_t - S^T k_t); S <- S + k_t u^T;
    o_t = S^T (scale q_t)``.

    Args:
        q, k: ``[B, T, H, K]``, float32, float16 or bfloat16. q, k and v may differ in dtype
            (as FLA allows); then the three are read as float32, which holds each exactly.
        v: ``[B, T, HV, V]``, HV a multiple of H.
        g: ``[B, T, HV]`` log-space decay (the raw gate input with ``use_gate_in_kernel``).
        beta: ``[B, T, HV]`` write strength (logits with ``use_beta_sigmoid_in_kernel``).
        scale: multiplies q; None means ``1 / sqrt(K)``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``), any of
            the float dtypes; computed in f32.
        output_final_state: also return the state after each sequence's last token.
        use_qk_l2norm_in_kernel: replace q and k by ``x / sqrt(sum x^2 + 1e-6)`` over K.
        cu_seqlens: ``[N + 1]`` integer offsets of packed sequences (then B = 1).

    Keyword args:
        use_beta_sigmoid_in_kernel: beta is ``sigmoid(beta)``.
        allow_neg_eigval: with it, beta is ``2 sigmoid(beta)``.
        use_gate_in_kernel, A_log, dt_bias: g is ``-exp(A_log) softplus(g + dt_bias)``
            (``[HV]`` each; dt_bias may be None).
        state_v_first: states are ``[N, HV, V, K]``. FLA's deprecated name for it,
            ``transpose_state_layout``, is taken too, with a ``DeprecationWarning`` (as FLA does).
        chunk_size: 16, 32 or 64 (default 64); the result does not depend on it beyond f32
            rounding.
        head_map: ``"grouped"`` (value head j reads q/k head ``j // (HV/H)``, FLA) or
            ``"tiled"`` (``j % H``, llama.cpp's Qwen3.5 layout).
        precision: ``"exact"`` (default; every product to f32 rounding) or ``"fast"`` (bf16
            operands with f32 accumulation where the fused GPU kernel for bf16 inputs runs,
            about FLA's error; elsewhere the same as exact).
        Any other keyword is ignored (as FLA's callers pass attention keywords through).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in v's dtype; final_state f32 in the
        initial state's layout, or None unless ``output_final_state``. Numpy arrays, or CPU
        torch tensors when v is a torch tensor.

    Raises:
        ValueError: a bad argument; the message starts with its name.
        TypeError: an argument that is not an array or tensor.
        RuntimeError: a failure of the GPU (or a bug), with the library's message.
    """
    return _call(
        "chunk",
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
        kwargs,
    )


def fused_recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any = None,
    beta: Any = None,
    scale: Optional[float] = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    **kwargs: Any,
) -> Tuple[Any, Any]:
    """The gated delta rule's forward, token by token (FLA's decode entry point).

    The same arguments, options and results as :func:`chunk_gated_delta_rule` (``chunk_size``
    is accepted and has no effect), computed by the per-token recurrence, which is cheapest for
    a few tokens per sequence. As in FLA, ``g`` may be None (no decay) and ``beta`` None (ones).
    To decode, pass the previous call's ``final_state`` as ``initial_state``.

    With ``inplace_final_state=True`` (vLLM's keyword) the final states are written into
    ``initial_state`` itself (a writable contiguous float32 array or tensor), which is returned as
    ``final_state``. For a pool of states with row indices, see :func:`decode_step`.
    """
    inplace = _flag("inplace_final_state", kwargs.get("inplace_final_state", False))
    if inplace:
        if initial_state is None:
            raise ValueError(
                "initial_state: expected the states to update in place (inplace_final_state is "
                "on), got None"
            )
        if _is_torch(initial_state):
            ok = str(initial_state.dtype) == "torch.float32" and initial_state.is_contiguous()
            got = f"dtype {initial_state.dtype}, contiguous {initial_state.is_contiguous()}"
        else:
            arr = _as_numpy("initial_state", initial_state)
            ok = arr.dtype == np.float32 and arr.flags.c_contiguous and arr.flags.writeable
            got = f"dtype {arr.dtype}, contiguous {arr.flags.c_contiguous}, writable {arr.flags.writeable}"
        if not ok:
            raise ValueError(
                "initial_state: expected a writable contiguous float32 array or tensor "
                f"(inplace_final_state is on), got {got}"
            )
    if g is None or beta is None:
        if _on_cuda(v):
            import torch

            fill = lambda value: torch.full(tuple(v.shape[:3]), value, dtype=torch.float32, device=v.device)
        else:
            fill = lambda value: np.full(tuple(v.shape[:3]), value, dtype=np.float32)
        if g is None:
            g = fill(0.0)
        if beta is None:
            beta = fill(1.0)
    o, final_state = _call(
        "recurrent",
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state or inplace,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
        kwargs,
    )
    if inplace:
        if _is_torch(initial_state):
            initial_state.copy_(final_state)
        else:
            np.copyto(_as_numpy("initial_state", initial_state), final_state)
        final_state = initial_state
    return o, final_state


def _index_list(arg: str, x: Any, shape: Tuple[int, ...]) -> Optional[list]:
    """Host pool-row indices (list, array or CPU tensor of integers, of ``shape``) as a flat
    list of ints, or None."""
    if x is None:
        return None
    arr = np.asarray(x) if isinstance(x, (list, tuple)) else _as_numpy(arg, x)
    if arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"{arg}: expected integer pool rows, got dtype {arr.dtype}")
    if tuple(arr.shape) != shape:
        dims = "[N]" if len(shape) == 1 else "[N, T]"
        raise ValueError(f"{arg}: expected shape {dims} = {list(shape)}, got {list(arr.shape)}")
    return [int(r) for r in arr.reshape(-1)]


def decode_step(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state_pool: Any,
    state_indices: Any = None,
    out_state_indices: Any = None,
    token_state_indices: Any = None,
    output_token_states: bool = False,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs: Any,
) -> Tuple[Any, Any]:
    """One decode step of N sequences, T tokens each, over a pool of states updated in place
    (how serving engines keep them; T > 1 verifies speculative draft tokens).

    For each sequence n: start from pool row ``state_indices[n]`` (row n without indices; a
    negative index is a padding slot: nothing read or written, its outputs zeros), advance the
    state through its T tokens by the gated delta rule, write the final state to row
    ``out_state_indices[n]`` (default: back to the row read; negative: none) and, if given, the
    state after token t to row ``token_state_indices[n, t]`` (negative: none), so an engine can
    roll back to the last accepted token. A row written by one sequence may be neither read nor
    written by another (sequences may share a row they only read); indices given on the host
    are checked for it (``ValueError``), indices in GPU memory are the caller's promise.

    Args:
        q, k: ``[N, T, H, K]``; v ``[N, T, HV, V]``; g, beta ``[N, T, HV]``: as
            :func:`fused_recurrent_gated_delta_rule` takes them (dtypes likewise).
        state_pool: ``[P, HV, K, V]`` float32 (``[P, HV, V, K]`` with ``state_v_first``), a
            writable contiguous numpy array or torch tensor (CPU or CUDA, as v), updated in place.
        state_indices, out_state_indices: ``[N]`` integers (i32 or i64), or None.
        token_state_indices: ``[N, T]`` integers, or None.
        output_token_states: also return the state after every token, ``[N, T, HV, K, V]``
            float32 (``[N, T, HV, V, K]`` with ``state_v_first``).
        scale, use_qk_l2norm_in_kernel, and the keywords of :func:`chunk_gated_delta_rule`
            (``use_beta_sigmoid_in_kernel``, ``allow_neg_eigval``, ``use_gate_in_kernel``,
            ``A_log``, ``dt_bias``, ``state_v_first``, ``head_map``); others are ignored.

    Returns:
        ``(o, token_states)``: o ``[N, T, HV, V]`` in v's dtype; token_states or None.

    Example:
        >>> import numpy as np, deltanet
        >>> N, T, H, HV, K, V, P = 2, 1, 1, 2, 8, 4, 5
        >>> rng = np.random.default_rng(0)
        >>> q, k = (rng.standard_normal((N, T, H, K), dtype=np.float32) for _ in range(2))
        >>> v = rng.standard_normal((N, T, HV, V), dtype=np.float32)
        >>> g = np.full((N, T, HV), -0.1, np.float32); beta = np.full((N, T, HV), 0.5, np.float32)
        >>> pool = np.zeros((P, HV, K, V), np.float32)
        >>> o, _ = deltanet.decode_step(q, k, v, g, beta, pool, state_indices=[3, -1])
        >>> bool(pool[3].any()), bool(pool[0].any()), bool((o[1] == 0).all())
        (True, False, True)
    """
    options = _options(scale, use_qk_l2norm_in_kernel, False, kwargs)
    a_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    q, k, v, o_dtype = _common_dtype(q, k, v)
    token_states = _flag("output_token_states", output_token_states)
    try:
        if _on_cuda(v):
            from . import _cuda

            o, ts = _cuda.decode(
                q, k, v, g, beta, state_pool, state_indices, out_state_indices,
                token_state_indices, token_states, a_log, dt_bias, options,
            )
            return _cast_like(o, o_dtype), ts
    except ValueError as e:
        raise ValueError(_fla_names(str(e))) from None
    pool = _as_numpy("state_pool", state_pool)
    f = pool.flags
    if pool.dtype != np.float32 or not (f.c_contiguous and f.writeable and f.aligned):
        raise ValueError(
            "state_pool: expected a writable aligned contiguous float32 array (updated in place), "
            f"got dtype {pool.dtype}, contiguous {f.c_contiguous}, writable {f.writeable}, "
            f"aligned {f.aligned}"
        )
    qs, vs = tuple(getattr(q, "shape", ())), tuple(getattr(v, "shape", ()))
    n, t = (qs + (0, 0))[:2]
    if len(qs) == 4 and len(vs) == 4:
        row = (vs[2], vs[3], qs[3]) if options["state_v_first"] else (vs[2], qs[3], vs[3])
        if pool.ndim != 4 or tuple(pool.shape[1:]) != row:
            names = "[P, HV, V, K]" if options["state_v_first"] else "[P, HV, K, V]"
            raise ValueError(
                f"state_pool: expected shape {names} with rows {list(row)}, got {list(pool.shape)}"
            )
    tensors = _host_tensors(q, k, v, g, beta, None, a_log, dt_bias, options["gate_in_kernel"])
    indices = {
        "state_indices": _index_list("state_indices", state_indices, (n,)),
        "out_state_indices": _index_list("out_state_indices", out_state_indices, (n,)),
        "token_state_indices": _index_list("token_state_indices", token_state_indices, (n, t)),
    }
    try:
        # The step updates the pool where it lies (its memory is handed over by address).
        o, ts = _native.decode(tensors, (pool.ctypes.data, pool.size), indices, token_states, options)
    except ValueError as e:
        raise ValueError(_fla_names(re.sub(r"^state:", "state_pool:", str(e)))) from None
    return _cast_like(_wrap(o, v), o_dtype), None if ts is None else _wrap(ts, v)
