// Day 19 - wgrad_wgmma: the filter gradient on Hopper's main loop (sm_90a): the copy engine (TMA)
// loads dy and x, the tensor cores read both from shared memory as *transposed* operands (wgmma
// with imm-trans-a = imm-trans-b = 1), mbarriers pace a producer warpgroup and the consumers; the
// long reduction over N P Q is split (split-K) and summed by a second kernel in a fixed order.
// NHWC x [N][H][W][C], dy [N][P][Q][K]; KRSC dw [K][R][S][C]; fp16/bf16 in, fp32 accumulation.
//
// The math: dw[k][r][s][c] = sum over pixels m = (n P + p) Q + q of dy[m][k] x[n][p sh - ph + r dh]
// [q sw - pw + s dw][c]. Per tap (r, s) a GEMM: GEMM-M = K (filters), GEMM-N = C (channels),
// GEMM-K = N P Q (output pixels), walked 64 pixels per stage.
//
// What changed since day 16 (16_igemm_wgmma.cu: fprop, both operands K-major):
// 1. Loads, per stage (64 pixels t * 64 .. t * 64 + 63 of GEMM-K):
//    A = dy, a tiled map of dy as a matrix [N P Q][K] (dims K, N P Q; helpers/tma.py's TiledMap):
//      BM / 64 boxes of 64 filters x 64 pixels at (k0 + 64 i, 64 t), zeros past K and past N P Q;
//    B = x, day 16's im2col map unchanged but for 64 pixels per copy: BN / 64 boxes of 64 channels
//      x 64 pixels of tap (r, s) at (c0 + 64 j, w0, h0, n0), the tap's offset (s dil_w, r dil_h),
//      zeros outside the image, past C and for pixels past N P Q (images n >= N: outside the map).
//    Each box lands as 64 rows of 128 bytes with the 128-byte swizzle: a row is one pixel, i.e.
//    one GEMM-K index, holding 64 consecutive filters (A) or channels (B). For wgmma that is the
//    MN-major ("transposed") layout of both operands: no transpose pass, the descriptor says it.
// 2. Math: wgmma.mma_async m64nBNk16 with A M-major, B N-major (hopper.cuh: wgmma_mn, the
//    descriptor sw128_mn_desc): SBO 1024 (8 pixel rows, one swizzle atom), LBO 8192 (the next
//    64-wide box of B's channels; A's 64 filters are one box, LBO unused), the k-th 16-pixel
//    slice 2048 bytes further. A consumer warpgroup owns MT x 64 filters and all BN channels.
//    days/day19_wgrad_wgmma.py simulates the swizzled writes and the descriptor's reads.
// 3. Work: units (split z, tap, m-tile, n-tile), z slowest, n-tile fastest; unit u of
//    tiles_m x tiles_n x taps x splits runs the GEMM-K steps [steps z / splits, steps (z + 1) /
//    splits) of its tile (days/day14_backward/model.py's split_k_slices, in steps of 64 pixels).
//    Persistent blocks: block b takes units b, b + grid, ...; the ring's phases run on across
//    units (day 16's PERSISTENT), so the producer fetches the next unit while the consumers store.
// 4. Epilogue, from the accumulators, no staging: direct = 1 (one split, dw in fp16/bf16): each
//    thread rounds its column pairs and stores them (4 bytes each); direct = 0: it stores them as
//    fp32 pairs (8 bytes) into the workspace, split z at ws + z K R S C (same [K][R][S][C] order).
//    Rows k >= K and columns c >= C (the tile's edge) are not stored.
// 5. wgrad_wgmma_reduce_<dtype> (a second launch when splits > 1, or for the fp32-dw option) sums
//    the splits in the order 0, 1, ..., splits - 1 in fp32 (the same bits on every run, whatever
//    the blocks' order: no atomics) and rounds once into dw; with dw32 != null it also writes the
//    fp32 sum there (the fp32-dw option). Grid-stride over groups of 4 elements (C % 8 == 0).
//
// Roles, as day 16: warpgroup 0 is the producer (thread 0 issues every copy, up to STAGES steps
// ahead; with two consumers setmaxnreg gives its registers to them), warpgroups 1 .. CONSUMERS
// consume. full[s] completes when both operands of slot s have landed (one arrival with the
// expected bytes, then the bytes); empty[s] when every consumer warp has read it (one arrival per
// warp). Ring step u (over all the block's units) uses slot u % STAGES, parity (u / STAGES) & 1.
//
// Accumulator layout (hopper.cuh): register i of thread t of consumer g, m-tile j:
//   filter  k0 + 64 (MT g + j) + 16 (t / 32 % 4) + (t % 32) / 4 + 8 ((i / 2) % 2)
//   channel c0 + 8 (i / 4) + 2 (t % 4) + i % 2
// Shared memory: STAGES x (BM + BN) rows of 128 bytes (A's BM / 64 boxes, then B's BN / 64),
// 1024-byte aligned (one more KB to align); the barriers static.
// Assumes: C % 8 == 0 and K % 8 == 0 (16-byte strides of the maps), x and dy 16-byte aligned, dw
// and the workspace 16-byte aligned; day 16's im2col limits (corners within -128 .. 127, (R - 1)
// dil_h and (S - 1) dil_w below 256, strides at most 8); N P Q + 64 and the unit count below 2^31;
// at least one step per split (Python checks all of it).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"  // pack2

// Built for any other GPU this file stops here (as day 16's; plain sm_90 refuses wgmma in ptxas).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#error "19_wgrad_wgmma.cu uses wgmma, setmaxnreg and the bulk tensor copy: build it with -arch=sm_90a (compute capability 9.0 only)"
#endif

typedef unsigned short u16;

// ---- Hopper wrappers new on this day (hopper.cuh, day 16's, is unchanged) -------------------------
// tma_load_2d(dst, map, bar, c0, c1)  cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//                                     (dy as a matrix of N P Q pixel rows of K filters)
// sw128_mn_desc(p, lbo)               the descriptor of an MN-major tile of 128-byte rows with the 128-byte swizzle
// wgmma_mn<N, BF16>(d, da, db, acc)   hopper.cuh's wgmma with imm-trans-a = imm-trans-b = 1: A M-major, B
//                                     N-major (transposed operands exist for f16/bf16 only)
// Sources as hopper.cuh's: the PTX ISA's cp.async.bulk.tensor, the wgmma matrix descriptor and
// "Shared Memory Matrix Layout" (#asynchronous-warpgroup-level-matrix-shared-memory-layout).

// tma_load_4d (hopper.cuh) for a 2-d map: coordinates (c0, c1), innermost first.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* map, uint64_t* bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
        : "memory");
}

// Descriptor of an MN-major tile: each 128-byte row holds 64 consecutive M (or N) elements of one
// K index, rows of consecutive K 128 bytes apart, written by the copy engine with the 128-byte
// swizzle at a 1024-byte aligned address. In CUTLASS's terms (cute/atom/mma_traits_sm90_gmma.hpp,
// make_gmma_desc<Major::MN>, LayoutType::B128) the canonical layout in 16-byte units is
// Swizzle<3,4,3> o ((8, n), (8, k)) : ((1, LBO), (8, SBO)): 8 units (64 halves) of MN per row, the
// next 64 MN elements LBO further, 8 rows of K (one 1024-byte swizzle atom) then the next 8 K rows
// SBO further. Here SBO = 1024 (K rows are contiguous) and LBO = `lbo` bytes, the distance between
// two 64-element MN blocks (one 64-row box after the other, 8192 bytes; unused when the operand is
// 64 wide, as A of m64 always is). Fields as hopper.cuh's sw128_desc: start >> 4 (bits 0-13), LBO
// >> 4 (16-29), SBO >> 4 (32-45), layout 1 = 128-byte swizzle (62-63). The k-th 16-deep slice
// starts 16 rows = 2048 bytes further: add 128 k (a whole number of atoms, so the swizzle phase is
// unchanged). days/day19_wgrad_wgmma.py simulates the copy engine's writes and this descriptor's
// reads (`wgmma_read`) and tests them against the logical matrices.
__device__ __forceinline__ uint64_t sw128_mn_desc(const void* tile, unsigned lbo) {
    const uint64_t addr = smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
           (uint64_t(1) << 62);
}

// hopper.cuh's WGMMA_WRAPPER with the immediates imm-trans-a = imm-trans-b = 1 (its operand lists
// WGMMA_D<N>, WGMMA_OUT<N>, WGMMA_DA/DB/SCALE_<N> reused).
#define WGMMA_MN_WRAPPER(N, T, NAME)                                                                     \
    __device__ __forceinline__ void NAME(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {    \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" WGMMA_SCALE_##N ", 0;\n"                  \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" WGMMA_D##N "}, " \
                     "%" WGMMA_DA_##N ", %" WGMMA_DB_##N ", p, 1, 1, 1, 1;\n}\n"                     \
                     : WGMMA_OUT##N                                                                      \
                     : "l"(da), "l"(db), "r"(scale_d));                                                  \
    }
WGMMA_MN_WRAPPER(64, "f16", wgmma_m64n64k16_fp16_mn)
WGMMA_MN_WRAPPER(64, "bf16", wgmma_m64n64k16_bf16_mn)
WGMMA_MN_WRAPPER(128, "f16", wgmma_m64n128k16_fp16_mn)
WGMMA_MN_WRAPPER(128, "bf16", wgmma_m64n128k16_bf16_mn)
WGMMA_MN_WRAPPER(256, "f16", wgmma_m64n256k16_fp16_mn)
WGMMA_MN_WRAPPER(256, "bf16", wgmma_m64n256k16_bf16_mn)

// wgmma with A M-major and B N-major (sw128_mn_desc descriptors): D (64 x N) += A (64 x 16) B (16 x N).
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_mn(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma wrappers for N = 64, 128 and 256");
    if constexpr (N == 64 && !BF16) wgmma_m64n64k16_fp16_mn(d, da, db, scale_d);
    else if constexpr (N == 64) wgmma_m64n64k16_bf16_mn(d, da, db, scale_d);
    else if constexpr (N == 128 && !BF16) wgmma_m64n128k16_fp16_mn(d, da, db, scale_d);
    else if constexpr (N == 128) wgmma_m64n128k16_bf16_mn(d, da, db, scale_d);
    else if constexpr (!BF16) wgmma_m64n256k16_fp16_mn(d, da, db, scale_d);
    else wgmma_m64n256k16_bf16_mn(d, da, db, scale_d);
}

constexpr int BK = 64;                     // GEMM-K (pixels) per stage: the rows of a box
constexpr int ROW_BYTES = 128;             // a box row: 64 filters or channels of one pixel
constexpr int BOX_BYTES = BK * ROW_BYTES;  // one box: 64 pixels x 64 filters or channels (8 KB)
constexpr int K16_BYTES = 16 * ROW_BYTES;  // one k16 slice of GEMM-K: 16 pixel rows
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // two consumers: 128 x 40 + 256 x 232 = 168 x 384

struct WGeometry {
    int K, C, P, Q, sh, sw, ph, pw, dh, dw, S, taps;
    int steps;                    // GEMM-K steps: ceil(N P Q / 64)
    int tiles_m, tiles_n, splits;  // ceil(K / BM), ceil(C / BN), the split factor
    int units;                    // tiles_m tiles_n taps splits
    int direct;                   // 1: dw (fp16/bf16) from the accumulators; 0: fp32 partials into ws
};

// One work unit: an output tile (tm, tn) of one tap and the GEMM-K steps [t0, t1) of split z.
struct Unit {
    int tm, tn, tap, split, t0, t1;
};

__device__ __forceinline__ Unit unit_of(const WGeometry& g, int u) {
    Unit w;
    const int tiles = g.tiles_m * g.tiles_n, per_split = tiles * g.taps;
    w.split = u / per_split;
    int rest = u - w.split * per_split;
    w.tap = rest / tiles;
    rest -= w.tap * tiles;
    w.tm = rest / g.tiles_n;
    w.tn = rest - w.tm * g.tiles_n;
    w.t0 = (int)((long long)g.steps * w.split / g.splits);
    w.t1 = (int)((long long)g.steps * (w.split + 1) / g.splits);
    return w;
}

// ---- shared storage: the ring (dynamic, 1024-byte aligned: the swizzle's period) and its barriers
extern __shared__ unsigned char smem_raw[];
__device__ __forceinline__ unsigned ring_offset() { return (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u; }

struct Barriers {
    uint64_t* full_;
    uint64_t* empty_;
    __device__ __forceinline__ uint64_t* full(int s) const { return &full_[s]; }
    __device__ __forceinline__ uint64_t* empty(int s) const { return &empty_[s]; }
};

// ---- the producer: one thread, the copies of GEMM-K step t of unit w into one slot
// A: dy's boxes (k0 + 64 i, pixel 64 t); B: x's im2col boxes of channels c0 + 64 j for the 64
// pixels from 64 t, whose first pixel (n0, p0, q0) starts the walk at (w0, h0) = (q0 sw - pw,
// p0 sh - ph), shifted by the tap.
template <int BM, int BN>
__device__ __forceinline__ void issue_step(const CUtensorMap* dymap, const CUtensorMap* xmap, unsigned char* slot,
                                           uint64_t* full, const WGeometry& g, const Unit& w, int t) {
    const int m0 = t * BK, pq = g.P * g.Q;
    const int n0 = m0 / pq, rem = m0 - n0 * pq, p0 = rem / g.Q, q0 = rem - p0 * g.Q;
    const int r = w.tap / g.S, s = w.tap - r * g.S;
    const unsigned short off_w = s * g.dw, off_h = r * g.dh;
    mbar_expect_tx(full, (BM + BN) * ROW_BYTES);
#pragma unroll
    for (int i = 0; i < BM / 64; ++i) tma_load_2d(slot + i * BOX_BYTES, dymap, full, w.tm * BM + 64 * i, m0);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j)
        tma_im2col_4d(slot + BM * ROW_BYTES + j * BOX_BYTES, xmap, full, w.tn * BN + 64 * j, q0 * g.sw - g.pw,
                      p0 * g.sh - g.ph, n0, off_w, off_h);
}

template <int BM, int BN, int STAGES>
__device__ __forceinline__ void produce(const CUtensorMap* dymap, const CUtensorMap* xmap, const WGeometry& g,
                                        const Barriers& bar, int tid) {
    constexpr int SLOT = (BM + BN) * ROW_BYTES;
    unsigned char* ring = smem_raw + ring_offset();
    if (tid != 0) return;
    int u = 0;  // ring steps issued so far, over every unit of this block
    for (int unit = blockIdx.x; unit < g.units; unit += gridDim.x) {
        const Unit w = unit_of(g, unit);
        for (int t = w.t0; t < w.t1; ++t, ++u) {
            const int slot = u % STAGES;
            if (u >= STAGES) mbar_wait(bar.empty(slot), (u / STAGES - 1) & 1);
            issue_step<BM, BN>(dymap, xmap, ring + slot * SLOT, bar.full(slot), g, w, t);
        }
    }
}

// ---- a consumer warpgroup's wgmma over one slot: 4 k16 slices x MT m-tiles of 64 filters.
// A's m-tile (MT group + j) is box MT group + j of the slot; B's BN channels are its BN / 64 boxes
// after A, LBO = one box apart. Slice kk: 2048 bytes further in both (128 in the descriptor's units).
template <int BM, int BN, int MT, bool BF16>
__device__ __forceinline__ void mma_step(float (&acc)[MT][BN / 2], const unsigned char* slot, int group) {
    const uint64_t da = sw128_mn_desc(slot + group * MT * BOX_BYTES, BOX_BYTES);
    const uint64_t db = sw128_mn_desc(slot + BM * ROW_BYTES, BOX_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < MT; ++j)
            wgmma_mn<BN, BF16>(acc[j], da + (uint64_t)((j * BOX_BYTES + kk * K16_BYTES) >> 4),
                               db + (uint64_t)(kk * K16_BYTES >> 4), 1);
    wgmma_commit();
}

// ---- the epilogue: this consumer's 64 MT filters x BN channels of the unit's tap, from the
// accumulators: dw (direct) or the split's fp32 partial, at [k][tap][c] of [K][R S][C].
template <int BM, int BN, int MT, bool BF16>
__device__ __forceinline__ void store_unit(const float (&acc)[MT][BN / 2], const WGeometry& g, const Unit& w, u16* dw,
                                           float* ws, int lane_t, int group) {
    const int warp = lane_t / 32, lane = lane_t % 32;
    float* part = ws + (idx_t)w.split * g.K * g.taps * g.C;
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int k = w.tm * BM + 64 * (MT * group + j) + 16 * warp + lane / 4 + 8 * h;
            if (k >= g.K) continue;
            const idx_t row = ((idx_t)k * g.taps + w.tap) * g.C;
#pragma unroll
            for (int c8 = 0; c8 < BN / 8; ++c8) {
                const int c = w.tn * BN + 8 * c8 + 2 * (lane % 4);  // even, and C is: c < C means c + 1 < C
                if (c >= g.C) continue;
                const float v0 = acc[j][4 * c8 + 2 * h], v1 = acc[j][4 * c8 + 2 * h + 1];
                if (g.direct)
                    *reinterpret_cast<unsigned*>(dw + row + c) = pack2<BF16>(v0, v1);
                else
                    *reinterpret_cast<float2*>(part + row + c) = make_float2(v0, v1);
            }
        }
}

template <int BM, int BN, int MT, int STAGES, bool BF16>
__device__ __forceinline__ void consume(u16* dw, float* ws, const WGeometry& g, const Barriers& bar, int tid,
                                        int group) {
    constexpr int SLOT = (BM + BN) * ROW_BYTES;
    unsigned char* ring = smem_raw + ring_offset();
    const int lane_t = tid % 128;
    int u = 0;  // ring steps consumed so far, over every unit of this block (as the producer's)
    for (int unit = blockIdx.x; unit < g.units; unit += gridDim.x) {
        const Unit w = unit_of(g, unit);
        float acc[MT][BN / 2] = {};
        for (int t = w.t0; t < w.t1; ++t, ++u) {
            const int slot = u % STAGES;
            mbar_wait(bar.full(slot), (u / STAGES) & 1);
            mma_step<BM, BN, MT, BF16>(acc, ring + slot * SLOT, group);
            wgmma_wait<1>();  // step t - 1's wgmma are done: its slot may be refilled
            if (t > w.t0 && lane_t % 32 == 0) mbar_arrive(bar.empty((u - 1) % STAGES));
        }
        wgmma_wait<0>();
        if (lane_t % 32 == 0) mbar_arrive(bar.empty((u - 1) % STAGES));  // t1 > t0: every unit has a step
#pragma unroll
        for (int j = 0; j < MT; ++j) fence_regs(acc[j]);
        store_unit<BM, BN, MT, BF16>(acc, g, w, dw, ws, lane_t, group);
    }
}

// ---- the kernel: the barriers, then each warpgroup's role
template <int BN, int MT, int CONSUMERS, int STAGES, bool BF16>
__device__ __forceinline__ void wgrad_wgmma(const CUtensorMap* dymap, const CUtensorMap* xmap, u16* dw, float* ws,
                                            const WGeometry& g) {
    constexpr int BM = 64 * MT * CONSUMERS;
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
    const int wg = tid / 128;
    if (wg == 0) {
        if constexpr (CONSUMERS > 1) setmaxnreg_dec<PRODUCER_REGS>();
        produce<BM, BN, STAGES>(dymap, xmap, g, bar, tid);
    } else {
        if constexpr (CONSUMERS > 1) setmaxnreg_inc<CONSUMER_REGS>();
        consume<BM, BN, MT, STAGES, BF16>(dw, ws, g, bar, tid, wg - 1);
    }
}

// One entry point per (tile, dtype): wgrad_wgmma_<BM>x<BN>_c<CONSUMERS>_s<STAGES>_<fp16|bf16>.
// Arguments: the tiled map of dy (dims K, N P Q; boxes 64 x 64), the im2col map of x (64 channels
// x 64 pixels per copy), both __grid_constant__; dw (written when direct), the workspace (fp32
// partials, written when not direct); K, C, P, Q, sh, sw, ph, pw, dh, dw, S, taps = R S, steps =
// ceil(N P Q / 64), tiles_m, tiles_n, splits, units, direct (int32).
// Threads: 128 (1 + CONSUMERS). Grid: any (persistent: min(units, SMs)). BN is 64, 128 or 256.
// With one consumer the block keeps ptxas's registers (no setmaxnreg: 256 threads may hold 255).
#define WGRAD_WGMMA_ENTRY_T(BM, BN, MT, CONS, ST, BF16, DT)                                                   \
    extern "C" __global__ void __launch_bounds__(128 * (1 + CONS), 1)                                         \
        wgrad_wgmma_##BM##x##BN##_c##CONS##_s##ST##_##DT(                                                     \
            const __grid_constant__ CUtensorMap dymap, const __grid_constant__ CUtensorMap xmap, u16* dw,     \
            float* ws, int K, int C, int P, int Q, int sh, int sw, int ph, int pw, int dh, int dil_w, int S,  \
            int taps, int steps, int tiles_m, int tiles_n, int splits, int units, int direct) {               \
        static_assert(BM == 64 * MT * CONS, "BM = 64 MT CONSUMERS");                                           \
        wgrad_wgmma<BN, MT, CONS, ST, BF16>(                                                                   \
            &dymap, &xmap, dw, ws,                                                                             \
            WGeometry{K, C, P, Q, sh, sw, ph, pw, dh, dil_w, S, taps, steps, tiles_m, tiles_n, splits, units, \
                      direct});                                                                                \
    }
#define WGRAD_WGMMA_ENTRY(BM, BN, MT, CONS, ST)                 \
    WGRAD_WGMMA_ENTRY_T(BM, BN, MT, CONS, ST, false, fp16) \
    WGRAD_WGMMA_ENTRY_T(BM, BN, MT, CONS, ST, true, bf16)

// WGRAD_WGMMA_ENTRIES (days/day19_wgrad_wgmma.py reads this list; keep one entry per line):
// BM, BN, MT (64-filter m-tiles per consumer), CONSUMERS, STAGES.
WGRAD_WGMMA_ENTRY(128, 128, 1, 2, 6)
WGRAD_WGMMA_ENTRY(128, 256, 1, 2, 4)
WGRAD_WGMMA_ENTRY(256, 128, 2, 2, 4)
WGRAD_WGMMA_ENTRY(64, 128, 1, 1, 6)
WGRAD_WGMMA_ENTRY(64, 256, 1, 1, 4)
WGRAD_WGMMA_ENTRY(64, 64, 1, 1, 8)

// ---- the reduction: dw = sum of the splits' fp32 partials, in split order, rounded once
constexpr int REDUCE_THREADS = 256;

template <bool BF16>
__device__ __forceinline__ void reduce_splits(const float* __restrict__ ws, u16* __restrict__ dw,
                                              float* __restrict__ dw32, long long count, int splits) {
    const idx_t quads = count / 4;  // count = K R S C, a multiple of 8
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < quads; i += (idx_t)gridDim.x * blockDim.x) {
        const float4* src = reinterpret_cast<const float4*>(ws) + i;
        float4 sum = src[0];
#pragma unroll 4
        for (int z = 1; z < splits; ++z) {  // z = 1, 2, ...: the same order every run
            const float4 v = src[(idx_t)z * quads];
            sum.x += v.x;
            sum.y += v.y;
            sum.z += v.z;
            sum.w += v.w;
        }
        if (dw32 != nullptr) reinterpret_cast<float4*>(dw32)[i] = sum;
        reinterpret_cast<uint2*>(dw)[i] = make_uint2(pack2<BF16>(sum.x, sum.y), pack2<BF16>(sum.z, sum.w));
    }
}

// Arguments: the workspace (splits x count fp32), dw, dw32 (fp32 dw, or null), count = K R S C, splits.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    wgrad_wgmma_reduce_fp16(const float* __restrict__ ws, u16* __restrict__ dw, float* __restrict__ dw32,
                            long long count, int splits) {
    reduce_splits<false>(ws, dw, dw32, count, splits);
}
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    wgrad_wgmma_reduce_bf16(const float* __restrict__ ws, u16* __restrict__ dw, float* __restrict__ dw32,
                            long long count, int splits) {
    reduce_splits<true>(ws, dw, dw32, count, splits);
}
