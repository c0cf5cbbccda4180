// Day 22 - igemm_split_k: day 16's persistent fprop with GEMM-K split across blocks, for layers
// whose output tiles leave SMs idle, and a deterministic reduction kernel with day 13's epilogue.
// NHWC, fp16/bf16 in and out, fp32 accumulation and fp32 partial sums.
//
// Why: at N = 32 ResNet-50's deep layers have fewer output tiles than the GPU has SMs (C2048 7x7
// K512 1x1: GEMM-M = 32 x 49 = 1,568 pixels by 512 filters, 26 tiles of 128 x 256 on 132 SMs), so
// most SMs wait while a few walk the whole GEMM-K (2,048 channels). Splitting GEMM-K
// into Z ranges (the split factor; day 19 splits wgrad's the same way) makes Z times as many work
// units, each 1/Z as long; the price is Z partial tiles of fp32 written and read back once, and a
// second launch.
//
// What is day 16's (16_igemm_wgmma.cu, whose notebook shows that file whole, so its pieces are
// repeated here rather than moved to a header; the first block below): the copy engine's loads
// (issue_step: the im2col map of x, the tiled map of w), the wgmma step (mma_step), the ring of
// STAGES slots with its full / empty mbarriers, the tile order (tile_coords), the warp
// specialisation (one producer warpgroup, two consumers, setmaxnreg). What is new here:
//   SplitScheduler  work unit w of splits x tiles: split z = w / tiles of tile w % tiles (all of a
//                   split's tiles before the next split's, so tiles in flight at once still share
//                   rows of A and columns of B, as day 16's order makes them); its GEMM-K steps are
//                   [z steps / splits, (z + 1) steps / splits), at least one each (Python checks
//                   splits <= steps). Block b takes units b, b + gridDim.x, ... (persistent).
//   produce_split   day 16's producer over the units' step ranges.
//   consume_split   day 16's consumer over the same ranges; each unit's accumulators go to its
//                   split's slice of the workspace, part[z][m][k] fp32, straight from the registers
//                   (store_partial: a thread's column pairs are 8-byte stores; a warp's instruction
//                   writes 8 rows x 32 bytes, whole 32-byte sectors when K % 8 == 0).
//   split_k_reduce  y[m][k] = act(alpha (part[0] + part[1] + ... + part[Z-1]) + beta Cin + bias),
//                   summed in that order for every element: the same bits on every run, whatever
//                   order the blocks ran in (no atomics, no semaphore between blocks). Rounded once.
// Every unit computes a partial tile and stores it whole (rows < M, columns < K), so the workspace
// needs no zero fill: each element of part[z] is written by exactly one unit (Python:
// days/day22_split_k.py, split_units and partial_writes).
//
// Assumes what day 16 assumes of x and w (C % 8 == 0, 16-byte alignment, the im2col limits),
// part 8-byte aligned (a torch allocation; 32-byte for the reduction's float4 pairs: a workspace
// at a 128-byte offset), y 16-byte aligned when K % 8 == 0 (the reduction's vector store), splits <=
// steps, M x K (+ a grid) < 2^31 and the ring counter below 2^31 (Python checks).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"  // pack2

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#error "22_split_k.cu uses wgmma, setmaxnreg and the bulk tensor copy: build it with -arch=sm_90a (compute capability 9.0 only)"
#endif

typedef unsigned short u16;

// ---- day 16's pieces (16_igemm_wgmma.cu: the same names, PERSISTENT's path only; read them there)
constexpr int BK = 64;             // GEMM-K per stage: 64 halves = one 128-byte swizzled row
constexpr int ROW_BYTES = BK * 2;  // bytes per tile row
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // setmaxnreg's targets: 128 x 40 + 256 x 232 = 168 x 384

template <bool BF16>
__device__ __forceinline__ float to_f32(u16 v) {
    if constexpr (BF16) return __bfloat162float(__ushort_as_bfloat16(v));
    else return __half2float(__ushort_as_half(v));
}

struct Geometry {
    int M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps, cblocks, group_m;
};

// GEMM-K step t of the tile at (n0, h0, w0), filters k0..: channel block t % cblocks of tap t / cblocks.
template <int BM, int BN>
__device__ __forceinline__ void issue_step(const CUtensorMap* xmap, const CUtensorMap* wmap, unsigned char* slot,
                                           uint64_t* full, const Geometry& g, int n0, int h0, int w0, int k0, int t) {
    const int cb = t % g.cblocks, tap = t / g.cblocks, r = tap / g.S, s = tap % g.S;
    const unsigned short off_w = s * g.dw, off_h = r * g.dh;
    mbar_expect_tx(full, (BM + BN) * ROW_BYTES);
    tma_im2col_4d(slot, xmap, full, cb * BK, w0, h0, n0, off_w, off_h);
    tma_load_4d(slot + BM * ROW_BYTES, wmap, full, cb * BK, s, r, k0);
}

__device__ __forceinline__ void tile_origin(const Geometry& g, int m0, int& n0, int& h0, int& w0) {
    const int pq = g.P * g.Q;
    n0 = m0 / pq;
    const int rem = m0 - n0 * pq, p0 = rem / g.Q, q0 = rem - p0 * g.Q;
    h0 = p0 * g.sh - g.ph;
    w0 = q0 * g.sw - g.pw;
}

__device__ __forceinline__ void tile_coords(const Geometry& g, int tiles_m, int tiles_n, int t, int& tm, int& tn) {
    const int span = g.group_m * tiles_n, first = t / span * g.group_m, r = t % span;
    const int rows = min(g.group_m, tiles_m - first);
    tm = first + r % rows;
    tn = r / rows;
}

template <int BM, int BN, int MT, bool BF16>
__device__ __forceinline__ void mma_step(float (&acc)[MT][BN / 2], const unsigned char* slot, int group) {
    const uint64_t da = sw128_desc(slot + group * MT * 64 * ROW_BYTES);
    const uint64_t db = sw128_desc(slot + BM * ROW_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < MT; ++j)
            wgmma<BN, BF16>(acc[j], da + (uint64_t)(j * 64 * ROW_BYTES >> 4) + 2 * kk, db + 2 * kk, 1);
    wgmma_commit();
}

extern __shared__ unsigned char smem_raw[];
template <int BM, int BN, int STAGES>
struct Ring {
    static constexpr int SLOT = (BM + BN) * ROW_BYTES;
    __device__ __forceinline__ static unsigned offset() { return (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u; }
};

struct Barriers {
    uint64_t* full_;
    uint64_t* empty_;
    __device__ __forceinline__ uint64_t* full(int s) const { return &full_[s]; }
    __device__ __forceinline__ uint64_t* empty(int s) const { return &empty_[s]; }
};


// ---- the work units: (split, tile) -> the tile's coordinates and its GEMM-K step range
struct SplitScheduler {
    const Geometry& g;
    const int tiles_m, tiles_n, tiles, splits, steps, count, first, step;
    __device__ __forceinline__ SplitScheduler(const Geometry& g_, int tiles_m_, int tiles_n_, int splits_, int steps_)
        : g(g_),
          tiles_m(tiles_m_),
          tiles_n(tiles_n_),
          tiles(tiles_m_ * tiles_n_),
          splits(splits_),
          steps(steps_),
          count(tiles_m_ * tiles_n_ * splits_),
          first(blockIdx.x),
          step(gridDim.x) {}
    __device__ __forceinline__ void unit(int w, int& tm, int& tn, int& z, int& lo, int& hi) const {
        z = w / tiles;
        tile_coords(g, tiles_m, tiles_n, w - z * tiles, tm, tn);
        lo = (int)((long long)z * steps / splits);
        hi = (int)((long long)(z + 1) * steps / splits);
    }
};

// ---- the producer: day 16's, over each unit's steps lo .. hi - 1
template <int BM, int BN, int STAGES>
__device__ __forceinline__ void produce_split(const CUtensorMap* xmap, const CUtensorMap* wmap, const Geometry& g,
                                              const Barriers& bar, const SplitScheduler& sch, int tid) {
    using R = Ring<BM, BN, STAGES>;
    unsigned char* ring = smem_raw + R::offset();
    if (tid != 0) return;
    int u = 0;  // loads issued so far, over every unit of this block
    for (int w = sch.first; w < sch.count; w += sch.step) {
        int tm, tn, z, lo, hi;
        sch.unit(w, tm, tn, z, lo, hi);
        if (lo == hi) continue;  // no steps (never with splits <= steps: Python checks); the consumers skip it too
        int n0, h0, w0;
        tile_origin(g, tm * BM, n0, h0, w0);
        for (int t = lo; t < hi; ++t, ++u) {
            const int slot = u % STAGES;
            if (u >= STAGES) mbar_wait(bar.empty(slot), (u / STAGES - 1) & 1);
            issue_step<BM, BN>(xmap, wmap, ring + slot * R::SLOT, bar.full(slot), g, n0, h0, w0, tn * BN, t);
        }
    }
}

// One consumer's 64 MT rows x BN columns of fp32 partial sums into its split's slice of the
// workspace (row-major M x K), rows < M and columns < K. Register i of m-tile j sits at row row0 +
// 64 j + 16 warp + lane / 4 + 8 ((i / 2) % 2), column k0 + 8 (i / 4) + 2 (lane % 4) + i % 2
// (hopper.cuh's accumulator layout): registers i, i + 1 are neighbouring columns, one 8-byte store
// when K is even (the pair's offset m K + k is then even).
template <int BN, int MT>
__device__ __forceinline__ void store_partial(const float (&acc)[MT][BN / 2], const Geometry& g, float* part, int row0,
                                              int k0, int lane_t) {
    const int warp = lane_t / 32, lane = lane_t % 32;
    const bool pairs = g.K % 2 == 0;
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int i = 0; i < BN / 2; i += 2) {
            const int m = row0 + 64 * j + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
            const int k = k0 + 8 * (i / 4) + 2 * (lane % 4);
            if (m >= g.M || k >= g.K) continue;
            float* dst = part + (idx_t)m * g.K + k;
            if (pairs) {
                *reinterpret_cast<float2*>(dst) = make_float2(acc[j][i], acc[j][i + 1]);
            } else {
                dst[0] = acc[j][i];
                if (k + 1 < g.K) dst[1] = acc[j][i + 1];
            }
        }
}

// ---- a consumer warpgroup (group 0 or 1): its 64 MT rows of every unit of the block
template <int BM, int BN, int MT, int STAGES, bool BF16>
__device__ __forceinline__ void consume_split(const Geometry& g, float* part, const Barriers& bar,
                                              const SplitScheduler& sch, int tid, int group) {
    using R = Ring<BM, BN, STAGES>;
    unsigned char* ring = smem_raw + R::offset();
    const int lane_t = tid % 128;
    int u = 0;  // the ring's slot uses so far
    for (int w = sch.first; w < sch.count; w += sch.step) {
        int tm, tn, z, lo, hi;
        sch.unit(w, tm, tn, z, lo, hi);
        if (lo == hi) continue;  // as the producer: no ring step, no release
        float acc[MT][BN / 2] = {};
#pragma unroll
        for (int j = 0; j < MT; ++j) fence_regs(acc[j]);  // the zeros in their own registers before the first
                                                          // wgmma_fence (else ptxas serialises the wgmma of
                                                          // the second m-tile behind the first)
        for (int t = lo; t < hi; ++t, ++u) {
            const int slot = u % STAGES;
            mbar_wait(bar.full(slot), (u / STAGES) & 1);
            mma_step<BM, BN, MT, BF16>(acc, ring + slot * R::SLOT, group);
            wgmma_wait<1>();
            if (t > lo && lane_t % 32 == 0) mbar_arrive(bar.empty((u - 1) % STAGES));
        }
        wgmma_wait<0>();
        if (lane_t % 32 == 0) mbar_arrive(bar.empty((u - 1) % STAGES));
#pragma unroll
        for (int j = 0; j < MT; ++j) fence_regs(acc[j]);
        store_partial<BN, MT>(acc, g, part + (idx_t)z * g.M * g.K, tm * BM + group * MT * 64, tn * BN, lane_t);
    }
}

// ---- the kernel: the barriers, the units, then each warpgroup's role (day 16's PERSISTENT layout:
// a producer warpgroup and two consumers of 64 MT rows each)
template <int BN, int MT, int STAGES, bool BF16>
__device__ __forceinline__ void igemm_split_k(const CUtensorMap* xmap, const CUtensorMap* wmap, float* part,
                                              const Geometry& g, int splits) {
    constexpr int CONSUMERS = 2, BM = 64 * MT * CONSUMERS;
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    const Barriers bar{full, empty};
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bar.full(s), 1);
            mbar_init(bar.empty(s), 4 * CONSUMERS);  // one arrival per consumer warp
        }
        mbar_fence_init();
    }
    __syncthreads();
    const SplitScheduler sch(g, CEIL_DIV(g.M, BM), CEIL_DIV(g.K, BN), splits, g.taps * g.cblocks);
    if (tid / 128 == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        produce_split<BM, BN, STAGES>(xmap, wmap, g, bar, sch, tid);
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        consume_split<BM, BN, MT, STAGES, BF16>(g, part, bar, sch, tid, tid / 128 - 1);
    }
}

// One entry point per (tile, dtype): igemm_split_k_<BM>x<BN>_c2_s<STAGES>_<fp16|bf16>, 384 threads.
// Arguments: the im2col map of x and the tiled map of w (day 16's), the workspace part
// [splits][M][K] fp32, M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps = R * S, cblocks = ceil(C / 64),
// group_m (tile_coords), splits.
#define SPLIT_ENTRY_T(BM, BN, MT, ST, BF16, DT)                                                                     \
    extern "C" __global__ void __launch_bounds__(384, 1) igemm_split_k_##BM##x##BN##_c2_s##ST##_##DT(              \
        const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, float* __restrict__ part, \
        int M, int K, int P, int Q, int sh, int sw, int ph, int pw, int dh, int dw, int S, int taps, int cblocks,   \
        int group_m, int splits) {                                                                               \
        static_assert(BM == 128 * MT, "BM = 64 MT x 2 consumers");                                                   \
        igemm_split_k<BN, MT, ST, BF16>(&xmap, &wmap, part,                                                           \
                                        Geometry{M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps, cblocks, group_m}, splits); \
    }
#define SPLIT_ENTRY(BM, BN, MT, ST)                \
    SPLIT_ENTRY_T(BM, BN, MT, ST, false, fp16) \
    SPLIT_ENTRY_T(BM, BN, MT, ST, true, bf16)

// SPLIT_ENTRIES (days/day22_split_k.py reads this list; keep one entry per line): day 16's
// persistent tiles.
SPLIT_ENTRY(128, 256, 1, 4)
SPLIT_ENTRY(256, 128, 2, 4)
SPLIT_ENTRY(128, 128, 1, 6)
SPLIT_ENTRY(128, 64, 1, 8)

// ---- the reduction: every output element sums its partials (one per split) in split order, then day 13's
// epilogue act(alpha sum + beta Cin + bias) in fp32 (alpha = 1, no bias, Cin or ReLU: the sum
// itself; a missing bias adds -0, which changes no value), rounded once to y's type. A grid-stride
// loop over vectors of 8 consecutive elements of the M x K output: two 16-byte loads per split,
// Cin and the bias element by element (read only with an epilogue), one 16-byte store of y, when
// K % 8 == 0 (a vector then stays in one row); else element by element.
template <bool BF16>
__device__ __forceinline__ float epilogue_value(float v, int e, int k, const u16* cin, const u16* bias, float alpha,
                                                float beta, int relu) {
    v = fmaf(alpha, v, bias != nullptr ? to_f32<BF16>(bias[k]) : -0.0f);
    if (cin != nullptr && beta != 0.0f) v += beta * to_f32<BF16>(cin[e]);
    return relu && v < 0.0f ? 0.0f : v;  // v < 0 ? 0 : v keeps a NaN a NaN, as torch.relu does
}

// M K < 2^31 (Python checks): element and vector indices are ints; a split's offset z M K is not.
template <bool BF16>
__device__ __forceinline__ void split_k_reduce(const float* __restrict__ part, u16* y, const u16* cin,
                                               const u16* __restrict__ bias, int M, int K,
                                               int splits, float alpha, float beta, int relu) {
    const int plane = M * K, stride = gridDim.x * blockDim.x;
    if (K % 8 == 0) {
        for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < plane / 8; v += stride) {
            const int e = 8 * v, k = e % K;
            float sum[8] = {};
            for (int z = 0; z < splits; ++z) {
                const float4* src = reinterpret_cast<const float4*>(part + (idx_t)z * plane + e);
                const float4 a = src[0], b = src[1];
                sum[0] += a.x, sum[1] += a.y, sum[2] += a.z, sum[3] += a.w;
                sum[4] += b.x, sum[5] += b.y, sum[6] += b.z, sum[7] += b.w;
            }
            unsigned out[4];
#pragma unroll
            for (int q = 0; q < 4; ++q)
                out[q] = pack2<BF16>(epilogue_value<BF16>(sum[2 * q], e + 2 * q, k + 2 * q, cin, bias, alpha, beta, relu),
                                     epilogue_value<BF16>(sum[2 * q + 1], e + 2 * q + 1, k + 2 * q + 1, cin, bias, alpha,
                                                          beta, relu));
            *reinterpret_cast<uint4*>(y + e) = make_uint4(out[0], out[1], out[2], out[3]);
        }
        return;
    }
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < plane; e += stride) {
        float sum = 0.0f;
        for (int z = 0; z < splits; ++z) sum += part[(idx_t)z * plane + e];
        const float v = epilogue_value<BF16>(sum, e, e % K, cin, bias, alpha, beta, relu);
        y[e] = (u16)(pack2<BF16>(v, v) & 0xFFFF);  // the low half: the first value
    }
}

// Arguments: part [splits][M][K] fp32, y, cin, bias (null when absent), M, K, splits, alpha, beta, relu.
#define REDUCE_ENTRY(BF16, DT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) split_k_reduce_##DT(                                         \
        const float* __restrict__ part, u16* y, const u16* cin, /* y may be Cin (in place) */                      \
        const u16* __restrict__ bias, int M, int K, int splits, float alpha, float beta, int relu) {               \
        split_k_reduce<BF16>(part, y, cin, bias, M, K, splits, alpha, beta, relu);                                 \
    }
REDUCE_ENTRY(false, fp16)
REDUCE_ENTRY(true, bf16)
