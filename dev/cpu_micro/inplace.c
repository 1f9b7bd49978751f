/* One core's floor for the decode step's traffic: an in-place pass (read and write) over 32 MiB,
 * the states of decode N=16 at H=16 HV=32 K=V=128, warm in the last-level cache as they are
 * between steps. gcc -O3 -march=native -o inplace inplace.c && ./inplace (NOTES-CPU.md). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t n=8u<<20; float*a=aligned_alloc(64,n*4); for(size_t i=0;i<n;i++)a[i]=1.0f;
  for(int r=0;r<3;r++) for(size_t i=0;i<n;i++) a[i]=a[i]*0.999f+0.001f;
  int reps=40; double t=now();
  for(int r=0;r<reps;r++) for(size_t i=0;i<n;i++) a[i]=a[i]*0.999f+0.001f;
  double dt=(now()-t)/reps; printf("in-place 32 MiB: %.3f ms, %.1f GB/s r+w\n",dt*1e3,2.0*n*4/dt/1e9);
  return 0;}
