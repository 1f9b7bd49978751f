"""FlashQLA's forward at B=1 T=32768 H=16 HV=32 K=V=128 (bf16) with three kinds of gate: the
anchors' (g = logsigmoid(U(0, 1)), about -32 a chunk of 64), slow ones (g = -0.001 a token, as
Qwen3-Next's slowest heads: -0.064 a chunk) and half the heads of each; medians by
triton.testing.do_bench, then a per-kernel breakdown (torch.profiler) of the first two. Our
kernels do the same work whatever the gates are; FlashQLA's segment warm-up does not."""
import sys
import torch
import torch.nn.functional as F
from triton.testing import do_bench
from flash_qla import chunk_gated_delta_rule as chunk

B, T, H, HV, K, V = 1, 32768, 16, 32, 128, 128
dev = "cuda"
gen = torch.Generator(device=dev).manual_seed(0)
q = torch.randn(B, T, H, K, device=dev, generator=gen, dtype=torch.bfloat16)
k = F.normalize(torch.randn(B, T, H, K, device=dev, generator=gen), dim=-1).bfloat16()
v = torch.randn(B, T, HV, V, device=dev, generator=gen, dtype=torch.bfloat16)
beta = torch.rand(B, T, HV, device=dev, generator=gen).sigmoid()
fast_g = F.logsigmoid(torch.rand(B, T, HV, device=dev, generator=gen))
slow_g = torch.full((B, T, HV), -0.001, device=dev)
mixed_g = fast_g.clone()
mixed_g[:, :, ::2] = -0.001
gates = {"anchor": fast_g, "slow": slow_g, "mixed": mixed_g}
outs = {}
for name, g in gates.items():
    fn = lambda: chunk(q, k, v, g, beta, output_final_state=True)
    o, s = fn()
    torch.cuda.synchronize()
    outs[name] = (o.float(), s.float())
    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    print(f"flashqla gates={name} T={T}: {ms:.3f} ms", flush=True)
for name in ["anchor", "slow"]:
    g = gates[name]
    fn = lambda: chunk(q, k, v, g, beta, output_final_state=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    print(f"== kernels, gates={name} (5 forwards)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
