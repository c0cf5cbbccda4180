// Day 09 (b) - igemm_simt: implicit GEMM on CUDA cores, optimized. NHWC fp32.
//
// The GEMM view is day 09 (a)'s (09_igemm_simt_analytic.cu):
//     GEMM-M = N*P*Q (pixels), GEMM-N = K (output channels), GEMM-K = R*S*C (taps x channels)
//     A[m][kg] = x[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c],  B[kg][k] = w[k][r][s][c],  Y = y.
// What changed since (a):
// 1. A 2-D register tile of TM x TN = 8 x 8 (block tile 128 x 128) instead of 4 x 4: per kk a
//    thread reads 16 values from shared memory for 64 FMAs (4 per value, against 2).
// 2. No divisions in the main loop. GEMM-K is walked filter tap by filter tap: for each (r, s),
//    the C channels in steps of BK = 8 ("tap-major"; CUTLASS's optimized iterators walk it the
//    same way). The pixel a thread loads for, and its row of the filter, never change, so
//    (n, p, q) -> (input row, column, base offset) is decoded once per block; a step adds BK
//    channels, or moves to the next tap with an add and a bounds test (the padding mask).
//    When C is not a multiple of BK, a tap's last step is partly masked (zeros).
// 3. 16-byte loads: where C % 4 == 0 a thread loads 4 consecutive channels of one pixel (A) or
//    one filter row (B) with one LDG.128; otherwise (C = 1, 3, 45, ...) the same 4 elements with
//    4 scalar loads, each masked by c < C. The entry point is chosen per problem (VEC).
// 4. Double buffering: two shared-memory stages. The next step's global loads go to registers
//    before this step's FMAs and into the other stage after them, so global latency hides
//    behind 512 FMAs per thread, with one barrier per step.
// 5. Shared memory padded by 4 floats per row: the 4 transposing stores of a load (thread e
//    writes sa[cv + j][row]) fall in 32 different banks, and rows stay 16-byte aligned for the
//    float4 reads of the inner loop.
//
// Tile descriptions (template parameters, one entry point each, see the bottom of the file):
//   BM x BN in {128 x 128, 128 x 64, 64 x 128, 64 x 64}, BK = 8, 256 threads,
//   thread tile TM x TN = BM/16 x BN/16 (8 x 8 .. 4 x 4).
// Mapping: tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
//   thread rows    m0 + 4*tm + 64*g + i, i < 4, g < TM/4         m0 = blockIdx.x * BM
//   thread columns k0 + 4*tn + 64*h + j, j < 4, h < TN/4         k0 = blockIdx.y * BN
//   (a warp's 16 tn read 64 consecutive floats of sb: conflict-free; its 2 tm broadcast from sa)
//   loads: thread tid < 2*BM loads A row tid / 2, channels cv = 4 * (tid % 2) .. +3 of the step;
//          thread tid < 2*BN loads B row tid / 2 the same way.
// Launch: block (256, 1, 1); grid (ceil(M / BM), ceil(K / BN), 1); static shared memory
//   2 * 8 * (BM + 4 + BN + 4) * 4 bytes (16.9 KB for 128 x 128).
//
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], fp32, groups = 1,
// any stride, padding, dilation, filter size. VEC entries need C % 4 == 0 and x, w 16-byte
// aligned; float4 stores need K % 4 == 0 and y 16-byte aligned (the harness checks pointers).
// Offsets that grow with the tensors are 64-bit; R*S*C <= 2^31 - 32 and P*Q < 2^31 (checked in Python).
#include "conv2d_common.cuh"

constexpr int I_BK = 8, I_THREADS = 256;

template <int BM, int BN, bool VEC>
__device__ __forceinline__ void conv2d_igemm_simt(const float* __restrict__ x, const float* __restrict__ w,
                                                  float* __restrict__ y, int N, int C, int H, int W, int K,
                                                  int R, int S, int P, int Q, int sh, int sw, int ph, int pw,
                                                  int dh, int dw) {
    constexpr int TM = BM / 16, TN = BN / 16;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "BM and BN must be multiples of 64");
    __shared__ __align__(16) float sa[2][I_BK][BM + 4];
    __shared__ __align__(16) float sb[2][I_BK][BN + 4];

    const int tid = threadIdx.x, tn = tid % 16, tm = tid / 16;
    const idx_t M = (idx_t)N * P * Q;
    const int KG = R * S * C;
    const idx_t m0 = (idx_t)blockIdx.x * BM;
    const int k0 = blockIdx.y * BN;
    const int cv = 4 * (tid % 2);  // the 4 channels of a step this thread loads: cv .. cv+3

    // Decoded once: the output pixel whose A row this thread loads, as the top-left corner
    // (h0, w0) of its receptive field and a pointer to image n; and its row of the filter.
    const bool a_loader = tid < 2 * BM, b_loader = tid < 2 * BN;
    const idx_t am = m0 + tid / 2;
    const bool a_row_in = a_loader && am < M;
    int h0 = 0, w0 = 0;
    const float* xn = x;
    if (a_row_in) {
        const idx_t PQ = (idx_t)P * Q;
        const int n = (int)(am / PQ), pq = (int)(am % PQ);
        h0 = (pq / Q) * sh - ph;
        w0 = (pq % Q) * sw - pw;
        xn = x + (idx_t)n * H * W * C;
    }
    const int bk = k0 + tid / 2;
    const bool b_row_in = b_loader && bk < K;
    const float* wk = w + (b_row_in ? (idx_t)bk * KG : 0);

    // The GEMM-K position of the step being loaded: tap (r, s), channels c0 .. c0+BK.
    int r = 0, s = 0, c0 = 0;
    const int steps = R * S * CEIL_DIV(C, I_BK);
    float ar[4], br[4];

    auto fetch = [&]() {
        const int h = h0 + r * dh, ww = w0 + s * dw;
        const bool a_in = a_row_in && h >= 0 && h < H && ww >= 0 && ww < W;  // the padding mask
        const float* ap = xn + ((idx_t)h * W + ww) * C + c0 + cv;
        const float* bp = wk + (r * S + s) * C + c0 + cv;
        if constexpr (VEC) {  // C % 4 == 0: the 4 channels are all in or all out
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 a4 = (a_in && c0 + cv < C) ? *reinterpret_cast<const float4*>(ap) : z;
            const float4 b4 = (b_row_in && c0 + cv < C) ? *reinterpret_cast<const float4*>(bp) : z;
            ar[0] = a4.x; ar[1] = a4.y; ar[2] = a4.z; ar[3] = a4.w;
            br[0] = b4.x; br[1] = b4.y; br[2] = b4.z; br[3] = b4.w;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const bool c_in = c0 + cv + j < C;
                ar[j] = (a_in && c_in) ? ap[j] : 0.0f;
                br[j] = (b_row_in && c_in) ? bp[j] : 0.0f;
            }
        }
    };
    auto advance = [&]() {  // next step: BK more channels, or the next filter tap
        c0 += I_BK;
        if (c0 >= C) {
            c0 = 0;
            if (++s == S) {
                s = 0;
                ++r;
            }
        }
    };
    auto put = [&](int b) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (a_loader) sa[b][cv + j][tid / 2] = ar[j];
            if (b_loader) sb[b][cv + j][tid / 2] = br[j];
        }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    fetch();
    put(0);
    __syncthreads();
    int b = 0;
    for (int t = 0; t < steps; ++t, b ^= 1) {
        const bool more = t + 1 < steps;
        if (more) {
            advance();
            fetch();
        }
#pragma unroll
        for (int kk = 0; kk < I_BK; ++kk) {
            float a[TM], v[TN];
#pragma unroll
            for (int g = 0; g < TM / 4; ++g) {
                const float4 t4 = *reinterpret_cast<const float4*>(&sa[b][kk][4 * tm + 64 * g]);
                a[4 * g] = t4.x; a[4 * g + 1] = t4.y; a[4 * g + 2] = t4.z; a[4 * g + 3] = t4.w;
            }
#pragma unroll
            for (int h = 0; h < TN / 4; ++h) {
                const float4 t4 = *reinterpret_cast<const float4*>(&sb[b][kk][4 * tn + 64 * h]);
                v[4 * h] = t4.x; v[4 * h + 1] = t4.y; v[4 * h + 2] = t4.z; v[4 * h + 3] = t4.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], v[j], acc[i][j]);
        }
        if (more) put(b ^ 1);
        __syncthreads();
    }

    // Epilogue: Y[m][k] is y[n][p][q][k]; 4 consecutive channels are one float4 when K % 4 == 0.
    const bool vec_store = K % 4 == 0;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const idx_t m = m0 + 4 * tm + 64 * (i / 4) + i % 4;
        if (m >= M) continue;
        float* ym = y + m * K;
#pragma unroll
        for (int h = 0; h < TN / 4; ++h) {
            const int k = k0 + 4 * tn + 64 * h;
            if (vec_store && k + 3 < K) {
                *reinterpret_cast<float4*>(ym + k) =
                    make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (k + j < K) ym[k + j] = acc[i][4 * h + j];
            }
        }
    }
}

// One entry per tile description and load path: conv2d_igemm_simt_<BM>x<BN>_<vec|scalar>.
// MINB: the 8 x 8 thread tile needs more than the 128 registers two blocks per SM allow.
#define IGEMM_ENTRY(BM, BN, VEC, NAME, MINB_I)                                                             \
    extern "C" __global__ void __launch_bounds__(I_THREADS, MINB_I)                                       \
        conv2d_igemm_simt_##BM##x##BN##_##NAME(const float* __restrict__ x, const float* __restrict__ w,   \
                                               float* __restrict__ y, int N, int C, int H, int W, int K,  \
                                               int R, int S, int P, int Q, int sh, int sw, int ph, int pw, \
                                               int dh, int dw, int groups) {                               \
        conv2d_igemm_simt<BM, BN, VEC>(x, w, y, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw);      \
    }
#define IGEMM_ENTRIES(BM, BN, MINB_I) \
    IGEMM_ENTRY(BM, BN, true, vec, MINB_I) IGEMM_ENTRY(BM, BN, false, scalar, MINB_I)

IGEMM_ENTRIES(128, 128, 1)
IGEMM_ENTRIES(128, 64, 2)
IGEMM_ENTRIES(64, 128, 2)
IGEMM_ENTRIES(64, 64, 2)
