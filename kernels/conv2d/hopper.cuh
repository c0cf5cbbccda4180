// hopper.cuh - the Hopper (sm_90a) wrappers of day 16: mbarriers, the bulk tensor copy (TMA) in
// its tiled and im2col modes, wgmma from shared-memory descriptors, and setmaxnreg.
//
// Each wrapper is one PTX instruction (or a short fixed sequence), inlined, with the operands as
// the instruction takes them. Everything here needs sm_90a: build with -arch=sm_90a (the
// variant's target), which runs on compute capability 9.0 only.
//
//   wrapper                          PTX                                                    
//   mbar_init(bar, count)            mbarrier.init.shared::cta.b64
//   mbar_fence_init()                fence.mbarrier_init.release.cluster (init -> the copy engine)
//   mbar_expect_tx(bar, bytes)       mbarrier.arrive.expect_tx.shared::cta.b64 (one arrival + bytes)
//   mbar_arrive(bar)                 mbarrier.arrive.shared::cta.b64                        
//   mbar_wait(bar, parity)           mbarrier.try_wait.parity.shared::cta.b64, in a loop    
//   mbar_arrive_peer(bar, rank)      mapa.shared::cluster.u32, then mbarrier.arrive.shared::cluster.b64
//                                    (an arrival on the barrier at the same offset in block `rank` of the cluster)
//   cluster_sync()                   barrier.cluster.arrive.release + barrier.cluster.wait.acquire
//   tma_load_4d(dst, map, bar, c..)  cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   tma_load_4d_multicast(dst, map, bar, c.., mask)
//                                    the same with .multicast::cluster: the box lands at dst, and its bytes
//                                    count on bar, in every block of the cluster named in mask
//   tma_im2col_4d(dst, map, bar, c.., off_w, off_h)
//                                    cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes
//   tma_im2col_4d_multicast(dst, map, bar, c.., off_w, off_h, mask)
//                                    the same with .multicast::cluster, as tma_load_4d_multicast
//   fence_async_shared()             fence.proxy.async.shared::cta (this thread's shared writes -> the copy engine)
//   tma_store_2d(map, src, c0, c1)   cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
//   bulk_commit()                    cp.async.bulk.commit_group (the stores issued so far: one group)
//   bulk_wait_read<N>()              cp.async.bulk.wait_group.read N (all but N groups have read their source)
//   bulk_wait<N>()                   cp.async.bulk.wait_group N (all but N groups are complete)
//   wgmma_fence()                    wgmma.fence.sync.aligned (registers -> the next wgmma)
//   wgmma_commit()                   wgmma.commit_group.sync.aligned
//   wgmma_wait<N>()                  wgmma.wait_group.sync.aligned N
//   wgmma<N, BF16>(d, da, db, acc)   wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T, T = f16 or bf16,
//                                    A and B from shared memory (K-major), D += A B if acc else D = A B
//   sw128_desc(p)                    none: the 64-bit shared-memory matrix descriptor of a K-major
//                                    tile of 128-byte rows stored with the 128-byte swizzle
//   setmaxnreg_inc<R>(), _dec<R>()   setmaxnreg.inc / .dec.sync.aligned.u32 R
//
// Source: the PTX ISA (NVIDIA, "Parallel Thread Execution ISA" 8.x/9.0), sections
//   Parallel Synchronization and Communication Instructions: mbarrier (#parallel-synchronization-
//     and-communication-instructions-mbarrier), its expect-tx operation and phase parity
//   Data Movement and Conversion Instructions: cp.async.bulk.tensor (#data-movement-and-conversion-
//     instructions-cp-async-bulk-tensor), cp.async.bulk.commit_group / wait_group; Tensors: Tensor
//     Access Modes, im2col mode (#tensor-im2col-mode)
//   Parallel Synchronization and Communication Instructions: membar / fence (fence.proxy.async, the
//     async proxy: #parallel-synchronization-and-communication-instructions-membar)
//   Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions (#asynchronous-warpgroup-
//     level-matrix-instructions): wgmma.mma_async, the matrix descriptor (#asynchronous-warpgroup-
//     level-matrix-shared-memory-layout-matrix-descriptor), wgmma.fence / commit_group / wait_group,
//     and the register fragment of D for .m64nNk16
//   Miscellaneous Instructions: setmaxnreg (#miscellaneous-instructions-setmaxnreg)
//   Thread-block clusters: barrier.cluster (#parallel-synchronization-and-communication-instructions-
//     barrier-cluster), mapa (#data-movement-and-conversion-instructions-mapa), and the
//     .multicast::cluster form of cp.async.bulk.tensor
// and the CUDA driver API's cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col, which fill the
// 128-byte tensor maps on the host (helpers/tma.py).
#pragma once

#include <cstdint>

#include "tensor_core.cuh"  // smem_addr

// ---- mbarriers: a 64-bit word in shared memory that counts arrivals and bytes of one phase ----

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the copy engine (the async proxy); then __syncthreads.
__device__ __forceinline__ void mbar_fence_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` more to come from copies completing on this barrier:
// the phase completes when every arrival is in and the bytes have landed.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Wait until the phase of parity `parity` (0, 1, 0, ... as phases complete) is complete.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

// ---- clusters: blocks launched together on one GPC, whose shared memories reach each other ----

// An arrival on the mbarrier at bar's offset in block `rank` of this cluster (another block's, or
// this one's): mapa turns the local shared address into that block's, in the cluster window.
__device__ __forceinline__ void mbar_arrive_peer(uint64_t* bar, unsigned rank) {
    asm volatile(
        "{\n.reg .b32 peer;\n"
        "mapa.shared::cluster.u32 peer, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [peer];\n}\n" ::"r"(smem_addr(bar)),
        "r"(rank)
        : "memory");
}

// Every thread of every block of the cluster arrives, then waits for all the others: the blocks'
// shared memories (barriers included) are ready before anyone signals them, or no longer needed
// before a block exits.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// ---- the bulk tensor copy (TMA): one thread asks the copy engine for a whole box ------------
// `map` is a CUtensorMap (128 bytes, 64-byte aligned) passed as a __grid_constant__ kernel
// parameter; coordinates are innermost first, in elements, and may be negative or past the end
// (those elements are written as zeros). The bytes count on `bar` (mbar_expect_tx).
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// tma_load_4d into every block of the cluster whose bit is set in `mask` (bit r: rank r): the box
// lands at dst's offset there, and its bytes count on the barrier at bar's offset there.
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const void* map, uint64_t* bar, int c0, int c1,
                                                      int c2, int c3, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(mask)
        : "memory");
}

// im2col mode on an NHWC tensor (dims C, W, H, N): the box is `pixels` consecutive output pixels
// of `channels` channels each (both fixed in the map), starting at input position (w, h) of image
// n, i.e. q0 * stride_w - pad_w and p0 * stride_h - pad_h of the first output pixel, walking the
// map's bounding box with the conv strides, shifted by the filter tap (off_w, off_h) =
// (s * dil_w, r * dil_h). Outside the image: zeros (the padding).
__device__ __forceinline__ void tma_im2col_4d(void* dst, const void* map, uint64_t* bar, int c, int w, int h, int n,
                                              unsigned short off_w, unsigned short off_h) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(c), "r"(w), "r"(h), "r"(n), "h"(off_w), "h"(off_h)
        : "memory");
}

// tma_im2col_4d into every block of the cluster whose bit is set in `mask`, as tma_load_4d_multicast.
__device__ __forceinline__ void tma_im2col_4d_multicast(void* dst, const void* map, uint64_t* bar, int c, int w, int h,
                                                        int n, unsigned short off_w, unsigned short off_h,
                                                        unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8}, %9;\n" ::"r"(smem_addr(dst)),
        "l"(map), "r"(smem_addr(bar)), "r"(c), "r"(w), "r"(h), "r"(n), "h"(off_w), "h"(off_h), "h"(mask)
        : "memory");
}

// ---- the bulk tensor store: the copy engine writes a box of shared memory to global memory ----
// The source is laid out as a load of the same map would write it (swizzle included); elements
// of the box outside the tensor are not written. Stores are asynchronous: the issuing thread
// groups them (bulk_commit) and waits for a group to have read its shared memory (bulk_wait_read)
// before that memory is written again, and for the whole group (bulk_wait) before the block exits.
// Shared memory written by threads reaches the copy engine (the async proxy) only through a
// fence_async_shared by each writing thread, then a barrier, then the issue.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void tma_store_2d(const void* map, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
                 "r"(smem_addr(src)), "r"(c0), "r"(c1)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------
// Descriptor of a K-major tile of rows of 64 halves (128 bytes) written by the copy engine with
// the 128-byte swizzle (16-byte chunk j of row r at chunk j ^ (r % 8)), based at a 1024-byte
// aligned address: start address >> 4 (bits 0-13), leading byte offset 16 >> 4 (unused by this
// layout), stride byte offset 1024 >> 4 (8 rows of 128 bytes: the next 8-row core-matrix group,
// bits 32-45), layout 1 = 128-byte swizzle (bits 62-63). The k-th 16-wide slice of GEMM-K starts
// 32 bytes further: add 2 * k to the descriptor (the swizzle is applied to the full address).
__device__ __forceinline__ uint64_t sw128_desc(const void* tile) {
    const uint64_t addr = smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the accumulators' registers in place across the asynchronous wgmma (the compiler may
// not move them while the tensor cores write them).
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x N fp32, N / 2 registers per thread) += A (64 x 16, descriptor da) * B (N x 16, db)^T;
// scale_d = 0 overwrites D instead. Register i of thread t (warp w = t / 32 of the warpgroup,
// lane l = t % 32) holds row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + i % 2.
// The wrappers below differ only in N and the element type: the register list (WGMMA_Dn, its
// "%0, %1, ..." string) and the output operands (WGMMA_OUTn, "+f"(d[i])) are written out once per
// N; the descriptors and scale-d follow at %(N/2), %(N/2 + 1), %(N/2 + 2).
#define WGMMA_D64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_OUT64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WGMMA_D128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_OUT128 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_D256 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_OUT256 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WGMMA_WRAPPER(N, T, NAME)                                                                        \
    __device__ __forceinline__ void NAME(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {    \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" WGMMA_SCALE_##N ", 0;\n"                  \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " {" WGMMA_D##N "}, " \
                     "%" WGMMA_DA_##N ", %" WGMMA_DB_##N ", p, 1, 1, 0, 0;\n}\n"                     \
                     : WGMMA_OUT##N                                                                      \
                     : "l"(da), "l"(db), "r"(scale_d));                                                  \
    }
#define WGMMA_DA_64 "32"
#define WGMMA_DB_64 "33"
#define WGMMA_SCALE_64 "34"
#define WGMMA_DA_128 "64"
#define WGMMA_DB_128 "65"
#define WGMMA_SCALE_128 "66"
#define WGMMA_DA_256 "128"
#define WGMMA_DB_256 "129"
#define WGMMA_SCALE_256 "130"
WGMMA_WRAPPER(64, "f16", wgmma_m64n64k16_fp16)
WGMMA_WRAPPER(64, "bf16", wgmma_m64n64k16_bf16)
WGMMA_WRAPPER(128, "f16", wgmma_m64n128k16_fp16)
WGMMA_WRAPPER(128, "bf16", wgmma_m64n128k16_bf16)
WGMMA_WRAPPER(256, "f16", wgmma_m64n256k16_fp16)
WGMMA_WRAPPER(256, "bf16", wgmma_m64n256k16_bf16)

template <int N, bool BF16>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
    static_assert(N == 64 || N == 128 || N == 256, "wgmma wrappers for N = 64, 128 and 256");
    if constexpr (N == 64 && !BF16) wgmma_m64n64k16_fp16(d, da, db, scale_d);
    else if constexpr (N == 64) wgmma_m64n64k16_bf16(d, da, db, scale_d);
    else if constexpr (N == 128 && !BF16) wgmma_m64n128k16_fp16(d, da, db, scale_d);
    else if constexpr (N == 128) wgmma_m64n128k16_bf16(d, da, db, scale_d);
    else if constexpr (!BF16) wgmma_m64n256k16_fp16(d, da, db, scale_d);
    else wgmma_m64n256k16_bf16(d, da, db, scale_d);
}

// ---- registers per warpgroup -----------------------------------------------------------------
// A warpgroup that only issues copies gives registers back (dec) so the math warpgroups can take
// more (inc); R is a multiple of 8 in 24 .. 256. Effective only with a register cap at entry
// (__launch_bounds__(threads, 1)).
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
