// Shared by every kernel source (prepended by the registry; no toolkit header is available).
// All index arithmetic is 64-bit: a [T, H, K] buffer can exceed 2^31 elements.
//
// Every kernel takes one parameter: a struct passed by value, mirrored field by field by a
// #[repr(C)] struct in src/cuda/stages/ (pointers are CUdeviceptr, u64, there). The registry
// compiles each source with -DPARAMS_BYTES=<size of the Rust mirror>, and each source checks its
// struct against it, so a mismatch is a compile error rather than a garbled launch.
typedef long long i64;

// Work items are spread over a 1-D grid of at most a few million blocks; each block loops over
// the items it owns, so no count can hit a grid-dimension limit.
#define BLOCK_LOOP(item, n) for (i64 item = blockIdx.x; item < (n); item += gridDim.x)

// One step of the within-chunk cumsum of the gate: x below `reset` restarts the sum (a hard
// reset; resets counts them), else acc += x with err collecting, by TwoSum, exactly what rounding
// that add lost (plain adds: nothing reassociates them without fast math).
// Written with selects rather than branches: the same values, and an unrolled loop of steps
// has no branch to resolve per token.
__device__ __forceinline__ void cumsum_step(float x, float reset, float& acc, float& err,
                                            float& resets) {
    const bool r = x < reset;
    const float s = acc + x, b = s - acc;
    const float e = (acc - (s - b)) + (x - b);
    acc = r ? 0.0f : s;
    err = r ? 0.0f : err + e;
    resets += r ? 1.0f : 0.0f;
}

// (a, ae) += (b, be) for double-floats (value, collected error): the add's rounding error, by
// TwoSum, joins the errors.
__device__ __forceinline__ void two_sum_add(float& a, float& ae, float b, float be) {
    const float s = a + b, bb = s - a;
    const float e = (a - (s - bb)) + (b - bb);
    a = s;
    ae = (ae + be) + e;
}

// The within-chunk cumulative gate (see the Gamma doc in backend.rs), three [B, T, HV] arrays.
struct GammaIn {
    const float* gamma;
    const float* lo;
    const float* seg;
};

// gm's arrays as __restrict__ locals gamma, lo and seg.
#define GAMMA_LOCALS(gm) \
    const float *__restrict__ gamma = (gm).gamma, *__restrict__ lo = (gm).lo, *__restrict__ seg = (gm).seg

// The chunk table: chunk c covers the flat tokens start[c] .. start[c] + len[c].
struct Chunks {
    const i64* start;
    const i64* len;
    i64 count;
};

// The dimensions most kernels take: H q/k heads, HV value heads, K, V, and the head map (tiled:
// value head j reads q/k head j % H; grouped: j / (HV / H)).
struct Shape {
    i64 heads, hv, dk, dv;
    int tiled;
};

// The decay from token j to token i of one chunk (see the Gamma doc in backend.rs): the
// difference of the running sums plus the difference of their rounding errors.
__device__ __forceinline__ float decay(float gamma_i, float lo_i, float seg_i, float gamma_j,
                                       float lo_j, float seg_j) {
    return seg_i == seg_j ? expf((gamma_i - gamma_j) + (lo_i - lo_j)) : 0.0f;
}

// The decay from the state entering a chunk to token i.
__device__ __forceinline__ float decay0(float gamma_i, float lo_i, float seg_i) {
    return seg_i == 0.0f ? expf(gamma_i + lo_i) : 0.0f;
}

// The q/k head read by value head j: grouped j / (HV / H) or tiled j % H.
__device__ __forceinline__ i64 qk_head(i64 j, i64 h, i64 hv, int tiled) {
    return tiled ? j % h : j / (hv / h);
}

// Sum over a full warp; every lane gets the same value, in the same order on every run.
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
