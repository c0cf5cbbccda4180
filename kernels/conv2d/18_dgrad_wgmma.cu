// Day 18 - dgrad_wgmma: dgrad on day 16's Hopper kernel, unchanged, after one small kernel that
// turns the filter around; strided layers phase by phase, merged by a scatter kernel (below).
// NHWC dy [N][P][Q][K] and dx [N][H][W][C], KRSC w [K][R][S][C]; fp16/bf16, fp32 accumulation.
//
// With stride 1, dgrad is an fprop. An input pixel h collects, for every tap r, the dy row
// p = h + pad_h - r * dil_h (where 0 <= p < P):
//   dx[n][h][w][c] = sum_{k, r, s} dy[n][h + pad_h - r dil_h][w + pad_w - s dil_w][k] * w[k][r][s][c].
// Put r' = R - 1 - r: the dy row is h - pad'_h + r' dil_h with pad'_h = dil_h (R - 1) - pad_h, the
// row an fprop with padding pad'_h reads for output row h. So dx is the fprop over dy (K input
// channels, a P x Q image) with the filter
//   wr[c][r'][s'][k] = w[k][R - 1 - r'][S - 1 - s'][c]
// (C filters of R x S taps and K channels: turned 180 degrees, filters and channels swapped),
// stride 1, the same dilation and padding' = (dil_h (R - 1) - pad_h, dil_w (S - 1) - pad_w),
// whose output is exactly H x W. (Day 14's phases say the same: with stride 1 there is one phase,
// every tap, padding' as here; days/day14_backward/model.py.)
//
// The kernels of a run, in launch order:
//   dgrad_rotate_filter   w -> wr in the workspace (this file): a 64 x 64 transpose per tap.
//   igemm_wgmma_<config>  day 16's fprop, built from day 16's own file (16_igemm_wgmma.cu: that
//                         launch names it, days/day18_dgrad_wgmma.py; not one line of it changed,
//                         and nothing of it is in this file) with dy as x, wr as w and dx as y: its
//                         im2col map walks dy, its tiled map reads wr, its epilogue stores dx; a
//                         plain epilogue (no Cin, bias, ReLU).
// A strided layer: a rotate and an fprop per phase (each into the workspace), then
//   dgrad_scatter_strided every phase's output -> dx, zeros where no tap reaches (this file).
//
// dgrad_rotate_filter: grid (ceil(C / 64) * ceil(K / 64), R, S), block 256, 8,448 bytes of static
// shared memory. Block (x, r', s') takes the c-tile x % ceil(C / 64), k-tile x / ceil(C / 64) of
// tap (r', s') of wr, i.e. the slab w[k0 .. k0 + 63][R - 1 - r'][S - 1 - s'][c0 .. c0 + 63]:
//   load:  thread t reads row k0 + t / 8 (+ 32) of the slab, channels c0 + 8 (t % 8) .. + 7, as
//          one 16-byte load when C % 8 == 0 (else element by element), zeros past K and C, and
//          keeps them in tile[k][c] (rows of 66 halves: the 32-bit stores of a warp hit 32
//          banks, the reads below at most two ways);
//   store: thread t writes row c0 + t / 8 (+ 32) of wr's tap, filters k0 + 8 (t % 8) .. + 7, one
//          16-byte store when K % 8 == 0 (else element by element), nothing past C and K.
// Both passes are coalesced: a warp reads four 128-byte runs of w's rows and writes four of wr's.
// Every element of wr is written exactly once (Python: days/day18_dgrad_wgmma.py, rotate_writes).
// Offsets are 64-bit (idx_t); K, C + 63 fit an int (Python checks).
// Assumes: w 16-byte aligned when C % 8 == 0, wr when K % 8 == 0 (a workspace, torch-allocated).
// Day 16's assumptions hold for its fprop (K % 8 == 0: dy's pixel rows in 16-byte strides; dy and
// wr 16-byte aligned; dx when C % 8 == 0; the im2col limits on padding', the dilated filter and
// the corners): the Python refuses what breaks them, naming the dgrad value.
#include "conv2d_common.cuh"  // idx_t, CEIL_DIV

typedef unsigned short u16;  // one fp16/bf16 element, moved as raw bits

constexpr int ROT_TILE = 64;      // filters x channels per block and tap
constexpr int ROT_ROW = 66;       // halves per shared row: 33 words, so a warp's 32-bit stores spread over 32 banks
constexpr int ROT_THREADS = 256;  // 8 threads per 64-element row, 32 rows per pass, two passes

// Strided layers run one such filter per phase (below): the taps r = rb + j rstep, s = sb + i sstep
// of w that reach the phase's dx pixels, T x U of them, turned around:
//   wr[c][t][u][k] = w[k][rb + (T - 1 - t) rstep][sb + (U - 1 - u) sstep][c]
// (unit stride: T = R, U = S, rb = sb = 0, rstep = sstep = 1, the filter above). Grid (tiles, T, U).
extern "C" __global__ void __launch_bounds__(ROT_THREADS)
    dgrad_rotate_filter(const u16* __restrict__ w, u16* __restrict__ wr, int K, int C, int R, int S, int T, int U,
                        int rb, int rstep, int sb, int sstep) {
    __shared__ __align__(16) u16 tile[ROT_TILE][ROT_ROW];  // [k][c] of the slab
    const int ctiles = CEIL_DIV(C, ROT_TILE);
    const int c0 = (int)(blockIdx.x % ctiles) * ROT_TILE, k0 = (int)(blockIdx.x / ctiles) * ROT_TILE;
    const int rr = blockIdx.y, sr = blockIdx.z;                             // the tap (t, u) of wr
    const int r = rb + (T - 1 - rr) * rstep, s = sb + (U - 1 - sr) * sstep;  // the tap of w it holds
    const int tid = threadIdx.x, ch = tid % 8, row = tid / 8;
    const bool vec_in = C % 8 == 0, vec_out = K % 8 == 0;
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // rows k of the slab, 8 channels per thread
        const int kr = row + 32 * u, k = k0 + kr, c = c0 + 8 * ch;
        const u16* src = w + (((idx_t)k * R + r) * S + s) * C + c;
        unsigned v[4] = {0, 0, 0, 0};
        if (vec_in) {
            if (k < K && c < C) {
                const uint4 q = *reinterpret_cast<const uint4*>(src);
                v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            }
        } else if (k < K) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (c + e < C) v[e / 2] |= (unsigned)src[e] << (16 * (e % 2));
        }
        unsigned* dst = reinterpret_cast<unsigned*>(&tile[kr][8 * ch]);  // 4-byte aligned: 66 and 8 ch are even
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = v[j];
    }
    __syncthreads();
    const idx_t tap = ((idx_t)rr * U + sr) * K;  // wr[c][t][u][k] = wr + (c T U + t U + u) K + k
#pragma unroll
    for (int u = 0; u < 2; ++u) {  // rows c of wr's tap, 8 filters per thread
        const int cr = row + 32 * u, c = c0 + cr, k = k0 + 8 * ch;
        if (c >= C || k >= K) continue;
        u16* out = wr + (idx_t)c * T * U * K + tap + k;
        u16 v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = tile[8 * ch + e][cr];
        if (vec_out) {
            *reinterpret_cast<uint4*>(out) = make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16,
                                                        v[4] | (unsigned)v[5] << 16, v[6] | (unsigned)v[7] << 16);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (k + e < K) out[e] = v[e];
        }
    }
}

// Strided layers (stride (sh, sw) > 1) by phases. Input row h is reached only by the taps r with
// sh | h + ph - r dh, which depend on a = h mod sh alone: the phase. For phase (a, b) the rows
// h = a + sh i (i < Ha = ceil((H - a) / sh)) and columns w = b + sw j (j < Wb) of dx are a stride-1
// fprop over dy with that phase's T x U taps, turned around (dgrad_rotate_filter above, with
// rb = the first such r, rstep = sh / gcd(sh, dh)), dilation rstep dh / sh and padding
// (r_last dh - a - ph) / sh (Python: days/day18_dgrad_wgmma.py, phases). Each phase's fprop (day
// 16's kernel) stores its compact y_ab[N][Ha][Wb][C] into the workspace, the phases back to back
// in (a, b) order: phase (a, b) starts N C (rows_before(a) W + Ha cols_before(b)) elements in,
// rows_before(a) = sum over a' < a of Ha'. A 1 x 1 filter has one phase with a tap.
//
// dgrad_scatter_strided then writes all of dx in one pass:
//   dx[n][h][w][c] = y_ab[n][h / sh][w / sw][c], (a, b) = (h mod sh, w mod sw), or 0 where the
//   phase has no tap (no dy pixel reaches the pixel: day 14 fills those in a pass of its own).
// It moves bytes only, so its index arithmetic must stay far below its 16-byte vectors: the first
// version divided three 64-bit numbers per vector (a subroutine of ~100 instructions each), and
// ResNet-50's strided 1 x 1 dgrad ran at 0.37-0.65x cuDNN on an H100 (unit stride: 0.62-1.0x).
// Now:
//   a row of dx at a time: block x takes rows x, x + gridDim.x, ... of the N H rows; what depends on
//     the row alone (n, h, the phase row a, its extent Ha and offset, whether it has a tap) is
//     computed once per row, and what depends on the column phase b alone (its extent Wb, offset and
//     tap) once per block, into shared memory (sw <= 8 entries);
//   in the row, thread t takes vectors t, t + 256, ... of W ceil(C / 8), vector v = pixel w =
//     v / cvec, channels 8 (v mod cvec) .. + 7, and j = w / sw, b = w - j sw: two 32-bit divisions by
//     numbers fixed for the launch, each a multiply-high, an add and a shift (Divisor, below).
// One 16-byte load and store when C % 8 == 0, else element by element. Every dx element is written
// exactly once (Python: scatter_writes). Assumes: y and dx 16-byte aligned when C % 8 == 0 (y: the
// workspace at a 128-byte offset, each phase a multiple of 8 channels in; dx: checked in Python),
// sh, sw <= 8, W ceil(C / 8) < 2^31 (Python checks).
constexpr int SCATTER_THREADS = 256;
constexpr int MAX_STRIDE = 8;

// n / d for 0 <= n < 2^31 and a divisor 1 <= d < 2^31 fixed for the launch, without a division
// instruction (the GPU has none: a 32-bit `/` by a variable is a ~20-instruction subroutine): with
// s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1, n / d = (umulhi(n, m) + n) >> s.
// Source: Granlund and Montgomery, "Division by invariant integers using multiplication" (PLDI
// 1994), section 4; Python: days/day18_dgrad_wgmma.py, Divisor (checked against // there).
struct Divisor {
    unsigned d, m, s;
    __device__ __forceinline__ explicit Divisor(unsigned d_) : d(d_), s(0) {
        while ((1u << s) < d) ++s;
        m = (unsigned)((((unsigned long long)1 << 32) * ((1ull << s) - d)) / d) + 1;
    }
    __device__ __forceinline__ unsigned div(unsigned n) const { return (__umulhi(n, m) + n) >> s; }
};

__device__ __forceinline__ int phase_extent(int size, int a, int stride) { return (size - a + stride - 1) / stride; }

__device__ __forceinline__ bool phase_has_tap(int a, int pad, int dil, int stride, int taps) {
    for (int r = 0; r < taps; ++r)
        if ((a + pad - r * dil) % stride == 0) return true;
    return false;
}

extern "C" __global__ void __launch_bounds__(SCATTER_THREADS)
    dgrad_scatter_strided(const u16* __restrict__ y, u16* __restrict__ dx, int N, int H, int W, int C, int sh, int sw,
                          int ph, int pw, int dh, int dw, int R, int S) {
    // per column phase b: Wb, N C cols_before(b) (the phase's offset is Ha times it, plus the row
    // phase's), and whether it has a tap
    __shared__ int col_extent[MAX_STRIDE], col_hit[MAX_STRIDE];
    __shared__ idx_t col_offset[MAX_STRIDE];
    if (threadIdx.x == 0) {
        int before = 0;
        for (int b = 0; b < sw; ++b) {
            col_extent[b] = phase_extent(W, b, sw);
            col_hit[b] = phase_has_tap(b, pw, dw, sw, S);
            col_offset[b] = (idx_t)N * C * before;
            before += col_extent[b];
        }
    }
    __syncthreads();
    const int cvec = CEIL_DIV(C, 8), row_vectors = W * cvec;
    const Divisor by_cvec(cvec), by_sw(sw);
    const bool vec = C % 8 == 0;
    for (int row = blockIdx.x; row < N * H; row += gridDim.x) {  // N H < 2^31: Python checks N H W C
        const int n = row / H, h = row - n * H, i = h / sh, a = h - i * sh;
        const bool row_hit = phase_has_tap(a, ph, dh, sh, R);
        int rows_before = 0;
        for (int e = 0; e < a; ++e) rows_before += phase_extent(H, e, sh);
        const int Ha = phase_extent(H, a, sh);
        const u16* yrow = y + (idx_t)N * C * rows_before * W;  // phase row a's block: its phases (a, b) follow
        u16* dxrow = dx + (idx_t)row * W * C;
        for (int v = threadIdx.x; v < row_vectors; v += SCATTER_THREADS) {
            const int w = (int)by_cvec.div(v), c = (v - w * cvec) * 8, j = (int)by_sw.div(w), b = w - j * sw;
            const bool hit = row_hit && col_hit[b];
            const u16* src = yrow + Ha * col_offset[b] + (((idx_t)n * Ha + i) * col_extent[b] + j) * C + c;
            u16* dst = dxrow + (idx_t)w * C + c;
            if (vec) {
                *reinterpret_cast<uint4*>(dst) = hit ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (c + e < C) dst[e] = hit ? src[e] : (u16)0;
            }
        }
    }
}
