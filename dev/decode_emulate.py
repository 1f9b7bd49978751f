"""Runs the decode kernel's CUDA source on the CPU: a host shim (threads as lanes, barriers for
__shfl_xor_sync and __syncwarp) around src/cuda/kernels/fused/decode.cu, driven by
decode_emulate_driver.cpp against a float64 reference. No GPU needed:
    python3 dev/decode_emulate.py [cases]   (150 by default; needs g++ with C++20)"""
import os
import re, subprocess, sys
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
shim = r'''
#include <cmath>
#include <cstring>
#include <vector>
#include <thread>
#include <barrier>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
struct float4 { float x, y, z, w; };
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint2 { unsigned x, y; };
static uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
struct Dim { long long x = 0; };
thread_local Dim threadIdx, blockIdx;
static long long blockDim_g, gridDim_g;
#define blockDim (Dim{blockDim_g})
#define gridDim (Dim{gridDim_g})
struct Warp { std::barrier<> bar{32}; float xch[32]; };
thread_local Warp* my_warp; thread_local int my_lane;
static float __shfl_xor_sync(unsigned, float v, int m) {
    my_warp->xch[my_lane] = v; my_warp->bar.arrive_and_wait();
    float r = my_warp->xch[my_lane ^ m]; my_warp->bar.arrive_and_wait(); return r;
}
static void __syncwarp() { my_warp->bar.arrive_and_wait(); }
static float g_smem[4 * 4 * 256];
'''
src = open(os.path.join(root, "src/cuda/kernels/common.cuh")).read() + open(os.path.join(root, "src/cuda/kernels/fused/decode.cu")).read()
src = src.replace("extern __shared__ float smem[];", "float* smem = g_smem;")
src = src.replace('asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));', "{ _Float16 x; memcpy(&x, &h, 2); f = (float)x; }")
src = src.replace('asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(x));', "{ _Float16 y = (_Float16)x; memcpy(&h, &y, 2); }")
# The streaming hints of the state loads and stores (ld_state, st_state) are plain accesses here.
src = re.sub(r'asm volatile\("ld\.global\.cs[^;]*;"[^;]*;', "v = *(const float4*)p;", src)
src = re.sub(r'asm volatile\("st\.global\.cs[^;]*;"[^;]*;', "*(float4*)p = v;", src)
assert "asm(" not in src and "asm volatile(" not in src
drv = open(os.path.join(root, "dev/decode_emulate_driver.cpp")).read()
out = "/tmp/decode_emulate"
open(out + ".cpp", "w").write(shim + src + drv)
subprocess.check_call(["g++", "-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-o", out, out + ".cpp"])
sys.exit(subprocess.call([out] + sys.argv[1:]))
