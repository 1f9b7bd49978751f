// FLA's softplus: ln(1 + e^x), the identity above 20 where the two agree in f32.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The effective gate and beta, one thread per (token, value head).
extern "C" __global__ void gate(const float* __restrict__ g, const float* __restrict__ beta,
                                const float* __restrict__ a_log,
                                const float* __restrict__ dt_bias, float* __restrict__ g_out,
                                float* __restrict__ beta_out, i64 n, i64 hv, int gate_in_kernel,
                                int beta_is_logits, float beta_mult) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 j = i % hv;
        g_out[i] = gate_in_kernel ? -expf(a_log[j]) * softplus(g[i] + dt_bias[j]) : g[i];
        beta_out[i] = beta_is_logits ? beta_mult / (1.0f + expf(-beta[i])) : beta[i];
    }
}
