// Day 07 - depthwise: groups = C = K, one filter plane per channel, memory-bound by design.
//
// What changed since the general kernel: a depthwise convolution does R*S multiply-adds per
// output and reads one input plane per output plane, so it is limited by DRAM bandwidth, not by
// arithmetic. The goal is to move each input element from DRAM once, write each output once,
// and keep everything between those two in shared memory and registers:
//   1. a block copies its input tile (with the halo, zeros for padding) into shared memory with
//      coalesced float4 loads, and the R*S weights of its planes next to it;
//   2. after one __syncthreads each thread computes DW_QPT consecutive outputs of one row,
//      reading each of the R input rows it needs once into registers (float4 shared loads) and
//      reusing every value for up to S outputs; 3x3 stride 1 and 2 (dilation_w 1) have unrolled
//      register versions, any other filter/stride/dilation uses a plain loop over the tile.
//
// Tiles. Output plane (n, c) is cut into tiles of TP rows x TQ = NSEG*DW_QPT columns; when a
// whole plane is small (14x14, 7x7) one tile holds PL whole planes, so blocks are not tiny.
// PL, TP, NSEG are chosen on the host (days/day07_general.py) and passed as arguments:
//   planes NC = N*C; strips ST = ceil(P/TP); column tiles CT = ceil(Q/TQ)
//   blockIdx.x = (plane_group * ST + strip) * CT + column_tile      (1-D grid, < 2^31)
//   input tile per plane: TH = (TP-1)*sh + (R-1)*dh + 1 rows (from h0 = strip*TP*sh - ph)
//                         x TW = round_up((TQ-1)*sw + (S-1)*dw + 1, 4) columns (from w0 = q0*sw - pw),
//                         stored with a row pitch of TW + 8: tile column j lives at 4 + j, and the
//                         4 spare columns on each side take the overhang of the 4-column load chunks
//   shared memory: (PL*TH*(TW+8) + PL*round_up(R*S, 4)) * 4 bytes, dynamic
// Thread mapping inside a block (thread counts per row are powers of two, so a thread's column
// is threadIdx.x % G and only its row needs a division):
//   fill:    GW = next_pow2(chunks per tile row) threads per tile row, one 4-column chunk each
//            (a 16-byte-aligned float4 of x when W % 4 == 0), rows DW_BLOCK/GW apart; each
//            thread issues DW_FILL chunk loads before its first shared store (bytes in flight)
//   compute: GS = next_pow2(NSEG) threads per output row, thread sg owns columns
//            q0 + sg*DW_QPT .. + DW_QPT - 1; rows DW_BLOCK/GS apart.
// Launch: block (DW_BLOCK, 1, 1), grid (ceil(NC/PL) * ST * CT, 1, 1), dynamic shared as above.
//
// Compile-time parameters (defaults):
//   DW_BLOCK       256  threads per block
//   DW_QPT         4    consecutive outputs per thread (a multiple of 4: shared loads stay aligned)
//   DW_FILL        4    float4 loads in flight per thread while filling the tile
//   DW_MIN_BLOCKS  1280/DW_BLOCK (1024/DW_BLOCK on sm_75)  __launch_bounds__ minimum blocks
//                  per SM: 5 blocks of 256 threads need at most 48 registers per thread
//                  (registers are allocated per warp in chunks of 256; ptxas gives 48)
//
// Assumes: NCHW fp32, groups = C = K (channel multiplier 1), x and y dense; any R, S, stride,
// padding, dilation. The host refuses tiles over 48 KB of shared memory or with rows of more
// than 4*DW_BLOCK - 4 columns (huge strided/dilated filters). All offsets that grow with N, C,
// H, W are 64-bit; x and y need no alignment (float4 paths are taken only when aligned).
#include "conv2d_common.cuh"

#include <stdint.h>

#ifndef DW_BLOCK
#define DW_BLOCK 256
#endif
#ifndef DW_QPT
#define DW_QPT 4
#endif
#ifndef DW_FILL
#define DW_FILL 4
#endif
#ifndef DW_MIN_BLOCKS  // blocks per SM for __launch_bounds__: 1280 threads, at most 48 registers
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 750
#define DW_MIN_BLOCKS (1024 / DW_BLOCK)  // Turing runs at most 1024 threads per SM
#else
#define DW_MIN_BLOCKS (1280 / DW_BLOCK)
#endif
#endif
#if DW_QPT % 4 != 0
#error "DW_QPT must be a multiple of 4 (a thread's first input column must stay 16-byte aligned)"
#endif

__device__ __forceinline__ int round_up4(int v) { return (v + 3) & ~3; }
__device__ __forceinline__ int next_pow2(int v) { return v <= 1 ? 1 : 1 << (32 - __clz(v - 1)); }

// DW_QPT outputs of one row, unrolled for an R x S filter, column stride SW, column dilation 1.
// trow: tile row of filter row 0 for this output row, at the thread's first input column
// (16-byte aligned); row_step = dh * pitch floats between filter rows; wp: the plane's R*S weights.
template <int R, int S, int SW>
__device__ __forceinline__ void dw_row_unrolled(const float* trow, int row_step, const float* wp,
                                                float (&acc)[DW_QPT]) {
    constexpr int NX = (DW_QPT - 1) * SW + S;  // input columns the DW_QPT outputs read
    constexpr int NV = (NX + 3) / 4;           // float4 loads per filter row
    constexpr int NW = (R * S + 3) / 4;        // float4 loads for the weights
    float wr[4 * NW];
#pragma unroll
    for (int v = 0; v < NW; ++v) {
        const float4 f = reinterpret_cast<const float4*>(wp)[v];
        wr[4 * v] = f.x, wr[4 * v + 1] = f.y, wr[4 * v + 2] = f.z, wr[4 * v + 3] = f.w;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float xv[4 * NV];
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const float4 f = reinterpret_cast<const float4*>(trow + r * row_step)[v];
            xv[4 * v] = f.x, xv[4 * v + 1] = f.y, xv[4 * v + 2] = f.z, xv[4 * v + 3] = f.w;
        }
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
            for (int u = 0; u < DW_QPT; ++u) acc[u] = fmaf(xv[u * SW + s], wr[r * S + s], acc[u]);
    }
}

// The same for any filter, stride and dilation: loops over the tile, no register window.
__device__ __forceinline__ void dw_row_any(const float* trow, int row_step, const float* wp, int R, int S,
                                           int sw, int dw, float (&acc)[DW_QPT]) {
#pragma unroll 1
    for (int r = 0; r < R; ++r)
#pragma unroll 1
        for (int s = 0; s < S; ++s) {
            const float wv = wp[r * S + s];
            const float* t = trow + r * row_step + s * dw;
#pragma unroll
            for (int u = 0; u < DW_QPT; ++u) acc[u] = fmaf(t[u * sw], wv, acc[u]);
        }
}

// Step 1 of the kernel: copy one 4-column chunk (global columns wc..wc+3) of tile rows
// row0, row0 + step, ... into the shared tile, zeros outside the image. VEC: one aligned float4
// load per chunk (needs W % 4 == 0 and a 16-byte-aligned x); otherwise 4 guarded scalar loads.
// Tile row `row` is row i = row % TH of plane pl = row / TH: input row h0 + i of plane nc0 + pl.
// A chunk overhangs the tile by at most 3 columns on either side; the spare columns of the row
// pitch take that overhang, so all 4 values are stored without a test (and never read).
struct TileRows {
    const float* xc;      // x[nc0][0][wc]: the chunk's column in row 0 of the block's first plane
    float* tile;
    int rows, TH, pitch;  // tile rows in all (planes * TH), rows per plane, floats per tile row
    int H, W, h0, w0;     // image size; input row and column of tile element (0, 0)
    int wc;               // this thread's chunk: global columns wc .. wc+3
};

// All B loads of a round are issued before the first store, so each thread keeps B loads in
// flight (DRAM latency is hidden by bytes in flight, not by arithmetic).
template <bool VEC>
__device__ __forceinline__ void fill_column(const TileRows& t, int row0, int step) {
    constexpr int B = VEC ? DW_FILL : (DW_FILL + 1) / 2;  // a scalar chunk is 4 loads already
    // Per thread, fixed: which of the chunk's 4 columns lie in the image (with VEC all or none).
    bool in_img[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) in_img[u] = (unsigned)(t.wc + u) < (unsigned)t.W;
    float* dst0 = t.tile + 4 + (t.wc - t.w0);  // where element 0 of the chunk goes in tile row 0
    for (int row = row0; row < t.rows; row += B * step) {
        float4 v[B];
#pragma unroll
        for (int b = 0; b < B; ++b) {
            const int r = row + b * step;
            const int pl = (unsigned)r / (unsigned)t.TH, h = t.h0 + (r - pl * t.TH);
            const bool ok = r < t.rows && (unsigned)h < (unsigned)t.H;
            const float* src = t.xc + (ok ? (idx_t)pl * t.H + h : 0) * t.W;
            if constexpr (VEC) {
                v[b] = ok && in_img[0] ? __ldg(reinterpret_cast<const float4*>(src)) : make_float4(0.f, 0.f, 0.f, 0.f);
            } else {
                v[b].x = ok && in_img[0] ? __ldg(src) : 0.0f;
                v[b].y = ok && in_img[1] ? __ldg(src + 1) : 0.0f;
                v[b].z = ok && in_img[2] ? __ldg(src + 2) : 0.0f;
                v[b].w = ok && in_img[3] ? __ldg(src + 3) : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
            const int r = row + b * step;
            if (r >= t.rows) break;
            float* dst = dst0 + r * t.pitch;
            dst[0] = v[b].x, dst[1] = v[b].y, dst[2] = v[b].z, dst[3] = v[b].w;
        }
    }
}

extern "C" __global__ void __launch_bounds__(DW_BLOCK, DW_MIN_BLOCKS)
conv2d_depthwise(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                 int N, int C, int H, int W, int K, int R, int S, int P, int Q,
                 int sh, int sw, int ph, int pw, int dh, int dw, int groups,
                 int PL, int TP, int NSEG) {
    extern __shared__ float4 dw_smem[];  // float4: 16-byte aligned
    const int TQ = NSEG * DW_QPT;
    const int TH = (TP - 1) * sh + (R - 1) * dh + 1;
    const int TW = round_up4((TQ - 1) * sw + (S - 1) * dw + 1);
    const int RSP = round_up4(R * S);
    const int pitch = TW + 8;                          // floats per tile row; column j at 4 + j
    float* tile = reinterpret_cast<float*>(dw_smem);  // [PL][TH][pitch]
    float* wsm = tile + PL * TH * pitch;               // [PL][RSP]

    // Which tile: plane group, strip of output rows, column tile.
    const int CT = CEIL_DIV(Q, TQ), ST = CEIL_DIV(P, TP);
    const int ct = blockIdx.x % CT, st = (blockIdx.x / CT) % ST, pg = blockIdx.x / (CT * ST);
    const idx_t NC = (idx_t)N * C, nc0 = (idx_t)pg * PL;  // first plane (n*C + c) of the block
    const int npl = (int)min((idx_t)PL, NC - nc0);        // planes in this block
    const int p0 = st * TP, q0 = ct * TQ;                 // first output row and column
    const int h0 = p0 * sh - ph, w0 = q0 * sw - pw;       // input row and column of tile (0, 0)

    // 1a. Weights of the block's planes: plane nc has channel c = nc % C, filter w[c][0][:][:].
    const int c0 = (int)(nc0 % C);
    for (int e = threadIdx.x; e < npl * RSP; e += DW_BLOCK) {
        const int pl = e / RSP, t = e - pl * RSP;
        wsm[e] = t < R * S ? w[(idx_t)((c0 + pl) % C) * R * S + t] : 0.0f;
    }

    // 1b. Input tile. Global columns are cut into 4-column chunks [4j, 4j+4); the n_ch chunks
    //     that meet tile columns w0 .. w0+TW-1 are loaded (zeros outside the image) and each
    //     element is stored at its tile column. With W % 4 == 0 a chunk is one aligned float4.
    const int ch_lo = w0 >> 2, n_ch = ((w0 + TW - 1) >> 2) - ch_lo + 1;  // (>> 2 floors negatives)
    const int GW = next_pow2(n_ch);  // <= DW_BLOCK (the host keeps n_ch <= DW_BLOCK)
    const int ch = threadIdx.x % GW;
    if (ch < n_ch) {
        const int wc = (ch_lo + ch) * 4;
        const TileRows rows{x + nc0 * H * W + wc, tile, npl * TH, TH, pitch, H, W, h0, w0, wc};
        if ((W % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0))
            fill_column<true>(rows, threadIdx.x / GW, DW_BLOCK / GW);
        else
            fill_column<false>(rows, threadIdx.x / GW, DW_BLOCK / GW);
    }
    __syncthreads();

    // 2. Outputs: thread sg of each row group computes DW_QPT consecutive columns of a row.
    const int GS = next_pow2(NSEG), sg = threadIdx.x % GS;
    const int q = q0 + sg * DW_QPT;  // this thread's first output column
    if (sg >= NSEG || q >= Q) return;  // no barrier follows
    const bool vec_out = (Q % 4 == 0) && ((reinterpret_cast<uintptr_t>(y) & 15) == 0);
    const bool r3s1 = R == 3 && S == 3 && sw == 1 && dw == 1;
    const bool r3s2 = R == 3 && S == 3 && sw == 2 && dw == 1;
    for (int orow = threadIdx.x / GS; orow < npl * TP; orow += DW_BLOCK / GS) {
        const int pl = (unsigned)orow / (unsigned)TP, tp = orow - pl * TP, p = p0 + tp;
        if (p >= P) continue;
        const float* trow = tile + (pl * TH + tp * sh) * pitch + 4 + sg * DW_QPT * sw;
        const float* wp = wsm + pl * RSP;
        float acc[DW_QPT];
#pragma unroll
        for (int u = 0; u < DW_QPT; ++u) acc[u] = 0.0f;
        if (r3s1)
            dw_row_unrolled<3, 3, 1>(trow, dh * pitch, wp, acc);
        else if (r3s2)
            dw_row_unrolled<3, 3, 2>(trow, dh * pitch, wp, acc);
        else
            dw_row_any(trow, dh * pitch, wp, R, S, sw, dw, acc);

        float* yrow = y + ((nc0 + pl) * P + p) * Q;
        if (vec_out) {  // Q % 4 == 0 and q % 4 == 0: each float4 is inside the row or past it
#pragma unroll
            for (int u = 0; u < DW_QPT; u += 4)
                if (q + u < Q)
                    *reinterpret_cast<float4*>(yrow + q + u) = make_float4(acc[u], acc[u + 1], acc[u + 2], acc[u + 3]);
        } else {
#pragma unroll
            for (int u = 0; u < DW_QPT; ++u)
                if (q + u < Q) yrow[q + u] = acc[u];
        }
    }
}
