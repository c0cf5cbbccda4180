// igemm_mainloop.cuh - day 13's production kernel as templates: day 12's cp.async-pipelined mma.sync
// implicit GEMM with named tile descriptions, three input iterators, a threadblock swizzle and a
// fused epilogue. NHWC, fp16/bf16 in and out, fp32 accumulation. Day 13's entry points
// (13_igemm_production.cu) instantiate it with the fprop policies; day 14's dgrad (14_dgrad.cu)
// passes its own Rows and Filter policies (see "B from a filter with GEMM-N contiguous" below).
//
// What changed since day 12 (12_igemm_pipelined.cu: day 11's one 128 x 128 x 32 tile, one
// iterator, a plain store, fed by a ring of STAGES cp.async stages):
// 1. The same cp.async ring (prologue of STAGES - 1 commit groups, then per step
//    cp.async.wait_group STAGES-2, one __syncthreads(), the refill of slot (t - 1) % STAGES and
//    the mma.sync of slot t % STAGES; empty groups at the tail), now for any tile description, and
//    where registers allow (see FRAG_DB below) with warp fragments double-buffered too: ldmatrix
//    for slice kk + 1 of GEMM-K issues before the mma.sync of slice kk (CUTLASS's multistage
//    mainloop). Padding and out-of-range rows or channels are zero-filled by cp.async itself:
//    src-size 0 writes 16 zero bytes and reads nothing.
// 2. Tile descriptions as template parameters: block tile BM x BN x BK, WGM x WGN warps (warp
//    tile BM/WGM x BN/WGN of 16 x 8 mma tiles), STAGES; the instruction is m16n8k16. One entry
//    point per instantiated description (PIPE_ENTRIES in 13_igemm_production.cu; days/day13_igemm_production/tiles.py names them
//    and refuses the invalid ones with a reason before any launch).
// 3. Input iterators (ITER), i.e. how a thread finds the 8 GEMM-K elements of its A chunks:
//    OPTIMIZED    (C % 8 == 0, R and S <= 16) day 12's iterator, tap-major (day 09/11's vec path): per step
//                 one filter tap (r, s) and BK channels; per-row base pointers and tap masks
//                 (which filter rows and columns land inside the image) precomputed once, so a
//                 step costs a 64-bit add and one AND-and-compare per chunk (CUTLASS's optimized
//                 iterator keeps the same masks); 16-byte cp.async with zero-fill.
//    ANALYTIC     (any C) GEMM-K in flat steps of BK; each element decodes (r, s, c) from its
//                 GEMM-K index with divisions and is loaded alone (2 bytes, so no cp.async: the
//                 loads go through registers, issued before the math, stored after it).
//    FEW_CHANNELS (C <= 8, first layers such as C = 3) GEMM-K packed as ANALYTIC (no padding of
//                 each tap up to BK, which would multiply the work of a C = 3 layer by ~10),
//                 but a chunk's 8 elements are decoded with one division per chunk, then
//                 incremented (c, s, r) like an odometer.
//    B (the KRSC filter) follows the same walk: 16-byte cp.async for OPTIMIZED, element loads
//    of the contiguous row w[k][kg] otherwise.
// 4. Threadblock swizzle (CUTLASS's GemmIdentityThreadblockSwizzle): with LOG = swz_log,
//        tile_m = blockIdx.x >> LOG,   tile_n = (blockIdx.y << LOG) + (blockIdx.x & (2^LOG - 1))
//    so 2^LOG consecutive blocks share one A tile (the same pixels) across 2^LOG filter tiles,
//    and a wave of resident blocks reads each A tile from DRAM once rather than once per filter
//    tile. Grid (ceil(M/BM) << LOG, ceil(ceil(K/BN) / 2^LOG)); blocks past the last filter tile
//    return at once.
// 5. Epilogue D = act(alpha * conv(x, w) + beta * Cin + bias), act = identity or ReLU, in fp32
//    on the accumulators, rounded once to the output dtype. The tile is staged through shared
//    memory so each thread reads Cin and stores y in whole 16-byte runs of 8 channels. Cin has
//    y's shape and may be y itself (in place: each run of Cin is read by the thread that then
//    stores that run of y). bias has K elements. Both optional (nullptr).
//
// Mapping (per block, THREADS = 32 * WGM * WGN):
//   warp = tid / 32, wm = warp / WGN, wn = warp % WGN, lane = tid % 32
//   accumulator rows m0 + WTM*wm + 16*i + {lane/4, lane/4 + 8}, cols k0 + WTN*wn + 8*j + 2*(lane%4) + {0,1}
//   loads: chunk (row = tid / (BK/8) + (THREADS / (BK/8)) * u, ch = tid % (BK/8)) of A and of B
// Shared memory: STAGES * (BM + BN) * BK * 2 bytes for the ring; the output staging tile reuses
//   it: BM * (BN + 8) halves, or floats when Cin is read (dynamic shared memory = the larger).
// Shared layout: a stage row is BK halves; 16-byte chunk ch of row r sits at chunk
//   ch ^ ((r >> 1) & 3) for BK = 32 (day 11's swizzle), ch ^ (r & 7) for BK = 64: ldmatrix and
//   the cp.async stores are conflict-free (swz, in tensor_core.cuh).
// B from a filter with GEMM-N contiguous (day 14's dgrad reads w [K][R][S][C] in place, GEMM-N = C):
//   a Filter policy with B_KN = true (every fprop entry takes KrscFilter, B_KN = false) makes B's
//   stage [BK][BN], GEMM-K rows of BN/8 chunks: thread chunk (row b_k + B_ROWSTEP * u, column b_ch),
//   the policy's row(r, s, c) giving where GEMM-K row (r, s, c) starts in w; chunk ch of row r at
//   ch ^ (r & 7) (swz_trans) and B fragments by ldmatrix.trans, as in day 14's wgrad.
//
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], all fp16 or all bf16,
// groups = 1, any stride/padding/dilation/filter. OPTIMIZED needs x and w 16-byte aligned and
// R, S <= 16 (its tap masks); y is stored and Cin read 16 bytes at a time when K % 8 == 0 (both
// 16-byte aligned), element by element otherwise.
// Offsets that grow with the tensors are 64-bit; R*S*C <= 2^31 - 64 and P*Q < 2^31 (Python checks).
// sm_80+ (cp.async, ldmatrix, bf16 mma.sync; see tensor_core.cuh).
//
// Where each phase is (in file order; igemm_production, the last function, runs them in this order):
//   Tile<...>            the tile description: the template parameters and every constant derived from them
//   a_rows, b_rows       iterator set-up, all three iterators: per A chunk row its pixel's input origin and
//                        base pointers, per B chunk row whether its filter exists
//   tap_masks            iterator set-up, OPTIMIZED only: per A chunk row, the filter taps inside the image
//                        (ANALYTIC and FEW_CHANNELS need no more set-up: they decode GEMM-K in fetch)
//   OptimizedIterator    OPTIMIZED: load_async, the global -> shared load of one stage (cp.async)
//   RegisterIterator     ANALYTIC / FEW_CHANNELS: fetch (global -> registers, with each iterator's decode of
//                        GEMM-K) and store (registers -> shared), the load of one stage in two halves
//   frag_addresses       set-up of the warp's ldmatrix addresses
//   WarpFragments        load_frags, the shared -> register fragments of one 16-wide slice of GEMM-K
//                        (ldmatrix), and mma_all, that slice's mma.sync
//   pipeline_prologue    the first STAGES - 1 loads, one commit group each
//   Stage, StageRounded, StageFp32
//                        epilogue pass 1, both forms: without Cin (ReLU, rounded into halves) and with
//                        Cin (fp32)
//   igemm_production      which tile and which thread, the set-up calls, then, in its own body, the main
//                        loop ("main loop": FRAG_DB, and its frag_db_loop and plain_loop branches) and
//                        epilogue pass 2 ("epilogue, pass 2", both forms)
// The PTX wrappers (swz, smem_addr, ldsm_x4, mma16816, pack2, cp_async16, cp_commit, cp_wait) are in
// tensor_core.cuh. Every phase is __forceinline__, and the state the phases share is the kernel's
// own variables: the set-up functions fill arrays that igemm_production declares, and the iterator,
// fragment and Stage structs hold references to those variables, as lambdas capture them. In this
// form the kernel compiles to the same SASS as the single-body version it replaced (every entry,
// sm_80, sm_86, sm_89, sm_90, sm_120; CUDA 13.0). Forms that did not: the arrays grouped into
// structs, small decode structs inside fetch, pass 1 as functions taking values, and the main loop
// or pass 2 moved into a function or a lambda (the same instructions, but ptxas assigned registers
// differently). So the main loop and pass 2 stay in the kernel's body, under their own headings.
#pragma once
#include <climits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"
#include "tensor_core.cuh"


enum Iterator { ANALYTIC = 0, OPTIMIZED = 1, FEW_CHANNELS = 2 };

typedef unsigned short u16;  // one fp16/bf16 element, moved as raw bits

template <bool BF16>
__device__ __forceinline__ float to_f32(u16 v) {
    if constexpr (BF16) return __bfloat162float(__ushort_as_bfloat16(v));
    else return __half2float(__ushort_as_half(v));
}

struct Conv {
    int N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw;
};

// ---- the tile description -------------------------------------------------------------------
// The template parameters and what follows from them. Every phase is templated on one Tile
// (`class T`) and reads its constants as T::A_PER, T::MI, ...
template <int BM_, int BN_, int BK_, int WGM_, int WGN_, int STAGES_, int MINB_, int ITER_, bool BF16_,
          bool B_KN_ = false>
struct Tile {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WGM = WGM_, WGN = WGN_, STAGES = STAGES_, MINB = MINB_;
    static constexpr int ITER = ITER_;
    static constexpr bool BF16 = BF16_;
    static constexpr int THREADS = 32 * WGM * WGN, WTM = BM / WGM, WTN = BN / WGN, MI = WTM / 16, NJ = WTN / 8;
    static constexpr int CPRW = BK / 8;             // 16-byte chunks per stage row
    static constexpr int ROWSTEP = THREADS / CPRW;  // rows one pass of the block covers
    static constexpr int A_PER = BM / ROWSTEP, B_PER = BN / ROWSTEP;  // chunks per thread per stage
    static_assert(THREADS % CPRW == 0 && BM % ROWSTEP == 0 && BN % ROWSTEP == 0, "loader shape");
    static_assert(WTM % 16 == 0 && WTN % 16 == 0 && STAGES >= 2, "warp tile / stages");
    static constexpr bool ASYNC = ITER == OPTIMIZED;  // cp.async; the others stage loads in registers
    static constexpr int KK = BK / 16;                // 16-wide GEMM-K slices per stage
    static constexpr unsigned A_STAGE = BM * BK * 2, B_STAGE = BN * BK * 2;  // bytes per stage
    // B_KN: B's stage is [BK][BN] (see the header), B_PER chunks per thread all the same; a thread's
    // ldmatrix.trans bases differ per 16 columns of GEMM-N (j2), not per slice kk (frag_addresses).
    static constexpr bool B_KN = B_KN_;
    static constexpr int B_CPRW = BN / 8, B_ROWSTEP = THREADS / B_CPRW, B_FRAGS = B_KN ? NJ / 2 : KK;
    static_assert(!B_KN || (ASYNC && THREADS % B_CPRW == 0 && BK % B_ROWSTEP == 0 && B_ROWSTEP % 8 == 0), "B_KN");
};

// ---- iterator set-up, all three iterators -----------------------------------------------------
// Per A chunk row u (row row0 + ROWSTEP * u of the tile): its pixel's input origin (h0, w0) and
// image base pointer. A row past M gets h0 = INT_MIN: h0 + r*dh stays negative, so the bounds
// tests (fetch, tap_masks) mask it with no extra flag.
template <class T>
__device__ __forceinline__ void a_rows(int (&h0)[T::A_PER], int (&w0)[T::A_PER], const u16* (&xn)[T::A_PER],
                                       const u16* (&xo)[T::A_PER], const u16* __restrict__ x, const Conv& cv,
                                       idx_t m0, int row0, idx_t M) {
    constexpr int ROWSTEP = T::ROWSTEP;
    const int C = cv.C, H = cv.H, W = cv.W;
    const int PQ = cv.P * cv.Q;  // < 2^31 (checked in Python)
#pragma unroll
    for (int u = 0; u < T::A_PER; ++u) {
        const idx_t m = m0 + row0 + ROWSTEP * u;
        int n = 0, pq = 0;
        if (M <= 0x7fffffff) {  // the usual case: 32-bit division, several times cheaper than 64-bit
            n = (unsigned)m / (unsigned)PQ;
            pq = (unsigned)m - (unsigned)n * PQ;
        } else if (m < M) {
            n = (int)(m / PQ);
            pq = (int)(m % PQ);
        }
        const int p = (unsigned)pq / (unsigned)cv.Q, q = pq - p * cv.Q;  // unsigned: cheaper than signed
        h0[u] = m < M ? p * cv.sh - cv.ph : INT_MIN;
        w0[u] = q * cv.sw - cv.pw;
        xn[u] = x + (idx_t)(m < M ? n : 0) * H * W * C;  // image base (ANALYTIC / FEW_CHANNELS)
        xo[u] = xn[u] + ((idx_t)(m < M ? h0[u] : 0) * W + w0[u]) * C;  // tap (0, 0) of the pixel; read only when in
    }
}

// Per B chunk row u: filter row k0 + row0 + ROWSTEP * u, at wk + u * ROWSTEP * KG (one pointer,
// kept by the kernel); b_row[u] says whether that filter exists. B_KN: whether GEMM-N columns
// k0 + 8 * b_ch .. + 7, the same for every u, exist.
template <class T>
__device__ __forceinline__ void b_rows(bool (&b_row)[T::B_PER], int k0, int row0, int b_ch, int K) {
#pragma unroll
    for (int u = 0; u < T::B_PER; ++u) b_row[u] = T::B_KN ? k0 + 8 * b_ch < K : k0 + row0 + T::ROWSTEP * u < K;
}

// ---- iterator set-up, OPTIMIZED only ----------------------------------------------------------
// Per A chunk row, the filter taps that land inside the image, as bits: bit r for the filter rows
// r whose input row h0 + r*dh is in [0, H), bit 16 + s for the filter columns s whose input column
// w0 + s*dw is in [0, W) (R, S <= 16, checked in Python). A step's bounds test is then one AND
// against the step's (r, s) probe. A row past M has no bits. FPROP_SIZES: P and Q follow from the
// padding (fprop), so an unpadded problem needs no test; day 14's dgrad phases pass other P, Q.
template <class T, bool FPROP_SIZES = true>
__device__ __forceinline__ void tap_masks(unsigned (&amask)[T::A_PER], const int (&h0)[T::A_PER],
                                          const int (&w0)[T::A_PER], const Conv& cv, idx_t m0, int row0, idx_t M) {
    const int H = cv.H, W = cv.W, S = cv.S;
    // Bits t < len with 0 <= o + t*d < n: a run of ones when d == 1 (the usual case), a loop otherwise.
    auto span = [](int o, int n, int len, int d) -> unsigned {
        if (d == 1) {
            const int lo = max(0, -o), hi = min(len, n - o);
            return hi > lo ? (1u << hi) - (1u << lo) : 0u;
        }
        unsigned mk = 0;
#pragma unroll 1
        for (int t = 0; t < len; ++t) mk |= (unsigned)((unsigned)(o + t * d) < (unsigned)n) << t;
        return mk;
    };
    // Without padding every tap of a valid row is inside the image (fprop's P, Q are defined that way).
    const bool no_pad = FPROP_SIZES && cv.ph == 0 && cv.pw == 0;
    const unsigned full = ((1u << cv.R) - 1) | ((1u << S) - 1) << 16;
#pragma unroll
    for (int u = 0; u < T::A_PER; ++u) {
        const bool row_in = m0 + row0 + T::ROWSTEP * u < M;
        amask[u] = !row_in ? 0u
                 : no_pad ? full
                          : span(h0[u], H, cv.R, cv.dh) | span(w0[u], W, S, cv.dw) << 16;
    }
}

// ---- OPTIMIZED: the global -> shared load of one stage ------------------------------------------
// Step = (tap r, s; channels c0 .. c0 + BK), advanced after each load: R * S * ceil(C / BK) steps.
// The members are references to the kernel's variables (its set-up's results and the walk's
// position r, s, c0), like a lambda's captures.
template <class T, class Filter>
struct OptimizedIterator {
    static constexpr int A_PER = T::A_PER, B_PER = T::B_PER, ROWSTEP = T::ROWSTEP, BK = T::BK;
    // (in the order load_async first uses them)
    int& c0;
    const int &ch, &C;
    int &r, &s;
    const Conv& cv;
    const int& W;
    const unsigned &sa_u, &a_dst, &sb_u, &b_dst;  // shared byte addresses: the ring; this thread's chunk
    const u16* const (&xo)[A_PER];
    const unsigned (&amask)[A_PER];
    const u16* const& wk;
    const int& S;
    const idx_t& w_rows;
    const bool (&b_row)[B_PER];
    const Filter& filt;  // B_KN only
    const int& b_k;
    __device__ __forceinline__ void load_async(int slot) {
        const int c = c0 + 8 * ch;
        const bool c_in = c < C;
        const unsigned probe = (1u << r) | (1u << (16 + s));  // this step's tap (r, s) in the row masks
        const idx_t tap_off = ((idx_t)(r * cv.dh) * W + s * cv.dw) * C + c;  // the same for every row
        const unsigned da = sa_u + slot * T::A_STAGE + a_dst, db = sb_u + slot * T::B_STAGE + b_dst;
        // A masked-off chunk's address is never read (src-size 0), so it is not clamped.
#pragma unroll
        for (int u = 0; u < A_PER; ++u)
            cp_async16(da + ROWSTEP * BK * 2 * u, xo[u] + tap_off, c_in && (amask[u] & probe) == probe);
        if constexpr (T::B_KN) {  // GEMM-K rows c0 + b_k + B_ROWSTEP * u of tap (r, s), each with BN/8 chunks
            const u16* wt = wk + filt.row(r, s, c0 + b_k);
#pragma unroll
            for (int u = 0; u < B_PER; ++u)
                cp_async16(db + T::B_ROWSTEP * T::BN * 2 * u, wt + u * w_rows,
                           b_row[u] && c0 + b_k + T::B_ROWSTEP * u < C);
        } else {
            const u16* wt = wk + (r * S + s) * C + c;
#pragma unroll
            for (int u = 0; u < B_PER; ++u) cp_async16(db + ROWSTEP * BK * 2 * u, wt + u * w_rows, b_row[u] && c_in);
        }
        c0 += BK;
        if (c0 >= C) {
            c0 = 0;
            if (++s == S) {
                s = 0;
                ++r;
            }
        }
    }
};

// ---- ANALYTIC / FEW_CHANNELS: fetch and store of one stage ------------------------------------
// Step t covers GEMM-K indices t*BK .. t*BK + BK - 1 (packed), each thread the 8 of its chunk;
// fetched into registers (ra, rb), stored after the math: ceil(R * S * C / BK) steps. The members
// are references to the kernel's variables, like a lambda's captures.
template <class T>
struct RegisterIterator {
    static constexpr int A_PER = T::A_PER, B_PER = T::B_PER, ROWSTEP = T::ROWSTEP, BK = T::BK;
    // (in the order fetch, then store, first use them)
    const int &ch, &C, &S, &KG;
    const Conv& cv;
    const int (&h0)[A_PER];
    const int (&w0)[A_PER];
    const int &H, &W;
    u16 (&ra)[A_PER][8];
    const u16* const (&xn)[A_PER];
    u16 (&rb)[B_PER][8];
    const bool (&b_row)[B_PER];
    const u16* const& wk;
    const idx_t& w_rows;
    u16* const& sa;  // [STAGES][BM * BK]
    u16* const& sb;  // [STAGES][BN * BK]
    const int& row0;
    // Global -> registers: the 8 elements of this thread's A and B chunks of step t.
    __device__ __forceinline__ void fetch(int t) {
        const int kg0 = t * BK + 8 * ch;
        int c = 0, ss = 0, rr = 0;
        if constexpr (T::ITER == FEW_CHANNELS) {  // one decode per chunk, then an odometer
            const int tap = kg0 / C;
            c = kg0 - tap * C;
            rr = tap / S;
            ss = tap - rr * S;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int kg = kg0 + e;
            if constexpr (T::ITER == ANALYTIC) {  // every element decoded from scratch
                c = kg % C;
                ss = (kg / C) % S;
                rr = kg / (S * C);
            }
            const bool k_in = kg < KG;
            const int dy = rr * cv.dh, dx = ss * cv.dw;
#pragma unroll
            for (int u = 0; u < A_PER; ++u) {
                const int h = h0[u] + dy, ww = w0[u] + dx;
                const bool in = k_in && (unsigned)h < (unsigned)H && (unsigned)ww < (unsigned)W;
                ra[u][e] = in ? xn[u][((idx_t)h * W + ww) * C + c] : (u16)0;
            }
#pragma unroll
            for (int u = 0; u < B_PER; ++u) rb[u][e] = (b_row[u] && k_in) ? wk[u * w_rows + kg] : (u16)0;
            if constexpr (T::ITER == FEW_CHANNELS) {
                if (++c == C) {
                    c = 0;
                    if (++ss == S) {
                        ss = 0;
                        ++rr;
                    }
                }
            }
        }
    }
    // Registers -> shared: the fetched chunks into ring slot `slot`, 16 bytes each.
    __device__ __forceinline__ void store(int slot) {
        u16* da = sa + slot * T::BM * BK;
        u16* db = sb + slot * T::BN * BK;
#pragma unroll
        for (int u = 0; u < A_PER; ++u) {
            uint4 v;
            v.x = ra[u][0] | ((unsigned)ra[u][1] << 16); v.y = ra[u][2] | ((unsigned)ra[u][3] << 16);
            v.z = ra[u][4] | ((unsigned)ra[u][5] << 16); v.w = ra[u][6] | ((unsigned)ra[u][7] << 16);
            *reinterpret_cast<uint4*>(da + swz<BK>(row0 + ROWSTEP * u, ch)) = v;
        }
#pragma unroll
        for (int u = 0; u < B_PER; ++u) {
            uint4 v;
            v.x = rb[u][0] | ((unsigned)rb[u][1] << 16); v.y = rb[u][2] | ((unsigned)rb[u][3] << 16);
            v.z = rb[u][4] | ((unsigned)rb[u][5] << 16); v.w = rb[u][6] | ((unsigned)rb[u][7] << 16);
            *reinterpret_cast<uint4*>(db + swz<BK>(row0 + ROWSTEP * u, ch)) = v;
        }
    }
};

// ---- shared -> register fragments and the mma.sync of one slice -------------------------------
// ldmatrix addresses of slice kk, fragment 0, relative to a stage. A row's swizzle key uses bits
// 0..2 of the row only, and every row offset added later (16 * i, 16 * j2) is a multiple of 8, so
// each thread's addresses are one computed base plus compile-time constants.
// B_KN: ldmatrix.trans of [BK][BN]. Lane l gives row l % 8 of matrix l / 8, the matrices (GEMM-K
// 0-7 | 8-15) x (GEMM-N 0-7 | 8-15) in the order (k0, n0), (k8, n0), (k0, n8), (k8, n8): the b0,
// b1 of two fragments. Slice kk is 16 rows on (a constant); the 16 columns of j2 are chunks the
// row's key permutes, so there is one base per j2.
template <class T>
__device__ __forceinline__ void frag_addresses(unsigned (&a_frag)[T::KK], unsigned (&b_frag)[T::B_FRAGS], int wm,
                                               int wn, int lane) {
#pragma unroll
    for (int kk = 0; kk < T::KK; ++kk) {
        a_frag[kk] = 2 * swz<T::BK>(T::WTM * wm + lane % 16, 2 * kk + lane / 16);
        if constexpr (!T::B_KN)
            b_frag[kk] = 2 * swz<T::BK>(T::WTN * wn + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1));
    }
    if constexpr (T::B_KN) {
#pragma unroll
        for (int j2 = 0; j2 < T::NJ / 2; ++j2)
            b_frag[j2] = 2 * swz_trans<T::BN>(lane % 8 + 8 * ((lane >> 3) & 1), T::WTN * wn / 8 + 2 * j2 + lane / 16);
    }
}

// Warp fragments of one kk slice (16 of GEMM-K) of a stage: MI A fragments, NJ B fragments; and
// the MI x NJ mma.sync of one slice into the accumulators. References to the kernel's variables.
template <class T>
struct WarpFragments {
    static constexpr int MI = T::MI, NJ = T::NJ, BK = T::BK, KK = T::KK;
    const unsigned &sa_u, &sb_u;
    const unsigned (&a_frag)[KK];
    const unsigned (&b_frag)[T::B_FRAGS];
    float (&acc)[MI][NJ][4];
    __device__ __forceinline__ void load_frags(unsigned (&af)[MI][4], unsigned (&bf)[NJ][2], int slot, int kk) {
        const unsigned ca = sa_u + slot * T::A_STAGE + a_frag[kk],
                       cb = sb_u + slot * T::B_STAGE + (T::B_KN ? 16 * T::BN * 2 * kk : b_frag[kk]);
#pragma unroll
        for (int i = 0; i < MI; ++i) ldsm_x4(af[i], ca + 16 * BK * 2 * i);  // rows 16i + lane % 16
#pragma unroll
        for (int j2 = 0; j2 < NJ / 2; ++j2) {  // one ldmatrix.x4 = two 16(k) x 8(n) B fragments
            unsigned q[4];
            if constexpr (T::B_KN) ldsm_x4_trans(q, cb + b_frag[j2]);
            else ldsm_x4(q, cb + 16 * BK * 2 * j2);
            bf[2 * j2][0] = q[0];
            bf[2 * j2][1] = q[1];
            bf[2 * j2 + 1][0] = q[2];
            bf[2 * j2 + 1][1] = q[3];
        }
    }
    __device__ __forceinline__ void mma_all(const unsigned (&af)[MI][4], const unsigned (&bf)[NJ][2]) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NJ; ++j) mma16816<T::BF16>(acc[i][j], af[i], bf[j][0], bf[j][1]);
    }
};

// ---- the pipeline -----------------------------------------------------------------------------
// Prologue: steps 0 .. STAGES-2 into slots 0 .. STAGES-2.
template <class T, class Iter>
__device__ __forceinline__ void pipeline_prologue(Iter& it, int steps) {
#pragma unroll
    for (int st = 0; st < T::STAGES - 1; ++st) {
        if (st < steps) {
            if constexpr (T::ASYNC) {
                it.load_async(st);
            } else {
                it.fetch(st);
                it.store(st);
            }
        }
        cp_commit();  // one group per step, empty ones included, so wait_group counts steps
    }
}

// ---- epilogue: D = act(alpha * acc + beta * Cin + bias) ---------------------------------------
// Two passes through shared memory. Pass 1: each thread puts its accumulators, times alpha
// plus bias, into a staging tile. Pass 2: each thread takes 16-byte runs of 8 channels of
// one output row, so every global access (Cin reads, y stores) is 16 bytes and coalesced.
// Without Cin, pass 1 also applies ReLU and rounds: the staging tile is the output itself,
// so[BM][BN + 8] halves, and pass 2 is a copy. With Cin, the staging tile is fp32,
// sf[BM][BN + 8] floats, and pass 2 adds beta * Cin, applies ReLU and rounds once.
// The + 8 pads make pass 1's stores conflict-free (each quarter-warp covers all 32 banks).
template <class T>
struct EpilogueShape {
    static constexpr int SOW = T::BN + 8;
    static constexpr int CPR = T::BN / 8;            // 16-byte runs (8 channels) per output row
    static constexpr int RSTEP = T::THREADS / CPR;   // rows one pass of the block covers
    static constexpr int OUT_ITERS = T::BM / RSTEP;  // runs per thread
    static_assert(T::THREADS % CPR == 0 && T::BM % RSTEP == 0, "epilogue shape");
};

// Pass 1 visits every accumulator pair (v0, v1) = alpha * acc + bias with its tile row and
// column; `put` (StageRounded or StageFp32, below) stores it in the staging tile's format. The
// accumulator element (i, j, hf) sits at row st_row + 16i + 8hf, column st_col + 8j of the tile.
// The members are references to the kernel's variables, like a lambda's captures (in the order
// stage first uses them).
template <class T>
struct Stage {
    const int& k0;
    const int& st_col;
    const u16* __restrict__ const& bias;
    const int& K;
    const int& st_row;
    const float& alpha;
    float (&acc)[T::MI][T::NJ][4];
    template <class Put>
    __device__ __forceinline__ void operator()(Put&& put) {
#pragma unroll
        for (int j = 0; j < T::NJ; ++j) {
            const int k = k0 + st_col + 8 * j;  // bias of this thread's two columns of fragment column j
            const float b0 = (bias != nullptr && k < K) ? to_f32<T::BF16>(bias[k]) : 0.0f;
            const float b1 = (bias != nullptr && k + 1 < K) ? to_f32<T::BF16>(bias[k + 1]) : 0.0f;
#pragma unroll
            for (int i = 0; i < T::MI; ++i)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf)
                    put(st_row + 16 * i + 8 * hf, st_col + 8 * j, alpha * acc[i][j][2 * hf] + b0,
                        alpha * acc[i][j][2 * hf + 1] + b1);
        }
    }
};

// Pass 1 without Cin: ReLU and rounding here, into so[BM][BN + 8] halves (the output itself).
template <class T>
struct StageRounded {
    const int& relu;
    __device__ __forceinline__ void operator()(int row, int col, float v0, float v1) const {
        extern __shared__ __align__(128) u16 smem[];
        if (relu) {  // v < 0 ? 0 : v keeps a NaN a NaN, as torch.relu does (fmaxf would give 0)
            v0 = v0 < 0.0f ? 0.0f : v0;
            v1 = v1 < 0.0f ? 0.0f : v1;
        }
        *reinterpret_cast<unsigned*>(smem + row * EpilogueShape<T>::SOW + col) = pack2<T::BF16>(v0, v1);
    }
};

// Pass 1 with Cin: alpha * acc + bias in fp32, into sf[BM][BN + 8] floats; pass 2 does the rest.
template <class T>
struct StageFp32 {
    __device__ __forceinline__ void operator()(int row, int col, float v0, float v1) const {
        extern __shared__ __align__(128) u16 smem[];
        *reinterpret_cast<float2*>(reinterpret_cast<float*>(smem) + row * EpilogueShape<T>::SOW + col) =
            make_float2(v0, v1);
    }
};

// ---- where output rows go ---------------------------------------------------------------------
// FpropRows: GEMM-M row m is row m of y[M][K], and P, Q follow from the padding (fprop). Day 14's
// dgrad passes its own policy (FPROP = false, offset(m): the element offset of row m in dx), which
// also turns off Cin and the unpadded shortcut of tap_masks.
struct FpropRows {
    static constexpr bool FPROP = true;
};

// ---- where B comes from -----------------------------------------------------------------------
// KrscFilter: B row n is filter n of w [K][R][S][C], its GEMM-K (r, s, c) contiguous: the loads
// above. Day 14's dgrad passes a policy with B_KN = true and row(r, s, c), the offset in w of
// GEMM-K row (r, s, c), whose GEMM-N columns are contiguous (see the header).
struct KrscFilter {
    static constexpr bool B_KN = false;
};

// ---- the kernel: which tile, which thread; then the phases in order ---------------------------
template <int BM, int BN, int BK, int WGM, int WGN, int STAGES, int MINB, int ITER, bool BF16, class Rows = FpropRows,
          class Filter = KrscFilter>
__device__ __forceinline__ void igemm_production(const u16* __restrict__ x, const u16* __restrict__ w, u16* y,
                                                const u16* cin, const u16* __restrict__ bias, const Conv cv,
                                                float alpha, float beta, int relu, int swz_log,
                                                const Rows rows = Rows{}, const Filter filt = Filter{}) {
    using T = Tile<BM, BN, BK, WGM, WGN, STAGES, MINB, ITER, BF16, Filter::B_KN>;
    constexpr int A_PER = T::A_PER, B_PER = T::B_PER, CPRW = T::CPRW, ROWSTEP = T::ROWSTEP, KK = T::KK;
    constexpr bool ASYNC = T::ASYNC;

    extern __shared__ __align__(128) u16 smem[];
    u16* sa = smem;                     // [STAGES][BM * BK]
    u16* sb = smem + STAGES * BM * BK;  // [STAGES][BN * BK]

    // Threadblock swizzle: which output tile this block computes.
    const int tile_m = blockIdx.x >> swz_log;
    const int tile_n = (blockIdx.y << swz_log) + (blockIdx.x & ((1 << swz_log) - 1));
    if (tile_n * BN >= cv.K) return;  // past the last filter tile (whole block: before any barrier)

    const int C = cv.C, H = cv.H, W = cv.W, K = cv.K, S = cv.S;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / WGN, wn = warp % WGN;
    const idx_t M = (idx_t)cv.N * cv.P * cv.Q;
    const int KG = cv.R * S * C;
    const idx_t m0 = (idx_t)tile_m * BM;
    const int k0 = tile_n * BN;
    const int ch = tid % CPRW, row0 = tid / CPRW;

    // ---- iterator set-up (a_rows, tap_masks, b_rows) and the shared-memory addresses
    int h0[A_PER], w0[A_PER];
    const u16* xn[A_PER];
    const u16* xo[A_PER];
    a_rows<T>(h0, w0, xn, xo, x, cv, m0, row0, M);
    unsigned amask[A_PER];
    if constexpr (ASYNC) tap_masks<T, Rows::FPROP>(amask, h0, w0, cv, m0, row0, M);
    const int b_ch = tid % T::B_CPRW, b_k = tid / T::B_CPRW;  // B_KN: this thread's B chunk column, first row
    const u16* wk;  // B chunk 0 at step 0 (B_KN: its GEMM-N column; the step adds filt.row); chunk u at + u * w_rows
    idx_t w_rows;
    if constexpr (T::B_KN) {
        wk = w + k0 + 8 * b_ch;
        w_rows = filt.row(0, 0, T::B_ROWSTEP) - filt.row(0, 0, 0);
    } else {
        wk = w + (idx_t)(k0 + row0) * KG;
        w_rows = (idx_t)ROWSTEP * KG;
    }
    bool b_row[B_PER];
    b_rows<T>(b_row, k0, row0, b_ch, K);
    // Shared-memory byte addresses; the cp.async destinations of this thread's chunks are
    // a_dst + ROWSTEP*BK*2*u (and b_dst + ...) within a stage.
    const unsigned sa_u = smem_addr(sa), sb_u = smem_addr(sb);
    const unsigned a_dst = 2 * swz<BK>(row0, ch);
    unsigned b_dst = 2 * swz<BK>(row0, ch);
    if constexpr (T::B_KN) b_dst = 2 * swz_trans<BN>(b_k, b_ch);
    unsigned a_frag[KK], b_frag[T::B_FRAGS];
    frag_addresses<T>(a_frag, b_frag, wm, wn, lane);

    // The iterators and the fragments: views of the variables above (both iterators are built in
    // every instantiation, as lambdas would be; the one of this ITER runs).
    int r = 0, s = 0, c0 = 0;  // OPTIMIZED: the walk's position, advanced by load_async
    const int steps = ASYNC ? cv.R * S * CEIL_DIV(C, BK) : CEIL_DIV(KG, BK);
    OptimizedIterator<T, Filter> opt{c0, ch, C, r, s, cv, W, sa_u, a_dst, sb_u, b_dst, xo, amask, wk, S, w_rows,
                                     b_row, filt, b_k};
    u16 ra[A_PER][8], rb[B_PER][8];  // ANALYTIC / FEW_CHANNELS: one step's chunks between fetch and store
    RegisterIterator<T> reg{ch, C, S, KG, cv, h0, w0, H, W, ra, xn, rb, b_row, wk, w_rows, sa, sb, row0};

    float acc[T::MI][T::NJ][4];
#pragma unroll
    for (int i = 0; i < T::MI; ++i)
#pragma unroll
        for (int j = 0; j < T::NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    WarpFragments<T> frags{sa_u, sb_u, a_frag, b_frag, acc};

    // ---- pipeline prologue
    if constexpr (ASYNC) pipeline_prologue<T>(opt, steps);
    else pipeline_prologue<T>(reg, steps);

    // ---- main loop: FRAG_DB, then frag_db_loop or plain_loop. It stays in this body: as a
    // function (or a lambda) it compiled to the same instructions with a different register
    // assignment (see the header).
    constexpr int THREADS = T::THREADS, MI = T::MI, NJ = T::NJ;
    // Fragment double buffering needs a second set of fragments in registers: it runs where the
    // warp tile leaves room (<= 64 accumulators per thread, warp tiles up to 64 x 32) under a
    // register cap of at least 160, and on 64 x 64 warp tiles when __launch_bounds__ leaves the
    // full 255 registers and each thread loads at most 16 chunk rows per stage (128 accumulators
    // + 64 fragment registers + 3 registers per A row fit). Elsewhere the second set would spill
    // (the 8-warp tiles held to 128 registers for 2 blocks per SM): those run the plain loop.
    constexpr int REG_CAP = 65536 / (THREADS * MINB);
    constexpr bool FRAG_DB = ASYNC && ((MI * NJ * 4 <= 64 && REG_CAP >= 160) || (REG_CAP >= 255 && A_PER + B_PER <= 16));
    if constexpr (FRAG_DB) {
        // frag_db_loop, CUTLASS's multistage mainloop: the fragments of slice kk + 1 are read from
        // shared memory while the mma.sync of slice kk run; the wait and barrier for step t + 1 come
        // before the last slice's mma, so step t + 1's first fragments load under them too.
        unsigned af[2][MI][4], bf[2][NJ][2];
        cp_wait<STAGES - 2>();
        __syncthreads();
        if (steps > 0) frags.load_frags(af[0], bf[0], 0, 0);
        for (int t = 0; t < steps; ++t) {
            const int next = t + STAGES - 1;  // its slot (t - 1) % STAGES: every warp left it before the last barrier
            if (next < steps) opt.load_async(next % STAGES);
            cp_commit();
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                if (kk == KK - 1) {
                    cp_wait<STAGES - 2>();  // step t + 1 has landed ...
                    __syncthreads();        // ... for everyone, and everyone has its last fragments of step t
                }
                if (kk < KK - 1) frags.load_frags(af[(kk + 1) % 2], bf[(kk + 1) % 2], t % STAGES, kk + 1);
                else if (t + 1 < steps) frags.load_frags(af[(kk + 1) % 2], bf[(kk + 1) % 2], (t + 1) % STAGES, 0);
                frags.mma_all(af[kk % 2], bf[kk % 2]);
            }
        }
    } else {
        // plain_loop: per step one wait and one barrier, the refill of the slot every warp left at
        // step t - 1, then the step's slices (ldmatrix, mma.sync).
        for (int t = 0; t < steps; ++t) {
            cp_wait<STAGES - 2>();  // this thread's copies of step t have landed ...
            __syncthreads();        // ... and everyone's; slot (t - 1) % STAGES is free again
            const int next = t + STAGES - 1;
            if (next < steps) {
                if constexpr (ASYNC) opt.load_async(next % STAGES);
                else reg.fetch(next);  // global loads in flight during the math below
            }
            cp_commit();
#pragma unroll
            for (int kk = 0; kk < KK; ++kk) {
                unsigned af[MI][4], bf[NJ][2];
                frags.load_frags(af, bf, t % STAGES, kk);
                frags.mma_all(af, bf);
            }
            if constexpr (!ASYNC) {
                if (next < steps) reg.store(next % STAGES);
            }
        }
    }
    cp_wait<0>();
    __syncthreads();  // every warp is done with the ring: reuse it for the output tile

    // ---- epilogue, pass 1: Stage, with StageRounded (without Cin) or StageFp32 (with Cin)
    const bool with_c = Rows::FPROP && cin != nullptr && beta != 0.0f;
    // The accumulator element (i, j, hf) sits at row WTM*wm + 16i + lane/4 + 8hf, column
    // WTN*wn + 8j + 2*(lane%4) of the tile: one base offset plus compile-time constants.
    const int st_row = T::WTM * wm + lane / 4, st_col = T::WTN * wn + 2 * (lane % 4);
    Stage<T> stage{k0, st_col, bias, K, st_row, alpha, acc};
    if (!with_c) {
        stage(StageRounded<T>{relu});
    } else {
        stage(StageFp32<T>{});
    }
    __syncthreads();

    // ---- epilogue, pass 2: thread tid takes run cc = tid % CPR of rows tid / CPR + RSTEP * it; a
    // copy without Cin, and with Cin the staged fp32 values plus beta * Cin, ReLU, rounded once.
    // It stays in this body for the same reason as the main loop.
    constexpr int SOW = EpilogueShape<T>::SOW, CPR = EpilogueShape<T>::CPR, RSTEP = EpilogueShape<T>::RSTEP;
    constexpr int OUT_ITERS = EpilogueShape<T>::OUT_ITERS;
    const int cc = tid % CPR, orow = tid / CPR, k = k0 + 8 * cc;
    if (k >= K) return;  // no barrier follows
    const bool vec = K % 8 == 0;  // whole 16-byte runs, 16-byte aligned (y and Cin checked in Python)
    const idx_t m_first = m0 + orow;
    u16* dst = y + m_first * K + k;
    const u16* cs = with_c ? cin + m_first * K + k : nullptr;
    const idx_t row_step = (idx_t)RSTEP * K;
#pragma unroll 4
    for (int it = 0; it < OUT_ITERS; ++it) {
        const int row = orow + RSTEP * it;
        if (m_first + RSTEP * it >= M) break;  // rows only grow with it
        if constexpr (!Rows::FPROP) dst = y + rows.offset(m_first + RSTEP * it) + k;
        uint4 out;
        u16* o = reinterpret_cast<u16*>(&out);
        if (!with_c) {
            out = *reinterpret_cast<const uint4*>(smem + row * SOW + 8 * cc);
        } else {
            const float* src = reinterpret_cast<const float*>(smem) + row * SOW + 8 * cc;
            const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
            float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            uint4 craw;
            const u16* cr = reinterpret_cast<const u16*>(&craw);
            if (vec) {
                craw = *reinterpret_cast<const uint4*>(cs);
            } else {
                u16 ce[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) ce[e] = k + e < K ? cs[e] : (u16)0;
                craw = make_uint4(ce[0] | (unsigned)ce[1] << 16, ce[2] | (unsigned)ce[3] << 16,
                                  ce[4] | (unsigned)ce[5] << 16, ce[6] | (unsigned)ce[7] << 16);
            }
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                float v0 = v[e] + beta * to_f32<BF16>(cr[e]), v1 = v[e + 1] + beta * to_f32<BF16>(cr[e + 1]);
                if (relu) {
                    v0 = v0 < 0.0f ? 0.0f : v0;
                    v1 = v1 < 0.0f ? 0.0f : v1;
                }
                reinterpret_cast<unsigned*>(&out)[e / 2] = pack2<BF16>(v0, v1);
            }
            cs += row_step;
        }
        if (vec) {
            *reinterpret_cast<uint4*>(dst) = out;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (k + e < K) dst[e] = o[e];
        }
        dst += row_step;
    }
}
