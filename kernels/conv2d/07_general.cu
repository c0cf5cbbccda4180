// Day 07 - general: every option of torch.nn.functional.conv2d, on CUDA cores, fp32 NCHW.
//
// What changed since day 06: the kernel stops assuming anything about the problem. Batch N,
// stride (sh != sw), padding (ph != pw, any size), dilation, even and non-square filters,
// non-square images and groups (any divisor of C and K, depthwise included) are all handled by
// one formula per output element:
//   y[n][k][p][q] = sum_{c<C/g, r<R, s<S} x[n][g*C/g + c][p*sh - ph + r*dh][q*sw - pw + s*dw]
//                                         * w[k][c][r][s],        g = k / (K/groups)
// (x reads as 0 outside the image). The day-06 register blocking carries over: each thread keeps
// GEN_PPT pixels x GEN_KPT output channels of accumulators, so every input value it loads is
// used GEN_KPT times and every weight GEN_PPT times.
//
// Mapping (see conv2d_common.cuh). The N*P*Q output pixels of the whole batch are one flat list,
// m = (n*P + p)*Q + q (GEMM-M of the implicit-GEMM view), so small images (7x7) fill a block as
// well as large ones:
//   m  = blockIdx.x * (GEN_BLOCK*GEN_PPT) + i*GEN_BLOCK + threadIdx.x,  i < GEN_PPT
//        (a warp's 32 lanes take 32 consecutive pixels: coalesced loads and stores)
//   gk = blockIdx.z, step gridDim.z, over groups * ceil(Kg/GEN_KPT) blocks of output channels:
//        g = gk / ceil(Kg/GEN_KPT), channels k = g*Kg + (gk % ceil(Kg/GEN_KPT))*GEN_KPT + kk,
//        kk < GEN_KPT, written only when the local channel is < Kg = K/groups.
// Each thread walks the Cg*R*S filter taps (c, r, s) of its group in w's memory order, s fastest.
// The block stages the taps of its GEN_KPT filters GEN_TAPS at a time in shared memory,
// transposed to ws[tap][channel] so the GEN_KPT weights of one tap are one 16-byte-aligned run
// (two LDS.128 for the default GEN_KPT = 8), read by all threads at the same address (broadcast).
//
// Launch: block (GEN_BLOCK, 1, 1); grid (ceil(N*P*Q / (GEN_BLOCK*GEN_PPT)), 1,
//         min(groups * ceil(Kg / GEN_KPT), 65535)); static shared GEN_TAPS*GEN_KPT*4 bytes.
//         Grid x allows 2^31-1 blocks, so any N*P*Q that fits in memory is covered; grid z is
//         capped and grid-strided, so any K is covered.
//
// Compile-time parameters (defaults):
//   GEN_BLOCK 256   threads per block
//   GEN_PPT   4     output pixels per thread (GEN_BLOCK apart)
//   GEN_KPT   8     output channels per thread/block (a multiple of 4)
//   GEN_TAPS  128   filter taps staged in shared memory per round (a power of 2)
//
// Assumes: NCHW fp32 tensors, x and y dense; C and K divisible by groups. Every offset that grows
// with N, C, K, H or W is 64-bit, so tensors past 2^31 elements work.
// Does not: reuse input values between neighbouring outputs in registers or shared memory (the
// L1 cache does it), so it is compute-light but not fast; with K/groups < GEN_KPT (depthwise)
// most of the GEN_KPT accumulators are wasted. Day 07's depthwise kernel covers that case.
#include "conv2d_common.cuh"

#ifndef GEN_BLOCK
#define GEN_BLOCK 256
#endif
#ifndef GEN_PPT
#define GEN_PPT 4
#endif
#ifndef GEN_KPT
#define GEN_KPT 8
#endif
#ifndef GEN_TAPS
#define GEN_TAPS 128
#endif
#if GEN_KPT % 4 != 0
#error "GEN_KPT must be a multiple of 4 (the weights of one tap are read as float4)"
#endif
#if (GEN_TAPS & (GEN_TAPS - 1)) != 0
#error "GEN_TAPS must be a power of 2"
#endif

extern "C" __global__ void __launch_bounds__(GEN_BLOCK)
conv2d_general(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
               int N, int C, int H, int W, int K, int R, int S, int P, int Q,
               int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
    __shared__ __align__(16) float ws[GEN_TAPS][GEN_KPT];  // [tap][channel] of the block's filters

    const int Cg = C / groups, Kg = K / groups;  // channels per group, in and out
    const int CRS = Cg * R * S;                  // taps per output (GEMM-K)
    const idx_t HW = (idx_t)H * W, PQ = (idx_t)P * Q, M = (idx_t)N * PQ;

    // 1. This thread's GEN_PPT output pixels. For each: the top-left corner (hb, wb) of its
    //    receptive field, the offset of x[n][0][hb][wb] and the offset of y[n][0][p][q].
    int hb[GEN_PPT], wb[GEN_PPT];
    idx_t x_pix[GEN_PPT], y_pix[GEN_PPT];
    const idx_t m0 = (idx_t)blockIdx.x * (GEN_BLOCK * GEN_PPT) + threadIdx.x;
#pragma unroll
    for (int i = 0; i < GEN_PPT; ++i) {
        const idx_t m = m0 + (idx_t)i * GEN_BLOCK;
        if (m < M) {
            const idx_t n = m / PQ, pq = m - n * PQ;
            const int p = (int)(pq / Q), q = (int)(pq - (idx_t)p * Q);
            hb[i] = p * sh - ph;
            wb[i] = q * sw - pw;
            x_pix[i] = n * C * HW + (idx_t)hb[i] * W + wb[i];
            y_pix[i] = n * K * PQ + pq;
        } else {  // past the last pixel: every tap reads as padding, nothing is stored
            hb[i] = H;
            wb[i] = 0;
            x_pix[i] = 0;
            y_pix[i] = -1;
        }
    }

    // 2. Blocks of GEN_KPT output channels of one group (grid-stride over gridDim.z).
    const int kblocks = CEIL_DIV(Kg, GEN_KPT);
    for (int gk = blockIdx.z; gk < groups * kblocks; gk += gridDim.z) {
        const int g = gk / kblocks, k0 = (gk - g * kblocks) * GEN_KPT;  // group, first local channel
        const float* wk = w + ((idx_t)g * Kg + k0) * CRS;                // filter of channel g*Kg + k0

        float acc[GEN_PPT][GEN_KPT];
#pragma unroll
        for (int i = 0; i < GEN_PPT; ++i)
#pragma unroll
            for (int kk = 0; kk < GEN_KPT; ++kk) acc[i][kk] = 0.0f;

        // The current tap (c, r, s) and its offset from x_pix: (g*Cg + c)*H*W + r*dh*W + s*dw.
        int c = 0, r = 0, s = 0;
        idx_t tap = (idx_t)g * Cg * HW;
        bool row_ok[GEN_PPT];  // is input row hb + r*dh inside the image?
#pragma unroll
        for (int i = 0; i < GEN_PPT; ++i) row_ok[i] = (unsigned)hb[i] < (unsigned)H;

        for (int j0 = 0; j0 < CRS; j0 += GEN_TAPS) {
            const int nt = min(GEN_TAPS, CRS - j0);  // taps in this round
            __syncthreads();                         // everyone is done with the previous round
            for (int e = threadIdx.x; e < GEN_KPT * GEN_TAPS; e += GEN_BLOCK) {
                const int kk = e / GEN_TAPS, t = e % GEN_TAPS;  // consecutive threads: consecutive taps
                ws[t][kk] = (t < nt && k0 + kk < Kg) ? wk[(idx_t)kk * CRS + j0 + t] : 0.0f;
            }
            __syncthreads();

            for (int t = 0; t < nt; ++t) {
                float wv[GEN_KPT];
#pragma unroll
                for (int kk = 0; kk < GEN_KPT; kk += 4) {
                    const float4 v = *reinterpret_cast<const float4*>(&ws[t][kk]);
                    wv[kk] = v.x, wv[kk + 1] = v.y, wv[kk + 2] = v.z, wv[kk + 3] = v.w;
                }
                const int col = s * dw;
#pragma unroll
                for (int i = 0; i < GEN_PPT; ++i) {
                    const bool ok = row_ok[i] && (unsigned)(wb[i] + col) < (unsigned)W;
                    const float xv = ok ? x[x_pix[i] + tap] : 0.0f;  // zero padding
#pragma unroll
                    for (int kk = 0; kk < GEN_KPT; ++kk) acc[i][kk] = fmaf(xv, wv[kk], acc[i][kk]);
                }
                // Next tap, in w's memory order: s fastest, then r, then c.
                tap += dw;
                if (++s == S) {
                    s = 0;
                    if (++r == R) {
                        r = 0;
                        ++c;
                    }
                    tap = ((idx_t)g * Cg + c) * HW + (idx_t)r * dh * W;
#pragma unroll
                    for (int i = 0; i < GEN_PPT; ++i) row_ok[i] = (unsigned)(hb[i] + r * dh) < (unsigned)H;
                }
            }
        }

        // 3. Store: y[n][g*Kg + k0 + kk][p][q]; a warp writes 32 consecutive pixels per channel.
#pragma unroll
        for (int i = 0; i < GEN_PPT; ++i) {
            if (y_pix[i] < 0) continue;
#pragma unroll
            for (int kk = 0; kk < GEN_KPT; ++kk)
                if (k0 + kk < Kg) y[y_pix[i] + ((idx_t)g * Kg + k0 + kk) * PQ] = acc[i][kk];
        }
    }
}
