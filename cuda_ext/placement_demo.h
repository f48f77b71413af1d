// Host launcher of the placement checksum kernel (placement_demo.cu).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

// Threads per CTA of the demo: four warps, so the block-cooperative helpers are exercised beyond one warp.
constexpr int PLACEMENT_DEMO_THREADS = 128;

// grid CTAs over the plan; item i adds 1 + (i * 40503) % 65536 into out[i % n_out] and 1 into count[i].
cudaError_t launch_placement_demo(int64_t* out, int32_t* count, int64_t n_out, const int32_t* plan, int64_t* state,
                                  int64_t grid, cudaStream_t stream);

}  // namespace l2topo
