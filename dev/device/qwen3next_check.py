#!/usr/bin/env python3
"""Qwen3-Next's gated delta-net layer (transformers) with its chunk function routed to deltanet.

Requirement checked: transformers' Qwen3-Next linear-attention layer, with its chunk function
routed to ``deltanet.chunk_gated_delta_rule``, gives the same layer output as with FLA's
``chunk_gated_delta_rule`` within FLA's test tolerance, and is closer than FLA to the layer run
on a float64 recurrence.

One layer (fixed seed, the model's dtype, eval, no grad) runs on the same hidden states with its
chunk function replaced by, in turn:

  fla     FLA's chunk_gated_delta_rule
  deltanet  deltanet.chunk_gated_delta_rule
  f64     the plain gated delta recurrence, token by token in float64 (its o goes back to the
          layer in v's dtype, so the rest of the layer runs unchanged; the float64 o is kept)
  hf_torch  transformers' own torch fallback (information only)
  stock   the layer as transformers set it up, untouched (information only: with FLA installed
          it is FLA, and must match the fla route exactly, which shows the routing is faithful)

It reports relative L2 errors ||x - ref|| / ||ref|| (float64) of the layer outputs and of the
raw chunk outputs the wrappers capture. FLA's tests (fla/utils/testing.py, ``assert_close``)
accept when ``get_err_ratio`` = RMSE(diff) / RMSE(ref), which is this relative L2 error, is below
a ratio; its bf16 tests of chunk_gated_delta_rule's output use 0.005, the threshold here.

Checks, for every T: (1) the chunk function's output (what FLA's tolerance is written for):
deltanet vs FLA <= threshold (0.005); (2) the layer output: deltanet vs FLA <= layer threshold
(0.01: FLA's CI run, FLA_CI_ENV, passes errors under 1 % with a warning); whether it is also
under the strict 0.005 is printed beside it: the layer's gated norm and projection make FLA's own
layer error against the float64 layer about 5e-3, so an exact layer differs from FLA's by about
that much; (3) deltanet's output is closer to the float64 one than FLA's, for the chunk function
and for the layer. Exit 0 only when all pass; 1 when a check fails; 2 on any exception
(traceback printed).

Usage (GPU):   python3 dev/device/qwen3next_check.py --json OUT.json
Usage (CPU, no FLA, tiny):  python3 dev/device/qwen3next_check.py --device cpu --no-fla \
    --hidden-size 64 --key-heads 2 --value-heads 4 --head-dim 16 --T 70,64 --json /tmp/q.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import re
import sys
import time
import traceback

# With another backend installed (FlashQLA), FLA dispatches its chunk function there unless this
# is set; "FLA" here means FLA's own Triton kernels. Set before fla is first imported (transformers
# imports it when the modeling module loads).
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

MODELING = "transformers.models.qwen3_next.modeling_qwen3_next"
LAYER_CLASS = "Qwen3NextGatedDeltaNet"
CONFIG_CLASS = "Qwen3NextConfig"
# FLA's flags that change the recurrence; the float64 reference implements none of them, so it
# refuses them rather than silently computing something else.
UNSUPPORTED_FLAGS = (
    "use_gate_in_kernel",
    "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval",
    "state_v_first",
    "transpose_state_layout",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--T", default="1024,1000", help="comma-separated sequence lengths")
    p.add_argument("--B", type=int, default=2, help="batch size")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    # The defaults are Qwen3-Next-80B-A3B's linear-attention shapes (transformers' config defaults).
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--key-heads", type=int, default=16)
    p.add_argument("--value-heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128, help="key and value head dim")
    p.add_argument("--conv-kernel", type=int, default=4)
    p.add_argument("--threshold", type=float, default=0.005, help="FLA assert_close ratio")
    p.add_argument("--layer-threshold", type=float, default=0.01,
                   help="FLA's CI tolerance (FLA_CI_ENV: errors under 1%% pass)")
    p.add_argument(
        "--deltanet-precision",
        default=None,
        choices=["exact", "fast"],
        help="pass precision= to deltanet (default: not passed, the library's default)",
    )
    p.add_argument("--no-fla", action="store_true", help="skip FLA (CPU testing); checks are then skipped")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Numerics


def rel_l2(x, ref):
    """||x - ref|| / ||ref|| in float64 (equal to FLA's get_err_ratio(ref, x))."""
    import torch

    x = x.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(x - ref).item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def gated_delta_f64(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    **kwargs,
):
    """The gated delta rule as its definition, in float64, token by token.

    Per value head j (reading q/k head j // (HV/H), FLA's grouped value attention):
    S <- exp(g_t) S; u = beta_t (v_t - S^T k_t); S <- S + k_t u^T; o_t = S^T (scale q_t).
    Returns (o float64 [B, T, HV, V], final state float32 [B, HV, K, V] or None).
    """
    import torch

    bad = [name for name in UNSUPPORTED_FLAGS if kwargs.get(name)]
    if bad or cu_seqlens is not None:
        raise NotImplementedError(f"float64 reference: unsupported {bad or ['cu_seqlens']}")
    f64 = torch.float64
    q, k, v, g, beta = (x.to(f64) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        # FLA's l2norm: x / sqrt(sum x^2 + 1e-6) over the head dim.
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"HV={HV} is not a multiple of H={H}")
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    scale = K**-0.5 if scale is None else float(scale)
    q = q * scale
    if initial_state is None:
        S = torch.zeros(B, HV, K, V, dtype=f64, device=v.device)
    else:
        S = initial_state.to(f64).clone()
    decay = g.exp()
    o = torch.empty(B, T, HV, V, dtype=f64, device=v.device)
    for t in range(T):  # vectorised over batch and heads
        S.mul_(decay[:, t, :, None, None])
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S.add_(kt[..., :, None] * u[..., None, :])
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, (S.float() if output_final_state else None)


# ----------------------------------------------------------------------------------------------
# Routing the layer's chunk function


def describe(fn):
    """module.qualname of a callable, looking through transformers' hub-kernel wrapper."""
    if fn is None:
        return "None"
    code = getattr(fn, "__code__", None)
    if code is not None and "implementation" in code.co_freevars and fn.__closure__:
        # use_kernel_func_from_hub_with_fallback: the closure holds what it resolved to.
        impl = fn.__closure__[code.co_freevars.index("implementation")].cell_contents
        return f"hub wrapper -> {describe(impl)}"
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{mod}.{name}"


def chunk_call_sites(cls, module):
    """How the layer's forward reaches its chunk function: [(kind, name)], kind 'attr' or 'global'.

    Read from forward's source: ``self.X(`` is an instance attribute, a bare ``X(`` a global of
    the modeling module (looked up at call time, so replacing it there reroutes the call).
    """
    sites = []
    try:
        src = inspect.getsource(inspect.unwrap(cls.forward))
        for self_prefix, name in re.findall(r"(?<![\w.])(self\.)?(\w*chunk_gated_delta_rule)\s*\(", src):
            site = ("attr", name) if self_prefix else ("global", name)
            if site not in sites:
                sites.append(site)
    except (OSError, TypeError):
        pass
    if not sites:  # no source: fall back on the names transformers has used
        for name in ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"):
            if callable(getattr(module, name, None)):
                sites.append(("global", name))
    return sites


@contextlib.contextmanager
def routed(layer, module, sites, fn):
    """Within the block, every chunk call site of ``layer`` calls ``fn``."""
    saved = []
    try:
        for kind, name in sites:
            target = layer if kind == "attr" else module
            saved.append((target, name, target.__dict__.get(name, _MISSING)))
            setattr(target, name, fn)
        yield
    finally:
        for target, name, old in reversed(saved):
            if old is _MISSING:
                delattr(target, name)
            else:
                setattr(target, name, old)


_MISSING = object()


def summarize_call(args, kwargs):
    def one(x):
        shape = getattr(x, "shape", None)
        if shape is not None:
            return f"tensor{list(shape)} {str(x.dtype).replace('torch.', '')}"
        return repr(x)

    return {"positional": [one(a) for a in args], **{k: one(v) for k, v in kwargs.items()}}


class Capture:
    """A chunk function with FLA's signature that calls ``fn`` and keeps what it returned."""

    def __init__(self, name, fn, returns_f64=False):
        self.name, self.fn, self.returns_f64 = name, fn, returns_f64
        self.calls = 0
        self.call_summary = None
        self.o = None  # the chunk output the route computed (float64 for the reference)

    def __call__(self, q, k, v, *args, **kwargs):
        if self.call_summary is None:
            self.call_summary = summarize_call((q, k, v) + args, kwargs)
        o, final_state = self.fn(q, k, v, *args, **kwargs)
        self.calls += 1
        self.o = o.detach().clone()
        # The layer continues in v's dtype, as it does after FLA.
        return (o.to(v.dtype) if self.returns_f64 else o), final_state


# ----------------------------------------------------------------------------------------------


def versions():
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "triton", "transformers", "fla", "deltanet", "causal_conv1d", "kernels"):
        try:
            m = importlib.import_module(name)
            out[name] = getattr(m, "__version__", "?") + f" ({getattr(m, '__file__', '?')})"
        except Exception as e:  # absent packages are information, not failures
            out[name] = f"absent ({type(e).__name__})"
    return out


def build_layer(args, torch, cfg_cls, layer_cls, dtype):
    cfg = cfg_cls(
        hidden_size=args.hidden_size,
        num_hidden_layers=4,
        linear_num_key_heads=args.key_heads,
        linear_num_value_heads=args.value_heads,
        linear_key_head_dim=args.head_dim,
        linear_value_head_dim=args.head_dim,
        linear_conv_kernel_dim=args.conv_kernel,
    )
    idx = cfg.layer_types.index("linear_attention")
    torch.manual_seed(args.seed)
    # PyTorch's default init for the projections and conv; A_log and dt_bias as the layer's
    # __init__ sets them (as the model's _init_weights does too).
    layer = layer_cls(cfg, layer_idx=idx).to(device=args.device, dtype=dtype).eval()
    return cfg, idx, layer


def run(args):
    import torch

    dtype = getattr(torch, args.dtype)
    info = {"versions": versions()}
    print("versions:", *(f"  {k}: {v}" for k, v in info["versions"].items()), sep="\n")

    module = importlib.import_module(MODELING)
    layer_cls = getattr(module, LAYER_CLASS)
    cfg_cls = getattr(module, CONFIG_CLASS, None) or getattr(
        importlib.import_module(MODELING.replace("modeling_", "configuration_")), CONFIG_CLASS
    )
    cfg, idx, layer = build_layer(args, torch, cfg_cls, layer_cls, dtype)
    sites = chunk_call_sites(layer_cls, module)
    if not sites:
        raise RuntimeError(f"no chunk_gated_delta_rule call site found in {LAYER_CLASS}.forward")
    stock = {
        f"{kind}:{name}": describe(getattr(layer if kind == "attr" else module, name, None))
        for kind, name in sites
    }
    conv = describe(getattr(module, "causal_conv1d_fn", None))
    print(f"layer: {MODELING}.{LAYER_CLASS} (layer_idx {idx}, {args.dtype}, {args.device})")
    print(f"route: replace {', '.join(f'{k} {n!r}' for k, n in sites)}"
          f" ({'module global' if sites[0][0] == 'global' else 'instance attribute'})")
    print(f"stock chunk function: {stock}; causal_conv1d_fn: {conv}")
    info.update(
        layer=f"{MODELING}.{LAYER_CLASS}",
        layer_idx=idx,
        config={k: getattr(cfg, k) for k in (
            "hidden_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "hidden_act", "rms_norm_eps")},
        dtype=args.dtype,
        device=args.device,
        B=args.B,
        route_sites=[list(s) for s in sites],
        stock_chunk_function=stock,
        causal_conv1d_fn=conv,
        threshold=args.threshold,
        fla_disable_backend_dispatch=os.environ.get("FLA_DISABLE_BACKEND_DISPATCH"),
        threshold_rule="FLA assert_close: get_err_ratio = RMSE(diff)/RMSE(ref) < ratio",
    )

    import deltanet

    dn_kwargs = {} if args.deltanet_precision is None else {"precision": args.deltanet_precision}

    def deltanet_fn(*a, **kw):
        return deltanet.chunk_gated_delta_rule(*a, **kw, **dn_kwargs)

    routes = {"deltanet": deltanet_fn, "f64": gated_delta_f64}
    if not args.no_fla:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

        routes = {"fla": fla_chunk, **routes}
    hf_torch = getattr(module, "torch_chunk_gated_delta_rule", None)
    if hf_torch is not None:
        routes["hf_torch"] = inspect.unwrap(hf_torch)  # the pure-torch path under the hub wrapper

    results, all_pass, printed_kwargs = [], True, False
    for T in [int(t) for t in args.T.split(",") if t.strip()]:
        gen = torch.Generator(device="cpu").manual_seed(args.seed + T)
        x = torch.randn(args.B, T, cfg.hidden_size, generator=gen).to(args.device, dtype)
        out, core, seconds = {}, {}, {}
        with torch.no_grad():
            for name, fn in routes.items():
                cap = Capture(name, fn, returns_f64=(name == "f64"))
                with routed(layer, module, sites, cap):
                    t0 = time.perf_counter()
                    out[name] = layer(x)
                    if args.device.startswith("cuda"):
                        torch.cuda.synchronize()
                    seconds[name] = time.perf_counter() - t0
                if cap.calls != 1:
                    raise RuntimeError(f"route {name}: chunk function called {cap.calls} times, expected 1")
                core[name] = cap.o
                if not printed_kwargs:
                    print("the layer calls its chunk function with:", json.dumps(cap.call_summary))
                    info["layer_call"] = cap.call_summary
                    printed_kwargs = True
            if not args.no_fla:
                out["stock"] = layer(x)  # the layer as transformers set it up

        def err(a, b, d):
            return rel_l2(d[a], d[b]) if a in d and b in d else None

        e = {
            "layer_deltanet_vs_fla": err("deltanet", "fla", out),
            "layer_deltanet_vs_f64": err("deltanet", "f64", out),
            "layer_fla_vs_f64": err("fla", "f64", out),
            "layer_hf_torch_vs_f64": err("hf_torch", "f64", out),
            "layer_stock_vs_fla": err("stock", "fla", out),
            "core_deltanet_vs_f64": err("deltanet", "f64", core),
            "core_fla_vs_f64": err("fla", "f64", core),
            "core_deltanet_vs_fla": err("deltanet", "fla", core),
            "core_hf_torch_vs_f64": err("hf_torch", "f64", core),
            # The floor: the float64 o rounded once to the layer's dtype.
            "core_f64_in_dtype_vs_f64": rel_l2(core["f64"].to(dtype), core["f64"]),
        }
        e = {k: v for k, v in e.items() if v is not None}
        finite = all(torch.isfinite(o.float()).all().item() for o in out.values())
        checks = {}
        if not args.no_fla:
            checks["core_deltanet_vs_fla_within_threshold"] = finite and e["core_deltanet_vs_fla"] <= args.threshold
            checks["layer_deltanet_vs_fla_within_layer_threshold"] = (
                finite and e["layer_deltanet_vs_fla"] <= args.layer_threshold)
            checks["deltanet_closer_to_f64_than_fla"] = finite and (
                e["layer_deltanet_vs_f64"] < e["layer_fla_vs_f64"]
                and e["core_deltanet_vs_f64"] < e["core_fla_vs_f64"])
            all_pass &= all(checks.values())
        results.append({"T": T, "errors": e, "all_finite": finite, "checks": checks,
                        "seconds": {k: round(v, 4) for k, v in seconds.items()}})

        print(f"\nB={args.B} T={T}: relative L2 error ||x - ref|| / ||ref||" + ("" if finite else "  NON-FINITE OUTPUT"))
        for k, v in e.items():
            print(f"  {k:<26} {v:.3e}")
        if checks:
            c1, c2, c3 = checks.values()
            strict = e["layer_deltanet_vs_fla"] <= args.threshold
            print(f"  [{'PASS' if c1 else 'FAIL'}] deltanet vs FLA chunk output "
                  f"{e['core_deltanet_vs_fla']:.3e} <= {args.threshold}")
            print(f"  [{'PASS' if c2 else 'FAIL'}] deltanet vs FLA layer output "
                  f"{e['layer_deltanet_vs_fla']:.3e} <= {args.layer_threshold} "
                  f"({'also' if strict else 'not'} <= {args.threshold}; FLA vs float64 layer "
                  f"{e['layer_fla_vs_f64']:.3e})")
            print(f"  [{'PASS' if c3 else 'FAIL'}] deltanet closer to float64 than FLA: layer "
                  f"{e['layer_deltanet_vs_f64']:.3e} < {e['layer_fla_vs_f64']:.3e}, chunk output "
                  f"{e['core_deltanet_vs_f64']:.3e} < {e['core_fla_vs_f64']:.3e}")

    info["results"] = results
    info["pass"] = bool(all_pass) if not args.no_fla else None
    verdict = "SKIPPED (--no-fla)" if args.no_fla else ("PASS" if all_pass else "FAIL")
    print(f"\noverall: {verdict}")
    return info, (0 if all_pass else 1)


def main(argv=None):
    args = parse_args(argv)
    try:
        info, rc = run(args)
    except Exception:
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        print("overall: ERROR")
        info, rc = {"error": tb, "pass": False}, 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=2, default=str)
    return rc


if __name__ == "__main__":
    sys.exit(main())
