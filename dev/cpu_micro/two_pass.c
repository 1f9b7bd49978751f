/* The decode step's two passes per 64 KB state (128 x 128 f32): column sums over the rows, then
 * the update of every row; with and without prefetching the next state. AVX-512.
 * gcc -O3 -march=native -o two_pass two_pass.c && ./two_pass (NOTES-CPU.md). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float run(float*a,size_t n,int mode){
  float s=0;
  for(size_t b=0;b<n;b+=16384){
    __m512 ka[8],qa[8]; for(int c=0;c<8;c++){ka[c]=_mm512_setzero_ps();qa[c]=_mm512_setzero_ps();}
    float*blk=a+b; float*nx=a+((b+16384)%n);
    for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(0.01f*row), qr=_mm512_set1_ps(0.02f*row);
      if(mode==1) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_T1);
      if(mode==3) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_T0);
      for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(blk+row*128+c*16); ka[c]=_mm512_fmadd_ps(kr,x,ka[c]); qa[c]=_mm512_fmadd_ps(qr,x,qa[c]); } }
    __m512 d=_mm512_set1_ps(0.999f);
    for(int row=0;row<128;row++){ __m512 kr=_mm512_set1_ps(1e-6f*row);
      if(mode==2) for(int l=0;l<8;l++) _mm_prefetch((const char*)(nx+row*128+l*16),_MM_HINT_T1);
      for(int c=0;c<8;c++){ __m512 x=_mm512_load_ps(blk+row*128+c*16); _mm512_store_ps(blk+row*128+c*16,_mm512_fmadd_ps(kr,ka[c],_mm512_mul_ps(d,x))); } }
    s+=_mm512_reduce_add_ps(qa[0]);
  }
  return s;
}
int main(){
  size_t n=8u<<20; float*a=aligned_alloc(64,n*4); for(size_t i=0;i<n;i++)a[i]=1.0f;
  const char*names[]={"no prefetch","next block in pass 1 (T1)","next block in pass 2 (T1)","next block in pass 1 (T0)"};
  for(int rep=0;rep<2;rep++) for(int mode=0;mode<4;mode++){
    float s=run(a,n,mode); int reps=30; double t=now();
    for(int r=0;r<reps;r++) s+=run(a,n,mode);
    double dt=(now()-t)/reps; printf("%-28s %.3f ms (%g)\n",names[mode],dt*1e3,s);
  }
  return 0;}
