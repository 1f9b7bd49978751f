// gamma = cumsum(g) within each chunk, restarted after every hard reset (g < reset); lo is the
// running sum's rounding error (TwoSum), seg counts the resets. One thread per (chunk, value head).
struct CumsumParams {
    const float* g;  // [B, T, HV], the effective gate
    float* gamma;    // [B, T, HV]
    float* lo;       // [B, T, HV]
    float* seg;      // [B, T, HV]
    Chunks chunks;
    i64 hv;
    float reset;  // RESET_LOG_DECAY
};
static_assert(sizeof(CumsumParams) == PARAMS_BYTES, "CumsumParams differs from its Rust mirror");

extern "C" __global__ void chunk_local_cumsum(const CumsumParams P) {
    const float* __restrict__ g = P.g;
    float* __restrict__ gamma = P.gamma;
    float* __restrict__ lo = P.lo;
    float* __restrict__ seg = P.seg;
    const i64 hv = P.hv;
    for (i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x; item < P.chunks.count * hv;
         item += (i64)gridDim.x * blockDim.x) {
        const i64 c = item / hv, j = item % hv;
        const i64 start = P.chunks.start[c], len = P.chunks.len[c];
        float acc = 0.0f, err = 0.0f, resets = 0.0f;
        for (i64 i = 0; i < len; ++i) {
            const i64 t = (start + i) * hv + j;
            cumsum_step(g[t], P.reset, acc, err, resets);
            gamma[t] = acc;
            lo[t] = err;
            seg[t] = resets;
        }
    }
}
