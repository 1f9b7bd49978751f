// FLA's softplus: ln(1 + e^x), the identity above 20 where the two agree in f32.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

struct GateParams {
    const float* g;        // [n]
    const float* beta;     // [n]
    const float* a_log;    // [hv], read only with gate_in_kernel (null otherwise)
    const float* dt_bias;  // [hv], read only with gate_in_kernel (null otherwise)
    float* g_out;          // [n]
    float* beta_out;       // [n]
    i64 n;                 // tokens * hv
    i64 hv;
    int gate_in_kernel;
    int beta_is_logits;
    float beta_mult;  // 2 with allow_neg_eigval, else 1
};
static_assert(sizeof(GateParams) == PARAMS_BYTES, "GateParams differs from its Rust mirror");

// The effective gate and beta, one thread per (token, value head).
extern "C" __global__ void gate(const GateParams P) {
    const float* __restrict__ g = P.g;
    const float* __restrict__ beta = P.beta;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < P.n;
         i += (i64)gridDim.x * blockDim.x) {
        const i64 j = i % P.hv;
        P.g_out[i] = P.gate_in_kernel ? -expf(P.a_log[j]) * softplus(g[i] + P.dt_bias[j]) : g[i];
        P.beta_out[i] = P.beta_is_logits ? P.beta_mult / (1.0f + expf(-beta[i])) : beta[i];
    }
}
