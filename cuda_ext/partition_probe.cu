// CUDA backend of the partition probe: partition_probe_kernel of triton_kernels/partition_probe.py (which
// documents the method), load for load. Each pair of SMs times every block of its range, the fastest of
// N_TIMED single loads of the block's first line after one warm load, and the two SMs take the halves of each
// CHUNK blocks in turn. Built ahead of time (`python -m torch_l2topo build`), it needs neither Triton's import
// nor its first-launch lookup in a fresh process. One warp per CTA, lane 0 works.
#include "partition_probe.h"
#include "protocol.cuh"

namespace l2topo {
namespace {

constexpr int64_t CHUNK = 64;  // triton_kernels/partition_probe.py's CHUNK

// The fastest of N_TIMED dependent loads of the line at addr, each timed alone, after one warm load; starts
// once `prev` (the previous block's end clock) has arrived, and leaves this block's end clock in it.
template <int N_TIMED>
__device__ __forceinline__ int64_t fastest_load(int64_t addr, int64_t& prev, int64_t zero) {
  int64_t p = address_after(addr, chase(address_after(addr, prev, zero)), zero);
  int64_t t0 = clock_after(p);
  int64_t fastest = int64_t{1} << 40;
#pragma unroll
  for (int i = 0; i < N_TIMED; ++i) {
    p = address_after(addr, chase(address_after(addr, t0, zero)), zero);  // issues after the clock read before it
    const int64_t t1 = clock_after(p);
    fastest = t1 - t0 < fastest ? t1 - t0 : fastest;
    t0 = t1;
  }
  prev = t0;
  return fastest;
}

template <int N_TIMED>
__global__ void __launch_bounds__(32) partition_probe_kernel(ProbeLaunch launch, int64_t base, const int64_t* plan,
                                                             int32_t* cycles, int64_t n_blocks, int64_t block_bytes,
                                                             int64_t zero) {
  if (threadIdx.x != 0) return;
  const int64_t sm = claim_sm(launch.ctrl, launch.n_sm, launch.wave, launch.timeout_ns);
  if (sm < 0) return;
  const int64_t lo = plan[sm * 3 + 0], hi = plan[sm * 3 + 1], row = plan[sm * 3 + 2];
  int64_t prev = lo;  // any value: the first block waits for nothing
  // not unrolled, as Triton leaves these loops: one block's loads and clock reads at a time
#pragma unroll 1
  for (int64_t c0 = lo; c0 < hi; c0 += CHUNK) {
    const int64_t m = hi - c0 < CHUNK ? hi - c0 : CHUNK;
    const int64_t shift = row * (m / 2);
#pragma unroll 1
    for (int64_t i = 0; i < m; ++i) {
      const int64_t j = c0 + (i + shift) % m;
      cycles[row * n_blocks + j] = static_cast<int32_t>(fastest_load<N_TIMED>(base + j * block_bytes, prev, zero));
    }
  }
  finish_turn(launch.ctrl);
}

template <int N_TIMED>
cudaError_t launch_with(const ProbeLaunch& launch, int64_t base, const int64_t* plan, int32_t* cycles,
                        int64_t n_blocks, int64_t block_bytes, int64_t zero, cudaStream_t stream) {
  partition_probe_kernel<N_TIMED><<<static_cast<unsigned>(launch.grid), 32, 0, stream>>>(
      launch, base, plan, cycles, n_blocks, block_bytes, zero);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_partition_probe(const ProbeLaunch& launch, int64_t base, const int64_t* plan, int32_t* cycles,
                                   int64_t n_blocks, int64_t block_bytes, int64_t zero, int64_t n_timed,
                                   cudaStream_t stream) {
  switch (n_timed) {  // the counts the host uses, unrolled as the Triton kernel's static_range is
    case 1: return launch_with<1>(launch, base, plan, cycles, n_blocks, block_bytes, zero, stream);
    case 2: return launch_with<2>(launch, base, plan, cycles, n_blocks, block_bytes, zero, stream);
    case 4: return launch_with<4>(launch, base, plan, cycles, n_blocks, block_bytes, zero, stream);
    case 8: return launch_with<8>(launch, base, plan, cycles, n_blocks, block_bytes, zero, stream);
    case 16: return launch_with<16>(launch, base, plan, cycles, n_blocks, block_bytes, zero, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace l2topo
