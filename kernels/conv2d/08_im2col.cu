// Day 08 - im2col + GEMM: lower the convolution to a matrix, then multiply two matrices.
//
// What changed since day 07: no kernel computes a convolution any more. The first kernel copies
// every receptive field of the input into one row of a matrix ("im2col", Chellapilla, Puri and
// Simard 2006, "High Performance Convolutional Neural Networks for Document Processing"); the
// second is a plain matrix multiplication that knows nothing about images. The tensors switch to
// NHWC (channels last) and KRSC filters, the layouts in which both matrices need no transpose:
//
//   x   [N][H][W][C]   input                    w   [K][R][S][C]   filters  = B, K rows of GEMM-K
//   col [M][GK]        the lowered input = A    y   [N][P][Q][K]   output   = Y, M rows of K
//
//   M  = N*P*Q   (GEMM-M: one row per output pixel, m = (n*P + p)*Q + q)
//   GK = R*S*C   (GEMM-K: one column per filter tap, j = (r*S + s)*C + c, c fastest: KRSC order)
//   col[m][j] = x[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c], or 0 where that lies in the padding
//   y[m][k]   = sum_j col[m][j] * w[k][j]          i.e.  Y = A . B^T   ("NT": both K-contiguous)
//
// The price is memory: every input value is copied into col once per filter tap that reads it,
// about R*S/(sh*sw) times, so col is that many times larger than x (9x for a 3x3 stride-1 layer)
// and is written and read back through DRAM. Day 09 (implicit GEMM) forms the same tiles of col
// on the fly, in shared memory, and never stores the matrix.
//
// ---- kernel 1: im2col_nhwc --------------------------------------------------------------------
// One thread per V consecutive elements of col (V = 4 when C % 4 == 0 and both pointers are
// 16-byte aligned: one float4 load and one float4 store; else V = 1), in a grid-stride loop over
// the M*GK/V groups: consecutive threads write consecutive addresses of col, and for one (r, s)
// read consecutive channels of one input pixel.
//   e = blockIdx.x*IM2COL_BLOCK + threadIdx.x, step gridDim.x*IM2COL_BLOCK;  m = e / (GK/V),
//   j = (e % (GK/V))*V, then (r, s, c) from j and (n, p, q) from m.
// Launch: block (IM2COL_BLOCK, 1, 1); grid (min(ceil(M*GK/V / IM2COL_BLOCK), 2^31-1), 1, 1).
// The flat index is 32-bit unsigned inside the loop (Python refuses col of 2^32 elements or
// more, and caps its size at a few GiB anyway); offsets into x and col are 64-bit.
//
// ---- kernel 2: sgemm_nt_128x{128,64} ----------------------------------------------------------
// A classic tiled SGEMM on CUDA cores (the structure of CUTLASS's "Efficient GEMM in CUDA":
// thread-block tile in shared memory, thread tile in registers, outer products over BK):
//   block tile BM = 128 rows of A (pixels) x BN = 128 or 64 rows of B (filters), BK = 8,
//   256 threads as 16 x 16: thread (tm, tn) = (tid / 16, tid % 16) accumulates rows
//   {4*tm + i, 64 + 4*tm + i} (i < 4) x columns {4*tn + j + 64*h} (j < 4, h < BN/64) of Y,
//   an 8 x 8 (or 8 x 4) register tile: per BK step it reads 8 + BN/16 values from shared
//   memory (float4s) and does 8*BN/16 FMAs.
// Staging: each step, A's 128 x 8 and B's BN x 8 sub-tiles are loaded from global memory (every
// thread loads 4 (A) and BN/32 (B) consecutive k of one row: float4/float2 when GK allows,
// bounds-checked scalars otherwise; zeros outside the matrix) and stored TRANSPOSED in shared
// memory, As[k][m] and Bs[k][n], padded by 4 floats per row: the inner loop then reads float4s
// along m and n, and the transposing stores of one warp hit 32 different banks.
// Double buffering: two shared buffers; the global loads of step t+1 go to registers before the
// FMAs of step t and into the other buffer after them, so their latency hides behind the math;
// one __syncthreads() per step.
//   blockIdx.x -> tile of BN filters (columns of Y): consecutive blocks share one A tile, which
//                 is then read from DRAM about once while B (the filters) stays in L2;
//   blockIdx.y -> tile of BM pixels (rows of Y), grid-stride loop (gridDim.y is capped at 65535).
// Launch: block (256, 1, 1); grid (ceil(K/BN), min(ceil(M/128), 65535), 1); static shared
//   2*8*(128+4)*4 + 2*8*(BN+4)*4 bytes (16.9 KB / 12.8 KB).
// Stores to Y are bounds-checked (float4 when the block's BN columns all lie inside Y, K % 4 == 0
// and y is 16-byte aligned). Tile starts and row/column indices are 32-bit (Python refuses M, K or
// GK above 2^31 - 129); offsets are 64-bit. Each output is accumulated by one thread in a fixed
// order, so results are bitwise reproducible.
//
// Compile-time parameters (defaults): IM2COL_BLOCK (256) threads per block of im2col_nhwc;
// SGEMM_MINB_128 (2; 1 on sm_120) and SGEMM_MINB_64 (2), the blocks per SM asked of
// __launch_bounds__. The GEMM tile is fixed (BM = 128, BK = 8, 256 threads); BN is the template
// parameter of the two entries.
//
// Assumes: fp32, NHWC input, KRSC filter, NHWC output, all dense; groups = 1; any N, C, H, W, K,
// R, S, stride, padding, dilation. Does not: fuse the two kernels, use tensor cores, or avoid the
// workspace (the harness allocates col, M*GK*4 bytes, before the launch).
#include <cstdint>

#include "conv2d_common.cuh"

#ifndef IM2COL_BLOCK
#define IM2COL_BLOCK 256
#endif

// ---- im2col ----------------------------------------------------------------------------------

template <int V>
__device__ __forceinline__ void im2col_lower(const float* __restrict__ x, float* __restrict__ col, int N, int C,
                                             int H, int W, int R, int S, int P, int Q, int sh, int sw, int ph,
                                             int pw, int dh, int dw) {
    const unsigned GK = (unsigned)R * S * C;  // columns of col
    const unsigned Gv = GK / V;               // groups of V columns per row (V divides C, so GK)
    const unsigned PQ = (unsigned)P * Q;
    const idx_t total = (idx_t)N * PQ * Gv;   // < 2^32 (checked in Python)
    for (idx_t e = (idx_t)blockIdx.x * IM2COL_BLOCK + threadIdx.x; e < total;
         e += (idx_t)gridDim.x * IM2COL_BLOCK) {
        const unsigned eu = (unsigned)e;
        const unsigned m = eu / Gv;               // row: output pixel (n, p, q)
        const unsigned j = (eu - m * Gv) * V;     // column: filter tap (r, s, c), c fastest
        const unsigned rs = j / C, c = j - rs * C;
        const int r = rs / S, s = rs - r * S;
        const unsigned n = m / PQ, pq = m - n * PQ;
        const int p = pq / Q, q = pq - p * Q;
        const int h = p * sh - ph + r * dh, w = q * sw - pw + s * dw;
        const bool inside = (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
        const idx_t src = (((idx_t)n * H + h) * W + w) * C + c;
        float* dst = col + (idx_t)eu * V;
        if constexpr (V == 4) {
            *reinterpret_cast<float4*>(dst) =
                inside ? __ldg(reinterpret_cast<const float4*>(x + src)) : make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            *dst = inside ? __ldg(x + src) : 0.0f;
        }
    }
}

extern "C" __global__ void __launch_bounds__(IM2COL_BLOCK)
im2col_nhwc(const float* __restrict__ x, float* __restrict__ col, int N, int C, int H, int W, int R, int S, int P,
            int Q, int sh, int sw, int ph, int pw, int dh, int dw) {
    const bool vec = C % 4 == 0 && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(col)) & 15) == 0;
    if (vec)
        im2col_lower<4>(x, col, N, C, H, W, R, S, P, Q, sh, sw, ph, pw, dh, dw);
    else
        im2col_lower<1>(x, col, N, C, H, W, R, S, P, Q, sh, sw, ph, pw, dh, dw);
}

// ---- SGEMM, Y[GM][GN] = A[GM][GK] . B[GN][GK]^T ----------------------------------------------

constexpr int GEMM_BM = 128, GEMM_BK = 8, GEMM_THREADS = 256, GEMM_PAD = 4;

template <int L>
struct VecOf;  // the vector type of L consecutive floats
template <>
struct VecOf<4> {
    using T = float4;
};
template <>
struct VecOf<2> {
    using T = float2;
};

// L consecutive floats row[k0 .. k0+L-1] into r[], zero from column `lim` on (lim = 0 for a row
// outside the matrix). vec: lim % L == 0 and the row is aligned, so the L floats are all in or out.
template <int L>
__device__ __forceinline__ void load_run(float (&r)[L], const float* __restrict__ row, int k0, int lim, bool vec) {
    if (vec) {
        if (k0 < lim) {
            const typename VecOf<L>::T v = __ldg(reinterpret_cast<const typename VecOf<L>::T*>(row + k0));
            const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
            for (int i = 0; i < L; ++i) r[i] = f[i];
        } else {
#pragma unroll
            for (int i = 0; i < L; ++i) r[i] = 0.0f;
        }
    } else {
#pragma unroll
        for (int i = 0; i < L; ++i) r[i] = k0 + i < lim ? __ldg(row + k0 + i) : 0.0f;
    }
}

template <int BN>
__device__ __forceinline__ void sgemm_nt_tile(const float* __restrict__ A, const float* __restrict__ B,
                                              float* __restrict__ Y, int GM, int GN, int GK) {
    constexpr int BM = GEMM_BM, BK = GEMM_BK, T = GEMM_THREADS;
    constexpr int TN = BN / 16;       // columns per thread (8 or 4); rows per thread: 8
    constexpr int LA = BM * BK / T;   // A values each thread loads per step (4)
    constexpr int LB = BN * BK / T;   // B values each thread loads per step (4 or 2)
    static_assert(BN == 128 || BN == 64, "BN must be 128 or 64");
    static_assert(LA == 4 && (LB == 4 || LB == 2), "one float4 of A and a float4/float2 of B per thread");
    __shared__ __align__(16) float As[2][BK][BM + GEMM_PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + GEMM_PAD];

    const int tid = threadIdx.x, tm = tid / 16, tn = tid % 16;
    // Loader coordinates: A row a_r, k offset a_k within the step; B likewise.
    const int a_r = tid / (BK / LA), a_k = (tid % (BK / LA)) * LA;
    const int b_r = tid / (BK / LB), b_k = (tid % (BK / LB)) * LB;
    const bool a_vec = GK % LA == 0 && (reinterpret_cast<uintptr_t>(A) & 15) == 0;
    const bool b_vec = GK % LB == 0 && (reinterpret_cast<uintptr_t>(B) & (4 * LB - 1)) == 0;
    const bool y_vec = GN % 4 == 0 && (reinterpret_cast<uintptr_t>(Y) & 15) == 0;

    const int n0 = blockIdx.x * BN;  // first filter (column of Y) of this block
    const bool b_in = n0 + b_r < GN;
    const float* b_row = B + (idx_t)(b_in ? n0 + b_r : 0) * GK + b_k;
    const int b_lim = b_in ? GK - b_k : 0;  // this thread's B values exist for k0 < b_lim

    const int m_tiles = CEIL_DIV(GM, BM);
    for (int mt = blockIdx.y; mt < m_tiles; mt += gridDim.y) {
        const int m0 = mt * BM;
        const bool a_in = m0 + a_r < GM;
        const float* a_row = A + (idx_t)(a_in ? m0 + a_r : 0) * GK + a_k;
        const int a_lim = a_in ? GK - a_k : 0;

        float acc[8][TN];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

        float ar[LA], br[LB];  // the next step's values, in flight while this step computes
        auto fetch = [&](int k0) {
            load_run<LA>(ar, a_row, k0, a_lim, a_vec);
            load_run<LB>(br, b_row, k0, b_lim, b_vec);
        };
        auto put = [&](int buf) {  // transposed: As[k][m], Bs[k][n]
#pragma unroll
            for (int i = 0; i < LA; ++i) As[buf][a_k + i][a_r] = ar[i];
#pragma unroll
            for (int i = 0; i < LB; ++i) Bs[buf][b_k + i][b_r] = br[i];
        };

        __syncthreads();  // the previous M tile's last step is no longer being read
        fetch(0);
        put(0);
        __syncthreads();
        int buf = 0;
        for (int k0 = 0; k0 < GK; k0 += BK, buf ^= 1) {
            const bool more = k0 + BK < GK;
            if (more) fetch(k0 + BK);  // global -> registers, overlapping the FMAs below
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                float a[8], b[TN];
                const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][4 * tm]);
                const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][64 + 4 * tm]);
                a[0] = a0.x, a[1] = a0.y, a[2] = a0.z, a[3] = a0.w;
                a[4] = a1.x, a[5] = a1.y, a[6] = a1.z, a[7] = a1.w;
#pragma unroll
                for (int h = 0; h < TN / 4; ++h) {
                    const float4 v = *reinterpret_cast<const float4*>(&Bs[buf][kk][4 * tn + 64 * h]);
                    b[4 * h] = v.x, b[4 * h + 1] = v.y, b[4 * h + 2] = v.z, b[4 * h + 3] = v.w;
                }
#pragma unroll
                for (int i = 0; i < 8; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
            }
            if (more) put(buf ^ 1);  // the other buffer: last read in the previous step
            __syncthreads();
        }

        // Store rows m0 + {4*tm + i, 64 + 4*tm + i}, columns n0 + 4*tn + 64*h + j: float4 stores
        // when the block's BN columns are all inside Y (block-uniform), else scalar, guarded.
        const bool full = y_vec && n0 + BN <= GN;
        const int rows_left = min(BM, GM - m0), cols_left = GN - n0 - 4 * tn;
        float* yt = Y + (idx_t)m0 * GN + n0 + 4 * tn;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int mi = i < 4 ? 4 * tm + i : 64 + 4 * tm + i - 4;
            if (mi >= rows_left) continue;
            float* yr = yt + (idx_t)mi * GN;
#pragma unroll
            for (int h = 0; h < TN / 4; ++h) {
                if (full) {
                    *reinterpret_cast<float4*>(yr + 64 * h) =
                        make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (64 * h + j < cols_left) yr[64 * h + j] = acc[i][4 * h + j];
                }
            }
        }
    }
}

// MINB: blocks per SM asked of __launch_bounds__. 2 caps registers at 128 per thread, which the
// 8 x 8 tile fits without spills on sm_75..sm_100; sm_120's ptxas spills there, so it gets 1
// (one block of 8 warps per SM, up to 255 registers).
#ifndef SGEMM_MINB_128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define SGEMM_MINB_128 1
#else
#define SGEMM_MINB_128 2
#endif
#endif
#ifndef SGEMM_MINB_64
#define SGEMM_MINB_64 2
#endif

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, SGEMM_MINB_128)
sgemm_nt_128x128(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ Y, int GM, int GN,
                 int GK) {
    sgemm_nt_tile<128>(A, B, Y, GM, GN, GK);
}

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, SGEMM_MINB_64)
sgemm_nt_128x64(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ Y, int GM, int GN,
                int GK) {
    sgemm_nt_tile<64>(A, B, Y, GM, GN, GK);
}
