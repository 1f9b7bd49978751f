// Shared by the fused kernels (prepended after common.cuh): input element types, the exact
// tensor-core product, and the warp-level tile product every fused kernel is built from.
//
// Compile-time constants: IN_T (0 f32, 1 bf16, 2 f16: the dtype q, k, v are read in), DK, DV,
// FUSED_MMA (1: tensor cores; 0: the same tile products in plain f32 FMA, a slow cross-check).
typedef unsigned long long u64;

#if IN_T == 0
typedef float in_t;
__device__ __forceinline__ float to_f(float x) { return x; }
#define SPLIT_IN 1
#elif IN_T == 1
typedef unsigned short in_t;
// bf16 is the top half of an f32.
__device__ __forceinline__ float to_f(unsigned short x) { return __uint_as_float(((unsigned)x) << 16); }
#define SPLIT_IN 0
#else
typedef unsigned short in_t;
__device__ __forceinline__ float to_f(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}
#define SPLIT_IN 0
#endif
// OUT_T (0 f32, 1 bf16, 2 f16): the type o is written in, narrowed as it is stored (round to
// nearest even, as the cast kernel), so no second pass over o is needed.
#ifndef OUT_T
#define OUT_T 0
#endif
#if OUT_T == 0
typedef float out_t;
__device__ __forceinline__ float from_f(float x) { return x; }
#else
typedef unsigned short out_t;
__device__ __forceinline__ unsigned short from_f(float x) {
    unsigned short r;
#if OUT_T == 1
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
#endif
    return r;
}
// Two values narrowed as from_f does, lo in the low half (the lower address in memory).
__device__ __forceinline__ unsigned pack_out(float lo, float hi) {
    unsigned r;
#if OUT_T == 1
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
#endif
// SPLIT_IN: whether an input value needs the hi + lo split to be exact in TF32. bf16 (8
// significant bits) and f16 (11, exponent range inside f32's) are exact in TF32 (11 bits); f32
// is not.

// x = hi + lo with hi, lo both TF32 (11 significant bits each): hi is x rounded to TF32, lo the
// rounded remainder, so hi + lo carries 22 of x's 24 bits (relative error <= 2^-22).
// x rounded to TF32, to nearest with ties away from zero (what cvt.rna.tf32.f32 gives for every
// finite x, which sm_90 emulates in about twice the instructions): half a TF32 ulp added to the
// magnitude bits carries into the kept bits exactly when the dropped ones are at least half.
__device__ __forceinline__ unsigned round_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
    hi = round_tf32(x);
    lo = round_tf32(x - __uint_as_float(hi));  // the difference is exact: shared leading bits
}

// c += a b on the tensor cores: a 16x8 (row), b 8x8 (col), TF32 operands, f32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The C fragment of m16n8: element e of a lane is at row frag_row(e), column frag_col(e) of the
// 16x8 tile.
__device__ __forceinline__ int frag_row(int e) { return ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int frag_col(int e) { return 2 * (threadIdx.x & 3) + (e & 1); }

// One warp: acc[j] += A (16 x KD) B (KD x 8 columns 8j .. 8j+7), for j < NT. a_at(m, k) and
// b_at(k, n) return the operands as f32 (m < 16, n < 8 NT, k < KD). SA / SB: 1 where A / B
// need the TF32 split (f32 values), 0 where they are exact in TF32 (bf16/f16 inputs), 2 where
// f32 values are rounded to TF32 (to nearest: 2^-12 relative; the tensor cores would drop the
// low bits instead) for one pass. Products: exact x exact one pass; exact x split two (x hi,
// x lo); split x split three (hi hi, hi lo, lo hi; lo lo is below 2^-22 relative). The small
// terms go first into the accumulator.
template <int SA, int SB, int NT, int KD, typename FA, typename FB>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], FA a_at, FB b_at) {
#if FUSED_MMA
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll 2
    for (int k0 = 0; k0 < KD; k0 += 8) {
        const float af[4] = {a_at(g, k0 + t), a_at(g + 8, k0 + t), a_at(g, k0 + t + 4),
                             a_at(g + 8, k0 + t + 4)};
        unsigned ah[4], al[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (SA == 1) split_tf32(af[e], ah[e], al[e]);
            else ah[e] = SA == 2 ? round_tf32(af[e]) : __float_as_uint(af[e]);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float bf[2] = {b_at(k0 + t, 8 * j + g), b_at(k0 + t + 4, 8 * j + g)};
            unsigned bh[2], bl[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (SB == 1) split_tf32(bf[e], bh[e], bl[e]);
                else bh[e] = SB == 2 ? round_tf32(bf[e]) : __float_as_uint(bf[e]);
            }
            if (SA == 1 && SB == 1) {
                mma_tf32(acc[j], ah, bl);
                mma_tf32(acc[j], al, bh);
            } else if (SA == 1) {
                mma_tf32(acc[j], al, bh);
            } else if (SB == 1) {
                mma_tf32(acc[j], ah, bl);
            }
            mma_tf32(acc[j], ah, bh);
        }
    }
#else
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int m = frag_row(e), n = 8 * j + frag_col(e);
            float x = acc[j][e];
            for (int k = 0; k < KD; ++k) x = fmaf(a_at(m, k), b_at(k, n), x);
            acc[j][e] = x;
        }
#endif
}

// Row stride (elements) of a shared [rows][cols] tile read as an A operand (lanes read rows g,
// columns t): 4 words past a multiple of 32 banks for 4-byte elements, 8 halves for 2-byte ones,
// so the 32 lanes hit distinct banks.
#define STRIDE_A(cols, bytes) ((cols) + ((bytes) == 4 ? 4 : 8))
// Row stride of a tile read as a B operand (lanes read rows t, columns g): 8 words past.
#define STRIDE_B(cols) ((cols) + 8)

// 16 bytes global -> shared without passing through registers (cp.async, sm_80+); `valid`
// false writes 16 zero bytes instead (rows past a chunk's end). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)s), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
// acc + 0 * w in each bf16 half: NaN in a half once some w's half was not finite (0 * inf and
// 0 * NaN are NaN), else acc unchanged. Two elements' finiteness test in one instruction.
__device__ __forceinline__ unsigned zero_fma_bf16x2(unsigned w, unsigned acc) {
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(0u), "r"(acc));
    return r;
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `n` of this thread's committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory"); }

// Copies rows [0, 64) x `cols` elements of a row-major global matrix (row i at src + i *
// src_stride, 16-byte aligned) into shared rows of `dst_stride` elements; rows >= len are zero.
// This thread (`tid` of `nt` copying threads) takes pieces tid, tid + nt, ... of 16 bytes.
// LOWER: only the 16 x 16 blocks on and below the diagonal of a 64 x 64 matrix (the others of
// dst are left as they are): for lower-triangular matrices whose upper blocks are never read.
template <typename T, int cols, bool LOWER = false>
__device__ __forceinline__ void stage_rows_loop(T* dst, int dst_stride, const T* src, i64 src_stride,
                                                int len, int tid, int nt) {
    static_assert(!LOWER || cols == 64, "LOWER: a 64 x 64 matrix");
    constexpr int per_row = cols * (int)sizeof(T) / 16;
    for (int e = tid; e < 64 * per_row; e += nt) {
        const int i = e / per_row, piece = e % per_row;
        const int off = piece * (16 / (int)sizeof(T));
        if (LOWER && (off >> 4) > (i >> 4)) continue;
        const bool valid = i < len;
        cp_async16(dst + i * dst_stride + off, valid ? src + i * src_stride + off : src, valid);
    }
}
// stage_rows_loop by every thread of the block.
template <typename T, int cols>
__device__ __forceinline__ void stage_rows(T* dst, int dst_stride, const T* src, i64 src_stride,
                                           int len) {
    stage_rows_loop<T, cols>(dst, dst_stride, src, src_stride, len, threadIdx.x, blockDim.x);
}

// stage_rows by NT copying threads known at compile time, this one `tid` (0 <= tid < NT): where
// NT is a multiple of the 16-byte pieces of a row, each thread keeps one piece of every
// (NT / pieces)-th row, so the loop unrolls into a pointer step, a compare and a copy per piece.
// Why: the general loop (a division, a remainder and a 64-bit product per piece) was half of
// chunk_recurrent_regs's instructions (Nsight Compute, NOTES-GPU.md).
// WHOLE: len is 64 (a whole chunk), so no row is tested: the copies take no predicate and no
// fallback address (most of the staging's integer work a chunk).
template <typename T, int cols, int NT, bool LOWER = false, bool WHOLE = false>
__device__ __forceinline__ void stage_rows_by(T* dst, int dst_stride, const T* src, i64 src_stride,
                                              int len, int tid) {
    static_assert(!LOWER || cols == 64, "LOWER: a 64 x 64 matrix");
    constexpr int per_row = cols * (int)sizeof(T) / 16;
    if constexpr (NT % per_row == 0) {
        constexpr int step = NT / per_row;  // rows apart of one thread's pieces
        constexpr int iters = (64 + step - 1) / step;
        const int r0 = tid / per_row, off = (tid % per_row) * (16 / (int)sizeof(T));
        const T* s = src + r0 * src_stride + off;
        T* d = dst + r0 * dst_stride + off;
        const i64 s_step = step * src_stride;
#pragma unroll 4
        for (int it = 0; it < iters; ++it) {
            const int i = r0 + it * step;
            if ((64 % step == 0 || i < 64) && (!LOWER || (off >> 4) <= (i >> 4)))
                cp_async16(d + it * step * dst_stride, WHOLE || i < len ? s : src, WHOLE || i < len);
            s += s_step;
        }
    } else {
        stage_rows_loop<T, cols, LOWER>(dst, dst_stride, src, src_stride, len, tid, NT);
    }
}

// warp_mma for NA (1 or 2) A operands sharing one B operand (its fragments loaded and split
// once), with two accumulator sets for alternate k steps so that consecutive tensor-core
// products do not wait on each other; the sets are added at the end.
template <int SA, int SB, int NT, int KD, int NA, typename FA0, typename FA1, typename FB>
__device__ __forceinline__ void warp_mma_x(float (&acc)[NA][NT][4], FA0 a_at0, FA1 a_at1,
                                           FB b_at) {
    static_assert(SA <= 1 && SB <= 1, "warp_mma_x splits or takes exact operands (0 or 1)");
#if FUSED_MMA
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float odd[NA][NT][4];
#pragma unroll
    for (int x = 0; x < NA; ++x)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) odd[x][j][e] = 0.0f;
#pragma unroll 1
    for (int k00 = 0; k00 < KD; k00 += 16)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int k0 = k00 + 8 * half;
        unsigned ah[NA][4], al[NA][4];
#pragma unroll
        for (int x = 0; x < NA; ++x) {
            float af[4];
            if (x == 0) {
                af[0] = a_at0(g, k0 + t); af[1] = a_at0(g + 8, k0 + t);
                af[2] = a_at0(g, k0 + t + 4); af[3] = a_at0(g + 8, k0 + t + 4);
            } else {
                af[0] = a_at1(g, k0 + t); af[1] = a_at1(g + 8, k0 + t);
                af[2] = a_at1(g, k0 + t + 4); af[3] = a_at1(g + 8, k0 + t + 4);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (SA) split_tf32(af[e], ah[x][e], al[x][e]);
                else ah[x][e] = __float_as_uint(af[e]);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float bf[2] = {b_at(k0 + t, 8 * j + g), b_at(k0 + t + 4, 8 * j + g)};
            unsigned bh[2], bl[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (SB) split_tf32(bf[e], bh[e], bl[e]);
                else bh[e] = __float_as_uint(bf[e]);
            }
#pragma unroll
            for (int x = 0; x < NA; ++x) {
                float(&c)[4] = half ? odd[x][j] : acc[x][j];
                const unsigned(&a_h)[4] = ah[x];
                const unsigned(&a_l)[4] = al[x];
                if (SA && SB) {
                    mma_tf32(c, a_h, bl);
                    mma_tf32(c, a_l, bh);
                } else if (SA) {
                    mma_tf32(c, a_l, bh);
                } else if (SB) {
                    mma_tf32(c, a_h, bl);
                }
                mma_tf32(c, a_h, bh);
            }
        }
    }
#pragma unroll
    for (int x = 0; x < NA; ++x)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[x][j][e] += odd[x][j][e];
#else
    warp_mma<SA, SB, NT, KD>(acc[0], a_at0, b_at);
    if (NA > 1) warp_mma<SA, SB, NT, KD>(acc[NA - 1], a_at1, b_at);
#endif
}

// --- bf16 tensor-core products with f32 operands split into bf16 pieces ---
// x = x1 + x2 + x3, each piece x rounded to bf16 (8 significant bits) minus the pieces before:
// every difference is exact, so the three carry x's 24 bits (exact for normal x). An input
// already in bf16 is its own single piece. PIECES (3 unless defined) is how many pieces of an
// f32 operand the products use: 3 is the exact precision; 1 (bf16 operands, as FLA) and 2
// (about 16 bits) are the fast ones.
#ifndef PIECES
#define PIECES 3
#endif

// Two f32 rounded to bf16 and packed, `lo` in the low half (the A/B register order of mma).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_lo(unsigned p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf16_hi(unsigned p) { return __uint_as_float(p & 0xffff0000u); }

// The first PIECES pieces of (x0, x1) as packed pairs (p[i] piece i + 1).
__device__ __forceinline__ void split3(float x0, float x1, unsigned& p1, unsigned& p2,
                                       unsigned& p3) {
    p1 = pack_bf16(x0, x1);
    p2 = p3 = 0u;
    if (PIECES > 1) {
        x0 -= bf16_lo(p1);
        x1 -= bf16_hi(p1);
        p2 = pack_bf16(x0, x1);
    }
    if (PIECES > 2) {
        x0 -= bf16_lo(p2);
        x1 -= bf16_hi(p2);
        p3 = pack_bf16(x0, x1);
    }
}

// An A operand (16 x 16) in three pieces.
struct APieces {
    unsigned p[3][4];
};
// The A operand of one k16 step from two accumulator (C) tiles of m16n8: columns 0..7 from c0,
// 8..15 from c1. The C fragment of a lane (rows g, g + 8; columns 2t, 2t + 1) is the A fragment
// of the same lane, so a product's result feeds the next product with no data exchange.
__device__ __forceinline__ APieces a_from_acc(const float (&c0)[4], const float (&c1)[4]) {
    APieces a;
    split3(c0[0], c0[1], a.p[0][0], a.p[1][0], a.p[2][0]);
    split3(c0[2], c0[3], a.p[0][1], a.p[1][1], a.p[2][1]);
    split3(c1[0], c1[1], a.p[0][2], a.p[1][2], a.p[2][2]);
    split3(c1[2], c1[3], a.p[0][3], a.p[1][3], a.p[2][3]);
    return a;
}

// c += a b on the tensor cores: a 16x16 (row), b 16x8 (col), bf16 operands, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a b for 16-bit inputs (IN_T: bf16 or f16), a 16x16 (row), b 16x8 (col), f32 accumulate.
__device__ __forceinline__ void mma_in16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
#if IN_T == 2
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    mma_bf16(c, a, b0, b1);
#endif
}
// c += a b with a split and b exact in bf16: one pass per piece, small pieces first.
__device__ __forceinline__ void mma3(float (&c)[4], const APieces& a, unsigned b0, unsigned b1) {
    if (PIECES > 2) mma_bf16(c, a.p[2], b0, b1);
    if (PIECES > 1) mma_bf16(c, a.p[1], b0, b1);
    mma_bf16(c, a.p[0], b0, b1);
}
// c += a b with both split: the piece products whose orders add to at most PIECES + 1 (with
// three pieces six products; the dropped three are below 2^-25 relative), small ones first.
// b[i] = {b0, b1} of piece i.
__device__ __forceinline__ void mma6(float (&c)[4], const APieces& a,
                                     const unsigned (&b)[PIECES][2]) {
#if PIECES > 2
    mma_bf16(c, a.p[2], b[0][0], b[0][1]);
    mma_bf16(c, a.p[1], b[1][0], b[1][1]);
    mma_bf16(c, a.p[0], b[2][0], b[2][1]);
#endif
#if PIECES > 1
    mma_bf16(c, a.p[1], b[0][0], b[0][1]);
    mma_bf16(c, a.p[0], b[1][0], b[1][1]);
#endif
    mma_bf16(c, a.p[0], b[0][0], b[0][1]);
}

// The shared-space address of p, as integer arithmetic the compiler can fold offsets into.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}
// Four 8 x 8 bf16 matrices from shared memory (address a, shared space), lane l giving row l % 8
// of matrix l / 8; result register i holds, per lane, matrix i's row g, columns 2t, 2t + 1 (with
// .trans: rows 2t, 2t + 1 of column g).
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// The inverse of ldsm_x4_t: register i of each lane, as ldsm_x4_t's result would hold it, goes
// to matrix i's rows 2t, 2t + 1 of column g (lane l giving row l % 8 of matrix l / 8).
__device__ __forceinline__ void stsm_x4_t(unsigned a, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};"
                 ::"r"(a), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}
// A bf16 row-major matrix in shared memory for the loads below: this lane's row address in
// either pattern, so that every load is that address plus a constant.
struct SmemRows {
    unsigned b;   // ldsm_b: row l % 8 + 8 ((l / 8) / 2), column 8 ((l / 8) % 2)
    unsigned bt;  // ldsm_bt: row l % 8 + 8 ((l / 8) % 2), column 8 ((l / 8) / 2)
};
// M with row stride s elements.
__device__ __forceinline__ SmemRows smem_rows(const unsigned short* M, int s) {
    const int l = threadIdx.x & 31, mi = l >> 3, r = l & 7;
    const unsigned base = smem_addr(M);
    return {base + 2u * ((r + 8 * (mi >> 1)) * s + 8 * (mi & 1)),
            base + 2u * ((r + 8 * (mi & 1)) * s + 8 * (mi >> 1))};
}
// B operands (k16 x n8) of B = M^T for one k16 step (columns k0 .. k0 + 15 of M) and two n8
// tiles (rows r0 .. r0 + 7 and r0 + 8 .. r0 + 15 of M); M bf16 row-major with row stride s.
// b[0], b[1]: the first tile's registers; b[2], b[3]: the second's.
__device__ __forceinline__ void ldsm_b(unsigned (&b)[4], const SmemRows& M, int s, int r0,
                                       int k0) {
    ldsm_x4(b, M.b + 2u * (r0 * s + k0));
}
// B operands of B = M itself (rows k0 .. k0 + 15 are the k16 step, columns n0 .. n0 + 15 the
// two n8 tiles), by the transposing load.
__device__ __forceinline__ void ldsm_bt(unsigned (&b)[4], const SmemRows& M, int s, int k0,
                                        int n0) {
    ldsm_x4_t(b, M.bt + 2u * (k0 * s + n0));
}

// x's PIECES bf16 pieces written to dst[0], dst[plane], .. (PLANES workspace rows).
__device__ __forceinline__ void store_pieces(unsigned short* dst, int plane, float x) {
    unsigned p[3];
    split3(x, 0.0f, p[0], p[1], p[2]);
#pragma unroll
    for (int i = 0; i < PIECES; ++i) dst[i * plane] = (unsigned short)p[i];
}

// Warpgroup products (wgmma, sm_90a; WGMMA = 1): four consecutive warps starting at a multiple
// of four issue one product together, each warp giving 16 rows of the register A operand in the
// fragment of mma.sync's A (a_from_acc) and receiving 16 rows of the result in mma.sync's C
// fragments, so that they stand in for a warp's m16n8k16 products tile for tile. B is read by the
// tensor cores from shared memory through a descriptor: 64 rows of bf16 in 128-byte lines, each
// 64-column atom (8 KB, 1024-aligned) with its 16-byte pieces swizzled by the row (piece c of
// row r at c ^ (r % 8)), as stage_rows_sw128 writes them.
#ifndef WGMMA
#define WGMMA 0
#endif
#if WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Pins an accumulator's registers at this point of the program: before a batch of products (no
// write to them sinks below its issue) and after its wait (no read of the results rises above
// it), as the compiler does not know that the wait is what delivers them.
template <int NT>
__device__ __forceinline__ void wg_pin(float (&d)[NT][4]) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
// Orders this thread's ordinary (generic-proxy) writes to shared memory, cp.async included,
// before the tensor cores' (async-proxy) reads of it that follow the next barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Descriptor of a 64-row operand at shared address `a` in the 128-byte swizzle: 8-row groups
// 1024 bytes apart. Both byte offsets are 1024: a k16 step spans two 8-row groups along K of an
// MN-major operand, and n = 64 stays within one atom, so which field the hardware takes for which
// stride does not matter here.
__device__ __forceinline__ u64 wg_desc(unsigned a) {
    return (u64)((a & 0x3FFFFu) >> 4) | ((u64)(1024 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
// B = X^T for the k16 step kb (columns 16 kb .. of X, [64][DK] swizzled): K-major.
__device__ __forceinline__ u64 desc_xt(unsigned x, int kb) { return wg_desc(x + (kb >> 2) * 8192 + (kb & 3) * 32); }
// B = X's rows 16 kb .. (the k16 step) and columns 64 nh .. (n64): MN-major.
__device__ __forceinline__ u64 desc_x(unsigned x, int kb, int nh) { return wg_desc(x + nh * 8192 + kb * 2048); }
// The four accumulator registers of tile i, as asm operands.
#define WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
// d += a b, a 64 x 16 (registers), b 16 x N (descriptor; TB = 1: MN-major), f32 accumulate, into
// the last N / 8 tiles of d (columns 64 - N .. 63 of a 64-column accumulator: the rows of a
// lower-triangular B below a k16 step's diagonal block). NW: the tiles written (for the host
// emulation, which reads these names).
template <int N, int TB>
__device__ __forceinline__ void wgmma_tail(float (&d)[8][4], const unsigned (&a)[4], u64 desc) {
    static_assert(N == 16 || N == 32 || N == 48 || N == 64, "n: 16, 32, 48 or 64");
    constexpr int NW = N / 8;
    if constexpr (N == 16) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %14;\n}\n"
            : WG_D(6), WG_D(7)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TB));
    } else if constexpr (N == 32) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
            : WG_D(4), WG_D(5), WG_D(6), WG_D(7)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TB));
    } else if constexpr (N == 48) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %29, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28, p, 1, 1, %30;\n}\n"
            : WG_D(2), WG_D(3), WG_D(4), WG_D(5), WG_D(6), WG_D(7)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TB));
    } else if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
            : WG_D(0), WG_D(1), WG_D(2), WG_D(3), WG_D(4), WG_D(5), WG_D(6), WG_D(7)
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TB));
    }
}
// d += a b, a 64 x 16 and b 16 x N both read by the tensor cores through descriptors, both
// K-major (rows of 16 bf16 along K in the 128-byte swizzle), f32 accumulate into all N / 8 tiles.
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], u64 da, u64 db) {
    static_assert(N == 32 || N == 64, "n: 32 or 64");
    constexpr int NW = N / 8;
    if constexpr (N == 32) {
        asm volatile(
            "{\n.reg .pred s;\nsetp.ne.b32 s, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, s, 1, 1, 0, 0;\n}\n"
            : WG_D(0), WG_D(1), WG_D(2), WG_D(3)
            : "l"(da), "l"(db), "r"(1));
    } else {
        asm volatile(
            "{\n.reg .pred s;\nsetp.ne.b32 s, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, s, 1, 1, 0, 0;\n}\n"
            : WG_D(0), WG_D(1), WG_D(2), WG_D(3), WG_D(4), WG_D(5), WG_D(6), WG_D(7)
            : "l"(da), "l"(db), "r"(1));
    }
    (void)NW;
}
#undef WG_D
template <int TB>
__device__ __forceinline__ void wgmma64(float (&d)[8][4], const unsigned (&a)[4], u64 desc) {
    wgmma_tail<64, TB>(d, a, desc);
}
// cp_async16 to the shared-space address s.
__device__ __forceinline__ void cp_async16_to(unsigned s, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// Copies the 16 x 16 blocks on and below the diagonal of a 64 x 64 bf16 matrix (row i at src + i
// src_stride) into one swizzled atom at shared address `x` (rows >= len zero), by NT threads;
// with ZERO_UPPER the blocks above are written as zeros (read from nowhere), else left as they are.
template <int NT, bool ZERO_UPPER, bool WHOLE = false>
__device__ __forceinline__ void stage_lower_sw128(unsigned x, const unsigned short* src, i64 src_stride, int len,
                                                  int tid) {
    static_assert(NT % 8 == 0, "whole rows");
    constexpr int step = NT / 8;
    constexpr int iters = (64 + step - 1) / step;
    const int r0 = tid / 8, c = tid % 8;
    const unsigned short* s = src + r0 * src_stride + 8 * c;
    const i64 s_step = step * src_stride;
#pragma unroll
    for (int it = 0; it < iters; ++it) {
        const int i = r0 + it * step;
        const bool lower = (c >> 1) <= (i >> 4);
        if ((64 % step == 0 || i < 64) && (ZERO_UPPER || lower))
            cp_async16_to(x + i * 128 + ((c ^ (i & 7)) << 4), (WHOLE || i < len) && lower ? s : src,
                          (WHOLE || i < len) && lower);
        s += s_step;
    }
}
// Copies rows [0, 64) x DK bf16 of a row-major global matrix into the swizzled layout above at
// shared address `x` (rows >= len zero), by NT threads (this one `tid`), as stage_rows_by.
template <int NT, bool WHOLE = false>
__device__ __forceinline__ void stage_rows_sw128(unsigned x, const unsigned short* src, i64 src_stride, int len,
                                                 int tid) {
    constexpr int per_row = DK / 8;
    static_assert(NT % per_row == 0 && DK % 64 == 0, "whole rows of 64-column atoms");
    constexpr int step = NT / per_row;
    constexpr int iters = (64 + step - 1) / step;
    const int r0 = tid / per_row, c = tid % per_row;
    const unsigned short* s = src + r0 * src_stride + 8 * c;
    const i64 s_step = step * src_stride;
#pragma unroll 4
    for (int it = 0; it < iters; ++it) {
        const int i = r0 + it * step;
        if (64 % step == 0 || i < 64)
            cp_async16_to(x + (c >> 3) * 8192 + i * 128 + (((c & 7) ^ (i & 7)) << 4), WHOLE || i < len ? s : src,
                          WHOLE || i < len);
        s += s_step;
    }
}
#endif
