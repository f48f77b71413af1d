// Host launcher of the whereami kernel (whereami.cu).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

// grid CTAs; out is (grid, k + 1) int64: %smid then the k signature cycle counts.
cudaError_t launch_whereami(const int64_t* lines, const int32_t* idx, int64_t k, int64_t n_warm, int64_t n_timed,
                            int64_t* out, int64_t grid, cudaStream_t stream);

}  // namespace l2topo
