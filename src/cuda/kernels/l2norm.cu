// x / sqrt(sum x^2 + 1e-6) over each row of `dim` elements: one warp per row.
struct L2normParams {
    const float* x;  // [rows, dim]
    float* y;        // [rows, dim]
    i64 rows;
    i64 dim;
};
static_assert(sizeof(L2normParams) == PARAMS_BYTES, "L2normParams differs from its Rust mirror");

extern "C" __global__ void l2norm(const L2normParams P) {
    const float* __restrict__ x = P.x;
    float* __restrict__ y = P.y;
    const i64 rows = P.rows, dim = P.dim;
    const i64 warps = blockDim.x / 32;
    const int lane = threadIdx.x & 31;
    for (i64 row = (i64)blockIdx.x * warps + threadIdx.x / 32; row < rows;
         row += (i64)gridDim.x * warps) {
        const float* xr = x + row * dim;
        float s = 0.0f;
        for (i64 d = lane; d < dim; d += 32) s = fmaf(xr[d], xr[d], s);
        s = warp_sum(s);
        const float inv = 1.0f / sqrtf(s + 1e-6f);
        for (i64 d = lane; d < dim; d += 32) y[row * dim + d] = xr[d] * inv;
    }
}
