// Per-CTA records from any CUDA kernel: which SM ran each block, when, and how much work it did. It mirrors
// triton_kernels/recorder.py function by function, under the same names (that file documents the record;
// tests/test_kernel_sources.py checks that the two lists agree):
//
//   CtaStamp record_start<RECORD>()                    {%smid, %globaltimer start}; {0, 0} when RECORD is false
//   void record_cta<RECORD>(rec, tag, sm, t0, n_items, n_near)
//                                                      append the block's record (one atomic); -1: near unknown
//   int64_t* recorder_at(address)                      the buffer from its address held as an int64
//
// RECORD is a template argument: with RECORD false both functions compile to nothing. Where the Triton
// version returns a tuple, record_start returns the small struct CtaStamp. Usage:
//
//   template <bool RECORD>
//   __global__ void my_kernel(const float* x, int64_t* rec, int64_t tag) {
//     const l2topo::CtaStamp cta = l2topo::record_start<RECORD>();
//     ...the block's work...
//     l2topo::record_cta<RECORD>(rec, tag, cta.sm, cta.t0, 1, -1);
//   }
//
// Block-cooperative: every thread of the block calls record_cta, from code all threads reach (it holds a
// __syncthreads, so that the end time follows the last thread's work); thread (0, 0, 0) writes the record.
#pragma once
#include <cstdint>
#include "layout.h"
#include "protocol.cuh"

namespace l2topo {

struct CtaStamp {
  int64_t sm;  // %smid
  int64_t t0;  // %globaltimer at record_start, ns
};

template <bool RECORD>
__device__ __forceinline__ CtaStamp record_start() {
  if constexpr (RECORD) {
    return {sm_id(), global_ns()};
  } else {
    return {0, 0};
  }
}

template <bool RECORD>
__device__ inline void record_cta(int64_t* rec, int64_t tag, int64_t sm, int64_t t0, int64_t n_items,
                                  int64_t n_near) {
  if constexpr (RECORD) {
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
      const int64_t t1 = global_ns();
      // relaxed: the slot orders nothing else; the host reads the buffer after the kernel has ended
      auto* cursor = reinterpret_cast<unsigned long long*>(rec + REC_CURSOR);
      const int64_t slot = static_cast<int64_t>(atomicAdd(cursor, 1ull));
      if (slot < rec[REC_CAPACITY]) {
        int64_t* r = rec + REC_HEADER + slot * REC_WORDS;
        r[REC_TAG] = tag;
        r[REC_SM] = sm;
        r[REC_PROGRAM] = blockIdx.x + static_cast<int64_t>(gridDim.x) *
                                          (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
        r[REC_START_NS] = t0;
        r[REC_END_NS] = t1;
        r[REC_ITEMS] = n_items;
        r[REC_NEAR] = n_near;
      }
    }
  }
}

__device__ __forceinline__ int64_t* recorder_at(int64_t address) { return reinterpret_cast<int64_t*>(address); }

}  // namespace l2topo
