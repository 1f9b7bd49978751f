// A_inv = (I + A_strict)^-1 for every chunk block of layout [B, T, HV, BT] (row stride HV * BT).
// Column col of the inverse solves (I + A_strict) x = e_col by forward substitution and depends
// on no other column, so each thread owns whole columns and no synchronisation is needed between
// rows. Row i reads only rows l < i, so a non-finite row never reaches an earlier one. The output
// arrives zeroed: entries above the diagonal and past a short chunk stay zero.
struct SolveTrilParams {
    const float* a_strict;  // [B, T, HV, BT]
    float* a_inv;           // [B, T, HV, BT], zeroed
    Chunks chunks;
    i64 hv;
};
static_assert(sizeof(SolveTrilParams) == PARAMS_BYTES, "SolveTrilParams differs from its Rust mirror");

extern "C" __global__ void solve_tril(const SolveTrilParams P) {
    const float* __restrict__ a_strict = P.a_strict;
    float* __restrict__ a_inv = P.a_inv;
    const i64 hv = P.hv;
    __shared__ float as[BT][BT + 1];
    __shared__ float x[BT][BT + 1];
    BLOCK_LOOP(item, P.chunks.count * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 start = P.chunks.start[c], n = P.chunks.len[c];
        __syncthreads();
        for (i64 e = threadIdx.x; e < n * n; e += blockDim.x) {
            const i64 i = e / n, l = e % n;
            as[i][l] = l < i ? a_strict[((start + i) * hv + j) * BT + l] : 0.0f;
        }
        __syncthreads();
        for (i64 col = threadIdx.x; col < n; col += blockDim.x) {
            for (i64 i = col; i < n; ++i) {
                float v = i == col ? 1.0f : 0.0f;
                for (i64 l = col; l < i; ++l) v = fmaf(-as[i][l], x[l][col], v);
                x[i][col] = v;
                a_inv[((start + i) * hv + j) * BT + col] = v;
            }
        }
    }
}
