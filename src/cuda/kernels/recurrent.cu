// The gated delta rule token by token, the state updated in place.
struct RecurrentParams {
    const float* q;     // [B, T, H, K]
    const float* k;     // [B, T, H, K]
    const float* v;     // [B, T, HV, V]
    const float* g;     // [B, T, HV], effective
    const float* beta;  // [B, T, HV], effective
    float* state;       // [N, HV, K, V] (recurrent_kv) or [N, HV, V, K] (recurrent_vk)
    float* o;           // [B, T, HV, V]
    const i64* seq_start;  // [N + 1]
    Shape s;
    i64 seqs;
    float scale;
};
static_assert(sizeof(RecurrentParams) == PARAMS_BYTES, "RecurrentParams differs from its Rust mirror");

// P's arrays as __restrict__ locals and its sizes, as both kernels read them.
#define RECURRENT_LOCALS(P)                                                  \
    const float* __restrict__ q = P.q;                                       \
    const float* __restrict__ k = P.k;                                       \
    const float* __restrict__ v = P.v;                                       \
    const float* __restrict__ g = P.g;                                       \
    const float* __restrict__ beta = P.beta;                                 \
    float* __restrict__ state = P.state;                                     \
    float* __restrict__ o = P.o;                                             \
    const i64 h = P.s.heads, hv = P.s.hv, dk = P.s.dk, dv = P.s.dv;          \
    const float scale = P.scale

// State [N, HV, K, V]: column c evolves on its own, so each thread owns one column of one
// (sequence, value head) and walks the sequence's tokens; reads across a warp are coalesced.
extern "C" __global__ void recurrent_kv(const RecurrentParams P) {
    RECURRENT_LOCALS(P);
    const i64 tiles = (dv + blockDim.x - 1) / blockDim.x;
    BLOCK_LOOP(item, P.seqs * hv * tiles) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, n = rest / hv;
        const i64 c = tile * blockDim.x + threadIdx.x;
        if (c >= dv) continue;
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        float* s = state + (n * hv + j) * dk * dv + c;
        for (i64 t = P.seq_start[n]; t < P.seq_start[n + 1]; ++t) {
            const i64 tj = t * hv + j;
            const float dcy = expf(g[tj]);
            const float* kt = k + (t * h + kh) * dk;
            const float* qt = q + (t * h + kh) * dk;
            // u = beta (v - S^T k), with S decayed first.
            float acc = 0.0f;
            for (i64 r = 0; r < dk; ++r) acc = fmaf(kt[r], s[r * dv] * dcy, acc);
            const float uc = beta[tj] * (v[tj * dv + c] - acc);
            float out = 0.0f;
            for (i64 r = 0; r < dk; ++r) {
                const float x = fmaf(kt[r], uc, s[r * dv] * dcy);
                s[r * dv] = x;
                out = fmaf(scale * qt[r], x, out);
            }
            o[tj * dv + c] = out;
        }
    }
}

// State [N, HV, V, K]: row c (K elements, contiguous) is owned by one warp, lanes over K.
extern "C" __global__ void recurrent_vk(const RecurrentParams P) {
    RECURRENT_LOCALS(P);
    const i64 warps = blockDim.x / 32;
    const int lane = threadIdx.x & 31;
    const i64 tiles = (dv + warps - 1) / warps;
    BLOCK_LOOP(item, P.seqs * hv * tiles) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, n = rest / hv;
        const i64 c = tile * warps + threadIdx.x / 32;
        if (c >= dv) continue;  // uniform across the warp: the shuffles below stay full-warp
        const i64 kh = qk_head(j, h, hv, P.s.tiled);
        float* row = state + ((n * hv + j) * dv + c) * dk;
        for (i64 t = P.seq_start[n]; t < P.seq_start[n + 1]; ++t) {
            const i64 tj = t * hv + j;
            const float dcy = expf(g[tj]);
            const float* kt = k + (t * h + kh) * dk;
            const float* qt = q + (t * h + kh) * dk;
            float part = 0.0f;
            for (i64 r = lane; r < dk; r += 32) {
                const float x = row[r] * dcy;
                row[r] = x;
                part = fmaf(x, kt[r], part);
            }
            const float uc = beta[tj] * (v[tj * dv + c] - warp_sum(part));
            part = 0.0f;
            for (i64 r = lane; r < dk; r += 32) {
                const float x = fmaf(uc, kt[r], row[r]);
                row[r] = x;
                part = fmaf(x, qt[r], part);
            }
            const float out = warp_sum(part);
            if (lane == 0) o[tj * dv + c] = scale * out;
        }
    }
}
