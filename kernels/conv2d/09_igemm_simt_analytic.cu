// Day 09 (a) - igemm_simt_analytic: implicit GEMM on CUDA cores, the readable version. NHWC fp32.
//
// What changed since day 08: day 08 wrote the lowered matrix A[M][Kg] to memory (im2col) and ran
// a GEMM on it. Here the GEMM kernel computes each element of A on the fly, from the index, when
// it loads its tile: the lowered matrix never exists. In the implicit-GEMM view
//     GEMM-M = N*P*Q   (row m = (n, p, q), one output pixel)
//     GEMM-N = K       (column k, one output channel)
//     GEMM-K = R*S*C   (kg = (r*S + s)*C + c, c fastest: the order of a KRSC filter row)
//     A[m][kg] = x[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c]   (0 in the padding)
//     B[kg][k] = w[k][r][s][c]                                 (the KRSC filter, row k)
//     y[n][p][q][k] = Y[m][k] = sum_kg A[m][kg] * B[kg][k]     (NHWC output = Y row-major)
// "Analytic": every load decodes its (m, kg) with divisions, (n, p, q) = m / (P*Q), ... and
// (r, s, c) = kg / (S*C), ..., then tests the padding. Simple and correct for any shape; the
// divisions cost integer instructions in the main loop, which day 09 (b) removes.
//
// Block tile: BM = 64 pixels x BN = 64 output channels, BK = 8 steps of GEMM-K per stage,
// 256 threads, each a 4 x 4 register tile. Per stage the block stages
//     sa[BK][BM]   A[m0 .. m0+64)[kg0 .. kg0+8), transposed (kg row-major)
//     sb[BK][BN]   B[kg0 .. kg0+8)[k0 .. k0+64)
// and each thread reads 4 A values and 4 B values per kk (one float4 each) for 16 FMAs.
//
// Mapping: tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
//   thread outputs  Y[m0 + 4*tm + i][k0 + 4*tn + j], i, j < 4     m0 = blockIdx.x * 64, k0 = blockIdx.y * 64
//   loads: element e = tid + u * 256 (u < 2) of a stage is (row e / 8, kg0 + e % 8) of A or B:
//   8 consecutive threads read 8 consecutive kg, i.e. 8 consecutive channels of one pixel.
// Launch: block (256, 1, 1); grid (ceil(M / 64), ceil(K / 64), 1); static shared 4 KB.
// Grid x allows 2^31 - 1 blocks; y allows 65,535, so K <= 4,194,240 (checked in Python).
//
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], fp32, groups = 1.
// Any C, K, stride, padding, dilation, filter size. Offsets that grow with the tensors are
// 64-bit; C*R*S <= 2^31 - 32 and P*Q < 2^31 (checked in Python).
#include "conv2d_common.cuh"

constexpr int A_BM = 64, A_BN = 64, A_BK = 8, A_THREADS = 256;

extern "C" __global__ void __launch_bounds__(A_THREADS)
conv2d_igemm_simt_analytic(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                           int N, int C, int H, int W, int K, int R, int S, int P, int Q,
                           int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
    __shared__ __align__(16) float sa[A_BK][A_BM];
    __shared__ __align__(16) float sb[A_BK][A_BN];

    const int tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
    const idx_t M = (idx_t)N * P * Q;
    const int KG = R * S * C;  // GEMM-K
    const idx_t m0 = (idx_t)blockIdx.x * A_BM;
    const int k0 = blockIdx.y * A_BN;

    float acc[4][4] = {};

    for (int kg0 = 0; kg0 < KG; kg0 += A_BK) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int e = tid + u * A_THREADS, row = e / A_BK, kk = e % A_BK;
            const int kg = kg0 + kk;
            // (r, s, c) of this GEMM-K index: the divisions of the analytic iterator.
            const int r = kg / (S * C), s = (kg / C) % S, c = kg % C;

            // A: the input value under filter tap (r, s) of output pixel m, or 0 in the padding.
            float a = 0.0f;
            const idx_t m = m0 + row;
            if (m < M && kg < KG) {
                const int n = (int)(m / ((idx_t)P * Q)), pq = (int)(m % ((idx_t)P * Q));
                const int p = pq / Q, q = pq % Q;
                const int h = p * sh - ph + r * dh, ww = q * sw - pw + s * dw;
                if (h >= 0 && h < H && ww >= 0 && ww < W) a = x[(((idx_t)n * H + h) * W + ww) * C + c];
            }
            sa[kk][row] = a;

            // B: w[k][r][s][c] = w[k * KG + kg], KRSC is already the GEMM's row layout.
            const int k = k0 + row;
            sb[kk][row] = (k < K && kg < KG) ? w[(idx_t)k * KG + kg] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < A_BK; ++kk) {
            const float4 av = *reinterpret_cast<const float4*>(&sa[kk][4 * tm]);
            const float4 bv = *reinterpret_cast<const float4*>(&sb[kk][4 * tn]);
            const float a4[4] = {av.x, av.y, av.z, av.w}, b4[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a4[i], b4[j], acc[i][j]);
        }
        __syncthreads();  // the stage is no longer read: the next one may overwrite it
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const idx_t m = m0 + 4 * tm + i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int k = k0 + 4 * tn + j;
            if (k < K) y[m * K + k] = acc[i][j];  // NHWC: y[n][p][q][k] = Y[m][k]
        }
    }
}
