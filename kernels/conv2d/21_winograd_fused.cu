// Day 21 - winograd_f2_fused, winograd_f4_fused: Winograd F(m x m, 3 x 3) on CUDA cores,
// fp32, with the input transform, the n^2 GEMMs and the output transform in ONE kernel: no
// workspace for V or M.
//
// What changed since day 20 (20_winograd.cu): the pipeline wrote V (n^2 x C x tiles floats) and M
// (n^2 x K x tiles) to DRAM and read them back, once each; here a block keeps its tiles' V in
// shared memory for one chunk of channels and its M in registers for the whole reduction. Only the
// filter transform stays a launch of its own (U = G g G^T is the same for every tile: computed once
// per run into a small workspace, then read by every block from L2). The transforms are day 20's
// (winograd_transforms.cuh, the same fmaf chains), so each output is computed by the same sequence
// of roundings as in the pipeline, and `winograd_model(m)` bounds it unchanged (see Rounding).
//
// The launches of a run:
//   winof_filter_<layout>  w -> Ub, the blocked U (below): grid-stride loop, 256-thread blocks
//   winof_main_<layout>    x, Ub -> y: one block per (tile block, filter block), 1-D grid
//
// Compile-time parameters (-D, from days/day21_winograd_fused.py `fused_defines`; required):
//   WINO_M, WINO_AT, WINO_G, WINO_BT  the transforms (winograd_transforms.cuh)
//   WINOF_BT  Winograd tiles per block        (F(2): 32, F(4): 16)
//   WINOF_BK  filters per block               (32)
//   WINOF_BC  channels per chunk of the loop  (F(2): 8, F(4): 4)
// Derived: n = m + 2, NPOS = n^2 transform positions; register tile TT = BT / 8 tiles x TK = 4
// filters; 64 threads (8 x 8 register tiles) cover BT x BK for one position, so the 256 threads
// form PG = 4 position groups and a thread owns NP = NPOS / 4 positions (F(2): 4, F(4): 9):
// NP x TT x TK accumulators (F(2): 4 x 4 x 4 = 64, F(4): 9 x 2 x 4 = 72).
//
// Tiles: t = (n * tP + th) * tQ + tw as in the pipeline (tP = ceil(P / m), tQ = ceil(Q / m),
// T = N tP tQ); tile t reads the n x n patch at rows th*m - pad_h .., columns tw*m - pad_w ..,
// zeros outside the image, and writes the pixels of its m x m tile inside P x Q.
// Grid: blockIdx.x = tb * kblocks + kb (the filter blocks of one tile block are neighbours: they read
// the same patches of x, from L2), tiles t0 = tb * BT .., filters k0 = kb * BK ..; 256 threads.
//
// The blocked U (the workspace, written by winof_filter_<layout>, the same for both layouts):
//   Ub[kb][ch][pos][c][k'] = U[pos](k = kb * BK + k', channel = ch * BC + c), zeros past K and C,
// so one block's U for one chunk is NPOS * BC * BK consecutive floats, copied as it is into
// shared memory (float2 loads, coalesced).
//
// The main loop, per chunk ch of BC channels (c0 = ch * BC):
//   0. U chunk global -> registers (float2s; in flight during 1-2)
//   1. columns: job (tile, c, b) loads column b of its patch (n floats of x) and computes
//      col = B^T d[:, b] (mul_left, one column) into the staging array st (shared).
//      NCHW: b fastest, then tile, then c (a warp reads neighbouring columns of a row: along W);
//      NHWC: c fastest, then b, then tile (a warp reads BC consecutive channels of a pixel: along C).
//   2. rows: job (tile, c, i) reads row i of st and computes v = row B (mul_right_t, one row) into
//      sv[i n + j][c][tile] (tile fastest: conflict-free stores).
//   3. U registers -> su[pos][c][k] (st's space: st is dead after 2).
//   4. GEMM: for c < BC, for each of its NP positions pos = pg + 4 j: the thread's TT x TK outer
//      product acc[j][.][.] += sv[pos][c][tt*TT ..] x su[pos][c][tk*TK ..] (fmaf, c ascending).
//   __syncthreads between the steps (4 per chunk).
// The epilogue, per piece s of KS = 8 filters (BK / KS pieces): the threads whose TK filters lie in
// the piece store their accumulators into sm[pos][pair] (the main loop's space); then each pair
// (tile, filter) of the piece (BT * KS of them: 256 for F(2), 128 for F(4)) reads its n^2 values,
// computes y = A^T M A (output_tile) and writes its pixels inside P x Q. pair = kk * BT + tile
// (NCHW: neighbouring threads write neighbouring tiles of a row) or tile * KS + kk (NHWC: 8
// consecutive filters of a pixel).
//
// Shared memory (static, one union, at most 48 KB): the main loop's sv (NPOS*BC*BT floats) and, in
// the same space, st (n*BC*TCS) then su (NPOS*BC*BK); the epilogue's sm (NPOS*BT*KS) over all of it.
// st's pitches: a row of a (c, tile) is n + 1 floats (the row jobs' reads, tile fastest, hit
// distinct banks), a channel TCS = BT (n + 1) + pad floats with TCS = n (mod 32), which makes the
// column jobs' stores conflict-free for F(2) NHWC only; F(2) NCHW and F(4) in both layouts store
// 2-way (counted per warp by a review, not measured; speed only).
//   F(2): 16*8*32 + max(16*8*32, 4*8*164) floats = 37,376 B;  F(4): 36*4*16 + 36*4*32 = 27,648 B.
//
// Registers (-Xptxas -v, CUDA 13.0, __launch_bounds__(256, 2): at most 128), main kernel, no spills,
// no stack on sm_75, 80, 86, 89, 90, 120: F(2) 113-123, F(4) 124-128 (the NP x TT x TK accumulators
// are live through the whole loop; the channel loop of the GEMM step is kept rolled, `#pragma unroll 1`,
// and the epilogue's A^T M A streams one column of M at a time, or F(4) spills a few bytes).
// F(6) (64 positions) is not offered: the tiles tried (8 x 32 x 4, 8 x 16 x 4) spill at 128 registers.
//
// Rounding: every accumulator is one chain of fmaf over the channels c = 0, 1, ... in ascending
// order, starting from 0 (chunks in order, channels in order within a chunk; channels past C add
// fmaf(0, 0, acc)), the transforms the pipeline's: the same operations in the same order as the
// pipeline's M = U V and y = A^T M A, so the same `rounding_depth`. Nothing depends on the block
// or grid: two runs agree bit for bit, and an image alone agrees with the same image in a batch.
// (tests/test_winograd_host.py runs this file's code on CPU threads, with the C library's fmaf: its y
// equals 20_winograd.cu's, run the same way, bit for bit.)
//
// Assumes: stride 1, dilation 1, groups 1, a 3 x 3 filter, fp32; NCHW x [N][C][H][W], KCRS w,
// NCHW y [N][K][P][Q], or NHWC x [N][H][W][C], KRSC w [K][3][3][C], NHWC y [N][P][Q][K]; any
// padding, H, W, C, K. The workspace 8-byte aligned. Offsets into x, y and Ub are 64-bit; T + BT,
// the grid and the tiles' coordinates fit their ints (days/day21_winograd_fused.py refuses what does not).
#include "winograd_transforms.cuh"  // WM, WN, MatBT, MatG, mul_left, mul_right_t, filter_tile, output_tile, TileOrigin

#if !defined(WINOF_BT) || !defined(WINOF_BK) || !defined(WINOF_BC)
#error "WINOF_BT, WINOF_BK and WINOF_BC (the block tile: days/day21_winograd_fused.py, fused_defines) must be defined"
#endif

// WINOF_SKIP (optional, default 0): a timing experiment (day 21, section 5), never a result. Each set bit
// leaves one step of the main loop out, so the main kernel's time without it can be set beside its
// whole time: 1 = the input stage (steps 1 and 2: x's loads and the input transform), 2 = U's copy
// (steps 0 and 3), 4 = the GEMM (step 4). The barriers stay; the output is wrong (never checked).
#ifndef WINOF_SKIP
#define WINOF_SKIP 0
#endif
constexpr bool SKIP_INPUT = WINOF_SKIP & 1, SKIP_U = WINOF_SKIP & 2, SKIP_GEMM = WINOF_SKIP & 4;

constexpr int F_THREADS = 256;
constexpr int BT = WINOF_BT, BK = WINOF_BK, BC = WINOF_BC;
constexpr int NPOS = WN * WN;              // transform positions
constexpr int TT = BT / 8, TK = 4;         // a thread's register tile: TT tiles x TK filters
constexpr int GROUP = (BT / TT) * (BK / TK);  // threads that cover BT x BK for one position
constexpr int PG = F_THREADS / GROUP;      // position groups
constexpr int NP = NPOS / PG;              // positions per thread
constexpr int KS = 8;                      // filters per piece of the epilogue
constexpr int TROW = WN + 1;               // st: pitch of one (c, tile) row
constexpr int TCS = BT * TROW + ((WN - BT * TROW) % 32 + 32) % 32;  // st: pitch of a channel, = n (mod 32)
constexpr int UCHUNK = NPOS * BC * BK;     // floats of one block's U for one chunk
constexpr int U_VEC = UCHUNK / (2 * F_THREADS);  // float2s per thread
constexpr int NPAIR = BT * KS;             // (tile, filter) pairs of one piece

static_assert(BT % 8 == 0 && (TT == 1 || TT == 2 || TT == 4), "BT must be 8, 16 or 32");
static_assert(BK % KS == 0 && KS % TK == 0, "BK must be a multiple of 8");
static_assert(F_THREADS % GROUP == 0 && NPOS % PG == 0, "the position groups must divide the positions");
static_assert(UCHUNK % (2 * F_THREADS) == 0, "a U chunk must split into whole float2s per thread");

// The block's shared memory: the main loop's V and (st, then U), or the epilogue's M pieces.
union StageOrU {
    float t[WN][BC][TCS];    // step 1 -> 2: the columns' B^T d
    float u[NPOS][BC][BK];   // step 3 -> 4: the chunk's U
};
struct MainLoopSmem {
    float v[NPOS][BC][BT];   // step 2 -> 4: the chunk's V
    StageOrU su;
};
union FusedSmem {
    MainLoopSmem loop;
    float m[NPOS][NPAIR];    // the epilogue: one piece of M
};
static_assert(sizeof(FusedSmem) <= 48 * 1024, "static shared memory is limited to 48 KB");

// ---- the filter transform into the blocked U ------------------------------------------------------

// Element i = ((kb * chunks + ch) * BC + c) * BK + k' (k' fastest: a warp writes consecutive floats of
// each position's plane); filter k = kb BK + k', channel ch BC + c; zeros past K or C.
template <bool NHWC>
__device__ __forceinline__ void filter_blocked(const float* __restrict__ w, float* __restrict__ Ub, int K, int C,
                                               int kblocks, int chunks) {
    const idx_t total = (idx_t)kblocks * chunks * BC * BK;
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (idx_t)gridDim.x * blockDim.x) {
        const int kq = (int)(i % BK), c = (int)(i / BK % BC);
        const idx_t blk = i / (BK * BC);  // kb * chunks + ch
        const int ch = (int)(blk % chunks), kb = (int)(blk / chunks);
        const int k = kb * BK + kq, cg = ch * BC + c;
        const bool in = k < K && cg < C;
        float g[WR][WR];
#pragma unroll
        for (int r = 0; r < WR; ++r)
#pragma unroll
            for (int s = 0; s < WR; ++s) {
                const idx_t off = NHWC ? ((idx_t)k * WR * WR + r * WR + s) * C + cg : (((idx_t)k * C + cg) * WR + r) * WR + s;
                g[r][s] = in ? w[off] : 0.0f;
            }
        float u[WN][WN];
        filter_tile(g, u);
        float* dst = Ub + blk * UCHUNK + c * BK + kq;
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) dst[(xi * WN + nu) * BC * BK] = u[xi][nu];
    }
}

extern "C" __global__ void __launch_bounds__(F_THREADS)
    winof_filter_nchw(const float* __restrict__ w, float* __restrict__ Ub, int K, int C, int kblocks, int chunks) {
    filter_blocked<false>(w, Ub, K, C, kblocks, chunks);
}

extern "C" __global__ void __launch_bounds__(F_THREADS)
    winof_filter_nhwc(const float* __restrict__ w, float* __restrict__ Ub, int K, int C, int kblocks, int chunks) {
    filter_blocked<true>(w, Ub, K, C, kblocks, chunks);
}

// ---- the fused main kernel: its phases -------------------------------------------------------------

// The problem as the main kernel sees it.
struct FusedShape {
    int N, C, H, W, K, P, Q, pad_h, pad_w, tP, tQ, T;
};

// Step 1: column b of the patch of (tile, c), B^T applied, into st.
template <bool NHWC>
__device__ __forceinline__ void input_columns(const float* __restrict__ x, const FusedShape& s, int t0, int c0,
                                              FusedSmem& sm) {
    constexpr int JOBS = BT * BC * WN;
#pragma unroll 1
    for (int j = threadIdx.x; j < JOBS; j += F_THREADS) {
        int b, tile, c;
        if (NHWC) {
            c = j % BC; b = j / BC % WN; tile = j / (BC * WN);
        } else {
            b = j % WN; tile = j / WN % BT; c = j / (WN * BT);
        }
        const int t = t0 + tile, cg = c0 + c;
        const bool in = t < s.T && cg < s.C;
        const TileOrigin o(in ? t : 0, s.tP, s.tQ, s.pad_h, s.pad_w);
        const int ww = o.w0 + b;
        const bool col_in = in && ww >= 0 && ww < s.W;
        // the column's pixel in row 0 of the image, and the step from one row to the next
        const idx_t row0 = NHWC ? ((idx_t)o.n * s.H * s.W + ww) * s.C + cg : ((idx_t)o.n * s.C + cg) * s.H * s.W + ww;
        const idx_t pitch = NHWC ? (idx_t)s.W * s.C : (idx_t)s.W;
        float d[WN][1];
#pragma unroll
        for (int a = 0; a < WN; ++a) {
            const int h = o.h0 + a;
            d[a][0] = col_in && h >= 0 && h < s.H ? x[row0 + h * pitch] : 0.0f;
        }
        float col[WN][1];
        mul_left<MatBT>(d, col);
#pragma unroll
        for (int i = 0; i < WN; ++i) sm.loop.su.t[i][c][tile * TROW + b] = col[i][0];
    }
}

// Step 2: row i of (tile, c)'s B^T d, times B, into V.
__device__ __forceinline__ void input_rows(FusedSmem& sm) {
    constexpr int JOBS = BT * BC * WN;
#pragma unroll 1
    for (int j = threadIdx.x; j < JOBS; j += F_THREADS) {
        const int tile = j % BT, c = j / BT % BC, i = j / (BT * BC);
        float row[1][WN];
#pragma unroll
        for (int l = 0; l < WN; ++l) row[0][l] = sm.loop.su.t[i][c][tile * TROW + l];
        float v[1][WN];
        mul_right_t<MatBT>(row, v);
#pragma unroll
        for (int jj = 0; jj < WN; ++jj) sm.loop.v[i * WN + jj][c][tile] = v[0][jj];
    }
}

// Steps 0 and 3: the chunk's U, global -> registers -> shared, one float2 per thread and round.
struct UChunk {
    float2 r[U_VEC];
    __device__ __forceinline__ void fetch(const float* __restrict__ src) {
        const float2* s2 = reinterpret_cast<const float2*>(src);
#pragma unroll
        for (int q = 0; q < U_VEC; ++q) r[q] = s2[q * F_THREADS + threadIdx.x];
    }
    __device__ __forceinline__ void put(FusedSmem& sm) const {
        float2* d2 = reinterpret_cast<float2*>(&sm.loop.su.u[0][0][0]);
#pragma unroll
        for (int q = 0; q < U_VEC; ++q) d2[q * F_THREADS + threadIdx.x] = r[q];
    }
};

template <int L>
__device__ __forceinline__ void load_row(const float* p, float (&out)[L]) {
    if constexpr (L == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else if constexpr (L == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        out[0] = v.x; out[1] = v.y;
    } else {
        out[0] = p[0];
    }
}

// The thread's place in the GEMM: position group pg, tile column tt, filter column tk.
struct GemmThread {
    int pg, tt, tk;
    __device__ __forceinline__ GemmThread() {
        const int g = threadIdx.x % GROUP;
        pg = threadIdx.x / GROUP;
        tt = g % (BT / TT);
        tk = g / (BT / TT);
    }
};

// Step 4: the chunk's BC channels into the accumulators, c ascending.
__device__ __forceinline__ void gemm_chunk(const FusedSmem& sm, const GemmThread& th, float (&acc)[NP][TT][TK]) {
#pragma unroll 1
    for (int c = 0; c < BC; ++c)
#pragma unroll
        for (int j = 0; j < NP; ++j) {
            const int pos = th.pg + PG * j;
            float a[TT], b[TK];
            load_row(&sm.loop.v[pos][c][th.tt * TT], a);
            load_row(&sm.loop.su.u[pos][c][th.tk * TK], b);
#pragma unroll
            for (int i1 = 0; i1 < TT; ++i1)
#pragma unroll
                for (int i2 = 0; i2 < TK; ++i2) acc[j][i1][i2] = fmaf(a[i1], b[i2], acc[j][i1][i2]);
        }
}

template <bool NHWC>
__device__ __forceinline__ int pair_of(int tile, int kk) {
    return NHWC ? tile * KS + kk : kk * BT + tile;
}

// The epilogue: per piece of KS filters, M through shared memory, y = A^T M A, the pixels inside P x Q.
template <bool NHWC>
__device__ __forceinline__ void output_pieces(float* __restrict__ y, const FusedShape& s, int t0, int k0,
                                              const GemmThread& th, const float (&acc)[NP][TT][TK],
                                              FusedSmem& sm) {
#pragma unroll 1
    for (int piece = 0; piece < BK / KS; ++piece) {
        __syncthreads();  // the GEMM, or the previous piece's readers, are done with the space
        if (th.tk * TK / KS == piece) {
#pragma unroll
            for (int j = 0; j < NP; ++j)
#pragma unroll
                for (int i1 = 0; i1 < TT; ++i1)
#pragma unroll
                    for (int i2 = 0; i2 < TK; ++i2)
                        sm.m[th.pg + PG * j][pair_of<NHWC>(th.tt * TT + i1, th.tk * TK + i2 - piece * KS)] =
                            acc[j][i1][i2];
        }
        __syncthreads();
#pragma unroll 1
        for (int pair = threadIdx.x; pair < NPAIR; pair += F_THREADS) {
            const int tile = NHWC ? pair / KS : pair % BT, kk = NHWC ? pair % KS : pair / BT;
            const int t = t0 + tile, k = k0 + piece * KS + kk;
            if (t >= s.T || k >= s.K) continue;
            // output_tile's A^T M A, one column of M, then one row of A^T M at a time (the same
            // fmaf chains as output_tile's mul_left and mul_right_t; fewer values live beside acc)
            float am[WM][WN];
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) {
                float mcol[WN][1], amcol[WM][1];
#pragma unroll
                for (int xi = 0; xi < WN; ++xi) mcol[xi][0] = sm.m[xi * WN + nu][pair];
                mul_left<MatAT>(mcol, amcol);
#pragma unroll
                for (int a = 0; a < WM; ++a) am[a][nu] = amcol[a][0];
            }
            const TileOrigin o(t, s.tP, s.tQ, 0, 0);  // (h0, w0): the tile's first output pixel
#pragma unroll
            for (int a = 0; a < WM; ++a) {
                float yrow[1][WM];
                mul_right_t<MatAT>(reinterpret_cast<const float(&)[1][WN]>(am[a]), yrow);
                const int p = o.h0 + a;
#pragma unroll
                for (int b = 0; b < WM; ++b) {
                    const int q = o.w0 + b;
                    if (p < s.P && q < s.Q) {
                        const idx_t off = NHWC ? (((idx_t)o.n * s.P + p) * s.Q + q) * s.K + k
                                               : (((idx_t)o.n * s.K + k) * s.P + p) * s.Q + q;
                        y[off] = yrow[0][b];
                    }
                }
            }
        }
    }
}

template <bool NHWC>
__device__ __forceinline__ void fused_main(const float* __restrict__ x, const float* __restrict__ Ub,
                                           float* __restrict__ y, const FusedShape& s, int kblocks) {
    __shared__ __align__(16) FusedSmem sm;
    const int kb = blockIdx.x % kblocks, tb = blockIdx.x / kblocks;
    const int t0 = tb * BT, k0 = kb * BK;
    const int chunks = CEIL_DIV(s.C, BC);
    const GemmThread th;
    float acc[NP][TT][TK];
#pragma unroll
    for (int j = 0; j < NP; ++j)
#pragma unroll
        for (int i1 = 0; i1 < TT; ++i1)
#pragma unroll
            for (int i2 = 0; i2 < TK; ++i2) acc[j][i1][i2] = 0.0f;

    const float* ub = Ub + (idx_t)kb * chunks * UCHUNK;
    UChunk uc;
#pragma unroll 1
    for (int ch = 0; ch < chunks; ++ch) {
        if constexpr (!SKIP_U) uc.fetch(ub + (idx_t)ch * UCHUNK);  // 0: in flight during 1 and 2
        if constexpr (!SKIP_INPUT) input_columns<NHWC>(x, s, t0, ch * BC, sm);  // 1
        __syncthreads();
        if constexpr (!SKIP_INPUT) input_rows(sm);  // 2
        __syncthreads();
        if constexpr (!SKIP_U) uc.put(sm);  // 3
        __syncthreads();
        if constexpr (!SKIP_GEMM) gemm_chunk(sm, th, acc);  // 4
        __syncthreads();
    }
    output_pieces<NHWC>(y, s, t0, k0, th, acc, sm);
}

// MINB 2: at most 128 registers, two blocks of 256 threads per SM.
#define WINOF_MAIN_ENTRY(NAME, NHWC)                                                                        \
    extern "C" __global__ void __launch_bounds__(F_THREADS, 2)                                             \
        NAME(const float* __restrict__ x, const float* __restrict__ Ub, float* __restrict__ y, int N, int C, \
             int H, int W, int K, int P, int Q, int pad_h, int pad_w, int tP, int tQ, int kblocks) {         \
        const FusedShape s{N, C, H, W, K, P, Q, pad_h, pad_w, tP, tQ, N * tP * tQ};                         \
        fused_main<NHWC>(x, Ub, y, s, kblocks);                                                             \
    }

WINOF_MAIN_ENTRY(winof_main_nchw, false)
WINOF_MAIN_ENTRY(winof_main_nhwc, true)
