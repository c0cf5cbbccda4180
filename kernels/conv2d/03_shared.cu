// Day 03 - shared: the block's input tile staged in shared memory.
//
// What changed since day 02: the threads of a block cover a TILE x TILE square of outputs
// instead of a BX x BY strip, and for each input channel c they first copy the matching
// TILE x TILE square of x[n][c] into shared memory (one element per thread), wait at a
// barrier, then read their taps from there. A tap that falls outside the square (the "halo",
// the R-1 rows and S-1 columns the filter reaches past the tile's edge) is still read from
// global memory: a branch per tap. Day 04 stages the halo too.
//
// The lesson: for a 3x3 filter the L1/L2 caches already serve most of day 02's repeated reads,
// so this tile saves little, while it adds two barriers per channel and a divergent branch on
// every tap near the tile's edge. It is correct, not necessarily faster.
//
// Mapping (see conv2d_common.cuh), thread (tx, ty) of the block owns one output pixel:
//   q  = blockIdx.x * TILE + tx                                            output column
//   p  = tile * TILE + ty, tile = blockIdx.y, step gridDim.y, over ceil(P / TILE) row tiles
//   nk = blockIdx.z, step gridDim.z, over N*K:  n = nk / K, k = nk % K
// Both loops are uniform across the block (every thread runs the same iterations), so every
// thread reaches every barrier; threads whose pixel is outside the image load a 0, compute,
// and skip only the final store.
// Launch: block (TILE, TILE, 1),
//         grid (ceil(Q / TILE), min(ceil(P / TILE), 65535), min(N*K, 65535)),
//         static shared memory TILE*TILE*4 bytes (1 KB at TILE = 16), no dynamic shared memory.
//
// Compile-time parameters: TILE (default 16; TILE*TILE <= 1024 threads).
//
// Assumes: NCHW fp32, stride 1, dilation 1, groups 1, odd R and S, "same" padding
// (pad_h = (R-1)/2, pad_w = (S-1)/2, so P = H and Q = W). Any filter size works (taps past the
// tile go to global memory). The harness refuses anything else.
#include "conv2d_common.cuh"

#ifndef TILE
#define TILE 16
#endif
static_assert(TILE >= 1 && TILE * TILE <= 1024, "TILE x TILE threads must fit a block (TILE <= 32)");

extern "C" __global__ void __launch_bounds__(TILE * TILE)
conv2d_shared(const float* __restrict__ x,
              const float* __restrict__ w,
              float* __restrict__ y,
              int N, int C, int H, int W, int K, int R, int S) {
    __shared__ float tile[TILE][TILE];  // x[n][c][p0 .. p0+TILE)[q0 .. q0+TILE), 0 outside the image

    const int pad_h = (R - 1) / 2, pad_w = (S - 1) / 2;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int q = blockIdx.x * TILE + tx;
    const int tiles_y = CEIL_DIV(H, TILE);
    const bool in_image_q = q < W;

    const idx_t NK = (idx_t)N * K;
    for (idx_t nk = blockIdx.z; nk < NK; nk += gridDim.z) {
        const int n = (int)(nk / K), k = (int)(nk % K);
        const float* wk = w + (idx_t)k * C * R * S;  // the block's filter
        for (int ty0 = blockIdx.y; ty0 < tiles_y; ty0 += gridDim.y) {
            const int p = ty0 * TILE + ty;
            const bool in_image = in_image_q && p < H;
            float acc = 0.0f;
            for (int c = 0; c < C; ++c) {
                const float* xc = x + ((idx_t)n * C + c) * H * W;
                const float* wkc = wk + (idx_t)c * R * S;

                tile[ty][tx] = in_image ? xc[(idx_t)p * W + q] : 0.0f;
                __syncthreads();  // the tile is complete

                for (int r = 0; r < R; ++r) {
                    const int tr = ty - pad_h + r;  // row of the tap inside the tile
                    const int h = p - pad_h + r;    // ... and inside the image
                    for (int s = 0; s < S; ++s) {
                        const int tc = tx - pad_w + s;
                        const int ww = q - pad_w + s;
                        float v;
                        if (tr >= 0 && tr < TILE && tc >= 0 && tc < TILE) {
                            v = tile[tr][tc];  // inside the tile: shared memory
                        } else if (h >= 0 && h < H && ww >= 0 && ww < W) {
                            v = xc[(idx_t)h * W + ww];  // halo: global memory
                        } else {
                            v = 0.0f;  // zero padding
                        }
                        acc += v * wkc[r * S + s];
                    }
                }
                __syncthreads();  // everyone is done with the tile before the next c overwrites it
            }
            if (in_image) y[(nk * H + p) * W + q] = acc;
        }
    }
}
