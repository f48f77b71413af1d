// Host launcher of the cluster co-residence probe (cluster_probe.cu). Plain pointers and a stream.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

// Launch `grid` CTAs in thread-block clusters of `cluster` CTAs (sm_90+), each CTA holding `smem_bytes` of
// dynamic shared memory (enough for one CTA per SM) for `hold_ns`. out[b] = %smid of CTA b; CTAs b and b'
// share a cluster iff b / cluster == b' / cluster.
cudaError_t launch_cluster_probe(int64_t* out, int64_t grid, int64_t cluster, int64_t smem_bytes,
                                 int64_t hold_ns, cudaStream_t stream);

}  // namespace l2topo
