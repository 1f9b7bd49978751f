// Host shim of dev/fused_emulate.py: enough of CUDA for the fused prefill kernels to run on the
// CPU. Threads are lanes; a block is `threads` std::threads with a barrier for __syncthreads;
// warp-collective operations meet in a per-warp exchange area between two barriers.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n)
using std::isfinite;
using std::isnan;
using std::max;
using std::min;
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __expf(float x) { return expf(x); }  // the GPU's is approximate: a looser check
struct Dim { unsigned x = 0; };
static thread_local Dim threadIdx, blockIdx;
static unsigned emu_block_dim, emu_grid_dim;
#define blockDim (Dim{emu_block_dim})
#define gridDim (Dim{emu_grid_dim})

struct Warp {
    std::barrier<> bar{32};
    unsigned xa[32][4];
    unsigned xb[32][2];
    float xf[32];
    int xi[32];
};
// A warpgroup (four consecutive warps; fewer threads where the block has fewer): wgmma's
// operands meet here between two barriers.
struct WarpGroup {
    explicit WarpGroup(int n) : bar(n) {}
    std::barrier<> bar;
    unsigned xa[128][4];
    unsigned long long desc[128];
};
static thread_local WarpGroup* my_wg;
static thread_local Warp* my_warp;
static thread_local int my_lane;
static std::barrier<>* emu_block_bar;
static std::vector<unsigned char> emu_smem_buf;
static unsigned char* emu_smem() { return emu_smem_buf.data(); }
static void __syncthreads() { emu_block_bar->arrive_and_wait(); }
static void __syncwarp() { my_warp->bar.arrive_and_wait(); }
static void emu_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static int atomicMin(int* p, int v) {
    std::atomic_ref<int> a(*p);
    int old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {}
    return old;
}
static int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }
static int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static float __shfl_sync(unsigned, float v, int src) {
    Warp& w = *my_warp;
    w.xf[my_lane] = v;
    w.bar.arrive_and_wait();
    const float r = w.xf[src];
    w.bar.arrive_and_wait();
    return r;
}
template <class T>
static T __shfl_xor_sync(unsigned, T v, int m) {
    static_assert(sizeof(T) == 4, "4-byte values only");
    Warp& w = *my_warp;
    int b;
    std::memcpy(&b, &v, 4);
    w.xi[my_lane] = b;
    w.bar.arrive_and_wait();
    const int r = w.xi[my_lane ^ m];
    w.bar.arrive_and_wait();
    T out;
    std::memcpy(&out, &r, 4);
    return out;
}
// Any 4-byte value (float or int), through the warp's int slots.
template <class T>
static T __shfl_up_sync(unsigned, T v, int d) {
    static_assert(sizeof(T) == 4, "4-byte values only");
    Warp& w = *my_warp;
    int b;
    std::memcpy(&b, &v, 4);
    w.xi[my_lane] = b;
    w.bar.arrive_and_wait();
    const int r = my_lane >= d ? w.xi[my_lane - d] : b;
    w.bar.arrive_and_wait();
    T out;
    std::memcpy(&out, &r, 4);
    return out;
}
static unsigned __ballot_sync(unsigned, int p) {
    Warp& w = *my_warp;
    w.xi[my_lane] = p != 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) r |= (unsigned)w.xi[l] << l;
    w.bar.arrive_and_wait();
    return r;
}
static int __popc(unsigned x) { return __builtin_popcount(x); }
static int __reduce_min_sync(unsigned, int v) {
    Warp& w = *my_warp;
    w.xi[my_lane] = v;
    w.bar.arrive_and_wait();
    int r = w.xi[0];
    for (int l = 1; l < 32; ++l) r = std::min(r, w.xi[l]);
    w.bar.arrive_and_wait();
    return r;
}
static int __any_sync(unsigned, int p) {
    Warp& w = *my_warp;
    w.xi[my_lane] = p != 0;
    w.bar.arrive_and_wait();
    int r = 0;
    for (int l = 0; l < 32; ++l) r |= w.xi[l];
    w.bar.arrive_and_wait();
    return r;
}
// Named barriers (PTX bar.arrive / bar.sync with a thread count): a count that only grows.
// bar.arrive adds itself (a release) and goes on without taking anything from the others, as
// on the GPU; bar.sync adds itself and waits (acquire) until the count reaches the end of its
// phase. (A mutex shared by both would hand arriving threads the writes of the waiting ones.)
struct NamedBar {
    std::atomic<long> count{0};
};
static NamedBar emu_named[16];
static void emu_bar_arrive(int id, int) {
    emu_named[id].count.fetch_add(1, std::memory_order_release);
}
static void emu_bar_sync(int id, int n) {
    const long old = emu_named[id].count.fetch_add(1, std::memory_order_acq_rel);
    const long end = (old / n + 1) * n;
    while (emu_named[id].count.load(std::memory_order_acquire) < end) std::this_thread::yield();
}
// Shared-space addresses are offsets into the block's shared memory.
static unsigned long long emu_smem_addr(const void* p) {
    return (unsigned long long)((const unsigned char*)p - emu_smem_buf.data());
}
static unsigned long long __cvta_generic_to_shared(const void* p) { return emu_smem_addr(p); }
// cp.async as on the GPU, as far as order goes: a copy lands no earlier than the wait that
// covers its group (cp.async.wait_group N: all but the N newest committed groups), so shared
// memory read before that wait, or by another thread before a barrier after it, still holds
// the poison or the previous chunk's rows, and the comparison fails.
struct EmuCopy {
    unsigned s;
    const void* src;
    bool valid;
    long group;
};
static thread_local std::vector<EmuCopy> emu_copies;
static thread_local long emu_groups;  // groups committed by this thread so far
static void emu_cp_async16(unsigned s, const void* src, bool valid) {
    emu_copies.push_back({s, src, valid, emu_groups});
}
static void emu_cp_commit() { ++emu_groups; }
static void emu_cp_wait(int n) {
    std::vector<EmuCopy> later;
    for (const EmuCopy& c : emu_copies) {
        if (c.group < emu_groups - n) {
            if (c.valid) memcpy(emu_smem_buf.data() + c.s, c.src, 16);
            else memset(emu_smem_buf.data() + c.s, 0, 16);
        } else {
            later.push_back(c);
        }
    }
    emu_copies.swap(later);
}
// Conversions (round to nearest even, as cvt.rn).
static unsigned short emu_f32_to_bf16(float x) {
    unsigned u = __float_as_uint(x);
    if (std::isnan(x)) return 0x7fc0;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static unsigned emu_pack_bf16x2(float hi, float lo) {
    return ((unsigned)emu_f32_to_bf16(hi) << 16) | emu_f32_to_bf16(lo);
}
// fma.rn.bf16x2: each half a * b + c, rounded once (the product of two bf16 is exact in f64).
static unsigned emu_fma_bf16x2(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (int h = 0; h < 2; ++h) {
        auto f = [&](unsigned x) { return (double)__uint_as_float(((x >> (16 * h)) & 0xffffu) << 16); };
        r |= (unsigned)emu_f32_to_bf16((float)(f(a) * f(b) + f(c))) << (16 * h);
    }
    return r;
}
static unsigned short emu_f32_to_f16(float f);
static unsigned emu_pack_f16x2(float hi, float lo) {
    return ((unsigned)emu_f32_to_f16(hi) << 16) | emu_f32_to_f16(lo);
}
static float emu_f16_to_f32(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static unsigned short emu_f32_to_f16(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }
static float emu_half(unsigned short h, bool f16) {
    return f16 ? emu_f16_to_f32(h) : __uint_as_float((unsigned)h << 16);
}
// mma.sync m16n8k16 (bf16 or f16 operands, f32 accumulate): the fragments of the 32 lanes
// gathered into A (16 x 16) and B (16 x 8); products summed in double, rounded once.
static void emu_mma16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, bool f16) {
    Warp& w = *my_warp;
    for (int e = 0; e < 4; ++e) w.xa[my_lane][e] = a[e];
    w.xb[my_lane][0] = b0;
    w.xb[my_lane][1] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; ++L) {
        const int g = L >> 2, t = L & 3;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int e = 0; e < 4; ++e) {
            A[rows[e]][cols[e]] = emu_half(w.xa[L][e] & 0xffff, f16);
            A[rows[e]][cols[e] + 1] = emu_half(w.xa[L][e] >> 16, f16);
        }
        for (int e = 0; e < 2; ++e) {
            B[2 * t + 8 * e][g] = emu_half(w.xb[L][e] & 0xffff, f16);
            B[2 * t + 8 * e + 1][g] = emu_half(w.xb[L][e] >> 16, f16);
        }
    }
    w.bar.arrive_and_wait();
    const int g = my_lane >> 2, t = my_lane & 3;
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < 16; ++k) s += (double)A[r][k] * B[k][col];
        c[e] = (float)s;
    }
}
// mma.sync m16n8k8 TF32 (the low 13 bits of each operand are ignored, as the hardware does).
static void emu_mma_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    Warp& w = *my_warp;
    for (int e = 0; e < 4; ++e) w.xa[my_lane][e] = a[e];
    w.xb[my_lane][0] = b[0];
    w.xb[my_lane][1] = b[1];
    w.bar.arrive_and_wait();
    float A[16][8], B[8][8];
    for (int L = 0; L < 32; ++L) {
        const int g = L >> 2, t = L & 3;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {t, t, t + 4, t + 4};
        for (int e = 0; e < 4; ++e) A[rows[e]][cols[e]] = __uint_as_float(w.xa[L][e] & 0xffffe000u);
        B[t][g] = __uint_as_float(w.xb[L][0] & 0xffffe000u);
        B[t + 4][g] = __uint_as_float(w.xb[L][1] & 0xffffe000u);
    }
    w.bar.arrive_and_wait();
    const int g = my_lane >> 2, t = my_lane & 3;
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = c[e];
        for (int k = 0; k < 8; ++k) s += (double)A[r][k] * B[k][col];
        c[e] = (float)s;
    }
}
// ldmatrix .x4 (.trans): lane 8i + j gives the address of row j of matrix i; register i of lane
// (g, t) gets matrix i's row g, columns 2t, 2t + 1 (transposed: rows 2t, 2t + 1 of column g).
static void emu_ldsm(unsigned (&r)[4], unsigned addr, bool trans) {
    Warp& w = *my_warp;
    w.xi[my_lane] = (int)addr;
    w.bar.arrive_and_wait();
    const int g = my_lane >> 2, t = my_lane & 3;
    for (int i = 0; i < 4; ++i) {
        unsigned short lo, hi;
        if (!trans) {
            const unsigned short* row = (const unsigned short*)(emu_smem_buf.data() + (unsigned)w.xi[8 * i + g]);
            lo = row[2 * t];
            hi = row[2 * t + 1];
        } else {
            lo = ((const unsigned short*)(emu_smem_buf.data() + (unsigned)w.xi[8 * i + 2 * t]))[g];
            hi = ((const unsigned short*)(emu_smem_buf.data() + (unsigned)w.xi[8 * i + 2 * t + 1]))[g];
        }
        r[i] = ((unsigned)hi << 16) | lo;
    }
    w.bar.arrive_and_wait();
}
// stmatrix .x4 .trans: the inverse of emu_ldsm's transposing load (lane 8i + j gives the address
// of row j of matrix i; register i of lane (g, t) goes to rows 2t, 2t + 1 of column g).
static void emu_stsm(unsigned addr, const unsigned (&r)[4]) {
    Warp& w = *my_warp;
    w.xi[my_lane] = (int)addr;
    w.bar.arrive_and_wait();
    const int g = my_lane >> 2, t = my_lane & 3;
    for (int i = 0; i < 4; ++i) {
        ((unsigned short*)(emu_smem_buf.data() + (unsigned)w.xi[8 * i + 2 * t]))[g] = (unsigned short)(r[i] & 0xffffu);
        ((unsigned short*)(emu_smem_buf.data() + (unsigned)w.xi[8 * i + 2 * t + 1]))[g] = (unsigned short)(r[i] >> 16);
    }
    w.bar.arrive_and_wait();
}
static void __trap() { abort(); }
// wgmma m64nNk16, N = 8 nw (bf16, f32 accumulate; A from registers, B through a shared-memory
// descriptor in the 128-byte swizzle) into the last nw tiles of d: the 128 lanes' A fragments
// gathered into A (64 x 16); B (16 x N) read at the descriptor's address, K-major (tb = 0:
// element (k, n) at n * 128 + 2 k) or MN-major (tb = 1: at k * 128 + 2 n), each address's 16-byte
// piece swizzled by its 128-byte line (bits 4-6 xor bits 7-9), as the hardware reads it; products
// summed in double.
static void emu_wgmma(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc, int tb, int nw) {
    WarpGroup& G = *my_wg;
    const int me = threadIdx.x % 128;
    for (int e = 0; e < 4; ++e) G.xa[me][e] = a[e];
    G.desc[me] = desc;
    G.bar.arrive_and_wait();
    if ((desc >> 62) != 1 || ((desc >> 16) & 0x3fff) != 64 || ((desc >> 32) & 0x3fff) != 64) abort();
    for (int T = 0; T < 128; ++T)
        if (G.desc[T] != desc) abort();  // one product of the warpgroup
    float A[64][16], B[16][64];
    for (int T = 0; T < 128; ++T) {
        const int w = T / 32, L = T % 32, g = L >> 2, t = L & 3;
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int e = 0; e < 4; ++e) {
            A[16 * w + rows[e]][cols[e]] = emu_half(G.xa[T][e] & 0xffff, false);
            A[16 * w + rows[e]][cols[e] + 1] = emu_half(G.xa[T][e] >> 16, false);
        }
    }
    const unsigned start = (unsigned)(desc & 0x3fff) << 4;
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 8 * nw; ++n) {
            unsigned at = start + (tb ? k * 128 + 2 * n : n * 128 + 2 * k);
            at ^= ((at >> 7) & 7) << 4;
            unsigned short x;
            memcpy(&x, emu_smem_buf.data() + at, 2);
            B[k][n] = emu_half(x, false);
        }
    G.bar.arrive_and_wait();
    const int w = me / 32, g = my_lane >> 2, t = my_lane & 3;
    for (int i = 8 - nw; i < 8; ++i)
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * w + g + 8 * (e >> 1), col = 8 * (i - (8 - nw)) + 2 * t + (e & 1);
            double sum = d[i][e];
            for (int k = 0; k < 16; ++k) sum += (double)A[r][k] * B[k][col];
            d[i][e] = (float)sum;
        }
}
// wgmma with both operands in shared memory, both K-major (wgmma_ss): d (64 x 8 nw) += A B.
template <int NT>
static void emu_wgmma_ss(float (&d)[NT][4], unsigned long long da, unsigned long long db, int nw) {
    WarpGroup& G = *my_wg;
    const int me = threadIdx.x % 128;
    G.desc[me] = da ^ (db * 1315423911ull);
    G.bar.arrive_and_wait();
    for (int T = 0; T < 128; ++T)
        if (G.desc[T] != G.desc[me]) abort();  // one product of the warpgroup
    for (unsigned long long x : {da, db})
        if ((x >> 62) != 1 || ((x >> 16) & 0x3fff) != 64 || ((x >> 32) & 0x3fff) != 64) abort();
    G.bar.arrive_and_wait();
    if (nw != NT) abort();
    auto at = [](unsigned long long desc, int row, int k) {
        unsigned a = ((unsigned)(desc & 0x3fff) << 4) + row * 128 + 2 * k;
        a ^= ((a >> 7) & 7) << 4;
        unsigned short x;
        memcpy(&x, emu_smem_buf.data() + a, 2);
        return (double)emu_half(x, false);
    };
    const int w = me / 32, g = my_lane >> 2, t = my_lane & 3;
    for (int i = 0; i < NT; ++i)
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * w + g + 8 * (e >> 1), col = 8 * i + 2 * t + (e & 1);
            double sum = d[i][e];
            for (int k = 0; k < 16; ++k) sum += at(da, r, k) * at(db, col, k);
            d[i][e] = (float)sum;
        }
}
// A launch: blocks one after the other, each on `threads` threads, its shared memory poisoned
// (all bits set: NaN as f32 and as bf16) so that a read before a write shows.
template <class F>
static void emu_launch(long long grid, int threads, long long smem, F f) {
    emu_block_dim = threads;
    emu_grid_dim = (unsigned)grid;
    for (long long b = 0; b < grid; ++b) {
        for (auto& nb : emu_named) nb.count.store(0);
        emu_smem_buf.assign(smem + 64, 0xff);
        std::barrier<> bb(threads);
        emu_block_bar = &bb;
        std::vector<Warp> ws(threads / 32);
        std::vector<std::unique_ptr<WarpGroup>> wgs;
        for (int g0 = 0; g0 < threads; g0 += 128) wgs.push_back(std::make_unique<WarpGroup>(std::min(128, threads - g0)));
        std::vector<std::thread> th;
        for (int tid = 0; tid < threads; ++tid)
            th.emplace_back([&, tid, b] {
                threadIdx.x = tid;
                blockIdx.x = (unsigned)b;
                my_warp = &ws[tid / 32];
                my_wg = wgs[tid / 128].get();
                my_lane = tid % 32;
                f();
            });
        for (auto& t : th) t.join();
    }
}
