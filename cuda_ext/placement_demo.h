// Host launcher of the placement checksum kernel (placement_demo.cu).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

// Threads per CTA of the demo: four warps, so the block-cooperative helpers are exercised beyond one warp.
constexpr int PLACEMENT_DEMO_THREADS = 128;

// grid CTAs over the plan in placement mode `place` (layout.h PLACE_*); item i adds 1 + (i * 40503) % 65536
// into out[i % n_out] and 1 into count[i]. An unknown mode: cudaErrorInvalidValue.
cudaError_t launch_placement_demo(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state,
                                  int64_t place, int64_t grid, cudaStream_t stream);

// The capped chase: `place` a PLACE_* mode (the kernel on the helpers) or CAPPED_PLAIN (the same work written
// without them, plan and state unused); each CTA holds smem_bytes of dynamic shared memory.
constexpr int64_t CAPPED_PLAIN = -1;
cudaError_t launch_capped_chase(const int64_t* starts, int64_t* ends, int64_t n_loads, const int32_t* plan,
                                int64_t* state, int64_t place, int64_t smem_bytes, int64_t grid, cudaStream_t stream);

// CTAs of the capped chase (mode `place`) an SM holds at once with smem_bytes each: the CUDA occupancy API's
// answer, -1 on error.
int64_t capped_chase_occupancy(int64_t place, int64_t smem_bytes);

}  // namespace l2topo
