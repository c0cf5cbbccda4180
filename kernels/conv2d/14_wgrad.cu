// Day 14 - wgrad: dw = dL/dw from x and dy as an implicit GEMM on tensor cores, with split-K.
// NHWC x [N][H][W][C] and dy [N][P][Q][K], KRSC dw [K][R][S][C]; fp16/bf16 in and out, fp32
// accumulation always.
//
// GEMM view: M = K (filters), N = C*R*S (dw's row, n = (r*S + s)*C + c), GEMM-K = N*P*Q (every
// output pixel of every image: the longest reduction of the three operations).
//   dw[k][n] = sum_pix dy[pix][k] * x[img(pix)][h(pix) + r*dh][w(pix) + s*dw][c]
// with h(pix) = p*sh - ph, w(pix) = q*sw - pw for pix = (img*P + p)*Q + q, x read as 0 outside.
//
// Both operands arrive pixel-major: a pixel's K values of dy are contiguous, and so are a tap's
// C values of x. So both shared tiles are [BK pixels][BM or BN] (rows = GEMM-K), the transpose
// of what day 13's fragments read, and the fragments come from ldmatrix.trans: each 8 x 8 matrix
// is read as 8 pixel rows of 16 bytes and handed out transposed, in the mma.sync layout.
//
// Mapping (per block, THREADS = 32 * WGM * WGN; warp tile WTM x WTN of 16 x 8 mma tiles):
//   block (bx, by, z): filters m0 = BM*bx, columns n0 = BN*by, GEMM-K slice z of gridDim.z
//   A loads: 16-byte chunk (row = tid / (BM/8) + A_ROWSTEP*u, chunk tid % (BM/8)) of dy
//   B loads: 16-byte chunk (row = tid / (BN/8) + B_ROWSTEP*u, chunk tid % (BN/8)) of x: a thread's
//            column n (so its tap r, s and channel c) is the same at every step, decoded once;
//            its rows' pixels are decoded per step with two FastDiv (multiply-high and shift)
// Shared layout: row r of a [BK][BM] stage holds BM/8 chunks, chunk ch at ch ^ (r & 7): the
//   8 rows an ldmatrix reads sit in 8 different 16-byte bank groups (swz_trans, tensor_core.cuh).
//
// Split-K (gridDim.z = SPLITS slices of whole BK steps, z the slowest grid axis):
//   MODE 0 (direct)   one slice: the block rounds its fp32 tile to the output dtype, stores dw.
//   MODE 1 (parallel) slice z stores its fp32 tile to partial[z][K][CRS] (the workspace); a
//                     second kernel, wgrad_reduce_*, sums the slices in order and rounds once.
//   MODE 2 (serial)   the slices of a tile take turns on a semaphore (an int per tile, zeroed
//                     by wgrad_zero first): slice z waits until it reads z, adds its tile to
//                     the fp32 running sum in the workspace (slice 0 writes it), and the last
//                     slice rounds the sum into dw. The slices are added in order: the result
//                     is bitwise the same every run, and the same as MODE 1's.
// Never atomics on fp16/bf16 partials: every partial sum stays fp32 until the last rounding.
//
// Assumes C % 8 == 0 and K % 8 == 0 (16-byte chunks), x and dy 16-byte aligned, N*P*Q < 2^31
// (FastDiv), groups = 1 (Python checks). sm_80+ (cp.async, bf16 mma.sync, ldmatrix).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"
#include "tensor_core.cuh"

typedef unsigned short u16;

// n / d for 0 <= n < 2^31 by one multiply-high, an add and a shift (the "round-up" method of
// Granlund and Montgomery): with l = ceil(log2 d), mul = floor(2^32 (2^l - d) / d) + 1, computed
// on the host (days/day14_backward/wgrad.py, fast_div, which also checks it).
struct FastDiv {
    unsigned mul, shift;
    __device__ __forceinline__ unsigned operator()(unsigned n) const { return (__umulhi(n, mul) + n) >> shift; }
};

struct WConv {
    int N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw;
    FastDiv by_pq, by_q;
};

template <int BM_, int BN_, int BK_, int WGM_, int WGN_, int STAGES_, bool BF16_>
struct WTile {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WGM = WGM_, WGN = WGN_, STAGES = STAGES_;
    static constexpr bool BF16 = BF16_;
    static constexpr int THREADS = 32 * WGM * WGN, WTM = BM / WGM, WTN = BN / WGN, MI = WTM / 16, NJ = WTN / 8;
    static constexpr int A_CPR = BM / 8, B_CPR = BN / 8;  // 16-byte chunks per stage row
    static constexpr int A_ROWSTEP = THREADS / A_CPR, B_ROWSTEP = THREADS / B_CPR;
    static constexpr int A_PER = BK / A_ROWSTEP, B_PER = BK / B_ROWSTEP;  // chunks per thread per stage
    static constexpr int KK = BK / 16;
    static constexpr unsigned A_STAGE = BM * BK * 2, B_STAGE = BN * BK * 2;  // bytes
    static_assert(THREADS % A_CPR == 0 && THREADS % B_CPR == 0 && BK % A_ROWSTEP == 0 && BK % B_ROWSTEP == 0,
                  "loader shape");
    static_assert(BM >= 64 && BN >= 64 && WTM % 16 == 0 && WTN % 16 == 0 && BK % 16 == 0 && STAGES >= 2,
                  "tile shape");
};

__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

template <int BM, int BN, int BK, int WGM, int WGN, int STAGES, int MODE, bool BF16>
__device__ __forceinline__ void wgrad(const u16* __restrict__ x, const u16* __restrict__ dy, u16* __restrict__ dw,
                                      float* __restrict__ partial, int* __restrict__ sems, const WConv cv) {
    using T = WTile<BM, BN, BK, WGM, WGN, STAGES, BF16>;
    constexpr int MI = T::MI, NJ = T::NJ, A_PER = T::A_PER, B_PER = T::B_PER;
    extern __shared__ __align__(128) u16 smem[];
    const unsigned sa = smem_addr(smem), sb = sa + STAGES * T::A_STAGE;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / WGN, wn = warp % WGN;
    const int K = cv.K, C = cv.C, CRS = cv.C * cv.R * cv.S;
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, z = blockIdx.z, splits = gridDim.z;
    const int NPQ = cv.N * cv.P * cv.Q;  // < 2^31 (checked in Python)
    const int steps_all = CEIL_DIV(NPQ, BK);
    // This slice: whole BK steps [BK * floor(steps*z/splits), BK * floor(steps*(z+1)/splits)), the
    // last one ending at NPQ (days/day14_backward/model.py, split_k_slices).
    const int k_begin = BK * (int)((idx_t)steps_all * z / splits);
    const int k_end = z == splits - 1 ? NPQ : BK * (int)((idx_t)steps_all * (z + 1) / splits);
    const int steps = CEIL_DIV(k_end - k_begin, BK);

    // A (dy): this thread's chunk column (8 filters) and rows
    const int a_ch = tid % T::A_CPR, a_row = tid / T::A_CPR;
    const bool a_col_in = m0 + 8 * a_ch < K;
    const u16* a_src = dy + (idx_t)(k_begin + a_row) * K + m0 + 8 * a_ch;  // row u: + u*A_ROWSTEP*K
    // B (x): this thread's column n = n0 + 8*b_ch is one tap (r, s) and 8 channels c .. c+7
    const int b_ch = tid % T::B_CPR, b_row = tid / T::B_CPR;
    const int n = n0 + 8 * b_ch;
    const bool b_col_in = n < CRS;
    const int tap = n / C, c = n - tap * C, r = tap / cv.S, s = tap - r * cv.S;
    const int tap_h = r * cv.dh - cv.ph, tap_w = s * cv.dw - cv.pw;

    auto load_stage = [&](int t, int slot) {
        const int kb = k_begin + t * BK;
        const unsigned da = sa + slot * T::A_STAGE, db = sb + slot * T::B_STAGE;
#pragma unroll
        for (int u = 0; u < A_PER; ++u) {
            const int row = a_row + T::A_ROWSTEP * u;
            cp_async16(da + 2 * swz_trans<BM>(row, a_ch), a_src + ((idx_t)t * BK + T::A_ROWSTEP * u) * K,
                       a_col_in && kb + row < k_end);
        }
#pragma unroll
        for (int u = 0; u < B_PER; ++u) {
            const int row = b_row + T::B_ROWSTEP * u, pix = kb + row;
            const unsigned img = cv.by_pq((unsigned)pix), pq = pix - img * (cv.P * cv.Q);
            const unsigned p = cv.by_q(pq), q = pq - p * cv.Q;
            const int h = (int)p * cv.sh + tap_h, w = (int)q * cv.sw + tap_w;
            const bool in = b_col_in && pix < k_end && (unsigned)h < (unsigned)cv.H && (unsigned)w < (unsigned)cv.W;
            const u16* src = x + (((idx_t)img * cv.H + h) * cv.W + w) * C + c;
            cp_async16(db + 2 * swz_trans<BN>(row, b_ch), in ? src : x, in);
        }
    };

    // ldmatrix.trans addresses (bytes within a stage) of slice kk, fragment 0. Lane l feeds row
    // l % 8 of matrix l / 8: for A, matrices (k 0-7 | 8-15) x (m 0-7 | 8-15) in the order a0..a3
    // want ((k0,m0), (k0,m8), (k8,m0), (k8,m8)); for B, ((k0,n0), (k8,n0), (k0,n8), (k8,n8)).
    const int mat = lane / 8, lrow = lane % 8;
    unsigned a_addr[T::KK][MI], b_addr[T::KK][NJ / 2];
#pragma unroll
    for (int kk = 0; kk < T::KK; ++kk) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
            a_addr[kk][i] = 2 * swz_trans<BM>(16 * kk + lrow + 8 * (mat / 2), (T::WTM * wm + 16 * i) / 8 + mat % 2);
#pragma unroll
        for (int j2 = 0; j2 < NJ / 2; ++j2)
            b_addr[kk][j2] = 2 * swz_trans<BN>(16 * kk + lrow + 8 * (mat % 2), (T::WTN * wn + 16 * j2) / 8 + mat / 2);
    }

    float acc[MI][NJ][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    // The cp.async ring (day 12): STAGES - 1 steps in flight ahead of the one computed.
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < steps) load_stage(st, st);
        cp_commit();
    }
    for (int t = 0; t < steps; ++t) {
        cp_wait<STAGES - 2>();
        __syncthreads();
        const int next = t + STAGES - 1;
        if (next < steps) load_stage(next, next % STAGES);
        cp_commit();
        const unsigned ca = sa + (t % STAGES) * T::A_STAGE, cb = sb + (t % STAGES) * T::B_STAGE;
#pragma unroll
        for (int kk = 0; kk < T::KK; ++kk) {
            unsigned af[MI][4], bf[NJ][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) ldsm_x4_trans(af[i], ca + a_addr[kk][i]);
#pragma unroll
            for (int j2 = 0; j2 < NJ / 2; ++j2) {
                unsigned q4[4];
                ldsm_x4_trans(q4, cb + b_addr[kk][j2]);
                bf[2 * j2][0] = q4[0];
                bf[2 * j2][1] = q4[1];
                bf[2 * j2 + 1][0] = q4[2];
                bf[2 * j2 + 1][1] = q4[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j) mma16816<BF16>(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    cp_wait<0>();

    // ---- epilogue: accumulator (i, j, hf) is row m0 + WTM*wm + 16i + lane/4 + 8hf, columns
    // n0 + WTN*wn + 8j + 2(lane%4) + {0, 1}; CRS is even (C % 8 == 0), so a pair is in or out together.
    const int row_base = m0 + T::WTM * wm + lane / 4, col_base = n0 + T::WTN * wn + 2 * (lane % 4);
    auto each_pair = [&](auto&& f) {
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = row_base + 16 * i + 8 * hf;
                if (row >= K) continue;
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const int col = col_base + 8 * j;
                    if (col < CRS) f((idx_t)row * CRS + col, acc[i][j][2 * hf], acc[i][j][2 * hf + 1]);
                }
            }
    };
    if constexpr (MODE == 0) {
        each_pair([&](idx_t off, float v0, float v1) { *reinterpret_cast<unsigned*>(dw + off) = pack2<BF16>(v0, v1); });
    } else if constexpr (MODE == 1) {
        float* mine = partial + (idx_t)z * K * CRS;
        each_pair([&](idx_t off, float v0, float v1) { *reinterpret_cast<float2*>(mine + off) = make_float2(v0, v1); });
    } else {
        int* sem = sems + blockIdx.y * gridDim.x + blockIdx.x;
        if (z > 0) {
            if (tid == 0)
                while (ld_acquire(sem) != z) {
                }
            __syncthreads();  // slice z - 1's running sum is complete and visible
        }
        if (z < splits - 1) {
            each_pair([&](idx_t off, float v0, float v1) {
                float2 v = make_float2(v0, v1);
                if (z > 0) {
                    const float2 prev = __ldcg(reinterpret_cast<const float2*>(partial + off));  // L2: not a stale L1 line
                    v = make_float2(prev.x + v0, prev.y + v1);
                }
                __stcg(reinterpret_cast<float2*>(partial + off), v);
            });
            __threadfence();
            __syncthreads();  // every thread's part of the sum is written ...
            if (tid == 0) st_release(sem, z + 1);  // ... before the next slice may read it
        } else {
            each_pair([&](idx_t off, float v0, float v1) {
                if (z > 0) {
                    const float2 prev = __ldcg(reinterpret_cast<const float2*>(partial + off));
                    v0 = prev.x + v0;
                    v1 = prev.y + v1;
                }
                *reinterpret_cast<unsigned*>(dw + off) = pack2<BF16>(v0, v1);
            });
        }
    }
}

// Entry points: wgrad_<BM>x<BN>x<BK>_w<WGM>x<WGN>_s<STAGES>_<direct|parallel|serial>_<fp16|bf16>.
// Arguments: x, dy, dw, partial (fp32 workspace or null), sems (int workspace or null), N, C, H, W,
// K, R, S, P, Q, sh, sw, ph, pw, dh, dw, the FastDiv of P*Q and of Q (mul, shift each).
#define WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, MODE, MNAME, BF16, DT)                                         \
    extern "C" __global__ void __launch_bounds__(32 * WGM * WGN)                                                \
        wgrad_##BM##x##BN##x##BK##_w##WGM##x##WGN##_s##ST##_##MNAME##_##DT(                                     \
            const u16* __restrict__ x, const u16* __restrict__ dy, u16* __restrict__ dw, float* partial,        \
            int* sems, int N, int C, int H, int W, int K, int R, int S, int P, int Q, int sh, int sw, int ph,   \
            int pw, int dh, int dwl, unsigned pq_mul, unsigned pq_shift, unsigned q_mul, unsigned q_shift) {    \
        wgrad<BM, BN, BK, WGM, WGN, ST, MODE, BF16>(                                                            \
            x, dy, dw, partial, sems,                                                                           \
            WConv{N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dwl, {pq_mul, pq_shift}, {q_mul, q_shift}});   \
    }
#define WGRAD_ENTRY(BM, BN, BK, WGM, WGN, ST)                          \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 0, direct, false, fp16)   \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 0, direct, true, bf16)    \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 1, parallel, false, fp16) \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 1, parallel, true, bf16)  \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 2, serial, false, fp16)   \
    WGRAD_ENTRY_T(BM, BN, BK, WGM, WGN, ST, 2, serial, true, bf16)

// WGRAD_ENTRIES (days/day14_backward/wgrad.py reads this list; keep one entry per line)
WGRAD_ENTRY(128, 128, 32, 2, 2, 4)
WGRAD_ENTRY(128, 128, 32, 2, 4, 4)
WGRAD_ENTRY(128, 128, 64, 2, 2, 3)
WGRAD_ENTRY(128, 64, 32, 2, 2, 4)
WGRAD_ENTRY(64, 64, 32, 2, 2, 4)
WGRAD_ENTRY(64, 64, 64, 2, 2, 4)
WGRAD_ENTRY(64, 64, 64, 2, 2, 3)

// Parallel split-K, second kernel: dw[i] = round(sum_z partial[z][i]), z in order, 2 elements per
// thread and step of a grid-stride loop (K*CRS is a multiple of 8). dw is small where the split is
// large (a few dozen output tiles, up to ~100 slices), so few threads each sum many slices: the
// loads of REDUCE_BATCH slices are issued before their adds, so that many loads are in flight per
// thread (one at a time, the sum would wait a memory latency per slice). The adds stay in slice
// order: the result is bitwise the serial split-K's.
constexpr int REDUCE_BATCH = 16;
template <bool BF16>
__device__ __forceinline__ void wgrad_reduce(const float* __restrict__ partial, u16* __restrict__ dw, long long count,
                                             int splits) {
    const idx_t pairs = count / 2;
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += (idx_t)gridDim.x * blockDim.x) {
        const float2* src = reinterpret_cast<const float2*>(partial) + i;
        float2 sum = __ldcs(src);
        for (int z0 = 1; z0 < splits; z0 += REDUCE_BATCH) {
            float2 v[REDUCE_BATCH];
#pragma unroll
            for (int j = 0; j < REDUCE_BATCH; ++j)
                if (z0 + j < splits) v[j] = __ldcs(src + (idx_t)(z0 + j) * pairs);
#pragma unroll
            for (int j = 0; j < REDUCE_BATCH; ++j)
                if (z0 + j < splits) {
                    sum.x += v[j].x;
                    sum.y += v[j].y;
                }
        }
        *reinterpret_cast<unsigned*>(dw + 2 * i) = pack2<BF16>(sum.x, sum.y);
    }
}
extern "C" __global__ void wgrad_reduce_fp16(const float* __restrict__ partial, u16* __restrict__ dw,
                                             long long count, int splits) {
    wgrad_reduce<false>(partial, dw, count, splits);
}
extern "C" __global__ void wgrad_reduce_bf16(const float* __restrict__ partial, u16* __restrict__ dw,
                                             long long count, int splits) {
    wgrad_reduce<true>(partial, dw, count, splits);
}

// Serial split-K, first kernel: zero the semaphores (one int per output tile).
extern "C" __global__ void wgrad_zero(int* sems, int count) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) sems[i] = 0;
}
