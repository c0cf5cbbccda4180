// Day 04 (a) - shared_halo_threads: tile plus halo in shared memory, one thread per input pixel.
//
// What changed since day 03: the shared tile now holds everything the block's outputs read,
// the TILE x TILE outputs' own pixels plus the halo around them (pad_h = (R-1)/2 rows above and
// below, pad_w = (S-1)/2 columns left and right), so the inner loop has no branch and no global
// read of x. The block grows to match: one thread per pixel of the (TILE+R-1) x (TILE+S-1)
// input window. Every thread loads its pixel; after the barrier only the TILE x TILE threads in
// the middle compute, and the ring of halo threads idles (for 3x3 and TILE = 16: 324 threads,
// 256 of them compute).
//
// Mapping (see conv2d_common.cuh). Thread (tx, ty) loads input pixel
//   h = tile * TILE - pad_h + ty,   w = blockIdx.x * TILE - pad_w + tx      (0 outside the image)
// into xs[ty][tx]. Because "same" padding makes P = H and Q = W, a computing thread's output
// pixel is the very pixel it loaded: threads with pad_h <= ty < pad_h + TILE and
// pad_w <= tx < pad_w + TILE compute y[n][k][h][w], reading xs[ty - pad_h + r][tx - pad_w + s].
//   tile = blockIdx.y, step gridDim.y, over ceil(P / TILE) row tiles
//   nk   = blockIdx.z, step gridDim.z, over N*K:  n = nk / K, k = nk % K
// Both loops are uniform across the block, and no thread returns early: a thread outside the
// image loads a 0 and still reaches every barrier (a `return` before a __syncthreads() would
// leave the rest of the block waiting on threads that never arrive: undefined behaviour, often
// a hang). Only the final store is guarded.
// Launch: block (TILE + S - 1, TILE + R - 1, 1): its shape depends on the runtime filter size,
//         so the launch config computes it from R, S and the harness refuses filters whose block
//         would exceed 1024 threads (R, S <= 17 for a square filter at TILE = 16);
//         grid (ceil(Q / TILE), min(ceil(P / TILE), 65535), min(N*K, 65535));
//         dynamic shared memory (TILE + R - 1) * (TILE + S - 1) * 4 bytes (1296 B for 3x3).
//
// Compile-time parameters: TILE, the output tile's side (default 16).
//
// Assumes: NCHW fp32, stride 1, dilation 1, groups 1, odd R and S, "same" padding (P = H,
// Q = W); blockDim == (TILE + S - 1, TILE + R - 1, 1). The harness refuses anything else.
#include "conv2d_common.cuh"

#ifndef TILE
#define TILE 16
#endif
static_assert(TILE >= 1 && TILE <= 32, "TILE must be in 1..32 (the block is (TILE+S-1) x (TILE+R-1) threads)");

extern "C" __global__ void __launch_bounds__(1024)
conv2d_shared_halo_threads(const float* __restrict__ x,
                           const float* __restrict__ w,
                           float* __restrict__ y,
                           int N, int C, int H, int W, int K, int R, int S) {
    extern __shared__ float xs[];  // [TILE + R - 1][TILE + S - 1], row pitch XS_W

    const int pad_h = (R - 1) / 2, pad_w = (S - 1) / 2;
    const int XS_W = TILE + S - 1;  // == blockDim.x
    const int tx = threadIdx.x, ty = threadIdx.y;
    const bool computes = ty >= pad_h && ty < pad_h + TILE && tx >= pad_w && tx < pad_w + TILE;
    const int ww = blockIdx.x * TILE - pad_w + tx;  // the input column this thread loads
    const int tiles_y = CEIL_DIV(H, TILE);

    const idx_t NK = (idx_t)N * K;
    for (idx_t nk = blockIdx.z; nk < NK; nk += gridDim.z) {
        const int n = (int)(nk / K), k = (int)(nk % K);
        const float* wk = w + (idx_t)k * C * R * S;  // the block's filter
        for (int ty0 = blockIdx.y; ty0 < tiles_y; ty0 += gridDim.y) {
            const int h = ty0 * TILE - pad_h + ty;  // the input row this thread loads
            const bool in_image = h >= 0 && h < H && ww >= 0 && ww < W;
            float acc = 0.0f;
            for (int c = 0; c < C; ++c) {
                const float* xc = x + ((idx_t)n * C + c) * H * W;
                const float* wkc = wk + (idx_t)c * R * S;

                xs[ty * XS_W + tx] = in_image ? xc[(idx_t)h * W + ww] : 0.0f;
                __syncthreads();  // tile and halo are complete

                if (computes) {
                    const float* win = xs + (ty - pad_h) * XS_W + (tx - pad_w);  // window's top-left
                    for (int r = 0; r < R; ++r)
                        for (int s = 0; s < S; ++s) acc += win[r * XS_W + s] * wkc[r * S + s];
                }
                __syncthreads();  // everyone is done with xs before the next c overwrites it
            }
            // A computing thread's output pixel is its input pixel (h, ww), >= 0 by construction.
            if (computes && in_image) y[(nk * H + h) * W + ww] = acc;
        }
    }
}
