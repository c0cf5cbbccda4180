// Day 14 - dgrad: dx = dL/dx from dy and w, as day 13's implicit GEMM run once per filter phase.
// NHWC dy [N][P][Q][K] and dx [N][H][W][C], KRSC w [K][R][S][C]; fp16/bf16, fp32 accumulation.
//
// Per axis, with stride s, padding pad and dilation d, an input row h collects the taps r whose
// (h + pad - r*d) is a multiple of s, from dy row (h + pad - r*d) / s. The rows h = phi + s*i
// of one phase phi all keep the same taps; ordered by their dy offset o = (phi + pad - r*d) / s
// (ascending, so r descending) they are J taps at offsets o_min + j*d', d' = d / gcd(s, d). So a
// phase is an fprop over dy with stride 1, padding -o_min, dilation d', a J-tap filter, and
// I = ceil((H - phi) / s) output rows. With stride 1 there is one phase: the filter turned around
// (r -> R - 1 - r) with padding (R - 1)*d - pad. A phase pair (phi_h, phi_w) without a tap on an
// axis has no GEMM: its dx pixels are exact zeros, those of all such pairs written by one launch.
// The phases together do exactly the useful multiplications (days/day14_backward/model.py
// simulates them).
//
// A phase's GEMM: GEMM-M = its dx pixels (n, i, j), GEMM-N = C, GEMM-K = (jh, jw, k), k fastest,
// with B[(jh, jw, k)][c] = w[k][r(jh)][s(jw)][c]: tap jh of a phase is filter row
// r(jh) = r_first - jh * r_step, r_first its largest tap and r_step = s / gcd(s, d) (the taps of
// one phase are r_step apart in r; by ascending dy offset, r descends), the same for s(jw).
//
// The kernels of a run, in launch order:
//   dgrad_filter_phases_<dt>   ANALYTIC and FEW_CHANNELS only (dy's K or dx's C not a multiple
//                              of 8): w [K][R][S][C] -> the phase filters, one after another in phase order
//                              (phi_h, phi_w) row-major, each [C][Jh][Jw][K] (GEMM-N = C rows,
//                              GEMM-K = (jh, jw, k) contiguous: what day 13's B loads want), in a
//                              workspace. A 64 x 64 shared-memory transpose per filter tap (r, s).
//   dgrad_<tile>_<iterator>_<dt>
//                              day 13's igemm_production on one phase: dy as the input, and PhaseRows
//                              as the output map: GEMM-M row m = (n, i, j) goes to dx pixel
//                              (n, phi_h + sh*i, phi_w + sw*j). B: OPTIMIZED reads w in place
//                              (PhaseFilter<true>: a GEMM-K row (jh, jw, k) is w[k][r(jh)][s(jw)][:],
//                              C contiguous, day 13's B_KN stage), the others the phase filter.
//                              One launch per phase pair with taps (Python: days/day14_backward/dgrad.py);
//                              with unit stride, dgrad_unit_* (day 13's dense output map).
//   dgrad_zero_phases          every dx pixel no tap reaches (its row's or its column's phase has
//                              no taps): zeros, at store bandwidth, one launch for all such phases
//                              (none when every phase has taps).
#include "igemm_mainloop.cuh"  // day 13's kernel as templates (not day 13's entry points)

// ---- the phases of one filter axis ----------------------------------------------------------
// phase(r): the phase phi in 0 .. s-1 whose rows tap r reaches: phi = (r*d - pad) mod s.
__device__ __forceinline__ int tap_phase(int r, int s, int pad, int d) { return ((r * d - pad) % s + s) % s; }

struct AxisPlace {
    int phase;   // the phase of tap r
    int rank;    // its position among that phase's taps, by ascending dy offset (descending r)
    int taps;    // J: how many taps that phase has
    int before;  // taps of the phases before it (their filters come first)
};

__device__ __forceinline__ AxisPlace axis_place(int r, int R, int s, int pad, int d) {
    AxisPlace a{tap_phase(r, s, pad, d), 0, 0, 0};
    for (int r2 = 0; r2 < R; ++r2) {
        const int ph2 = tap_phase(r2, s, pad, d);
        a.taps += ph2 == a.phase;
        a.rank += ph2 == a.phase && r2 > r;
        a.before += ph2 < a.phase;
    }
    return a;
}

// Phase filters: grid (ceil(C/64), ceil(K/64), R*S), block 256. Block z is filter tap (r, s); it
// moves the 64 x 64 slab w[k0 .. k0+63][r][s][c0 .. c0+63] through shared memory, reading rows of
// c and writing rows of k, 16 bytes per thread and access when C and K are multiples of 8 (here
// only with R or S > 16, past OPTIMIZED's tap masks), element by element otherwise. Phase
// (ph, pw) starts at element (before_h * S + Jh * before_w) * C * K: the filters of all earlier
// phase pairs.
template <bool BF16>
__device__ __forceinline__ void dgrad_filter_phases(const u16* __restrict__ w, u16* __restrict__ wt, int K, int C,
                                                    int R, int S, int sh, int sw, int ph, int pw, int dh, int dw) {
    __shared__ __align__(16) u16 tile[64][72];  // [k][c]; rows padded by 16 bytes
    const int r = blockIdx.z / S, s = blockIdx.z % S;
    const int c0 = blockIdx.x * 64, k0 = blockIdx.y * 64, tid = threadIdx.x, ch = tid % 8, row = tid / 8;
    const AxisPlace a = axis_place(r, R, sh, ph, dh), b = axis_place(s, S, sw, pw, dw);
    const idx_t base = ((idx_t)a.before * S + (idx_t)a.taps * b.before) * C * K;
    const idx_t c_step = (idx_t)a.taps * b.taps * K;  // [C][Jh][Jw][K]: one c apart
    const idx_t tap_off = ((idx_t)a.rank * b.taps + b.rank) * K;
    const bool vec = C % 8 == 0 && K % 8 == 0;
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // rows k of 8 chunks of 8 channels
        const int kr = row + 32 * u, k = k0 + kr, c = c0 + 8 * ch;
        const u16* src = w + (((idx_t)k * R + r) * S + s) * C + c;
        if (vec) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (k < K && c < C) v = *reinterpret_cast<const uint4*>(src);
            *reinterpret_cast<uint4*>(&tile[kr][8 * ch]) = v;
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) tile[kr][8 * ch + e] = (k < K && c + e < C) ? src[e] : (u16)0;
        }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // rows c of 8 chunks of 8 filters
        const int cr = row + 32 * u, c = c0 + cr, k = k0 + 8 * ch;
        if (c >= C) continue;
        u16* dst = wt + base + c * c_step + tap_off + k;
        u16 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = tile[8 * ch + e][cr];
        if (vec && k < K) {
            *reinterpret_cast<uint4*>(dst) = make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16,
                                                        v[4] | (unsigned)v[5] << 16, v[6] | (unsigned)v[7] << 16);
        } else if (!vec) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (k + e < K) dst[e] = v[e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) dgrad_filter_phases_fp16(const u16* __restrict__ w,
                                                                           u16* __restrict__ wt, int K, int C, int R,
                                                                           int S, int sh, int sw, int ph, int pw,
                                                                           int dh, int dw) {
    dgrad_filter_phases<false>(w, wt, K, C, R, S, sh, sw, ph, pw, dh, dw);
}
extern "C" __global__ void __launch_bounds__(256) dgrad_filter_phases_bf16(const u16* __restrict__ w,
                                                                           u16* __restrict__ wt, int K, int C, int R,
                                                                           int S, int sh, int sw, int ph, int pw,
                                                                           int dh, int dw) {
    dgrad_filter_phases<true>(w, wt, K, C, R, S, sh, sw, ph, pw, dh, dw);
}

// ---- where a phase's B comes from ------------------------------------------------------------
// PhaseFilter<true> (OPTIMIZED): w in place. GEMM-K row (jh, jw, k) of the phase is
// w[k][r_first - jh * r_step][s_first - jw * s_step][0 .. C-1]: its GEMM-N (C) is contiguous in
// KRSC, so a BK x BN slab of B is BK rows of w (R*S*C apart), each BN contiguous channels: day 13's
// B_KN layout, 16-byte cp.async along C (C % 8 == 0, w 16-byte aligned: Python checks) into
// [BK][BN] stages, fragments by ldmatrix.trans. No transpose, no workspace. Offsets in 32 bits but
// k * R*S*C (64): R*S*C, r_step*S*C < 2^31 (Python checks). PhaseFilter<false> (ANALYTIC,
// FEW_CHANNELS): day 13's KRSC loads of the phase filter the transpose wrote; its fields go unread.
template <bool IN_PLACE>
struct PhaseFilter {
    static constexpr bool B_KN = IN_PLACE;
    int first, k_stride, jh_stride, jw_stride;  // tap (0, 0)'s element (r_first, s_first); R*S*C; r_step*S*C; s_step*C
    __device__ __forceinline__ idx_t row(int jh, int jw, int k) const {
        return (idx_t)k * k_stride + (first - jh * jh_stride - jw * jw_stride);
    }
};

template <int ITER>
__device__ __forceinline__ PhaseFilter<ITER == OPTIMIZED> phase_filter(int R, int S, int C, int r_first, int r_step,
                                                                        int s_first, int s_step) {
    return {(r_first * S + s_first) * C, R * S * C, r_step * S * C, s_step * C};
}

// ---- the output map of one phase ------------------------------------------------------------
// GEMM-M row m = (n, i, j) over N x I x J is dx pixel (n, fh + sh*i, fw + sw*j): element offset
// ((n*H + h)*W + w)*C. Divisions in 32 bits while m fits (the usual case).
struct PhaseRows {
    static constexpr bool FPROP = false;
    int I, J, H, W, sh, sw, fh, fw, C;
    __device__ __forceinline__ idx_t offset(idx_t m) const {
        const int IJ = I * J;  // < 2^31 (checked in Python)
        idx_t n;
        int ij;
        if (m <= 0x7fffffff) {
            n = (unsigned)m / (unsigned)IJ;
            ij = (unsigned)m - (unsigned)n * IJ;
        } else {
            n = m / IJ;
            ij = (int)(m - n * IJ);
        }
        const int i = (unsigned)ij / (unsigned)J, j = ij - i * J;
        return ((n * H + fh + sh * i) * W + fw + sw * j) * C;
    }
};

// Pixels no tap reaches: dx pixel (n, h, w) is an exact zero when bit (h mod sh) of zh (the
// H-axis phases without taps) or bit (w mod sw) of zw (the W axis) is set; sh, sw <= 32 (Python
// checks). Grid (N * H, ceil(W * runs / 256)), block 256: block x is the dx row (n, h); blocks y
// and threads walk that row's W pixels of `runs` 16-byte runs (C % 8 == 0) or elements. A row of a
// tap-less phase is zeroed whole; another row only at its tap-less columns, and with none (zw == 0)
// its blocks exit at once. 32-bit index math (W * runs < 2^31 and N * H < 2^31: Python checks the
// grid), so the stores run at bandwidth.
extern "C" __global__ void dgrad_zero_phases(u16* __restrict__ dx, int H, int W, int C, int sh, int sw, unsigned zh,
                                             unsigned zw) {
    const int n = blockIdx.x / H, h = blockIdx.x - n * H;
    const bool row_zero = zh >> (h % sh) & 1u;
    if (!row_zero && zw == 0) return;  // a row with taps, every column with taps: nothing to write
    const bool vec = C % 8 == 0;
    const int runs = vec ? C / 8 : C;
    const int t = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= W * runs) return;
    const int w = t / runs, e = t - w * runs;
    if (!row_zero && !(zw >> (w % sw) & 1u)) return;  // a pixel a phase GEMM writes
    u16* px = dx + (((idx_t)n * H + h) * W + w) * C;
    if (vec) reinterpret_cast<uint4*>(px)[e] = make_uint4(0, 0, 0, 0);
    else px[e] = 0;
}

// One entry point per (tile description, iterator, dtype), named as day 13's:
//   dgrad_<BM>x<BN>x<BK>_w<WGM>x<WGN>_s<STAGES>_b<MINB>_<iterator>_<fp16|bf16>
// Arguments: dy, wf (OPTIMIZED: w itself; the others: this phase's filter), dx, N, K, P, Q, C, Jh,
// Jw, I, J, pad_h, pad_w, dil_h, dil_w (the phase's fprop padding -o_min and dilation d'), H, W,
// sh, sw, fh, fw (the phase), R, S, r_first, r_step, s_first, s_step (its taps in w, read by
// OPTIMIZED), swz_log.
#define DGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, BF16, DT)                                  \
    extern "C" __global__ void __launch_bounds__(32 * WGM * WGN, MINB)                                          \
        dgrad_##BM##x##BN##x##BK##_w##WGM##x##WGN##_s##ST##_b##MINB##_##ITNAME##_##DT(                          \
            const u16* __restrict__ dy, const u16* __restrict__ wf, u16* dx, int N, int K, int P, int Q, int C, \
            int Jh, int Jw, int I, int J, int pad_h, int pad_w, int dil_h, int dil_w, int H, int W, int sh,     \
            int sw, int fh, int fw, int R, int S, int r_first, int r_step, int s_first, int s_step,             \
            int swz_log) {                                                                                      \
        igemm_production<BM, BN, BK, WGM, WGN, ST, MINB, ITER, BF16, PhaseRows, PhaseFilter<ITER == OPTIMIZED>>( \
            dy, wf, dx, nullptr, nullptr, Conv{N, K, P, Q, C, Jh, Jw, I, J, 1, 1, pad_h, pad_w, dil_h, dil_w},  \
            1.0f, 0.0f, 0, swz_log, PhaseRows{I, J, H, W, sh, sw, fh, fw, C},                                   \
            phase_filter<ITER>(R, S, C, r_first, r_step, s_first, s_step));                                     \
    }
// Unit stride: one phase, dx pixel m = GEMM-M row m and I, J = H, W from the padding, so day 13's
// own FpropRows (a dense output, the unpadded shortcut) holds: dgrad_unit_<tile>_<iterator>_<dt>,
// the same arguments (r_first = R - 1, r_step = 1: the filter turned around).
#define DGRAD_UNIT_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, BF16, DT)                             \
    extern "C" __global__ void __launch_bounds__(32 * WGM * WGN, MINB)                                          \
        dgrad_unit_##BM##x##BN##x##BK##_w##WGM##x##WGN##_s##ST##_b##MINB##_##ITNAME##_##DT(                     \
            const u16* __restrict__ dy, const u16* __restrict__ wf, u16* dx, int N, int K, int P, int Q, int C, \
            int Jh, int Jw, int I, int J, int pad_h, int pad_w, int dil_h, int dil_w, int H, int W, int sh,     \
            int sw, int fh, int fw, int R, int S, int r_first, int r_step, int s_first, int s_step,             \
            int swz_log) {                                                                                      \
        igemm_production<BM, BN, BK, WGM, WGN, ST, MINB, ITER, BF16, FpropRows, PhaseFilter<ITER == OPTIMIZED>>( \
            dy, wf, dx, nullptr, nullptr, Conv{N, K, P, Q, C, Jh, Jw, I, J, 1, 1, pad_h, pad_w, dil_h, dil_w},  \
            1.0f, 0.0f, 0, swz_log, FpropRows{}, phase_filter<ITER>(R, S, C, r_first, r_step, s_first, s_step)); \
    }
#define DGRAD_ENTRY(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME)                    \
    DGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, false, fp16)      \
    DGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, true, bf16)       \
    DGRAD_UNIT_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, false, fp16) \
    DGRAD_UNIT_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MINB, ITER, ITNAME, true, bf16)

// DGRAD_ENTRIES (days/day14_backward/dgrad.py reads this list; keep one entry per line): the tiles
// day 13's rule picks.
DGRAD_ENTRY(128, 128, 64, 2, 2, 3, 1, OPTIMIZED, optimized)
DGRAD_ENTRY(128, 64, 32, 2, 2, 4, 1, OPTIMIZED, optimized)
DGRAD_ENTRY(64, 64, 64, 2, 2, 4, 1, OPTIMIZED, optimized)
DGRAD_ENTRY(128, 64, 32, 2, 2, 4, 1, ANALYTIC, analytic)
DGRAD_ENTRY(64, 64, 32, 2, 2, 4, 1, ANALYTIC, analytic)
DGRAD_ENTRY(128, 64, 32, 2, 2, 4, 1, FEW_CHANNELS, few_channels)
DGRAD_ENTRY(64, 64, 32, 2, 2, 4, 1, FEW_CHANNELS, few_channels)
