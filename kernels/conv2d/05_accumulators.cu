// Day 05 - accumulators: float vs double vs compensated (Kahan) float accumulation.
//
// What changed since day 04 (b): nothing in the data movement. This is the strided tile+halo
// kernel with the running sum `acc` replaced by an `Accum` whose flavour ACCUM_MODE picks at
// compile time, so one file yields three kernels that differ only in how they add:
//   ACCUM_FLOAT   acc = fma(x, w, acc) in fp32, as on days 01-04 (bitwise the same output as
//                 shared_halo_strided). Error grows like n * 2^-24 in the worst case.
//   ACCUM_DOUBLE  the products and the sum in fp64 (a fp32 x fp32 product is exact in fp64),
//                 rounded to fp32 once at the end. Nearly correctly rounded, but fp64 runs at
//                 1/32 to 1/64 of the fp32 rate on GeForce parts (1/2 on A100, H100, H200).
//   ACCUM_KAHAN   compensated summation in fp32: a second float `comp` carries the low-order bits
//                 each addition rounded away and feeds them into the next term. The error bound
//                 is about 2 * 2^-24 per term plus O(n * 2^-48) (Higham, "Accuracy and Stability
//                 of Numerical Algorithms", 4.3) instead of n * 2^-24, for 4 flops per tap
//                 instead of 1. The compensation steps use the _rn intrinsics, which the
//                 compiler neither fuses into an FMA nor reassociates: (t - sum) - y is 0 in
//                 exact arithmetic, and algebra that "simplified" it would silently turn this
//                 back into plain float summation (SASS for sm_90: 3 FADD + 1 FFMA per tap).
//                 Do not build with -use_fast_math.
//
// Mapping, launch and shared memory: exactly day 04 (b) (04_shared_halo_strided.cu):
//   q = blockIdx.x * TILE + tx, p = tile * TILE + ty (tile = blockIdx.y, step gridDim.y),
//   nk = blockIdx.z, step gridDim.z;  block (TILE, TILE, 1),
//   grid (ceil(Q / TILE), min(ceil(P / TILE), 65535), min(N*K, 65535)),
//   dynamic shared memory (TILE + R - 1) * (TILE + S - 1) * 4 bytes.
//
// Compile-time parameters:
//   ACCUM_MODE  required: ACCUM_FLOAT, ACCUM_DOUBLE or ACCUM_KAHAN (e.g. -DACCUM_MODE=ACCUM_KAHAN)
//   TILE        the output tile's side (default 16; TILE*TILE <= 1024)
//
// Assumes: NCHW fp32, stride 1, dilation 1, groups 1, odd R and S, "same" padding
// (P = H, Q = W). The harness refuses anything else.
#include "conv2d_common.cuh"

#define ACCUM_FLOAT 1
#define ACCUM_DOUBLE 2
#define ACCUM_KAHAN 3

#ifndef ACCUM_MODE
#error "define ACCUM_MODE as ACCUM_FLOAT, ACCUM_DOUBLE or ACCUM_KAHAN, e.g. -DACCUM_MODE=ACCUM_KAHAN"
#endif
#ifndef TILE
#define TILE 16
#endif
static_assert(TILE >= 1 && TILE * TILE <= 1024, "TILE x TILE threads must fit a block (TILE <= 32)");

#if ACCUM_MODE == ACCUM_FLOAT
struct Accum {
    float sum = 0.0f;
    __device__ void add(float a, float b) { sum += a * b; }  // contracted to one FFMA
    __device__ float result() const { return sum; }
};
#elif ACCUM_MODE == ACCUM_DOUBLE
struct Accum {
    double sum = 0.0;
    __device__ void add(float a, float b) { sum += (double)a * (double)b; }  // one DFMA
    __device__ float result() const { return (float)sum; }  // the only rounding to fp32
};
#elif ACCUM_MODE == ACCUM_KAHAN
struct Accum {
    float sum = 0.0f;
    float comp = 0.0f;  // rounding error of the last addition (computed minus exact): exact ~ sum - comp
    __device__ void add(float a, float b) {
        const float yv = __fmaf_rn(a, b, -comp);  // the new term, corrected; one rounding
        const float t = __fadd_rn(sum, yv);       // big + small: low bits of yv are lost ...
        comp = __fsub_rn(__fsub_rn(t, sum), yv);  // ... and recovered here: (t - sum) - yv
        sum = t;
    }
    __device__ float result() const { return __fsub_rn(sum, comp); }  // apply the last correction
};
#else
#error "ACCUM_MODE must be ACCUM_FLOAT, ACCUM_DOUBLE or ACCUM_KAHAN"
#endif

extern "C" __global__ void __launch_bounds__(TILE * TILE)
conv2d_accumulators(const float* __restrict__ x,
                    const float* __restrict__ w,
                    float* __restrict__ y,
                    int N, int C, int H, int W, int K, int R, int S) {
    extern __shared__ float xs[];  // [TILE + R - 1][TILE + S - 1], row pitch XS_W

    const int pad_h = (R - 1) / 2, pad_w = (S - 1) / 2;
    const int XS_H = TILE + R - 1, XS_W = TILE + S - 1;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int q0 = blockIdx.x * TILE, q = q0 + tx;
    const int tiles_y = CEIL_DIV(H, TILE);

    const idx_t NK = (idx_t)N * K;
    for (idx_t nk = blockIdx.z; nk < NK; nk += gridDim.z) {
        const int n = (int)(nk / K), k = (int)(nk % K);
        const float* wk = w + (idx_t)k * C * R * S;  // the block's filter
        for (int ty0 = blockIdx.y; ty0 < tiles_y; ty0 += gridDim.y) {
            const int p0 = ty0 * TILE, p = p0 + ty;
            Accum acc;
            for (int c = 0; c < C; ++c) {
                const float* xc = x + ((idx_t)n * C + c) * H * W;
                const float* wkc = wk + (idx_t)c * R * S;

                for (int i = ty; i < XS_H; i += TILE) {  // cooperative, strided load of the window
                    const int h = p0 - pad_h + i;
                    for (int j = tx; j < XS_W; j += TILE) {
                        const int ww = q0 - pad_w + j;
                        const bool inside = h >= 0 && h < H && ww >= 0 && ww < W;
                        xs[i * XS_W + j] = inside ? xc[(idx_t)h * W + ww] : 0.0f;
                    }
                }
                __syncthreads();  // tile and halo are complete

                const float* win = xs + ty * XS_W + tx;  // this output's window, top-left
                for (int r = 0; r < R; ++r)
                    for (int s = 0; s < S; ++s) acc.add(win[r * XS_W + s], wkc[r * S + s]);
                __syncthreads();  // everyone is done with xs before the next c overwrites it
            }
            if (p < H && q < W) y[(nk * H + p) * W + q] = acc.result();
        }
    }
}
