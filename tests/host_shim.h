// host_shim.h - just enough of CUDA for a kernel file to compile as C++20 and run on CPU threads
// (tests/hostrun.py): each block's threads are std::threads, __syncthreads a std::barrier,
// __shared__ a function-local static (one block runs at a time), fmaf the C library's fused
// multiply-add (one rounding, as on the GPU). Built with -ffp-contract=off: no other contraction.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct HostDim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local HostDim3 threadIdx, blockIdx;
inline HostDim3 blockDim, gridDim;
inline std::barrier<>* host_barrier = nullptr;
inline void __syncthreads() { host_barrier->arrive_and_wait(); }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

// Run kernel f on grid x block, one block at a time, each block's threads concurrently.
template <class... A, class... B>
void host_launch(void (*f)(A...), HostDim3 grid, HostDim3 block, B... args) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> bar((std::ptrdiff_t)nt);
                host_barrier = &bar;
                std::vector<std::thread> ts;
                ts.reserve(nt);
                for (unsigned t = 0; t < nt; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        blockIdx = {bx, by, bz};
                        f(args...);
                    });
                for (auto& th : ts) th.join();
            }
}

// A kernel argument from tests/hostrun.py's launch script: a float pointer or an int.
struct HostArg {
    float* p;
    long long i;
};
template <class T>
T host_arg(const HostArg& a) {
    if constexpr (std::is_pointer_v<T>)
        return (T)a.p;
    else
        return (T)a.i;
}
template <class... A, std::size_t... I>
void host_call(void (*f)(A...), HostDim3 g, HostDim3 b, const std::vector<HostArg>& v, std::index_sequence<I...>) {
    host_launch(f, g, b, host_arg<A>(v[I])...);
}
template <class... A>
void host_call(void (*f)(A...), HostDim3 g, HostDim3 b, const std::vector<HostArg>& v) {
    host_call(f, g, b, v, std::index_sequence_for<A...>{});
}
