// The sequential pass over each sequence's chunks. Column c of the state evolves on its own (it
// needs only column c of v_new), so one block owns a tile of `vt` state columns of one
// (sequence, value head) and walks its chunks in order, the tile in shared memory:
//   h[chunk] = S;  v_new = u - w S;  S = e^gamma_last S + k^T (e^(gamma_last - gamma) v_new).
// Dynamic shared memory: S [dk][vt], v_new tile [BT][vt], decays [BT], and with `staged` the
// chunk's w and k rows [BT][dk] each, loaded once per chunk with coalesced reads so that the
// serial loops below read shared memory rather than wait on global loads.
struct ChunkStateParams {
    const float* k;  // [B, T, H, K]
    const float* w;  // [B, T, HV, K]
    const float* u;  // [B, T, HV, V]
    GammaIn gm;
    // [N, HV, K, V]; null means zero states. It may be final_state itself: each block reads its
    // tile of h0 before it writes the same tile of final_state, and no other block touches it
    // (so neither pointer is __restrict__).
    const float* h0;
    float* h;            // [chunks, HV, K, V], the state entering each chunk
    float* v_new;        // [B, T, HV, V]
    float* final_state;  // [N, HV, K, V]
    Chunks chunks;
    const i64* seq_first_chunk;  // [N + 1]
    Shape s;
    i64 seqs;
    i64 vt;      // state columns per block
    int staged;  // the chunk's w and k rows are staged in shared memory
};
static_assert(sizeof(ChunkStateParams) == PARAMS_BYTES, "ChunkStateParams differs from its Rust mirror");

extern "C" __global__ void chunk_state(const ChunkStateParams P) {
    const float* __restrict__ k = P.k;
    const float* __restrict__ w = P.w;
    const float* __restrict__ u = P.u;
    GAMMA_LOCALS(P.gm);
    float* __restrict__ h_out = P.h;
    float* __restrict__ v_new = P.v_new;
    const float* h0 = P.h0;
    float* final_state = P.final_state;
    const i64* __restrict__ chunk_start = P.chunks.start;
    const i64* __restrict__ chunk_len = P.chunks.len;
    const i64 h = P.s.heads, hv = P.s.hv, dk = P.s.dk, dv = P.s.dv, vt = P.vt;
    extern __shared__ float smem[];
    float* s = smem;                 // [dk][vt]
    float* vn = s + dk * vt;         // [BT][vt]
    float* dl = vn + BT * vt;        // [BT]
    float* ws = dl + BT;             // [BT][dk], with staged
    float* kc = ws + BT * dk;        // [BT][dk], with staged
    const i64 tiles = (dv + vt - 1) / vt;
    const i64 kv = dk * dv;
    BLOCK_LOOP(item, P.seqs * hv * tiles) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, n = rest / hv;
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        const i64 c0 = tile * vt;
        const i64 cw = dv - c0 < vt ? dv - c0 : vt;
        __syncthreads();
        for (i64 e = threadIdx.x; e < dk * cw; e += blockDim.x) {
            const i64 r = e / cw, cc = e % cw;
            s[r * vt + cc] = h0 ? h0[(n * hv + j) * kv + r * dv + c0 + cc] : 0.0f;
        }
        for (i64 ci = P.seq_first_chunk[n]; ci < P.seq_first_chunk[n + 1]; ++ci) {
            const i64 start = chunk_start[ci], len = chunk_len[ci];
            const i64 last = (start + len - 1) * hv + j;
            const float g_last = gamma[last], l_last = lo[last], s_last = seg[last];
            // Row i of w is w_rows + i * w_stride, row i of k is k_rows + i * k_stride.
            const float* w_rows = w + (start * hv + j) * dk;
            const float* k_rows = k + (start * h + kh) * dk;
            i64 w_stride = hv * dk, k_stride = h * dk;
            if (P.staged) {
                for (i64 e = threadIdx.x; e < len * dk; e += blockDim.x) {
                    const i64 i = e / dk, r = e % dk;
                    ws[e] = w_rows[i * w_stride + r];
                    kc[e] = k_rows[i * k_stride + r];
                }
                w_rows = ws;
                k_rows = kc;
                w_stride = dk;
                k_stride = dk;
            }
            for (i64 i = threadIdx.x; i < len; i += blockDim.x) {
                const i64 t = (start + i) * hv + j;
                dl[i] = decay(g_last, l_last, s_last, gamma[t], lo[t], seg[t]);
            }
            __syncthreads();
            for (i64 e = threadIdx.x; e < dk * cw; e += blockDim.x) {
                const i64 r = e / cw, cc = e % cw;
                h_out[(ci * hv + j) * kv + r * dv + c0 + cc] = s[r * vt + cc];
            }
            for (i64 e = threadIdx.x; e < len * cw; e += blockDim.x) {
                const i64 i = e / cw, cc = e % cw;
                const i64 t = (start + i) * hv + j;
                const float* w_row = w_rows + i * w_stride;
                float x = u[t * dv + c0 + cc];
#pragma unroll 4
                for (i64 r = 0; r < dk; ++r) x = fmaf(-w_row[r], s[r * vt + cc], x);
                vn[i * vt + cc] = x;
                v_new[t * dv + c0 + cc] = x;
            }
            __syncthreads();
            const float d_last = decay0(g_last, l_last, s_last);
            for (i64 e = threadIdx.x; e < dk * cw; e += blockDim.x) {
                const i64 r = e / cw, cc = e % cw;
                float x = s[r * vt + cc] * d_last;
#pragma unroll 4
                for (i64 i = 0; i < len; ++i)
                    x = fmaf(dl[i] * k_rows[i * k_stride + r], vn[i * vt + cc], x);
                s[r * vt + cc] = x;
            }
            __syncthreads();
        }
        for (i64 e = threadIdx.x; e < dk * cw; e += blockDim.x) {
            const i64 r = e / cw, cc = e % cw;
            final_state[(n * hv + j) * kv + r * dv + c0 + cc] = s[r * vt + cc];
        }
    }
}
