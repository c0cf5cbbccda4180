// Day 11 - igemm_mma: implicit GEMM on tensor cores with mma.sync and ldmatrix. NHWC, fp16/bf16
// in and out, fp32 accumulation.
//
// The GEMM view is day 09's (GEMM-M = N*P*Q pixels, GEMM-N = K, GEMM-K = R*S*C, A = the input
// under the filter taps, B = the KRSC filter, Y = y). What changed since day 10 (WMMA):
// 1. The tensor-core instruction itself, through inline PTX:
//      mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
//    one warp multiplies a 16x16 A fragment by a 16x8 B fragment into 16x8 fp32 accumulators.
//    Unlike WMMA's opaque fragments, the PTX ISA documents which lane holds which element, so
//    the epilogue writes y straight from the accumulator registers:
//      lane l holds rows l/4 and l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1 of the 16x8 tile.
// 2. ldmatrix.x4 loads a whole 16x16 A fragment (four 8x8 matrices, one 16-byte row per lane)
//    from shared memory into the registers mma.sync expects, in one instruction.
// 3. XOR-swizzled shared memory instead of padding. A stage holds sa[BM][BK] and sb[BN][BK]
//    halves, BK = 32: a row is 64 bytes, four 16-byte chunks. The chunk ch of row r is stored
//    at chunk ch ^ ((r >> 1) & 3). ldmatrix reads chunk ch of 8 consecutive rows; unswizzled,
//    rows r and r + 2 are 128 bytes apart and hit the same banks (4-way conflict); swizzled,
//    the 8 rows' chunks fall in 8 different 16-byte bank groups: conflict-free, with no
//    padding bytes. The 16-byte stores of the loaders are conflict-free too.
//
// Block tile BM x BN x BK = 128 x 128 x 32, 256 threads = 8 warps as 2 (M) x 4 (N); warp tile
// 64 x 32 = 4 x 4 mma tiles of 16 x 8; per BK step a warp runs 2 x 16 mma.sync (k16 each).
// Mapping: warp = tid / 32, wm = warp / 4, wn = warp % 4, lane = tid % 32;
//   warp rows m0 + 64*wm + 16*i + {lane/4, lane/4 + 8}, i < 4          m0 = blockIdx.x * 128
//   warp cols k0 + 32*wn + 8*j + 2*(lane%4) + {0, 1}, j < 4            k0 = blockIdx.y * 128
//   loads: chunk q = tid + 256*u (u < 2) of a stage is row q / 4, 16-byte chunk q % 4 (8 channels),
//   of A and of B: each thread decodes its two pixels and two filter rows once.
// GEMM-K walk, two load paths (entry point per problem):
//   vec (C % 8 == 0): tap-major like day 09: for each tap (r, s), channels c0 .. c0+32 as four
//        16-byte loads; padding and c >= C read as zeros.
//   scalar (any C): GEMM-K in flat steps of 32, each element decoded as (r, s, c) = kg / (S*C),
//        (kg / C) % S, kg % C (day 09 (a)'s analytic iterator) and loaded alone.
// Double buffering as day 09: the next step's global loads go to registers before this step's
// mma.sync, and to the other shared stage after them; one barrier per step.
// Launch: block (256, 1, 1); grid (ceil(M / 128), ceil(K / 128), 1); static shared memory
//   2 stages * (128 + 128) * 32 * 2 bytes = 32 KB.
//
// Assumes: NHWC x [N][H][W][C], KRSC w [K][R][S][C], NHWC y [N][P][Q][K], all fp16 or all bf16,
// groups = 1, any stride, padding, dilation, filter size. vec entries need x and w 16-byte
// aligned (the harness checks); y stores are pairs (4 bytes) where K is even. sm_80+.
// Offsets that grow with the tensors are 64-bit; R*S*C <= 2^31 - 32 and P*Q < 2^31 (checked in Python).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv2d_common.cuh"

constexpr int MB = 128, NB = 128, KB = 32, MMA_THREADS = 256;

// Offset (in halves) of 16-byte chunk ch of row r in a [rows][32] stage, XOR-swizzled.
__device__ __forceinline__ int swz(int r, int ch) { return r * KB + ((ch ^ ((r >> 1) & 3)) << 3); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two fp32 accumulators -> one pair of output elements (4 bytes).
template <bool BF16>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    if constexpr (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&v);
    }
}

template <bool BF16>
__device__ __forceinline__ unsigned short to_bits(float v) {
    if constexpr (BF16) {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        return *reinterpret_cast<unsigned short*>(&h);
    } else {
        __half h = __float2half_rn(v);
        return *reinterpret_cast<unsigned short*>(&h);
    }
}

template <bool BF16, bool VEC>
__device__ __forceinline__ void conv2d_igemm_mma(const unsigned short* __restrict__ x,
                                                 const unsigned short* __restrict__ w,
                                                 unsigned short* __restrict__ y, int N, int C, int H, int W,
                                                 int K, int R, int S, int P, int Q, int sh, int sw, int ph,
                                                 int pw, int dh, int dw) {
    __shared__ __align__(128) unsigned short sa[2][MB * KB];
    __shared__ __align__(128) unsigned short sb[2][NB * KB];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wm = warp / 4, wn = warp % 4;
    const idx_t M = (idx_t)N * P * Q;
    const int KG = R * S * C;
    const idx_t m0 = (idx_t)blockIdx.x * MB;
    const int k0 = blockIdx.y * NB;
    const int ch = tid % 4;  // this thread's 16-byte chunk of every row it loads

    // Decoded once: the two pixels (A rows tid/4 and tid/4 + 64) and the two filters (B rows)
    // this thread loads for.
    int h0[2], w0[2];
    bool a_row[2], b_row[2];
    const unsigned short* xn[2];
    const unsigned short* wk[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const idx_t m = m0 + tid / 4 + 64 * u;
        a_row[u] = m < M;
        const idx_t PQ = (idx_t)P * Q;
        const int n = a_row[u] ? (int)(m / PQ) : 0, pq = a_row[u] ? (int)(m % PQ) : 0;
        h0[u] = (pq / Q) * sh - ph;
        w0[u] = (pq % Q) * sw - pw;
        xn[u] = x + (idx_t)n * H * W * C;
        const int k = k0 + tid / 4 + 64 * u;
        b_row[u] = k < K;
        wk[u] = w + (b_row[u] ? (idx_t)k * KG : 0);
    }

    // GEMM-K position of the step being loaded. vec: tap (r, s) and channel c0; scalar: kg0.
    int r = 0, s = 0, c0 = 0, kg0 = 0;
    const int steps = VEC ? R * S * CEIL_DIV(C, KB) : CEIL_DIV(KG, KB);
    uint4 ar[2], br[2];

    auto fetch = [&]() {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            if constexpr (VEC) {
                const int c = c0 + 8 * ch;
                const int h = h0[u] + r * dh, ww = w0[u] + s * dw;
                const bool a_in = a_row[u] && c < C && h >= 0 && h < H && ww >= 0 && ww < W;
                const bool b_in = b_row[u] && c < C;
                const uint4 z = make_uint4(0, 0, 0, 0);
                ar[u] = a_in ? *reinterpret_cast<const uint4*>(xn[u] + ((idx_t)h * W + ww) * C + c) : z;
                br[u] = b_in ? *reinterpret_cast<const uint4*>(wk[u] + (r * S + s) * C + c) : z;
            } else {
                unsigned short av[8], bv[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int kg = kg0 + 8 * ch + j;
                    const int rr = kg / (S * C), ss = (kg / C) % S, c = kg % C;  // analytic decode
                    const int h = h0[u] + rr * dh, ww = w0[u] + ss * dw;
                    const bool a_in = a_row[u] && kg < KG && h >= 0 && h < H && ww >= 0 && ww < W;
                    av[j] = a_in ? xn[u][((idx_t)h * W + ww) * C + c] : (unsigned short)0;
                    bv[j] = (b_row[u] && kg < KG) ? wk[u][kg] : (unsigned short)0;
                }
                ar[u] = make_uint4(av[0] | (unsigned)av[1] << 16, av[2] | (unsigned)av[3] << 16,
                                   av[4] | (unsigned)av[5] << 16, av[6] | (unsigned)av[7] << 16);
                br[u] = make_uint4(bv[0] | (unsigned)bv[1] << 16, bv[2] | (unsigned)bv[3] << 16,
                                   bv[4] | (unsigned)bv[5] << 16, bv[6] | (unsigned)bv[7] << 16);
            }
        }
    };
    auto advance = [&]() {
        if constexpr (VEC) {
            c0 += KB;
            if (c0 >= C) {
                c0 = 0;
                if (++s == S) {
                    s = 0;
                    ++r;
                }
            }
        } else {
            kg0 += KB;
        }
    };
    auto put = [&](int b) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int row = tid / 4 + 64 * u;
            *reinterpret_cast<uint4*>(&sa[b][swz(row, ch)]) = ar[u];
            *reinterpret_cast<uint4*>(&sb[b][swz(row, ch)]) = br[u];
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

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
        for (int kk = 0; kk < KB / 16; ++kk) {
            unsigned af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i)  // A 16x16: lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 at k 8-15
                ldsm_x4(af[i], &sa[b][swz(64 * wm + 16 * i + lane % 16, 2 * kk + lane / 16)]);
#pragma unroll
            for (int j2 = 0; j2 < 2; ++j2) {  // two 16x8 B tiles: (n 0-7 | 8-15) x (k 0-7 | 8-15)
                unsigned q[4];
                ldsm_x4(q, &sb[b][swz(32 * wn + 16 * j2 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1))]);
                bf[2 * j2][0] = q[0];
                bf[2 * j2][1] = q[1];
                bf[2 * j2 + 1][0] = q[2];
                bf[2 * j2 + 1][1] = q[3];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816<BF16>(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
        if (more) put(b ^ 1);
        __syncthreads();
    }

    // Epilogue from the accumulator registers: Y[m][k] = y[n][p][q][k], a pair of channels per store.
    const bool pairs = K % 2 == 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int half_ = 0; half_ < 2; ++half_) {
            const idx_t m = m0 + 64 * wm + 16 * i + lane / 4 + 8 * half_;
            if (m >= M) continue;
            unsigned short* ym = y + m * K;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = k0 + 32 * wn + 8 * j + 2 * (lane % 4);
                const float v0 = acc[i][j][2 * half_], v1 = acc[i][j][2 * half_ + 1];
                if (pairs && k + 1 < K) {
                    *reinterpret_cast<unsigned*>(ym + k) = pack2<BF16>(v0, v1);
                } else {
                    if (k < K) ym[k] = to_bits<BF16>(v0);
                    if (k + 1 < K) ym[k + 1] = to_bits<BF16>(v1);
                }
            }
        }
    }
}

#define MMA_ENTRY(DT, BF16, PATH, VEC)                                                                  \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS, 1)                                        \
        conv2d_igemm_mma_##DT##_##PATH(const unsigned short* __restrict__ x,                           \
                                       const unsigned short* __restrict__ w, unsigned short* __restrict__ y, \
                                       int N, int C, int H, int W, int K, int R, int S, int P, int Q,  \
                                       int sh, int sw, int ph, int pw, int dh, int dw, int groups) {   \
        conv2d_igemm_mma<BF16, VEC>(x, w, y, N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw);       \
    }
MMA_ENTRY(fp16, false, vec, true)
MMA_ENTRY(fp16, false, scalar, false)
MMA_ENTRY(bf16, true, vec, true)
MMA_ENTRY(bf16, true, scalar, false)
