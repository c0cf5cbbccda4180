// winograd_transforms.cuh - Winograd F(m x m, 3 x 3)'s transforms, shared by the Winograd kernels:
// 20_winograd.cu (the pipeline over a workspace) and 21_winograd_fused.cu (day 21, one fused main kernel).
//
// The constants are not typed here: days/day20_winograd builds them exactly (`winograd(m)`) and
// passes them as -D defines (`kernel_defines`): WINO_M = m; WINO_AT (m x n), WINO_G (n x 3),
// WINO_BT (n x n) row by row, each entry WINO_E(value), value the float32 nearest the exact
// fraction (a comma-free list: nvcc splits -D values at commas).
//
// Every transform is a fixed sum of products in a fixed order (`mul_left`, `mul_right_t`: l
// ascending, zero entries skipped, one fmaf each), so a kernel that calls these gets the same bits
// for the same inputs, whatever its thread mapping:
//   filter_tile  U = G g G^T   = mul_right_t<G>(mul_left<G>(g))
//   input_tile   V = B^T d B   = mul_right_t<B^T>(mul_left<B^T>(d))
//   output_tile  Y = A^T M A   = mul_right_t<A^T>(mul_left<A^T>(M))
#pragma once
#include "conv2d_common.cuh"  // idx_t, CEIL_DIV

#ifndef WINO_M
#error "WINO_M (the output tile side m of F(m x m, 3 x 3)) must be defined, with WINO_AT, WINO_G, WINO_BT"
#endif
#if !defined(WINO_AT) || !defined(WINO_G) || !defined(WINO_BT)
#error "WINO_AT, WINO_G and WINO_BT (the transforms, days/day20_winograd/pipeline.py kernel_defines) must be defined"
#endif

constexpr int WM = WINO_M;      // output tile side m
constexpr int WR = 3;           // filter side r
constexpr int WN = WINO_M + 2;  // input tile side n = m + r - 1: also the transform positions per side

#define WINO_E(v) v,  // one entry of a generated matrix

// The transforms as compile-time matrices: T::v(i, j) is a constant once the loops are unrolled,
// so mul_left's test for a zero entry is decided at compile time and a zero entry emits no instruction.
struct MatAT {  // A^T, m x n
    static constexpr int rows = WM, cols = WN;
    __host__ __device__ static constexpr float v(int i, int j) {
        constexpr float t[WM][WN] = {WINO_AT};
        return t[i][j];
    }
};
struct MatG {  // G, n x r
    static constexpr int rows = WN, cols = WR;
    __host__ __device__ static constexpr float v(int i, int j) {
        constexpr float t[WN][WR] = {WINO_G};
        return t[i][j];
    }
};
struct MatBT {  // B^T, n x n
    static constexpr int rows = WN, cols = WN;
    __host__ __device__ static constexpr float v(int i, int j) {
        constexpr float t[WN][WN] = {WINO_BT};
        return t[i][j];
    }
};

// out = T . in: out[i][j] = sum_l T(i, l) in[l][j], l ascending, zero entries skipped.
template <class T, int COLS>
__device__ __forceinline__ void mul_left(const float (&in)[T::cols][COLS], float (&out)[T::rows][COLS]) {
#pragma unroll
    for (int i = 0; i < T::rows; ++i)
#pragma unroll
        for (int j = 0; j < COLS; ++j) {
            float acc = 0.0f;
#pragma unroll
            for (int l = 0; l < T::cols; ++l)
                if (T::v(i, l) != 0.0f) acc = fmaf(T::v(i, l), in[l][j], acc);
            out[i][j] = acc;
        }
}

// out = in . T^T: out[i][j] = sum_l in[i][l] T(j, l), l ascending, zero entries skipped.
template <class T, int ROWS>
__device__ __forceinline__ void mul_right_t(const float (&in)[ROWS][T::cols], float (&out)[ROWS][T::rows]) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i)
#pragma unroll
        for (int j = 0; j < T::rows; ++j) {
            float acc = 0.0f;
#pragma unroll
            for (int l = 0; l < T::cols; ++l)
                if (T::v(j, l) != 0.0f) acc = fmaf(in[i][l], T::v(j, l), acc);
            out[i][j] = acc;
        }
}

__device__ __forceinline__ void filter_tile(const float (&g)[WR][WR], float (&u)[WN][WN]) {
    float gg[WN][WR];
    mul_left<MatG>(g, gg);
    mul_right_t<MatG>(gg, u);
}

// Tile t -> image n and the top-left input pixel (h0, w0) of its n x n patch.
struct TileOrigin {
    int n, h0, w0;
    __device__ __forceinline__ TileOrigin(int t, int tP, int tQ, int ph, int pw) {
        n = t / (tP * tQ);
        const int rem = t - n * (tP * tQ), th = rem / tQ, tw = rem - th * tQ;
        h0 = th * WM - ph;
        w0 = tw * WM - pw;
    }
};

__device__ __forceinline__ void input_tile(const float (&d)[WN][WN], float (&v)[WN][WN]) {
    float bd[WN][WN];
    mul_left<MatBT>(d, bd);
    mul_right_t<MatBT>(bd, v);
}

__device__ __forceinline__ void output_tile(const float (&mt)[WN][WN], float (&y)[WM][WM]) {
    float am[WM][WN];
    mul_left<MatAT>(mt, am);
    mul_right_t<MatAT>(am, y);
}
