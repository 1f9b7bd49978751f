// o_i = scale (e^gamma_i q_i^T h + sum_{l <= i} e^(gamma_i - gamma_l) (q_i . k_l) v_new_l), h the
// state entering the chunk. One block per (chunk, value head): the masked, decayed q k^T block is
// staged in shared memory, then each thread produces output elements (i, c).
extern "C" __global__ void chunk_output(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v_new,
    const float* __restrict__ hs, const float* __restrict__ gamma,
    const float* __restrict__ seg, float* __restrict__ o, const i64* __restrict__ chunk_start,
    const i64* __restrict__ chunk_len, i64 chunks, i64 h, i64 hv, i64 dk, i64 dv, float scale,
    int tiled) {
    __shared__ float p[BT][BT + 1];
    __shared__ float d0[BT];
    BLOCK_LOOP(item, chunks * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, tiled);
        const i64 start = chunk_start[c], n = chunk_len[c];
        __syncthreads();
        for (i64 e = threadIdx.x; e < n * n; e += blockDim.x) {
            const i64 i = e / n, l = e % n;
            if (l > i) continue;
            const i64 ti = (start + i) * hv + j, tl = (start + l) * hv + j;
            const float d = decay(gamma[ti], seg[ti], gamma[tl], seg[tl]);
            float dot = 0.0f;
            if (d != 0.0f) {
                const float* qi = q + ((start + i) * h + kh) * dk;
                const float* kl = k + ((start + l) * h + kh) * dk;
                for (i64 r = 0; r < dk; ++r) dot = fmaf(qi[r], kl[r], dot);
            }
            p[i][l] = d * dot;
        }
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
            const i64 ti = (start + i) * hv + j;
            d0[i] = decay0(gamma[ti], seg[ti]);
        }
        __syncthreads();
        const float* state = hs + (c * hv + j) * dk * dv;
        for (i64 e = threadIdx.x; e < n * dv; e += blockDim.x) {
            const i64 i = e / dv, cc = e % dv;
            float acc = 0.0f;
            const float di = d0[i];
            if (di != 0.0f) {
                const float* qi = q + ((start + i) * h + kh) * dk;
                for (i64 r = 0; r < dk; ++r) acc = fmaf(di * qi[r], state[r * dv + cc], acc);
            }
            for (i64 l = 0; l <= i; ++l)
                acc = fmaf(p[i][l], v_new[((start + l) * hv + j) * dv + cc], acc);
            o[((start + i) * hv + j) * dv + cc] = acc * scale;
        }
    }
}
