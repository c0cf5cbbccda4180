// Day 16 - igemm_wgmma: implicit-GEMM fprop for Hopper (sm_90a): the copy engine (TMA) loads the
// tiles, the tensor cores read them straight from shared memory (wgmma), mbarriers pace the two.
// NHWC, fp16/bf16 in and out, fp32 accumulation, day 13's fused epilogue.
//
// What changed since day 13 (13_igemm_production.cu: every thread copies 16-byte chunks with
// cp.async, ldmatrix moves them to registers, each warp runs mma.sync m16n8k16):
// 1. Loads: one thread asks the copy engine for a whole tile per operand and stage.
//    A (the activations) in im2col mode: BM consecutive output pixels, 64 channels each, of one
//      filter tap (r, s); the map (helpers/tma.py's Im2colMap) walks the image with the conv's
//      strides inside a bounding box from (-pad_w, -pad_h) that holds exactly Q x P pixels, and
//      each copy shifts it by the tap's offset (s * dil_w, r * dil_h); pixels outside the image
//      and channels past C arrive as zeros (the padding, the last channel block).
//    B (the KRSC filter) in tiled mode: a box of 64 channels x 1 x 1 x BN filters at (c, s, r, k0),
//      zeros past C and K.
//    Both are written with the 128-byte swizzle: a row is 64 halves (128 bytes), and its 16-byte
//    chunk j lands at chunk j ^ (row % 8), the layout wgmma reads without bank conflicts.
//    GEMM-K step t (of taps * cblocks, cblocks = ceil(C / 64)) is channel block t % cblocks of tap
//    t / cblocks.
// 2. Math: wgmma.mma_async m64nBNk16, a warpgroup (4 warps, 128 threads) at a time, A and B read
//    from shared memory through 64-bit descriptors (hopper.cuh's sw128_desc): no ldmatrix, no
//    fragments in registers but the accumulators. A consumer warpgroup owns MT x 64 rows of the
//    block tile and all BN columns: MT x BN / 2 fp32 accumulators per thread.
// 3. Pacing: a ring of STAGES slots, each with two mbarriers. full[s] completes when the copy
//    engine has written both tiles of slot s (one arrival with the expected bytes, mbar_expect_tx,
//    then the bytes); empty[s] when every consumer warp is done reading it (one arrival per warp).
//    Step u of the ring (GEMM-K steps over all of a block's tiles) uses slot u % STAGES for the
//    (u / STAGES)-th time and waits on phase parity (u / STAGES) & 1.
// 4. Six schedules (MODE), the steps of day 16's ladder:
//    ONE_WG      one warpgroup does everything: thread 0 issues the copies STAGES - 1 steps ahead,
//                between its own wgmma steps; block 128 threads.
//    SPECIALISED a producer warpgroup (one thread issues every copy, setmaxnreg gives its registers
//                back: 40 per thread) and CONSUMERS math warpgroups (232 registers each); the
//                producer runs up to STAGES steps ahead, the consumers never wait for an issue.
//    PERSISTENT  SPECIALISED, with one block per SM looping over output tiles (tile = blockIdx.x,
//                + gridDim.x, ...): the producer fetches the next tile while the consumers store
//                this one, and the ring's phases run on across tiles.
//    PINGPONG    PERSISTENT with two consumers that each own a whole BM x BN tile and take the
//                block's tiles in turn (consumer 0 tiles 0, 2, 4, ... of the block, consumer 1
//                tiles 1, 3, ...): one stores its tile while the other computes. An ordering
//                mbarrier per consumer (order[g]) lets consumer g start its main loop only after
//                the other has issued its last wgmma of the tile before, so the main loops run in
//                tile order. That also keeps a consumer from waiting on a slot two phases early: the
//                fills it waits for are always the next ones of their slots.
//    CLUSTER     PERSISTENT in clusters of two blocks (__cluster_dims__(2, 1, 1)) on vertically
//                adjacent tiles, which need the same B: each producer copies half of B into both
//                blocks' slot (multicast), and each consumer warp releases a slot on both blocks'
//                empty barriers (a remote arrival), since either producer writes into both. Both
//                blocks walk the same pair tiles, so their rings stay in step; a rank past the last
//                m-tile computes zeros and stores nothing; group_m counts pair rows. The producer
//                needs 56 registers here.
//    CLUSTER_A   CLUSTER with the pair on horizontally adjacent tiles, which need the same A: each
//                producer copies half of A (BM / 2 pixels) into both blocks; a rank past the last
//                n-tile computes zeros and stores nothing.
//    Tile t -> (tm, tn) in groups of group_m m-tiles (tile_coords), day 13's threadblock swizzle
//    for a one-dimensional tile count: the tiles in flight at once share rows of A and columns of B.
// 5. Epilogue, from the accumulators: D = act(alpha * acc + beta * Cin + bias), as day 13, rounded
//    once, staged 64 x 64 at a time through two swizzled buffers per consumer, each stored to y by
//    the copy engine (a TMA store of a tiled map of y, dims K x M) while the warpgroup goes on
//    (element stores by the threads when K % 8 != 0); the ring stays the producer's, which is
//    already filling it for the next tile.
//
// The code by role, top to bottom: the producer's copies (issue_step), the math of one slot
// (mma_step), the epilogue (store_tile); then the shared storage (Ring: the slots and staging
// buffers of the dynamic shared memory; Barriers: full / empty / order), the TileScheduler (a
// block's tiles and their order, the pair's rank), and the three roles: one_warpgroup (ONE_WG's
// whole block), produce (the producer warpgroup's thread 0) and consume (a consumer warpgroup);
// igemm_wgmma initialises the barriers, builds the scheduler and gives each warpgroup its role.
//
// Accumulator layout (hopper.cuh, wgmma): register i of thread t of consumer warpgroup g, m-tile j:
//   row  m0 + 64 (MT g + j) + 16 (t / 32 % 4) + (t % 32) / 4 + 8 ((i / 2) % 2)
//   col  k0 + 8 (i / 4) + 2 (t % 4) + i % 2
// Shared memory: STAGES x (BM + BN) rows of 128 bytes (1024-byte aligned), then two 64 x 64-half
// staging buffers per consumer warpgroup (8 KB each) (Ring); the barriers static (Barriers).
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], all fp16 or all bf16;
// C % 8 == 0 and x, w 16-byte aligned (the copy engine's strides and addresses), the im2col limits
// of a 4-d map (corners within -128 .. 127, (R - 1) dil_h and (S - 1) dil_w below 256, strides
// at most 8), y 16-byte aligned when K % 8 == 0 (its map), Cin 4-byte aligned when K is even;
// M = N P Q < 2^31 (Python checks).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"  // pack2

// Built for any other GPU this file stops here; for plain sm_90, ptxas refuses wgmma and setmaxnreg
// (nvcc's preprocessing pass does not define __CUDA_ARCH_FEAT_SM90_ALL, so that cannot be tested here).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
#error "16_igemm_wgmma.cu uses wgmma, setmaxnreg and the bulk tensor copy: build it with -arch=sm_90a (compute capability 9.0 only)"
#endif

typedef unsigned short u16;

enum Mode { ONE_WG = 0, SPECIALISED = 1, PERSISTENT = 2, PINGPONG = 3, CLUSTER = 4, CLUSTER_A = 5 };

constexpr int BK = 64;            // GEMM-K per stage: 64 halves = one 128-byte swizzled row
constexpr int ROW_BYTES = BK * 2;  // bytes per tile row
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // setmaxnreg's targets: 128 x 40 + 256 x 232 = 168 x 384
constexpr int PAIR_PRODUCER_REGS = 56, PAIR_CONSUMER_REGS = 224;  // the cluster schedules' producer spills at 40: 128 x 56 + 256 x 224

template <bool BF16>
__device__ __forceinline__ float to_f32(u16 v) {
    if constexpr (BF16) return __bfloat162float(__ushort_as_bfloat16(v));
    else return __half2float(__ushort_as_half(v));
}

struct Geometry {
    int M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps, cblocks, group_m;
};

struct Epilogue {
    u16* y;
    const u16* cin;
    const u16* bias;
    float alpha, beta;
    int relu;
};

// ---- the producer: one thread, the copies of GEMM-K step t of tile (tm, tn) into slot t % STAGES
// (n0, h0, w0): the im2col start of the tile's first pixel, or with CLUSTER_A of its pixel rank BM / 2.
// CLUSTER: B is shared with the other block of the pair, which computes the same columns: this
// block's producer copies half of it, rows rank BN / 2 .., into both blocks (multicast), and the
// other half arrives from the other block's producer. CLUSTER_A: the same with A, rows rank BM / 2 ..
// of the tile, for a pair that computes the same rows. full still expects (BM + BN) rows.
template <int BM, int BN, int MODE>
__device__ __forceinline__ void issue_step(const CUtensorMap* xmap, const CUtensorMap* wmap, unsigned char* slot,
                                           uint64_t* full, const Geometry& g, int n0, int h0, int w0, int k0, int t,
                                           unsigned rank) {
    const int cb = t % g.cblocks, tap = t / g.cblocks, r = tap / g.S, s = tap % g.S;
    const unsigned short off_w = s * g.dw, off_h = r * g.dh;
    mbar_expect_tx(full, (BM + BN) * ROW_BYTES);
    if constexpr (MODE == CLUSTER_A)
        tma_im2col_4d_multicast(slot + rank * BM / 2 * ROW_BYTES, xmap, full, cb * BK, w0, h0, n0, off_w, off_h, 3);
    else
        tma_im2col_4d(slot, xmap, full, cb * BK, w0, h0, n0, off_w, off_h);
    if constexpr (MODE == CLUSTER)
        tma_load_4d_multicast(slot + (BM + rank * BN / 2) * ROW_BYTES, wmap, full, cb * BK, s, r, k0 + rank * BN / 2, 3);
    else
        tma_load_4d(slot + BM * ROW_BYTES, wmap, full, cb * BK, s, r, k0);
}

// The first output pixel of m-tile tm as the im2col copy's start: (n0, h0 = p0 sh - ph, w0 = q0 sw - pw).
__device__ __forceinline__ void tile_origin(const Geometry& g, int m0, int& n0, int& h0, int& w0) {
    const int pq = g.P * g.Q;
    n0 = m0 / pq;
    const int rem = m0 - n0 * pq, p0 = rem / g.Q, q0 = rem - p0 * g.Q;
    h0 = p0 * g.sh - g.ph;
    w0 = q0 * g.sw - g.pw;
}

// Tile t of a block's loop (or of the grid) -> (tm, tn), in groups of group_m m-tiles: tiles t of
// group t / (group_m tiles_n) walk its m-tiles first, then its columns, so the tiles in flight at
// once read a few rows of A and columns of B (which stay in L2) instead of one row of A and all of
// B. group_m = 1 is row-major order, tile (t / tiles_n, t % tiles_n).
__device__ __forceinline__ void tile_coords(const Geometry& g, int tiles_m, int tiles_n, int t, int& tm, int& tn) {
    const int span = g.group_m * tiles_n, first = t / span * g.group_m, r = t % span;
    const int rows = min(g.group_m, tiles_m - first);  // the last group may be shorter
    tm = first + r % rows;
    tn = r / rows;
}

// ---- the consumer: one warpgroup's wgmma over one slot (4 k16 slices x MT m-tiles)
template <int BM, int BN, int MT, bool BF16>
__device__ __forceinline__ void mma_step(float (&acc)[MT][BN / 2], const unsigned char* slot, int group) {
    const uint64_t da = sw128_desc(slot + group * MT * 64 * ROW_BYTES);
    const uint64_t db = sw128_desc(slot + BM * ROW_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
        for (int j = 0; j < MT; ++j)  // the next 64 rows: 64 x 128 bytes further (a multiple of 1024)
            wgmma<BN, BF16>(acc[j], da + (uint64_t)(j * 64 * ROW_BYTES >> 4) + 2 * kk, db + 2 * kk, 1);
    wgmma_commit();
}

// ---- the epilogue: the accumulators to y through staging buffers, stored by the copy engine
// Each consumer warpgroup has two staging buffers of 64 rows x 64 columns (halves): one box of the
// tiled map of y (dims K, M; box 64 x 64, the 128-byte swizzle), and walks its MT x BN / 64
// sub-tiles of that size, sub-tile i into buffer i % 2. Every thread finishes its own values,
// act(alpha * acc + beta * Cin + bias) in fp32 (Cin read where the value sits, 32-bit loads when K
// is even; the bias of its 16 columns read once per column block), rounds them once and writes the
// pairs into the buffer, where the 16-byte chunk c of row r sits at chunk c ^ (r % 8): the layout a
// TMA load of the same box would write, and 8 rows x 4 lanes of 4-byte writes per instruction hit
// 32 different banks. Then one barrier and one thread: when K % 8 == 0 it hands the buffer to the
// copy engine (tma_store_2d, which clips the box to M x K) and goes on, so the warpgroup returns to
// its main loop while the bytes still travel; before the barrier of sub-tile i that thread waits
// until the store of sub-tile i - 1 has read its buffer, the one sub-tile i + 1 writes next. When K %
// 8 != 0 (y's rows are not 16-byte strides, which a map needs) the threads store the buffer
// themselves, element by element.
// The staging tile rounds and swizzles; the copy engine makes the 16-byte runs, the bounds and the
// addresses. A plain epilogue (alpha = 1, no Cin, bias or ReLU) skips the math. (The measurements
// behind these choices, and the alternatives tried, are in the day's notebook, appendix.)
constexpr int STAGE_ROWS = 64, STAGE_COLS = 64;  // a sub-tile: 64 rows of 128 bytes, one box of y's map
constexpr int STAGE_BUF = STAGE_ROWS * STAGE_COLS;  // halves per staging buffer (8 KB); two per consumer

__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The three epilogues store_tile compiles: PLAIN (alpha = 1, no Cin, bias or ReLU): the values are
// only rounded, the case cuDNN's GEMM kernels specialise too; AFFINE: alpha * acc + bias, then ReLU
// if asked; WITH_C: AFFINE plus beta * Cin (read only inside the problem).
enum class EpilogueKind { PLAIN, AFFINE, WITH_C };

// The values of this thread in one 64 x 64 sub-tile (m-tile j's rows from m_row, columns from
// k_col) into the staging buffer, with epilogue E.
template <int BN, bool BF16, EpilogueKind E>
__device__ __forceinline__ void stage_values(const float (&acc)[BN / 2], int ibase, const float (&bias)[STAGE_COLS / 4],
                                             const Geometry& g, const Epilogue& ep, int m_row, int k_col,
                                             u16* stage_row, int swz) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int m = m_row + 8 * h;  // rows r and r + 8 of the thread
        const u16* cs = E == EpilogueKind::WITH_C ? ep.cin + (idx_t)m * g.K + k_col : nullptr;
#pragma unroll
        for (int c8 = 0; c8 < STAGE_COLS / 8; ++c8) {
            const int i = ibase + 4 * c8 + 2 * h;
            float v0 = acc[i], v1 = acc[i + 1];
            if constexpr (E != EpilogueKind::PLAIN) {
                v0 = fmaf(ep.alpha, v0, bias[2 * c8]);
                v1 = fmaf(ep.alpha, v1, bias[2 * c8 + 1]);
            }
            if constexpr (E == EpilogueKind::WITH_C) {
                const int k = k_col + 8 * c8;
                if (m < g.M && k < g.K) {
                    if (g.K % 2 == 0) {
                        const unsigned both = *reinterpret_cast<const unsigned*>(cs + 8 * c8);
                        v0 += ep.beta * to_f32<BF16>((u16)(both & 0xFFFF));
                        v1 += ep.beta * to_f32<BF16>((u16)(both >> 16));
                    } else {
                        v0 += ep.beta * to_f32<BF16>(cs[8 * c8]);
                        if (k + 1 < g.K) v1 += ep.beta * to_f32<BF16>(cs[8 * c8 + 1]);
                    }
                }
            }
            if (E != EpilogueKind::PLAIN && ep.relu) {  // v < 0 ? 0 : v keeps a NaN a NaN, as torch.relu does
                v0 = v0 < 0.0f ? 0.0f : v0;
                v1 = v1 < 0.0f ? 0.0f : v1;
            }
            *reinterpret_cast<unsigned*>(stage_row + 8 * h * STAGE_COLS + 8 * (c8 ^ swz)) = pack2<BF16>(v0, v1);
        }
    }
}

// The block tile's rows row0 .. row0 + 64 MT - 1, columns k0 .. k0 + BN - 1 of this consumer to y,
// with epilogue E (stage_values). `sub` counts the sub-tiles this consumer has staged
// so far (over all its tiles: the buffers alternate across tiles too); thread 0 of the warpgroup
// issues and waits for the stores.
template <int BN, int MT, bool BF16, EpilogueKind E>
__device__ __forceinline__ void store_tile_as(float (&acc)[MT][BN / 2], const Geometry& g, const Epilogue& ep,
                                              const CUtensorMap* ymap, int row0, int k0, int lane_t, u16* stage,
                                              int bar_id, unsigned& sub) {
    const unsigned warp = lane_t / 32, lane = lane_t % 32;
    const bool tma = g.K % 8 == 0;
    // rows 16 warp + lane / 4 (+ 8), columns 8 c8 + 2 (lane % 4) (+ 1) of the sub-tile
    const int r1 = 16 * warp + lane / 4, c1 = 2 * (lane % 4);
#pragma unroll
    for (int cb = 0; cb < BN / STAGE_COLS; ++cb) {
        const int k_col = k0 + STAGE_COLS * cb + c1;
        float bias[STAGE_COLS / 4];  // this thread's columns of the block; -0 (adds nothing) without bias or past K
#pragma unroll
        for (int c = 0; c < STAGE_COLS / 4; ++c) {
            const int k = k_col + 8 * (c / 2) + c % 2;
            bias[c] = E != EpilogueKind::PLAIN && ep.bias != nullptr && k < g.K ? to_f32<BF16>(ep.bias[k]) : -0.0f;
        }
#pragma unroll
        for (int j = 0; j < MT; ++j, ++sub) {
            u16* const buf = stage + (sub % 2) * STAGE_BUF;
            const int m_row = row0 + 64 * j + r1, ibase = 4 * (STAGE_COLS / 8) * cb;
            stage_values<BN, BF16, E>(acc[j], ibase, bias, g, ep, m_row, k_col, buf + r1 * STAGE_COLS + c1, lane / 4);
            if (tma) {
                fence_async_shared();                   // this thread's writes -> the copy engine
                if (lane_t == 0) bulk_wait_read<0>();  // the other buffer's store has read it
            }
            named_barrier(bar_id, 128);  // the buffer is written (and the other one free again)
            if (tma) {
                if (lane_t == 0) {
                    tma_store_2d(ymap, buf, k0 + STAGE_COLS * cb, row0 + 64 * j);
                    bulk_commit();
                }
                continue;
            }
            // K % 8 != 0: thread t stores chunk t % 8 (8 channels) of rows t / 8 + 16 it, element by
            // element (sub-tile i + 2 writes this buffer after the next barrier, when every thread is
            // done reading it)
            const int ch = lane_t % 8, r2 = lane_t / 8, m2 = row0 + 64 * j + r2, k = k0 + STAGE_COLS * cb + 8 * ch;
            if (k >= g.K) continue;
            const u16* src = buf + r2 * STAGE_COLS + 8 * (ch ^ (r2 % 8));  // r2 + 16 it: the same swizzle
            u16* dst = ep.y + (idx_t)m2 * g.K + k;
#pragma unroll 1
            for (int it = 0; it < STAGE_ROWS / 16 && m2 + 16 * it < g.M; ++it, dst += (idx_t)16 * g.K) {
                const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * STAGE_COLS * it);
                const u16* e = reinterpret_cast<const u16*>(&v);
#pragma unroll
                for (int q = 0; q < 8; ++q)
                    if (k + q < g.K) dst[q] = e[q];
            }
        }
    }
}

// store_tile_as with the epilogue the arguments ask for, chosen once per tile: each of the three
// copies of the unrolled code stays in one piece, and the instructions fetched for a tile are those
// of its own epilogue only (chosen per sub-tile, the other copies sat between its pieces, and
// instruction fetch paid for them).
template <int BN, int MT, bool BF16>
__device__ __forceinline__ void store_tile(float (&acc)[MT][BN / 2], const Geometry& g, const Epilogue& ep,
                                           const CUtensorMap* ymap, int row0, int k0, int lane_t, u16* stage,
                                           int bar_id, unsigned& sub) {
    if (ep.cin != nullptr && ep.beta != 0.0f)
        store_tile_as<BN, MT, BF16, EpilogueKind::WITH_C>(acc, g, ep, ymap, row0, k0, lane_t, stage, bar_id, sub);
    else if (ep.bias == nullptr && !ep.relu && ep.alpha == 1.0f)  // D = acc, rounded
        store_tile_as<BN, MT, BF16, EpilogueKind::PLAIN>(acc, g, ep, ymap, row0, k0, lane_t, stage, bar_id, sub);
    else
        store_tile_as<BN, MT, BF16, EpilogueKind::AFFINE>(acc, g, ep, ymap, row0, k0, lane_t, stage, bar_id, sub);
}

// Before the block exits: its stores are complete (thread 0 of each consumer warpgroup).
__device__ __forceinline__ void store_drain(int lane_t) {
    if (lane_t == 0) bulk_wait<0>();
}

// A consumer warp is done with a slot: it arrives on the slot's empty barrier, and with PAIR on the
// other block's too (whose producer copies half of B into this block's slot).
template <bool PAIR>
__device__ __forceinline__ void release(uint64_t* empty, unsigned rank) {
    mbar_arrive(empty);
    if constexpr (PAIR) mbar_arrive_peer(empty, rank ^ 1);
}

// ---- shared storage
// The dynamic shared memory: the ring of STAGES slots, each BM rows of A then BN rows of B (128
// bytes a row), then the consumers' staging buffers (two of STAGE_BUF halves per consumer,
// store_tile). Its base is 1024-byte aligned (the swizzle's period): each role takes it as
// smem_raw + Ring::offset(), an offset into smem_raw, so that the compiler still knows every tile
// pointer as shared memory (st.shared / ld.shared, not generic); slot s is ring + s * SLOT, the
// staging area ring + STAGING. (A pointer returned by an accessor, instead of that sum written
// where it is used, changes the machine code ptxas emits: python -m benchmarks.same_code.)
extern __shared__ unsigned char smem_raw[];
template <int BM, int BN, int STAGES>
struct Ring {
    static constexpr int SLOT = (BM + BN) * ROW_BYTES;  // bytes per slot
    static constexpr int STAGING = STAGES * SLOT;       // where the staging buffers start
    __device__ __forceinline__ static unsigned offset() { return (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u; }
};

// The mbarriers (static shared memory, declared by igemm_wgmma): full(s) completes when the copy
// engine has written slot s, empty(s) when every consumer warp reading it is done; order(g)
// (ping-pong) when consumer g may start its next tile's main loop.
struct Barriers {
    uint64_t* full_;
    uint64_t* empty_;
    uint64_t* order_;
    __device__ __forceinline__ uint64_t* full(int s) const { return &full_[s]; }
    __device__ __forceinline__ uint64_t* empty(int s) const { return &empty_[s]; }
    __device__ __forceinline__ uint64_t* order(int g) const { return &order_[g]; }
};

// ---- the tile scheduler: which output tiles a block computes, in which order
// The block's tiles are t = first, first + step, ... < count, tile t at tile(t) (tile_coords' groups).
// One tile per block (ONE_WG, SPECIALISED): step = every tile, so a role's loop runs once. A pair
// (CLUSTER: blocks 2 c and 2 c + 1, ranks 0 and 1) walks the pair tiles (pm, tn) of ceil(tiles_m / 2)
// x tiles_n; rank r computes m-tile 2 pm + r (past the last m-tile: a tile of zeros that stores
// nothing, so both blocks run the same ring steps). CLUSTER_A: pair tiles (tm, pn) of tiles_m x
// ceil(tiles_n / 2), rank r on n-tile 2 pn + r. a_row: the first pixel of the tile this block's
// producer copies (CLUSTER_A: its half of A).
template <int MODE, int BM>
struct TileScheduler {
    static constexpr bool PAIR = MODE == CLUSTER || MODE == CLUSTER_A;
    const Geometry& g;
    const unsigned rank;
    const int pairs_m, pairs_n, count, first, step, a_row;
    __device__ __forceinline__ TileScheduler(const Geometry& g_, int tiles_m, int tiles_n, int tiles)
        : g(g_),
          rank(PAIR ? blockIdx.x % 2 : 0),
          pairs_m(MODE == CLUSTER ? CEIL_DIV(tiles_m, 2) : tiles_m),
          pairs_n(MODE == CLUSTER_A ? CEIL_DIV(tiles_n, 2) : tiles_n),
          count(pairs_m * pairs_n),
          first(PAIR ? blockIdx.x / 2 : blockIdx.x),
          step(PAIR ? gridDim.x / 2 : MODE >= PERSISTENT ? gridDim.x : tiles),
          a_row(MODE == CLUSTER_A ? rank * BM / 2 : 0) {}
    __device__ __forceinline__ void tile(int t, int& tm, int& tn) const {
        tile_coords(g, pairs_m, pairs_n, t, tm, tn);
        if constexpr (MODE == CLUSTER) tm = 2 * tm + rank;
        if constexpr (MODE == CLUSTER_A) tn = 2 * tn + rank;
    }
};

// ---- one warpgroup (ONE_WG): thread 0 keeps STAGES - 1 steps in flight ahead of the math, which
// all four warps do, then the epilogue
template <int BM, int BN, int MT, int STAGES, int MODE, bool BF16>
__device__ __forceinline__ void one_warpgroup(const CUtensorMap* xmap, const CUtensorMap* wmap, const CUtensorMap* ymap,
                                              const Geometry& g, const Epilogue& ep, const Barriers& bar,
                                              const TileScheduler<MODE, BM>& sched, const int& steps, const int& tid) {
    using R = Ring<BM, BN, STAGES>;
    unsigned char* ring = smem_raw + R::offset();
    int tm, tn;
    sched.tile(sched.first, tm, tn);
    const int m0 = tm * BM, k0 = tn * BN;
    int n0, h0, w0;
    tile_origin(g, m0, n0, h0, w0);
    if (tid == 0)
        for (int t = 0; t < STAGES - 1 && t < steps; ++t)
            issue_step<BM, BN, MODE>(xmap, wmap, ring + t * R::SLOT, bar.full(t), g, n0, h0, w0, k0, t, 0);
    float acc[MT][BN / 2] = {};
    for (int t = 0; t < steps; ++t) {
        const int slot = t % STAGES;
        mbar_wait(bar.full(slot), (t / STAGES) & 1);
        mma_step<BM, BN, MT, BF16>(acc, ring + slot * R::SLOT, 0);
        wgmma_wait<1>();  // step t - 1's wgmma are done: its slot may be refilled
        if (t > 0 && tid % 32 == 0) mbar_arrive(bar.empty((t - 1) % STAGES));
        const int next = t + STAGES - 1;
        if (tid == 0 && next < steps) {
            const int ns = next % STAGES;
            if (next >= STAGES) mbar_wait(bar.empty(ns), (next / STAGES - 1) & 1);
            issue_step<BM, BN, MODE>(xmap, wmap, ring + ns * R::SLOT, bar.full(ns), g, n0, h0, w0, k0, next, 0);
        }
        __syncwarp();  // warp 0 together again for the next wgmma (.sync.aligned)
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < MT; ++j) fence_regs(acc[j]);
    unsigned sub = 0;
    store_tile<BN, MT, BF16>(acc, g, ep, ymap, m0, k0, tid, reinterpret_cast<u16*>(ring + R::STAGING), 1, sub);
    store_drain(tid);
}

// ---- the producer warpgroup: one thread issues every copy of every tile of the block, up to STAGES
// steps ahead of the consumers (ring step u over all the block's tiles uses slot u % STAGES)
template <int BM, int BN, int STAGES, int MODE>
__device__ __forceinline__ void produce(const CUtensorMap* xmap, const CUtensorMap* wmap, const Geometry& g,
                                        const Barriers& bar, const TileScheduler<MODE, BM>& sched, int steps, int tid) {
    using R = Ring<BM, BN, STAGES>;
    unsigned char* ring = smem_raw + R::offset();
    if (tid == 0) {
        int u = 0;  // loads issued so far, over every tile of this block
        for (int tile = sched.first; tile < sched.count; tile += sched.step) {
            int tm, tn;
            sched.tile(tile, tm, tn);
            const int m0 = tm * BM, k0 = tn * BN;
            int n0, h0, w0;
            tile_origin(g, m0 + sched.a_row, n0, h0, w0);
            for (int t = 0; t < steps; ++t, ++u) {
                const int slot = u % STAGES;
                if (u >= STAGES) mbar_wait(bar.empty(slot), (u / STAGES - 1) & 1);
                issue_step<BM, BN, MODE>(xmap, wmap, ring + slot * R::SLOT, bar.full(slot), g, n0, h0, w0, k0, t,
                                         sched.rank);
            }
        }
    }
}

// ---- a consumer warpgroup (group 0 .. CONSUMERS - 1): its 64 MT rows of every tile of the block,
// or with ping-pong every second whole tile; then its epilogue, while the producer fills the ring
template <int BM, int BN, int MT, int STAGES, int MODE, bool BF16>
__device__ __forceinline__ void consume(const CUtensorMap* ymap, const Geometry& g, const Epilogue& ep,
                                        const Barriers& bar, const TileScheduler<MODE, BM>& sched, int steps, int tid, int group) {
    constexpr bool PING = MODE == PINGPONG, PAIR = MODE == CLUSTER || MODE == CLUSTER_A;
    using R = Ring<BM, BN, STAGES>;
    unsigned char* ring = smem_raw + R::offset();
    const int lane_t = tid % 128;
    // ping-pong: this consumer's tiles are every second one of the block's, from the group-th
    const int own_first = sched.first + (PING ? group * sched.step : 0), own_step = PING ? 2 * sched.step : sched.step;
    int u = PING ? group * steps : 0;  // the ring's slot uses so far (both consumers' when ping-pong)
    unsigned sub = 0;                  // sub-tiles staged so far (store_tile)
    for (int tile = own_first, n = 0; tile < sched.count; tile += own_step, ++n) {
        int tm, tn;
        sched.tile(tile, tm, tn);
        const int m0 = tm * BM, k0 = tn * BN;
        // ping-pong: the other consumer has issued its last wgmma of the tile before this one
        if (PING && (group == 1 || n > 0)) mbar_wait(bar.order(group), (n - (group == 0)) & 1);
        float acc[MT][BN / 2] = {};
        for (int t = 0; t < steps; ++t, ++u) {
            const int slot = u % STAGES;
            mbar_wait(bar.full(slot), (u / STAGES) & 1);
            mma_step<BM, BN, MT, BF16>(acc, ring + slot * R::SLOT, PING ? 0 : group);
            wgmma_wait<1>();
            if (t > 0 && lane_t % 32 == 0) release<PAIR>(bar.empty((u - 1) % STAGES), sched.rank);
        }
        if (PING && lane_t == 0) mbar_arrive(bar.order(1 - group));  // the other consumer's turn
        wgmma_wait<0>();
        if (lane_t % 32 == 0) release<PAIR>(bar.empty((u - 1) % STAGES), sched.rank);
        if (PING) u += steps;  // the slot uses of the other consumer's tile
#pragma unroll
        for (int j = 0; j < MT; ++j) fence_regs(acc[j]);
        store_tile<BN, MT, BF16>(acc, g, ep, ymap, m0 + (PING ? 0 : group * MT * 64), k0, lane_t,
                                 reinterpret_cast<u16*>(ring + R::STAGING) + group * 2 * STAGE_BUF, 1 + group,
                                 sub);
    }
    store_drain(lane_t);
}

// ---- the kernel: the barriers, the scheduler, then each warpgroup's role
template <int BN, int MT, int CONSUMERS, int STAGES, int MODE, bool BF16>
__device__ __forceinline__ void igemm_wgmma(const CUtensorMap* xmap, const CUtensorMap* wmap, const CUtensorMap* ymap,
                                            const Geometry& g, const Epilogue& ep) {
    constexpr bool PING = MODE == PINGPONG, PAIR = MODE == CLUSTER || MODE == CLUSTER_A;
    constexpr int BM = 64 * MT * (PING ? 1 : CONSUMERS);  // ping-pong: every consumer owns a whole tile
    constexpr int READERS = PING ? 1 : CONSUMERS;         // consumer warpgroups reading one slot
    static_assert(BN % STAGE_COLS == 0, "BN: whole staging sub-tiles");
    static_assert(MODE != ONE_WG || CONSUMERS == 1, "one warpgroup: one consumer");
    static_assert(!PING || CONSUMERS == 2, "ping-pong: two consumers");
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES], order[2];
    const Barriers bar{full, empty, order};

    const int tid = threadIdx.x;
    const int tiles_m = CEIL_DIV(g.M, BM), tiles_n = CEIL_DIV(g.K, BN), tiles = tiles_m * tiles_n;
    const int steps = g.taps * g.cblocks;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bar.full(s), 1);
            mbar_init(bar.empty(s), 4 * READERS * (PAIR ? 2 : 1));  // one arrival per reading warp (of both blocks)
        }
        if (PING) {
            mbar_init(bar.order(0), 1);
            mbar_init(bar.order(1), 1);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if constexpr (PAIR) cluster_sync();  // both blocks' barriers are initialised before either signals the other's

    const TileScheduler<MODE, BM> sched(g, tiles_m, tiles_n, tiles);

    if constexpr (MODE == ONE_WG) {
        one_warpgroup<BM, BN, MT, STAGES, MODE, BF16>(xmap, wmap, ymap, g, ep, bar, sched, steps, tid);
    } else {
        // ---- warp-specialised: warpgroup 0 produces, warpgroups 1 .. CONSUMERS consume
        const int wg = tid / 128;
        if (wg == 0) {
            setmaxnreg_dec<PAIR ? PAIR_PRODUCER_REGS : PRODUCER_REGS>();
            produce<BM, BN, STAGES, MODE>(xmap, wmap, g, bar, sched, steps, tid);
        } else {
            setmaxnreg_inc<PAIR ? PAIR_CONSUMER_REGS : CONSUMER_REGS>();
            consume<BM, BN, MT, STAGES, MODE, BF16>(ymap, g, ep, bar, sched, steps, tid, wg - 1);
        }
    }
    if constexpr (PAIR) cluster_sync();  // the other block no longer copies into or arrives on this one's
}

// One entry point per (schedule, tile, dtype):
//   igemm_wgmma_<mode>_<BM>x<BN>_c<CONSUMERS>_s<STAGES>_<fp16|bf16>
// Arguments: the im2col map of x, the tiled map of w, the tiled map of y (all __grid_constant__:
// they stay in the kernel's parameter memory, where the copy engine reads them; y's is read only
// when K % 8 == 0), y, cin, bias, M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps = R * S, cblocks =
// ceil(C / 64), group_m (tile_coords), alpha, beta, relu.
// Threads: 128 (one_wg) or 128 (1 + CONSUMERS) (specialised, persistent). BN is 64, 128 or 256
// (the wgmma wrappers of hopper.cuh).
#define WGMMA_ENTRY_T(MODE, MNAME, BM, BN, MT, CONS, ST, BF16, DT)                                           \
    extern "C" __global__ void __launch_bounds__(128 * (MODE == ONE_WG ? 1 : 1 + CONS), 1) CLUSTER_DIMS_##MODE \
        igemm_wgmma_##MNAME##_##BM##x##BN##_c##CONS##_s##ST##_##DT(                                            \
            const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,                \
            const __grid_constant__ CUtensorMap ymap, u16* y, const u16* cin, const u16* __restrict__ bias,   \
            int M, int K, int P, int Q, int sh, int sw, int ph, int pw, int dh, int dw, int S, int taps,       \
            int cblocks, int group_m, float alpha, float beta, int relu) {                                  \
        static_assert(BM == 64 * MT * (MODE == PINGPONG ? 1 : CONS), "BM = 64 MT (x CONSUMERS but ping-pong)");  \
        igemm_wgmma<BN, MT, CONS, ST, MODE, BF16>(&xmap, &wmap, &ymap,                                         \
            Geometry{M, K, P, Q, sh, sw, ph, pw, dh, dw, S, taps, cblocks, group_m},                           \
            Epilogue{y, cin, bias, alpha, beta, relu});                                                        \
    }
#define CLUSTER_DIMS_ONE_WG
#define CLUSTER_DIMS_SPECIALISED
#define CLUSTER_DIMS_PERSISTENT
#define CLUSTER_DIMS_PINGPONG
#define CLUSTER_DIMS_CLUSTER __cluster_dims__(2, 1, 1)  // pairs of blocks (ranks 0, 1 = blockIdx.x % 2)
#define CLUSTER_DIMS_CLUSTER_A __cluster_dims__(2, 1, 1)  // the same pairs, on n-tiles
#define WGMMA_ENTRY(MODE, MNAME, BM, BN, MT, CONS, ST)                   \
    WGMMA_ENTRY_T(MODE, MNAME, BM, BN, MT, CONS, ST, false, fp16) \
    WGMMA_ENTRY_T(MODE, MNAME, BM, BN, MT, CONS, ST, true, bf16)

// WGMMA_ENTRIES (days/day16_igemm_wgmma.py reads this list; keep one entry per line). MT is the
// number of 64-row m-tiles per consumer warpgroup: BM = 64 MT CONSUMERS (ping-pong: BM = 64 MT).
WGMMA_ENTRY(ONE_WG, one_wg, 128, 128, 2, 1, 4)
WGMMA_ENTRY(SPECIALISED, specialised, 128, 256, 1, 2, 4)
WGMMA_ENTRY(SPECIALISED, specialised, 256, 128, 2, 2, 4)
WGMMA_ENTRY(PERSISTENT, persistent, 128, 256, 1, 2, 4)
WGMMA_ENTRY(PERSISTENT, persistent, 256, 128, 2, 2, 4)
WGMMA_ENTRY(PERSISTENT, persistent, 128, 128, 1, 2, 6)
WGMMA_ENTRY(PERSISTENT, persistent, 128, 64, 1, 2, 8)
WGMMA_ENTRY(PERSISTENT, persistent, 256, 64, 2, 2, 4)
WGMMA_ENTRY(PINGPONG, pingpong, 128, 128, 2, 2, 6)
WGMMA_ENTRY(PINGPONG, pingpong, 128, 64, 2, 2, 8)
WGMMA_ENTRY(PINGPONG, pingpong, 64, 256, 1, 2, 4)
WGMMA_ENTRY(CLUSTER, cluster, 256, 128, 2, 2, 4)
WGMMA_ENTRY(CLUSTER, cluster, 128, 256, 1, 2, 4)
WGMMA_ENTRY(CLUSTER_A, cluster_a, 256, 128, 2, 2, 4)
