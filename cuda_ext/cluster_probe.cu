// Cluster co-residence probe: the CTAs of one thread-block cluster always run in one GPC (sm_90+), so the
// SM ids that ever share a cluster belong to one GPC. Each CTA records its %smid and holds its SM briefly,
// so the clusters of one launch spread over all GPCs. The host unions the SM ids (torch_l2topo/measure/gpc_probe.py).
#include "cluster_probe.h"
#include "protocol.cuh"

namespace l2topo {

// Clusters hold their SMs for 1 to 4 times hold_ns (by cluster index) and the grid is larger than one wave,
// so later clusters land wherever earlier ones left first: the placement mixes instead of repeating the
// scheduler's fixed packing order.
__global__ void cluster_probe_kernel(int64_t* out, int64_t cluster, int64_t hold_ns) {
  extern __shared__ char occupy[];  // sized by the launch so that only one CTA fits per SM
  if (threadIdx.x != 0) return;
  occupy[0] = 0;
  out[blockIdx.x] = sm_id();
  const int64_t hold = hold_ns * (1 + (blockIdx.x / cluster) % 4);
  const int64_t start = global_ns();
  while (global_ns() - start < hold) {
  }
}

cudaError_t launch_cluster_probe(int64_t* out, int64_t grid, int64_t cluster, int64_t smem_bytes,
                                 int64_t hold_ns, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(cluster_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_bytes));
  if (err != cudaSuccess) return err;
  if (cluster > 8) {  // 8 is the portable maximum; larger clusters must be allowed explicitly
    err = cudaFuncSetAttribute(cluster_probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(32);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, cluster_probe_kernel, out, cluster, hold_ns);
}

}  // namespace l2topo
