// Day 10 - igemm_wmma: implicit GEMM on tensor cores through the WMMA API. NHWC fp16/bf16 in,
// fp32 accumulation, fp16/bf16 out.
//
// The GEMM view is day 09's (09_igemm_simt.cu):
//     GEMM-M = N*P*Q (pixels), GEMM-N = K (output channels), GEMM-K = R*S*C (taps x channels)
//     A[m][kg] = x[n][p*sh - ph + r*dh][q*sw - pw + s*dw][c],  B[kg][k] = w[k][r][s][c],  Y = y.
// So are the tap-major walk over GEMM-K (for each filter tap (r, s), the C channels in steps of
// BK, zeros for the padding and for c >= C), the pixel and filter rows decoded once per thread,
// and the register-prefetch double buffer (two shared-memory stages, one barrier per step).
//
// What changed since day 09:
// 1. The arithmetic runs on tensor cores. Day 09's threads each did an 8 x 8 outer product with
//    FFMAs; here a *warp* computes a 16 x 16 x 16 matrix product D = A*B + C in one call,
//    nvcuda::wmma::mma_sync (NVIDIA CUDA C++ Programming Guide, "Warp Matrix Functions"). Its
//    operands are *fragments*: 16 x 16 tiles spread over the registers of the warp's 32 lanes in
//    a layout the programmer does not see. load_matrix_sync fills a fragment from memory (a
//    pointer, a row stride `ldm` in elements, row- or column-major), mma_sync multiplies, and
//    store_matrix_sync writes the float accumulator back to memory. All three are collective:
//    every lane of the warp calls them with the same arguments.
// 2. Half the bytes: x, w and y are 16-bit (fp16 or bf16, a template parameter); the sums are
//    fp32 accumulator fragments, rounded to 16 bits only once, when y is written.
// 3. Deeper steps: BK = 32 channels of one tap per step, two k = 16 slices of mma_sync. The slice
//    loop is deliberately not unrolled: unrolled, the compiler hoists the second slice's
//    fragment loads above the first slice's mma_sync, which needs ~150 registers per thread;
//    rolled, the kernel fits the 128 that two 256-thread blocks per SM allow, without spills.
// 4. Shared rows padded by 8 elements (16 bytes), [BM][BK + 8] and [BN][BK + 8]. A fragment load
//    reads 8 rows of 16 bytes at a time (one 8 x 8 sub-matrix). Without padding the row stride is
//    64 bytes = 16 banks, so rows 0, 2, 4, 6 start in the same bank: a 4-way conflict. With 80-byte
//    rows (20 banks) the 8 rows start at banks 0, 20, 8, 28, 16, 4, 24, 12 and cover all 32 banks
//    once. The 16-byte stores of the loaders use the same 8-rows-per-phase pattern (see the
//    loader mapping), so they are conflict-free too. ldm must be a multiple of 8 elements for
//    16-bit types and fragment pointers 32-byte aligned, which BK + 8 = 40 keeps.
// 5. An epilogue through shared memory: the accumulator layout is opaque, so each warp stores its
//    fragments (two at a time, 16 x 32 floats, ldm = 36) into its own slice of the drained
//    stage buffers, then reads them back as rows of 8 channels, converts to 16 bits and writes y
//    with 16-byte stores (K % 8 == 0) or element by element.
//
// Tile (compile-time constants below):
//   block tile BM x BN = 128 (pixels) x 128 (channels), BK = 32 GEMM-K per step, 256 threads
//   = 8 warps arranged 2 (M) x 4 (N); warp tile WM x WN = 64 x 32 = 4 x 2 fragments of 16 x 16,
//   8 float accumulator fragments (64 registers) per thread.
// Mapping: warp = tid / 32, lane = tid % 32; wm = warp / 4, wn = warp % 4;
//   warp (wm, wn) owns rows m0 + 64*wm .. +63 and columns k0 + 32*wn .. +31 of Y,
//   fragment (i, j) of it rows + 16*i, columns + 16*j.     m0 = blockIdx.x * BM, k0 = blockIdx.y * BN
//   loads: thread (warp, lane) moves row ld_row = 32 * (warp / 2) + lane of the A tile and of the
//          B tile, channels ld_col = 16 * (warp % 2) .. +15 of the step: two 16-byte chunks, i.e.
//          one whole 32-byte sector of its pixel (or filter) per step. The 8 lanes of a 16-byte
//          store phase write 8 consecutive rows at the same column: conflict-free (change 4).
// Launch: block (256, 1, 1); grid (ceil(M / BM), ceil(K / BN), 1); static shared memory
//   2 stages * (BM + BN) * (BK + 8) * 2 bytes = 40960 bytes.
//
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], all fp16 or all bf16,
// groups = 1, any stride, padding, dilation, filter size, C and K. VEC entries need C % 8 == 0
// and x, w 16-byte aligned (8 channels are one 16-byte load); the 16-byte stores need K % 8 == 0
// and y 16-byte aligned (the harness checks pointers and picks the entry). Needs sm_80+ for the
// bf16 entries (sm_70+ for fp16 WMMA; the harness asks for sm_80+ throughout). Offsets that grow
// with the tensors are 64-bit; R*S*C <= 2^31 - 32 and P*Q < 2^31 (checked in Python).
//
// Sources: CUDA C++ Programming Guide, "Warp Matrix Functions"; CUTLASS
// docs/implicit_gemm_convolution.md (the GEMM view and tap-major iterators).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "conv2d_common.cuh"

using namespace nvcuda;

constexpr int W_BM = 128, W_BN = 128, W_BK = 32;  // block tile and GEMM-K per step
constexpr int W_WM = 64, W_WN = 32;               // warp tile: 4 x 2 fragments
constexpr int W_F = 16;                           // fragment edge: wmma 16 x 16 x 16
constexpr int W_PAD = 8;                          // elements of padding per shared row (change 4)
constexpr int W_LDS = W_BK + W_PAD;               // shared row stride, elements (40 = 80 bytes)
constexpr int W_EPI_LD = W_WN + 4;                // epilogue row stride, floats (36)
constexpr int W_THREADS = 256;
constexpr int W_STAGE_ELEMS = (W_BM + W_BN) * W_LDS;                  // one stage, A then B
constexpr int W_SMEM_BYTES = 2 * W_STAGE_ELEMS * 2;                   // two stages of 16-bit values
static_assert(8 * W_F * W_EPI_LD * 4 <= W_SMEM_BYTES, "the epilogue reuses the stage buffers");
static_assert(W_LDS % 8 == 0, "wmma ldm must be a multiple of 8 elements for 16-bit types");

// The two element types: float -> 16 bits, for one value and for a packed pair.
template <typename T>
struct Elem;
template <>
struct Elem<__half> {
    static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const unsigned*>(&h);
    }
};
template <>
struct Elem<__nv_bfloat16> {
    static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const unsigned*>(&h);
    }
};

template <typename T, bool VEC>
__device__ __forceinline__ void conv2d_igemm_wmma(const T* __restrict__ x, const T* __restrict__ w,
                                                  T* __restrict__ y, int N, int C, int H, int W, int K, int R,
                                                  int S, int P, int Q, int sh, int sw, int ph, int pw, int dh,
                                                  int dw) {
    using FragA = wmma::fragment<wmma::matrix_a, W_F, W_F, W_F, T, wmma::row_major>;
    using FragB = wmma::fragment<wmma::matrix_b, W_F, W_F, W_F, T, wmma::col_major>;
    using FragC = wmma::fragment<wmma::accumulator, W_F, W_F, W_F, float>;

    // Two stages of sa[BM][LDS] (A: pixel rows, GEMM-K contiguous) and sb[BN][LDS] (B: filter
    // rows, GEMM-K contiguous, which is B column-major), carved from one buffer that the
    // epilogue reuses as float tiles.
    __shared__ __align__(128) unsigned char smem[W_SMEM_BYTES];
    typedef T Row[W_LDS];
    Row* const sa = reinterpret_cast<Row*>(smem);                   // sa[stage * BM + row][kk]
    Row* const sb = reinterpret_cast<Row*>(smem) + 2 * W_BM;        // sb[stage * BN + row][kk]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4;
    const idx_t M = (idx_t)N * P * Q;
    const int KG = R * S * C;
    const idx_t m0 = (idx_t)blockIdx.x * W_BM;
    const int k0 = blockIdx.y * W_BN;

    // Loader mapping: row ld_row of each tile, channels ld_col .. ld_col + 15 of the step.
    const int ld_row = 32 * (warp / 2) + lane, ld_col = 16 * (warp % 2);

    // Decoded once: the top-left input corner (h0, w0) of the A row's receptive field and a
    // pointer to its image; a pointer to the B row's filter.
    const idx_t am = m0 + ld_row;
    const bool a_row_in = am < M;
    int h0 = 0, w0 = 0;
    const T* xn = x;
    if (a_row_in) {
        const idx_t PQ = (idx_t)P * Q;
        const int n = (int)(am / PQ), pq = (int)(am % PQ);
        h0 = (pq / Q) * sh - ph;
        w0 = (pq % Q) * sw - pw;
        xn = x + (idx_t)n * H * W * C;
    }
    const int bk = k0 + ld_row;
    const bool b_row_in = bk < K;
    const T* wk = w + (b_row_in ? (idx_t)bk * KG : 0);

    // The GEMM-K position of the step being loaded: tap (r, s), channels c0 .. c0 + BK - 1.
    int r = 0, s = 0, c0 = 0;
    const int steps = R * S * CEIL_DIV(C, W_BK);
    uint4 ar[2], br[2];  // the prefetch registers: 2 x 8 raw 16-bit values of A, and of B

    // Load 8 channels starting at p (masked: `ok` for the row/padding, c < C per lane) as raw
    // bits; 0x0000 is +0.0 in fp16 and bf16 alike, so the loader never needs to know T.
    auto load8 = [&](const T* p, bool ok, int c) -> uint4 {
        if constexpr (VEC) {  // C % 8 == 0: the 8 channels are all in or all out
            return (ok && c < C) ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
        } else {
            const unsigned short* p16 = reinterpret_cast<const unsigned short*>(p);
            unsigned v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned lo = (ok && c + 2 * j < C) ? p16[2 * j] : 0u;
                const unsigned hi = (ok && c + 2 * j + 1 < C) ? p16[2 * j + 1] : 0u;
                v[j] = lo | (hi << 16);
            }
            return make_uint4(v[0], v[1], v[2], v[3]);
        }
    };
    auto fetch = [&]() {
        const int c = c0 + ld_col;
        const int h = h0 + r * dh, ww = w0 + s * dw;
        const bool a_in = a_row_in && h >= 0 && h < H && ww >= 0 && ww < W;  // the padding mask
        const T* ap = xn + ((idx_t)h * W + ww) * C + c;
        const T* bp = wk + (r * S + s) * C + c;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            ar[j] = load8(ap + 8 * j, a_in, c + 8 * j);
            br[j] = load8(bp + 8 * j, b_row_in, c + 8 * j);
        }
    };
    auto advance = [&]() {  // next step: BK more channels, or the next filter tap
        c0 += W_BK;
        if (c0 >= C) {
            c0 = 0;
            if (++s == S) {
                s = 0;
                ++r;
            }
        }
    };
    auto put = [&](int b) {  // 16-byte stores into stage b
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            *reinterpret_cast<uint4*>(&sa[b * W_BM + ld_row][ld_col + 8 * j]) = ar[j];
            *reinterpret_cast<uint4*>(&sb[b * W_BN + ld_row][ld_col + 8 * j]) = br[j];
        }
    };

    FragC acc[W_WM / W_F][W_WN / W_F];
#pragma unroll
    for (int i = 0; i < W_WM / W_F; ++i)
#pragma unroll
        for (int j = 0; j < W_WN / W_F; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    fetch();
    put(0);
    __syncthreads();
    int b = 0;
    for (int t = 0; t < steps; ++t, b ^= 1) {
        const bool more = t + 1 < steps;
        if (more) {  // the next step's global loads, in flight during this step's mma
            advance();
            fetch();
        }
#pragma unroll 1
        for (int kk = 0; kk < W_BK; kk += W_F) {
            FragB fb[W_WN / W_F];  // the warp's 2 B fragments, reused by its 4 A fragments
#pragma unroll
            for (int j = 0; j < W_WN / W_F; ++j)
                wmma::load_matrix_sync(fb[j], &sb[b * W_BN + W_WN * wn + W_F * j][kk], W_LDS);
#pragma unroll
            for (int i = 0; i < W_WM / W_F; ++i) {
                FragA fa;
                wmma::load_matrix_sync(fa, &sa[b * W_BM + W_WM * wm + W_F * i][kk], W_LDS);
#pragma unroll
                for (int j = 0; j < W_WN / W_F; ++j) wmma::mma_sync(acc[i][j], fa, fb[j], acc[i][j]);
            }
        }
        if (more) put(b ^ 1);
        __syncthreads();
    }

    // Epilogue. The loop ended on a barrier, so the stage buffers are free: each warp gets a
    // 16 x 36-float slice and writes its warp tile in 4 passes of one fragment row (16 x 32).
    // Lane q of a pass converts row q / 4 (and q / 4 + 8), channels 8 * (q % 4) .. +7.
    float* const epi = reinterpret_cast<float*>(smem) + warp * W_F * W_EPI_LD;
    const bool vec_store = K % 8 == 0;
#pragma unroll
    for (int i = 0; i < W_WM / W_F; ++i) {
#pragma unroll
        for (int j = 0; j < W_WN / W_F; ++j)
            wmma::store_matrix_sync(epi + W_F * j, acc[i][j], W_EPI_LD, wmma::mem_row_major);
        __syncwarp();
#pragma unroll
        for (int part = 0; part < 2; ++part) {
            const int row = lane / 4 + 8 * part, col = 8 * (lane % 4);
            const idx_t m = m0 + W_WM * wm + W_F * i + row;
            const int k = k0 + W_WN * wn + col;
            const float* e = epi + row * W_EPI_LD + col;
            if (m < M && k < K) {
                T* ym = y + m * K + k;
                if (vec_store) {  // K % 8 == 0 and k % 8 == 0: all 8 channels exist
                    const float4 lo = *reinterpret_cast<const float4*>(e);
                    const float4 hi = *reinterpret_cast<const float4*>(e + 4);
                    *reinterpret_cast<uint4*>(ym) =
                        make_uint4(Elem<T>::pack2(lo.x, lo.y), Elem<T>::pack2(lo.z, lo.w),
                                   Elem<T>::pack2(hi.x, hi.y), Elem<T>::pack2(hi.z, hi.w));
                } else {
#pragma unroll
                    for (int jj = 0; jj < 8; ++jj)
                        if (k + jj < K) ym[jj] = Elem<T>::from_float(e[jj]);
                }
            }
        }
        __syncwarp();  // the slice is read before the next pass overwrites it
    }
}

// One entry per element type and load path: conv2d_igemm_wmma_<fp16|bf16>_<vec|scalar>.
// __launch_bounds__(256, 2): at most 128 registers per thread, so that two blocks (16 warps,
// 80 KB of shared memory) share an SM. bf16 fragments exist from sm_80 on; built for an older
// target, the bf16 entries are traps (the harness refuses GPUs below sm_80 before any launch).
#define WMMA_ARGS                                                                                       \
    int N, int C, int H, int W, int K, int R, int S, int P, int Q, int sh, int sw, int ph, int pw, int dh, \
        int dw, int groups
#define WMMA_CALL(T, VEC) \
    conv2d_igemm_wmma<T, VEC>(x, w, y, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw)

extern "C" __global__ void __launch_bounds__(W_THREADS, 2)
    conv2d_igemm_wmma_fp16_vec(const __half* __restrict__ x, const __half* __restrict__ w,
                               __half* __restrict__ y, WMMA_ARGS) {
    WMMA_CALL(__half, true);
}
extern "C" __global__ void __launch_bounds__(W_THREADS, 2)
    conv2d_igemm_wmma_fp16_scalar(const __half* __restrict__ x, const __half* __restrict__ w,
                                  __half* __restrict__ y, WMMA_ARGS) {
    WMMA_CALL(__half, false);
}
extern "C" __global__ void __launch_bounds__(W_THREADS, 2)
    conv2d_igemm_wmma_bf16_vec(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                               __nv_bfloat16* __restrict__ y, WMMA_ARGS) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    WMMA_CALL(__nv_bfloat16, true);
#else
    __trap();
#endif
}
extern "C" __global__ void __launch_bounds__(W_THREADS, 2)
    conv2d_igemm_wmma_bf16_scalar(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                  __nv_bfloat16* __restrict__ y, WMMA_ARGS) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    WMMA_CALL(__nv_bfloat16, false);
#else
    __trap();
#endif
}
