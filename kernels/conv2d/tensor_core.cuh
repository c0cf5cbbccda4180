// tensor_core.cuh - the tensor-core and cp.async wrappers of the mma.sync kernels (day 12 on).
//
// Each wrapper but swz is one PTX instruction (or one CUDA intrinsic that compiles to one),
// inlined, with the operands as the instruction takes them. Days 10 and 11 keep their own copies
// (a day never edits an earlier day's kernel); later days include this header.
//
//   wrapper                        PTX instruction                                     min sm
//   swz<BK>(r, ch)                 none: integer arithmetic (the stage layout)         any
//   swz_trans<COLS>(r, ch)         none: the same for stages read with .trans          any
//   smem_addr(p)                   cvta.to.shared (via __cvta_generic_to_shared)       any
//   ldsm_x4(r, addr)               ldmatrix.sync.aligned.m8n8.x4.shared.b16            sm_75
//   ldsm_x4_trans(r, addr)         ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16      sm_75
//   mma16816<BF16>(d, a, b0, b1)   mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32,      sm_80
//                                    T = f16 or bf16
//   pack2<BF16>(lo, hi)            cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 (via           sm_80 (the
//                                    __floats2half2_rn / __floats2bfloat162_rn)        x2 forms)
//   cp_async16(dst, src, valid)    cp.async.cg.shared.global [dst], [src], 16, src-size sm_80
//   cp_commit()                    cp.async.commit_group                               sm_80
//   cp_wait<N>()                   cp.async.wait_group N                               sm_80
//
// Source: the PTX ISA (NVIDIA, "Parallel Thread Execution ISA"), sections (and their anchors)
//   Data Movement and Conversion Instructions: cvta   (#data-movement-and-conversion-instructions-cvta)
//   Data Movement and Conversion Instructions: cvt    (#data-movement-and-conversion-instructions-cvt),
//     its .f16x2 / .bf16x2 forms
//   Data Movement and Conversion Instructions: cp.async, cp.async.commit_group,
//     cp.async.wait_group / cp.async.wait_all  (#data-movement-and-conversion-instructions-cp-async, ...)
//   Warp-level matrix load instruction: ldmatrix      (#warp-level-matrix-instructions-ldmatrix)
//   Warp Level Matrix Multiply-Accumulate Instructions: mma  (#warp-level-matrix-instructions-mma),
//     and its Matrix Fragments for mma.m16n8k16 with floating point type (which lane holds which element)
// The swizzle is day 11's (BK = 32), extended to BK = 64 on day 13; swz_trans is day 14's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// Offset (in halves) of 16-byte chunk ch of row r in a [rows][BK] stage, XOR-swizzled: chunk ch of
// row r sits at chunk ch ^ ((r >> 1) & 3) for BK = 32, ch ^ (r & 7) for BK = 64, so that ldmatrix
// reads and the 16-byte cp.async (or st.shared) writes of a stage are conflict-free.
template <int BK>
__device__ __forceinline__ int swz(int r, int ch) {
    static_assert(BK == 32 || BK == 64, "BK is 32 or 64");
    if constexpr (BK == 32) return r * 32 + ((ch ^ ((r >> 1) & 3)) << 3);
    else return r * 64 + ((ch ^ (r & 7)) << 3);
}

// Offset (in halves) of 16-byte chunk ch of row r in a [rows][COLS] stage whose rows are GEMM-K
// (wgrad's pixel-major tiles, dgrad's filter read in place), read with ldmatrix.trans: chunk ch of
// row r sits at chunk ch ^ (r & 7). Rows are COLS * 2 bytes apart, a multiple of 128, so unswizzled
// the 8 rows of one 8x8 matrix (the 8 addresses ldmatrix serves together) would share 4 banks; the
// XOR puts rows 8i .. 8i + 7 of one chunk in 8 different 16-byte bank groups. The stores stay
// conflict-free too: 8 consecutive threads copy 8 consecutive chunks of one row, and XOR with the
// row's key only permutes them within their aligned group of 8 (one 128-byte line).
template <int COLS>
__device__ __forceinline__ int swz_trans(int r, int ch) {
    static_assert(COLS % 64 == 0, "rows of whole groups of 8 chunks");
    return r * COLS + ((ch ^ (r & 7)) << 3);
}

// The 32-bit shared-memory address of a generic pointer into shared memory (what ldmatrix and
// cp.async take as their .shared operand).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ldmatrix.x4 from a shared-memory byte address (32-bit, as __cvta_generic_to_shared gives it).
// Lanes 8i .. 8i + 7 give the row addresses of 8x8 matrix i; each lane gets one 32-bit register
// (two 16-bit elements) of each of the four matrices, in the mma fragment layout.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same with .trans (day 14): each 8x8 matrix is read as 8 rows of 16 bytes and handed out
// transposed (lane l gets row l/4, columns 2(l%4) and 2(l%4)+1 of the transpose), so a tile stored
// with GEMM-K as its rows gives the fragments of one stored with GEMM-K along its rows.
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16-byte global -> shared copy; with valid == false nothing is read and 16 zero bytes are
// written (src-size 0), which is how padding and out-of-range rows become zeros. .cg caches the
// line in L2 only (L1 bypassed) and takes 16-byte copies only; .ca would keep it in L1 too.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// Close this thread's cp.async issued since the last commit into one group (an empty group too).
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most N_ of this thread's groups are still in flight (N_ must be an immediate).
// Only this thread's copies: a __syncthreads() after it makes everyone's visible.
template <int N_>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N_));
}

// d += a * b for one 16 x 8 x 16 tile of a warp: a is the 16 x 16 A fragment (4 registers of two
// halves), b0, b1 the 16 x 8 B fragment (column-major), d the 16 x 8 fp32 accumulators.
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

// Two fp32 values -> one pair of fp16/bf16 elements (4 bytes, lo in the low half), rounded to nearest.
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
