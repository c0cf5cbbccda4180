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
// (KT, KG) in {(1,1), (4,1), (8,1), (8,4)}, except 1x1 with (8,4): 1x1 filters with K >= 32 run
// the GEMM tile at the end of this file (conv2d_blocked_1x1_m64 / _m128) instead.
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

// 1x1 filters with K < 32 use the tiles above; K >= 32 goes to the GEMM tile below.
BLOCKED_ENTRY(1, 1, 1, 0)
BLOCKED_ENTRY(1, 4, 1, 0)
BLOCKED_ENTRY(1, 8, 1, 0)
BLOCKED_ENTRIES(3)
BLOCKED_ENTRIES(5)
BLOCKED_ENTRIES(7)
BLOCKED_ENTRIES(9)

// ---- 1x1 filters as a GEMM tile ------------------------------------------------------------
//
// A 1x1 "same" convolution has no halo and no taps: for each image n it is the matrix product
//     Y[n] (K x HW) = W (K x C) . X[n] (C x HW),    HW = H * W pixels, row-major, NCHW as is.
// The tiles above spend their shared memory on halos and keep TK = 32 channels per block, so each
// staged input value serves 32 output channels (day 06's notebook, section 8, counts it). Here a
// block computes a BM x BN tile of Y[n] (BM output channels x BN = 128 pixels) with 256 threads,
// each a TM x 8 register tile (TM = BM / 16), and stages BK = 8 input channels per step:
//     sw[BK][BM + 4]   W[k0 .. k0+BM)[c0 .. c0+BK), transposed (channel c row-major); the 4-float
//                      pad puts the 8 rows of a warp's transposing stores in different banks
//     sx[BK][BN]       X[n][c0 .. c0+BK)[pix0 .. pix0+BN)
// Each step a thread reads TM weights and 8 pixels per channel as float4s (TM/4 + 2 loads) for
// TM * 8 FMAs. Two buffers: the next step's global loads go to registers before this step's FMAs
// and into the other buffer after them, one barrier per step (the prefetch of the tiles above).
//
// Mapping: tid = threadIdx.x (256 threads), tn = tid % 16, tm = tid / 16;
//   thread pixels   pix0 + 4*tn + {0..3} and pix0 + 64 + 4*tn + {0..3}     pix0 = blockIdx.x * BN
//   thread channels k0 + 4*tm + 64*g + {0..3}, g < TM / 4                   k0 = blockIdx.y * BM
//   a warp's 16 tn read 64 consecutive floats of sx (no bank conflict), its two tm broadcast.
//   image n = blockIdx.z, step gridDim.z.
// Launch: block (256, 1, 1); grid (ceil(HW / 128), ceil(K / BM), min(N, 65535)); static shared
//   memory. Loads are scalar and bounds-checked (any C, H, W, no alignment needed); stores are
//   float4 where HW % 4 == 0 and y is 16-byte aligned (then every row of 4 pixels is), scalar
//   otherwise.
constexpr int G_BN = 128, G_BK = 8, G_THREADS = 256;

template <int BM>
__device__ __forceinline__ void conv2d_blocked_1x1(const float* __restrict__ x, const float* __restrict__ w,
                                                   float* __restrict__ y, int N, int C, int H, int W, int K) {
    constexpr int TM = BM / 16, TN = G_BN / 16, SWW = BM + 4;
    constexpr int NX = G_BK * G_BN / G_THREADS, NW = G_BK * BM / G_THREADS;  // loads per thread per step
    static_assert(TM % 4 == 0 && NW >= 1, "BM must be a multiple of 64");
    __shared__ __align__(16) float sw[2][G_BK][SWW];
    __shared__ __align__(16) float sx[2][G_BK][G_BN];

    const int tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
    const idx_t HW = (idx_t)H * W;
    const idx_t pix0 = (idx_t)blockIdx.x * G_BN;
    const int k0 = blockIdx.y * BM;
    const bool vec_store = HW % 4 == 0 && reinterpret_cast<unsigned long long>(y) % 16 == 0;  // float4-aligned rows

    // Element e = tid + u * 256 of a step: sx[e / BN][e % BN] (consecutive threads, consecutive
    // pixels: coalesced) and sw[e % BK][e / BK] (8 consecutive channels of one filter). Which
    // pixel and which filter an element holds never changes, so the bounds tests on them and
    // the offsets are computed once; a step only adds BK channels.
    bool x_in[NX], w_in[NW];
    idx_t x_off[NX];
    int w_off[NW];
#pragma unroll
    for (int u = 0; u < NX; ++u) {
        const int e = tid + u * G_THREADS;
        x_in[u] = pix0 + e % G_BN < HW;
        x_off[u] = (idx_t)(e / G_BN) * HW + pix0 + e % G_BN;
    }
#pragma unroll
    for (int u = 0; u < NW; ++u) {
        const int e = tid + u * G_THREADS;
        w_in[u] = k0 + e / G_BK < K;
        w_off[u] = w_in[u] ? (k0 + e / G_BK) * C + e % G_BK : 0;  // K * C < 2^31 (checked in Python)
    }

    for (int n = blockIdx.z; n < N; n += gridDim.z) {
        const float* xn = x + (idx_t)n * C * HW;
        float xr[NX], wr[NW];
        auto fetch = [&](int c0) {
            const float* xc = xn + (idx_t)c0 * HW;
#pragma unroll
            for (int u = 0; u < NX; ++u)
                xr[u] = (x_in[u] && c0 + (tid + u * G_THREADS) / G_BN < C) ? xc[x_off[u]] : 0.0f;
#pragma unroll
            for (int u = 0; u < NW; ++u)
                wr[u] = (w_in[u] && c0 + (tid + u * G_THREADS) % G_BK < C) ? w[w_off[u] + c0] : 0.0f;
        };
        auto put = [&](int b) {
#pragma unroll
            for (int u = 0; u < NX; ++u) {
                const int e = tid + u * G_THREADS;
                sx[b][e / G_BN][e % G_BN] = xr[u];
            }
#pragma unroll
            for (int u = 0; u < NW; ++u) {
                const int e = tid + u * G_THREADS;
                sw[b][e % G_BK][e / G_BK] = wr[u];
            }
        };

        float acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

        __syncthreads();  // the previous image's last step is no longer read
        fetch(0);
        put(0);
        __syncthreads();
        int b = 0;
        for (int c0 = 0; c0 < C; c0 += G_BK, b ^= 1) {
            const bool more = c0 + G_BK < C;
            if (more) fetch(c0 + G_BK);
#pragma unroll
            for (int kk = 0; kk < G_BK; ++kk) {
                float a[TM], v[TN];
#pragma unroll
                for (int g = 0; g < TM / 4; ++g) {
                    const float4 t = *reinterpret_cast<const float4*>(&sw[b][kk][4 * tm + 64 * g]);
                    a[4 * g] = t.x; a[4 * g + 1] = t.y; a[4 * g + 2] = t.z; a[4 * g + 3] = t.w;
                }
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float4 t = *reinterpret_cast<const float4*>(&sx[b][kk][4 * tn + 64 * h]);
                    v[4 * h] = t.x; v[4 * h + 1] = t.y; v[4 * h + 2] = t.z; v[4 * h + 3] = t.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
            }
            if (more) put(b ^ 1);
            __syncthreads();
        }

#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int k = k0 + 4 * tm + 64 * (i / 4) + i % 4;
            if (k >= K) continue;
            float* yk = y + ((idx_t)n * K + k) * HW;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const idx_t pix = pix0 + 4 * tn + 64 * h;
                if (vec_store && pix + 3 < HW) {
                    *reinterpret_cast<float4*>(yk + pix) =
                        make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (pix + j < HW) yk[pix + j] = acc[i][4 * h + j];
                }
            }
        }
    }
}

// MINB: the 8 x 8 register tile of BM = 128 needs more than the 128 registers that two blocks
// per SM allow (it spills), so it runs one block (8 warps) per SM; BM = 64 fits two.
#define BLOCKED_1X1_ENTRY(BM, MINB_1X1)                                                               \
    extern "C" __global__ void __launch_bounds__(G_THREADS, MINB_1X1)                                 \
        conv2d_blocked_1x1_m##BM(const float* __restrict__ x, const float* __restrict__ w,            \
                                 float* __restrict__ y, int N, int C, int H, int W, int K) {           \
        conv2d_blocked_1x1<BM>(x, w, y, N, C, H, W, K);                                               \
    }
BLOCKED_1X1_ENTRY(64, 2)
BLOCKED_1X1_ENTRY(128, 1)
