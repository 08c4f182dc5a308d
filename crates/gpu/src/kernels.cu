// sift's CUDA kernels: quantized weight matrices (GGUF block layouts, unchanged) times f32
// activations. Compiled at run time by NVRTC (src/cuda.rs); no CUDA headers needed.
//
// One warp per weight row; each lane takes 32-value sub-blocks of the row in turn (a Q4_0/Q4_1/
// Q5_0/Q8_0 block, or one of the 8 sub-blocks of a K-quant super-block), so a row of any width
// spreads over the warp; a warp shuffle sums the lanes. Weights are dequantized in registers and
// multiplied by the f32 activations: the activations are not rounded as the CPU kernels round them
// (to 8 bits), so results differ from the CPU's by that rounding, not by the weights.
//
// Layout: y[t * rows + r] = W[r] . x[t * cols ..], for r < rows, t < n_tok.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;

#define WARPS_PER_BLOCK 4

__device__ __forceinline__ float h2f(const u8* p) {
    u16 h = (u16)p[0] | ((u16)p[1] << 8);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// A K-quant sub-block's 6-bit scale and min (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Type ids (WeightType order on the Rust side, see src/cuda.rs).
#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_Q4_0 3
#define T_Q4_1 4
#define T_Q5_0 5
#define T_Q8_0 6
#define T_Q4_K 7
#define T_Q5_K 8
#define T_Q6_K 9

// Dot product of sub-block `s` (values 32s .. 32s+32) of a row with x (already offset to 32s);
// `left` values of the row remain from 32s (only the float types may end mid sub-block).
template <int T>
__device__ __forceinline__ float sub_dot(const u8* row, int s, const float* x, int left) {
    if (T == T_F32) {
        const float* w = (const float*)row + 32 * s;
        float acc = 0.f;
        int n = left < 32 ? left : 32;
        for (int j = 0; j < n; j++) acc += w[j] * x[j];
        return acc;
    } else if (T == T_F16) {
        const u8* w = row + 64 * s;
        float acc = 0.f;
        int n = left < 32 ? left : 32;
        for (int j = 0; j < n; j++) acc += h2f(w + 2 * j) * x[j];
        return acc;
    } else if (T == T_BF16) {
        const u8* w = row + 64 * s;
        float acc = 0.f;
        int n = left < 32 ? left : 32;
        for (int j = 0; j < n; j++) {
            u32 bits = ((u32)w[2 * j] | ((u32)w[2 * j + 1] << 8)) << 16;
            acc += __uint_as_float(bits) * x[j];
        }
        return acc;
    } else if (T == T_Q4_0) {
        const u8* b = row + 18 * s;
        const u8* qs = b + 2;
        float acc = 0.f;
        for (int j = 0; j < 16; j++) {
            acc += (float)((int)(qs[j] & 0xF) - 8) * x[j] + (float)((int)(qs[j] >> 4) - 8) * x[j + 16];
        }
        return h2f(b) * acc;
    } else if (T == T_Q4_1) {
        const u8* b = row + 20 * s;
        const u8* qs = b + 4;
        float acc = 0.f, sx = 0.f;
        for (int j = 0; j < 16; j++) {
            acc += (float)(qs[j] & 0xF) * x[j] + (float)(qs[j] >> 4) * x[j + 16];
            sx += x[j] + x[j + 16];
        }
        return h2f(b) * acc + h2f(b + 2) * sx;
    } else if (T == T_Q5_0) {
        const u8* b = row + 22 * s;
        u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
        const u8* qs = b + 6;
        float acc = 0.f;
        for (int j = 0; j < 16; j++) {
            int lo = (int)((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
            int hi = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            acc += (float)lo * x[j] + (float)hi * x[j + 16];
        }
        return h2f(b) * acc;
    } else if (T == T_Q8_0) {
        const u8* b = row + 34 * s;
        const i8* qs = (const i8*)(b + 2);
        float acc = 0.f;
        for (int j = 0; j < 32; j++) acc += (float)qs[j] * x[j];
        return h2f(b) * acc;
    } else if (T == T_Q4_K) {
        const u8* b = row + 144 * (s >> 3);
        int j = s & 7;
        float sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const u8* qs = b + 16 + 32 * (j >> 1);
        int shift = (j & 1) * 4;
        float acc = 0.f, sx = 0.f;
        for (int l = 0; l < 32; l++) {
            acc += (float)((qs[l] >> shift) & 0xF) * x[l];
            sx += x[l];
        }
        return h2f(b) * sc * acc - h2f(b + 2) * m * sx;
    } else if (T == T_Q5_K) {
        const u8* b = row + 176 * (s >> 3);
        int j = s & 7;
        float sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const u8* qh = b + 16;
        const u8* qs = b + 48 + 32 * (j >> 1);
        int shift = (j & 1) * 4;
        float acc = 0.f, sx = 0.f;
        for (int l = 0; l < 32; l++) {
            int q = ((qs[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
            acc += (float)q * x[l];
            sx += x[l];
        }
        return h2f(b) * sc * acc - h2f(b + 2) * m * sx;
    } else {  // T_Q6_K
        const u8* b = row + 210 * (s >> 3);
        int j = s & 7;
        int n = j >> 2, g = j & 3;
        const u8* ql = b + 64 * n + 32 * (g & 1);
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192) + 8 * n + 2 * g;
        int shift = (g >> 1) * 4, hs = 2 * g;
        float a0 = 0.f, a1 = 0.f;
        for (int l = 0; l < 16; l++) {
            int q = (int)(((ql[l] >> shift) & 0xF) | (((qh[l] >> hs) & 3) << 4)) - 32;
            a0 += (float)q * x[l];
        }
        for (int l = 16; l < 32; l++) {
            int q = (int)(((ql[l] >> shift) & 0xF) | (((qh[l] >> hs) & 3) << 4)) - 32;
            a1 += (float)q * x[l];
        }
        return h2f(b + 208) * ((float)sc[0] * a0 + (float)sc[1] * a1);
    }
}

template <int T>
__device__ __forceinline__ void matvec(const u8* w, const float* x, float* y, int rows, int cols, int n_tok,
                                       long long row_bytes) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * WARPS_PER_BLOCK + warp;
    if (r >= rows) return;  // the whole warp leaves together
    const u8* row = w + (long long)r * row_bytes;
    int nsub = (cols + 31) >> 5;
    for (int t = blockIdx.y; t < n_tok; t += gridDim.y) {
        const float* xt = x + (long long)t * cols;
        float acc = 0.f;
        for (int s = lane; s < nsub; s += 32) acc += sub_dot<T>(row, s, xt + 32 * s, cols - 32 * s);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) y[(long long)t * rows + r] = acc;
    }
}

#define MATVEC(name, T)                                                                                  \
    extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int n_tok, \
                                    long long row_bytes) {                                               \
        matvec<T>(w, x, y, rows, cols, n_tok, row_bytes);                                                \
    }

MATVEC(matvec_f32, T_F32)
MATVEC(matvec_f16, T_F16)
MATVEC(matvec_bf16, T_BF16)
MATVEC(matvec_q4_0, T_Q4_0)
MATVEC(matvec_q4_1, T_Q4_1)
MATVEC(matvec_q5_0, T_Q5_0)
MATVEC(matvec_q8_0, T_Q8_0)
MATVEC(matvec_q4_k, T_Q4_K)
MATVEC(matvec_q5_k, T_Q5_K)
MATVEC(matvec_q6_k, T_Q6_K)

// ---- Whole layers on the GPU (src/stack.rs): norms, biases, RoPE, the KV cache, attention ----

__device__ __forceinline__ float round_f16(float v) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float h2f_bits(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the sum.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    int warps = blockDim.x >> 5;
    for (int w = 0; w < warps; w++) s += part[w];
    return s;
}

// g = silu(g) * u (a prompt batch's GLU, computed once for all of down's rows).
extern "C" __global__ void silu_mul(float* g, const float* u, long long total) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

// x[i] += o[i].
extern "C" __global__ void add_rows(float* x, const float* o, long long total) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += o[i];
}

#define ATTN_MAX_WARPS 32
#define MAX_HEAD_DIM 256
#define NEG_INF __int_as_float(0xff800000)

// Causal grouped-query attention of token t (position *pos + t) and query head h over the f16
// cache: one block per (head, token) of up to ATTN_MAX_WARPS warps (blockDim.x / 32: many for a
// decode step, whose one block per head must cover every position; few for a prompt batch, which
// has blocks enough). A warp takes 32 positions at a time, one per lane: each lane computes its
// key's score whole (the key read in 16-byte loads, the query from shared memory), the warp folds
// the 32 scores into its online softmax, then weights the 32 values with lanes over dimensions.
// The warps' states are merged at the end. As llama.cpp's default path (and the CPU's): q rounded
// to f16 before K.q, softmax weights rounded to f16 (relative to the running maximum) before they
// weight V.
extern "C" __global__ void attention(const float* q, const u16* kc, const u16* vc, float* out, int n_head,
                                     int n_head_kv, int hd, const int* pos, float scale) {
    int pos0 = *pos;
    __shared__ float sm_m[ATTN_MAX_WARPS], sm_l[ATTN_MAX_WARPS];
    __shared__ float sm_o[ATTN_MAX_WARPS * MAX_HEAD_DIM];
    __shared__ float sq[MAX_HEAD_DIM];
    int warps = blockDim.x >> 5;
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (n_head / n_head_kv);
    int kvd = n_head_kv * hd;
    const float* qh = q + ((long long)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) sq[d] = round_f16(qh[d]) * scale;
    __syncthreads();
    int n_keys = pos0 + t + 1;
    int per = hd >> 5;  // values per lane (hd is a multiple of 32, at most MAX_HEAD_DIM)
    float o[MAX_HEAD_DIM / 32];
    for (int j = 0; j < per; j++) o[j] = 0.f;
    float m = NEG_INF, l = 0.f;
    for (int base = warp * 32; base < n_keys; base += warps * 32) {
        int p = base + lane;
        float s = NEG_INF;
        if (p < n_keys) {
            // hd / 8 loads of 8 halves: a row starts at a multiple of 64 bytes (kvd and hd are
            // multiples of 32 halves, the cache is allocated aligned).
            const uint4* kp = (const uint4*)(kc + (long long)p * kvd + kvh * hd);
            float acc = 0.f;
#pragma unroll 4
            for (int c = 0; c < (hd >> 3); c++) {
                uint4 v = kp[c];
                u32 w4[4] = {v.x, v.y, v.z, v.w};
                for (int i = 0; i < 4; i++) {
                    acc += sq[8 * c + 2 * i] * h2f_bits((u16)(w4[i] & 0xFFFF));
                    acc += sq[8 * c + 2 * i + 1] * h2f_bits((u16)(w4[i] >> 16));
                }
            }
            s = acc;
        }
        float cm = s;
        for (int k = 16; k > 0; k >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, k));
        float mn = fmaxf(m, cm);
        float a = expf(m - mn);
        float w = p < n_keys ? round_f16(expf(s - mn)) : 0.f;
        float ws = w;
        for (int k = 16; k > 0; k >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, k);
        l = l * a + ws;
        for (int j = 0; j < per; j++) o[j] *= a;
        // All 32 positions (past the last one: weight 0, the last row read again), unrolled so
        // that the value loads of several positions are in flight together.
        int last = n_keys - 1;
#pragma unroll 8
        for (int i = 0; i < 32; i++) {
            float wi = __shfl_sync(0xffffffffu, w, i);
            const u16* vp = vc + (long long)min(base + i, last) * kvd + kvh * hd;
            for (int j = 0; j < per; j++) o[j] += wi * h2f_bits(vp[lane + 32 * j]);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    for (int j = 0; j < per; j++) sm_o[warp * hd + lane + 32 * j] = o[j];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < warps; w++) mx = fmaxf(mx, sm_m[w]);
    float L = 0.f;
    for (int w = 0; w < warps; w++) L += sm_l[w] * expf(sm_m[w] - mx);
    float* dst = out + ((long long)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int w = 0; w < warps; w++) acc += sm_o[w * hd + d] * expf(sm_m[w] - mx);
        dst[d] = acc / L;
    }
}

// The same attention with a warp per position (lanes over dimensions, a shuffle sum per score):
// what decode steps use (faster than a lane per position up to ~1K positions, the same at 1K).
extern "C" __global__ void attention_rows(const float* q, const u16* kc, const u16* vc, float* out, int n_head,
                                          int n_head_kv, int hd, const int* pos, float scale) {
    int pos0 = *pos;
    __shared__ float sm_m[ATTN_MAX_WARPS], sm_l[ATTN_MAX_WARPS];
    __shared__ float sm_o[ATTN_MAX_WARPS * MAX_HEAD_DIM];
    int warps = blockDim.x >> 5;
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (n_head / n_head_kv);
    int kvd = n_head_kv * hd;
    const float* qh = q + ((long long)t * n_head + h) * hd;
    int n_keys = pos0 + t + 1;
    int per = hd >> 5;
    float qv[MAX_HEAD_DIM / 32], o[MAX_HEAD_DIM / 32];
    for (int j = 0; j < per; j++) {
        qv[j] = round_f16(qh[lane + 32 * j]) * scale;
        o[j] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int p = warp; p < n_keys; p += warps) {
        const u16* kp = kc + (long long)p * kvd + kvh * hd;
        float s = 0.f;
        for (int j = 0; j < per; j++) s += qv[j] * h2f_bits(kp[lane + 32 * j]);
        for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
        float mn = fmaxf(m, s);
        float a = expf(m - mn);
        float w = round_f16(expf(s - mn));
        l = l * a + w;
        const u16* vp = vc + (long long)p * kvd + kvh * hd;
        for (int j = 0; j < per; j++) o[j] = o[j] * a + w * h2f_bits(vp[lane + 32 * j]);
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    for (int j = 0; j < per; j++) sm_o[warp * hd + lane + 32 * j] = o[j];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < warps; w++) mx = fmaxf(mx, sm_m[w]);
    float L = 0.f;
    for (int w = 0; w < warps; w++) L += sm_l[w] * expf(sm_m[w] - mx);
    float* dst = out + ((long long)t * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int w = 0; w < warps; w++) acc += sm_o[w * hd + d] * expf(sm_m[w] - mx);
        dst[d] = acc / L;
    }
}

// ---- Fused kernels of whole-layer runs: fewer launches per layer (a decode step of a small model
// is bound by the number of kernels in sequence, not by bytes) ----

// One row's dot product over the warp: lane-strided 32-value sub-blocks; with GLU the input is
// silu(x) * u, computed as it is read (the down projection after gate and up).
template <int T, int GLU>
__device__ __forceinline__ float row_dot(const u8* row, const float* x, const float* u, int cols, int lane) {
    int nsub = (cols + 31) >> 5;
    float acc = 0.f;
    for (int s = lane; s < nsub; s += 32) {
        int left = cols - 32 * s;
        if (GLU) {
            float xs[32];
            for (int j = 0; j < 32; j++) {
                float g = j < left ? x[32 * s + j] : 0.f;
                float v = j < left ? u[32 * s + j] : 0.f;
                xs[j] = g / (1.0f + expf(-g)) * v;
            }
            acc += sub_dot<T>(row, s, xs, left);
        } else {
            acc += sub_dot<T>(row, s, x + 32 * s, left);
        }
    }
    return acc;
}

template <int GLU>
__device__ float row_dot_any(int ty, const u8* row, const float* x, const float* u, int cols, int lane) {
    switch (ty) {
        case T_F32: return row_dot<T_F32, GLU>(row, x, u, cols, lane);
        case T_F16: return row_dot<T_F16, GLU>(row, x, u, cols, lane);
        case T_BF16: return row_dot<T_BF16, GLU>(row, x, u, cols, lane);
        case T_Q4_0: return row_dot<T_Q4_0, GLU>(row, x, u, cols, lane);
        case T_Q4_1: return row_dot<T_Q4_1, GLU>(row, x, u, cols, lane);
        case T_Q5_0: return row_dot<T_Q5_0, GLU>(row, x, u, cols, lane);
        case T_Q8_0: return row_dot<T_Q8_0, GLU>(row, x, u, cols, lane);
        case T_Q4_K: return row_dot<T_Q4_K, GLU>(row, x, u, cols, lane);
        case T_Q5_K: return row_dot<T_Q5_K, GLU>(row, x, u, cols, lane);
        default: return row_dot<T_Q6_K, GLU>(row, x, u, cols, lane);
    }
}

#define MULTI_TOKENS 8

// Up to three matrices (each its own type) over one input, in one launch: q, k, v, or gate and
// up, or down alone with glu (input silu(x) * u). The grid's warps take matrix 0's rows, then
// 1's, then 2's; y_m[t * rows_m + r] = W_m[r] . input[t].
extern "C" __global__ void matvec_multi(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2,
                                        int r0, int r1, int r2, int t0, int t1, int t2, long long rb0,
                                        long long rb1, long long rb2, const float* x, const float* u, int cols,
                                        int n_tok, int glu) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = blockIdx.x * WARPS_PER_BLOCK + warp;
    const u8* w;
    float* y;
    int ty, rows;
    long long rb;
    if (r < r0) {
        w = w0; y = y0; ty = t0; rows = r0; rb = rb0;
    } else if (r < r0 + r1) {
        r -= r0; w = w1; y = y1; ty = t1; rows = r1; rb = rb1;
    } else if (r < r0 + r1 + r2) {
        r -= r0 + r1; w = w2; y = y2; ty = t2; rows = r2; rb = rb2;
    } else {
        return;  // the whole warp leaves together
    }
    const u8* row = w + (long long)r * rb;
    // A block takes MULTI_TOKENS tokens in turn: the row's bytes come from L1 after the first.
    for (int t0 = blockIdx.y * MULTI_TOKENS; t0 < n_tok; t0 += gridDim.y * MULTI_TOKENS) {
        int t1 = min(t0 + MULTI_TOKENS, n_tok);
        for (int t = t0; t < t1; t++) {
            const float* xt = x + (long long)t * cols;
            float acc = glu ? row_dot_any<1>(ty, row, xt, u + (long long)t * cols, cols, lane)
                            : row_dot_any<0>(ty, row, xt, xt, cols, lane);
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) y[(long long)t * rows + r] = acc;
        }
    }
}

// One block per row: with `add`, x += o first (the residual of the op before); then
// out = x / sqrt(mean(x^2) + eps) * w.
extern "C" __global__ void add_norm(float* x, const float* o, const float* w, float* out, int e, float eps, int add) {
    float* xr = x + (long long)blockIdx.x * e;
    const float* orow = o + (long long)blockIdx.x * e;
    float* dst = out + (long long)blockIdx.x * e;
    float ss = 0.f;
    for (int i = threadIdx.x; i < e; i += blockDim.x) {
        float v = xr[i];
        if (add) {
            v += orow[i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss);
    float scale = 1.0f / sqrtf(ss / (float)e + eps);
    for (int i = threadIdx.x; i < e; i += blockDim.x) dst[i] = xr[i] * scale * w[i];
}

// After the q, k, v products of n_tok tokens: biases (null when the model has none), RoPE on q
// and k, and k and v into the f16 cache at positions *pos... One thread per (token, head) over
// the n_head query heads, then the n_head_kv key heads, then the n_head_kv value heads.
extern "C" __global__ void qkv_finish(float* q, float* k, const float* v, const float* bq, const float* bk,
                                      const float* bv, u16* kc, u16* vc, int n_tok, int n_head, int n_head_kv, int hd,
                                      int rope_dim, const int* pos, float theta_scale, int neox) {
    int pos0 = *pos;
    int per = n_head + 2 * n_head_kv;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tok * per) return;
    int t = idx / per, hh = idx % per;
    int kvd = n_head_kv * hd;
    if (hh < n_head + n_head_kv) {
        bool is_q = hh < n_head;
        int h = is_q ? hh : hh - n_head;
        float* x = is_q ? q + ((long long)t * n_head + h) * hd : k + ((long long)t * n_head_kv + h) * hd;
        const float* b = is_q ? bq : bk;
        if (b) {
            for (int i = 0; i < hd; i++) x[i] += b[h * hd + i];
        }
        int half = rope_dim / 2;
        float theta = (float)(pos0 + t);
        for (int i = 0; i < half; i++) {
            float s, c;
            sincosf(theta, &s, &c);
            int a = neox ? i : 2 * i;
            int bb = neox ? i + half : 2 * i + 1;
            float x0 = x[a], x1 = x[bb];
            x[a] = x0 * c - x1 * s;
            x[bb] = x0 * s + x1 * c;
            theta *= theta_scale;
        }
        if (!is_q) {
            u16* dst = kc + (long long)(pos0 + t) * kvd + h * hd;
            for (int i = 0; i < hd; i++) {
                u16 hv;
                asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hv) : "f"(x[i]));
                dst[i] = hv;
            }
        }
    } else {
        int h = hh - n_head - n_head_kv;
        const float* x = v + ((long long)t * n_head_kv + h) * hd;
        u16* dst = vc + (long long)(pos0 + t) * kvd + h * hd;
        for (int i = 0; i < hd; i++) {
            float val = x[i] + (bv ? bv[h * hd + i] : 0.f);
            u16 hv;
            asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hv) : "f"(val));
            dst[i] = hv;
        }
    }
}

// The hybrid tier's sparse columns (issue 20): y[k] += sum_i coef[i] * C[idx[i]][k], where
// column c of the pool is `col_bytes` bytes of Q8_0 blocks along the output (34 bytes per 32
// values: an f16 scale, 32 int8), at `pool + c * col_bytes`. A thread per output value; the
// active list is cut into chunks of COL_CHUNK (blockIdx.y), each chunk's sum added atomically,
// so y must start at zero (or hold what to add to).
#define COL_CHUNK 64
extern "C" __global__ void axpy_cols_q8(const u8* pool, long long col_bytes, const int* idx, const float* coef,
                                        int n_active, float* y, int n_out) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n_out) return;
    int i0 = blockIdx.y * COL_CHUNK;
    int i1 = min(i0 + COL_CHUNK, n_active);
    const long long blk = (long long)(k >> 5) * 34;
    const int lane = k & 31;
    float acc = 0.f;
    for (int i = i0; i < i1; i++) {
        const u8* b = pool + (long long)idx[i] * col_bytes + blk;
        acc += coef[i] * h2f(b) * (float)((const i8*)b)[2 + lane];
    }
    if (i1 > i0) atomicAdd(y + k, acc);
}
