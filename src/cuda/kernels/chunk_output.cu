// o_i = scale (e^gamma_i q_i^T h + sum_{l <= i} e^(gamma_i - gamma_l) (q_i . k_l) v_new_l), h the
// state entering the chunk. One block of THREADS threads per (chunk, value head):
// 1. the masked, decayed q k^T block goes to shared memory; q and k rows pass through shared
//    memory in slices of DT dimensions and each thread keeps EPT dot products in registers;
// 2. each thread produces RPT rows (i, i + R, ...) of one output column, so every element of h
//    and v_new it loads serves RPT outputs.
// Terms of later tokens (l > i) are skipped, never multiplied by a zero: a non-finite value at
// token l must not reach the outputs of tokens before it. BT and THREADS come from the registry.
// The loops' inputs (q, k, h, v_new) are read through __ldg, the read-only data path: pointers
// taken from the params struct carry no noalias guarantee, and the stores to o inside the loops
// would otherwise keep the compiler from using it.
#define DT 32
#define EPT ((BT * BT + THREADS - 1) / THREADS)
#define RPT 4

struct ChunkOutputParams {
    const float* q;      // [B, T, H, K]
    const float* k;      // [B, T, H, K]
    const float* v_new;  // [B, T, HV, V]
    const float* h;      // [chunks, HV, K, V], the state entering each chunk
    GammaIn gm;
    float* o;  // [B, T, HV, V]
    Chunks chunks;
    Shape s;
    float scale;
};
static_assert(sizeof(ChunkOutputParams) == PARAMS_BYTES, "ChunkOutputParams differs from its Rust mirror");

extern "C" __global__ void __launch_bounds__(THREADS) chunk_output(const ChunkOutputParams P) {
    const float* __restrict__ q = P.q;
    const float* __restrict__ k = P.k;
    const float* __restrict__ v_new = P.v_new;
    const float* __restrict__ hs = P.h;
    GAMMA_LOCALS(P.gm);
    float* __restrict__ o = P.o;
    const i64 h = P.s.heads, hv = P.s.hv, dk = P.s.dk, dv = P.s.dv;
    __shared__ float qs[BT][DT + 1];
    __shared__ float ks[BT][DT + 1];
    __shared__ float p[BT][BT + 1];
    __shared__ float d0[BT];
    BLOCK_LOOP(item, P.chunks.count * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        const i64 start = P.chunks.start[c], n = P.chunks.len[c];
        float acc[EPT];
#pragma unroll
        for (int m = 0; m < EPT; ++m) acc[m] = 0.0f;
        for (i64 b0 = 0; b0 < dk; b0 += DT) {
            __syncthreads();
            for (int e = threadIdx.x; e < BT * DT; e += THREADS) {
                const int i = e / DT, dd = e % DT;
                const bool in = i < n && b0 + dd < dk;
                const i64 at = ((start + i) * h + kh) * dk + b0 + dd;
                qs[i][dd] = in ? __ldg(&q[at]) : 0.0f;
                ks[i][dd] = in ? __ldg(&k[at]) : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int m = 0; m < EPT; ++m) {
                const int e = threadIdx.x + m * THREADS;
                if (e >= BT * BT) break;
                const int r = e / BT, col = e % BT;
#pragma unroll 8
                for (int dd = 0; dd < DT; ++dd) acc[m] = fmaf(qs[r][dd], ks[col][dd], acc[m]);
            }
        }
#pragma unroll
        for (int m = 0; m < EPT; ++m) {
            const int e = threadIdx.x + m * THREADS;
            if (e >= BT * BT) break;
            const i64 i = e / BT, l = e % BT;
            float x = 0.0f;
            if (i < n && l <= i) {
                const i64 ti = (start + i) * hv + j, tl = (start + l) * hv + j;
                x = decay(gamma[ti], lo[ti], seg[ti], gamma[tl], lo[tl], seg[tl]) * acc[m];
            }
            p[i][l] = x;
        }
        for (i64 i = threadIdx.x; i < n; i += THREADS) {
            const i64 ti = (start + i) * hv + j;
            d0[i] = decay0(gamma[ti], lo[ti], seg[ti]);
        }
        __syncthreads();
        const float* state = hs + (c * hv + j) * dk * dv;
        const i64 rows = (n + RPT - 1) / RPT;  // the row stride between a thread's rows
        for (i64 e = threadIdx.x; e < rows * dv; e += THREADS) {
            const i64 i0 = e / dv, cc = e % dv;
            float out[RPT];
            const float* qi[RPT];
            float di[RPT];
#pragma unroll
            for (int m = 0; m < RPT; ++m) {
                const i64 i = i0 + m * rows;
                out[m] = 0.0f;
                di[m] = i < n ? d0[i] : 0.0f;
                qi[m] = q + ((start + (i < n ? i : 0)) * h + kh) * dk;
            }
            for (i64 r = 0; r < dk; ++r) {
                const float s = __ldg(&state[r * dv + cc]);
#pragma unroll
                for (int m = 0; m < RPT; ++m) out[m] = fmaf(di[m] * __ldg(&qi[m][r]), s, out[m]);
            }
            const i64 last = i0 + (RPT - 1) * rows < n ? i0 + (RPT - 1) * rows : n - 1;
            for (i64 l = 0; l <= last; ++l) {
                const float x = __ldg(&v_new[((start + l) * hv + j) * dv + cc]);
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    // Only l <= i: v_new of a later token is skipped, not multiplied by p = 0.
                    const i64 i = i0 + m * rows;
                    if (i < n && l <= i) out[m] = fmaf(p[i][l], x, out[m]);
                }
            }
#pragma unroll
            for (int m = 0; m < RPT; ++m) {
                const i64 i = i0 + m * rows;
                if (i < n) o[((start + i) * hv + j) * dv + cc] = out[m] * P.scale;
            }
        }
    }
}
