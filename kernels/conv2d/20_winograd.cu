// Day 20 - winograd_f2, winograd_f4: Winograd's minimal filtering F(m x m, 3 x 3) on CUDA cores,
// fp32, as a pipeline of four kernels over a workspace (not fused: each step is its own launch).
//
// What changed since day 09: the multiplications. A direct 3 x 3 convolution spends 9 per output
// pixel and channel pair; Winograd's F(m x m, 3 x 3) computes an m x m output tile from an
// n x n input tile (n = m + 2) with n^2 multiplications in a transform domain:
//     Y = A^T [ sum_c (G g_c G^T) (.) (B^T d_c B) ] A          (.) elementwise, per output channel k
// (Lavin and Gray, CVPR 2016). The sum over the channels c sits inside the transform domain, so
// for each of the n^2 positions (xi, nu) it is one GEMM over all tiles and filters:
//     M[xi nu] = U[xi nu] (K x C) . V[xi nu] (C x tiles):   per whole tile, F(2, 3) runs 16 GEMMs of 1/36
//     the direct FLOPs each (16/36: 2.25x fewer in all), F(4, 3) 36 of 1/144 each (4x fewer); tiles
//     that stick out past P and Q spend FLOPs on no output and cut the saving.
// The transforms' constants (A^T m x n, G n x 3, B^T n x n) are not typed here: they are built
// exactly in days/day20_winograd/pipeline.py (`winograd(m)`) and passed as -D defines (`kernel_defines`):
//   WINO_M = m;  WINO_AT, WINO_G, WINO_BT: the matrices row by row, each entry WINO_E(value) with
//   value the float32 nearest the exact fraction (a comma-free list: nvcc splits -D values at commas).
// The matrices and the tile transforms (mul_left, mul_right_t, filter_tile, input_tile, output_tile,
// TileOrigin) live in winograd_transforms.cuh, which day 21's fused kernel (21_winograd_fused.cu) shares.
//
// The kernels of a run, in launch order (grid-stride loops over 1-D grids of 256 threads, except the GEMM):
//   wino_filter_<layout>  w -> U = G g G^T, per (filter k, channel c)
//   wino_input_<layout>   x -> V = B^T d B, per (tile t, channel c); d the n x n input patch of tile t,
//                         rows th*m - pad_h .., columns tw*m - pad_w .., zeros outside the image
//   wino_gemm_<BM>x<BN>   M[z] = A[z] . B[z] for the z = 0 .. n^2 - 1 transform positions (grid z)
//   wino_output_<layout>  M -> y = A^T M A, per (tile t, filter k), only the pixels inside P x Q
// Tiles: t = (n * tP + th) * tQ + tw, tP = ceil(P / m), tQ = ceil(Q / m), T = N tP tQ.
//
// The workspace layout follows the entry's layout, so that every transform reads and writes along
// the contiguous axis and the GEMM is always row-major A (Mg x Kg) times row-major B (Kg x Ng):
//   NCHW: U[n^2][K][Cp], V[n^2][Cp][Tp], M[n^2][K][Tp]   GEMM (Mg, Ng, Kg) = (K, Tp, Cp), A = U, B = V
//   NHWC: U[n^2][Cp][Kp], V[n^2][T][Cp], M[n^2][T][Kp]   GEMM (Mg, Ng, Kg) = (T, Kp, Cp), A = V, B = U
// with Cp = C rounded up to 8 (the GEMM's BK), Tp = T and Kp = K rounded up to 4 (a float4 row).
// The transforms write zeros into the padding, so the GEMM needs no mask along Kg and loads whole
// float4s along Ng; every element of U, V and M is written exactly once per run (Python models:
// transform_writes, gemm_writes_model, workspace_writes, and output_writes for y).
//
// wino_gemm_<BM>x<BN>: day 09's register tiling on plain operands: 256 threads, BM x BN in
// {128 x 128, 128 x 64, 64 x 128, 64 x 64}, BK = 8, thread tile BM/16 x BN/16, double-buffered
// shared memory (static: 2 * 8 * (BM + 4 + BN) * 4 bytes, 16.6 KB at 128 x 128).
//   tid = threadIdx.x, tn = tid % 16, tm = tid / 16: rows m0 + 4 tm + 64 g + i, columns n0 + 4 tn + 64 h + j;
//   A: thread tid < 2 BM loads row tid / 2, k 4 (tid % 2) .. + 3 of a step (one float4), stored
//      transposed in sa[k][m] (rows padded by 4 floats: the transposing stores hit 32 banks);
//   B: thread tid < 2 BN loads row tid / (BN / 4), columns 4 (tid % (BN / 4)) .. + 3 (one float4),
//      stored as it is in sb[k][n].
//   Grid (x, y, z): the filters' tile index on x (few: the blocks that share a tile of the big operand,
//   V, run side by side and find it in L2), the tiles' on y, the position on z; m_on_x says whether
//   GEMM-M is on x (NCHW: M = K) or on y (NHWC: M = T).
// Rounding: each output of the GEMM is one chain of FMAs over c = 0 .. Cp - 1, whatever the block
// tile, and each transform a fixed sum of products in a fixed order (`mul_left`, `mul_right_t`),
// so two runs, and a run of one image against a batch, agree bit for bit.
//
// Assumes: stride 1, dilation 1, groups 1, a 3 x 3 filter, fp32; NCHW x [N][C][H][W], KCRS w,
// NCHW y [N][K][P][Q], or NHWC x [N][H][W][C], KRSC w [K][3][3][C], NHWC y [N][P][Q][K]; any
// padding, any H, W, C, K. The workspace 16-byte aligned (each part starts 256-byte aligned).
// Offsets that grow with the tensors are 64-bit; T, Cp, Kp, Tp and the GEMM's grid fit their ints
// (days/day20_winograd/pipeline.py refuses what does not, and a workspace over its limit).
#include "winograd_transforms.cuh"  // WM, WR, WN, MatAT/MatG/MatBT, mul_left, mul_right_t, the tiles

constexpr int W_THREADS = 256;  // the transforms' blocks

// The grid-stride loop of the transforms: for (i = first; i < total; i += step).
#define GRID_STRIDE_LOOP(i, total)                                                    \
    for (idx_t i = (idx_t)blockIdx.x * blockDim.x + threadIdx.x; i < (total); \
         i += (idx_t)gridDim.x * blockDim.x)

// ---- step 1: the filter transform, U = G g G^T ----------------------------------------------------

// NCHW: w KCRS -> U[n^2][K][Cp]; element i = k Cp + c (c fastest: a warp writes consecutive channels);
// c >= C: zeros.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_filter_nchw(const float* __restrict__ w, float* __restrict__ U, int K, int C, int Cp) {
    const idx_t plane = (idx_t)K * Cp;
    GRID_STRIDE_LOOP(i, plane) {
        const int k = (int)(i / Cp), c = (int)(i - (idx_t)k * Cp);
        float g[WR][WR];
        const float* wk = w + ((idx_t)k * C + (c < C ? c : 0)) * (WR * WR);
#pragma unroll
        for (int r = 0; r < WR; ++r)
#pragma unroll
            for (int s = 0; s < WR; ++s) g[r][s] = c < C ? wk[r * WR + s] : 0.0f;
        float u[WN][WN];
        filter_tile(g, u);
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) U[(xi * WN + nu) * plane + i] = u[xi][nu];
    }
}

// NHWC: w KRSC -> U[n^2][Cp][Kp]; element i = c Kp + k (k fastest); c >= C or k >= K: zeros.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_filter_nhwc(const float* __restrict__ w, float* __restrict__ U, int K, int C, int Cp, int Kp) {
    const idx_t plane = (idx_t)Cp * Kp;
    GRID_STRIDE_LOOP(i, plane) {
        const int c = (int)(i / Kp), k = (int)(i - (idx_t)c * Kp);
        const bool in = c < C && k < K;
        float g[WR][WR];
        const float* wk = w + (in ? (idx_t)k * WR * WR * C + c : 0);
#pragma unroll
        for (int r = 0; r < WR; ++r)
#pragma unroll
            for (int s = 0; s < WR; ++s) g[r][s] = in ? wk[(idx_t)(r * WR + s) * C] : 0.0f;
        float u[WN][WN];
        filter_tile(g, u);
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) U[(xi * WN + nu) * plane + i] = u[xi][nu];
    }
}

// ---- step 2: the input transform, V = B^T d B -----------------------------------------------------

// NCHW: x [N][C][H][W] -> V[n^2][Cp][Tp]; element i = c Tp + t (t fastest: a warp writes
// consecutive tiles and reads the rows of neighbouring patches); c >= C or t >= T: zeros.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_input_nchw(const float* __restrict__ x, float* __restrict__ V, int N, int C, int H, int W, int pad_h,
                    int pad_w, int tP, int tQ, int Cp, int Tp) {
    const int T = N * tP * tQ;
    const idx_t plane = (idx_t)Cp * Tp;
    GRID_STRIDE_LOOP(i, plane) {
        const int c = (int)(i / Tp), t = (int)(i - (idx_t)c * Tp);
        const bool in = c < C && t < T;
        const TileOrigin o(in ? t : 0, tP, tQ, pad_h, pad_w);
        const float* xc = x + ((idx_t)o.n * C + (in ? c : 0)) * H * W;
        float d[WN][WN];
#pragma unroll
        for (int a = 0; a < WN; ++a)
#pragma unroll
            for (int b = 0; b < WN; ++b) {
                const int h = o.h0 + a, ww = o.w0 + b;
                d[a][b] = in && h >= 0 && h < H && ww >= 0 && ww < W ? xc[(idx_t)h * W + ww] : 0.0f;
            }
        float v[WN][WN];
        input_tile(d, v);
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) V[(xi * WN + nu) * plane + i] = v[xi][nu];
    }
}

// NHWC: x [N][H][W][C] -> V[n^2][T][Cp]; element i = t Cp + c (c fastest: a warp reads and writes
// consecutive channels); c >= C: zeros.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_input_nhwc(const float* __restrict__ x, float* __restrict__ V, int N, int C, int H, int W, int pad_h,
                    int pad_w, int tP, int tQ, int Cp) {
    const int T = N * tP * tQ;
    const idx_t plane = (idx_t)T * Cp;
    GRID_STRIDE_LOOP(i, plane) {
        const int t = (int)(i / Cp), c = (int)(i - (idx_t)t * Cp);
        const bool in = c < C;
        const TileOrigin o(t, tP, tQ, pad_h, pad_w);
        const float* xn = x + (idx_t)o.n * H * W * C + (in ? c : 0);
        float d[WN][WN];
#pragma unroll
        for (int a = 0; a < WN; ++a)
#pragma unroll
            for (int b = 0; b < WN; ++b) {
                const int h = o.h0 + a, ww = o.w0 + b;
                d[a][b] = in && h >= 0 && h < H && ww >= 0 && ww < W ? xn[((idx_t)h * W + ww) * C] : 0.0f;
            }
        float v[WN][WN];
        input_tile(d, v);
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) V[(xi * WN + nu) * plane + i] = v[xi][nu];
    }
}

// ---- step 3: the batched GEMM, M[z] = A[z] . B[z] -------------------------------------------------

constexpr int G_BK = 8, G_THREADS = 256;

// One block's shared memory: two stages of the A tile (transposed, [k][m], rows padded by 4) and
// of the B tile ([k][n]).
template <int BM, int BN>
struct GemmSmem {
    float a[2][G_BK][BM + 4];
    float b[2][G_BK][BN];
};

// The global -> register -> shared path of one block: a float4 of A and of B per thread and step.
template <int BM, int BN>
struct GemmLoader {
    const float* a_row;  // this thread's row of A (nullptr: past Mg, or not a loader), at column ka
    const float* b_row;  // this thread's row of B at column nb (nullptr: past Ng, or not a loader)
    int ka, kb, nb, am;  // A: column offset in a step and tile row; B: row in a step and tile column
    float4 ra, rb;

    __device__ __forceinline__ GemmLoader(const float* A, const float* B, int Mg, int Ng, int Kg, int m0, int n0) {
        const int tid = threadIdx.x;
        am = tid / 2;
        ka = 4 * (tid % 2);
        a_row = tid < 2 * BM && m0 + am < Mg ? A + (idx_t)(m0 + am) * Kg + ka : nullptr;
        kb = tid / (BN / 4);
        nb = 4 * (tid % (BN / 4));
        b_row = tid < 2 * BN && n0 + nb < Ng ? B + (idx_t)kb * Ng + n0 + nb : nullptr;
    }
    // Step s's float4s into registers (zeros past the matrices).
    __device__ __forceinline__ void fetch(int s, int Ng) {
        const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
        ra = a_row ? *reinterpret_cast<const float4*>(a_row + s * G_BK) : z;
        rb = b_row ? *reinterpret_cast<const float4*>(b_row + (idx_t)s * G_BK * Ng) : z;
    }
    __device__ __forceinline__ void put(GemmSmem<BM, BN>& sm, int stage) const {
        const int tid = threadIdx.x;
        if (tid < 2 * BM) {
            sm.a[stage][ka][am] = ra.x;
            sm.a[stage][ka + 1][am] = ra.y;
            sm.a[stage][ka + 2][am] = ra.z;
            sm.a[stage][ka + 3][am] = ra.w;
        }
        if (tid < 2 * BN) *reinterpret_cast<float4*>(&sm.b[stage][kb][nb]) = rb;
    }
};

// The thread's TM x TN accumulators over one stage: 8 rank-1 updates from shared memory.
template <int BM, int BN>
__device__ __forceinline__ void gemm_stage(const GemmSmem<BM, BN>& sm, int stage, float (&acc)[BM / 16][BN / 16]) {
    constexpr int TM = BM / 16, TN = BN / 16;
    const int tn = threadIdx.x % 16, tm = threadIdx.x / 16;
#pragma unroll
    for (int kk = 0; kk < G_BK; ++kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int g = 0; g < TM / 4; ++g) {
            const float4 t4 = *reinterpret_cast<const float4*>(&sm.a[stage][kk][4 * tm + 64 * g]);
            a[4 * g] = t4.x; a[4 * g + 1] = t4.y; a[4 * g + 2] = t4.z; a[4 * g + 3] = t4.w;
        }
#pragma unroll
        for (int h = 0; h < TN / 4; ++h) {
            const float4 t4 = *reinterpret_cast<const float4*>(&sm.b[stage][kk][4 * tn + 64 * h]);
            b[4 * h] = t4.x; b[4 * h + 1] = t4.y; b[4 * h + 2] = t4.z; b[4 * h + 3] = t4.w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// The epilogue: rows below Mg, each thread's 4 consecutive columns as one float4 (Ng % 4 == 0).
template <int BM, int BN>
__device__ __forceinline__ void gemm_store(float* __restrict__ Cm, int Mg, int Ng, int m0, int n0,
                                           const float (&acc)[BM / 16][BN / 16]) {
    constexpr int TM = BM / 16, TN = BN / 16;
    const int tn = threadIdx.x % 16, tm = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + 4 * tm + 64 * (i / 4) + i % 4;
        if (m >= Mg) continue;
#pragma unroll
        for (int h = 0; h < TN / 4; ++h) {
            const int n = n0 + 4 * tn + 64 * h;
            if (n < Ng)
                *reinterpret_cast<float4*>(Cm + (idx_t)m * Ng + n) =
                    make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
        }
    }
}

// M[z] (Mg x Ng) = A[z] (Mg x Kg) . B[z] (Kg x Ng), all row-major, z = blockIdx.z; Kg % 8 == 0,
// Ng % 4 == 0, every matrix 16-byte aligned.
template <int BM, int BN>
__device__ __forceinline__ void wino_gemm(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ Cm, int Mg, int Ng, int Kg, int m_on_x) {
    static_assert(BM % 64 == 0 && BN % 64 == 0, "BM and BN must be multiples of 64");
    __shared__ __align__(16) GemmSmem<BM, BN> sm;
    const idx_t z = blockIdx.z;
    A += z * Mg * Kg;
    B += z * Kg * Ng;
    Cm += z * Mg * Ng;
    const int m0 = (m_on_x ? blockIdx.x : blockIdx.y) * BM, n0 = (m_on_x ? blockIdx.y : blockIdx.x) * BN;

    GemmLoader<BM, BN> ld(A, B, Mg, Ng, Kg, m0, n0);
    float acc[BM / 16][BN / 16];
#pragma unroll
    for (int i = 0; i < BM / 16; ++i)
#pragma unroll
        for (int j = 0; j < BN / 16; ++j) acc[i][j] = 0.0f;

    const int steps = Kg / G_BK;
    ld.fetch(0, Ng);
    ld.put(sm, 0);
    __syncthreads();
    for (int s = 0, stage = 0; s < steps; ++s, stage ^= 1) {
        const bool more = s + 1 < steps;
        if (more) ld.fetch(s + 1, Ng);  // the next step's loads in flight during this step's FMAs
        gemm_stage(sm, stage, acc);
        if (more) ld.put(sm, stage ^ 1);
        __syncthreads();
    }
    gemm_store<BM, BN>(Cm, Mg, Ng, m0, n0, acc);
}

// MINB: the 8 x 8 thread tile needs more than the 128 registers two blocks per SM allow.
#define WINO_GEMM_ENTRY(BM, BN, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(G_THREADS, MINB)                                              \
        wino_gemm_##BM##x##BN(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ Cm, \
                              int Mg, int Ng, int Kg, int m_on_x) {                                             \
        wino_gemm<BM, BN>(A, B, Cm, Mg, Ng, Kg, m_on_x);                                                        \
    }

WINO_GEMM_ENTRY(128, 128, 1)
WINO_GEMM_ENTRY(128, 64, 2)
WINO_GEMM_ENTRY(64, 128, 2)
WINO_GEMM_ENTRY(64, 64, 2)

// ---- step 4: the output transform, y = A^T M A ----------------------------------------------------

// NCHW: M[n^2][K][Tp] -> y [N][K][P][Q]; element i = k T + t (t fastest: a warp reads consecutive
// tiles); writes the tile's pixels inside P x Q.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_output_nchw(const float* __restrict__ M, float* __restrict__ y, int N, int K, int P, int Q, int tP, int tQ,
                     int Tp) {
    const int T = N * tP * tQ;
    const idx_t plane = (idx_t)K * Tp, total = (idx_t)K * T;
    GRID_STRIDE_LOOP(i, total) {
        const int k = (int)(i / T), t = (int)(i - (idx_t)k * T);
        const TileOrigin o(t, tP, tQ, 0, 0);  // (h0, w0): the tile's first output pixel
        float mt[WN][WN];
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) mt[xi][nu] = M[(xi * WN + nu) * plane + (idx_t)k * Tp + t];
        float yt[WM][WM];
        output_tile(mt, yt);
        float* yk = y + ((idx_t)o.n * K + k) * P * Q;
#pragma unroll
        for (int a = 0; a < WM; ++a)
#pragma unroll
            for (int b = 0; b < WM; ++b)
                if (o.h0 + a < P && o.w0 + b < Q) yk[(idx_t)(o.h0 + a) * Q + o.w0 + b] = yt[a][b];
    }
}

// NHWC: M[n^2][T][Kp] -> y [N][P][Q][K]; element i = t K + k (k fastest: a warp reads and writes
// consecutive channels); writes the tile's pixels inside P x Q.
extern "C" __global__ void __launch_bounds__(W_THREADS)
    wino_output_nhwc(const float* __restrict__ M, float* __restrict__ y, int N, int K, int P, int Q, int tP, int tQ,
                     int Kp) {
    const int T = N * tP * tQ;
    const idx_t plane = (idx_t)T * Kp, total = (idx_t)T * K;
    GRID_STRIDE_LOOP(i, total) {
        const int t = (int)(i / K), k = (int)(i - (idx_t)t * K);
        const TileOrigin o(t, tP, tQ, 0, 0);
        float mt[WN][WN];
#pragma unroll
        for (int xi = 0; xi < WN; ++xi)
#pragma unroll
            for (int nu = 0; nu < WN; ++nu) mt[xi][nu] = M[(xi * WN + nu) * plane + (idx_t)t * Kp + k];
        float yt[WM][WM];
        output_tile(mt, yt);
        float* yn = y + (idx_t)o.n * P * Q * K + k;
#pragma unroll
        for (int a = 0; a < WM; ++a)
#pragma unroll
            for (int b = 0; b < WM; ++b)
                if (o.h0 + a < P && o.w0 + b < Q) yn[((idx_t)(o.h0 + a) * Q + o.w0 + b) * K] = yt[a][b];
    }
}
