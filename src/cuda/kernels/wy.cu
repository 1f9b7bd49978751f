// w = A_inv (beta e^gamma k), u = A_inv (beta v). One block per (chunk, value head): the
// coefficients A_inv[i, l] beta_l (e^gamma_l) are staged in shared memory, then each thread
// produces output elements (i, d).
extern "C" __global__ void recompute_w_u(
    const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ beta,
    const float* __restrict__ gamma, const float* __restrict__ lo, const float* __restrict__ seg,
    const float* __restrict__ a_inv, float* __restrict__ w, float* __restrict__ u,
    const i64* __restrict__ chunk_start, const i64* __restrict__ chunk_len, i64 chunks, i64 h,
    i64 hv, i64 dk, i64 dv, int tiled) {
    __shared__ float cw[BT][BT + 1];
    __shared__ float cu[BT][BT + 1];
    BLOCK_LOOP(item, chunks * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, tiled);
        const i64 start = chunk_start[c], n = chunk_len[c];
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
