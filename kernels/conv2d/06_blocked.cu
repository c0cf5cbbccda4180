// Day 06 - blocked: register blocking over output pixels and output channels.
//
// What changed since days 02-05: each thread now computes a PT x KT micro-tile of outputs
// (PT output rows of one column, KT output channels) instead of one value. Every input value
// a thread loads from shared memory is used for KT channels, and every weight for PT rows,
// so the ratio of FMAs to shared-memory loads grows from ~1 to ~PT*KT/(PT+KT). The filter
// size is a template parameter, so the tap loops unroll completely and the column of inputs
// a thread needs stays in registers, reused across the R filter rows.
//
// The BY thread rows of a block split into KG groups along K and RG = BY / KG groups along P:
// threadIdx.y = ky * RG + ry. Many output channels per block (KG > 1) means each staged input
// value serves KG*KT channels; that is what 1x1 and many-channel layers need.
//
// Block tile: TQ = 32 output columns x TP = RG*PT output rows x TK = KG*KT output channels.
//   Per chunk of CC input channels the block stages in shared memory
//     sx[CC][TP + R - 1][TQ + S - 1]   the input tile plus its halo (zero outside the image)
//     sw[CC][R][S][TK]                 the TK filters' taps, channel-fastest, so a thread reads
//                                      its KT weights of one tap with KT/4 float4 loads (a
//                                      broadcast: the whole warp reads the same address)
//   then each thread accumulates acc[PT][KT] in registers.
//
// Mapping (see conv2d_common.cuh):
//   q  = blockIdx.x * 32 + threadIdx.x                       one output column per thread
//   p  = p0 + ry * PT + i, i < PT                            PT consecutive output rows
//        p0 = blockIdx.y * TP, step gridDim.y * TP
//   k  = k0 + ky * KT + j, j < KT                            KT output channels
//   nk = blockIdx.z, step gridDim.z, over N * ceil(K / TK):  n = nk / k_tiles, k0 = (nk % k_tiles) * TK
// Launch: block (32, BY, 1); grid (ceil(Q/32), min(ceil(P/TP), 65535), min(N*ceil(K/TK), 65535));
//   dynamic shared memory 4 * CC * ((TP+R-1)*(TQ+S-1) + R*S*TK) bytes (up to 52 KB for 9x9:
//   above 48 KB the harness opts in).
//
// Compile-time parameters (-D, defaults below): BY (thread rows), PT (rows per thread),
// C_STAGE (input channels per shared-memory stage, the template parameter CC; default 32 for
// 1x1, 8 for 3x3, 4 above), LOAD_UNROLL (3),
// MINB (blocks per SM asked of __launch_bounds__; default 2 up to 3x3, 1 above, which keeps
// every architecture free of spills). R = S, KT, KG and CC are template parameters; the
// entry points below instantiate R = S in {1, 3, 5, 7, 9} with (KT, KG) in {(1,1), (4,1),
// (8,1), (8,4)}.
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
// Input channels per shared-memory stage: many for small filters (more loads in flight per
// barrier), few for large ones (shared memory). -DC_STAGE=n forces one value for every filter.
#ifdef C_STAGE
#define CC_FOR(R) C_STAGE
#else
#define CC_FOR(R) ((R) == 1 ? 32 : (R) == 3 ? 8 : 4)
#endif
// Minimum resident blocks per SM for __launch_bounds__: 2 caps registers at 128, which 5x5 and
// larger filters exceed on some architectures (spills); -DMINB=n forces one value.
#ifdef MINB
#define MINB_FOR(R) MINB
#else
#define MINB_FOR(R) ((R) >= 5 ? 1 : 2)
#endif
// Unrolling of the tile-loading loops: more loads in flight per thread, more registers. On the
// H200 (seed suite) 3 beat 1, 2 and 4; 4 spills on the 3x3 kernels.
#ifndef LOAD_UNROLL
#define LOAD_UNROLL 3
#endif
constexpr int kLoadUnroll = LOAD_UNROLL;  // #pragma unroll takes a constant, not a macro
#define TQ 32

template <int R, int S, int KT, int KG, int CC>
__device__ __forceinline__ void conv2d_blocked(const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               float* __restrict__ y,
                                               int N, int C, int H, int W, int K) {
    static_assert(BY % KG == 0, "KG must divide BY");
    constexpr int RG = BY / KG, TP = RG * PT, TK = KG * KT;
    constexpr int XH = TP + R - 1, XW = TQ + S - 1;  // input tile with halo
    constexpr int XTILE = CC * XH * XW, WTILE = CC * R * S * TK;
    extern __shared__ __align__(16) float smem[];
    float* sx = smem;          // [CC][XH][XW]
    float* sw = smem + XTILE;  // [CC][R][S][TK]
    static_assert(XTILE % 4 == 0, "sw must start 16-byte aligned for its float4 loads");
    const int pad_h = (R - 1) / 2, pad_w = (S - 1) / 2;
    const int P = H, Q = W;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int ry = ty % RG, ky = ty / RG;
    const int tid = ty * TQ + tx, nthreads = TQ * BY;
    const int q0 = blockIdx.x * TQ;
    const int k_tiles = CEIL_DIV(K, TK);
    const idx_t NKT = (idx_t)N * k_tiles;

    for (idx_t nk = blockIdx.z; nk < NKT; nk += gridDim.z) {
        const int n = (int)(nk / k_tiles), k0 = (int)(nk % k_tiles) * TK;
        for (int p0 = blockIdx.y * TP; p0 < P; p0 += gridDim.y * TP) {
            float acc[PT][KT];
#pragma unroll
            for (int i = 0; i < PT; ++i)
#pragma unroll
                for (int j = 0; j < KT; ++j) acc[i][j] = 0.0f;

            for (int c0 = 0; c0 < C; c0 += CC) {
                __syncthreads();  // the previous stage's tiles are no longer read
                // Input tile + halo, coalesced along the row; zero outside the image and past C.
#pragma unroll kLoadUnroll
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
#pragma unroll kLoadUnroll
                for (int i = tid; i < WTILE; i += nthreads) {
                    const int j = i / (CC * R * S), rem = i % (CC * R * S);
                    const int k = k0 + j, c = c0 + rem / (R * S);
                    float v = 0.0f;
                    if (k < K && c < C) v = w[((idx_t)k * C + c0) * (R * S) + rem];
                    sw[rem * TK + j] = v;
                }
                __syncthreads();

                const int cc_n = min(CC, C - c0);  // the last stage may hold fewer channels
#pragma unroll 1
                for (int cl = 0; cl < cc_n; ++cl) {
                    const float* sxc = sx + cl * XH * XW + (ry * PT) * XW + tx;
                    const float* swc = sw + cl * R * S * TK + ky * KT;
#pragma unroll
                    for (int s = 0; s < S; ++s) {
                        float col[PT + R - 1];  // the input column this thread needs at tap s
#pragma unroll
                        for (int i = 0; i < PT + R - 1; ++i) col[i] = sxc[i * XW + s];
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            float wk[KT];
                            const float* wp = swc + (r * S + s) * TK;
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
                    const int p = p0 + ry * PT + i;
#pragma unroll
                    for (int j = 0; j < KT; ++j) {
                        const int k = k0 + ky * KT + j;
                        if (p < P && k < K) y[(((idx_t)n * K + k) * P + p) * Q + q] = acc[i][j];
                    }
                }
            }
        }
    }
}

#define BLOCKED_ENTRY(R, KT, KG)                                                                  \
    extern "C" __global__ void __launch_bounds__(TQ * BY, MINB_FOR(R))                             \
        conv2d_blocked_r##R##_k##KT##_g##KG(const float* __restrict__ x, const float* __restrict__ w, \
                                            float* __restrict__ y, int N, int C, int H, int W, int K) { \
        conv2d_blocked<R, R, KT, KG, CC_FOR(R)>(x, w, y, N, C, H, W, K);                             \
    }
#define BLOCKED_ENTRIES(R) BLOCKED_ENTRY(R, 1, 1) BLOCKED_ENTRY(R, 4, 1) BLOCKED_ENTRY(R, 8, 1) BLOCKED_ENTRY(R, 8, 4)

BLOCKED_ENTRIES(1)
BLOCKED_ENTRIES(3)
BLOCKED_ENTRIES(5)
BLOCKED_ENTRIES(7)
BLOCKED_ENTRIES(9)
