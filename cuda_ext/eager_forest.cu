// The eager tree-ensemble kernel: forest_predict's walk for small calls launched from eager Python, where the
// whole cost is the host's (torch_l2topo/ops/eager_kernels.py says why it exists). The same work as
// triton_kernels/forest.py, split the same way: a CTA of FOREST_LANES threads takes one (sample block, tree
// chunk) item, each thread one sample and every block_t-th tree of the chunk, walking each tree for `depth`
// dependent steps (leaves point to themselves: no thread leaves its loop early). Each thread adds its leaves to
// its own column of shared memory (no atomics), then the CTA adds the columns of each sample pairwise, so the
// result is deterministic. A chunked launch adds its chunks as the Triton kernel does: each CTA stores its
// sums, counts itself in on its block's counter (the threadfence-reduction pattern), and the last CTA of a block
// adds the chunks in chunk order, applies the link, stores, and zeroes the counter for the next launch.
#include "eager_forest.h"
#include "protocol.cuh"  // sm_id

namespace l2topo {
namespace {

// One step of a walk: the child of `record` that the sample's value leads to.
__device__ __forceinline__ int child(const int4 record, float value) {
  // record: feature | default_left << 31, threshold bits, left, right
  const bool go_left = value <= __int_as_float(record.y) || (value != value && record.x < 0);
  return go_left ? record.z : record.w;
}

__device__ __forceinline__ int leaf_row(const int4* __restrict__ nodes, int node) {
  return __ldg(reinterpret_cast<const int*>(nodes + node) + 1);
}

// The leaf-value row that a walk from `node` reaches after `depth` steps: one 16-byte record and one feature of the
// sample per step, each dependent on the step before. (Two walks at once per thread were no faster, and large
// calls stay slower than on the Triton kernel, which is why they are left to it: ops/forest_predict.eager_forest.)
__device__ __forceinline__ int walk(const int4* __restrict__ nodes, const float* __restrict__ x_row, int node,
                                    int depth, int n_features) {
  for (int step = 0; step < depth; ++step) {
    const int4 record = __ldg(nodes + node);
    const int feature = record.x & 0x7FFFFFFF;
    // the loaders checked every feature (ops/forest.py); the bound keeps a hand-built forest inside x too
    node = child(record, feature < n_features ? __ldg(x_row + feature) : 0.0f);
  }
  return leaf_row(nodes, node);
}

// Tree `tree`'s leaf row `row` into this thread's column of acc.
__device__ __forceinline__ void add_leaf(const ForestLaunch& p, float* acc, int tree, int64_t row) {
  if (p.leaf_width > 1) {  // a whole output row (class probabilities, multi-output regression)
    for (int o = 0; o < p.n_outputs; ++o) acc[o * FOREST_LANES] += __ldg(p.values + row * p.leaf_width + o);
  } else {                 // one value, to the tree's output group (boosting: one tree per class and round)
    acc[__ldg(p.groups + tree) * FOREST_LANES] += __ldg(p.values + row);
  }
}

__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// The block's sums (block_s x n_outputs in shared memory) through the link, into out: one thread per sample.
__device__ void store_linked(const ForestLaunch& p, float* sums, int64_t block) {
  for (int s = threadIdx.x; s < p.block_s; s += FOREST_LANES) {
    const int64_t sample = block * p.block_s + s;
    if (sample >= p.n_samples) break;
    float* row = sums + s * p.n_outputs;
    if (p.link == LINK_SIGMOID_PAIR) {  // one output in, scikit-learn's [1 - p, p] out
      const float prob = sigmoid(row[0]);
      p.out[sample * 2] = 1.0f - prob;
      p.out[sample * 2 + 1] = prob;
      continue;
    }
    if (p.link == LINK_SOFTMAX) {
      float top = row[0], total = 0.0f;
      for (int o = 1; o < p.n_outputs; ++o) top = fmaxf(top, row[o]);
      for (int o = 0; o < p.n_outputs; ++o) total += (row[o] = expf(row[o] - top));
      for (int o = 0; o < p.n_outputs; ++o) row[o] /= total;
    }
    for (int o = 0; o < p.n_outputs; ++o) {
      const float v = row[o];
      p.out[sample * p.n_outputs + o] = p.link == LINK_SIGMOID ? sigmoid(v) : p.link == LINK_EXP ? expf(v) : v;
    }
  }
}

__global__ void __launch_bounds__(FOREST_LANES) forest_kernel(const ForestLaunch p) {
  extern __shared__ float shared[];
  float* acc = shared;                                // [n_outputs][FOREST_LANES]: thread t owns column t
  float* sums = shared + p.n_outputs * FOREST_LANES;  // [block_s][n_outputs]
  __shared__ int last_of_block;
  const int lane = threadIdx.x;
  const int block_t = FOREST_LANES / p.block_s;
  const int64_t block = blockIdx.x / p.n_chunks;
  const int chunk = blockIdx.x % p.n_chunks;
  const int64_t sample = block * p.block_s + lane / block_t;
  for (int o = 0; o < p.n_outputs; ++o) acc[o * FOREST_LANES + lane] = 0.0f;
  if (sample < p.n_samples) {
    const int32_t* roots = p.roots;
    if (p.sm_part != nullptr) {  // per-partition copies: the roots of this SM's copy (copy 0 past n_sm)
      const int64_t me = sm_id();
      roots += static_cast<int64_t>(me < p.n_sm ? __ldg(p.sm_part + me) : 0) * p.n_trees;
    }
    const int4* nodes = reinterpret_cast<const int4*>(p.nodes);
    const float* x_row = p.x + sample * p.n_features;
    const int end = min((chunk + 1) * p.trees_per_chunk, p.n_trees);
    for (int tree = chunk * p.trees_per_chunk + lane % block_t; tree < end; tree += block_t) {  // in order
      add_leaf(p, acc + lane, tree, walk(nodes, x_row, __ldg(roots + tree), p.depth, p.n_features));
    }
  }
  __syncthreads();
  // each sample's block_t columns added pairwise, in log2(block_t) rounds (the order of a tree, as tl.sum adds)
  for (int stride = block_t / 2; stride > 0; stride /= 2) {
    if (lane % block_t < stride) {
      for (int o = 0; o < p.n_outputs; ++o) acc[o * FOREST_LANES + lane] += acc[o * FOREST_LANES + lane + stride];
    }
    __syncthreads();
  }
  for (int i = lane; i < p.block_s * p.n_outputs; i += FOREST_LANES) {
    const int s = i / p.n_outputs, o = i % p.n_outputs;
    sums[i] = ((chunk == 0 ? __ldg(p.base + o) : 0.0f) + acc[o * FOREST_LANES + s * block_t]) * p.scale;
  }
  __syncthreads();
  if (p.n_chunks > 1) {
    const int64_t chunk_size = p.n_samples * p.n_outputs;
    const int64_t first_sample = block * p.block_s;
    const int block_samples = static_cast<int>(min(static_cast<int64_t>(p.block_s), p.n_samples - first_sample));
    const int n_values = block_samples * p.n_outputs;
    float* tile = p.partial + first_sample * p.n_outputs;  // sample-major: the block's values are contiguous
    for (int i = lane; i < n_values; i += FOREST_LANES) tile[chunk * chunk_size + i] = sums[i];
    __threadfence();  // this thread's sums are visible before the count below
    __syncthreads();
    if (lane == 0) last_of_block = atomicAdd(p.counts + block, 1) == p.n_chunks - 1;
    __syncthreads();
    if (!last_of_block) return;
    __threadfence();  // every other chunk counted after its fence: its sums are visible from here on
    for (int i = lane; i < n_values; i += FOREST_LANES) {
      float total = 0.0f;
      for (int c = 0; c < p.n_chunks; ++c) total += __ldcg(tile + c * chunk_size + i);  // past L1: fresh lines
      sums[i] = total;
    }
    if (lane == 0) p.counts[block] = 0;  // every chunk of the block has counted
    __syncthreads();
  }
  store_linked(p, sums, block);
}

}  // namespace

cudaError_t launch_eager_forest(const ForestLaunch& launch, cudaStream_t stream) {
  const int block_s = launch.block_s;
  if (block_s < 1 || block_s > FOREST_LANES || (block_s & (block_s - 1)) != 0 || launch.n_outputs < 1 ||
      launch.n_outputs > FOREST_MAX_OUTPUTS || launch.n_chunks < 1 || launch.trees_per_chunk < 1 || launch.depth < 0 ||
      (launch.link == LINK_SIGMOID_PAIR && launch.n_outputs != 1)) {
    return cudaErrorInvalidValue;
  }
  if (launch.n_samples == 0) return cudaSuccess;
  const int64_t n_blocks = (launch.n_samples + block_s - 1) / block_s;
  const size_t shared_bytes = sizeof(float) * launch.n_outputs * (FOREST_LANES + block_s);
  forest_kernel<<<static_cast<unsigned>(n_blocks * launch.n_chunks), FOREST_LANES, shared_bytes, stream>>>(launch);
  return cudaGetLastError();
}

}  // namespace l2topo
