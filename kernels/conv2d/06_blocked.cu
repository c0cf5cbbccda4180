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
//   dynamic shared memory STAGES * 4 * CC * ((TP+R-1)*(TQ+S-1) + R*S*TK) bytes, STAGES = 2 for
//   prefetching entries, else 1 (up to 52 KB for 9x9: above 48 KB the harness opts in).
//
// Prefetch (PF): in the many-channel entries (KG = 4) of 1x1 and 3x3 filters, the next stage's
// global loads go to registers before the current stage is computed, then into the other of
// two shared buffers: load latency hides behind FMAs even with one block per SM. Measured on
// the H200: 0.62x -> 0.91x cuDNN on the 256-channel 3x3 seed problem.
//
// Compile-time parameters (-D, defaults below): BY (thread rows), PT (rows per thread),
// C_STAGE (input channels per stage, the template parameter CC; default 32 for 1x1, 8 for 3x3,
// 4 above, and 8 / 4 when prefetching), LOAD_UNROLL (3), PREFETCH (force PF on/off), MINB
// (blocks per SM asked of __launch_bounds__; default 2 up to 3x3, 1 above and when
// prefetching, which keeps every architecture free of spills). R = S, KT, KG, CC and PF are
// template parameters; the entry points below instantiate R = S in {1, 3, 5, 7, 9} with
// (KT, KG) in {(1,1), (4,1), (8,1), (8,4)}.
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
// Prefetching (double-buffered stages, see below) in the many-channel entries (KG = 4) of
// filters up to 3x3; larger filters' stages would need too many registers. -DPREFETCH=0/1
// forces it off/on for those entries.
#ifdef PREFETCH
#define PF_FOR(R) PREFETCH
#else
#define PF_FOR(R) ((R) <= 3)
#endif
// Input channels per shared-memory stage: many for small filters (more loads in flight per
// barrier), few for large ones (shared memory), and few when a stage is held in registers
// (PF). -DC_STAGE=n forces one value for every entry.
#ifdef C_STAGE
#define CC_FOR(R, PF) C_STAGE
#else
#define CC_FOR(R, PF) ((PF) ? ((R) == 1 ? 8 : 4) : (R) == 1 ? 32 : (R) == 3 ? 8 : 4)
#endif
// Minimum resident blocks per SM for __launch_bounds__: 2 caps registers at 128, which 5x5 and
// larger filters exceed on some architectures (spills); -DMINB=n forces one value.
// Prefetching entries hold a stage in registers too and get 1.
#ifdef MINB
#define MINB_FOR(R, PF) MINB
#else
#define MINB_FOR(R, PF) ((PF) || (R) >= 5 ? 1 : 2)
#endif
// Unrolling of the tile-loading loops: more loads in flight per thread, more registers. On the
// H200 (seed suite) 3 beat 1, 2 and 4; 4 spills on the 3x3 kernels.
#ifndef LOAD_UNROLL
#define LOAD_UNROLL 3
#endif
constexpr int kLoadUnroll = LOAD_UNROLL;  // #pragma unroll takes a constant, not a macro
#define TQ 32

// The block's tile geometry, shared by the helpers below.
template <int R, int S, int KT, int KG, int CC>
struct Tile {
    static_assert(BY % KG == 0, "KG must divide BY");
    static constexpr int RG = BY / KG, TP = RG * PT, TK = KG * KT;
    static constexpr int XH = TP + R - 1, XW = TQ + S - 1;  // input tile with halo
    static constexpr int XTILE = CC * XH * XW, WTILE = CC * R * S * TK;
    static constexpr int NT = TQ * BY;  // threads per block
    static_assert(XTILE % 4 == 0, "sw must start 16-byte aligned for its float4 loads");
};

// Element i of a stage's input tile sx[CC][XH][XW]: x[n][c0 + cl][p0 - pad + row][q0 - pad + col],
// zero outside the image and past C. Consecutive i are consecutive columns: coalesced.
template <class T, int R, int S>
__device__ __forceinline__ float x_tile_value(const float* __restrict__ x, int i, int n, int c0, int p0,
                                              int q0, int C, int H, int W) {
    const int cl = i / (T::XH * T::XW), rem = i % (T::XH * T::XW);
    const int h = p0 - (R - 1) / 2 + rem / T::XW, ww = q0 - (S - 1) / 2 + rem % T::XW;
    const int c = c0 + cl;
    if (c < C && h >= 0 && h < H && ww >= 0 && ww < W) return x[(((idx_t)n * C + c) * H + h) * W + ww];
    return 0.0f;
}

// Element i of a stage's filter taps, read in memory order (w[k0+j][c0..c0+CC)[r][s] is
// contiguous) and stored transposed at sw[cl][r][s][j]: *dst gets that index.
template <class T, int R, int S>
__device__ __forceinline__ float w_tile_value(const float* __restrict__ w, int i, int k0, int c0, int C,
                                              int K, int* dst) {
    constexpr int CRS = T::WTILE / T::TK;  // CC * R * S
    const int j = i / CRS, rem = i % CRS;
    *dst = rem * T::TK + j;
    if (k0 + j < K && c0 + rem / (R * S) < C) return w[((idx_t)(k0 + j) * C + c0) * (R * S) + rem];
    return 0.0f;
}

// The inner loops: cc_n channels of the staged tiles into this thread's PT x KT accumulators.
template <class T, int R, int S, int KT>
__device__ __forceinline__ void compute_stage(const float* sx, const float* sw, float (&acc)[PT][KT],
                                              int cc_n, int ry, int ky, int tx) {
#pragma unroll 1
    for (int cl = 0; cl < cc_n; ++cl) {
        const float* sxc = sx + cl * T::XH * T::XW + (ry * PT) * T::XW + tx;
        const float* swc = sw + cl * R * S * T::TK + ky * KT;
#pragma unroll
        for (int s = 0; s < S; ++s) {
            float col[PT + R - 1];  // the input column this thread needs at tap s
#pragma unroll
            for (int i = 0; i < PT + R - 1; ++i) col[i] = sxc[i * T::XW + s];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float wk[KT];
                const float* wp = swc + (r * S + s) * T::TK;
                if constexpr (KT % 4 == 0) {
#pragma unroll
                    for (int j = 0; j < KT; j += 4) {  // a float4 broadcast: the warp reads one address
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

template <int R, int S, int KT, int KG, int CC, bool PF>
__device__ __forceinline__ void conv2d_blocked(const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               float* __restrict__ y,
                                               int N, int C, int H, int W, int K) {
    using T = Tile<R, S, KT, KG, CC>;
    extern __shared__ __align__(16) float smem[];  // PF: two buffers, else one
    const int P = H, Q = W;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int ry = ty % T::RG, ky = ty / T::RG;
    const int tid = ty * TQ + tx;
    const int q0 = blockIdx.x * TQ;
    const int k_tiles = CEIL_DIV(K, T::TK);
    const idx_t NKT = (idx_t)N * k_tiles;

    for (idx_t nk = blockIdx.z; nk < NKT; nk += gridDim.z) {
        const int n = (int)(nk / k_tiles), k0 = (int)(nk % k_tiles) * T::TK;
        for (int p0 = blockIdx.y * T::TP; p0 < P; p0 += gridDim.y * T::TP) {
            float acc[PT][KT];
#pragma unroll
            for (int i = 0; i < PT; ++i)
#pragma unroll
                for (int j = 0; j < KT; ++j) acc[i][j] = 0.0f;

            if constexpr (!PF) {
                // Load a stage, wait, compute it, wait: simple, but while a block loads it
                // computes nothing, and only other resident blocks hide the load latency.
                float* sx = smem;
                float* sw = smem + T::XTILE;
                for (int c0 = 0; c0 < C; c0 += CC) {
                    __syncthreads();  // the previous stage's tiles are no longer read
#pragma unroll kLoadUnroll
                    for (int i = tid; i < T::XTILE; i += T::NT)
                        sx[i] = x_tile_value<T, R, S>(x, i, n, c0, p0, q0, C, H, W);
#pragma unroll kLoadUnroll
                    for (int i = tid; i < T::WTILE; i += T::NT) {
                        int d;
                        const float v = w_tile_value<T, R, S>(w, i, k0, c0, C, K, &d);
                        sw[d] = v;
                    }
                    __syncthreads();
                    compute_stage<T, R, S, KT>(sx, sw, acc, min(CC, C - c0), ry, ky, tx);
                }
            } else {
                // Prefetch: the next stage's global loads are issued into registers before
                // computing the current stage from shared memory, and stored into the other
                // shared buffer afterwards, so their latency hides behind the FMAs. One barrier
                // per stage: buffer b is rewritten only after the barrier that ends its reads.
                constexpr int NX = CEIL_DIV(T::XTILE, T::NT), NW = CEIL_DIV(T::WTILE, T::NT);
                float xr[NX], wr[NW];
                int wd[NW];
                auto fetch = [&](int c0) {
#pragma unroll
                    for (int u = 0; u < NX; ++u) {
                        const int i = tid + u * T::NT;
                        xr[u] = i < T::XTILE ? x_tile_value<T, R, S>(x, i, n, c0, p0, q0, C, H, W) : 0.0f;
                    }
#pragma unroll
                    for (int u = 0; u < NW; ++u) {
                        const int i = tid + u * T::NT;
                        wd[u] = -1;
                        wr[u] = i < T::WTILE ? w_tile_value<T, R, S>(w, i, k0, c0, C, K, &wd[u]) : 0.0f;
                    }
                };
                auto put = [&](int b) {
                    float* sx = smem + b * (T::XTILE + T::WTILE);
                    float* sw = sx + T::XTILE;
#pragma unroll
                    for (int u = 0; u < NX; ++u)
                        if (tid + u * T::NT < T::XTILE) sx[tid + u * T::NT] = xr[u];
#pragma unroll
                    for (int u = 0; u < NW; ++u)
                        if (wd[u] >= 0) sw[wd[u]] = wr[u];
                };
                __syncthreads();  // the previous tile's last stage is no longer read
                fetch(0);
                put(0);
                __syncthreads();
                int b = 0;
                for (int c0 = 0; c0 < C; c0 += CC, b ^= 1) {
                    const bool more = c0 + CC < C;
                    if (more) fetch(c0 + CC);
                    const float* sx = smem + b * (T::XTILE + T::WTILE);
                    compute_stage<T, R, S, KT>(sx, sx + T::XTILE, acc, min(CC, C - c0), ry, ky, tx);
                    if (more) put(b ^ 1);
                    __syncthreads();
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

#define BLOCKED_ENTRY(R, KT, KG, PF)                                                                \
    extern "C" __global__ void __launch_bounds__(TQ * BY, MINB_FOR(R, PF))                           \
        conv2d_blocked_r##R##_k##KT##_g##KG(const float* __restrict__ x, const float* __restrict__ w,   \
                                            float* __restrict__ y, int N, int C, int H, int W, int K) { \
        conv2d_blocked<R, R, KT, KG, CC_FOR(R, PF), PF>(x, w, y, N, C, H, W, K);                       \
    }
#define BLOCKED_ENTRIES(R) \
    BLOCKED_ENTRY(R, 1, 1, 0) BLOCKED_ENTRY(R, 4, 1, 0) BLOCKED_ENTRY(R, 8, 1, 0) BLOCKED_ENTRY(R, 8, 4, PF_FOR(R))

BLOCKED_ENTRIES(1)
BLOCKED_ENTRIES(3)
BLOCKED_ENTRIES(5)
BLOCKED_ENTRIES(7)
BLOCKED_ENTRIES(9)
