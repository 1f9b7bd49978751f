"""The deltanet Python package on the CPU: the shared conformance vectors, every option against a
float64 oracle written here, dtypes, decoding after a prefill, and bad arguments."""

import math
import os
import types
from pathlib import Path

import numpy as np
import pytest

import deltanet
from deltanet import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

ml_dtypes = pytest.importorskip("ml_dtypes")

FNS = {"chunk": chunk_gated_delta_rule, "recurrent": fused_recurrent_gated_delta_rule}
TOL = 1e-5  # relative L2 error allowed against float64 for f32 results


def rel(got, want):
    """Relative L2 error of ``got`` against ``want`` over the whole tensor, in float64."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)


# ---------------------------------------------------------------------------------------------
# The float64 oracle: the per-token recurrence with every option, written from the definition.


def oracle(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, l2norm=False,
           beta_logits=False, neg_eigval=False, gate=False, A_log=None, dt_bias=None,
           v_first=False, head_map="grouped"):
    q, k, v, g, beta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    if beta_logits:
        beta = 1.0 / (1.0 + np.exp(-beta)) * (2.0 if neg_eigval else 1.0)
    if gate:
        bias = np.zeros(HV) if dt_bias is None else np.asarray(dt_bias, np.float64)
        g = -np.exp(np.asarray(A_log, np.float64)) * np.logaddexp(0.0, g + bias)
    scale = 1.0 / math.sqrt(K) if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        seqs = [(0, int(s), int(e)) for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    o = np.zeros((B, T, HV, V))
    final = np.zeros((len(seqs), HV, K, V))
    for n, (b, s, e) in enumerate(seqs):
        for j in range(HV):
            hj = j // (HV // H) if head_map == "grouped" else j % H
            if initial_state is None:
                S = np.zeros((K, V))
            else:
                S = np.asarray(initial_state[n, j], dtype=np.float64)
                S = S.T.copy() if v_first else S.copy()
            for t in range(s, e):
                S *= np.exp(g[b, t, j])
                u = beta[b, t, j] * (v[b, t, j] - S.T @ k[b, t, hj])
                S += np.outer(k[b, t, hj], u)
                o[b, t, j] = S.T @ (scale * q[b, t, hj])
            final[n, j] = S
    if v_first:
        final = final.transpose(0, 1, 3, 2)
    return o, final


def problem(seed=0, B=2, T=37, H=2, HV=4, K=16, V=12, logits=False, raw_gate=False):
    """Random f32 inputs in the ranges a model produces: unit-norm k, log decays in (-0.5, 0),
    beta in (0, 1) (or logits / raw gate inputs for the in-kernel options)."""
    r = np.random.default_rng(seed)
    f = np.float32
    q = r.standard_normal((B, T, H, K)).astype(f)
    k = r.standard_normal((B, T, H, K))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(f)
    v = r.standard_normal((B, T, HV, V)).astype(f)
    g = (r.standard_normal((B, T, HV)) if raw_gate else -r.uniform(0.01, 0.5, (B, T, HV))).astype(f)
    beta = (r.standard_normal((B, T, HV)) if logits else r.uniform(0, 1, (B, T, HV))).astype(f)
    return q, k, v, g, beta


# ---------------------------------------------------------------------------------------------
# The shared conformance vectors.

VECTORS = Path(os.environ.get("DELTANET_VECTORS", Path(__file__).resolve().parents[3] / "shared" / "vectors"))
VECTOR_FILES = sorted(VECTORS.glob("*.safetensors")) if VECTORS.is_dir() else []


def load_vector(path):
    """One case: its tensors (bf16 ones as ml_dtypes arrays) and its options (JSON metadata)."""
    import json

    from safetensors import safe_open

    tensors, meta = {}, {}
    with safe_open(str(path), "numpy") as f:
        for key, val in (f.metadata() or {}).items():
            try:
                meta[key] = json.loads(val)
            except ValueError:  # `case` is a plain string
                meta[key] = val
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    return tensors, meta


@pytest.mark.skipif(not VECTOR_FILES, reason=f"SKIPPED: {VECTORS} is missing")
@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("chunk_size", [None, 16])
def test_conformance_vectors(path, fn, chunk_size):
    if fn == "recurrent" and chunk_size is not None:
        pytest.skip("chunk_size has no effect on the recurrence")
    t, meta = load_vector(path)
    kwargs = {}
    if meta.get("gate_in_kernel"):
        kwargs.update(use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t.get("dt_bias"))
    if meta.get("beta_is_logits"):
        kwargs["use_beta_sigmoid_in_kernel"] = True
    if meta.get("allow_neg_eigval"):
        kwargs["allow_neg_eigval"] = True
    if chunk_size is not None:
        kwargs["chunk_size"] = chunk_size
    o, final = FNS[fn](
        t["q"], t["k"], t["v"], t["g"], t["beta"],
        scale=meta.get("scale"),
        initial_state=t.get("initial_state"),
        output_final_state=True,
        use_qk_l2norm_in_kernel=bool(meta.get("use_qk_l2norm", False)),
        cu_seqlens=t.get("cu_seqlens"),
        **kwargs,
    )
    assert o.dtype == t["v"].dtype and o.shape == t["o_ref"].shape
    assert final.dtype == np.float32 and final.shape == t["final_state_ref"].shape
    assert rel(final, t["final_state_ref"]) < TOL
    if o.dtype == np.float32:
        assert rel(o, t["o_ref"]) < TOL
    else:
        # A half-precision o can be no closer than the exact answer rounded to its dtype; allow
        # that rounding plus the f32 tolerance (a rounding flip near a tie costs one ulp).
        rounded = t["o_ref"].astype(np.float32).astype(o.dtype)
        assert rel(o, t["o_ref"]) <= rel(rounded, t["o_ref"]) + TOL


# ---------------------------------------------------------------------------------------------
# Every option, both entry points, against the oracle.

OPTION_CASES = {
    "default": ({}, {}),
    "scale": ({"scale": 0.3}, {"scale": 0.3}),
    "qk_l2norm": ({"use_qk_l2norm_in_kernel": True}, {"l2norm": True}),
    "beta_sigmoid": ({"use_beta_sigmoid_in_kernel": True}, {"beta_logits": True}),
    "neg_eigval": (
        {"use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True},
        {"beta_logits": True, "neg_eigval": True},
    ),
    "gate_in_kernel": ({"use_gate_in_kernel": True}, {"gate": True}),
    "gate_in_kernel_no_dt_bias": ({"use_gate_in_kernel": True, "dt_bias": None}, {"gate": True}),
    "initial_state": ({"initial_state": True}, {}),
    "state_v_first": ({"initial_state": True, "state_v_first": True}, {"v_first": True}),
    "head_map_tiled": ({"head_map": "tiled"}, {"head_map": "tiled"}),
    "head_map_grouped": ({"head_map": "grouped"}, {}),
    "varlen": ({"cu_seqlens": [0, 5, 5, 30, 37], "initial_state": True}, {}),
    "chunk_size_16": ({"chunk_size": 16}, {}),
    "chunk_size_32": ({"chunk_size": 32}, {}),
    "precision_exact": ({"precision": "exact"}, {}),
    # On the CPU the fast precision computes exactly (its bf16 operands are a GPU kernel's).
    "precision_fast": ({"precision": "fast"}, {}),
    "unknown_kwargs_ignored": ({"attention_mask": object(), "head_first": False}, {}),
}


def option_case(case):
    """The inputs of OPTION_CASES[case]: (q, k, v, g, beta), the call's keywords and the
    oracle's, with the initial state, A_log and dt_bias the case asks for filled in."""
    call, ref = OPTION_CASES[case]
    call, ref = dict(call), dict(ref)
    varlen = "cu_seqlens" in call
    q, k, v, g, beta = problem(
        seed=hash(case) % 1000,
        B=1 if varlen else 2,
        logits=ref.get("beta_logits", False),
        raw_gate=ref.get("gate", False),
    )
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    r = np.random.default_rng(7)
    if call.pop("initial_state", False):
        n = len(call["cu_seqlens"]) - 1 if varlen else q.shape[0]
        shape = (n, HV, V, K) if call.get("state_v_first") else (n, HV, K, V)
        call["initial_state"] = ref["initial_state"] = (0.1 * r.standard_normal(shape)).astype(np.float32)
    if varlen:
        ref["cu_seqlens"] = call["cu_seqlens"]
    if ref.get("gate"):
        call["A_log"] = ref["A_log"] = r.uniform(-2, 0.5, HV).astype(np.float32)
        if "dt_bias" not in call:
            call["dt_bias"] = ref["dt_bias"] = r.uniform(-1, 1, HV).astype(np.float32)
    return (q, k, v, g, beta), call, ref


@pytest.mark.parametrize("case", OPTION_CASES, ids=str)
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_options_against_oracle(case, fn):
    (q, k, v, g, beta), call, ref = option_case(case)
    o, final = FNS[fn](q, k, v, g, beta, output_final_state=True, **call)
    o_ref, final_ref = oracle(q, k, v, g, beta, **ref)
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.shape == o_ref.shape
    assert final.dtype == np.float32 and final.shape == final_ref.shape
    assert rel(o, o_ref) < TOL, case
    assert rel(final, final_ref) < TOL, case


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_final_state_only_when_asked(fn):
    q, k, v, g, beta = problem()
    o, final = FNS[fn](q, k, v, g, beta)
    assert final is None and o.shape == v.shape
    o.fill(0)  # the result owns writable memory, as FLA's does


def test_decode_continues_prefill():
    """A prefill of the first tokens, then decoding the rest one token at a time from its final
    state, gives what one prefill of all tokens gives."""
    q, k, v, g, beta = problem(B=2, T=40)
    o_all, final_all = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    split = 33
    o_pre, state = chunk_gated_delta_rule(
        q[:, :split], k[:, :split], v[:, :split], g[:, :split], beta[:, :split],
        output_final_state=True,
    )
    outs = [o_pre]
    for t in range(split, q.shape[1]):
        o_t, state = fused_recurrent_gated_delta_rule(
            q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1],
            initial_state=state, output_final_state=True,
        )
        outs.append(o_t)
    assert rel(np.concatenate(outs, axis=1), o_all) < TOL
    assert rel(state, final_all) < TOL


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_transpose_state_layout_is_state_v_first(fn):
    """FLA's deprecated name of state_v_first is taken as FLA takes it: with a
    DeprecationWarning, and refused beside state_v_first."""
    (q, k, v, g, beta), call, _ = option_case("state_v_first")
    h0 = call["initial_state"]
    want = FNS[fn](q, k, v, g, beta, initial_state=h0, output_final_state=True, state_v_first=True)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        got = FNS[fn](q, k, v, g, beta, initial_state=h0, output_final_state=True,
                      transpose_state_layout=True)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    with pytest.raises(ValueError, match=r"^transpose_state_layout:"):
        FNS[fn](q, k, v, g, beta, state_v_first=True, transpose_state_layout=True)


def test_recurrent_defaults_g_and_beta():
    """As in FLA, the recurrence's g may be None (no decay) and beta None (ones)."""
    q, k, v, _, _ = problem(T=9)
    o, final = fused_recurrent_gated_delta_rule(q, k, v, output_final_state=True)
    zeros = np.zeros(v.shape[:3], np.float32)
    o_ref, final_ref = oracle(q, k, v, zeros, zeros + 1)
    assert rel(o, o_ref) < TOL and rel(final, final_ref) < TOL


# ---------------------------------------------------------------------------------------------
# Element types and memory layouts.


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_half_precision_inputs(fn, dtype):
    """o comes back in v's dtype and the final state in f32; both are the exact answer on the
    rounded inputs (to within o's own rounding); g, beta and initial_state may be half too."""
    q, k, v, g, beta = (x.astype(dtype) for x in problem())
    h0 = (0.1 * np.random.default_rng(3).standard_normal((2, 4, 16, 12))).astype(dtype)
    o, final = FNS[fn](q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == np.dtype(dtype) and final.dtype == np.float32
    o_ref, final_ref = oracle(q, k, v, g, beta, initial_state=h0.astype(np.float32))
    rounded = o_ref.astype(np.float32).astype(dtype)
    assert rel(o, o_ref) <= rel(rounded, o_ref) + TOL
    assert rel(final, final_ref) < TOL


@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
@pytest.mark.parametrize(
    "qk_dtype, v_dtype",
    [(np.float32, np.float16), (ml_dtypes.bfloat16, np.float32), (np.float16, ml_dtypes.bfloat16)],
    ids=["qk_f32-v_f16", "qk_bf16-v_f32", "qk_f16-v_bf16"],
)
def test_mixed_input_dtypes(fn, qk_dtype, v_dtype):
    """q/k and v of different dtypes (FLA allows it, and its tests call so): the exact answer on
    the inputs as given, o in v's dtype."""
    q, k, v, g, beta = problem(seed=7)
    q, k, v = q.astype(qk_dtype), k.astype(qk_dtype), v.astype(v_dtype)
    o, final = FNS[fn](q, k, v, g, beta, output_final_state=True)
    assert o.dtype == np.dtype(v_dtype) and final.dtype == np.float32
    o_ref, final_ref = oracle(*(x.astype(np.float32) for x in (q, k, v)), g, beta)
    rounded = o_ref.astype(np.float32).astype(v_dtype)
    assert rel(o, o_ref) <= rel(rounded, o_ref) + TOL
    assert rel(final, final_ref) < TOL


def test_non_contiguous_and_big_endian_inputs():
    q, k, v, g, beta = problem()
    o_ref, _ = chunk_gated_delta_rule(q, k, v, g, beta)
    q_t = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # strided view
    v_be = v.astype(">f4")
    o, _ = chunk_gated_delta_rule(q_t, k, v_be, g, beta)
    assert not q_t.flags.c_contiguous
    assert np.array_equal(o, o_ref)


def test_chunk_and_recurrent_agree_bitwise_run_to_run():
    q, k, v, g, beta = problem(seed=5)
    a = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    b = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


# ---------------------------------------------------------------------------------------------
# Bad arguments: ValueError (TypeError for non-arrays) whose message starts with the argument.


def _bad_cases():
    q, k, v, g, beta = problem(B=1)
    f = np.float32
    base = dict(q=q, k=k, v=v, g=g, beta=beta)
    return {
        "q_rank": ("q", dict(base, q=q[0])),
        "q_float64": ("q", dict(base, q=q.astype(np.float64))),
        "q_int": ("q", dict(base, q=q.astype(np.int32))),
        "k_shape": ("k", dict(base, k=k[:, :, :, :8])),
        "k_dtype": ("k", dict(base, k=k.astype(np.int16))),
        "v_heads_not_multiple": ("v", dict(base, v=v[:, :, :3])),
        "v_tokens": ("v", dict(base, v=v[:, :5])),
        "g_shape": ("g", dict(base, g=g[:, :, :2])),
        "beta_shape": ("beta", dict(base, beta=beta[:, :4])),
        "initial_state_shape": ("initial_state", dict(base, initial_state=np.zeros((1, 4, 12, 16), f))),
        "initial_state_float64": ("initial_state", dict(base, initial_state=np.zeros((1, 4, 16, 12)))),
        "cu_seqlens_last": ("cu_seqlens", dict(base, cu_seqlens=[0, 10, 36])),
        "cu_seqlens_decreasing": ("cu_seqlens", dict(base, cu_seqlens=[0, 20, 10, 37])),
        "cu_seqlens_first": ("cu_seqlens", dict(base, cu_seqlens=[1, 37])),
        "cu_seqlens_float": ("cu_seqlens", dict(base, cu_seqlens=np.array([0.0, 37.0]))),
        "cu_seqlens_with_batch": ("cu_seqlens", dict(zip(base, problem(B=2)), cu_seqlens=[0, 37])),
        "scale_inf": ("scale", dict(base, scale=float("inf"))),
        "scale_string": ("scale", dict(base, scale="0.5")),
        "chunk_size": ("chunk_size", dict(base, chunk_size=128)),
        "chunk_size_negative": ("chunk_size", dict(base, chunk_size=-16)),
        "head_map": ("head_map", dict(base, head_map="interleaved")),
        "precision": ("precision", dict(base, precision="fastest")),
        "allow_neg_eigval_without_sigmoid": ("allow_neg_eigval", dict(base, allow_neg_eigval=True)),
        "gate_without_A_log": ("A_log", dict(base, use_gate_in_kernel=True)),
        "A_log_without_gate": ("A_log", dict(base, A_log=np.zeros(4, f))),
        "A_log_shape": ("A_log", dict(base, use_gate_in_kernel=True, A_log=np.zeros(3, f))),
        "dt_bias_shape": ("dt_bias", dict(base, use_gate_in_kernel=True, A_log=np.zeros(4, f), dt_bias=np.zeros(5, f))),
        "flag_not_bool": ("use_qk_l2norm_in_kernel", dict(base, use_qk_l2norm_in_kernel="yes")),
        "output_final_state_not_bool": ("output_final_state", dict(base, output_final_state=1.5)),
    }


BAD = _bad_cases()


@pytest.mark.parametrize("case", BAD, ids=str)
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_bad_arguments_raise_value_error_naming_them(case, fn):
    arg, kwargs = BAD[case]
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        FNS[fn](**kwargs)


def test_not_an_array_is_a_type_error():
    q, k, v, g, beta = problem()
    with pytest.raises(TypeError, match=r"^q:"):
        chunk_gated_delta_rule(q.tolist(), k, v, g, beta)


def test_tensors_on_another_device_than_v_are_refused():
    """A torch tensor is recognised by its type's module, without importing torch: a stand-in
    on a GPU, beside a numpy v, is refused with ValueError naming the argument."""
    fake = types.new_class("Tensor")
    fake.__module__ = "torch"
    t = fake()
    t.device = types.SimpleNamespace(type="cuda", __str__=None)
    q, k, v, g, beta = problem()
    with pytest.raises(ValueError, match=r"^q: expected a CPU tensor or numpy array \(as v\)"):
        chunk_gated_delta_rule(t, k, v, g, beta)


def test_cuda_plan_binding_validates_before_touching_a_gpu():
    """The GPU path's native class (called by deltanet/_cuda.py) takes its arguments as that
    module passes them: bad sizes and options are ValueErrors naming the argument before any
    GPU is looked for; without a driver, a RuntimeError saying so (never a crash)."""
    from deltanet import _native

    opts = dict(scale=None, use_qk_l2norm=False, beta_is_logits=False, allow_neg_eigval=False,
                gate_in_kernel=False, state_v_first=False, chunk_size=64, head_map="grouped", precision="exact",
                output_final_state=True)
    dims = (1, 2, 1, 1, 4, 4)
    with pytest.raises(ValueError, match=r"^chunk_size:"):
        _native.CudaPlan("chunk", 0, 0, dims, None, dict(opts, chunk_size=128), "f32")
    with pytest.raises(ValueError, match=r"^cu_seqlens:"):
        _native.CudaPlan("recurrent", 0, 0, dims, [0, 3], opts, "f32")
    with pytest.raises(ValueError, match=r"^mode:"):
        _native.CudaPlan("both", 0, 0, dims, None, opts, "f32")
    try:
        plan = _native.CudaPlan("chunk", 0, 0, dims, None, opts, "f32")
    except RuntimeError as e:
        assert "CUDA" in str(e)
    else:  # a GPU is present: the plan sizes its workspace
        assert plan.workspace_bytes > 0


def test_version():
    assert deltanet.__version__ == "0.1.0"


# ---------------------------------------------------------------------------------------------
# CPU torch tensors (skipped where torch is not installed, as in CI).


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
def test_torch_cpu_tensors(dtype_name):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    q, k, v, g, beta = problem()
    tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
    tg, tb = torch.from_numpy(g), torch.from_numpy(beta)
    h0 = torch.zeros(2, 4, 16, 12, dtype=torch.bfloat16)
    o, final = chunk_gated_delta_rule(
        tq, tk, tv, tg, tb, initial_state=h0, output_final_state=True,
        cu_seqlens=None, use_qk_l2norm_in_kernel=True,
    )
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and o.shape == tv.shape
    assert final.dtype == torch.float32 and final.shape == (2, 4, 16, 12)
    as64 = lambda x: x.to(torch.float32).numpy()
    o_ref, final_ref = oracle(as64(tq), as64(tk), as64(tv), g, beta, l2norm=True)
    assert rel(final.numpy(), final_ref) < TOL
    rounded = torch.from_numpy(o_ref.astype(np.float32)).to(dtype).to(torch.float32).numpy()
    assert rel(as64(o), o_ref) <= rel(rounded, o_ref) + TOL


def test_torch_mixed_dtypes_as_fla_calls_them():
    """FLA's test_fused_recurrent passes q, k float32 with v float16: o comes back float16."""
    torch = pytest.importorskip("torch")
    q, k, v, g, beta = problem(seed=9)
    tq, tk, tv = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v).half()
    for fn in FNS.values():
        o, final = fn(tq, tk, tv, torch.from_numpy(g), torch.from_numpy(beta), output_final_state=True)
        assert o.dtype == torch.float16 and final.dtype == torch.float32
        o_ref, final_ref = oracle(q, k, tv.float().numpy(), g, beta)
        rounded = torch.from_numpy(o_ref.astype(np.float32)).half().float().numpy()
        assert rel(o.float().numpy(), o_ref) <= rel(rounded, o_ref) + TOL
        assert rel(final.numpy(), final_ref) < TOL


# ---------------------------------------------------------------------------------------------
# decode_step: a state pool updated in place, indices, padding, multi-token steps.


def _pool_case(seed, N=3, T=3, P=7, H=2, HV=4, K=16, V=12):
    q, k, v, g, beta = problem(seed=seed, B=N, T=T, H=H, HV=HV, K=K, V=V)
    pool = (0.1 * np.random.default_rng(seed + 100).standard_normal((P, HV, K, V))).astype(np.float32)
    return q, k, v, g, beta, pool


@pytest.mark.parametrize("v_first", [False, True], ids=["k_major", "v_first"])
def test_decode_step_pool_against_oracle(v_first):
    """Rows read, written elsewhere, padding, per-token states: every row of the pool and every
    output as the float64 recurrence gives them; untouched rows stay bitwise as they were."""
    N, T = 3, 3
    q, k, v, g, beta, pool = _pool_case(11, N=N, T=T)
    if v_first:
        pool = np.ascontiguousarray(pool.transpose(0, 1, 3, 2))
    before = pool.copy()
    read, write = [4, -1, 0], [4, 2, 5]
    per_token = [[1, -1, -1], [-1, -1, -1], [6, 3, -1]]
    o, ts = deltanet.decode_step(q, k, v, g, beta, pool, state_indices=read, out_state_indices=write,
                                 token_state_indices=np.array(per_token, np.int32),
                                 output_token_states=True, state_v_first=v_first)
    assert o.shape == v.shape and o.dtype == np.float32
    assert ts.shape == ((N, T, 4, 12, 16) if v_first else (N, T, 4, 16, 12))
    want = before.copy()
    for n in range(N):
        if read[n] < 0:
            assert (o[n] == 0).all() and (ts[n] == 0).all()
            continue
        h0 = before[read[n]][None]
        for t in range(T):
            o_ref, s_ref = oracle(q[n:n + 1, :t + 1], k[n:n + 1, :t + 1], v[n:n + 1, :t + 1],
                                  g[n:n + 1, :t + 1], beta[n:n + 1, :t + 1], initial_state=h0,
                                  v_first=v_first)
            assert rel(ts[n, t], s_ref[0]) < TOL
            if per_token[n][t] >= 0:
                want[per_token[n][t]] = s_ref[0]
        assert rel(o[n], o_ref[0]) < TOL
        want[write[n]] = s_ref[0]
    touched = {r for r in write} | {r for row in per_token for r in row if r >= 0}
    for r in range(pool.shape[0]):
        if r in touched:
            assert rel(pool[r], want[r]) < TOL, r
        else:
            assert np.array_equal(pool[r], before[r]), r


def test_decode_step_in_place_matches_recurrent_and_torch_pool():
    """Without indices row n is sequence n's, updated in place: the same numbers as
    fused_recurrent_gated_delta_rule's final state; a CPU torch pool is updated in place too."""
    q, k, v, g, beta, pool = _pool_case(12, N=3, T=2, P=3)
    h0 = pool.copy()
    o, ts = deltanet.decode_step(q, k, v, g, beta, pool, use_qk_l2norm_in_kernel=True)
    assert ts is None
    o_rec, final = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel(o, o_rec) < TOL and rel(pool, final) < TOL
    torch = pytest.importorskip("torch")
    tpool = torch.from_numpy(h0[::-1].copy())  # sequence n reads row 2 - n, which holds h0[n]
    ptr = tpool.data_ptr()
    deltanet.decode_step(*(torch.from_numpy(x) for x in (q, k, v, g, beta)), tpool,
                         state_indices=torch.tensor([2, 1, 0]), use_qk_l2norm_in_kernel=True)
    assert tpool.data_ptr() == ptr
    assert rel(tpool.numpy()[::-1], final) < TOL


@pytest.mark.parametrize(
    "arg, kwargs",
    [
        ("state_indices", dict(state_indices=[1, 1, 0])),
        ("out_state_indices", dict(out_state_indices=[2, 2, 4])),
        ("state_indices", dict(state_indices=[0, 1, 2], out_state_indices=[1, 3, 4])),
        ("state_indices", dict(state_indices=[0, 9, 2])),
        ("state_indices", dict(state_indices=[0, 1])),
        ("token_state_indices", dict(token_state_indices=[[5, 5], [5, -1], [-1, -1]])),
        ("state_pool", dict(pool=np.zeros((7, 4, 16, 12)))),
        ("state_pool", dict(pool=np.zeros((7, 4, 12, 16), np.float32).transpose(0, 1, 3, 2))),
        ("state_pool", dict(pool=np.zeros((7, 4, 16, 11), np.float32))),
        ("output_token_states", dict(output_token_states=1)),
    ],
    ids=["read_twice_written", "written_twice", "read_row_written_by_other", "row_past_pool",
         "indices_short", "token_row_twice", "pool_f64", "pool_strided", "pool_shape",
         "token_states_not_bool"],
)
def test_decode_step_bad_arguments(arg, kwargs):
    q, k, v, g, beta, pool = _pool_case(13, N=3, T=2)
    pool = kwargs.pop("pool", pool)
    before = pool.copy()
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        deltanet.decode_step(q, k, v, g, beta, pool, **kwargs)
    assert np.array_equal(pool, before)


def test_recurrent_inplace_final_state():
    """vLLM's inplace_final_state: the final states land in initial_state, which is returned."""
    q, k, v, g, beta = problem(seed=14)
    h0 = (0.1 * np.random.default_rng(15).standard_normal((2, 4, 16, 12))).astype(np.float32)
    o_ref, final_ref = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0.copy(),
                                                       output_final_state=True)
    state = h0.copy()
    o, final = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                               inplace_final_state=True)
    assert final is state
    assert np.array_equal(state, final_ref) and np.array_equal(o, o_ref)
    with pytest.raises(ValueError, match=r"^initial_state:"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, inplace_final_state=True)
    with pytest.raises(ValueError, match=r"^initial_state:"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0.astype(np.float16),
                                         inplace_final_state=True)
    with pytest.raises(ValueError, match=r"^inplace_final_state:"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state, inplace_final_state=1)
    torch = pytest.importorskip("torch")
    tstate = torch.from_numpy(h0.copy())
    _, tfinal = fused_recurrent_gated_delta_rule(*(torch.from_numpy(x) for x in (q, k, v, g, beta)),
                                                 initial_state=tstate, inplace_final_state=True)
    assert tfinal is tstate and np.array_equal(tstate.numpy(), final_ref)
