// A_strict[i, l] = beta_i (k_i . k_l) exp(gamma_i - gamma_l) for l < i within a chunk, on layout
// [B, T, HV, BT]. One block of THREADS threads per (chunk, value head): the chunk's k rows pass
// through shared memory in slices of DT dimensions (coalesced loads), and each thread keeps the
// dot products of its EPT entries of the BT x BT block in registers. The output arrives zeroed,
// so entries on and above the diagonal and past a short chunk are left alone. BT and THREADS
// come from the registry.
#define DT 32
#define EPT ((BT * BT + THREADS - 1) / THREADS)

struct KktParams {
    const float* k;     // [B, T, H, K]
    const float* beta;  // [B, T, HV], effective
    GammaIn gm;
    float* a_strict;  // [B, T, HV, BT], zeroed
    Chunks chunks;
    Shape s;  // dv unused
};
static_assert(sizeof(KktParams) == PARAMS_BYTES, "KktParams differs from its Rust mirror");

extern "C" __global__ void __launch_bounds__(THREADS) chunk_scaled_dot_kkt(const KktParams P) {
    const float* __restrict__ k = P.k;
    const float* __restrict__ beta = P.beta;
    GAMMA_LOCALS(P.gm);
    float* __restrict__ a = P.a_strict;
    const i64 h = P.s.heads, hv = P.s.hv, dk = P.s.dk;
    __shared__ float ks[BT][DT + 1];
    BLOCK_LOOP(item, P.chunks.count * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        const i64 start = P.chunks.start[c], n = P.chunks.len[c];
        float acc[EPT];
#pragma unroll
        for (int m = 0; m < EPT; ++m) acc[m] = 0.0f;
        for (i64 d0 = 0; d0 < dk; d0 += DT) {
            __syncthreads();
            for (int e = threadIdx.x; e < BT * DT; e += THREADS) {
                const int i = e / DT, dd = e % DT;
                ks[i][dd] = i < n && d0 + dd < dk ? k[((start + i) * h + kh) * dk + d0 + dd] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int m = 0; m < EPT; ++m) {
                const int e = threadIdx.x + m * THREADS;
                if (e >= BT * BT) break;
                const int r = e / BT, col = e % BT;
#pragma unroll 8
                for (int dd = 0; dd < DT; ++dd) acc[m] = fmaf(ks[r][dd], ks[col][dd], acc[m]);
            }
        }
        // Entries with col >= r hold products with later tokens: they are skipped, never scaled
        // by zero, so a non-finite later token cannot reach an earlier row.
#pragma unroll
        for (int m = 0; m < EPT; ++m) {
            const int e = threadIdx.x + m * THREADS;
            if (e >= BT * BT) break;
            const i64 r = e / BT, col = e % BT;
            if (r >= n || col >= r) continue;
            const i64 tr = (start + r) * hv + j, tc = (start + col) * hv + j;
            a[tr * BT + col] = beta[tr] * acc[m] * decay(gamma[tr], lo[tr], seg[tr], gamma[tc], lo[tc], seg[tc]);
        }
    }
}
