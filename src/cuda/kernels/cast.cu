// Conversions between 16-bit floats and f32 on the device: inputs travel as 16 bits and are
// widened here (exactly), outputs are narrowed here with round-to-nearest-even. The widening is
// written out by hand and the narrowing uses PTX's cvt.rn (NVRTC alone has no cuda_bf16.h /
// cuda_fp16.h; cvt.rn.bf16.f32 needs sm_80, the oldest architecture compiled for).
struct CastParams {
    const void* x;  // n elements of the source type
    void* y;        // n elements of the destination type
    i64 n;
    int bf16;  // the 16-bit side is bf16 (1) or IEEE f16 (0)
};
static_assert(sizeof(CastParams) == PARAMS_BYTES, "CastParams differs from its Rust mirror");

#define ELEMENTS(e, n) \
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += (i64)gridDim.x * blockDim.x)

// bf16 is the top half of an f32.
__device__ __forceinline__ float bf16_to_f32(unsigned short b) {
    return __uint_as_float(((unsigned)b) << 16);
}

// IEEE half: 1 sign, 5 exponent, 10 mantissa bits.
__device__ __forceinline__ float f16_to_f32(unsigned short b) {
    const unsigned h = b;
    const unsigned sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24, exact in f32.
        const float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mant << 13));  // inf or NaN
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

extern "C" __global__ void widen(const CastParams P) {
    const unsigned short* __restrict__ x = (const unsigned short*)P.x;
    float* __restrict__ y = (float*)P.y;
    ELEMENTS(e, P.n) y[e] = P.bf16 ? bf16_to_f32(x[e]) : f16_to_f32(x[e]);
}

extern "C" __global__ void narrow(const CastParams P) {
    const float* __restrict__ x = (const float*)P.x;
    unsigned short* __restrict__ y = (unsigned short*)P.y;
    ELEMENTS(e, P.n) {
        unsigned short r;
        if (P.bf16)
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x[e]));
        else
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x[e]));
        y[e] = r;
    }
}
