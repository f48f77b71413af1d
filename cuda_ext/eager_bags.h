// Host launcher of the eager embedding-bag kernel (eager_bags.cu). Plain pointers and a stream: no torch
// headers, so the kernel compiles with nvcc alone and eager_bindings.cpp stays its only torch-facing file.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

enum EagerRowType : int { ROWS_FP32 = 0, ROWS_BF16 = 1, ROWS_FP16 = 2 };

// One warp per bag (half a warp in calls of 4,096+ bags of rows of at most 64 elements): out[bag] = sum, mean or
// max (mode 0, 1, 2 as torch.embedding_bag) of the rows weight[input[offsets[bag]:end]], end = offsets[bag + 1],
// or n_indices for the last bag when there is no offsets[n_bags]. Rows are `dim` elements of `row_type`,
// contiguous; indices and offsets int64 (index64) or int32. A bad index or offset is a device-side assert.
cudaError_t launch_eager_bags(const void* input, const void* offsets, bool index64, const void* weight, void* out,
                              int row_type, int mode, int64_t n_indices, int64_t n_offsets, int64_t n_bags,
                              int64_t n_rows, int64_t dim, cudaStream_t stream);

}  // namespace l2topo
