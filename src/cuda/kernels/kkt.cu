// A_strict[i, l] = beta_i (k_i . k_l) exp(gamma_i - gamma_l) for l < i within a chunk, on layout
// [B, T, HV, BT]. One block per (chunk, value head); the output arrives zeroed, so entries on and
// above the diagonal and past a short chunk are left alone.
extern "C" __global__ void chunk_scaled_dot_kkt(
    const float* __restrict__ k, const float* __restrict__ beta, const float* __restrict__ gamma,
    const float* __restrict__ seg, float* __restrict__ a, const i64* __restrict__ chunk_start,
    const i64* __restrict__ chunk_len, i64 chunks, i64 h, i64 hv, i64 dk, int tiled) {
    BLOCK_LOOP(item, chunks * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, tiled);
        const i64 start = chunk_start[c], len = chunk_len[c];
        for (i64 e = threadIdx.x; e < len * len; e += blockDim.x) {
            const i64 r = e / len, col = e % len;
            if (col >= r) continue;
            const float* kr = k + ((start + r) * h + kh) * dk;
            const float* kc = k + ((start + col) * h + kh) * dk;
            float dot = 0.0f;
            for (i64 d = 0; d < dk; ++d) dot = fmaf(kr[d], kc[d], dot);
            const i64 tr = (start + r) * hv + j, tc = (start + col) * hv + j;
            a[tr * BT + col] = beta[tr] * dot * decay(gamma[tr], seg[tr], gamma[tc], seg[tc]);
        }
    }
}
