// Day 06 - blocked: register blocking over output pixels and output channels.
//
// What changed since days 02-05: each thread now computes a PT x KT micro-tile of outputs
// (PT output rows of one column, KT output channels) instead of one value. Every input value
// a thread loads from shared memory is used for KT channels, and every weight for PT rows,
// so the ratio of FMAs to shared-memory loads grows from ~1 to ~PT*KT/(PT+KT). The filter
// size is a template parameter, so the tap loops unroll completely and the column of inputs
// a thread needs stays in registers, reused across the R filter rows.
//
// Block tile: TQ = 32 output columns x TP = BY*PT output rows x KT output channels of one image.
//   Per chunk of CC input channels the block stages in shared memory
//     sx[CC][TP + R - 1][TQ + S - 1]   the input tile plus its halo (zero outside the image)
//     sw[CC][R][S][KT]                 the KT filters' taps, KT-fastest so a thread reads all KT
//                                      weights of one tap with KT/4 float4 loads (a broadcast:
//                                      every thread of the block reads the same address)
//   then each thread accumulates acc[PT][KT] in registers.
//
// Mapping (see conv2d_common.cuh):
//   q  = blockIdx.x * 32 + threadIdx.x                       one output column per thread
//   p  = p0 + threadIdx.y * PT + i, i < PT                   PT consecutive output rows
//        p0 = tile_y * TP, tile_y = blockIdx.y, step gridDim.y
//   nk = blockIdx.z, step gridDim.z, over N * ceil(K / KT):  n = nk / KT_TILES, k0 = (nk % KT_TILES) * KT
// Launch: block (32, BY, 1); grid (ceil(Q/32), min(ceil(P/TP), 65535), min(N*ceil(K/KT), 65535));
//   dynamic shared memory 4 * CC * ((TP+R-1)*(TQ+S-1) + R*S*KT) bytes.
//
// Compile-time parameters (-D, defaults below): BY (thread rows), PT (rows per thread),
// CC (input channels per shared-memory stage). R = S and KT are template parameters; the
// entry points below instantiate R = S in {1, 3, 5, 7, 9} and KT in {1, 4, 8}.
//
// Assumes: NCHW fp32, stride 1, dilation 1, groups 1, square odd filter, "same" padding
// (P = H, Q = W). Threads past the image edge still load and reach every barrier; only their
// stores are skipped.
#include "conv2d_common.cuh"

#ifndef BY
#define BY 8
#endif
#ifndef PT
#define PT 4
#endif
#ifndef CC
#define CC 4
#endif
#define TQ 32
#define TP (BY * PT)

template <int R, int S, int KT>
__device__ __forceinline__ void conv2d_blocked(const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               float* __restrict__ y,
                                               int N, int C, int H, int W, int K) {
    constexpr int XH = TP + R - 1, XW = TQ + S - 1;  // input tile with halo
    constexpr int XTILE = CC * XH * XW, WTILE = CC * R * S * KT;
    extern __shared__ __align__(16) float smem[];
    float* sx = smem;          // [CC][XH][XW]
    float* sw = smem + XTILE;  // [CC][R][S][KT]
    static_assert(XTILE % 4 == 0, "sw must start 16-byte aligned for its float4 loads");
    const int pad_h = (R - 1) / 2, pad_w = (S - 1) / 2;
    const int P = H, Q = W;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * TQ + tx, nthreads = TQ * BY;
    const int q0 = blockIdx.x * TQ;
    const int k_tiles = CEIL_DIV(K, KT);
    const idx_t NKT = (idx_t)N * k_tiles;

    for (idx_t nk = blockIdx.z; nk < NKT; nk += gridDim.z) {
        const int n = (int)(nk / k_tiles), k0 = (int)(nk % k_tiles) * KT;
        for (int p0 = blockIdx.y * TP; p0 < P; p0 += gridDim.y * TP) {
            float acc[PT][KT];
#pragma unroll
            for (int i = 0; i < PT; ++i)
#pragma unroll
                for (int j = 0; j < KT; ++j) acc[i][j] = 0.0f;

            for (int c0 = 0; c0 < C; c0 += CC) {
                __syncthreads();  // the previous stage's tiles are no longer read
                // Input tile + halo, coalesced along the row; zero outside the image and past C.
                for (int i = tid; i < XTILE; i += nthreads) {
                    const int cl = i / (XH * XW), rem = i % (XH * XW);
                    const int h = p0 - pad_h + rem / XW, ww = q0 - pad_w + rem % XW;
                    const int c = c0 + cl;
                    float v = 0.0f;
                    if (c < C && h >= 0 && h < H && ww >= 0 && ww < W)
                        v = x[(((idx_t)n * C + c) * H + h) * W + ww];
                    sx[i] = v;
                }
                // Filter taps: w[k0+j][c0..c0+CC)[r][s] is contiguous, so read it in order and
                // transpose into sw[cl][r][s][j].
                for (int i = tid; i < WTILE; i += nthreads) {
                    const int j = i / (CC * R * S), rem = i % (CC * R * S);
                    const int k = k0 + j, c = c0 + rem / (R * S);
                    float v = 0.0f;
                    if (k < K && c < C) v = w[((idx_t)k * C + c0) * (R * S) + rem];
                    sw[rem * KT + j] = v;
                }
                __syncthreads();

#pragma unroll 1
                for (int cl = 0; cl < CC; ++cl) {
                    const float* sxc = sx + cl * XH * XW + (ty * PT) * XW + tx;
                    const float* swc = sw + cl * R * S * KT;
#pragma unroll
                    for (int s = 0; s < S; ++s) {
                        float col[PT + R - 1];  // the input column this thread needs at tap s
#pragma unroll
                        for (int i = 0; i < PT + R - 1; ++i) col[i] = sxc[i * XW + s];
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            float wk[KT];
                            const float* wp = swc + (r * S + s) * KT;
                            if constexpr (KT % 4 == 0) {
#pragma unroll
                                for (int j = 0; j < KT; j += 4) {
                                    const float4 v4 = *reinterpret_cast<const float4*>(wp + j);
                                    wk[j] = v4.x; wk[j + 1] = v4.y; wk[j + 2] = v4.z; wk[j + 3] = v4.w;
                                }
                            } else {
#pragma unroll
                                for (int j = 0; j < KT; ++j) wk[j] = wp[j];
                            }
#pragma unroll
                            for (int i = 0; i < PT; ++i)
#pragma unroll
                                for (int j = 0; j < KT; ++j) acc[i][j] = fmaf(col[i + r], wk[j], acc[i][j]);
                        }
                    }
                }
            }

            const int q = q0 + tx;
            if (q < Q) {
#pragma unroll
                for (int i = 0; i < PT; ++i) {
                    const int p = p0 + ty * PT + i;
#pragma unroll
                    for (int j = 0; j < KT; ++j)
                        if (p < P && k0 + j < K) y[(((idx_t)n * K + k0 + j) * P + p) * Q + q] = acc[i][j];
                }
            }
        }
    }
}

#define BLOCKED_ENTRY(R, KT)                                                                   \
    extern "C" __global__ void __launch_bounds__(TQ * BY, 2)                                   \
        conv2d_blocked_r##R##_k##KT(const float* __restrict__ x, const float* __restrict__ w, \
                                    float* __restrict__ y, int N, int C, int H, int W, int K) { \
        conv2d_blocked<R, R, KT>(x, w, y, N, C, H, W, K);                                      \
    }

BLOCKED_ENTRY(1, 1) BLOCKED_ENTRY(1, 4) BLOCKED_ENTRY(1, 8)
BLOCKED_ENTRY(3, 1) BLOCKED_ENTRY(3, 4) BLOCKED_ENTRY(3, 8)
BLOCKED_ENTRY(5, 1) BLOCKED_ENTRY(5, 4) BLOCKED_ENTRY(5, 8)
BLOCKED_ENTRY(7, 1) BLOCKED_ENTRY(7, 4) BLOCKED_ENTRY(7, 8)
BLOCKED_ENTRY(9, 1) BLOCKED_ENTRY(9, 4) BLOCKED_ENTRY(9, 8)
