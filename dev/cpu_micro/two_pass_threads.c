/* The decode step's two passes per 64 KB state (128 x 128 f32) on every thread (OpenMP, each
 * thread a fixed contiguous share of the states, as a decode step over states that stay in the
 * last-level cache): where the next state is fetched (none; all of it during the second pass;
 * half during each pass; all during the second pass for writing). AVX-512. Medians of 60 steps.
 * gcc -O3 -march=native -fopenmp -o two_pass_threads two_pass_threads.c
 * OMP_NUM_THREADS=2 ./two_pass_threads 512   (512 states: N=16, HV=32; NOTES-CPU.md) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define KV 16384
static void state(float*blk,float*nx,int mode,float*out){
    __m512 ka[8],qa[8]; for(int c=0;c<8;c++){ka[c]=_mm512_setzero_ps();qa[c]=_mm512_setzero_ps();}
    for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(0.01f*row), qr=_mm512_set1_ps(0.02f*row);
      if(mode==1&&nx) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_T1);
      if(mode==4&&nx&&(row&1)) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+(row>>1)*128+l*16),_MM_HINT_T1);
      for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(blk+row*128+c*16); ka[c]=_mm512_fmadd_ps(kr,x,ka[c]); qa[c]=_mm512_fmadd_ps(qr,x,qa[c]); } }
    __m512 d=_mm512_set1_ps(0.999f);
    for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(1e-6f*row);
      if(mode==2&&nx) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_T1);
      if(mode==4&&nx&&(row&1)) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+(64+(row>>1))*128+l*16),_MM_HINT_T1);
      if(mode==5&&nx) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_ET1);
      for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(blk+row*128+c*16); _mm512_store_ps(blk+row*128+c*16,_mm512_fmadd_ps(kr,ka[c],_mm512_mul_ps(d,x))); } }
    _mm512_store_ps(out,qa[0]);
}
int main(int argc,char**argv){
  size_t nst=atol(argv[1]); size_t n=nst*KV; float*a=aligned_alloc(64,n*4); for(size_t i=0;i<n;i++)a[i]=1.0f;
  float outs[64*16] __attribute__((aligned(64)));
  const char*names[]={"none","pass1 T1","pass2 T1","-","split T1","pass2 ET1"};
  int modes[]={0,1,2,4,5};
  for(int rep=0;rep<3;rep++) for(int mi=0;mi<5;mi++){int mode=modes[mi];
    double ts[60];
    for(int it=0;it<60;it++){ double t=now();
      #pragma omp parallel
      { int tid=omp_get_thread_num(),nt=omp_get_num_threads(); size_t lo=tid*nst/nt,hi=(tid+1)*nst/nt;
        for(size_t s=lo;s<hi;s++) state(a+s*KV, s+1<hi? a+(s+1)*KV:0, mode, outs+tid*16); }
      ts[it]=now()-t; }
    for(int i=0;i<60;i++)for(int j=i+1;j<60;j++)if(ts[j]<ts[i]){double x=ts[i];ts[i]=ts[j];ts[j]=x;} double best=ts[30];
    printf("%-10s %.3f ms %.1f GB/s\n",names[mode],best*1e3,2.0*n*4/best/1e9);
  }
}
