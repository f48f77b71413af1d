// whereami kernel: every CTA records (%smid, l2_signature) so the host can check its SM classifier against
// ground truth. One warp per CTA, lane 0 works.
#include "l2_signature.cuh"
#include "whereami.h"

namespace l2topo {

__global__ void __launch_bounds__(32) whereami_kernel(const int64_t* lines, const int32_t* idx, int k, int n_warm,
                                                      int n_timed, int64_t* out) {
  if (threadIdx.x != 0) return;
  int64_t* row = out + static_cast<int64_t>(blockIdx.x) * (k + 1);
  row[0] = sm_id();
  l2_signature(lines, idx, k, n_warm, n_timed, static_cast<int>(blockIdx.x % k), row + 1);
}

cudaError_t launch_whereami(const int64_t* lines, const int32_t* idx, int64_t k, int64_t n_warm, int64_t n_timed,
                            int64_t* out, int64_t grid, cudaStream_t stream) {
  whereami_kernel<<<static_cast<unsigned>(grid), 32, 0, stream>>>(lines, idx, static_cast<int>(k),
                                                                  static_cast<int>(n_warm),
                                                                  static_cast<int>(n_timed), out);
  return cudaGetLastError();
}

}  // namespace l2topo
