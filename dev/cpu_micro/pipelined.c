/* The decode step's two passes, software-pipelined across states: the update of state b row by
 * row together with the column sums of state b + 1. AVX-512.
 * gcc -O3 -march=native -o pipelined pipelined.c && ./pipelined (NOTES-CPU.md). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* software-pipelined: pass 2 of block b fused with pass 1 of block b+1, row by row */
static float run(float*a,size_t n){
  float s=0; size_t nb=n/16384;
  __m512 ka[8],qa[8],kn[8],qn[8];
  for(int c=0;c<8;c++){ka[c]=_mm512_setzero_ps();qa[c]=_mm512_setzero_ps();}
  for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(0.01f*row), qr=_mm512_set1_ps(0.02f*row);
    for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(a+row*128+c*16); ka[c]=_mm512_fmadd_ps(kr,x,ka[c]); qa[c]=_mm512_fmadd_ps(qr,x,qa[c]); } }
  __m512 d=_mm512_set1_ps(0.999f);
  for(size_t b=0;b<nb;b++){
    float*blk=a+b*16384; float*nx=a+((b+1)%nb)*16384; int more=b+1<nb;
    for(int c=0;c<8;c++){kn[c]=_mm512_setzero_ps();qn[c]=_mm512_setzero_ps();}
    for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(1e-6f*row);
      for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(blk+row*128+c*16); _mm512_store_ps(blk+row*128+c*16,_mm512_fmadd_ps(kr,ka[c],_mm512_mul_ps(d,x))); }
      if(more){ __m512 k2=_mm512_set1_ps(0.01f*row), q2=_mm512_set1_ps(0.02f*row);
        for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(nx+row*128+c*16); kn[c]=_mm512_fmadd_ps(k2,x,kn[c]); qn[c]=_mm512_fmadd_ps(q2,x,qn[c]); } }
    }
    s+=_mm512_reduce_add_ps(qa[0]);
    for(int c=0;c<8;c++){ka[c]=kn[c];qa[c]=qn[c];}
  }
  return s;
}
int main(){
  size_t n=8u<<20; float*a=aligned_alloc(64,n*4); for(size_t i=0;i<n;i++)a[i]=1.0f;
  for(int rep=0;rep<3;rep++){
    float s=run(a,n); int reps=30; double t=now();
    for(int r=0;r<reps;r++) s+=run(a,n);
    double dt=(now()-t)/reps; printf("pipelined  %.3f ms (%g)\n",dt*1e3,s);
  }
  return 0;}
