// The decode step: one launch advances every sequence's state by T tokens (T >= 1), with the
// l2norm of q and k, the gate and the beta activation done in the kernel, the states read from
// and written to rows of a pool chosen by index arrays.
//
// Work: one warp per (sequence n, value head j, tile of VT = 2048 / K state columns). Each lane
// holds a 16-row x 4-column block of the K x V state in registers for all T tokens, loaded and
// stored as 16-byte vectors; every column evolves on its own, so the only communication is the
// sum over the K rows, a butterfly over the DK / 16 lanes that share the lane's columns.
//
//   K-major state [.., K, V]: lane = rg * CG + cg with CG = VT / 4 lanes per state row; the lane
//     holds columns c0 .. c0 + 3 (c0 = tile * VT + 4 cg) of rows rg + RG * i, RG = DK / 16.
//     One load instruction of the warp covers RG consecutive rows, VT * 4 contiguous bytes each.
//   V-major state [.., V, K]: lane = cl * KL + kl with KL = DK / 16 lanes per state column; the
//     lane holds columns c0 .. c0 + 3 (c0 = tile * VT + 4 cl) and rows 4 kl + 4 KL m + e
//     (m, e < 4). One load instruction covers KL * 16 contiguous bytes of each of 32 / KL columns.
//
// Per token, with d = e^g and (with use_qk_l2norm) 1/|k|, 1/|q| from the same reduction:
//   a_c = k.S[:, c], b_c = q.S[:, c], summed on the undecayed state;
//   u_c = beta (v_c - d a_c);   S[:, c] <- d S[:, c] + k u_c;   o_c = scale (d b_c + u_c (q.k)),
// which is o_c = scale q.S'[:, c] for the updated S' with one reduction per token instead of two.
//
// Indices: read_idx[n] (or n when absent) is the pool row sequence n starts from; negative marks
// a padding slot: no state is read or written, and its outputs are zeros. write_idx[n] (or the
// read row) receives the final state, nothing when negative. token_idx[n, t] >= 0 receives the
// state after token t; token_states, when given, holds the state after every token
// [N, T, HV, (K, V) or (V, K)]. Rows written by one sequence must not be read or written by
// another (the host API checks this; device-resident indices are the caller's precondition).

struct DecodeParams {
    const void* q;        // [N, T, H, K], qkv_dtype
    const void* k;        // [N, T, H, K], qkv_dtype
    const void* v;        // [N, T, HV, V], qkv_dtype
    const void* g;        // [N, T, HV], g_dtype
    const void* beta;     // [N, T, HV], beta_dtype
    const void* a_log;    // [HV], a_log_dtype, with gate_in_kernel
    const void* dt_bias;  // [HV], dt_bias_dtype, with gate_in_kernel
    float* state;         // pool [P, HV, K, V] (decode_kv) or [P, HV, V, K] (decode_vk), f32
    void* o;              // [N, T, HV, V], out_dtype
    const void* read_idx;      // [N] i32/i64 or null (identity)
    const void* write_idx;     // [N] i32/i64 or null (the read row)
    const void* token_idx;     // [N, T] i32/i64 or null
    float* token_states;       // [N, T, HV, K, V] ([N, T, HV, V, K]) f32 or null
    i64 n, t, h, hv, dk, dv, pool;
    float scale;
    int qkv_dtype, g_dtype, beta_dtype, a_log_dtype, dt_bias_dtype, out_dtype;  // 0 f32, 1 bf16, 2 f16
    int read_i64, write_i64, token_i64;
    int tiled, use_qk_l2norm, beta_is_logits, allow_neg_eigval, gate_in_kernel;
    int cache_hints;  // 1: state vectors streamed (see ld_state)
};
static_assert(sizeof(DecodeParams) == 224, "DecodeParams differs from its Rust mirror");
#ifdef PARAMS_BYTES
static_assert(sizeof(DecodeParams) == PARAMS_BYTES, "DecodeParams differs from its Rust mirror");
#endif

#define ROWS 16  // state rows per lane
#define COLS 4   // state columns per lane (one 16-byte vector in the K-major layout)

__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned)b) << 16);
}

// IEEE half to f32, exact.
__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

// f32 to bf16, round to nearest even (NaN stays NaN).
__device__ __forceinline__ unsigned short f32_to_bf16_bits(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// f32 to IEEE half, round to nearest even.
__device__ __forceinline__ unsigned short f32_to_f16_bits(float x) {
    unsigned short h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(x));
    return h;
}

// Element i of an array of dtype `dt` (0 f32, 1 bf16, 2 f16).
__device__ __forceinline__ float load_any(const void* p, i64 i, int dt) {
    if (dt == 0) return ((const float*)p)[i];
    const unsigned short b = ((const unsigned short*)p)[i];
    return dt == 1 ? bf16_bits_to_f32(b) : f16_bits_to_f32(b);
}

// Four consecutive elements starting at i (a multiple of 4) of an array of dtype `dt`.
__device__ __forceinline__ void load4(const void* p, i64 i, int dt, float* x) {
    if (dt == 0) {
        const float4 f = *(const float4*)((const float*)p + i);
        x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
        return;
    }
    const uint2 w = *(const uint2*)((const unsigned short*)p + i);
    const unsigned short b[4] = {(unsigned short)(w.x & 0xffffu), (unsigned short)(w.x >> 16),
                                 (unsigned short)(w.y & 0xffffu), (unsigned short)(w.y >> 16)};
#pragma unroll
    for (int e = 0; e < 4; ++e) x[e] = dt == 1 ? bf16_bits_to_f32(b[e]) : f16_bits_to_f32(b[e]);
}

// Stores four consecutive elements at i (a multiple of 4) in dtype `dt`.
__device__ __forceinline__ void store4(void* p, i64 i, int dt, const float* x) {
    if (dt == 0) {
        *(float4*)((float*)p + i) = make_float4(x[0], x[1], x[2], x[3]);
        return;
    }
    unsigned short b[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) b[e] = dt == 1 ? f32_to_bf16_bits(x[e]) : f32_to_f16_bits(x[e]);
    *(uint2*)((unsigned short*)p + i) =
        make_uint2((unsigned)b[0] | ((unsigned)b[1] << 16), (unsigned)b[2] | ((unsigned)b[3] << 16));
}

__device__ __forceinline__ i64 load_idx(const void* p, i64 i, int wide) {
    return wide ? ((const i64*)p)[i] : (i64)((const int*)p)[i];
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The inputs of one token besides the state: this lane's share of q and k (elements
// 4 lane + 128 p + e, staged through shared memory for the whole warp), its 4 values of v, g and
// beta.
#define QK_PER_LANE 8  // DK <= 256
struct TokenIn {
    float q[QK_PER_LANE], k[QK_PER_LANE], v[COLS], g, beta;
};

// One 16-byte vector of a state. Each is read and written once per step and a step's states
// are far larger than L2 (256 sequences: 537 MB), so with cache_hints they are loaded and
// stored evict-first (.cs) and each load asks L2 for the whole 256-byte block around it (the
// neighbouring warps' columns of the same rows, which they request next). Asm volatile with a
// memory clobber keeps each load before the store to the same address.
__device__ __forceinline__ float4 ld_state(const float* p, int hints) {
    float4 v;
    if (hints)
        asm volatile("ld.global.cs.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "l"(p)
                     : "memory");
    else
        v = *(const float4*)p;
    return v;
}
__device__ __forceinline__ void st_state(float* p, float4 v, int hints) {
    if (hints)
        asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
                     "f"(v.w)
                     : "memory");
    else
        *(float4*)p = v;
}

// The lane's 16-byte vector x (0..15) of a state: its offset in one head's state and whether its
// columns exist. K-major: row part + span x, columns c0..c0+3. V-major: column c0 + x % 4, rows
// 4 part + 4 span (x / 4) + 0..3.
template <bool VFIRST>
__device__ __forceinline__ i64 vec_offset(int x, int part, int span, i64 c0, i64 dk, i64 dv) {
    return VFIRST ? (c0 + x % 4) * dk + 4 * part + 4 * span * (x / 4) : (i64)(part + span * x) * dv + c0;
}

template <bool VFIRST>
__device__ __forceinline__ void store_state(float* base, const float (&s)[ROWS][COLS], int part,
                                            int span, i64 c0, i64 dk, i64 dv, const bool (&col_ok)[COLS],
                                            int hints) {
#pragma unroll
    for (int x = 0; x < 16; ++x) {
        const i64 off = vec_offset<VFIRST>(x, part, span, c0, dk, dv);
        if (VFIRST) {
            const int m = x / 4, cc = x % 4;
            if (col_ok[cc])
                st_state(base + off, make_float4(s[4 * m][cc], s[4 * m + 1][cc], s[4 * m + 2][cc], s[4 * m + 3][cc]), hints);
        } else if (col_ok[0]) {
            st_state(base + off, make_float4(s[x][0], s[x][1], s[x][2], s[x][3]), hints);
        }
    }
}

// CDK, CDV: K and V as compile-time constants (0: read from P), so that the 16 vector offsets of
// a lane are immediates from one pointer instead of 16 live 64-bit addresses.
template <bool VFIRST, int CDK = 0, int CDV = 0>
__device__ __forceinline__ void decode_warp(const DecodeParams& P, float* smem) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int dk = CDK ? CDK : (int)P.dk;
    const int span = dk / ROWS;    // lanes sharing one column block: RG or KL
    const int groups = 32 / span;  // column blocks per warp: CG or CL
    const int vt = COLS * groups;  // state columns per warp
    // Lane coordinates: `part` indexes the rows within the span, `grp` the column block.
    const int part = VFIRST ? lane % span : lane / groups;
    const int grp = VFIRST ? lane / span : lane % groups;
    const i64 dv = CDV ? CDV : P.dv, hv = P.hv, T = P.t;
    const i64 tiles = (dv + vt - 1) / vt;
    const i64 items = P.n * hv * tiles;
    const i64 state_len = (i64)dk * dv;
    // Two buffers of q and k (DK each) per warp, alternating by token.
    float* const sbuf = smem + (i64)warp * 4 * dk;

    for (i64 item = (i64)blockIdx.x * warps + warp; item < items; item += (i64)gridDim.x * warps) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, n = rest / hv;
        const i64 c0 = tile * vt + COLS * grp;
        const i64 kh = qk_head(j, P.h, hv, P.tiled);
        const i64 row = P.read_idx ? load_idx(P.read_idx, n, P.read_i64) : n;

        // Column validity: the whole lane in the K-major layout (DV % 4 == 0), per column in
        // V-major.
        bool col_ok[COLS];
#pragma unroll
        for (int cc = 0; cc < COLS; ++cc) col_ok[cc] = VFIRST ? c0 + cc < dv : c0 < dv;
        float s[ROWS][COLS];

        if (row < 0) {
            // Padding: zero outputs, no pool row touched.
#pragma unroll
            for (int i = 0; i < ROWS; ++i)
#pragma unroll
                for (int cc = 0; cc < COLS; ++cc) s[i][cc] = 0.0f;
            for (i64 t = 0; t < T; ++t) {
                const i64 tj = (n * T + t) * hv + j;
                if (part == 0 && col_ok[0]) store4(P.o, tj * dv + c0, P.out_dtype, s[0]);
                if (P.token_states)
                    store_state<VFIRST>(P.token_states + tj * state_len, s, part, span, c0, dk, dv, col_ok, P.cache_hints);
            }
            continue;
        }

        // The activation constants of head j.
        float a_exp = 0.0f, dt_b = 0.0f;
        if (P.gate_in_kernel) {
            a_exp = -expf(load_any(P.a_log, j, P.a_log_dtype));
            dt_b = load_any(P.dt_bias, j, P.dt_bias_dtype);
        }
        const float beta_mult = P.allow_neg_eigval ? 2.0f : 1.0f;

        auto fetch = [&](i64 t, TokenIn& x) {
            const i64 base = ((n * T + t) * P.h + kh) * dk;
#pragma unroll
            for (int p = 0; p < QK_PER_LANE / 4; ++p) {
                const int e = 4 * lane + 128 * p;
                if (e < dk) {
                    load4(P.q, base + e, P.qkv_dtype, x.q + 4 * p);
                    load4(P.k, base + e, P.qkv_dtype, x.k + 4 * p);
                }
            }
            const i64 tj = (n * T + t) * hv + j;
            if (col_ok[0]) load4(P.v, tj * dv + c0, P.qkv_dtype, x.v);
            x.g = load_any(P.g, tj, P.g_dtype);
            x.beta = load_any(P.beta, tj, P.beta_dtype);
        };
        // Token 0's inputs are requested before the state, so both are in flight together.
        TokenIn next;
        fetch(0, next);

        // The lane's block of the state, s[i][cc] = S[row i of the lane, column c0 + cc].
        const float* src = P.state + (row * hv + j) * state_len;
#pragma unroll
        for (int x = 0; x < 16; ++x) {
            const i64 off = vec_offset<VFIRST>(x, part, span, c0, dk, dv);
            const bool ok = VFIRST ? col_ok[x % 4] : col_ok[0];
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ok) v = ld_state(src + off, P.cache_hints);
            if (VFIRST) {
                const int m = x / 4, cc = x % 4;
                s[4 * m][cc] = v.x, s[4 * m + 1][cc] = v.y, s[4 * m + 2][cc] = v.z, s[4 * m + 3][cc] = v.w;
            } else {
                s[x][0] = v.x, s[x][1] = v.y, s[x][2] = v.z, s[x][3] = v.w;
            }
        }

        // The warp's previous item may still be reading buffer 0 of q and k.
        __syncwarp();
        for (i64 t = 0; t < T; ++t) {
            const TokenIn cur = next;
            float* const bq = sbuf + (t & 1) * 2 * dk;
            float* const bk = bq + dk;
#pragma unroll
            for (int p = 0; p < QK_PER_LANE / 4; ++p) {
                const int e = 4 * lane + 128 * p;
                if (e < dk) {
                    *(float4*)(bq + e) = make_float4(cur.q[4 * p], cur.q[4 * p + 1], cur.q[4 * p + 2], cur.q[4 * p + 3]);
                    *(float4*)(bk + e) = make_float4(cur.k[4 * p], cur.k[4 * p + 1], cur.k[4 * p + 2], cur.k[4 * p + 3]);
                }
            }
            if (t + 1 < T) fetch(t + 1, next);
            __syncwarp();

            // This lane's rows of q and k.
            float kr[ROWS], qr[ROWS];
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const int r = VFIRST ? 4 * part + 4 * span * (i / 4) + i % 4 : part + span * i;
                kr[i] = bk[r];
                qr[i] = bq[r];
            }
            // Partial sums over the lane's rows: a and b per column, then |k|^2, |q|^2, q.k.
            float red[2 * COLS + 3];
#pragma unroll
            for (int cc = 0; cc < COLS; ++cc) {
                float a = 0.0f, b = 0.0f;
#pragma unroll
                for (int i = 0; i < ROWS; ++i) {
                    a = fmaf(kr[i], s[i][cc], a);
                    b = fmaf(qr[i], s[i][cc], b);
                }
                red[cc] = a;
                red[COLS + cc] = b;
            }
            float kk = 0.0f, qq = 0.0f, qk = 0.0f;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                kk = fmaf(kr[i], kr[i], kk);
                qq = fmaf(qr[i], qr[i], qq);
                qk = fmaf(qr[i], kr[i], qk);
            }
            red[2 * COLS] = kk, red[2 * COLS + 1] = qq, red[2 * COLS + 2] = qk;
            // Butterfly over the lanes of the span (low lane bits in V-major, high in K-major):
            // every lane of the span ends with the same sums, added in the same order.
            const int step = VFIRST ? 1 : groups;
            for (int m = step; m < step * span; m <<= 1) {
#pragma unroll
                for (int x = 0; x < 2 * COLS + 3; ++x) red[x] += __shfl_xor_sync(0xffffffffu, red[x], m);
            }

            const float ik = P.use_qk_l2norm ? 1.0f / sqrtf(red[2 * COLS] + 1e-6f) : 1.0f;
            const float iq = P.use_qk_l2norm ? 1.0f / sqrtf(red[2 * COLS + 1] + 1e-6f) : 1.0f;
            const float qk_n = red[2 * COLS + 2] * ik * iq;
            const float g = P.gate_in_kernel ? a_exp * softplus(cur.g + dt_b) : cur.g;
            const float beta = P.beta_is_logits ? beta_mult / (1.0f + expf(-cur.beta)) : cur.beta;
            const float d = expf(g);
            float u[COLS], out[COLS];
#pragma unroll
            for (int cc = 0; cc < COLS; ++cc) {
                u[cc] = beta * (cur.v[cc] - d * (red[cc] * ik));
                out[cc] = P.scale * fmaf(u[cc], qk_n, d * (red[COLS + cc] * iq));
            }
            const i64 tj = (n * T + t) * hv + j;
            if (part == 0 && col_ok[0]) store4(P.o, tj * dv + c0, P.out_dtype, out);
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const float kn = kr[i] * ik;
#pragma unroll
                for (int cc = 0; cc < COLS; ++cc) s[i][cc] = fmaf(kn, u[cc], d * s[i][cc]);
            }

            // Where the state after this token goes.
            if (P.token_states)
                store_state<VFIRST>(P.token_states + tj * state_len, s, part, span, c0, dk, dv, col_ok, P.cache_hints);
            if (P.token_idx) {
                const i64 w = load_idx(P.token_idx, n * T + t, P.token_i64);
                if (w >= 0) store_state<VFIRST>(P.state + (w * hv + j) * state_len, s, part, span, c0, dk, dv, col_ok, P.cache_hints);
            }
            if (t + 1 == T) {
                const i64 w = P.write_idx ? load_idx(P.write_idx, n, P.write_i64) : row;
                if (w >= 0) store_state<VFIRST>(P.state + (w * hv + j) * state_len, s, part, span, c0, dk, dv, col_ok, P.cache_hints);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) decode_kv(const DecodeParams P) {
    extern __shared__ float smem[];
    decode_warp<false>(P, smem);
}

extern "C" __global__ void __launch_bounds__(128) decode_vk(const DecodeParams P) {
    extern __shared__ float smem[];
    decode_warp<true>(P, smem);
}

// K = V = 128 (Qwen3-Next, Qwen3.5) with the head sizes as constants (see decode_warp). Held to
// three blocks a SM (168 registers; unbounded it takes 254, and at four blocks it spills 56 bytes).
extern "C" __global__ void __launch_bounds__(128, 3) decode_kv_k128_v128(const DecodeParams P) {
    extern __shared__ float smem[];
    decode_warp<false, 128, 128>(P, smem);
}
