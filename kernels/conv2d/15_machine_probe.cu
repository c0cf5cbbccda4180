// Day 15 - machine_probe: two throughput kernels that measure the tuner's cost model on the GPU
// present (helpers.tune.probe). No convolution: each kernel issues one instruction as fast as the
// SMs can and writes a result the compiler cannot drop.
//
// What changed since day 15's first model: the model read an H200's rates on every GPU (the mma
// rate scaled by SMs x clock, DRAM 4 TB/s, L2 10 TB/s). On a GeForce GPU the tensor-core rate with
// fp32 accumulation is half the fp16-accumulate rate, and DRAM is a tenth of an H200's; so the
// rates are now measured here, once per GPU, and cached (helpers.tune.probe.machine_for).
//
//   probe_mma_f32acc  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (the instruction of days
//                     11-14, fp16 in, fp32 accumulate): per loop step each warp issues MMA_CHAINS
//                     mma.sync into MMA_CHAINS independent accumulator tiles, so consecutive
//                     instructions never wait on each other; a chain depends on itself only across
//                     steps, MMA_CHAINS instructions later. One mma.sync = 16 x 8 x 16 MACs = 4,096
//                     FLOP per warp. sm_80+; on sm_75 the body is compiled out (it writes NaN).
//   probe_ffma        fp32 FMA (fmaf -> FFMA): FMA_CHAINS independent chains per thread,
//                     x = x * a + b, FMA_UNROLL steps per loop trip. One FMA = 2 FLOP per thread.
//
// Mapping: no data is read. Thread t of block b writes out[b * blockDim.x + t] = the sum of its
//   accumulators (mma: its 4 x MMA_CHAINS fp32 elements; ffma: its FMA_CHAINS values), so every
//   instruction feeds a stored value.
// Launch (helpers.tune.probe): block (PROBE_THREADS, 1, 1) = 8 warps; grid (PROBE_BLOCKS_PER_SM * SMs,
//   1, 1): one full wave, 32 resident warps per SM (fits sm_75's 1,024 threads per SM);
//   __launch_bounds__(PROBE_THREADS, PROBE_BLOCKS_PER_SM) holds the registers to <= 64 per thread so
//   the 4 blocks are resident; no shared memory.
//   FLOP of one launch: mma  blocks * 8 warps * iters * MMA_CHAINS * 4096
//                       ffma blocks * PROBE_THREADS * iters * FMA_CHAINS * 2   (iters % FMA_UNROLL == 0)
// Compile-time parameters (defaults): MMA_CHAINS 8, FMA_CHAINS 8, FMA_UNROLL 4.
//
// Assumes: out holds blocks * PROBE_THREADS floats; iters >= 0 (0: an empty launch, which the probe
// times as the launch cost). The operands are small constants derived from the lane, finite in fp16;
// the fp32 sums stay finite for any iters (the mma operands' products are below 1e-5; the FMA
// chains converge to b / (1 - a)). Tensor cores may run at a higher clock on such data than on a
// GEMM's (day 11's caveat): the mma rate is a ceiling, as the model reads it.
//
// Source: the PTX ISA (NVIDIA), "Warp Level Matrix Multiply-Accumulate Instructions: mma" and its
// fragment layout for m16n8k16 (which registers a lane passes); the shape of day 11's probe.
#include <cuda_fp16.h>

#ifndef MMA_CHAINS
#define MMA_CHAINS 8
#endif
#ifndef FMA_CHAINS
#define FMA_CHAINS 8
#endif
#ifndef FMA_UNROLL
#define FMA_UNROLL 4
#endif

constexpr int PROBE_THREADS = 256, PROBE_BLOCKS_PER_SM = 4;

// Two fp16 values in one 32-bit register, as an mma.sync fragment register holds them.
__device__ __forceinline__ unsigned half2_bits(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS, PROBE_BLOCKS_PER_SM)
    probe_mma_f32acc(float* __restrict__ out, int iters) {
    float sum = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const int lane = threadIdx.x % 32;
    // A fragment (16 x 16, four registers) and B fragment (16 x 8, two registers): values of the
    // lane, so no two lanes' operands are equal, and none is known at compile time.
    const unsigned a0 = half2_bits(1e-3f * (lane % 7), -1e-3f * (lane % 5));
    const unsigned a1 = half2_bits(2e-3f * (lane % 3), 1e-3f);
    const unsigned a2 = half2_bits(-1e-3f, 1e-3f * (lane % 11));
    const unsigned a3 = half2_bits(1e-3f * (lane % 13), -2e-3f);
    const unsigned b0 = half2_bits(1e-3f * (lane % 2), 3e-3f);
    const unsigned b1 = half2_bits(-3e-3f, 1e-3f * (lane % 9));
    float d[MMA_CHAINS][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < MMA_CHAINS; ++c)
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                "{%8, %9}, {%0, %1, %2, %3};\n"
                : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
#pragma unroll
    for (int c = 0; c < MMA_CHAINS; ++c) sum += (d[c][0] + d[c][1]) + (d[c][2] + d[c][3]);
#else
    sum = __int_as_float(0x7fc00000);  // sm_75: no m16n8k16 f16 mma.sync; the Python side never launches it
#endif
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

extern "C" __global__ void __launch_bounds__(PROBE_THREADS, PROBE_BLOCKS_PER_SM)
    probe_ffma(float* __restrict__ out, int iters) {
    const float a = 0.999f - 1e-4f * (threadIdx.x % 7), b = 1e-3f * (1 + threadIdx.x % 5);
    float x[FMA_CHAINS];
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; ++c) x[c] = 0.5f + 0.01f * c;
    for (int it = 0; it < iters; it += FMA_UNROLL) {
#pragma unroll
        for (int u = 0; u < FMA_UNROLL; ++u)
#pragma unroll
            for (int c = 0; c < FMA_CHAINS; ++c) x[c] = fmaf(x[c], a, b);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < FMA_CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
