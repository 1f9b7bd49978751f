"""FLA's fused_recurrent decode step beside deltanet's bench: N sequences, T tokens, HV=32, H=16,
K=V=128, bf16 q/k/v/beta, f32 g, f32 state, l2norm of q and k in the kernel (as deltanet's bench).
Medians of CUDA-event timings (triton do_bench)."""
import json, sys, os
os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"
import torch, torch.nn.functional as F
from triton.testing import do_bench
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fr
dev = "cuda"
gen = torch.Generator(device=dev).manual_seed(0)
rows = []
for N, T in [(1, 1), (256, 1), (64, 1), (64, 4)]:
    H, HV, K, V = 16, 32, 128, 128
    q = torch.randn(N, T, H, K, device=dev, generator=gen).bfloat16()
    k = torch.randn(N, T, H, K, device=dev, generator=gen).bfloat16()
    v = torch.randn(N, T, HV, V, device=dev, generator=gen).bfloat16()
    g = F.logsigmoid(torch.rand(N, T, HV, device=dev, generator=gen))
    beta = torch.rand(N, T, HV, device=dev, generator=gen).sigmoid().bfloat16()
    h0 = torch.randn(N, HV, K, V, device=dev, generator=gen)
    fn = lambda: fr(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    fn(); torch.cuda.synchronize()
    ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
    rows.append(dict(impl="fla", N=N, T=T, ms=ms, state_TB_s=2 * h0.numel() * 4 / ms / 1e9))
    print(rows[-1], flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
