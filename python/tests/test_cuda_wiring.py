"""The GPU path's Python half (deltanet/_cuda.py) on a machine without a GPU: its checks, dtype
conversions, state layouts and the pointers it hands to the native plan, with the plan replaced
by a stand-in that reads and writes those pointers on the host and computes with the CPU path.
What it cannot check is the native plan itself (tests/test_cuda.py, on a GPU, does).

Needs torch (skipped where it is missing, as in CI)."""

import ctypes
import types

import numpy as np
import pytest

import test_deltanet as base

torch = pytest.importorskip("torch")

from deltanet import _cuda  # noqa: E402  (imports torch)

_NP = {"f32": np.float32, "f16": np.float16, "bf16": base.ml_dtypes.bfloat16}


def _array(raw, shape):
    """The host memory a `(ptr, numel, dtype)` triple addresses, as a numpy array (no copy)."""
    ptr, numel, dtype = raw
    dt = np.dtype(_NP[dtype])
    buf = (ctypes.c_char * (numel * dt.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dt).reshape(shape)


class FakePlan:
    """Stands in for _native.CudaPlan: same constructor and `run`, computing on the CPU."""

    calls = []

    def __init__(self, mode, ordinal, stream, dims, cu_seqlens, options, dtype):
        self.mode, self.dims, self.cu, self.options, self.dtype = mode, dims, cu_seqlens, options, dtype
        self.workspace_bytes = 256
        FakePlan.calls.append(self)

    def run(self, q, k, v, g, beta, initial_state, a_log, dt_bias, o, state, workspace):
        B, T, H, HV, K, V = self.dims
        N = B if self.cu is None else len(self.cu) - 1
        assert q[2] == k[2] == v[2] == o[2] == self.dtype
        assert g[2] == beta[2] == state[2] == "f32"
        assert workspace[1] >= self.workspace_bytes
        opts = self.options
        v_first = opts["state_v_first"]
        if self.mode == "chunk":
            assert not v_first, "the engine's forward is K-major: _cuda.py must transpose"
        sshape = (N, HV, V, K) if v_first else (N, HV, K, V)
        kw = dict(
            scale=opts["scale"], output_final_state=True, use_qk_l2norm_in_kernel=opts["use_qk_l2norm"],
            cu_seqlens=self.cu, use_beta_sigmoid_in_kernel=opts["beta_is_logits"],
            allow_neg_eigval=opts["allow_neg_eigval"], use_gate_in_kernel=opts["gate_in_kernel"],
            state_v_first=v_first, chunk_size=opts["chunk_size"], head_map=opts["head_map"],
        )
        if a_log is not None:
            kw["A_log"], kw["dt_bias"] = _array(a_log, (HV,)).copy(), _array(dt_bias, (HV,)).copy()
        args = [_array(q, (B, T, H, K)), _array(k, (B, T, H, K)), _array(v, (B, T, HV, V)),
                _array(g, (B, T, HV)), _array(beta, (B, T, HV))]
        st = _array(state, sshape)
        if self.mode == "chunk":
            h0 = None if initial_state is None else _array(initial_state, sshape).copy()
            out, final = base.chunk_gated_delta_rule(*(a.copy() for a in args), initial_state=h0, **kw)
        else:
            assert initial_state is None
            out, final = base.fused_recurrent_gated_delta_rule(
                *(a.copy() for a in args), initial_state=st.copy(), **kw
            )
        np.copyto(_array(o, (B, T, HV, V)), out)
        np.copyto(st, final)


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(_cuda, "_native", types.SimpleNamespace(CudaPlan=FakePlan))
    monkeypatch.setattr(_cuda.torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=0))
    FakePlan.calls.clear()


def _options(**over):
    opts = dict(scale=None, use_qk_l2norm=False, beta_is_logits=False, allow_neg_eigval=False,
                gate_in_kernel=False, state_v_first=False, chunk_size=64, head_map="grouped",
                output_final_state=True)
    opts.update(over)
    return opts


CASES = {
    "default": {},
    "initial_state_v_first": {"initial_state": True, "state_v_first": True},
    "initial_state": {"initial_state": True},
    "gate_no_dt_bias": {"gate_in_kernel": True},
    "varlen": {"cu_seqlens": [0, 5, 5, 30, 37], "initial_state": True},
    "l2norm_sigmoid_neg": {"use_qk_l2norm": True, "beta_is_logits": True, "allow_neg_eigval": True},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_wiring_matches_the_cpu_path(fake_gpu, mode, case, dtype):
    spec = dict(CASES[case])
    varlen = "cu_seqlens" in spec
    q, k, v, g, beta = base.problem(B=1 if varlen else 2, logits=spec.get("beta_is_logits", False),
                                    raw_gate=spec.get("gate_in_kernel", False))
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    cu = spec.pop("cu_seqlens", None)
    N = len(cu) - 1 if cu else q.shape[0]
    h0 = None
    if spec.pop("initial_state", False):
        shape = (N, HV, V, K) if spec.get("state_v_first") else (N, HV, K, V)
        h0 = torch.from_numpy((0.1 * np.random.default_rng(1).standard_normal(shape)).astype(np.float32))
    a_log = torch.linspace(-1, 0.5, HV) if spec.get("gate_in_kernel") else None
    # q, k, v in dtype; g and beta as f16 (the path widens them); a strided q.
    tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
    tq = tq.transpose(1, 2).contiguous().transpose(1, 2)
    tg, tb = torch.from_numpy(g).half(), torch.from_numpy(beta).half()
    h0_before = None if h0 is None else h0.clone()
    o, final = _cuda.run(mode, tq, tk, tv, tg, tb, h0, cu, a_log, None, _options(**spec))
    assert len(FakePlan.calls) == 1
    assert o.dtype == dtype and tuple(o.shape) == v.shape and final.dtype == torch.float32
    want_shape = (N, HV, V, K) if spec.get("state_v_first") else (N, HV, K, V)
    assert tuple(final.shape) == want_shape
    if h0 is not None:
        assert torch.equal(h0, h0_before), "initial_state must be left as it was"
    # The same call through the CPU path.
    fn = base.FNS[mode]
    kw = dict(output_final_state=True, cu_seqlens=cu, initial_state=h0,
              use_qk_l2norm_in_kernel=spec.get("use_qk_l2norm", False),
              use_beta_sigmoid_in_kernel=spec.get("beta_is_logits", False),
              allow_neg_eigval=spec.get("allow_neg_eigval", False),
              use_gate_in_kernel=spec.get("gate_in_kernel", False),
              state_v_first=spec.get("state_v_first", False))
    if a_log is not None:
        kw["A_log"] = a_log
    o_cpu, final_cpu = fn(tq, tk, tv, tg.float(), tb.float(), **kw)
    assert torch.equal(o, o_cpu)
    assert torch.allclose(final, final_cpu, rtol=0, atol=0)


def test_wiring_refuses_like_the_cpu_path(fake_gpu):
    q, k, v, g, beta = (torch.from_numpy(x) for x in base.problem())
    with pytest.raises(ValueError, match=r"^k: expected dtype f32 \(as q\), got bf16"):
        _cuda.run("chunk", q, k.bfloat16(), v, g, beta, None, None, None, None, _options())
    with pytest.raises(ValueError, match=r"^g: expected shape \[B, T, HV\]"):
        _cuda.run("chunk", q, k, v, g[:, :, :2], beta, None, None, None, None, _options())
    with pytest.raises(ValueError, match=r"^initial_state: expected shape \[N, HV, V, K\]"):
        _cuda.run("chunk", q, k, v, g, beta, torch.zeros(2, 4, 16, 12), None, None, None,
                  _options(state_v_first=True))
    with pytest.raises(ValueError, match=r"^A_log: expected a \[HV\] = \[4\] tensor"):
        _cuda.run("chunk", q, k, v, g, beta, None, None, None, None, _options(gate_in_kernel=True))
    with pytest.raises(ValueError, match=r"^dt_bias: expected none unless"):
        _cuda.run("chunk", q, k, v, g, beta, None, None, None, torch.zeros(4), _options())
    with pytest.raises(TypeError, match=r"^beta: expected a torch tensor"):
        _cuda.run("chunk", q, k, v, g, beta.numpy(), None, None, None, None, _options())


def _fake_decode_cuda(ordinal, stream, dims, options, q, k, v, g, beta, a_log, dt_bias, pool, o,
                      read, write, per_token, token_states):
    """Stands in for _native.decode_cuda: reads the buffers and indices it is handed on the host
    and runs the CPU path's decode_step on them."""
    N, T, H, HV, K, V, P = dims
    row = (HV, V, K) if options["state_v_first"] else (HV, K, V)
    assert q[2] == k[2] == v[2] == o[2] and g[2] == beta[2] == pool[2] == "f32"

    def rows(raw, shape):
        if raw is None:
            return None
        ptr, count, wide = raw
        dt = np.int64 if wide else np.int32
        buf = (ctypes.c_char * (count * np.dtype(dt).itemsize)).from_address(ptr)
        return np.frombuffer(buf, dtype=dt).reshape(shape).copy()

    host_pool = _array(pool, (P,) + row)
    kw = dict(scale=options["scale"], use_qk_l2norm_in_kernel=options["use_qk_l2norm"],
              use_beta_sigmoid_in_kernel=options["beta_is_logits"],
              allow_neg_eigval=options["allow_neg_eigval"], use_gate_in_kernel=options["gate_in_kernel"],
              state_v_first=options["state_v_first"], head_map=options["head_map"])
    if a_log is not None:
        kw["A_log"], kw["dt_bias"] = _array(a_log, (HV,)).copy(), _array(dt_bias, (HV,)).copy()
    out, ts = base.deltanet.decode_step(
        _array(q, (N, T, H, K)).copy(), _array(k, (N, T, H, K)).copy(), _array(v, (N, T, HV, V)).copy(),
        _array(g, (N, T, HV)).copy(), _array(beta, (N, T, HV)).copy(), host_pool,
        state_indices=rows(read, (N,)), out_state_indices=rows(write, (N,)),
        token_state_indices=rows(per_token, (N, T)), output_token_states=token_states is not None, **kw)
    np.copyto(_array(o, (N, T, HV, V)), out)
    if token_states is not None:
        np.copyto(_array(token_states, (N, T) + row), ts)


@pytest.mark.parametrize("v_first", [False, True], ids=["k_major", "v_first"])
def test_decode_wiring_matches_the_cpu_path(monkeypatch, v_first):
    """_cuda.decode: its checks, the index tensors it makes (host lists to i64, i32 tensors kept),
    the buffers it hands over, and the pool updated where it lies."""
    monkeypatch.setattr(_cuda, "_native", types.SimpleNamespace(decode_cuda=_fake_decode_cuda))
    monkeypatch.setattr(_cuda.torch.cuda, "current_stream", lambda device: types.SimpleNamespace(cuda_stream=0))
    q, k, v, g, beta, pool = base._pool_case(31, N=3, T=2)
    if v_first:
        pool = np.ascontiguousarray(pool.transpose(0, 1, 3, 2))
    idx = dict(state_indices=[4, -1, 0], out_state_indices=torch.tensor([4, 2, 5], dtype=torch.int32),
               token_state_indices=[[1, -1], [-1, -1], [6, 3]])
    want_pool = pool.copy()
    o_want, ts_want = base.deltanet.decode_step(q, k, v, g, beta, want_pool, output_token_states=True,
                                                state_v_first=v_first, **idx)
    tpool = torch.from_numpy(pool.copy())
    o, ts = _cuda.decode(*(torch.from_numpy(x) for x in (q, k, v, g, beta)), tpool,
                         idx["state_indices"], idx["out_state_indices"], idx["token_state_indices"],
                         True, None, None, _options(state_v_first=v_first))
    assert np.array_equal(o.numpy(), o_want) and np.array_equal(ts.numpy(), ts_want)
    assert np.array_equal(tpool.numpy(), want_pool)
    with pytest.raises(ValueError, match=r"^out_state_indices:"):
        _cuda.decode(*(torch.from_numpy(x) for x in (q, k, v, g, beta)), tpool, None, [1, 1, 2], None,
                     False, None, None, _options(state_v_first=v_first))
    with pytest.raises(ValueError, match=r"^state_pool:"):
        _cuda.decode(*(torch.from_numpy(x) for x in (q, k, v, g, beta)), tpool.double(), None, None,
                     None, False, None, None, _options(state_v_first=v_first))
