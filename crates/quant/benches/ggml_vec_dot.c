/*
 * The cases of `dot.rs` run through llama.cpp's own kernels (`ggml_get_type_traits_cpu(t)->vec_dot`,
 * one call per row, activations quantized by the `vec_dot_type`'s `from_float`), to compare sift's
 * GB/s with llama.cpp's on the same machine. Needs the reference build of scripts/build-llama-ref.sh:
 *
 *   R=.ref; cc -O2 crates/quant/benches/ggml_vec_dot.c -I$R/src/vendor/llama.cpp/ggml/include \
 *      -L$R/build/bin -lggml-cpu -lggml-base -Wl,-rpath,$PWD/$R/build/bin -o /tmp/ggml_vec_dot
 *   /tmp/ggml_vec_dot
 */
#include "ggml.h"
#include "ggml-cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void run(enum ggml_type t, int rows, int n, const char*what){
  const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(t);
  const struct ggml_type_traits_cpu *ta = ggml_get_type_traits_cpu(tr->vec_dot_type);
  size_t rb = ggml_row_size(t, n), ab = ggml_row_size(tr->vec_dot_type, n);
  float *x = malloc(sizeof(float)*n); srand(7);
  char *w = malloc(rb*rows); char *a = malloc(ab);
  char *distinct = malloc(rb*64);
  for (int r=0;r<64;r++){ for(int i=0;i<n;i++) x[i]=2.0f*rand()/RAND_MAX-1.0f; ggml_quantize_chunk(t, x, distinct+r*rb, 0, 1, n, NULL);}
  for (int r=0;r<rows;r++) memcpy(w+(size_t)r*rb, distinct+(r%64)*rb, rb);
  for(int i=0;i<n;i++) x[i]=2.0f*rand()/RAND_MAX-1.0f;
  ta->from_float(x, a, n);
  float *out = malloc(sizeof(float)*rows);
  double best=1e9, start=now(); int calls=0;
  while (calls<5 || now()-start<0.1) { double t0=now(); for(int r=0;r<rows;r++) tr->vec_dot(n, out+r, 0, w+(size_t)r*rb, 0, a, 0, 1); double dt=now()-t0; if(dt<best)best=dt; calls++; }
  printf("ggml %-6s %6dx%-5d %8.2f GB/s %8.1f ns/row  %s\n", ggml_type_name(t), rows, n, (double)rb*rows/best/1e9, best*1e9/rows, what);
}
int main(){ ggml_cpu_init();
 run(GGML_TYPE_Q4_1,1536,576,"SmolLM2 ffn_up"); run(GGML_TYPE_Q4_1,576,1536,"SmolLM2 ffn_down");
 run(GGML_TYPE_Q8_0,49152,576,"SmolLM2 output"); run(GGML_TYPE_Q8_0,4864,896,"Qwen ffn_up");
 run(GGML_TYPE_Q5_0,896,4864,"Qwen ffn_down"); run(GGML_TYPE_Q4_0,1536,576,"");
 run(GGML_TYPE_F32,576,576,""); run(GGML_TYPE_F16,576,576,""); run(GGML_TYPE_BF16,576,576,"");
 run(GGML_TYPE_Q4_K,896,4864,""); run(GGML_TYPE_Q5_K,896,4864,""); run(GGML_TYPE_Q6_K,896,4864,"");
 run(GGML_TYPE_Q4_1,16384,4096,"from memory");
 return 0;}
