"""The CUDA path (torch tensors on a GPU), against the same float64 oracle and vectors as the CPU
path. Skipped where torch or a GPU is missing (as in CI)."""

import numpy as np
import pytest

import test_deltanet as base

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU visible to torch", allow_module_level=True)

FNS = base.FNS
TOL = base.TOL
deltanet = base.deltanet


def cuda(x):
    """numpy arrays to CUDA tensors (bf16 ones through f32), anything else unchanged."""
    if isinstance(x, np.ndarray):
        if x.dtype == base.ml_dtypes.bfloat16:
            return torch.from_numpy(x.astype(np.float32)).to("cuda", torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(x)).to("cuda")
    return x


def host(x):
    return x.float().cpu().numpy()


@pytest.mark.parametrize("case", base.OPTION_CASES, ids=str)
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_options_against_oracle(case, fn):
    (q, k, v, g, beta), call, ref = base.option_case(case)
    if "cu_seqlens" in call:
        call["cu_seqlens"] = torch.tensor(call["cu_seqlens"], device="cuda")
    call = {key: cuda(val) for key, val in call.items()}
    h0 = call.get("initial_state")
    h0_before = None if h0 is None else h0.clone()
    o, final = FNS[fn](*(cuda(x) for x in (q, k, v, g, beta)), output_final_state=True, **call)
    torch.cuda.synchronize()
    o_ref, final_ref = base.oracle(q, k, v, g, beta, **ref)
    assert o.is_cuda and o.dtype == torch.float32 and tuple(o.shape) == o_ref.shape
    assert final.is_cuda and final.dtype == torch.float32 and tuple(final.shape) == final_ref.shape
    assert base.rel(host(o), o_ref) < TOL, case
    assert base.rel(host(final), final_ref) < TOL, case
    if h0 is not None:
        assert torch.equal(h0, h0_before), "initial_state must be left as it was"


@pytest.mark.skipif(not base.VECTOR_FILES, reason="the vectors are missing")
@pytest.mark.parametrize("path", base.VECTOR_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_conformance_vectors(path, fn):
    t, meta = base.load_vector(path)
    o, final = FNS[fn](
        *(cuda(t[n]) for n in ("q", "k", "v", "g", "beta")),
        scale=meta.get("scale"),
        initial_state=cuda(t.get("initial_state")),
        output_final_state=True,
        use_qk_l2norm_in_kernel=bool(meta.get("use_qk_l2norm", False)),
        cu_seqlens=cuda(t.get("cu_seqlens")),
    )
    torch.cuda.synchronize()
    assert base.rel(host(final), t["final_state_ref"]) < TOL
    if o.dtype == torch.float32:
        assert base.rel(host(o), t["o_ref"]) < TOL
    else:
        rounded = torch.from_numpy(t["o_ref"].astype(np.float32)).to(o.dtype).float().numpy()
        assert base.rel(host(o), t["o_ref"]) <= base.rel(rounded, t["o_ref"]) + TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_half_precision_matches_cpu(dtype, fn):
    q, k, v, g, beta = base.problem()
    args = [torch.from_numpy(x).to(dtype) for x in (q, k, v, g, beta)]
    h0 = torch.zeros(2, 4, 16, 12, dtype=dtype)
    o_cpu, s_cpu = FNS[fn](*args, initial_state=h0, output_final_state=True)
    o_gpu, s_gpu = FNS[fn](*(a.cuda() for a in args), initial_state=h0.cuda(), output_final_state=True)
    assert o_gpu.dtype == dtype and s_gpu.dtype == torch.float32 and o_gpu.is_cuda
    assert base.rel(host(o_gpu), host(o_cpu)) < 1e-2  # one 16-bit rounding of o apart at most
    assert base.rel(host(s_gpu), host(s_cpu)) < TOL


def test_runs_on_torchs_current_stream():
    """Work is queued on the current stream (not the default one): results read after that
    stream's work are complete, and agree with the default stream's."""
    q, k, v, g, beta = (cuda(x) for x in base.problem(T=200))
    want, _ = base.chunk_gated_delta_rule(q, k, v, g, beta)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got, _ = base.chunk_gated_delta_rule(q, k, v, g, beta)
        got_copy = got.clone()  # queued after ours on the same stream
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got_copy, want)


def test_final_state_only_when_asked():
    q, k, v, g, beta = (cuda(x) for x in base.problem())
    o, final = base.chunk_gated_delta_rule(q, k, v, g, beta)
    assert final is None and o.shape == v.shape


@pytest.mark.parametrize("case", base.BAD, ids=str)
def test_bad_arguments_raise_value_error_naming_them(case):
    arg, kwargs = base.BAD[case]
    kwargs = {key: cuda(val) for key, val in kwargs.items()}
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        base.chunk_gated_delta_rule(**kwargs)


def test_mixed_devices_are_refused():
    q, k, v, g, beta = base.problem()
    with pytest.raises(ValueError, match=r"^k: expected a tensor on cuda"):
        base.chunk_gated_delta_rule(cuda(q), torch.from_numpy(k), cuda(v), cuda(g), cuda(beta))


@pytest.mark.parametrize("v_first", [False, True], ids=["k_major", "v_first"])
@pytest.mark.parametrize("where", ["host", "device"], ids=["host_indices", "device_indices"])
def test_decode_step_pool_matches_cpu(v_first, where):
    """The pool step on the GPU (indices as host lists or as device tensors, i32 and i64) gives
    the CPU path's pool, outputs and per-token states within f32 rounding; padding stays zero."""
    q, k, v, g, beta, pool = base._pool_case(21, N=3, T=3, K=16, V=12)
    if v_first:
        pool = np.ascontiguousarray(pool.transpose(0, 1, 3, 2))
    idx = dict(state_indices=[4, -1, 0], out_state_indices=[4, 2, 5],
               token_state_indices=[[1, -1, -1], [-1, -1, -1], [6, 3, -1]])
    cpu_pool = pool.copy()
    o_cpu, ts_cpu = deltanet.decode_step(q, k, v, g, beta, cpu_pool, output_token_states=True,
                                         state_v_first=v_first, **idx)
    gpu_pool = cuda(pool)
    if where == "device":
        idx = {name: torch.tensor(x, dtype=dt, device="cuda")
               for (name, x), dt in zip(idx.items(), (torch.int32, torch.int64, torch.int32))}
    o, ts = deltanet.decode_step(*(cuda(x) for x in (q, k, v, g, beta)), gpu_pool,
                                 output_token_states=True, state_v_first=v_first, **idx)
    assert o.is_cuda and ts.is_cuda
    assert base.rel(host(o), o_cpu) < base.TOL
    assert base.rel(host(ts), ts_cpu) < base.TOL
    assert base.rel(host(gpu_pool), cpu_pool) < base.TOL
    assert (host(o)[1] == 0).all()


def test_decode_step_refuses_shared_host_rows_on_gpu():
    q, k, v, g, beta, pool = base._pool_case(22, N=3, T=1)
    gpu_pool = cuda(pool)
    before = gpu_pool.clone()
    with pytest.raises(ValueError, match=r"^out_state_indices:"):
        deltanet.decode_step(*(cuda(x) for x in (q, k, v, g, beta)), gpu_pool,
                             out_state_indices=[2, 2, 4])
    assert torch.equal(gpu_pool, before)
