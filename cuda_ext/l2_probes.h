// Host launchers of the probe kernels (l2_probes.cu). Plain pointers and a stream: no torch headers, so
// the kernels compile with nvcc alone and bindings.cpp stays the only torch-facing file.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace l2topo {

struct ProbeLaunch {
  int64_t* ctrl;        // control block: layout.h
  int64_t n_sm;         // SMs that must each be claimed once; also the SM slot capacity
  int64_t grid;         // CTAs launched (> n_sm so that every SM gets one)
  int64_t timeout_ns;   // watchdog: longest wait without progress
  int64_t wave;         // SMs measuring at once: 1 serialized, n_sm all at once (protocol.cuh)
};

cudaError_t launch_chain_probe(const ProbeLaunch& launch, const int64_t* starts, int64_t* out,
                               int64_t n_loads, int64_t n_warm_first, int64_t n_first, int64_t n_warm,
                               cudaStream_t stream);

cudaError_t launch_line_probe(const ProbeLaunch& launch, const int64_t* lines, int64_t* cycles,
                              int64_t* per_sm, int64_t n_lines, int64_t n_warm, int64_t n_timed,
                              cudaStream_t stream);

}  // namespace l2topo
