// w = A_inv (beta e^gamma k), u = A_inv (beta v). One block per (chunk, value head): the
// coefficients A_inv[i, l] beta_l (e^gamma_l), l <= i, are staged in shared memory, then each
// thread produces output elements (i, d) from rows l <= i only.
struct WyParams {
    const float* k;     // [B, T, H, K]
    const float* v;     // [B, T, HV, V]
    const float* beta;  // [B, T, HV], effective
    GammaIn gm;
    const float* a_inv;  // [B, T, HV, BT]
    float* w;            // [B, T, HV, K]
    float* u;            // [B, T, HV, V]
    Chunks chunks;
    Shape s;
};
static_assert(sizeof(WyParams) == PARAMS_BYTES, "WyParams differs from its Rust mirror");

extern "C" __global__ void recompute_w_u(const WyParams P) {
    const float* __restrict__ k = P.k;
    const float* __restrict__ v = P.v;
    const float* __restrict__ beta = P.beta;
    GAMMA_LOCALS(P.gm);
    const float* __restrict__ a_inv = P.a_inv;
    float* __restrict__ w = P.w;
    float* __restrict__ u = P.u;
    const i64 h = P.s.heads, hv = P.s.hv, dk = P.s.dk, dv = P.s.dv;
    __shared__ float cw[BT][BT + 1];
    __shared__ float cu[BT][BT + 1];
    BLOCK_LOOP(item, P.chunks.count * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        const i64 start = P.chunks.start[c], n = P.chunks.len[c];
        __syncthreads();
        for (i64 e = threadIdx.x; e < n * n; e += blockDim.x) {
            const i64 i = e / n, l = e % n;
            if (l > i) continue;
            const i64 t = (start + l) * hv + j;
            const float ab = a_inv[((start + i) * hv + j) * BT + l] * beta[t];
            cw[i][l] = ab * decay0(gamma[t], lo[t], seg[t]);
            cu[i][l] = ab;
        }
        __syncthreads();
        for (i64 e = threadIdx.x; e < n * dk; e += blockDim.x) {
            const i64 i = e / dk, d = e % dk;
            float acc = 0.0f;
            for (i64 l = 0; l <= i; ++l) acc = fmaf(cw[i][l], k[((start + l) * h + kh) * dk + d], acc);
            w[((start + i) * hv + j) * dk + d] = acc;
        }
        for (i64 e = threadIdx.x; e < n * dv; e += blockDim.x) {
            const i64 i = e / dv, d = e % dv;
            float acc = 0.0f;
            for (i64 l = 0; l <= i; ++l) acc = fmaf(cu[i][l], v[((start + l) * hv + j) * dv + d], acc);
            u[((start + i) * hv + j) * dv + d] = acc;
        }
    }
}
