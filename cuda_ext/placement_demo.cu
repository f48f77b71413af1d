// Kernels built on placement.cuh, compiled once per placement mode. The placement checksum kernel: the same
// kernel as triton_kernels/placement_demo.py (which says why it proves exactly-once processing); the whole CTA
// runs the placement loop, thread 0 does the scalar work of each item. The capped chase: a latency-bound item
// (one dependent chain, thread 0) in a CTA whose dynamic shared memory caps an SM at a few CTAs, as attention
// kernels are capped; with and without the helpers (benchmarks/bench_placement.py times both).
#include "placement.cuh"
#include "placement_demo.h"
#include "protocol.cuh"

namespace l2topo {

constexpr int64_t VALUE_MUL = 40503;  // item_value(i) = 1 + (i * VALUE_MUL) % VALUE_MOD, as in the Triton kernel
constexpr int64_t VALUE_MOD = 65536;

template <int PLACE>
__global__ void __launch_bounds__(PLACEMENT_DEMO_THREADS)
    placement_demo_kernel(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state) {
  const PlanCta cta = plan_start<PLACE>(plan, state);
  PlanItem next = plan_next<PLACE>(plan, state, cta.sm, 0);
  int64_t n_done = 0;
  while (next.item >= 0) {
    if (threadIdx.x == 0) {
      const int64_t i = next.item;
      atomicAdd(reinterpret_cast<unsigned long long*>(out + i % n_out),
                static_cast<unsigned long long>(1 + (i * VALUE_MUL) % VALUE_MOD));
      atomicAdd(count + i, 1);
    }
    ++n_done;
    next = plan_next<PLACE>(plan, state, cta.sm, next.phase);
  }
  plan_finish<PLACE>(plan, state, cta.sm, cta.t0, n_done);
}

// Item i: n_loads dependent loads from starts[i]; ends[i] = where the chase ended. The shared memory is only
// held (its size is the point), one word of it touched so that it is really allocated.
__device__ __forceinline__ void capped_chase_item(const int64_t* starts, int64_t* ends, int64_t n_loads,
                                                  int64_t item) {
  extern __shared__ int64_t held[];
  if (threadIdx.x == 0) {
    int64_t p = starts[item];
#pragma unroll 1  // unrolled, the shares-mode kernel spilled 8 bytes (ptxas, sm_90): a dependent chain gains nothing
    for (int64_t k = 0; k < n_loads; ++k) p = chase(p);
    held[0] = p;
    ends[item] = held[0];
  }
}

template <int PLACE>
__global__ void __launch_bounds__(PLACEMENT_DEMO_THREADS)
    capped_chase_kernel(const int64_t* starts, int64_t* ends, int64_t n_loads, const int32_t* plan, int64_t* state) {
  const PlanCta cta = plan_start<PLACE>(plan, state);
  PlanItem next = plan_next<PLACE>(plan, state, cta.sm, 0);
  int64_t n_done = 0;
  while (next.item >= 0) {
    capped_chase_item(starts, ends, n_loads, next.item);
    ++n_done;
    next = plan_next<PLACE>(plan, state, cta.sm, next.phase);
  }
  plan_finish<PLACE>(plan, state, cta.sm, cta.t0, n_done);
}

// The hand-written plain kernel of the same work: CTA b chases item b.
__global__ void __launch_bounds__(PLACEMENT_DEMO_THREADS)
    capped_chase_plain_kernel(const int64_t* starts, int64_t* ends, int64_t n_loads) {
  capped_chase_item(starts, ends, n_loads, blockIdx.x);
}

namespace {
template <typename Kernel>
cudaError_t allow_shared(Kernel kernel, int64_t smem_bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
}
}  // namespace

cudaError_t launch_capped_chase(const int64_t* starts, int64_t* ends, int64_t n_loads, const int32_t* plan,
                                int64_t* state, int64_t place, int64_t smem_bytes, int64_t grid,
                                cudaStream_t stream) {
  const dim3 blocks(static_cast<unsigned>(grid));
  const size_t smem = static_cast<size_t>(smem_bytes);
  cudaError_t err = cudaSuccess;
  switch (place) {
    case CAPPED_PLAIN:
      err = allow_shared(capped_chase_plain_kernel, smem_bytes);
      if (err == cudaSuccess) capped_chase_plain_kernel<<<blocks, PLACEMENT_DEMO_THREADS, smem, stream>>>(starts, ends, n_loads);
      break;
    case PLACE_DIRECT:
      err = allow_shared(capped_chase_kernel<PLACE_DIRECT>, smem_bytes);
      if (err == cudaSuccess)
        capped_chase_kernel<PLACE_DIRECT><<<blocks, PLACEMENT_DEMO_THREADS, smem, stream>>>(starts, ends, n_loads, plan, state);
      break;
    case PLACE_SHARES:
      err = allow_shared(capped_chase_kernel<PLACE_SHARES>, smem_bytes);
      if (err == cudaSuccess)
        capped_chase_kernel<PLACE_SHARES><<<blocks, PLACEMENT_DEMO_THREADS, smem, stream>>>(starts, ends, n_loads, plan, state);
      break;
    case PLACE_QUEUES:
      err = allow_shared(capped_chase_kernel<PLACE_QUEUES>, smem_bytes);
      if (err == cudaSuccess)
        capped_chase_kernel<PLACE_QUEUES><<<blocks, PLACEMENT_DEMO_THREADS, smem, stream>>>(starts, ends, n_loads, plan, state);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return err == cudaSuccess ? cudaGetLastError() : err;
}

int64_t capped_chase_occupancy(int64_t place, int64_t smem_bytes) {
  int blocks = 0;
  const size_t smem = static_cast<size_t>(smem_bytes);
  cudaError_t err = cudaErrorInvalidValue;
  switch (place) {
    case CAPPED_PLAIN:
      if ((err = allow_shared(capped_chase_plain_kernel, smem_bytes)) == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, capped_chase_plain_kernel, PLACEMENT_DEMO_THREADS, smem);
      break;
    case PLACE_DIRECT:
      if ((err = allow_shared(capped_chase_kernel<PLACE_DIRECT>, smem_bytes)) == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, capped_chase_kernel<PLACE_DIRECT>,
                                                            PLACEMENT_DEMO_THREADS, smem);
      break;
    case PLACE_SHARES:
      if ((err = allow_shared(capped_chase_kernel<PLACE_SHARES>, smem_bytes)) == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, capped_chase_kernel<PLACE_SHARES>,
                                                            PLACEMENT_DEMO_THREADS, smem);
      break;
    case PLACE_QUEUES:
      if ((err = allow_shared(capped_chase_kernel<PLACE_QUEUES>, smem_bytes)) == cudaSuccess)
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, capped_chase_kernel<PLACE_QUEUES>,
                                                            PLACEMENT_DEMO_THREADS, smem);
      break;
    default:
      break;
  }
  return err == cudaSuccess ? blocks : -1;
}

cudaError_t launch_placement_demo(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state,
                                  int64_t place, int64_t grid, cudaStream_t stream) {
  const dim3 blocks(static_cast<unsigned>(grid));
  switch (place) {
    case PLACE_DIRECT:
      placement_demo_kernel<PLACE_DIRECT><<<blocks, PLACEMENT_DEMO_THREADS, 0, stream>>>(out, count, n_out, plan, state);
      break;
    case PLACE_SHARES:
      placement_demo_kernel<PLACE_SHARES><<<blocks, PLACEMENT_DEMO_THREADS, 0, stream>>>(out, count, n_out, plan, state);
      break;
    case PLACE_QUEUES:
      placement_demo_kernel<PLACE_QUEUES><<<blocks, PLACEMENT_DEMO_THREADS, 0, stream>>>(out, count, n_out, plan, state);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace l2topo
