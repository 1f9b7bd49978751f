// chunk_recurrent_regs: chunk_recurrent (the same stages: chunk_state + chunk_output with
// recompute_w_u factored; the same inputs, outputs and non-finite rules) for bf16 inputs with
// K <= 128, shaped so that the state never leaves the registers. One warp per 16 state columns,
// VT / 16 warps per block of (sequence, value head, VT columns).
// Why so shaped: a warp holds its K x 16 slice of the state transposed, h^T, as the accumulator
// fragments of the product that updates it, and computes every product of the chunk transposed
// (the 16 state columns are the M rows of m16n8k16). The accumulator fragment of a lane is its A
// fragment (see a_from_acc), so each product's result is the next one's operand with no trip
// through shared memory and no exchange between warps; the warps of a block share only the
// staged rows of the chunk (one barrier per chunk).
// Exact on bf16 tensor cores: an f32 operand is split into three bf16 pieces (see split3; 24
// bits); bf16 inputs are exact. Input x f32 products take three passes (mma3), f32 x f32 six
// (mma6). With PIECES = 1 or 2 (the fast precision) the f32 operands are rounded to one or two
// pieces and the products take one, or two and three, passes.
// chunk_intra writes a_inv and p already split (PLANES: PIECES bf16 planes per row), so
// their operands are ldmatrix loads of staged rows.
// Per chunk (tok: its 64 rows; d, rk, scale rq, D_last from chunk_intra's scal):
//   KH^T    = h^T K^T
//   R^T     = v^T - KH^T diag(d rk)
//   v_new^T = R^T a_inv^T                       (a_inv lower triangular: 10 of 16 blocks)
//   o^T     = (h^T Q^T) diag(scale rq d) + v_new^T p^T   (p lower triangular too)
//   h^T     = d_last h^T + (v_new^T diag(rk D_last)) K
// SPLIT_OUT = 1 gives each 16 columns a second warp for the output: the state warp forms KH^T,
// v_new^T and the update (the chain that carries h from chunk to chunk), the output warp forms
// QH^T and o^T from the same h (shared memory) and from v_new^T (passed through shared memory),
// beside it. Why: one block of two warps per SM (B = 1, HV = 32) is bound by the latency of one
// warp's chain of products; the split shortens that chain from five products to three and puts
// four warps on each SM. Named barriers order the hand-overs (see the chunk loop).
// Segments (part != 0): where one sequence's (value head, column tile) blocks cannot fill the
// GPU, part 1 cuts each sequence into up to `segments` runs of chunks, one block per (segment,
// value head, tile), so that more, wider blocks run at once. A segment's entering state is
// formed by a warm-up: from a zero state over the w chunks before it (state only, no output),
// w the fewest whose summed log-decay (chunk_intra's chunk_decay) falls below warm_log, or a
// hard reset, or the sequence start (then from h0: no approximation at all). What the warm-up
// drops is the true entering state of its first chunk times the chunks' transitions, each
// exp(g) (I - beta k k^T) of norm at most exp(g) where beta |k|^2 lies in [0, 2] (chunk_intra
// marks chunks where it does not: +inf, never below the bound); so the entering state is exact
// up to exp(warm_log) (warm_log = -50: 2e-22) of the dropped state's norm. A value head whose
// boundaries all find such a w within warm_max chunks, with no non-finite chunk before its last
// boundary (NaN would stay in the state: the whole sequence must run), is segmented; part 2
// runs every other value head over whole sequences, so that both launches together cover each
// (sequence, value head) once. Both decide alike (head_segmented reads the same values in the
// same order). A non-finite v makes its columns of the state NaN from there on, in every later
// segment too, whose warm-up may not reach back to it: part 1 marks the columns of each
// segment's leaving state that are not finite (nan_cols), and part 3, after it, sets those
// columns of every later segment's outputs (and of the final state) to NaN, as the recurrence
// over the whole sequence would have them.
// Non-finite inputs, as chunk_recurrent: lv is the first row marked by chunk_intra (NaN
// scalings) or holding a non-finite v in this warp's columns; R is zeroed from lv on, the outputs
// from lv on and the state leaving the chunk are NaN for these columns.
#ifndef SPLIT_OUT
#define SPLIT_OUT 0
#endif
// KSPLIT = 2 (with SPLIT_OUT) gives each group two state warps, each forming KH^T over half of
// K and updating that half of h; they add their halves of KH^T through shared memory and both
// form v_new^T (the same value). The state chain per chunk shortens from three products to two
// and a half, and an SM holds six warps at B = 1, HV = 32.
#ifndef KSPLIT
#define KSPLIT 1
#endif
#if KSPLIT == 2 && !SPLIT_OUT
#error "KSPLIT = 2 needs SPLIT_OUT"
#endif
#if KSPLIT == 2 && DK % 32 != 0
#error "KSPLIT = 2 needs K a multiple of 32 (halves of whole 16-row blocks)"
#endif
// HBUF = 2 (with SPLIT_OUT) keeps h in two shared-memory buffers, the update of chunk c writing
// the one chunk c reads not: the state warps then need not wait (barrier 2) for the output warp
// to finish Q H^T before they overwrite h, and the output warp's Q H^T overlaps their update.
// Why: Nsight Compute (NOTES-GPU.md, call AN) put 18 % of the exact kernel's stall samples on
// the state warps waiting at barrier 2.
#ifndef HBUF
#define HBUF 1
#endif
#if HBUF == 2 && !SPLIT_OUT
#error "HBUF = 2 needs SPLIT_OUT"
#endif
// LATE_PLANES = 1 (the plain kernel, NBUF = 2): the a_inv and p planes in one buffer, the
// chunk's other rows (K, Q, v, scalings) in two; the next chunk's planes are queued once every
// warp has formed this chunk's output (their last reader), to land while the state is updated.
// Why: the exact 128-column kernel's two full stage buffers (2 x 104 KB) and its state (64 KB)
// exceed the shared memory, and with one buffer every chunk waited for its own rows at the top
// (Nsight Compute, NOTES-GPU.md call BA: 13 % of the stall samples there, 4 % at barriers).
// The default where two whole buffers do not fit (DELTANET_FUSED_LATE=0|1 forces it off or on).
#ifndef LATE_PLANES
#define LATE_PLANES 0
#endif
#if LATE_PLANES && (SPLIT_OUT || NBUF != 2)
#error "LATE_PLANES needs the plain kernel with two stage buffers"
#endif
// ROW_SKIP = 1: a chunk shorter than 64 rows (a sequence's last) skips the 16-row blocks past
// its end in every product (their rows are zero, and so are the results' rows there). The chunk
// step is then a generic lambda built twice: for whole chunks, as without ROW_SKIP, in the loop;
// for a short chunk, with the tests of its length, peeled off the loop. Why so: varlen's
// sequences end in short chunks (3 % of its chunks at 64 sequences in 65536 tokens, on average
// half empty), and tests of the length inside the unrolled loops cut them into blocks that the
// compiler schedules apart (whole chunks measured ~10 % slower), as does a second copy of the
// products inside the loop (3 %).
#ifndef ROW_SKIP
#define ROW_SKIP 0
#endif
// WGMMA = 1 (the plain kernel, sm_90a): K H^T, Q H^T and the update as warpgroup products
// (wgmma, mma.cuh), B read by the tensor cores from K and Q staged in the 128-byte swizzle; the
// triangular products (a_inv, p) stay on mma.sync. Each warpgroup (four warps, 64 state
// columns) issues a chunk's K H^T and Q H^T as one batch of 16 PIECES products and the update as
// one of 8 PIECES, instead of each warp issuing 128 PIECES and 64 PIECES m16n8k16 products with
// an ldmatrix per two (about 40 % of the exact step's instructions went to issuing and feeding
// them: NOTES-GPU.md, calls BE and BO).
#if WGMMA && (SPLIT_OUT || KSPLIT != 1 || ROW_SKIP || VT % 64 != 0 || DK % 64 != 0)
#error "WGMMA needs the plain kernel (no SPLIT_OUT, KSPLIT or ROW_SKIP), VT and DK multiples of 64"
#endif
// WG_TRI = 1 (with WGMMA): the triangular products (v_new^T = R^T a_inv^T, v_new^T p^T) as
// warpgroup products too, the a_inv and p planes staged as swizzled atoms with zeros above the
// diagonal blocks (see TRI_SKIP).
#ifndef WG_TRI
#define WG_TRI 0
#endif
#if WG_TRI && !WGMMA
#error "WG_TRI needs WGMMA"
#endif
// O_VIA_SMEM (16-bit o, no SPLIT_OUT): a warp's o^T leaves through its own columns of the
// staged v (read for the last time by R^T, by this warp alone): stmatrix with .trans lays it
// out as rows of o, which go to device memory as whole 16-byte stores (32 bytes a row and warp,
// one sector). Why: stored element by element, o took 32 two-byte stores a lane and chunk, with
// their address arithmetic and row tests (about 10 % of the fast kernel's instructions:
// NOTES-GPU.md, call BZ's profile). Taken where o is 16-byte aligned (else element by element).
#define O_VIA_SMEM (OUT_T != 0 && !SPLIT_OUT)
// P_IN_REC (with WG_TRI; chunk_intra built with it too): p is formed here, not staged. Per chunk
// each warpgroup forms its share of the columns of P' = (Q K^T) diag(rk) * D (D_il from gamma +
// lo and seg, 0 above the diagonal and past the chunk's end) as a warpgroup product of the staged
// Q and K (both operands in shared memory), writes it as the PIECES planes the triangular product
// reads, and the row factor scale rq_i (from |q_i|, summed here over the staged q) multiplies
// each output row at the end:
//   o^T = (QH^T diag(d) + v_new^T P'^T) diag(scale rq)
// Why: chunk_intra then reads no q and writes no p (the forward's q is read once, and p never
// goes through device memory), and the products here have their operands staged already.
#ifndef P_IN_REC
#define P_IN_REC 0
#endif
#if P_IN_REC && !WG_TRI
#error "P_IN_REC needs WG_TRI"
#endif
template <bool B>
struct Flag {
    static constexpr bool value = B;
};
#define GROUPS (VT / 16)  // 16-column groups, each with its state warps (and an output warp)
#define THREADS (GROUPS * 32 * (KSPLIT + SPLIT_OUT))
// With SPLIT_OUT the output warps alone stage the chunk's rows, off the state chain (every warp
// staging measured no faster for exact and 13 % slower for fast: NOTES-GPU.md, call AD).
#define STAGERS (SPLIT_OUT ? GROUPS * 32 : THREADS)  // threads that stage a chunk's rows
#define C 64
#define SK (DK + 8)      // K and Q rows (bf16): consecutive rows 4 banks apart, so the 8 rows of
                         // an ldmatrix hit distinct banks
#define SPL (PIECES * C + 8)  // a_inv and p rows: PIECES planes of 64 side by side
#define SVR (VT + 8)
#define NDT (DK / 8)     // h^T as 16 x 8 tiles over K
#define NTT (C / 8)      // 16 x 8 tiles over the chunk's rows
#define NDH (NDT / KSPLIT)  // tiles of h^T per state warp
// Tiles of h^T updated at once: an even divisor of NDH (the tiles go in pairs) up to 8.
#define UPD (NDH % 8 == 0 ? 8 : NDH % 6 == 0 ? 6 : NDH % 4 == 0 ? 4 : 2)
typedef unsigned short u16;
// Between the phases of a chunk: the compiler would otherwise keep row scalings loaded in one
// phase alive in registers for the next (they are reread from shared memory instead).
#define PHASE() asm volatile("" ::: "memory")
// Named barriers (ids 1, 2; 0 is __syncthreads) for the hand-overs between a group's warps.
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

struct RecParams {
    u64 q, k, v, a_inv, p, scal;  // q, k, v bf16; a_inv, p bf16 planes; scal f32 (chunk_intra)
    u64 h0;                       // [N, HV, K, V] f32, or 0
    u64 o;                        // [tokens, HV, V] out_t
    u64 final_state;              // [N, HV, K, V] f32, or 0
    u64 chunk_states;             // [chunks, HV, K, V] f32, or 0
    u64 chunk_start, chunk_len, seq_first_chunk;  // i64
    i64 seqs, h, hv;
    int tiled;
    int part;                     // 0: whole sequences; 1: segmented heads; 2: the other heads;
                                  // 3: non-finite state columns handed on (after part 1)
    u64 chunk_decay;              // [chunks, HV] f32 (chunk_intra), with part != 0
    u64 nan_cols;                 // [seqs, segments, HV, 2, V] int, with part 1 and 3
    i64 segments, min_seg, warm_max;  // most segments a sequence; chunks a segment at least;
                                      // warm-up chunks at most
    float warm_log;               // the summed log-decay that ends a warm-up (negative)
    u64 seq_order;                // i64 [N]: the sequences by decreasing chunk count (ties in
                                  // order). Blocks start about in index order, so the longest
                                  // sequences' items go first and the short ones fill the tail
                                  // (varlen: the last blocks to finish are short ones).
    float scale;                  // with P_IN_REC: the output scale, and whether q is l2-normed
    int l2norm;
};

// Segments of a sequence of cnt chunks, and where segment s of S starts.
__device__ __forceinline__ i64 seg_count(const RecParams& P, i64 cnt) {
    return max((i64)1, min(P.segments, cnt / P.min_seg));
}
__device__ __forceinline__ i64 seg_start(i64 c_first, i64 cnt, i64 s, i64 S) { return c_first + cnt * s / S; }

// Warm-up chunks before chunk cb (a segment's first; chunks from c_first), or -1 if more than
// warm_max would be needed. Every lane of the warp takes part and gets the same answer.
__device__ i64 warm_chunks(const RecParams& P, i64 c_first, i64 cb, i64 j, int lane) {
    const float* dec = (const float*)P.chunk_decay;
    const i64 avail = cb - c_first, most = min(avail, P.warm_max);
    float carry = 0.0f;
    for (i64 w0 = 0; w0 < most; w0 += 32) {
        const i64 w = w0 + lane;  // chunk cb - 1 - w
        const bool in = w < most;
        const float x = in ? dec[(cb - 1 - w) * P.hv + j] : 0.0f;
        const bool reset = in && x == -__int_as_float(0x7f800000);
        float sum = reset ? 0.0f : x;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, sum, o);
            if (lane >= o) sum = y + sum;
        }
        sum = carry + sum;
        const unsigned stop = __ballot_sync(0xffffffffu, reset || (in && sum < P.warm_log));
        if (stop) return w0 + __ffs(stop);
        carry = __shfl_sync(0xffffffffu, sum, 31);
    }
    return avail <= P.warm_max ? avail : -1;
}

// Whether value head j of sequence n (chunks [c_first, c_end)) runs in segments.
__device__ bool head_segmented(const RecParams& P, i64 c_first, i64 c_end, i64 j, int lane) {
    const i64 cnt = c_end - c_first, S = seg_count(P, cnt);
    if (S < 2) return false;
    const float* dec = (const float*)P.chunk_decay;
    bool nan = false;
    const i64 last = seg_start(c_first, cnt, S - 1, S);
#pragma unroll 4
    for (i64 c = c_first + lane; c < last; c += 32) nan |= isnan(dec[c * P.hv + j]);
    if (__any_sync(0xffffffffu, nan)) return false;
    for (i64 s = 1; s < S; ++s)
        if (warm_chunks(P, c_first, seg_start(c_first, cnt, s, S), j, lane) < 0) return false;
    return true;
}

struct Stage {
    u16* K;       // [C][SK]
    u16* Q;       // [C][SK]
    u16* X;       // [C][SPL] a_inv planes
    u16* Pm;      // [C][SPL] p planes
    u16* Vr;      // [C][SVR] v, this block's columns
    float4* sc;   // [C] row scalings
    float4* sc2;  // [C] with P_IN_REC: gamma, lo, seg, rk of each row
    float* rp;    // [C] with P_IN_REC: scale rq of each row (formed here)
};
// A stage buffer's a_inv and p planes, and its other rows (scalings first: 16-byte aligned; with
// WGMMA K and Q first, 1024-aligned).
__device__ __forceinline__ size_t planes_bytes() { return WG_TRI ? (size_t)2 * PIECES * 8192 : (size_t)2 * C * SPL * 2; }
#if WGMMA
// K and Q first (1024-aligned: every part before them is a multiple of 1024 bytes), unpadded;
// with P_IN_REC the buffer rounded up to a multiple of 1024 bytes (the next one's K follows).
__device__ __forceinline__ size_t rows_bytes() {
    const size_t b = (size_t)(2 * C * DK + C * SVR) * 2 + C * 16;
    return P_IN_REC ? (b + C * 20 + 1023) / 1024 * 1024 : b;
}
#else
__device__ __forceinline__ size_t rows_bytes() { return (size_t)(2 * C * SK + C * SVR) * 2 + C * 16; }
#endif
// Every stage buffer: NBUF of both parts, or with LATE_PLANES one of the planes.
__device__ __forceinline__ size_t stages_bytes() {
    return LATE_PLANES ? planes_bytes() + NBUF * rows_bytes() : NBUF * (planes_bytes() + rows_bytes());
}
__device__ __forceinline__ Stage stage_at(unsigned char* base, int b) {
    Stage s;
    unsigned char* planes = base + (LATE_PLANES ? 0 : b * (planes_bytes() + rows_bytes()));
    unsigned char* rows = LATE_PLANES ? base + planes_bytes() + b * rows_bytes() : planes + planes_bytes();
    s.X = (u16*)planes;
    s.Pm = s.X + (WG_TRI ? PIECES * 4096 : C * SPL);
#if WGMMA
    s.K = (u16*)rows;
    s.Q = s.K + C * DK;
    s.Vr = s.Q + C * DK;
    s.sc = (float4*)(s.Vr + C * SVR);
    s.sc2 = s.sc + C;
    s.rp = (float*)(s.sc2 + C);
#else
    s.sc = (float4*)rows;
    s.K = (u16*)(s.sc + C);
    s.Q = s.K + C * SK;
    s.Vr = s.Q + C * SK;
#endif
    return s;
}

// Offset of state element (nd, e) of a lane from the lane's first one (row 2t, column g).
__device__ __forceinline__ int state_at(int nd, int e) { return (8 * nd + (e & 1)) * DV + 8 * (e >> 1); }

// acc = h^T M^T (16 x 64) for the chunk's staged rows M (K or Q, [C][SK] bf16), over KB blocks of
// 16 of K from block kb0.
// With PART, row blocks of 16 at or past `rows` (the chunk's length) are skipped.
template <int KB = DK / 16, bool PART = false>
__device__ __forceinline__ void h_times(float (&acc)[NTT][4], const float4* hs,
                                        const SmemRows& M0, int kb0 = 0, int rows = C) {
    hs += 2 * kb0 * 32;
    const SmemRows M = {M0.b + 2u * 16 * kb0, M0.bt};
#pragma unroll
    for (int a = 0; a < NTT; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[a][e] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
        const float4 x0 = hs[2 * kb * 32], x1 = hs[(2 * kb + 1) * 32];
        const float f0[4] = {x0.x, x0.y, x0.z, x0.w}, f1[4] = {x1.x, x1.y, x1.z, x1.w};
        const APieces ah = a_from_acc(f0, f1);
#pragma unroll
        for (int nb = 0; nb < NTT; nb += 2) {
            if (PART && 8 * nb >= rows) continue;
            unsigned b[4];
            ldsm_b(b, M, SK, 8 * nb, 16 * kb);
            mma3(acc[nb], ah, b[0], b[1]);
            mma3(acc[nb + 1], ah, b[2], b[3]);
        }
    }
}

// kacc = h^T K^T and qacc = h^T Q^T (16 x 64 each) from one split of h per k16 step: the plain
// kernel forms both at once where the chunk has output (h is read and split once, not twice).
template <bool PART = false>
__device__ __forceinline__ void h_times2(float (&kacc)[NTT][4], float (&qacc)[NTT][4], const float4* hs,
                                         const SmemRows& K, const SmemRows& Q, int rows = C) {
#pragma unroll
    for (int a = 0; a < NTT; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) kacc[a][e] = qacc[a][e] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < DK / 16; ++kb) {
        const float4 x0 = hs[2 * kb * 32], x1 = hs[(2 * kb + 1) * 32];
        const float f0[4] = {x0.x, x0.y, x0.z, x0.w}, f1[4] = {x1.x, x1.y, x1.z, x1.w};
        const APieces ah = a_from_acc(f0, f1);
#pragma unroll
        for (int nb = 0; nb < NTT; nb += 2) {
            if (PART && 8 * nb >= rows) continue;
            unsigned bk[4], bq[4];
            ldsm_b(bk, K, SK, 8 * nb, 16 * kb);
            ldsm_b(bq, Q, SK, 8 * nb, 16 * kb);
            mma3(kacc[nb], ah, bk[0], bk[1]);
            mma3(kacc[nb + 1], ah, bk[2], bk[3]);
            mma3(qacc[nb], ah, bq[0], bq[1]);
            mma3(qacc[nb + 1], ah, bq[2], bq[3]);
        }
    }
}

// acc += a M^T (16 x 64) for M a lower-triangular chunk matrix staged as PIECES bf16 planes
// (a_inv or p, [C][SPL]) and a an f32 accumulator tile set: block (rows 16m.., columns 16kb..)
// of M is zero for kb > m and skipped; with PART, so are block rows m at or past `rows`.
template <bool PART = false>
__device__ __forceinline__ void times_planes(float (&acc)[NTT][4], const float (&a)[NTT][4],
                                             const SmemRows& M, int rows = C) {
#pragma unroll
    for (int kb = 0; kb < C / 16; ++kb) {
        if (PART && 16 * kb >= rows) continue;
        const APieces ap = a_from_acc(a[2 * kb], a[2 * kb + 1]);
#pragma unroll
        for (int m = kb; m < C / 16; ++m) {
            if (PART && 16 * m >= rows) continue;
            unsigned x[PIECES][4], b0[PIECES][2], b1[PIECES][2];
#pragma unroll
            for (int pl = 0; pl < PIECES; ++pl) {
                ldsm_b(x[pl], M, SPL, 16 * m, 16 * kb + pl * C);
                b0[pl][0] = x[pl][0];
                b0[pl][1] = x[pl][1];
                b1[pl][0] = x[pl][2];
                b1[pl][1] = x[pl][3];
            }
            mma6(acc[2 * m], ap, b0);
            mma6(acc[2 * m + 1], ap, b1);
        }
    }
}

#if WGMMA
// With one batch of products (PIECES < 3: fast), Q H^T is issued as a second group after K H^T
// and left running beside v_new until qh_wait (NOTES-GPU.md, call BP: 3 % faster). With three
// pieces (exact) both go in batches of half of K, waited for at once: forming Q H^T apart just
// before the output (h split a second time) avoided ptxas's 92 bytes of spills but measured 5-7 %
// slower (call BP).
#define QH_LATE (PIECES < 3)
// kacc = h^T K^T and qacc = h^T Q^T (64 x 64 each a warpgroup) over all of K: each k16 step's A
// (h's pieces) from the lane's fragments of h, the products of a batch issued together. K and
// Q at shared addresses kx, qx.
__device__ __forceinline__ void h_times_wg(float (&kacc)[NTT][4], float (&qacc)[NTT][4], const float4* hs,
                                           unsigned kx, unsigned qx) {
#pragma unroll
    for (int a = 0; a < NTT; ++a)
#pragma unroll
        for (int e = 0; e < 4; ++e) kacc[a][e] = qacc[a][e] = 0.0f;
    // k16 steps a batch: all of K, or with three pieces half of it (their A operands and the
    // two accumulators would not fit the registers together).
    constexpr int KBG = PIECES > 2 ? DK / 32 : DK / 16;
    static_assert(!QH_LATE || KBG == DK / 16, "Q H^T left running: one batch");
#pragma unroll
    for (int kb0 = 0; kb0 < DK / 16; kb0 += KBG) {
        APieces ah[KBG];
#pragma unroll
        for (int i = 0; i < KBG; ++i) {
            const int kb = kb0 + i;
            const float4 x0 = hs[2 * kb * 32], x1 = hs[(2 * kb + 1) * 32];
            const float f0[4] = {x0.x, x0.y, x0.z, x0.w}, f1[4] = {x1.x, x1.y, x1.z, x1.w};
            ah[i] = a_from_acc(f0, f1);
        }
        wg_pin(kacc);
        wg_pin(qacc);
        wg_fence();
        if (QH_LATE) {
#pragma unroll
            for (int i = 0; i < KBG; ++i)
#pragma unroll
                for (int pc = PIECES - 1; pc >= 0; --pc) wgmma64<0>(kacc, ah[i].p[pc], desc_xt(kx, kb0 + i));
            wg_commit();
#pragma unroll
            for (int i = 0; i < KBG; ++i)
#pragma unroll
                for (int pc = PIECES - 1; pc >= 0; --pc) wgmma64<0>(qacc, ah[i].p[pc], desc_xt(qx, kb0 + i));
            wg_commit();
            wg_wait<1>();
            wg_pin(kacc);
            return;
        }
#pragma unroll
        for (int i = 0; i < KBG; ++i)
#pragma unroll
            for (int pc = PIECES - 1; pc >= 0; --pc) {
                wgmma64<0>(kacc, ah[i].p[pc], desc_xt(kx, kb0 + i));
                wgmma64<0>(qacc, ah[i].p[pc], desc_xt(qx, kb0 + i));
            }
        wg_commit();
        wg_wait<0>();
        wg_pin(kacc);
        wg_pin(qacc);
    }
}
#if WG_TRI
// The rows of M a k16 step KB reads: from its diagonal block on (n = 64 - 16 KB: no product of
// the blocks above the diagonal), or all 64 (the blocks above staged as zeros): ptxas serializes
// every product of a batch whose accumulator tiles differ between products (C7511).
#ifndef TRI_SKIP
#define TRI_SKIP 0
#endif
#define TRI_N(kb) (TRI_SKIP ? C - 16 * (kb) : C)
// acc += a M^T as times_planes does, M's PIECES planes swizzled atoms at shared address x: per
// k16 step KB (columns 16 KB.. of M), TRI_N(KB) rows of M (the last ones) into the last tiles of
// acc; mma6's products of a's pieces and M's planes, small first.
template <int KB>
__device__ __forceinline__ void tri_step(float (&acc)[NTT][4], const APieces& ap, unsigned x) {
    constexpr int N = TRI_N(KB);
    const unsigned at = x + KB * 32 + (C - N) * 128;
#if PIECES > 2
    wgmma_tail<N, 0>(acc, ap.p[2], wg_desc(at));
    wgmma_tail<N, 0>(acc, ap.p[1], wg_desc(at + 8192));
    wgmma_tail<N, 0>(acc, ap.p[0], wg_desc(at + 2 * 8192));
#endif
#if PIECES > 1
    wgmma_tail<N, 0>(acc, ap.p[1], wg_desc(at));
    wgmma_tail<N, 0>(acc, ap.p[0], wg_desc(at + 8192));
#endif
    wgmma_tail<N, 0>(acc, ap.p[0], wg_desc(at));
}
// WAIT = false: the products issued only (the caller waits).
template <bool WAIT = true>
__device__ __forceinline__ void times_planes_wg(float (&acc)[NTT][4], const float (&a)[NTT][4], unsigned x) {
    APieces ap[C / 16];
#pragma unroll
    for (int kb = 0; kb < C / 16; ++kb) ap[kb] = a_from_acc(a[2 * kb], a[2 * kb + 1]);
    wg_pin(acc);
    wg_fence();
    tri_step<0>(acc, ap[0], x);
    tri_step<1>(acc, ap[1], x);
    tri_step<2>(acc, ap[2], x);
    tri_step<3>(acc, ap[3], x);
    wg_commit();
    if (WAIT) {
        wg_wait<0>();
        wg_pin(acc);
    }
}
#endif
// Q H^T where it was left running (QH_LATE).
__device__ __forceinline__ void qh_wait(float (&qacc)[NTT][4]) {
    if (QH_LATE) {
        wg_wait<0>();
        wg_pin(qacc);
    }
}
#endif

// REC_REGS (0: the compiler's choice, up to 255 at one block an SM) caps the registers a thread
// (`__maxnreg__`, which NVRTC takes only without `__launch_bounds__`).
// The fast 128-column kernel takes 242 by choice and compiles in 192 without spills, which
// leaves room beside it for a chunk_intra block (64 x 256) or a producer warpgroup.
#ifndef REC_REGS
#define REC_REGS 0
#endif
#if REC_REGS
extern "C" __global__ void __maxnreg__(REC_REGS) chunk_recurrent_regs(const RecParams P) {
#else
extern "C" __global__ void __launch_bounds__(THREADS, 1) chunk_recurrent_regs(const RecParams P) {
#endif
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u16* __restrict__ q = (const u16*)P.q;
    const u16* __restrict__ k = (const u16*)P.k;
    const u16* __restrict__ v = (const u16*)P.v;
    const u16* __restrict__ a_inv = (const u16*)P.a_inv;
    const u16* __restrict__ pin = (const u16*)P.p;
    const float4* __restrict__ scal = (const float4*)P.scal;
    // h0 and final_state may be one buffer: each warp reads its slice of h0 before its first
    // chunk and writes the same slice after its last.
    const float* h0 = (const float*)P.h0;
    out_t* __restrict__ o = (out_t*)P.o;
    float* fin = (float*)P.final_state;
    float* __restrict__ hst = (float*)P.chunk_states;
    const i64* __restrict__ chunk_start = (const i64*)P.chunk_start;
    const i64* __restrict__ chunk_len = (const i64*)P.chunk_len;
    const i64* __restrict__ seq_first_chunk = (const i64*)P.seq_first_chunk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int grp = warp % GROUPS, role = warp / GROUPS;
#if WGMMA
    if (smem_addr(smem_raw) & 1023u) __trap();  // the swizzled atoms need 1024-byte alignment
#endif
    const bool state_warp = (WGMMA && !SPLIT_OUT) || role < KSPLIT;  // else an output warp
    // This state warp's half of K (KSPLIT = 2): tiles [nd0, nd0 + NDH) of h^T.
    const int half = state_warp ? role : 0, nd0 = half * NDH;
    const i64 hv = P.hv, tiles = DV / VT, kv = (i64)DK * DV;
    // Fragment element e of tile nb: row (state column) g + 8 (e >> 1), column 8 nb + 2t + (e & 1).
    const int cw = 16 * grp;
    // This lane's row of the transposing loads and stores of 8 x 8 tiles of the staged v (bytes
    // from its start): row (lane & 7) + 8 (lane >> 4), column cw + 8 ((lane >> 3) & 1), so that
    // register i of a 4-tile access is row tile i >> 1, column half i & 1.
    const unsigned v_lane = 2u * (((lane & 7) + 8 * (lane >> 4)) * SVR + cw + 8 * ((lane >> 3) & 1));
#if O_VIA_SMEM
    const bool o_vec = (P.o & 15) == 0;
#endif
    // This group's state slice (see hs below) in buffer 0 of HBUF, after the stage buffers.
    float4* hs_all = (float4*)(smem_raw + stages_bytes());
    float4* const hs0 = hs_all + grp * (NDT * 32) + lane;
    constexpr int HSTRIDE = GROUPS * NDT * 32;  // float4 a state buffer
#if SPLIT_OUT
    // v_new^T of this group in fragment order, then the groups' first bad rows (lv).
    float4* vx = hs_all + GROUPS * (HBUF * NDT * 32) + grp * (NTT * 32) + lane;
#if KSPLIT == 2
    // The two state warps' halves of KH^T, then lv.
    float4* px = hs_all + GROUPS * (HBUF * NDT + NTT) * 32 + grp * (2 * NTT * 32) + lane;
    int* lv_at = (int*)(hs_all + GROUPS * (HBUF * NDT + 3 * NTT) * 32) + grp;
#else
    int* lv_at = (int*)(hs_all + GROUPS * (HBUF * NDT + NTT) * 32) + grp;
#endif
#endif

    const i64 segs = P.part == 1 || P.part == 3 ? P.segments : 1;
    int* const nan_cols = (int*)P.nan_cols;
    if (P.part == 3) {
        // One block per (sequence, segment s >= 1, value head): a column not finite in the state
        // leaving any earlier segment is NaN in every output row of segment s.
        BLOCK_LOOP(item, P.seqs * segs * hv) {
            const i64 j = item % hv, sn = item / hv, s = sn % segs, n = sn / segs;
            const i64 c_first = seq_first_chunk[n], c_end = seq_first_chunk[n + 1];
            if (s == 0 || !head_segmented(P, c_first, c_end, j, lane)) continue;
            const i64 cnt = c_end - c_first, S = seg_count(P, cnt);
            if (s >= S) continue;
            const i64 cs = seg_start(c_first, cnt, s, S), ce = seg_start(c_first, cnt, s + 1, S);
            const i64 t0 = chunk_start[cs], t1 = chunk_start[ce - 1] + chunk_len[ce - 1];
            for (int col = threadIdx.x; col < DV; col += THREADS) {
                bool bad = false;
                for (i64 s2 = 0; s2 < s; ++s2)
#pragma unroll
                    for (int hh = 0; hh < KSPLIT; ++hh)
                        bad |= nan_cols[(((n * segs + s2) * hv + j) * 2 + hh) * DV + col] != 0;
                if (!bad) continue;
                for (i64 t = t0; t < t1; ++t) o[(t * hv + j) * DV + col] = from_f(__int_as_float(0x7fc00000));
                if (fin && s == S - 1)
                    for (int r = 0; r < DK; ++r) fin[(n * hv + j) * kv + (i64)r * DV + col] = __int_as_float(0x7fc00000);
            }
        }
        return;
    }
    BLOCK_LOOP(item, P.seqs * segs * hv * tiles) {
        const i64 tile = item % tiles, rest = item / tiles;
        const i64 j = rest % hv, sn = rest / hv, s = sn % segs, n = ((const i64*)P.seq_order)[sn / segs];
        const i64 c_first = seq_first_chunk[n], c_end = seq_first_chunk[n + 1];
        // This item's chunks [c_from, ce), its outputs from cs on.
        i64 c_from = c_first, cs = c_first, ce = c_end;
        bool last_seg = true;
        if (P.part != 0) {
            // Every warp decides alike: the branches below are the block's.
            if (head_segmented(P, c_first, c_end, j, lane) != (P.part == 1)) continue;
            if (P.part == 1) {
                const i64 cnt = c_end - c_first, S = seg_count(P, cnt);
                if (s >= S) continue;
                cs = seg_start(c_first, cnt, s, S);
                ce = seg_start(c_first, cnt, s + 1, S);
                last_seg = s == S - 1;
                c_from = s == 0 ? cs : cs - warm_chunks(P, c_first, cs, j, lane);
            }
        }
        const i64 kh = qk_head(j, P.h, hv, P.tiled);
        const i64 c0 = tile * VT;
        // Queues the rows of the chunk at `start` (len rows) into stage buffer b (rows past the
        // chunk's end are zero): its planes (what & 2) and its other rows (what & 1).
        // With SPLIT_OUT the output warps stage the rows: the copies stay off the state chain.
        auto issue_rows = [&](auto whole, i64 start, int len, int b, int what) {
            constexpr bool W = decltype(whole)::value;
            const int tid = threadIdx.x - (SPLIT_OUT ? KSPLIT * GROUPS * 32 : 0);
            const Stage st = stage_at(smem_raw, b);
            if (what & 1) {
#if WGMMA
                stage_rows_sw128<STAGERS, W>(smem_addr(st.K), k + (start * P.h + kh) * DK, P.h * DK, len, tid);
                stage_rows_sw128<STAGERS, W>(smem_addr(st.Q), q + (start * P.h + kh) * DK, P.h * DK, len, tid);
#else
                stage_rows_by<u16, DK, STAGERS, false, W>(st.K, SK, k + (start * P.h + kh) * DK, P.h * DK, len, tid);
                stage_rows_by<u16, DK, STAGERS, false, W>(st.Q, SK, q + (start * P.h + kh) * DK, P.h * DK, len, tid);
#endif
            }
#if WG_TRI
            if (what & 2) {
                const i64 xrow = (start * hv + j) * (PIECES * C), xstride = hv * PIECES * C;
#pragma unroll
                for (int pc = 0; pc < PIECES; ++pc) {
                    stage_lower_sw128<STAGERS, !TRI_SKIP, W>(smem_addr(st.X) + pc * 8192, a_inv + xrow + pc * C, xstride, len, tid);
                    if (!P_IN_REC)
                        stage_lower_sw128<STAGERS, !TRI_SKIP, W>(smem_addr(st.Pm) + pc * 8192, pin + xrow + pc * C, xstride, len, tid);
                }
            }
            if (false) {
#else
            if (what & 2) {
#endif
                // a_inv and p plane by plane (64 bf16 each: the pieces of a row divide the
                // stagers), their 16 x 16 blocks on and below the diagonal only: times_planes
                // reads no others, and chunk_intra writes no others.
                const i64 xrow = (start * hv + j) * (PIECES * C), xstride = hv * PIECES * C;
#pragma unroll
                for (int pc = 0; pc < PIECES; ++pc) {
                    stage_rows_by<u16, C, STAGERS, true, W>(st.X + pc * C, SPL, a_inv + xrow + pc * C, xstride, len, tid);
                    stage_rows_by<u16, C, STAGERS, true, W>(st.Pm + pc * C, SPL, pin + xrow + pc * C, xstride, len, tid);
                }
            }
            if (what & 1) {
                stage_rows_by<u16, VT, STAGERS, false, W>(st.Vr, SVR, v + (start * hv + j) * DV + c0, hv * DV, len, tid);
#if P_IN_REC
                // Rows of eight scalings: the first four to sc, the others to sc2.
                const float* s8 = (const float*)P.scal + (start * hv + j) * 8;
                stage_rows_by<float, 4, STAGERS, false, W>((float*)st.sc, 4, s8, hv * 8, len, tid);
                stage_rows_by<float, 4, STAGERS, false, W>((float*)st.sc2, 4, s8 + 4, hv * 8, len, tid);
#else
                stage_rows_by<float, 4, STAGERS, false, W>((float*)st.sc, 4, (const float*)(scal + start * hv + j), hv * 4, len, tid);
#endif
            }
            cp_async_commit();
        };
        // Whole chunks (all but a sequence's last) stage without row tests.
        auto issue = [&](i64 start, int len, int b, int what) {
            if (SPLIT_OUT && state_warp) return;
            if (len == C) {
                issue_rows(Flag<true>{}, start, len, b, what);
            } else {
                issue_rows(Flag<false>{}, start, len, b, what);
            }
        };
        // hs[32 nd] = {h[8 nd + 2t + (e & 1)][c0 + cw + g + 8 (e >> 1)] : e < 4}: this lane's
        // accumulator fragment of tile nd of h^T (element e at offset state_at(nd, e) from the
        // lane's first element in the state layout).
        const i64 sbase = (n * hv + j) * kv + c0 + cw + g + 2 * t * DV;
        if (state_warp)
#pragma unroll
        for (int nd = nd0; nd < nd0 + NDH; ++nd) {
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) x[e] = h0 && c_from == c_first ? h0[sbase + state_at(nd, e)] : 0.0f;
            hs0[32 * nd] = make_float4(x[0], x[1], x[2], x[3]);
        }
        __syncthreads();  // every warp is past the previous item's reads of the stage buffers

        // Where chunks ci and ci + 1 start and how long they are, carried in registers: each
        // chunk loads those of ci + 2, so that no staging waits on these loads.
        auto chunk_at = [&](i64 c, i64& st, int& ln) {
            st = c < ce ? chunk_start[c] : 0;
            ln = c < ce ? (int)chunk_len[c] : 0;
        };
        i64 start, nx_start;
        int len, nx_len;
        chunk_at(c_from, start, len);
        chunk_at(c_from + 1, nx_start, nx_len);
        if (c_from < ce) issue(start, len, 0, 3);
#if ROW_SKIP
        // One chunk step; whole = false: the chunk is short. A short chunk is always an item's
        // last: it is peeled off the loop (below), so that the loop over whole chunks runs the
        // products as the build without ROW_SKIP does.
        auto step = [&](auto part, i64 ci) {
            constexpr bool whole = !decltype(part)::value;
#else
        for (i64 ci = c_from; ci < ce; ++ci) {
            constexpr bool whole = true;
#endif
            i64 nn_start;
            int nn_len;
            chunk_at(ci + 2, nn_start, nn_len);
            const bool emit = ci >= cs;  // else a warm-up chunk: the state only
            const int b = NBUF == 2 ? (int)((ci - c_from) & 1) : 0;
            cp_async_wait<0>();
#if WGMMA
            fence_proxy_async();  // the staged K and Q are read by the tensor cores
#endif
            // This chunk's rows are visible to every warp, and every warp is past chunk ci - 1,
            // the last reader of the other buffer.
            __syncthreads();
#if NBUF == 2
            if (ci + 1 < ce) issue(nx_start, nx_len, b ^ 1, LATE_PLANES ? 1 : 3);
#endif
            const Stage st = stage_at(smem_raw, b);
            // h entering the chunk, and where the update writes h leaving it.
            const int hb = HBUF == 2 ? (int)((ci - c_from) & 1) : 0;
            const float4* hs = hs0 + hb * HSTRIDE;
            float4* hs_up = hs0 + (HBUF == 2 ? hb ^ 1 : 0) * HSTRIDE;
            const SmemRows Kr = smem_rows(st.K, SK), Qr = smem_rows(st.Q, SK);
            const SmemRows Xr = smem_rows(st.X, SPL), Pr = smem_rows(st.Pm, SPL);
#if P_IN_REC
            // P', this warpgroup's NPC columns of it, issued first (h_times_wg's wait for K H^T
            // covers it); then scale rq of the rows, beside the tensor cores.
            constexpr int NWG = THREADS / 128, NPC = C / NWG;
            float pacc[NPC / 8][4];
#pragma unroll
            for (int a = 0; a < NPC / 8; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) pacc[a][e] = 0.0f;
            {
                const unsigned qx = smem_addr(st.Q), kx = smem_addr(st.K) + (warp >> 2) * NPC * 128;
                wg_pin(pacc);
                wg_fence();
#pragma unroll
                for (int kb = 0; kb < DK / 16; ++kb) wgmma_ss<NPC>(pacc, desc_xt(qx, kb), desc_xt(kx, kb));
                wg_commit();
            }
            {
                // |q_r|^2 over the staged (swizzled) row r, TPR threads a row.
                constexpr int TPR = THREADS / C, CPT = DK / 8 / TPR;
                static_assert(THREADS % C == 0 && (DK / 8) % TPR == 0, "whole rows");
                const int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
                float sq = 0.0f;
                if (P.l2norm) {
                    const unsigned char* qb = (const unsigned char*)st.Q;
#pragma unroll
                    for (int u = 0; u < CPT; ++u) {
                        const int c = part * CPT + u;
                        const uint4 w = *(const uint4*)(qb + (c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
                        const unsigned wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                        for (int x = 0; x < 4; ++x) {
                            const float lo_ = bf16_lo(wv[x]), hi_ = bf16_hi(wv[x]);
                            sq = fmaf(lo_, lo_, sq);
                            sq = fmaf(hi_, hi_, sq);
                        }
                    }
#pragma unroll
                    for (int o_ = TPR / 2; o_ > 0; o_ >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o_);
                }
                if (part == 0) st.rp[r] = P.l2norm ? P.scale * (1.0f / sqrtf(sq + 1e-6f)) : P.scale;
            }
#endif
            // The state entering the chunk, by the warp that reads h anyway (the output warp when
            // split: off the state warp's chain).
            if (hst && emit && (!SPLIT_OUT || !state_warp)) {
                float* hp = hst + (ci * hv + j) * kv + c0 + cw + g + 2 * t * DV;
#pragma unroll
                for (int nd = 0; nd < NDT; ++nd) {
                    const float4 x = hs[32 * nd];
                    hp[state_at(nd, 0)] = x.x;
                    hp[state_at(nd, 1)] = x.y;
                    hp[state_at(nd, 2)] = x.z;
                    hp[state_at(nd, 3)] = x.w;
                }
            }
#if P_IN_REC
            // P' into the planes the output's triangular product reads (every element of this
            // warpgroup's columns: zeros above the diagonal and past the chunk's end).
            // Accumulator element (i, e): row 16 (warp % 4) + g + 8 (e >> 1), column
            // lb + 8 i + 2t + (e & 1); a pair of columns is one 4-byte word a plane. With one
            // bf16 piece it runs while the tensor cores form v_new (its registers fit beside
            // that product's operands only then), the decay's exponent without lo (relative
            // 2^-22 |gamma| against the piece's 2^-9) and the approximate exp.
            auto p_epilogue = [&]() {
                wg_pin(pacc);
                const int wq = warp & 3, lb = (warp >> 2) * NPC;
                const float4 rr[2] = {st.sc2[16 * wq + g], st.sc2[16 * wq + g + 8]};
#pragma unroll
                for (int i = 0; i < NPC / 8; ++i) {
                    const int l0 = lb + 8 * i + 2 * t;
                    // A tile wholly above the diagonal: zeros; with one piece, wholly below it
                    // in a whole chunk: no mask (both the same for the whole warp).
                    const bool above = lb + 8 * i > 16 * wq + 15;
                    const bool below = PIECES == 1 && lb + 8 * i + 7 < 16 * wq && len == C;
                    float4 cl[2];
                    if (!above) {
                        cl[0] = st.sc2[l0];
                        cl[1] = st.sc2[l0 + 1];
                    }
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int r = 16 * wq + g + 8 * hh;
                        float x[2] = {0.0f, 0.0f};
                        if (!above) {
#pragma unroll
                            for (int u = 0; u < 2; ++u) {
                                // D_rl: the exp of the difference, zero across a reset (as
                                // decay(), but the exp taken unconditionally and selected, as in
                                // chunk_intra's tiles: decay()'s conditional exp compiles to
                                // branches around each element).
                                const float dg = PIECES == 1 ? rr[hh].x - cl[u].x
                                                             : (rr[hh].x - cl[u].x) + (rr[hh].y - cl[u].y);
                                const float e = PIECES == 1 ? __expf(dg) : expf(dg);
                                const float dec = rr[hh].z == cl[u].z ? e : 0.0f;
                                const float y = pacc[i][2 * hh + u] * cl[u].w * dec;
                                x[u] = below || (l0 + u <= r && r < len) ? y : 0.0f;
                            }
                        }
                        unsigned pw[3];
                        split3(x[0], x[1], pw[0], pw[1], pw[2]);
                        unsigned char* dst = (unsigned char*)st.Pm + r * 128 + (((l0 >> 3) ^ (r & 7)) << 4) + (l0 & 7) * 2;
#pragma unroll
                        for (int pc = 0; pc < PIECES; ++pc) *(unsigned*)(dst + pc * 8192) = pw[pc];
                    }
                }
            };
#endif
            // o^T = QH^T diag(scale rq d) + v_new^T p^T, p lower triangular as a_inv: the first
            // term needs only h, the second v_new.
            auto scale_qh = [&](float (&qh)[NTT][4]) {
#pragma unroll
                for (int nb = 0; nb < NTT; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) qh[nb][e] *= st.sc[8 * nb + 2 * t + (e & 1)].y;
            };
            auto output_rest = [&](float (&qh)[NTT][4], const float (&vn)[NTT][4], int lv) {
#if WG_TRI
                times_planes_wg(qh, vn, smem_addr(st.Pm));
#if P_IN_REC
#pragma unroll
                for (int nb = 0; nb < NTT; ++nb) {
                    const float2 f = *(const float2*)(st.rp + 8 * nb + 2 * t);
                    qh[nb][0] *= f.x;
                    qh[nb][1] *= f.y;
                    qh[nb][2] *= f.x;
                    qh[nb][3] *= f.y;
                }
#endif
#else
                times_planes<!whole>(qh, vn, Pr, len);
#endif
#if O_VIA_SMEM
                if (o_vec) {
                    if (lv < len) {  // the same for the whole warp
#pragma unroll
                        for (int nb = 0; nb < NTT; ++nb)
#pragma unroll
                            for (int e = 0; e < 4; ++e)
                                if (8 * nb + 2 * t + (e & 1) >= lv) qh[nb][e] = __int_as_float(0x7fc00000);
                    }
                    const unsigned vb = smem_addr(st.Vr) + v_lane;
#pragma unroll
                    for (int nb = 0; nb < NTT; nb += 2) {
                        const unsigned x[4] = {pack_out(qh[nb][0], qh[nb][1]), pack_out(qh[nb][2], qh[nb][3]),
                                               pack_out(qh[nb + 1][0], qh[nb + 1][1]),
                                               pack_out(qh[nb + 1][2], qh[nb + 1][3])};
                        stsm_x4_t(vb + 2u * (8 * nb) * SVR, x);
                    }
                    __syncwarp();
                    // Lane: 16 bytes of rows (lane & 7) + 8 (lane >> 4) + 16 i, columns
                    // 8 ((lane >> 3) & 1) of the warp's 16: eight lanes read eight rows (distinct
                    // banks) and a store writes 16 whole 32-byte row pieces.
                    const int r0 = (lane & 7) + 8 * (lane >> 4), c8 = cw + 8 * ((lane >> 3) & 1);
                    out_t* op = o + (start + r0) * hv * DV + j * DV + c0 + c8;
#pragma unroll
                    for (int i = 0; i < C / 16; ++i) {
                        const int r = r0 + 16 * i;
                        const uint4 x = *(const uint4*)(st.Vr + r * SVR + c8);
                        if (r < len) *(uint4*)(op + 16 * i * hv * DV) = x;
                    }
                    return;
                }
#endif
                // Row stride of o, opaque here so that the 16 row offsets are formed at the
                // stores rather than hoisted out of the loop into 32 live registers.
                i64 rs = hv * DV;
                asm volatile("" : "+l"(rs));
                out_t* op = o + ((start + 2 * t) * hv + j) * DV + c0 + cw + g;
#pragma unroll
                for (int nb = 0; nb < NTT; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int r = 8 * nb + 2 * t + (e & 1);
                        if (r < len)
                            op[(8 * nb + (e & 1)) * rs + 8 * (e >> 1)] =
                                from_f(r < lv ? qh[nb][e] : __int_as_float(0x7fc00000));
                    }
            };
            auto output_qh = [&](float (&qh)[NTT][4]) {
                h_times<DK / 16, !whole>(qh, hs, Qr, 0, len);
                scale_qh(qh);
            };
            float vn[NTT][4];
            int lv = len;
#if !SPLIT_OUT
            float qh[NTT][4];  // QH^T, formed beside KH^T where the chunk has output
#endif
            if (state_warp) {
                // KH^T.
                float kh_[NTT][4];
#if KSPLIT == 2
                // This warp's half of K, then the other's through shared memory: both warps
                // hold the same sum (float addition commutes).
                h_times<DK / 32, !whole>(kh_, hs, Kr, half * (DK / 32), len);
#pragma unroll
                for (int a = 0; a < NTT; ++a)
                    px[(half * NTT + a) * 32] = make_float4(kh_[a][0], kh_[a][1], kh_[a][2], kh_[a][3]);
                bar_sync(3, GROUPS * 64);
#pragma unroll
                for (int a = 0; a < NTT; ++a) {
                    const float4 y = px[((half ^ 1) * NTT + a) * 32];
                    kh_[a][0] += y.x;
                    kh_[a][1] += y.y;
                    kh_[a][2] += y.z;
                    kh_[a][3] += y.w;
                }
#elif SPLIT_OUT
                h_times<DK / 16, !whole>(kh_, hs, Kr, 0, len);
#elif WGMMA
                // K H^T and Q H^T (with QH_LATE left running): Q H^T in warm-up chunks too, as
                // no warpgroup product may sit under a branch the compiler cannot prove uniform
                // (it would serialize them all).
                h_times_wg(kh_, qh, hs, smem_addr(st.K), smem_addr(st.Q));
#if P_IN_REC
                if (PIECES != 1) p_epilogue();
#endif
#else
                if (emit) {
                    h_times2<!whole>(kh_, qh, hs, Kr, Qr, len);
                } else {
                    h_times<DK / 16, !whole>(kh_, hs, Kr, 0, len);
                }
#endif
                // R^T in place of KH^T, v^T read in fragment order (two row tiles a transposing
                // load); then lv. Rows past the chunk's end are staged as zeros, so the sums of
                // v * 0 (two halves an instruction, on the staged bf16 pairs) and d * 0 over the
                // lane's elements are NaN only where some v or d is not finite (an infinite d,
                // never marked, merely takes the exact search below).
                float z1 = 0.0f;
                unsigned zv = 0u;
                {
                    const unsigned vb = smem_addr(st.Vr) + v_lane;
#pragma unroll
                    for (int nb = 0; nb < NTT; nb += 2) {
                        unsigned vv[4];
                        ldsm_x4_t(vv, vb + 2u * (8 * nb) * SVR);
#pragma unroll
                        for (int x = 0; x < 4; ++x) zv = zero_fma_bf16x2(vv[x], zv);
#pragma unroll
                        for (int x = 0; x < 2; ++x)
#pragma unroll
                            for (int e = 0; e < 4; ++e) {
                                const int r = 8 * (nb + x) + 2 * t + (e & 1);
                                const unsigned w = vv[2 * x + (e >> 1)];
                                const float vr = __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
                                const float4 s = st.sc[r];
                                if (e < 2) z1 = fmaf(s.w, 0.0f, z1);
                                kh_[nb + x][e] = fmaf(-s.x, kh_[nb + x][e], vr);
                            }
                    }
                }
                const float z0 = __uint_as_float(zv << 16) + __uint_as_float(zv & 0xffff0000u);
                if (__any_sync(0xffffffffu, isnan(z0 + z1))) {
                    // The first row with a NaN d (chunk_intra's mark) or a non-finite v.
                    int bad = len;
#pragma unroll
                    for (int nb = 0; nb < NTT; ++nb)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int r = 8 * nb + 2 * t + (e & 1), cc = cw + g + 8 * (e >> 1);
                            const float vr = __uint_as_float(((unsigned)st.Vr[r * SVR + cc]) << 16);
                            if (r < len && (isnan(st.sc[r].w) || !isfinite(vr))) bad = min(bad, r);
                        }
                    lv = __reduce_min_sync(0xffffffffu, bad);
                }
                PHASE();
                if (lv < len) {  // the same for the whole warp
#pragma unroll
                    for (int nb = 0; nb < NTT; ++nb)
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            if (8 * nb + 2 * t + (e & 1) >= lv) kh_[nb][e] = 0.0f;
                }
                // v_new^T = R^T a_inv^T: block (rows 16m.., columns 16kb..) of a_inv is zero
                // for kb > m.
#pragma unroll
                for (int a = 0; a < NTT; ++a)
#pragma unroll
                    for (int e = 0; e < 4; ++e) vn[a][e] = 0.0f;
#if WG_TRI
#if P_IN_REC
                if (PIECES == 1) {
                    times_planes_wg<false>(vn, kh_, smem_addr(st.X));
                    p_epilogue();
                    wg_wait<0>();
                    wg_pin(vn);
                } else {
                    times_planes_wg(vn, kh_, smem_addr(st.X));
                }
#else
                times_planes_wg(vn, kh_, smem_addr(st.X));
#endif
#else
                times_planes<!whole>(vn, kh_, Xr, len);
#endif
                PHASE();
            }
#if SPLIT_OUT
            // Barrier 1: v_new^T and lv are in shared memory (state warps arrive, output warps
            // wait). Barrier 2 (HBUF = 1): the output warps have read h (they arrive, state
            // warps wait before the update overwrites it); with HBUF = 2 the update writes the
            // other buffer, which the output warps last read before the chunk-top barrier.
            if (state_warp) {
                if (half == 0) {
#pragma unroll
                    for (int a = 0; a < NTT; ++a) vx[32 * a] = make_float4(vn[a][0], vn[a][1], vn[a][2], vn[a][3]);
                    if (lane == 0) *lv_at = lv;
                    bar_arrive(1, GROUPS * 64);
                }
#if HBUF == 1
                bar_sync(2, THREADS);
#endif
            } else {
                float qh[NTT][4];
                if (emit) output_qh(qh);
#if HBUF == 1
                bar_arrive(2, THREADS);
#endif
                bar_sync(1, GROUPS * 64);
                if (emit) {
#pragma unroll
                    for (int a = 0; a < NTT; ++a) {
                        const float4 x = vx[32 * a];
                        vn[a][0] = x.x;
                        vn[a][1] = x.y;
                        vn[a][2] = x.z;
                        vn[a][3] = x.w;
                    }
                    output_rest(qh, vn, *lv_at);
                }
            }
#else
#if WGMMA
            qh_wait(qh);
#endif
#if P_IN_REC
            fence_proxy_async();  // P' is read by the tensor cores
            __syncthreads();      // P' and scale rq of every row are in
#endif
            if (emit) {
                scale_qh(qh);
                output_rest(qh, vn, lv);
            }
#if LATE_PLANES
            // Every warp is past its last read of this chunk's planes.
            __syncthreads();
            if (ci + 1 < ce) issue(nx_start, nx_len, 0, 2);
#endif
#endif
            PHASE();
            if (state_warp) {
                // h^T = d_last h^T + (v_new^T diag(rk D_last)) K.
                const float d_last = lv < len ? __int_as_float(0x7fc00000) : st.sc[len - 1].w;
                APieces aw[C / 16];
#pragma unroll
                for (int kb = 0; kb < C / 16; ++kb) {
                    float w0[4], w1[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        w0[e] = vn[2 * kb][e] * st.sc[16 * kb + 2 * t + (e & 1)].z;
                        w1[e] = vn[2 * kb + 1][e] * st.sc[16 * kb + 8 + 2 * t + (e & 1)].z;
                    }
                    aw[kb] = a_from_acc(w0, w1);
                }
#if WGMMA
                // Per 64 columns of K (one swizzle atom of the staged K), one batch of products.
#pragma unroll
                for (int nh = 0; nh < DK / 64; ++nh) {
                    float h[8][4];
#pragma unroll
                    for (int x = 0; x < 8; ++x) {
                        const float4 y = hs[32 * (8 * nh + x)];
                        h[x][0] = y.x * d_last;
                        h[x][1] = y.y * d_last;
                        h[x][2] = y.z * d_last;
                        h[x][3] = y.w * d_last;
                    }
                    wg_pin(h);
                    wg_fence();
#pragma unroll
                    for (int kb = 0; kb < C / 16; ++kb)
#pragma unroll
                        for (int pc = PIECES - 1; pc >= 0; --pc) wgmma64<1>(h, aw[kb].p[pc], desc_x(smem_addr(st.K), kb, nh));
                    wg_commit();
                    wg_wait<0>();
                    wg_pin(h);
#pragma unroll
                    for (int x = 0; x < 8; ++x) hs_up[32 * (8 * nh + x)] = make_float4(h[x][0], h[x][1], h[x][2], h[x][3]);
                }
#else
                // UPD tiles of h^T at a time: that many independent accumulator chains (two
                // left the update waiting on each tensor-core result).
#pragma unroll
                for (int u0 = 0; u0 < NDH; u0 += UPD) {
                    const int ndu = nd0 + u0;
                    float h[UPD][4];
#pragma unroll
                    for (int x = 0; x < UPD; ++x) {
                        const float4 y = hs[32 * (ndu + x)];
                        h[x][0] = y.x * d_last;
                        h[x][1] = y.y * d_last;
                        h[x][2] = y.z * d_last;
                        h[x][3] = y.w * d_last;
                    }
                    // v_new's rows past the chunk's end are zero: with a short chunk, the
                    // 16-row blocks there are skipped (a build of their own, see ROW_SKIP).
#pragma unroll
                    for (int kb = 0; kb < C / 16; ++kb) {
                        if (!whole && 16 * kb >= len) continue;
#pragma unroll
                        for (int x = 0; x < UPD; x += 2) {
                            unsigned bk[4];
                            ldsm_bt(bk, Kr, SK, 16 * kb, 8 * (ndu + x));
                            mma3(h[x], aw[kb], bk[0], bk[1]);
                            mma3(h[x + 1], aw[kb], bk[2], bk[3]);
                        }
                    }
#pragma unroll
                    for (int x = 0; x < UPD; ++x) hs_up[32 * (ndu + x)] = make_float4(h[x][0], h[x][1], h[x][2], h[x][3]);
                }
#endif
            }
#if NBUF == 1
            __syncthreads();  // every warp is done with the buffer before it is refilled
            if (ci + 1 < ce) issue(nx_start, nx_len, 0, 3);
#endif
            start = nx_start;
            len = nx_len;
            nx_start = nn_start;
            nx_len = nn_len;
#if ROW_SKIP
        };
        // Only a sequence's last chunk is short (Problem's chunking; segments end at chunks).
        i64 ci = c_from;
        for (; ci < ce; ++ci) {
            if (len < C) break;
            step(Flag<false>{}, ci);
        }
        if (ci < ce) step(Flag<true>{}, ci);
#else
        }
#endif
        if (P.part == 1 && state_warp && !last_seg) {
            // The leaving state's non-finite columns (this lane's g and g + 8, over its tiles,
            // then over its quad), one slot per K half.
            const float4* hs = hs0 + (HBUF == 2 ? (int)((ce - c_from) & 1) : 0) * HSTRIDE;
            int b0 = 0, b1 = 0;
#pragma unroll
            for (int nd = nd0; nd < nd0 + NDH; ++nd) {
                const float4 x = hs[32 * nd];
                b0 |= !isfinite(x.x) || !isfinite(x.y);
                b1 |= !isfinite(x.z) || !isfinite(x.w);
            }
#pragma unroll
            for (int o_ = 1; o_ < 4; o_ <<= 1) {
                b0 |= __shfl_xor_sync(0xffffffffu, b0, o_);
                b1 |= __shfl_xor_sync(0xffffffffu, b1, o_);
            }
            if (t == 0) {
                int* f = nan_cols + (((n * segs + s) * hv + j) * 2 + half) * DV + c0 + cw + g;
                f[0] = b0;
                f[8] = b1;
            }
        }
        if (fin && state_warp && last_seg) {
            const float4* hs = hs0 + (HBUF == 2 ? (int)((ce - c_from) & 1) : 0) * HSTRIDE;
#pragma unroll
            for (int nd = nd0; nd < nd0 + NDH; ++nd)
#pragma unroll
                for (int e = 0; e < 4; ++e) fin[sbase + state_at(nd, e)] = (&hs[32 * nd].x)[e];
        }
    }
}
