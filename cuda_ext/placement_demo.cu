// The placement checksum kernel in CUDA: the same kernel as triton_kernels/placement_demo.py (which says why
// it proves exactly-once processing), built on placement.cuh. The whole CTA runs the placement loop; thread 0
// does the scalar work of each item.
#include "placement.cuh"
#include "placement_demo.h"

namespace l2topo {

constexpr int64_t VALUE_MUL = 40503;  // item_value(i) = 1 + (i * VALUE_MUL) % VALUE_MOD, as in the Triton kernel
constexpr int64_t VALUE_MOD = 65536;

__global__ void __launch_bounds__(PLACEMENT_DEMO_THREADS)
    placement_demo_kernel(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state) {
  const PlanCta cta = plan_start(plan, state);
  PlanItem next = plan_next(plan, state, cta.sm, PHASE_SHARE);
  int64_t n_done = 0;
  while (next.item >= 0) {
    if (threadIdx.x == 0) {
      const int64_t i = next.item;
      atomicAdd(reinterpret_cast<unsigned long long*>(out + i % n_out),
                static_cast<unsigned long long>(1 + (i * VALUE_MUL) % VALUE_MOD));
      atomicAdd(count + i, 1);
    }
    ++n_done;
    next = plan_next(plan, state, cta.sm, next.phase);
  }
  plan_finish(plan, state, cta.sm, cta.t0, n_done);
}

cudaError_t launch_placement_demo(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state,
                                  int64_t grid, cudaStream_t stream) {
  placement_demo_kernel<<<static_cast<unsigned>(grid), PLACEMENT_DEMO_THREADS, 0, stream>>>(out, count, n_out, plan,
                                                                                          state);
  return cudaGetLastError();
}

}  // namespace l2topo
