// chunk_intra: everything of one chunk that does not need the state, one block of 256 threads
// per (chunk, value head). Equals, for that chunk: l2norm (of q and k, as row scalings) + gate +
// cumsum + kkt + solve_tril, plus the masked, decayed q k^T block of chunk_output, and the row
// scalings the recurrent kernel applies. It writes (per token row i, value head j):
//   a_inv[i, :] = A_inv[i, :] diag(beta)          (64 f32; A_inv = (I + A_strict)^-1)
//   p[i, :]     = scale rq_i (q_i . k_l) rk_l D_il for l <= i, else 0      (64 f32)
//   scal[i]     = { d_i rk_i, scale rq_i d_i, rk_i D_last,i, d_i }          (4 f32)
// with rk, rq = 1/|k|, 1/|q| (or 1 without l2norm), d_i the decay from the chunk start to i and
// D_il from l to i (Gamma's semantics: exp of differences of gamma + lo, 0 across a reset).
// With PLANES (for chunk_recurrent_regs) a_inv and p rows are written as their PIECES bf16
// pieces (see split3), planes of 64 side by side: 64 PIECES bf16 per row. Of these planes only
// the 16 x 16 blocks on and below the diagonal are written (three eighths of the bytes less): the
// recurrent kernel stages and reads no others, and the rest of the workspace keeps what it held.
// Why so: w = A_inv (beta d k_hat) and u = A_inv (beta v) are never formed. The recurrent kernel
// computes v_new = a_inv (v - diag(d rk) K h), the same value with 64 instead of K + V values
// per token written here, and K h needs the keys it reads anyway.
// The two K-wide products (K K^T, Q K^T) run on the tensor cores on the raw inputs (one pass of
// m16n8k16 for bf16/f16, three of TF32 m16n8k8 for f32, see warp_mma); the norms and decays are
// applied to their results.
// The 64 x 64 tri-solve is f32 FMA: 16 x 16 diagonal blocks by substitution, then block rows
// (with INTRA_DOUBLING: by doubling, 16 x 16 then 32 x 32). With INTRA_DIAG the row norms are
// read off the diagonals of K K^T and Q Q^T instead of a phase of their own (step 3). Both are
// built with PLANES only; both precisions take them, the doubling's products on the tensor
// cores (INTRA_DOUBLING_MMA; measured: NOTES-GPU.md, calls BV and CA).
// With chunk_decay set (the segmented recurrent kernel reads it) it also writes, per (chunk,
// value head), what bounds the chunk's effect on the state entering it: the chunk's total
// log-decay gamma_last (-inf if a hard reset cuts it: the entering state is then dropped
// exactly), +inf where some row has beta |k|^2 outside [0, 2] (then ||I - beta k k^T|| > 1 and
// the decay alone bounds nothing), NaN where a row of k, g or beta is not finite (the state goes
// NaN there and stays so: no segment may start after it; a non-finite v poisons only its own
// columns, which the recurrent kernel's segments hand on by themselves).
// Non-finite inputs: lenf is the first row whose k, activated g (NaN or +inf; -inf is a reset)
// or activated beta is not finite. A product with a zero weight still carries a NaN, so every
// result is computed from the rows before lenf alone (beta is zeroed past it, the masks use
// lenf); rows from lenf on get zero a_inv and p rows and NaN scalings, the mark by which
// chunk_recurrent knows them. A non-finite q reaches its own output row only.
#define THREADS 256
#define C 64
#ifndef INTRA_DIAG
#define INTRA_DIAG 0
#endif
#ifndef INTRA_DOUBLING
#define INTRA_DOUBLING 0
#endif
// INTRA_DOUBLING_MMA (with INTRA_DOUBLING): the doubling's products on the tensor cores.
#ifndef INTRA_DOUBLING_MMA
#define INTRA_DOUBLING_MMA 0
#endif
#if INTRA_DOUBLING_MMA && !INTRA_DOUBLING
#error "INTRA_DOUBLING_MMA needs INTRA_DOUBLING"
#endif
// The doubling's products' operands (warp_mma's SA, SB): split into two TF32 pieces (three
// passes, about 2^-22 relative) for the exact precision; rounded to TF32 (one pass, 2^-12 an
// operand) where A_inv is then rounded to one bf16 piece (2^-9): the fast precision.
#define DSPLIT (PIECES == 1 ? 2 : 1)
// P_IN_REC (with INTRA_DIAG; for chunk_recurrent_regs built with it): p is formed in the
// recurrent kernel from the q and k it stages anyway, so that q is read once in the forward, not
// twice, and p never goes through device memory. chunk_intra then stages no q, forms no Q K^T
// and no |q|, and writes per row eight scalings instead of four:
//   scal[i] = { d_i rk_i, d_i, rk_i D_last,i, d_i, gamma_i, lo_i, seg_i, rk_i }
// (the recurrent kernel applies scale rq_i to each output row, and forms D_il from gamma + lo
// and seg as this kernel does).
#ifndef P_IN_REC
#define P_IN_REC 0
#endif
#if P_IN_REC && !INTRA_DIAG
#error "P_IN_REC needs INTRA_DIAG (the row norms of k from K K^T's diagonal)"
#endif
#if (INTRA_DIAG || INTRA_DOUBLING) && !PLANES
#error "INTRA_DIAG and INTRA_DOUBLING are built with PLANES only (64 registers: the f32 rows' form spills)"
#endif
// The warp that scans the gate: with INTRA_DIAG the one without product tiles (its columns lie
// above its rows), so that the scan runs beside the products.
#define SCAN_WARP (INTRA_DIAG ? 1 : 0)
#define SK STRIDE_A(DK, sizeof(in_t))
#define SA_ STRIDE_A(C, 4)

struct IntraParams {
    u64 q, k, g, beta, a_log, dt_bias;  // inputs: [tokens, H, K] x2 (in_t), [tokens, HV] f32 x2, [HV] x2
    u64 a_inv, p, scal;                 // outputs: [tokens, HV, 64] x2, [tokens, HV, 4] f32
    u64 chunk_start, chunk_len;         // i64 [chunks]
    u64 chunk_decay;                    // [chunks, HV] f32, or 0
    i64 chunks, h, hv;
    float scale, beta_mult, reset;
    int tiled, l2norm, gate_in_kernel, beta_is_logits;
};

// x += a b, element by element, for the four columns a thread forms in the tri-solve's products.
__device__ __forceinline__ void fma4(float (&x)[4], float a, float4 b) {
    x[0] = fmaf(a, b.x, x[0]);
    x[1] = fmaf(a, b.y, x[1]);
    x[2] = fmaf(a, b.z, x[2]);
    x[3] = fmaf(a, b.w, x[3]);
}

// x += sum over m in [lo, hi] of a[m] times the float4 at b + m SA_, in increasing m: the
// doubling's products, a row of one tile against rows of another. a's row is read by 16-byte
// loads (lo a multiple of 4); the bounds are per thread, the loop unrolled over M with masks.
template <int M>
__device__ __forceinline__ void row_times_rows(float (&x)[4], const float* a, const float* b, int lo,
                                               int hi) {
#pragma unroll
    for (int m0 = 0; m0 < M; m0 += 4) {
        if (m0 >= lo && m0 <= hi) {
            const float4 a4 = *(const float4*)(a + m0);
            const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (m0 + u <= hi) fma4(x, av[u], *(const float4*)(b + (m0 + u) * SA_));
        }
    }
}

__device__ __forceinline__ float softplus_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// INTRA_BLOCKS blocks per SM (4: at most 64 registers a thread; the shared memory allows five).
#ifndef INTRA_BLOCKS
#define INTRA_BLOCKS 4
#endif
extern "C" __global__ void __launch_bounds__(THREADS, INTRA_BLOCKS) chunk_intra(const IntraParams P) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float* Tm = (float*)smem_raw;          // [3][16][16] block-row temporaries
    float* gam = Tm + 3 * 256;             // [C] each below
    float* lo = gam + C;
    float* seg = lo + C;
    float* bet = seg + C;
    float* rk = bet + C;
    float* rq = rk + C;
    float* dd = rq + C;
    int* first_bad = (int*)(dd + C);       // [4]: lenf in [0]; with chunk_decay, a row with beta
                                           // |k|^2 outside [0, 2] in [1]
    // The staged q and k rows, and in the same memory once the products have read them (a
    // barrier lies between), A_strict and A_inv: half the shared memory, more blocks per SM.
    in_t* Ks = (in_t*)(first_bad + 4);     // [C][SK]
    in_t* Qs = Ks + C * SK;                // [C][SK]
    float* As = (float*)Ks;                // [C][SA_] A_strict (strictly lower part)
    float* Xs = As + C * SA_;              // [C][SA_] A_inv (lower part)

    const in_t* __restrict__ q = (const in_t*)P.q;
    const in_t* __restrict__ k = (const in_t*)P.k;
    const float* __restrict__ g = (const float*)P.g;
    const float* __restrict__ beta = (const float*)P.beta;
    const i64* __restrict__ chunk_start = (const i64*)P.chunk_start;
    const i64* __restrict__ chunk_len = (const i64*)P.chunk_len;
    float* __restrict__ a_inv = (float*)P.a_inv;
    float* __restrict__ pout = (float*)P.p;
    float* __restrict__ scal = (float*)P.scal;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const i64 hv = P.hv;

    BLOCK_LOOP(item, P.chunks * hv) {
        const i64 c = item / hv, j = item % hv;
        const i64 kh = qk_head(j, P.h, hv, P.tiled);
        const i64 start = chunk_start[c];
        const int len = (int)chunk_len[c];
        // The previous item read lenf into registers several barriers ago.
        if (tid == 0) {
            first_bad[0] = len;
            first_bad[1] = 0;
        }
        __syncthreads();
        // 1. Gate and beta activations (as the gate stage), q and k rows.
        if (tid < C) {
            float ge = 0.0f, be = 0.0f;
            if (tid < len) {
                const i64 t = (start + tid) * hv + j;
                const float x = g[t], b = beta[t];
                ge = P.gate_in_kernel
                         ? -expf(((const float*)P.a_log)[j]) * softplus_(x + ((const float*)P.dt_bias)[j])
                         : x;
                be = P.beta_is_logits ? P.beta_mult / (1.0f + expf(-b)) : b;
                if (isnan(ge) || ge == __int_as_float(0x7f800000) || !isfinite(be)) atomicMin(first_bad, tid);
            }
            gam[tid] = ge;
            bet[tid] = be;
        }
        stage_rows_by<in_t, DK, THREADS>(Ks, SK, k + (start * P.h + kh) * DK, P.h * DK, len, tid);
        if (!P_IN_REC) stage_rows_by<in_t, DK, THREADS>(Qs, SK, q + (start * P.h + kh) * DK, P.h * DK, len, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        // 2. gamma = cumsum(g), restarted after a hard reset, as a double-float (gam + lo) by a
        //    segmented scan across warp SCAN_WARP (lane l holds rows 2l, 2l + 1): log2(32)
        //    dependent steps instead of 64. Each add is TwoSum'd, its error collected in lo, so gam + lo
        //    is the sum to about 2^-46 whatever the order (cumsum.cu adds row by row; the decays
        //    take differences of gam + lo, which agree to f32 rounding).
        if (warp == SCAN_WARP) {
            const float x0 = gam[2 * lane], x1 = gam[2 * lane + 1];
            const bool r0 = x0 < P.reset, r1 = x1 < P.reset;
            // The pair's own segment: a reset row contributes 0 and cuts what came before.
            float v0 = r0 ? 0.0f : x0, e0 = 0.0f;
            float v = v0, e = 0.0f;
            if (r1) {
                v = 0.0f;
            } else {
                two_sum_add(v, e, x1, 0.0f);
            }
            bool cut = r0 || r1;
            // Inclusive scan of the pairs' (v, e, cut): a later segment that was cut keeps its own.
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float pv = __shfl_up_sync(0xffffffffu, v, o);
                const float pe = __shfl_up_sync(0xffffffffu, e, o);
                const int pc = __shfl_up_sync(0xffffffffu, (int)cut, o);
                if (lane >= o && !cut) {
                    float a = pv, ae = pe;
                    two_sum_add(a, ae, v, e);
                    v = a;
                    e = ae;
                    cut = pc != 0;
                }
            }
            // Exclusive prefix of this lane's pair, then its two rows.
            float pv = __shfl_up_sync(0xffffffffu, v, 1), pe = __shfl_up_sync(0xffffffffu, e, 1);
            if (lane == 0) pv = pe = 0.0f;
            float g0 = pv, l0 = pe;
            if (r0) {
                g0 = l0 = 0.0f;
            } else {
                two_sum_add(g0, l0, v0, e0);
            }
            float g1 = g0, l1 = l0;
            if (r1) {
                g1 = l1 = 0.0f;
            } else {
                two_sum_add(g1, l1, x1, 0.0f);
            }
            const unsigned m0 = __ballot_sync(0xffffffffu, r0), m1 = __ballot_sync(0xffffffffu, r1);
            const unsigned below = (1u << lane) - 1u;
            const float before = (float)(__popc(m0 & below) + __popc(m1 & below));
            if (2 * lane < len) {
                gam[2 * lane] = g0;
                lo[2 * lane] = l0;
                seg[2 * lane] = before + (r0 ? 1.0f : 0.0f);
            }
            if (2 * lane + 1 < len) {
                gam[2 * lane + 1] = g1;
                lo[2 * lane + 1] = l1;
                seg[2 * lane + 1] = before + (r0 ? 1.0f : 0.0f) + (r1 ? 1.0f : 0.0f);
            }
        }
#if !INTRA_DIAG
        // 3. Row norms of k and q on warps 1.. (warp 0 scans the gate), by 16-byte loads: LPR
        //    lanes per row, RPW rows a warp at a time. A non-finite k element is found by its
        //    row's sum of squares (then checked element by element: a finite row whose squares
        //    overflow is not marked). Without l2norm only k's sums are formed (for that check).
        {
            constexpr int EV = 16 / (int)sizeof(in_t);                // elements a 16-byte load
            constexpr int NV = DK / EV;                                // loads a row
            constexpr int LPR = (NV & -NV) < 32 ? (NV & -NV) : 32;     // lanes a row: a power of 2
            constexpr int VPL = NV / LPR;                              // loads a lane and row
            constexpr int RPW = 32 / LPR;                              // rows a warp at a time
            constexpr int NW = THREADS / 32 - 1;
            const int sub = lane / LPR, part = lane % LPR;
            for (int i0 = (warp - 1) * RPW; warp > 0 && i0 < C; i0 += NW * RPW) {
                const int row = i0 + sub;  // RPW (a power of 2 up to 16) divides 64: row < C
                float sk = 0.0f, sq = 0.0f;
#pragma unroll
                for (int u = 0; u < VPL; ++u) {
                    const int d0 = (u * LPR + part) * EV;
                    const uint4 wk = *(const uint4*)(Ks + row * SK + d0);
                    const in_t* ek = (const in_t*)&wk;
#pragma unroll
                    for (int e = 0; e < EV; ++e) sk = fmaf(to_f(ek[e]), to_f(ek[e]), sk);
                    if (P.l2norm) {
                        const uint4 wq = *(const uint4*)(Qs + row * SK + d0);
                        const in_t* eq = (const in_t*)&wq;
#pragma unroll
                        for (int e = 0; e < EV; ++e) sq = fmaf(to_f(eq[e]), to_f(eq[e]), sq);
                    }
                }
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1) {
                    sk += __shfl_xor_sync(0xffffffffu, sk, o);
                    if (P.l2norm) sq += __shfl_xor_sync(0xffffffffu, sq, o);
                }
                if (!isfinite(sk)) {
                    bool bad = false;
                    for (int d = part; d < DK; d += LPR) bad |= !isfinite(to_f(Ks[row * SK + d]));
                    if (bad) atomicMin(first_bad, row);
                }
                if (part == 0) {
                    rk[row] = P.l2norm ? 1.0f / sqrtf(sk + 1e-6f) : 1.0f;
                    rq[row] = P.l2norm ? 1.0f / sqrtf(sq + 1e-6f) : 1.0f;
                    // beta |k_hat|^2 in [0, 2] (bet is final here: step 1 and a barrier ago).
                    const float bk = bet[row] * (P.l2norm ? sk / (sk + 1e-6f) : sk);
                    if (P.chunk_decay && !(bk >= 0.0f && bk <= 2.0f)) atomicOr(first_bad + 1, 1);
                }
            }
        }
        __syncthreads();
        int lenf = *first_bad;
        if (tid < C) {
            dd[tid] = tid < lenf ? decay0(gam[tid], lo[tid], seg[tid]) : 0.0f;
            if (tid >= lenf) bet[tid] = 0.0f;
        }
#else
        int lenf;  // known once the products' diagonals are in (step 4)
#endif
#if INTRA_DIAG
        // 3. The row norms from the products' diagonals: |k_r|^2 is (K K^T)_rr, |q_r|^2 is
        //    (Q Q^T)_rr. The warps holding a 16 x 16 diagonal block of K K^T (rows rb.., columns
        //    cb..; w = 0, 2, 5, 7) form that block of Q Q^T first (with l2norm), and the
        //    lanes holding its diagonal elements (fragment row g = 2 (lane % 4) + h, element
        //    2 i + h of the block's tile i) write the row's scalings and check the row as the
        //    element-wise form did: a row whose sum of squares is not finite is checked element
        //    by element (a finite row whose squares overflow is not marked). This takes a
        //    phase and a barrier off the item; the sums are the products' (same values up to
        //    the order of f32 additions).
        // The diagonal of Q Q^T's block (rb, rb) where this lane holds one (else zeros): the
        // lane's rows g and g + 8 of the block. Formed before K K^T and Q K^T, so that only
        // these two values stay live across them.
        auto q_diagonal = [&](int rb, int cb, float (&qdiag)[2]) {
            qdiag[0] = qdiag[1] = 0.0f;
            const int dofs = rb - cb;
            if (P_IN_REC || !P.l2norm || (dofs != 0 && dofs != 16)) return;
            float qd[2][4];
#pragma unroll
            for (int a = 0; a < 2; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) qd[a][e] = 0.0f;
#if IN_T != 0 && FUSED_MMA
            const SmemRows Qr = smem_rows(Qs, SK);
#pragma unroll
            for (int kb = 0; kb < DK / 16; ++kb) {
                // The block's B operand (rows rb.. of Q as columns) is its A operand's data:
                // the ldmatrix tiles of rows rb.. and rb + 8.. are the two n8 tiles.
                unsigned aq[4];
                ldsm_x4(aq, Qr.bt + 2u * (rb * SK + 16 * kb));
                mma_in16(qd[0], aq, aq[0], aq[2]);
                mma_in16(qd[1], aq, aq[1], aq[3]);
            }
#else
            warp_mma<SPLIT_IN, SPLIT_IN, 2, DK>(
                qd, [&](int m, int kk) { return to_f(Qs[(rb + m) * SK + kk]); },
                [&](int kk, int n) { return to_f(Qs[(rb + n) * SK + kk]); });
#endif
            const bool h = ((lane >> 2) & 1) != 0;
            qdiag[0] = h ? qd[0][1] : qd[0][0];
            qdiag[1] = h ? qd[1][3] : qd[1][2];
        };
        auto row_norms_from_diagonals = [&](const float (&kk)[4][4], const float (&qdiag)[2], int rb,
                                            int cb) {
            const int dofs = rb - cb;
            const int g = lane >> 2, h = g & 1;
            if ((dofs != 0 && dofs != 16) || (g >> 1) != (lane & 3)) return;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = rb + g + 8 * i;
                // Constant indices only (a runtime index would put the fragments in local memory).
                const float k0 = dofs == 0 ? kk[i][2 * i] : kk[2 + i][2 * i];
                const float k1 = dofs == 0 ? kk[i][2 * i + 1] : kk[2 + i][2 * i + 1];
                const float s = h ? k1 : k0, sq = qdiag[i];
                if (!isfinite(s)) {
                    bool bad = false;
                    for (int d = 0; d < DK; ++d) bad |= !isfinite(to_f(Ks[r * SK + d]));
                    if (bad) atomicMin(first_bad, r);
                }
                rk[r] = P.l2norm ? 1.0f / sqrtf(s + 1e-6f) : 1.0f;
                rq[r] = P.l2norm ? 1.0f / sqrtf(sq + 1e-6f) : 1.0f;
                // beta |k_hat|^2 in [0, 2] (bet is final: step 1 and a barrier ago).
                const float bk = bet[r] * (P.l2norm ? s / (s + 1e-6f) : s);
                if (P.chunk_decay && !(bk >= 0.0f && bk <= 2.0f)) atomicOr(first_bad + 1, 1);
            }
        };
#endif
        // p's elements (r, l0) and (r, l0 + 1), as PIECES bf16 planes or f32.
        auto store_p = [&](int r, int l0, const float (&pv)[2]) {
#if PLANES
            unsigned pc[3];
            split3(pv[0], pv[1], pc[0], pc[1], pc[2]);
            unsigned* dst = (unsigned*)((unsigned short*)P.p + ((start + r) * hv + j) * (PIECES * C) + l0);
#pragma unroll
            for (int i = 0; i < PIECES; ++i) dst[i * (C / 2)] = pc[i];
#else
            *(float2*)(pout + ((start + r) * hv + j) * C + l0) = make_float2(pv[0], pv[1]);
#endif
        };
        // 4. K K^T and Q K^T on the tensor cores: warp w owns rows 16 (w / 2) .., columns
        //    32 (w % 2) .. + 31 (four 16 x 8 tiles); tiles wholly above the diagonal stay zero.
        {
            const int rb = (warp >> 1) * 16, cb = (warp & 1) * 32;
            float sk[4][4], sq[4][4];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int e = 0; e < 4; ++e) sk[a][e] = sq[a][e] = 0.0f;
#if INTRA_DIAG
            float qdiag[2];
            q_diagonal(rb, cb, qdiag);
#endif
            if (cb <= rb + 15) {
#if IN_T != 0 && FUSED_MMA
                // 16-bit inputs: m16n8k16 on the staged rows, operands by ldmatrix (A: rows
                // rb.. of K or Q; B = K^T: rows cb.. of K), one pass (the products are exact).
                const SmemRows Kr = smem_rows(Ks, SK), Qr = smem_rows(Qs, SK);
#pragma unroll
                for (int kb = 0; kb < DK / 16; ++kb) {
                    unsigned ak[4], aq[4], b0[4], b1[4];
                    ldsm_x4(ak, Kr.bt + 2u * (rb * SK + 16 * kb));
                    if (!P_IN_REC) ldsm_x4(aq, Qr.bt + 2u * (rb * SK + 16 * kb));
                    ldsm_b(b0, Kr, SK, cb, 16 * kb);
                    ldsm_b(b1, Kr, SK, cb + 16, 16 * kb);
                    mma_in16(sk[0], ak, b0[0], b0[1]);
                    mma_in16(sk[1], ak, b0[2], b0[3]);
                    mma_in16(sk[2], ak, b1[0], b1[1]);
                    mma_in16(sk[3], ak, b1[2], b1[3]);
                    if (!P_IN_REC) {
                        mma_in16(sq[0], aq, b0[0], b0[1]);
                        mma_in16(sq[1], aq, b0[2], b0[3]);
                        mma_in16(sq[2], aq, b1[0], b1[1]);
                        mma_in16(sq[3], aq, b1[2], b1[3]);
                    }
                }
#else
                auto kt = [&](int kk, int n) { return to_f(Ks[(cb + n) * SK + kk]); };
                warp_mma<SPLIT_IN, SPLIT_IN, 4, DK>(
                    sk, [&](int m, int kk) { return to_f(Ks[(rb + m) * SK + kk]); }, kt);
                warp_mma<SPLIT_IN, SPLIT_IN, 4, DK>(
                    sq, [&](int m, int kk) { return to_f(Qs[(rb + m) * SK + kk]); }, kt);
#endif
            }
#if INTRA_DIAG
            row_norms_from_diagonals(sk, qdiag, rb, cb);
            __syncthreads();  // gam, lo, seg (the scan), rk, rq and first_bad are in
            // beta is not zeroed past lenf: every use of it below is masked by lenf.
            lenf = *first_bad;
#else
            __syncthreads();  // dd, gam of every row are visible below
#endif
            // The thread's two rows (frag_row 0 and 8) and their scalings, held in registers:
            // the stores to As below share the shared memory these are read from, so without
            // this the compiler reloads them for every element.
            float rg[2], rl[2], rs[2], ra[2], rp[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int r = rb + frag_row(2 * i);
                rg[i] = gam[r];
                rl[i] = lo[r];
                rs[i] = seg[r];
                ra[i] = bet[r] * rk[r];
                rp[i] = P.scale * rq[r];
            }
            // Elements (e, e + 1) of a fragment are columns (l, l + 1) of one row: their column
            // values are float2 loads and p is stored in pairs (one 32-bit store per plane).
            // Each 16 x 8 tile is wholly above the diagonal (zeros), wholly below it with every
            // row valid (no test per element), or across it (a test per element, by selects);
            // the choice is the same for the whole warp, so no element branches.
            // (Inlined at each call with check a constant: two straight-line bodies.)
            auto tile = [&](int a, bool check) {
                const int l0 = cb + 8 * a + frag_col(0);
                const float2 cg = *(const float2*)(gam + l0), cl = *(const float2*)(lo + l0);
                const float2 cs = *(const float2*)(seg + l0), ck = *(const float2*)(rk + l0);
                const float colg[2] = {cg.x, cg.y}, coll[2] = {cl.x, cl.y};
                const float cols[2] = {cs.x, cs.y}, colk[2] = {ck.x, ck.y};
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int r = rb + frag_row(2 * i);
                    float pv[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int l = l0 + h;
                        // decay(): the exp of the difference, zero across a reset. With one
                        // bf16 piece (the fast precision) by the hardware's exp2 (relative
                        // error ~1e-6 against the piece's 4e-3), without expf's range steps.
                        const float dg = (rg[i] - colg[h]) + (rl[i] - coll[h]);
                        const float e = PIECES == 1 ? __expf(dg) : expf(dg);
                        const float dec = rs[i] == cols[h] ? e : 0.0f;
                        const bool valid = !check || (r < lenf && l <= r);
                        const float av = valid ? ra[i] * colk[h] * sk[a][2 * i + h] * dec : 0.0f;
                        pv[h] = valid ? rp[i] * colk[h] * sq[a][2 * i + h] * dec : 0.0f;
                        if (!check || l < r) As[r * SA_ + l] = av;
                    }
                    if (!P_IN_REC && (!check || r < len)) store_p(r, l0, pv);
                }
            };
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                if (cb + 8 * a + 7 < rb && rb + 16 <= lenf) {
                    tile(a, false);
                } else if (cb + 8 * a <= rb + 15) {
                    tile(a, true);
                } else if (!PLANES) {
                    // Wholly above the diagonal: a 16 x 16 block above it with PLANES, which no
                    // one reads (see the header), so not written; zeros in the f32 rows.
                    const int l0 = cb + 8 * a + frag_col(0);
                    const float zero[2] = {0.0f, 0.0f};
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const int r = rb + frag_row(2 * i);
                        if (r < len) store_p(r, l0, zero);
                    }
                }
            }
        }
#if INTRA_DIAG
        // dd is read in step 6 alone; formed here, where the products' fragments are dead.
        if (tid < C) dd[tid] = tid < lenf ? decay0(gam[tid], lo[tid], seg[tid]) : 0.0f;
#endif
        __syncthreads();
        // 5. A_inv = (I + A_strict)^-1. Diagonal 16 x 16 blocks by forward substitution, one
        //    thread per (block, column), column by column: once x[m] is final every later row
        //    takes its term, so the chain is 16 FMAs deep instead of 120, and each row still
        //    sums its terms in increasing m (the roundings of the row-by-row loop).
        // Loops over compile-time bounds, masked per thread: their operands' loads are issued
        // ahead and the index arithmetic folds into constant offsets.
        if (tid < C) {
            const int b0 = (tid >> 4) * 16, cc = tid & 15;
            const float* Ab = As + b0 * SA_ + b0;
            float x[16];
#pragma unroll
            for (int r = 0; r < 16; ++r) x[r] = r == cc ? 1.0f : 0.0f;
#pragma unroll
            for (int m = 0; m < 15; ++m)
#pragma unroll
                for (int r = m + 1; r < 16; ++r)
                    if (m >= cc) x[r] = fmaf(-Ab[r * SA_ + m], x[m], x[r]);
            // Every row, the zeros above the diagonal too (the block rows read them).
#pragma unroll
            for (int r = 0; r < 16; ++r) Xs[(b0 + r) * SA_ + b0 + cc] = x[r];
        } else if (INTRA_DOUBLING_MMA) {
            // Blocks (0, 1) and (2, 3): the upper-right blocks of the 32 x 32 halves X11 and
            // X22, zeros for the doubling's products below, which sum over whole halves.
            for (int e = tid - C; e < 512; e += THREADS - C)
                Xs[(32 * (e >> 8) + ((e >> 4) & 15)) * SA_ + 32 * (e >> 8) + 16 + (e & 15)] = 0.0f;
        }
        __syncthreads();
#if INTRA_DOUBLING_MMA
        // The blocks below the diagonal by doubling (as below, the same products) on the tensor
        // cores: each product a warp's 16 x 8 tile by warp_mma's three TF32 passes (about
        // 2^-22 relative, against the FMA form's f32 roundings; one pass in the fast precision,
        // see DSPLIT), operands read from the f32 tiles in shared memory. Why: the FMA form's float4 loads of whole rows were a third of
        // the kernel's shared-memory wavefronts (Nsight Compute, NOTES-GPU.md call BZ), and
        // shared memory bounds it. T1 (level 1) goes to the block-row scratch Tm, row stride
        // 24 (its B reads by rows t, columns g hit distinct banks), T2 (level 2) to rows ..31,
        // columns 32.. of Xs.
        {
            auto store = [&](float* dst, int stride, const float (&acc)[1][4], float sign) {
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    *(float2*)(dst + frag_row(2 * i) * stride + frag_col(0)) =
                        make_float2(sign * acc[0][2 * i], sign * acc[0][2 * i + 1]);
            };
            // Level 1, warps 0..3: pair p = w / 2 (block row 2p + 1, column 2p), columns
            // 8 (w % 2) .. of the pair's 16 x 16 blocks.
            const int p = warp >> 1, n0 = 8 * (warp & 1), b = 32 * p;
            float* T1 = Tm + p * 16 * 24;
            if (warp < 4) {
                float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
                warp_mma<DSPLIT, DSPLIT, 1, 16>(
                    acc, [&](int m, int kk) { return As[(b + 16 + m) * SA_ + b + kk]; },
                    [&](int kk, int n) { return Xs[(b + kk) * SA_ + b + n0 + n]; });
                store(T1 + n0, 24, acc, 1.0f);
            }
            __syncthreads();
            if (warp < 4) {
                float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
                warp_mma<DSPLIT, DSPLIT, 1, 16>(
                    acc, [&](int m, int kk) { return Xs[(b + 16 + m) * SA_ + b + 16 + kk]; },
                    [&](int kk, int n) { return T1[kk * 24 + n0 + n]; });
                store(Xs + (b + 16) * SA_ + b + n0, SA_, acc, -1.0f);
            }
            __syncthreads();
            // Level 2, every warp: rows 16 (w / 4) .., columns 8 (w % 4) .. of the 32 x 32 block.
            const int r0 = 16 * (warp >> 2), c0 = 8 * (warp & 3);
            float* T2 = Xs + 32;
            {
                float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
                warp_mma<DSPLIT, DSPLIT, 1, 32>(
                    acc, [&](int m, int kk) { return As[(32 + r0 + m) * SA_ + kk]; },
                    [&](int kk, int n) { return Xs[kk * SA_ + c0 + n]; });
                store(T2 + r0 * SA_ + c0, SA_, acc, 1.0f);
            }
            __syncthreads();
            {
                float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
                warp_mma<DSPLIT, DSPLIT, 1, 32>(
                    acc, [&](int m, int kk) { return Xs[(32 + r0 + m) * SA_ + 32 + kk]; },
                    [&](int kk, int n) { return T2[kk * SA_ + c0 + n]; });
                store(Xs + (32 + r0) * SA_ + c0, SA_, acc, -1.0f);
            }
            __syncthreads();
        }
#elif INTRA_DOUBLING
        // The blocks below the diagonal by doubling: for L = [[L11, 0], [L21, L22]],
        // L^-1 = [[X11, 0], [-X22 L21 X11, X22]] with X11, X22 the inverses of the diagonal
        // halves. Level 1 forms the 16 x 16 blocks (1, 0) and (3, 2) from the diagonal blocks,
        // level 2 the 32 x 32 block (rows 32.., columns ..31) from the two 32 x 32 halves: four
        // barriers where the block rows took six, and no phase with one block row's 48-term
        // sums. Each product is T = A X (T in the unused blocks above the diagonal of Xs:
        // block (2p, 2p + 1) for level 1's pair p, rows ..31 columns 32.. for level 2), then
        // X = -X_diag T. X is lower triangular: the sums skip its zeros above the diagonal
        // (those inside the diagonal blocks are stored zeros, so a float4 may straddle them).
        {
            // Level 1, pair p (block row 2p + 1, column 2p): thread (p, r, c4) on 128 threads.
            const int p = tid >> 6, r = (tid >> 2) & 15, c0 = (tid & 3) * 4;
            const int b = 32 * p;  // first row and column of the pair's diagonal block (2p, 2p)
            float* T1 = Xs + b * SA_ + b + 16;  // block (2p, 2p + 1)
            if (tid < 128) {
                float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                row_times_rows<16>(x, As + (b + 16 + r) * SA_ + b, Xs + b * SA_ + b + c0, c0, 15);
                *(float4*)(T1 + r * SA_ + c0) = make_float4(x[0], x[1], x[2], x[3]);
            }
            __syncthreads();
            if (tid < 128) {
                float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                row_times_rows<16>(x, Xs + (b + 16 + r) * SA_ + b + 16, T1 + c0, 0, r);
                *(float4*)(Xs + (b + 16 + r) * SA_ + b + c0) = make_float4(-x[0], -x[1], -x[2], -x[3]);
            }
            __syncthreads();
        }
        {
            // Level 2: thread (R, c4) on all 256 threads, row 32 + R, columns 4 c4 .. + 3.
            const int R = tid >> 3, c0 = (tid & 7) * 4;
            float* T2 = Xs + 32;  // rows ..31, columns 32..
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            row_times_rows<32>(x, As + (32 + R) * SA_, Xs + c0, c0, 31);
            *(float4*)(T2 + R * SA_ + c0) = make_float4(x[0], x[1], x[2], x[3]);
            __syncthreads();
            x[0] = x[1] = x[2] = x[3] = 0.0f;
            row_times_rows<32>(x, Xs + (32 + R) * SA_ + 32, T2 + c0, 0, R);
            *(float4*)(Xs + (32 + R) * SA_ + c0) = make_float4(-x[0], -x[1], -x[2], -x[3]);
            __syncthreads();
        }
#else
        // Block row bi: X_{bi,bj} = -X_{bi,bi} sum_{bj <= bk < bi} A_{bi,bk} X_{bk,bj}. Thread
        // (bj, r, c4) forms row r, columns 4 c4 .. 4 c4 + 3 of block bj < bi, by 16-byte
        // loads (five for sixteen FMAs where the one-element form took two for one); each
        // element sums in increasing m as before.
        {
            const int bj = tid >> 6, r = (tid >> 2) & 15, c0 = (tid & 3) * 4;
#pragma unroll
            for (int bi = 1; bi < 4; ++bi) {
                if (bj < bi) {
                    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    const float* arow = As + (bi * 16 + r) * SA_;
#pragma unroll
                    for (int m0 = 0; m0 < 48; m0 += 4) {
                        if (m0 >= bj * 16 && m0 < bi * 16) {
                            const float4 a4 = *(const float4*)(arow + m0);
                            const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
                            for (int u = 0; u < 4; ++u) {
                                const float4 x4 = *(const float4*)(Xs + (m0 + u) * SA_ + bj * 16 + c0);
                                fma4(x, av[u], x4);
                            }
                        }
                    }
                    *(float4*)(Tm + (bj << 8) + (r << 4) + c0) = make_float4(x[0], x[1], x[2], x[3]);
                }
                __syncthreads();
                if (bj < bi) {
                    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    const float* xrow = Xs + (bi * 16 + r) * SA_ + bi * 16;
#pragma unroll
                    for (int m0 = 0; m0 < 16; m0 += 4) {
                        const float4 a4 = *(const float4*)(xrow + m0);
                        const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
                        for (int u = 0; u < 4; ++u) {
                            if (m0 + u <= r) {
                                const float4 t4 = *(const float4*)(Tm + (bj << 8) + (m0 + u) * 16 + c0);
                                fma4(x, av[u], t4);
                            }
                        }
                    }
                    *(float4*)(Xs + (bi * 16 + r) * SA_ + bj * 16 + c0) = make_float4(-x[0], -x[1], -x[2], -x[3]);
                }
                __syncthreads();
            }
        }
#endif
        // 6. a_inv diag(beta) and the row scalings, valid rows only (beta is 0 past len).
#if PLANES
        // Eight consecutive columns of one row per thread: one 16-byte store per plane, from
        // 16-byte loads of the row and of beta (eight 4-byte ones each cost a wavefront or two).
        // The 16 x 16 blocks above the diagonal are not written (see the header); above the
        // diagonal inside a diagonal block the loaded values are not used.
        for (int e = tid; e < len * (C / 8); e += THREADS) {
            const int r = e / (C / 8), l0 = (e % (C / 8)) * 8;
            if ((l0 >> 4) > (r >> 4)) continue;
            const float4 xa = *(const float4*)(Xs + r * SA_ + l0), xb = *(const float4*)(Xs + r * SA_ + l0 + 4);
            const float4 ba = *(const float4*)(bet + l0), bb = *(const float4*)(bet + l0 + 4);
            const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            const float bv[8] = {ba.x, ba.y, ba.z, ba.w, bb.x, bb.y, bb.z, bb.w};
            unsigned pc[3][4];
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const int l = l0 + 2 * h;
                const float x0 = r < lenf && l <= r ? xv[2 * h] * bv[2 * h] : 0.0f;
                const float x1 = r < lenf && l + 1 <= r ? xv[2 * h + 1] * bv[2 * h + 1] : 0.0f;
                split3(x0, x1, pc[0][h], pc[1][h], pc[2][h]);
            }
            uint4* dst = (uint4*)((unsigned short*)P.a_inv + ((start + r) * hv + j) * (PIECES * C) + l0);
#pragma unroll
            for (int i = 0; i < PIECES; ++i) dst[i * (C / 8)] = make_uint4(pc[i][0], pc[i][1], pc[i][2], pc[i][3]);
        }
#else
        for (int e = tid; e < len * C; e += THREADS) {
            const int r = e / C, l = e % C;
            a_inv[((start + r) * hv + j) * C + l] = r < lenf && l <= r ? Xs[r * SA_ + l] * bet[l] : 0.0f;
        }
#endif
        if (P.chunk_decay && tid == 0) {
            const int last = len - 1;
            float x = seg[last] != 0.0f ? -__int_as_float(0x7f800000) : gam[last] + lo[last];
            if (first_bad[1]) x = __int_as_float(0x7f800000);
            if (lenf < len) x = __int_as_float(0x7fc00000);
            ((float*)P.chunk_decay)[c * hv + j] = x;
        }
        if (tid < len) {
            const int last = len - 1;
            const float dl = decay(gam[last], lo[last], seg[last], gam[tid], lo[tid], seg[tid]);
            const float nan = __int_as_float(0x7fc00000);  // NaN: the row's mark
            // One 16-byte store a row (four 4-byte ones cost a sector each).
#if P_IN_REC
            float* s8 = scal + ((start + tid) * hv + j) * 8;
            *(float4*)s8 = tid < lenf ? make_float4(dd[tid] * rk[tid], dd[tid], rk[tid] * dl, dd[tid])
                                      : make_float4(nan, nan, nan, nan);
            *(float4*)(s8 + 4) = make_float4(gam[tid], lo[tid], seg[tid], rk[tid]);
#else
            *(float4*)(scal + ((start + tid) * hv + j) * 4) =
                tid < lenf ? make_float4(dd[tid] * rk[tid], P.scale * rq[tid] * dd[tid], rk[tid] * dl, dd[tid])
                           : make_float4(nan, nan, nan, nan);
#endif
        }
    }
}
