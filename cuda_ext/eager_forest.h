// Host launcher of the eager tree-ensemble kernel (eager_forest.cu). Plain pointers and a stream: no torch
// headers, so the kernel compiles with nvcc alone and eager_bindings.cpp stays its only torch-facing file.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

// The links, numbered as torch_l2topo.ops.forest_predict.LINKS (and triton_kernels/forest.py) number them.
enum ForestLink : int { LINK_IDENTITY = 0, LINK_SIGMOID = 1, LINK_SIGMOID_PAIR = 2, LINK_SOFTMAX = 3, LINK_EXP = 4 };

constexpr int FOREST_LANES = 128;      // (sample, tree) walks per CTA: one per thread
constexpr int FOREST_MAX_OUTPUTS = 64;  // outputs a CTA sums in shared memory

// What one launch walks: the forest's tensors (ops/forest.py's layout), the rows x (n_samples, n_features)
// float32, and the work split of ops/forest_predict.work_split: CTA b takes sample block b / n_chunks (block_s
// samples) and tree chunk b % n_chunks (trees_per_chunk trees, block_t = FOREST_LANES / block_s at a time).
struct ForestLaunch {
  const int32_t* nodes;      // (n_slots, 4) records, 16-byte aligned
  const float* values;       // (n_leaves, leaf_width)
  const int32_t* roots;      // (n_trees,), or (2, n_trees) with sm_part
  const int32_t* groups;     // (n_trees,): the output a width-1 leaf adds to
  const float* base;         // (n_outputs,)
  const float* x;            // (n_samples, n_features)
  float* out;                // (n_samples, n_outputs), or (n_samples, 2) for LINK_SIGMOID_PAIR
  float* partial;            // (n_chunks, n_samples, n_outputs) when n_chunks > 1
  int32_t* counts;           // >= n_samples / block_s counters, zero at launch (and left at zero) when chunked
  const int32_t* sm_part;    // per-partition copies: each SM's copy (n_sm,), or nullptr
  int64_t n_samples, n_features;
  int n_sm, n_trees, trees_per_chunk, n_chunks, depth, n_outputs, leaf_width, link, block_s;
  float scale;               // 1 / the forest's divisor
};

// The forest's prediction (triton_kernels/forest.py's semantics: sums over every tree, times scale, through the
// link), one launch. A bad split (block_s not a power of two up to FOREST_LANES, too many outputs) is
// cudaErrorInvalidValue, before anything runs.
cudaError_t launch_eager_forest(const ForestLaunch& launch, cudaStream_t stream);

}  // namespace l2topo
