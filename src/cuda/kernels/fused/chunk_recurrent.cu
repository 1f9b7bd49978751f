// chunk_recurrent: the sequential pass over each sequence's chunks with the state on chip, one
// block of 256 threads per (sequence, value head, VT state columns). Equals chunk_state +
// chunk_output (and recompute_w_u, through the factored form below): per chunk, h the state
// tile entering it (K x VT, f32, in shared memory for the whole sequence),
//   R     = v - diag(d rk) (K h)              (= u - w h before the solve)
//   v_new = a_inv R                           (a_inv = A_inv diag(beta), from chunk_intra)
//   o     = diag(scale rq d) (Q h) + p v_new  (p: the masked, decayed, scaled q k^T block)
//   h     = d_last h + K^T diag(rk D_last) v_new
// with K, Q the raw key and query rows (bf16/f16/f32 as given) and the row scalings from
// chunk_intra's scal. Column c of the state needs only column c of v_new, so V-tiles are
// independent blocks. h and v_new never leave the chip (h is written per chunk only when chunk
// states are asked for). Every product is a warp_mma on the tensor cores: inputs x state two
// passes (three for f32 inputs), f32 x f32 three.
// FUSED_WIDE: 16 warps instead of 8 (latency hiding: one block fills an SM's shared memory),
// K h and Q h sharing their state fragments, two accumulator chains per product.
// A chunk's rows reach shared memory by cp.async; with NBUF = 2 (when shared memory allows) the
// next chunk's rows are in flight while this one is computed.
// Non-finite inputs: lv is the chunk's first row marked by chunk_intra (NaN scalings: its k, g or
// beta is not finite) or holding a non-finite v in this tile. A product with a zero weight still
// carries a NaN, so R is zeroed from lv on (the rows before come out as from a chunk ending at
// lv); this tile's outputs from lv on and the state tile leaving the chunk are NaN (a NaN v
// reaches only the tiles holding its columns).
#ifndef RTHREADS
#define RTHREADS 256
#endif
#define THREADS RTHREADS
#define WARPS (THREADS / 32)
#define C 64
#define SK STRIDE_A(DK, sizeof(in_t))
#define SC STRIDE_A(C, 4)
#define SV STRIDE_B(VT)
// A [64][VT] product is 4 x VT/8 tiles of 16 x 8: warp w owns row block w % 4 and NT tiles of
// column group w / 4.
#define NT (VT * 4 / (8 * WARPS))
// The [K][VT] state update: warp w owns row blocks w % 8, w % 8 + 8, .. and NT2 column tiles
// of column group w / 8.
#define NT2 (VT / 8 / (WARPS / 8))

struct RecParams {
    u64 q, k, v, a_inv, p, scal;   // inputs (q, k, v in in_t; the rest f32 from chunk_intra)
    u64 h0;                        // [N, HV, K, V] f32, or 0
    u64 o;                         // [tokens, HV, V] out_t
    u64 final_state;               // [N, HV, K, V] f32, or 0
    u64 chunk_states;              // [chunks, HV, K, V] f32, or 0
    u64 chunk_start, chunk_len, seq_first_chunk;  // i64
    i64 seqs, h, hv;
    int tiled;
    int part;                      // segments: chunk_recurrent_regs only (0 here)
    u64 chunk_decay, nan_cols;
    i64 segments, min_seg, warm_max;
    float warm_log;
    u64 seq_order;                 // i64 [N]: the sequences, longest first (see the regs kernel)
};

#define SVR STRIDE_B(VT)  // raw v rows, in_t
// One chunk's staged rows.
struct Stage {
    in_t* K;      // [C][SK]
    in_t* Q;      // [C][SK]
    float* X;     // [C][SC] a_inv
    float* Pm;    // [C][SC] p
    in_t* Vr;     // [C][SVR] v, raw
    float4* sc;   // [C] row scalings
};
__device__ __forceinline__ size_t stage_bytes() {
    return (size_t)2 * C * SK * sizeof(in_t) + (size_t)2 * C * SC * 4 + (size_t)C * SVR * sizeof(in_t) + C * 16;
}
__device__ __forceinline__ Stage stage_at(unsigned char* base) {
    Stage s;
    s.sc = (float4*)base;
    s.X = (float*)(s.sc + C);
    s.Pm = s.X + C * SC;
    s.K = (in_t*)(s.Pm + C * SC);
    s.Q = s.K + C * SK;
    s.Vr = s.Q + C * SK;
    return s;
}

extern "C" __global__ void __launch_bounds__(THREADS) chunk_recurrent(const RecParams P) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* Hs = (float*)smem_raw;          // [DK][SV] the state tile
    float* Vs = Hs + DK * SV;              // [C][SV] R = v - diag(d rk) K h
    float* Ns = Vs + C * SV;               // [C][SV] v_new
    int* first_bad = (int*)(Ns + C * SV);  // [4]: lv in [0]
    unsigned char* stages = (unsigned char*)(first_bad + 4);

    const in_t* __restrict__ q = (const in_t*)P.q;
    const in_t* __restrict__ k = (const in_t*)P.k;
    const in_t* __restrict__ v = (const in_t*)P.v;
    const float* __restrict__ a_inv = (const float*)P.a_inv;
    const float* __restrict__ pin = (const float*)P.p;
    const float4* __restrict__ scal = (const float4*)P.scal;
    // h0 and final_state may be one buffer (an engine advancing its states in place): each block
    // reads its tile of h0 before its first chunk and writes the same tile after its last.
    const float* h0 = (const float*)P.h0;
    out_t* __restrict__ o = (out_t*)P.o;
    float* fin = (float*)P.final_state;
    float* __restrict__ hst = (float*)P.chunk_states;
    const i64* __restrict__ chunk_start = (const i64*)P.chunk_start;
    const i64* __restrict__ chunk_len = (const i64*)P.chunk_len;
    const i64* __restrict__ seq_first_chunk = (const i64*)P.seq_first_chunk;
    const int tid = threadIdx.x, warp = tid >> 5;
    const i64 hv = P.hv, tiles = DV / VT, kv = (i64)DK * DV;
    // This warp's part of the [64][VT] products: rows rb .. rb + 15, columns cb .. cb + 8 NT - 1.
    const int rb = (warp & 3) * 16, cb = (warp >> 2) * (8 * NT);

    BLOCK_LOOP(item, P.seqs * hv * tiles) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, n = ((const i64*)P.seq_order)[rest / hv];
        const i64 kh = qk_head(j, P.h, hv, P.tiled);
        const i64 c0 = tile * VT;
        // Queues chunk ci's rows into stage buffer b (rows past the chunk's end are zero).
        auto issue = [&](i64 ci, int b) {
            const Stage st = stage_at(stages + b * stage_bytes());
            const i64 start = chunk_start[ci];
            const int len = (int)chunk_len[ci];
            stage_rows<in_t, DK>(st.K, SK, k + (start * P.h + kh) * DK, P.h * DK, len);
            stage_rows<in_t, DK>(st.Q, SK, q + (start * P.h + kh) * DK, P.h * DK, len);
            stage_rows<float, C>(st.X, SC, a_inv + (start * hv + j) * C, hv * C, len);
            stage_rows<float, C>(st.Pm, SC, pin + (start * hv + j) * C, hv * C, len);
            stage_rows<in_t, VT>(st.Vr, SVR, v + (start * hv + j) * DV + c0, hv * DV, len);
            stage_rows<float, 4>((float*)st.sc, 4, (const float*)(scal + start * hv + j), hv * 4, len);
            cp_async_commit();
        };
        __syncthreads();
        for (int e = tid; e < DK * VT; e += THREADS) {
            const int r = e / VT, cc = e % VT;
            Hs[r * SV + cc] = h0 ? h0[(n * hv + j) * kv + (i64)r * DV + c0 + cc] : 0.0f;
        }
        const i64 c_first = seq_first_chunk[n], c_end = seq_first_chunk[n + 1];
        if (c_first < c_end) issue(c_first, 0);
        for (i64 ci = c_first; ci < c_end; ++ci) {
            const i64 start = chunk_start[ci];
            const int len = (int)chunk_len[ci];
            const int b = NBUF == 2 ? (int)((ci - c_first) & 1) : 0;
            const Stage st = stage_at(stages + b * stage_bytes());
            const in_t* Ks = st.K;
            const in_t* Qs = st.Q;
            const float* Xs = st.X;
            const float* Ps = st.Pm;
            const float4* sc = st.sc;
            // Every read of lv in the previous chunk came before its closing barrier.
            if (tid == 0) *first_bad = len;
#if NBUF == 2
            // The other buffer was last read by chunk ci - 1, finished at its closing barrier.
            if (ci + 1 < c_end) {
                issue(ci + 1, b ^ 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
#else
            cp_async_wait<0>();
#endif
            __syncthreads();
            if (hst)
                for (int e = tid; e < DK * VT; e += THREADS) {
                    const int r = e / VT, cc = e % VT;
                    hst[(ci * hv + j) * kv + (i64)r * DV + c0 + cc] = Hs[r * SV + cc];
                }
            // K h and Q h; R = v - diag(d rk) K h in place of v; Q h scaled stays in registers
            // as the start of o.
            float kh_[NT][4], oacc[NT][4];
#pragma unroll
            for (int a = 0; a < NT; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) kh_[a][e] = oacc[a][e] = 0.0f;
            {
                auto hb = [&](int kk, int nn) { return Hs[kk * SV + cb + nn]; };
                auto ka = [&](int m, int kk) { return to_f(Ks[(rb + m) * SK + kk]); };
                auto qa = [&](int m, int kk) { return to_f(Qs[(rb + m) * SK + kk]); };
#if FUSED_WIDE
                float kq[2][NT][4];
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) kq[0][a][e] = kq[1][a][e] = 0.0f;
                warp_mma_x<SPLIT_IN, 1, NT, DK, 2>(kq, ka, qa, hb);
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        kh_[a][e] = kq[0][a][e];
                        oacc[a][e] = kq[1][a][e];
                    }
#else
                warp_mma<SPLIT_IN, 1, NT, DK>(kh_, ka, hb);
                warp_mma<SPLIT_IN, 1, NT, DK>(oacc, qa, hb);
#endif
            }
#pragma unroll
            for (int a = 0; a < NT; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rb + frag_row(e), cc = cb + 8 * a + frag_col(e);
                    const float4 s = sc[r];
                    const float vr = to_f(st.Vr[r * SVR + cc]);
                    if (r < len && (isnan(s.w) || !isfinite(vr))) atomicMin(first_bad, r);
                    Vs[r * SV + cc] = fmaf(-s.x, kh_[a][e], vr);
                    oacc[a][e] *= s.y;
                }
            __syncthreads();
            const int lv = *first_bad;
            if (lv < len) {  // the same for the whole block
                for (int e = lv * VT + tid; e < C * VT; e += THREADS) Vs[(e / VT) * SV + e % VT] = 0.0f;
                __syncthreads();
            }
            // v_new = a_inv R.
            {
                float vn[NT][4];
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) vn[a][e] = 0.0f;
                auto xa = [&](int m, int kk) { return Xs[(rb + m) * SC + kk]; };
                auto rbm = [&](int kk, int nn) { return Vs[kk * SV + cb + nn]; };
#if FUSED_WIDE
                float vn1[1][NT][4];
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) vn1[0][a][e] = 0.0f;
                warp_mma_x<1, 1, NT, C, 1>(vn1, xa, xa, rbm);
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) vn[a][e] = vn1[0][a][e];
#else
                warp_mma<1, 1, NT, C>(vn, xa, rbm);
#endif
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        Ns[(rb + frag_row(e)) * SV + cb + 8 * a + frag_col(e)] = vn[a][e];
            }
            __syncthreads();
            // o = diag(scale rq d) Q h + p v_new.
            {
                auto pa = [&](int m, int kk) { return Ps[(rb + m) * SC + kk]; };
                auto nb = [&](int kk, int nn) { return Ns[kk * SV + cb + nn]; };
#if FUSED_WIDE
                float o1[1][NT][4];
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o1[0][a][e] = oacc[a][e];
                warp_mma_x<1, 1, NT, C, 1>(o1, pa, pa, nb);
#pragma unroll
                for (int a = 0; a < NT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) oacc[a][e] = o1[0][a][e];
#else
                warp_mma<1, 1, NT, C>(oacc, pa, nb);
#endif
            }
#pragma unroll
            for (int a = 0; a < NT; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = rb + frag_row(e), cc = cb + 8 * a + frag_col(e);
                    if (r < len)
                        o[((start + r) * hv + j) * DV + c0 + cc] = from_f(r < lv ? oacc[a][e] : __int_as_float(0x7fc00000));
                }
            // h = d_last h + K^T diag(rk D_last) v_new.
            {
                const float d_last = sc[len - 1].w;
                const int hc = (warp / 8) * 8 * NT2;
                for (int hb0 = (warp % 8) * 16; hb0 < DK; hb0 += 16 * 8) {
                    float acc[1][NT2][4];
#pragma unroll
                    for (int a = 0; a < NT2; ++a)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[0][a][e] = 0.0f;
                    auto kta = [&](int m, int kk) { return to_f(Ks[kk * SK + hb0 + m]); };
                    auto vb = [&](int kk, int nn) { return sc[kk].z * Ns[kk * SV + hc + nn]; };
#if FUSED_WIDE
                    warp_mma_x<SPLIT_IN, 1, NT2, C, 1>(acc, kta, kta, vb);
#else
                    warp_mma<SPLIT_IN, 1, NT2, C>(acc[0], kta, vb);
#endif
#pragma unroll
                    for (int a = 0; a < NT2; ++a)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float* hp = &Hs[(hb0 + frag_row(e)) * SV + hc + 8 * a + frag_col(e)];
                            *hp = fmaf(d_last, *hp, acc[0][a][e]);
                        }
                }
            }
            __syncthreads();
            // Each thread poisons the elements it reads next (the copy-outs use this pattern;
            // the next chunk reads after its first barrier).
            if (lv < len)
                for (int e = tid; e < DK * VT; e += THREADS) Hs[(e / VT) * SV + e % VT] = __int_as_float(0x7fc00000);
#if NBUF == 1
            if (ci + 1 < c_end) issue(ci + 1, 0);
#endif
        }
        if (fin)
            for (int e = tid; e < DK * VT; e += THREADS) {
                const int r = e / VT, cc = e % VT;
                fin[(n * hv + j) * kv + (i64)r * DV + c0 + cc] = Hs[r * SV + cc];
            }
    }
}
