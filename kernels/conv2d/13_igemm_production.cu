// Day 13 - igemm_production: the entry points of day 13's production kernel, one per (tile
// description, iterator, dtype). The kernel itself, day 12's cp.async-pipelined mma.sync implicit
// GEMM with named tile descriptions, three input iterators, a threadblock swizzle and a fused
// epilogue, is igemm_mainloop.cuh (its header comment walks the mapping and the phases); this file
// instantiates it with the fprop policies (FpropRows, KrscFilter). NHWC x [N][H][W][C], KRSC w
// [K][R][S][C], NHWC y [N][P][Q][K], fp16/bf16 in and out, fp32 accumulation; sm_80+.
#include "igemm_mainloop.cuh"

// One entry point per (tile description, iterator, dtype):
//   igemm_production_<BM>x<BN>x<BK>_w<WGM>x<WGN>_s<STAGES>_b<MINB>_<iterator>_<fp16|bf16>
// MINB is __launch_bounds__'s minimum number of resident blocks per SM: ptxas then keeps the
// kernel within 65536 / (THREADS * MINB) registers per thread (occupancy traded for registers).
// Arguments: x, w, y, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw, cin, bias, alpha, beta,
// relu, swz_log. THREADS = 32 * WGM * WGN.
#define PIPE_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, BF16, DT)                                  \
    extern "C" __global__ void __launch_bounds__(32 * WGM * WGN, MINB)                                         \
        igemm_production_##BM##x##BN##x##BK##_w##WGM##x##WGN##_s##ST##_b##MINB##_##ITNAME##_##DT(              \
            const u16* __restrict__ x, const u16* __restrict__ w, u16* y, int N, int C, int H, int W, int K,  \
            int R, int S, int P, int Q, int sh, int sw, int ph, int pw, int dh, int dw, const u16* cin,        \
            const u16* __restrict__ bias, float alpha, float beta, int relu, int swz_log) {                    \
        igemm_production<BM, BN, BK, WGM, WGN, ST, MINB, ITER, BF16>(                                                 \
            x, w, y, cin, bias, Conv{N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw}, alpha, beta, relu,   \
            swz_log);                                                                                          \
    }
#define PIPE_ENTRY(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME)               \
    PIPE_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, false, fp16) \
    PIPE_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, true, bf16)

// One tile alone, for day 15's tuner: -DPIPE_TUNE_BM=.. -DPIPE_TUNE_BN=.. (and _BK, _WGM, _WGN,
// _ST, _MINB, _BF16 = 0 or 1) builds only that optimized tile in one dtype, named as the entries
// below, so each candidate of a search compiles in seconds and many compile at once. (PIPE_TUNE
// passes the values through one more macro so they are expanded before ## pastes the name.)
#define PIPE_TUNE_ENTRY(...) PIPE_ENTRY_T(__VA_ARGS__)
#if defined(PIPE_TUNE_BM) && PIPE_TUNE_BF16
PIPE_TUNE_ENTRY(PIPE_TUNE_BM, PIPE_TUNE_BN, PIPE_TUNE_BK, PIPE_TUNE_WGM, PIPE_TUNE_WGN, PIPE_TUNE_ST, PIPE_TUNE_MINB,
                OPTIMIZED, optimized, true, bf16)
#elif defined(PIPE_TUNE_BM)
PIPE_TUNE_ENTRY(PIPE_TUNE_BM, PIPE_TUNE_BN, PIPE_TUNE_BK, PIPE_TUNE_WGM, PIPE_TUNE_WGN, PIPE_TUNE_ST, PIPE_TUNE_MINB,
                OPTIMIZED, optimized, false, fp16)
#endif

// PIPE_ENTRIES (days/day13_igemm_production/tiles.py reads this list; keep one entry per line).
#if !defined(PIPE_TUNE_BM)
PIPE_ENTRY(128, 128, 32, 2, 2, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(128, 128, 32, 2, 4, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(128, 128, 32, 2, 4, 4, 2, OPTIMIZED, optimized)
PIPE_ENTRY(128, 128, 64, 2, 2, 3, 1, OPTIMIZED, optimized)
PIPE_ENTRY(128, 128, 64, 2, 4, 3, 2, OPTIMIZED, optimized)
PIPE_ENTRY(256, 64, 32, 4, 2, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(128, 64, 32, 2, 2, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(64, 64, 32, 2, 2, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(64, 64, 64, 2, 2, 4, 1, OPTIMIZED, optimized)
PIPE_ENTRY(128, 64, 32, 2, 2, 4, 1, ANALYTIC, analytic)
PIPE_ENTRY(64, 64, 32, 2, 2, 4, 1, ANALYTIC, analytic)
PIPE_ENTRY(128, 64, 32, 2, 2, 4, 1, FEW_CHANNELS, few_channels)
PIPE_ENTRY(64, 64, 32, 2, 2, 4, 1, FEW_CHANNELS, few_channels)
#endif
