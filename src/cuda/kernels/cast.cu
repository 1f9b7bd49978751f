// 16-bit inputs to f32 on the device, so the host uploads half the bytes. Both conversions are
// exact and written out by hand (NVRTC alone has no cuda_bf16.h / cuda_fp16.h).

// bf16 is the top half of an f32.
extern "C" __global__ void bf16_to_f32(const unsigned short* __restrict__ x, float* __restrict__ y,
                                       i64 n) {
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (i64)gridDim.x * blockDim.x)
        y[e] = __uint_as_float(((unsigned)x[e]) << 16);
}

// IEEE half: 1 sign, 5 exponent, 10 mantissa bits.
extern "C" __global__ void f16_to_f32(const unsigned short* __restrict__ x, float* __restrict__ y,
                                      i64 n) {
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (i64)gridDim.x * blockDim.x) {
        const unsigned h = x[e];
        const unsigned sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
        float v;
        if (exp == 0) {
            // Zero or subnormal: mant * 2^-24, exact in f32.
            v = (float)mant * 5.9604644775390625e-8f;
            v = sign ? -v : v;
        } else if (exp == 0x1f) {
            v = __uint_as_float(sign | 0x7f800000u | (mant << 13));  // inf or NaN
        } else {
            v = __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
        }
        y[e] = v;
    }
}
