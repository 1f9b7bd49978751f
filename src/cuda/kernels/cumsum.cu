// gamma = cumsum(g) within each chunk, restarted after every hard reset (g < reset); lo is the
// running sum's rounding error (TwoSum), seg counts the resets. One thread per (chunk, value head).
extern "C" __global__ void chunk_local_cumsum(const float* __restrict__ g,
                                              float* __restrict__ gamma, float* __restrict__ lo,
                                              float* __restrict__ seg,
                                              const i64* __restrict__ chunk_start,
                                              const i64* __restrict__ chunk_len, i64 chunks,
                                              i64 hv, float reset) {
    for (i64 item = (i64)blockIdx.x * blockDim.x + threadIdx.x; item < chunks * hv;
         item += (i64)gridDim.x * blockDim.x) {
        const i64 c = item / hv, j = item % hv;
        const i64 start = chunk_start[c], len = chunk_len[c];
        float acc = 0.0f, err = 0.0f, resets = 0.0f;
        for (i64 i = 0; i < len; ++i) {
            const i64 t = (start + i) * hv + j;
            const float x = g[t];
            if (x < reset) {
                acc = 0.0f;
                err = 0.0f;
                resets += 1.0f;
            } else {
                // TwoSum: exactly what rounding acc + x lost (plain adds: nothing reassociates
                // them without fast math).
                const float s = acc + x, b = s - acc;
                err += (acc - (s - b)) + (x - b);
                acc = s;
            }
            gamma[t] = acc;
            lo[t] = err;
            seg[t] = resets;
        }
    }
}
