/* The kernel facts behind docs/design/same_host_fast_path.md, measured between two processes
 * of one host: memcpy in one process, process_vm_writev from a child into its parent's
 * buffer, memcpy into a MAP_SHARED mapping from a child, an eventfd ping-pong and a
 * shared-memory spin ping-pong.
 * Build and run: gcc -O2 -o /tmp/probe docs/design/same_host_probe.c && /tmp/probe 1048576 2000
 * (arguments: bytes per copy, copies). Not part of the build or the tests. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t sz = argc>1?atol(argv[1]):1<<20; int iters = argc>2?atoi(argv[2]):2000;
  char *src = aligned_alloc(4096, sz), *dst = aligned_alloc(4096, sz);
  memset(src, 1, sz); memset(dst, 0, sz);
  double t=now(); for(int i=0;i<iters;i++){ memcpy(dst, src, sz); __asm__ volatile("":::"memory"); } double mc = sz*(double)iters/(now()-t)/1e9;
  // process_vm_writev from a child into the parent's dst
  int go[2], done[2]; pipe(go); pipe(done);
  pid_t parent = getpid();
  pid_t c = fork();
  if(c==0){ char b; read(go[0],&b,1);
    struct iovec l={src,sz}, r={dst,sz}; double t0=now(); long ok=0;
    for(int i=0;i<iters;i++){ if(process_vm_writev(parent,&l,1,&r,1,0)==(ssize_t)sz) ok++; }
    double g = sz*(double)ok/(now()-t0)/1e9; write(done[1],&g,sizeof g); _exit(ok==iters?0:1);}
  write(go[1],"x",1); double pvw=0; read(done[0],&pvw,sizeof pvw); int st; waitpid(c,&st,0);
  // shared memory (memfd) memcpy by the child
  char *shm = mmap(NULL, sz, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
  c = fork();
  if(c==0){ double t0=now(); for(int i=0;i<iters;i++){ memcpy(shm, src, sz); __asm__ volatile("":::"memory");} double g=sz*(double)iters/(now()-t0)/1e9; write(done[1],&g,sizeof g); _exit(0);}
  double shg=0; read(done[0],&shg,sizeof shg); waitpid(c,&st,0);
  // eventfd ping-pong latency (blocking reads)
  int a=eventfd(0,0), b=eventfd(0,0); int n=20000; uint64_t v=1;
  c=fork();
  if(c==0){ for(int i=0;i<n;i++){ read(a,&v,8); v=1; write(b,&v,8);} _exit(0);}
  t=now(); for(int i=0;i<n;i++){ v=1; write(a,&v,8); read(b,&v,8);} double rtt=(now()-t)/n*1e6; waitpid(c,&st,0);
  // shared-memory spin ping-pong latency
  volatile uint64_t *flag = (volatile uint64_t*)shm; flag[0]=0; flag[8]=0;
  c=fork();
  if(c==0){ for(uint64_t i=1;i<=(uint64_t)n;i++){ while(flag[0]!=i); flag[8]=i;} _exit(0);}
  t=now(); for(uint64_t i=1;i<=(uint64_t)n;i++){ flag[0]=i; while(flag[8]!=i);} double srtt=(now()-t)/n*1e6; waitpid(c,&st,0);
  printf("size %zu: memcpy %.2f GB/s, process_vm_writev %.2f GB/s (child exit %d), shared-memory memcpy %.2f GB/s, eventfd round trip %.2f us, shm spin round trip %.3f us\n", sz, mc, pvw, WEXITSTATUS(st), shg, rtt, srtt);
  return 0; }
