// The eager embedding-bag kernel: torch.nn.functional.embedding_bag's sum, mean and max over 1-D input with
// offsets (no per_sample_weights, no padding_idx), for small calls launched from eager Python, where the whole
// cost is the host's (torch_l2topo/ops/eager_kernels.py says why it exists). LANES lanes per bag (a warp, or half
// of one for many bags of rows of at most NARROW_DIM elements), four warps per CTA; each lane keeps VEC features
// of a LANES * VEC feature chunk in float registers and adds the bag's rows in order, as torch's own CUDA kernel
// does (so sums round alike), with the loads of several rows in flight at once.
#include <cassert>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "eager_bags.h"

namespace l2topo {
namespace {

constexpr int WARPS = 4;        // bags per CTA
constexpr int VEC = 4;          // features per lane per chunk
constexpr int SHORT_ROWS = 4;   // rows whose loads are in flight at once (VEC * rows loads per lane) ...
constexpr int LONG_ROWS = 16;   // ... and in bags of LONG_BAG rows or more on average
constexpr int LONG_BAG = 32;
// Calls of at least HALF_WARP_BAGS bags of rows of at most NARROW_DIM elements take half a warp per bag: a whole warp
// left half its lanes idle on such rows, and with many bags the GPU runs several waves of them. With few bags half
// warps mostly cost (a bag's row is read in four 64-byte pieces instead of two 128-byte ones).
// 4096: from there on half warps mostly won in the grid of shapes measured on two H200s (docs/ops.md).
constexpr int NARROW_DIM = 16 * VEC;
constexpr int64_t HALF_WARP_BAGS = 4096;

// A bad index or offset: triton_kernels/embedding_bag.py's CHECK_MESSAGE, then a device-side assert
// (cudaErrorAssert), as the Triton kernel and torch's own index kernels stop. Called once, after the bag's walk
// (bad entries read row 0 meanwhile): a call inside the loops would make the compiler spill around it.
__device__ __noinline__ void report_bad_entry() {
  printf("embedding_bag: an index is outside [0, num_embeddings), or offsets are not valid (offsets[0] must be 0, "
         "non-decreasing, and not past the input's length)\n");
  __assert_fail("valid embedding_bag indices and offsets", __FILE__, __LINE__, __func__);
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// sum and mean add the row's value; max keeps the first row's value, then any strictly greater one, as torch's
// CUDA kernel does
template <int MODE>
__device__ __forceinline__ float combine(float acc, float v, bool first) {
  return MODE == 2 ? (first || v > acc ? v : acc) : acc + v;
}

// the row index, or row 0 with `bad` set when it is outside the table
__device__ __forceinline__ int64_t checked(int64_t index, int64_t n_rows, bool& bad) {
  const bool ok = index >= 0 && index < n_rows;
  bad |= !ok;
  return ok ? index : 0;
}

// VEC features of a row (f0, f0 + LANES, ...), 0 for those at or past `dim`. Every load is made (from feature f0
// where the feature is past the row's end), so that the compiler can keep them all in flight: a load under a
// branch, with its conversion to float inside the branch, waited for its data before the next one (slower than
// torch's op on a long bf16 bag).
template <int LANES, typename T>
__device__ __forceinline__ void load_row(const T* __restrict__ row, int64_t f0, int64_t dim, float (&v)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int64_t f = f0 + LANES * j;
    const float x = to_float(row[f < dim ? f : f0]);
    v[j] = f < dim ? x : 0.0f;
  }
}

// Adds rows r .. r + N - 1 of the bag to acc: their indices, then all their loads in flight, then the adds in
// row order. Two memory latencies per call, whatever N.
template <int N, int MODE, int LANES, typename T, typename I>
__device__ __forceinline__ void add_rows(const I* __restrict__ input, const T* __restrict__ weight, int64_t r,
                                         int64_t start, int64_t n_rows, int64_t f0, int64_t dim, bool& bad,
                                         float (&acc)[VEC]) {
  int64_t index[N];
#pragma unroll
  for (int u = 0; u < N; ++u) index[u] = checked(input[r + u], n_rows, bad);
  float v[N][VEC];
#pragma unroll
  for (int u = 0; u < N; ++u) load_row<LANES>(weight + index[u] * dim, f0, dim, v[u]);
#pragma unroll
  for (int u = 0; u < N; ++u) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = combine<MODE>(acc[j], v[u][j], r + u == start);
  }
}

// ROWS: rows per add_rows call in the bag's walk (then a call of 4 if that many are left, then single rows). The
// launch picks SHORT_ROWS or LONG_ROWS by the mean bag: long rows hold more registers (fewer warps per SM, which
// many short bags need), and short ones leave a long bag's walk at two latencies per four rows.
template <typename T, typename I, int MODE, int ROWS, int LANES>
__global__ void __launch_bounds__(32 * WARPS)
    eager_bags_kernel(const I* __restrict__ input, const I* __restrict__ offsets, const T* __restrict__ weight,
                      T* __restrict__ out, int64_t n_indices, int64_t n_offsets, int64_t n_bags, int64_t n_rows,
                      int64_t dim) {
  constexpr int BAGS_PER_WARP = 32 / LANES;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * WARPS + threadIdx.y;
  const int64_t bag = warp * BAGS_PER_WARP + threadIdx.x / LANES;
  const int lane = threadIdx.x % LANES;
  if (bag >= n_bags) return;
  int64_t start = offsets[bag];
  int64_t end = bag + 1 < n_offsets ? static_cast<int64_t>(offsets[bag + 1]) : n_indices;
  bool bad = !(start >= 0 && start <= end && end <= n_indices && (bag != 0 || start == 0));
  if (bad) start = end = 0;  // walk nothing
  T* out_row = out + bag * dim;
  for (int64_t f0 = lane; f0 < dim; f0 += LANES * VEC) {
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
    int64_t r = start;
    for (; r + ROWS <= end; r += ROWS) add_rows<ROWS, MODE, LANES>(input, weight, r, start, n_rows, f0, dim, bad, acc);
    if (ROWS > SHORT_ROWS && r + SHORT_ROWS <= end) {
      add_rows<SHORT_ROWS, MODE, LANES>(input, weight, r, start, n_rows, f0, dim, bad, acc);
      r += SHORT_ROWS;
    }
    for (; r < end; ++r) add_rows<1, MODE, LANES>(input, weight, r, start, n_rows, f0, dim, bad, acc);
    const float count = static_cast<float>(end - start);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t f = f0 + LANES * j;
      if (f < dim) out_row[f] = from_float<T>(MODE == 1 && end > start ? acc[j] / count : acc[j]);
    }
  }
  if (bad) report_bad_entry();
}

// The launch dispatches, in turn: row type (launch_eager_bags), index type (launch_index), walk (launch_walk: short
// or long bags), lanes per bag (launch_lanes: many bags of narrow rows, or not), mode (launch_mode), each a
// template argument of the kernel.
template <typename T, typename I, int ROWS, int LANES>
void launch_mode(const I* in, const I* off, const T* w, T* o, int mode, int64_t n_indices, int64_t n_offsets,
                 int64_t n_bags, int64_t n_rows, int64_t dim, cudaStream_t stream) {
  const dim3 block(32, WARPS);
  constexpr int64_t bags_per_cta = WARPS * (32 / LANES);
  const unsigned grid = static_cast<unsigned>((n_bags + bags_per_cta - 1) / bags_per_cta);
  if (mode == 0) {
    eager_bags_kernel<T, I, 0, ROWS, LANES><<<grid, block, 0, stream>>>(in, off, w, o, n_indices, n_offsets, n_bags,
                                                                        n_rows, dim);
  } else if (mode == 1) {
    eager_bags_kernel<T, I, 1, ROWS, LANES><<<grid, block, 0, stream>>>(in, off, w, o, n_indices, n_offsets, n_bags,
                                                                        n_rows, dim);
  } else {
    eager_bags_kernel<T, I, 2, ROWS, LANES><<<grid, block, 0, stream>>>(in, off, w, o, n_indices, n_offsets, n_bags,
                                                                        n_rows, dim);
  }
}

template <typename T, typename I, int ROWS>
void launch_lanes(const I* in, const I* off, const T* w, T* o, int mode, int64_t n_indices, int64_t n_offsets,
                  int64_t n_bags, int64_t n_rows, int64_t dim, cudaStream_t stream) {
  if (dim <= NARROW_DIM && n_bags >= HALF_WARP_BAGS) {
    launch_mode<T, I, ROWS, 16>(in, off, w, o, mode, n_indices, n_offsets, n_bags, n_rows, dim, stream);
  } else {
    launch_mode<T, I, ROWS, 32>(in, off, w, o, mode, n_indices, n_offsets, n_bags, n_rows, dim, stream);
  }
}

template <typename T, typename I>
cudaError_t launch_walk(const void* input, const void* offsets, const void* weight, void* out, int mode,
                        int64_t n_indices, int64_t n_offsets, int64_t n_bags, int64_t n_rows, int64_t dim,
                        cudaStream_t stream) {
  const auto* in = static_cast<const I*>(input);
  const auto* off = static_cast<const I*>(offsets);
  const auto* w = static_cast<const T*>(weight);
  auto* o = static_cast<T*>(out);
  if (n_indices >= LONG_BAG * n_bags) {
    launch_lanes<T, I, LONG_ROWS>(in, off, w, o, mode, n_indices, n_offsets, n_bags, n_rows, dim, stream);
  } else {
    launch_lanes<T, I, SHORT_ROWS>(in, off, w, o, mode, n_indices, n_offsets, n_bags, n_rows, dim, stream);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_index(const void* input, const void* offsets, bool index64, const void* weight, void* out,
                         int mode, int64_t n_indices, int64_t n_offsets, int64_t n_bags, int64_t n_rows, int64_t dim,
                         cudaStream_t stream) {
  return index64 ? launch_walk<T, int64_t>(input, offsets, weight, out, mode, n_indices, n_offsets, n_bags, n_rows,
                                           dim, stream)
                 : launch_walk<T, int32_t>(input, offsets, weight, out, mode, n_indices, n_offsets, n_bags, n_rows,
                                           dim, stream);
}

}  // namespace

cudaError_t launch_eager_bags(const void* input, const void* offsets, bool index64, const void* weight, void* out,
                              int row_type, int mode, int64_t n_indices, int64_t n_offsets, int64_t n_bags,
                              int64_t n_rows, int64_t dim, cudaStream_t stream) {
  if (n_bags <= 0 || dim <= 0) return cudaSuccess;
  if (mode < 0 || mode > 2) return cudaErrorInvalidValue;
  switch (row_type) {
    case ROWS_FP32:
      return launch_index<float>(input, offsets, index64, weight, out, mode, n_indices, n_offsets, n_bags, n_rows,
                                dim, stream);
    case ROWS_BF16:
      return launch_index<__nv_bfloat16>(input, offsets, index64, weight, out, mode, n_indices, n_offsets, n_bags,
                                        n_rows, dim, stream);
    case ROWS_FP16:
      return launch_index<__half>(input, offsets, index64, weight, out, mode, n_indices, n_offsets, n_bags, n_rows,
                                 dim, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace l2topo
