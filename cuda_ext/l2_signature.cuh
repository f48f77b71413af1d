// Self-localization signature for CUDA kernels: include this header in your kernel and call l2_signature
// from one thread. For each of k chosen lines of a buffer this process calibrated (each line holds its own
// address), a few warm loads, then n_timed dependent loads timed with clock64. The cycle counts, matched
// against the calibration by torch_l2topo/identity/selfloc.py, say which SM (TPC, GPC, partition) the kernel is on.
// Mirrors triton_kernels/whereami.py.
#pragma once
#include <cstdint>
#include "protocol.cuh"

namespace l2topo {

// Lines are visited from position `start` (mod k) on: pass something that differs between CTAs so that CTAs
// measuring at once do not all load the same line together (merged requests lower the latency each sees).
__device__ inline void l2_signature(const int64_t* lines, const int32_t* idx, int k, int n_warm, int n_timed,
                                    int start, int64_t* out) {
  for (int step = 0; step < k; ++step) {
    const int i = (start + step) % k;
    int64_t p = reinterpret_cast<int64_t>(lines + static_cast<int64_t>(idx[i]) * LINE_WORDS);
    for (int w = 0; w < n_warm; ++w) p = chase(p);
    const int64_t t0 = clock_after(p);
    for (int r = 0; r < n_timed; ++r) p = chase(p);
    out[i] = clock_after(p) - t0;
  }
}

}  // namespace l2topo
