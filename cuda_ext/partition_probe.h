// Host launcher of the partition probe (partition_probe.cu).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "l2_probes.h"

namespace l2topo {

// plan: (n_sm, 3) int64 (lo, hi, row); cycles: (2, n_blocks) int32; n_timed: 1, 2, 4, 8 or 16 (the counts the
// kernel is compiled for; another is cudaErrorInvalidValue).
cudaError_t launch_partition_probe(const ProbeLaunch& launch, int64_t base, const int64_t* plan, int32_t* cycles,
                                   int64_t n_blocks, int64_t block_bytes, int64_t zero, int64_t n_timed,
                                   cudaStream_t stream);

}  // namespace l2topo
