// conv2d_common.cuh - the conventions every kernel of the series shares.
//
// Tensors (NCHW layout, the default of torch.nn.functional.conv2d):
//   x  input   [N][C][H][W]
//   w  filter  [K][C][R][S]        (C/groups channels when grouped)
//   y  output  [N][K][P][Q]
// The convolution is torch's (a cross-correlation, no filter flip):
//   y[n][k][p][q] = sum_{c,r,s} x[n][c][p*stride_h - pad_h + r*dil_h][q*stride_w - pad_w + s*dil_w] * w[k][c][r][s]
// with x read as 0 outside the image.
//
// Thread -> output mapping, the same on every day:
//   x (threadIdx.x, blockIdx.x) -> output column q   (adjacent threads, adjacent addresses: coalesced)
//   y (threadIdx.y, blockIdx.y) -> output row p       (or the flattened row n*P + p)
//   z (blockIdx.z)              -> output channel k   (or the flattened n*K + k)
//
// Grid limits: gridDim.y and gridDim.z are at most 65,535. Kernels cap the grid there and loop
// (a "grid-stride loop"), so any N, K or P is covered.
//
// Offsets: an index into a tensor of more than 2^31 elements overflows a 32-bit int. Every
// offset that can grow with N, C, K, H, W is computed in 64 bits (`idx_t`).
#pragma once

typedef long long idx_t;

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
