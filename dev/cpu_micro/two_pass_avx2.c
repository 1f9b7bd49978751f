/* The decode step's floor with AVX2 (16 ymm registers: the sums of a 128-column row do not fit,
 * so they live in a cache-line-aligned array, as in `rows_step`): per 64 KB state (128 x 128
 * f32) a pass of both sums four rows at a time, then the update pass; mode 0 fetches nothing,
 * mode 1 the next state (T0) during the update, mode 2 half of it during each pass; OpenMP static over the states, medians of 40 steps over
 * the same buffer (reused step after step, as `deltanet bench --work decode` reuses its pool).
 * gcc -O3 -march=native -fopenmp -o two_pass_avx2 two_pass_avx2.c
 * OMP_NUM_THREADS=2 ./two_pass_avx2 32   (MiB of states: 32 is decode N=16 at HV=32, K=V=128) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float step(float*blk,float*nx,int mode){
  float ka[128] __attribute__((aligned(64))), qa[128] __attribute__((aligned(64)));
  for(int c=0;c<128;c++){ka[c]=0;qa[c]=0;}
  for(int r=0;r<128;r+=4){ if(mode&2) for(int h=0;h<2;h++) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+(r/2+h)*128+l*16),_MM_HINT_T0);
    __m256 k0=_mm256_set1_ps(0.01f*r),k1=_mm256_set1_ps(0.011f*r),k2=_mm256_set1_ps(0.012f*r),k3=_mm256_set1_ps(0.013f*r);
    __m256 q0=_mm256_set1_ps(0.02f*r),q1=_mm256_set1_ps(0.021f*r),q2=_mm256_set1_ps(0.022f*r),q3=_mm256_set1_ps(0.023f*r);
    for(int c=0;c<128;c+=8){ __m256 x0=_mm256_load_ps(blk+r*128+c),x1=_mm256_load_ps(blk+(r+1)*128+c),x2=_mm256_load_ps(blk+(r+2)*128+c),x3=_mm256_load_ps(blk+(r+3)*128+c);
      __m256 a=_mm256_load_ps(ka+c),b=_mm256_load_ps(qa+c);
      a=_mm256_fmadd_ps(k0,x0,a);a=_mm256_fmadd_ps(k1,x1,a);a=_mm256_fmadd_ps(k2,x2,a);a=_mm256_fmadd_ps(k3,x3,a);
      b=_mm256_fmadd_ps(q0,x0,b);b=_mm256_fmadd_ps(q1,x1,b);b=_mm256_fmadd_ps(q2,x2,b);b=_mm256_fmadd_ps(q3,x3,b);
      _mm256_store_ps(ka+c,a);_mm256_store_ps(qa+c,b);} }
  for(int c=0;c<128;c++) ka[c]=ka[c]*1e-6f;
  __m256 d=_mm256_set1_ps(0.999f);
  for(int r=0;r<128;r++){ __m256 kr=_mm256_set1_ps(1e-6f*r);
    if((mode&2)&&(r&1)) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+(64+r/2)*128+l*16),_MM_HINT_T0);
    if(mode&1) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+r*128+l*16),_MM_HINT_T0);
    for(int c=0;c<128;c+=8){ __m256 x=_mm256_load_ps(blk+r*128+c); _mm256_store_ps(blk+r*128+c,_mm256_fmadd_ps(kr,_mm256_load_ps(ka+c),_mm256_mul_ps(d,x))); } }
  return qa[0];
}
int main(int argc,char**argv){
  size_t mib=argc>1?atoi(argv[1]):32; size_t n=mib<<18; float*a=aligned_alloc(64,n*4);
  #pragma omp parallel for schedule(static)
  for(size_t i=0;i<n;i++)a[i]=1.0f;
  size_t nb=n/16384;
  for(int mode=0;mode<3;mode++) for(int rep=0;rep<2;rep++){
    double ts[40]; volatile float s=0;
    for(int it=0;it<40;it++){ double t=now();
      #pragma omp parallel for schedule(static)
      for(size_t b=0;b<nb;b++) s+=step(a+b*16384,a+((b+1)%nb)*16384,mode);
      ts[it]=now()-t;}
    for(int i=0;i<40;i++)for(int j=i+1;j<40;j++)if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;}
    printf("%zu MiB mode %d: median %.3f ms min %.3f\n",mib,mode,ts[20]*1e3,ts[0]*1e3);}
}
