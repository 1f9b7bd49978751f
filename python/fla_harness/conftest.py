"""FLA's own GDN tests (tests/ops/test_gdn.py) judging deltanet: a conftest that routes FLA's
``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` to deltanet before the test
module is collected (so its ``from fla.ops.gated_delta_rule import ...`` gets the routed ones).

- Forward: deltanet's outputs. Where an input requires grad (and grad mode is on), the routed
  call is a ``torch.autograd.Function`` whose backward re-runs FLA's original forward on the same
  inputs under ``enable_grad`` and takes ``torch.autograd.grad`` of it: the forward assertions
  (o, ht) judge deltanet, the backward ones (dq, dk, ...) judge FLA, as FLA's own tests do.
  Where FLA's chunk backward refuses to run (Triton 3.4 to 3.7.0 on Hopper: FLA raises rather
  than compute its gated dq/dk/dg wrongly, its issue #640; and in CPU mode) the backward is
  autograd through ``_torch_recurrence``, the token-by-token recurrence in float32 PyTorch:
  then the gradient assertions judge that recurrence, and only the forward ones judge
  deltanet. The summary counts both kinds of backward re-run.
- Arguments are bound with FLA's signature (so FLA's positional order holds) and passed to
  deltanet by name; keywords deltanet does not know go through (it ignores them).
- A call deltanet cannot serve (listed in ``_not_applicable``) skips its test with the reason:
  visible, never a silent pass. Every other refusal by deltanet fails the test.
- The rest of FLA (naive references, gate and WY kernels, backend verifiers) is left as it is.

Per test function: passed / failed / skipped / error counts, deltanet calls and FLA backward
re-runs, in the terminal summary and in the markdown file ``$DELTANET_FLA_SUMMARY`` (rewritten
after every test, so a run cut off by a time limit still leaves one).

Environment:
  DELTANET_FLA_SUMMARY      where to write the summary (markdown); none if unset.
  DELTANET_FLA_DEADLINE_S   seconds after the session starts past which the remaining tests are
                            skipped (reason: the harness's time budget), so that the summary
                            is complete before an outer time limit.
  DELTANET_FLA_HARNESS_CPU  1: run on the CPU (FLA's ``device`` set to ``cpu``), to check the
                            harness itself where no GPU is; FLA's Triton kernels can't run there,
                            so its backward re-runs fail. Not a way to judge anything.
"""

from __future__ import annotations

import inspect
import os
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

# Before FLA is imported (FLA's own tests/conftest.py imports it first where it sits above this
# one, so the run script sets these too). FLA's test file skips its GVA cases (HV != H) unless
# backend dispatch is off, as in FLA's Triton baseline run; dispatch would pick FlashQLA only.
os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import fla.utils  # noqa: E402
import fla.utils.testing  # noqa: E402

CPU_MODE = os.environ.get("DELTANET_FLA_HARNESS_CPU") == "1"
if CPU_MODE:
    import fla.utils.hardware

    fla.utils.device = fla.utils.hardware.device = "cpu"
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None  # FLA's conftest syncs after each test

# FLA_CI_ENV=1 turns FLA's assert_close into a warning for errors under 1 % (or 0.3 absolute):
# off here, so the tolerances are the ones written in the tests.
fla.utils.testing.FLA_CI_ENV = False

import deltanet  # noqa: E402
import fla.ops.gated_delta_rule as _gdr  # noqa: E402
import fla.ops.gated_delta_rule.chunk as _gdr_chunk  # noqa: E402
import fla.ops.gated_delta_rule.fused_recurrent as _gdr_rec  # noqa: E402

# FLA's originals, kept before routing: the backward re-runs them.
FLA = {
    "chunk": _gdr_chunk.chunk_gated_delta_rule,
    "recurrent": _gdr_rec.fused_recurrent_gated_delta_rule,
}
DELTANET = {
    "chunk": deltanet.chunk_gated_delta_rule,
    "recurrent": deltanet.fused_recurrent_gated_delta_rule,
}
SIGNATURES = {mode: inspect.signature(fn) for mode, fn in FLA.items()}

# FLA arguments deltanet has no counterpart of: a call with one of them set skips its test.
FLA_ONLY = {
    "chunk": {"cp_context": "context parallelism (cp_context)"},
    "recurrent": {
        "gk": "per-key decays (gk)",
        "gv": "per-value decays (gv)",
    },
}

# Per test: deltanet calls by entry point, and FLA backward re-runs.
CALLS: Counter = Counter()


def _bind(mode: str, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by name, as FLA's signature binds them (its **kwargs flattened)."""
    sig = SIGNATURES[mode]
    call = {}
    for name, value in sig.bind(*args, **kwargs).arguments.items():
        if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            call.update(value)
        else:
            call[name] = value
    return call


def _not_applicable(mode: str, call: dict):
    """Why deltanet cannot serve this call (a skip reason), or None."""
    for name, what in FLA_ONLY[mode].items():
        if call.get(name) is not None:
            return f"deltanet has no {what}"
    beta = call.get("beta")
    if isinstance(beta, torch.Tensor) and beta.dim() == 4:
        return "deltanet has no per-value beta ([B, T, HV, V])"
    return None


def _deltanet(mode: str, call: dict):
    call = {n: v for n, v in call.items() if n not in FLA_ONLY[mode]}  # all None here
    CALLS[f"deltanet_{mode}"] += 1
    return DELTANET[mode](**call)


class _Spec:
    """A routed call: its mode, its arguments by name, and which of them travel through
    ``Function.apply`` as tensors (the floating-point ones, in this order)."""

    def __init__(self, mode: str, call: dict, names: list):
        self.mode, self.call, self.names = mode, call, names

    def with_tensors(self, tensors) -> dict:
        return dict(self.call, **dict(zip(self.names, tensors)))


def _torch_recurrence(call: dict):
    """The routed call's function in plain PyTorch, float32, token by token (FLA's naive
    recurrence with the call's options applied around it), differentiable by autograd: the
    backward where FLA's own chunk backward cannot run (see ``_fla_chunk_backward_refused``)."""
    import torch.nn.functional as F

    q, k, v, g, beta = (call[n] for n in ("q", "k", "v", "g", "beta"))
    h0, cu = call.get("initial_state"), call.get("cu_seqlens")
    v_first = bool(call.get("state_v_first") or call.get("transpose_state_layout"))
    K = q.shape[-1]
    scale = call.get("scale")
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.float(), k.float(), v.float()
    if call.get("use_qk_l2norm_in_kernel"):
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = g.float()
    if call.get("use_gate_in_kernel"):
        dt_bias = call.get("dt_bias")
        g = g if dt_bias is None else g + dt_bias.float()
        g = -call["A_log"].float().exp() * F.softplus(g)
    beta = beta.float()
    if call.get("use_beta_sigmoid_in_kernel"):
        beta = beta.sigmoid() * (2.0 if call.get("allow_neg_eigval") else 1.0)
    HV = v.shape[2]
    q, k = (x.repeat_interleave(HV // x.shape[2], dim=2) for x in (q, k))  # grouped heads
    bounds = [(b, 0, q.shape[1]) for b in range(q.shape[0])] if cu is None else \
        [(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)]
    outs, finals = [], []
    for n, (b, start, end) in enumerate(bounds):
        S = q.new_zeros(HV, K, v.shape[-1]) if h0 is None else h0[n].float()
        if h0 is not None and v_first:
            S = S.transpose(-1, -2)
        rows = []
        for t in range(start, end):
            S = S * g[b, t].exp()[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hk,hkv->hv", k[b, t], S))
            S = S + torch.einsum("hk,hv->hkv", k[b, t], u)
            rows.append(torch.einsum("hk,hkv->hv", q[b, t] * scale, S))
        outs.append(torch.stack(rows) if rows else v.new_zeros(0, HV, v.shape[-1]))
        finals.append(S.transpose(-1, -2) if v_first else S)
    o = torch.cat(outs)[None] if cu is not None else torch.stack(outs)
    final_state = torch.stack(finals) if call.get("output_final_state") else None
    return o.to(call["v"].dtype), final_state


def _fla_chunk_backward_refused(mode: str) -> bool:
    """Whether FLA's chunk backward refuses to run here: with Triton 3.4-3.7.0 on Hopper it
    raises (its gated chunk_bwd_dqkwg computes wrong results there, FLA's issue #640) after
    recomputing the forward; and on the CPU (harness check) no Triton kernel runs at all."""
    if mode != "chunk":
        return False
    if CPU_MODE:
        return True
    import fla.utils.env as env

    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    return hopper and env.TRITON_ABOVE_3_4_0 and not env.TRITON_ABOVE_3_7_1


class RoutedGatedDeltaRule(torch.autograd.Function):
    """Forward: deltanet. Backward: FLA's original forward re-run on the saved inputs, then
    ``torch.autograd.grad`` of its outputs (``_torch_recurrence`` instead where FLA's chunk
    backward refuses to run)."""

    @staticmethod
    def forward(ctx, spec: _Spec, *tensors):
        o, final_state = _deltanet(spec.mode, spec.with_tensors(tensors))
        ctx.spec = spec
        ctx.save_for_backward(*tensors)
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        spec = ctx.spec
        needs = ctx.needs_input_grad[1:]
        torch_bwd = _fla_chunk_backward_refused(spec.mode)
        CALLS["torch_backward" if torch_bwd else "fla_backward"] += 1
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_(n) for t, n in zip(ctx.saved_tensors, needs)]
            fn = _torch_recurrence if torch_bwd else lambda call: FLA[spec.mode](**call)
            o, final_state = fn(spec.with_tensors(inputs))
        outputs, grads = [o], [do]
        if final_state is not None and dht is not None:
            outputs.append(final_state)
            grads.append(dht)
        wrt = [x for x, n in zip(inputs, needs) if n]
        got = iter(torch.autograd.grad(outputs, wrt, grads, allow_unused=True))
        return (None, *(next(got) if n else None for n in needs))


def _route(mode: str):
    original = FLA[mode]

    def routed(*args, **kwargs):
        call = _bind(mode, args, kwargs)
        reason = _not_applicable(mode, call)
        if reason is not None:
            pytest.skip(f"not applicable: {reason}")
        names = [n for n, v in call.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if torch.is_grad_enabled() and any(call[n].requires_grad for n in names):
            return RoutedGatedDeltaRule.apply(_Spec(mode, call, names), *(call[n] for n in names))
        return _deltanet(mode, call)

    routed.__name__ = original.__name__
    routed.__qualname__ = f"routed_to_deltanet.{original.__name__}"
    routed.__doc__ = f"FLA's {original.__name__}, routed to deltanet (python/fla_harness)."
    routed.__signature__ = SIGNATURES[mode]
    return routed


ROUTED = {mode: _route(mode) for mode in FLA}

# Everywhere FLA exports them (the package, its modules, the short aliases, fla.ops).
import fla.ops  # noqa: E402

for _module in (_gdr, fla.ops):
    _module.chunk_gated_delta_rule = _module.chunk_gdn = ROUTED["chunk"]
    _module.fused_recurrent_gated_delta_rule = _module.fused_recurrent_gdn = ROUTED["recurrent"]
_gdr_chunk.chunk_gated_delta_rule = _gdr_chunk.chunk_gdn = ROUTED["chunk"]
_gdr_rec.fused_recurrent_gated_delta_rule = _gdr_rec.fused_recurrent_gdn = ROUTED["recurrent"]


# ---------------------------------------------------------------------------------------------
# Collection: not-applicable tests, order, time budget.

# FLA's FlashQLA tests check that FLA's backend dispatch picked FlashQLA; routed calls never
# dispatch, so these cannot apply (FLA skips them anyway where flash_qla is not installed).
_FLASH_QLA_REASON = (
    "not applicable: checks FLA's dispatch to its FlashQLA backend, which routed calls bypass"
)


def _names(item) -> set:
    """The global and attribute names a test's code uses, its nested functions' too."""
    fn = getattr(item, "function", None)
    fn = inspect.unwrap(fn) if fn is not None else None  # under @torch.inference_mode() etc.
    code = getattr(fn, "__code__", None)
    names, todo = set(), [code] if code is not None else []
    while todo:
        code = todo.pop()
        names.update(code.co_names)
        todo.extend(c for c in code.co_consts if inspect.iscode(c))
    return names


def _calls_routed(item) -> bool:
    """Whether the test's own code calls one of the routed entry points (by name)."""
    return bool(_names(item) & {"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"})


def _needs_backward(item) -> bool:
    return "backward" in _names(item)


_ROUTED_FUNCTIONS: set = set()  # test functions whose code calls a routed entry point


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _calls_routed(item):
            _ROUTED_FUNCTIONS.add(item.originalname)
        if "_flash_qla_run" in _names(item):
            item.add_marker(pytest.mark.skip(reason=_FLASH_QLA_REASON))
    # Cheapest verdicts first, in case the time budget runs out: deltanet forward-only tests,
    # then those with FLA's backward (Triton compilation and autotuning), then FLA-only ones.
    rank = lambda it: (0 if not _needs_backward(it) else 1) if _calls_routed(it) else 2
    items.sort(key=rank)  # stable: FLA's order within each group


_START = time.monotonic()
_DEADLINE = float(os.environ.get("DELTANET_FLA_DEADLINE_S", "0") or 0)


def pytest_runtest_setup(item):
    CALLS.clear()
    # What the summary needs from the process that ran the test travels with its reports
    # (under pytest-xdist the summary is written by the controller, which runs no test).
    item.user_properties.append(("routed", item.originalname in _ROUTED_FUNCTIONS))
    if _DEADLINE and time.monotonic() - _START > _DEADLINE:
        pytest.skip(f"not run: the harness's time budget ({_DEADLINE:.0f} s) was spent")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    item.user_properties.append(("deltanet_calls", dict(CALLS)))


# ---------------------------------------------------------------------------------------------
# The per-function summary.

_RESULTS: dict = {}  # nodeid -> dict(function, case, outcome, detail, calls)
_ASSERT_CLOSE = re.compile(r"(\S+) diff: ([0-9.eE+-]+) ratio: ([0-9.eE+-]+)")


def _detail(report) -> str:
    if report.skipped:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            return str(longrepr[2]).removeprefix("Skipped: ")
        return str(longrepr)
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    m = _ASSERT_CLOSE.search(message)
    if m:  # FLA's assert_close: which quantity, its max abs diff and error ratio
        return f"{m.group(1)}: diff {m.group(2)} ratio {m.group(3)}"
    return message.strip().splitlines()[0][:200] if message.strip() else "?"


def pytest_runtest_logreport(report):
    nodeid = report.nodeid
    entry = _RESULTS.setdefault(nodeid, {
        "function": nodeid.split("::")[-1].split("[")[0],
        "case": nodeid.split("[", 1)[1][:-1] if "[" in nodeid else "",
        "outcome": None, "detail": "", "calls": Counter(),
    })
    if report.when == "call" or report.outcome != "passed":
        if entry["outcome"] in (None, "passed"):
            if report.when != "call" and report.failed:
                entry["outcome"] = "error"
            else:
                entry["outcome"] = report.outcome
            if report.outcome != "passed":
                entry["detail"] = _detail(report)
    props = dict(report.user_properties)
    if props.get("routed"):
        _ROUTED_FUNCTIONS.add(entry["function"])
    if report.when == "call":
        entry["calls"] = Counter(props.get("deltanet_calls", {}))
    if report.when == "teardown":
        if entry["outcome"] is None:
            entry["outcome"] = "passed"
        _write_summary()


def _revision() -> str:
    here = Path(__file__).resolve().parent
    for parent in (here, *here.parents):
        rev = parent / "REVISION"
        if rev.is_file():
            return " ".join(rev.read_text().split("\n")[:1])
    return "unknown"


def _table() -> list:
    per = defaultdict(lambda: {"cases": 0, "passed": 0, "failed": 0, "skipped": 0, "error": 0,
                               "calls": Counter(), "notes": Counter()})
    for entry in _RESULTS.values():
        row = per[entry["function"]]
        row["cases"] += 1
        row[entry["outcome"] or "error"] += 1
        row["calls"].update(entry["calls"])
        if entry["outcome"] in ("skipped", "failed", "error"):
            note = entry["detail"]
            if entry["outcome"] == "failed":
                quantity = re.fullmatch(r"(\S+): diff .*", note)
                note = f"failed at {quantity.group(1)}" if quantity else f"failed: {note}"
            row["notes"][note] += 1
    lines = [
        "| test function | routed | cases | passed | failed | skipped | error "
        "| deltanet calls (chunk/recurrent) | backward re-runs (FLA/torch) | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fn, row in per.items():
        c = row["calls"]
        routed = "yes" if fn in _ROUTED_FUNCTIONS else "no (FLA only)"
        notes = "; ".join(f"{n} (x{k})" if k > 1 else n for n, k in row["notes"].items())
        lines.append(f"| {fn} | {routed} | {row['cases']} | {row['passed']} | {row['failed']} "
                     f"| {row['skipped']} | {row['error']} | {c['deltanet_chunk']}/{c['deltanet_recurrent']} "
                     f"| {c['fla_backward']}/{c['torch_backward']} | {notes} |")
    return lines


def _write_summary():
    path = os.environ.get("DELTANET_FLA_SUMMARY")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist the controller writes it, from the workers' reports
    totals = Counter(e["outcome"] for e in _RESULTS.values())
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU mode)"
    out = [
        "# FLA's tests/ops/test_gdn.py, routed to deltanet",
        "",
        f"FLA tests at {_revision()}; fla {fla.__version__}, "
        f"deltanet {deltanet.__version__}, torch {torch.__version__}, {gpu}; "
        f"{time.monotonic() - _START:.0f} s so far.",
        f"Totals: {dict(totals)}",
        "",
        *_table(),
        "",
        "## Cases not passed",
        "",
    ]
    for entry in _RESULTS.values():
        if entry["outcome"] != "passed":
            case = f"[{entry['case']}]" if entry["case"] else ""
            out.append(f"- {entry['outcome']}: {entry['function']}{case}: {entry['detail']}")
    Path(path).write_text("\n".join(out) + "\n")


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    terminalreporter.section("per test function (deltanet routed)")
    for line in _table():
        terminalreporter.write_line(line)
    _write_summary()

