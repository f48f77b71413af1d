// The device side of SM-aware placement in CUDA: take this CTA's items under one of three modes.
// Public API for any CUDA kernel of torch_l2topo or of its users; it mirrors triton_kernels/placement.py
// function by function, under the same names (that file documents the modes and the protocol;
// tests/test_kernel_sources.py checks that the two lists agree). The mode is a template parameter PLACE (a
// layout.h PLACE_* value, chosen by the launcher), so a kernel is compiled once per mode and carries only that
// mode's code:
//
//   PlanCta plan_start<PLACE>(plan, state)                {%smid, %globaltimer start}; sm -1: a bad plan
//   PlanItem plan_next<PLACE>(plan, state, sm, phase)     {next item or -1, phase to pass back}; start with 0
//   void plan_finish<PLACE>(plan, state, sm, t0, n_done)  shares mode: statistics; the last CTA out resets
//
// PLACE_DIRECT (one CTA per item): CTA b takes item b, with no plan read, no atomic and no barrier.
// PLACE_QUEUES (a plain-sized grid): each CTA claims PLAN_CHUNK items at a time from its SM's home queue, then
// from the other queues in its order; the launcher zeroes the queue cursors before every launch.
// PLACE_SHARES (a persistent grid): the items the plan hands out by block index (PLAN_N_FIRST), the SM's share,
// the dynamic tail, then stealing; the last CTA resets (not needed, and not done, when nothing is claimed).
// With the PLACE_RECORD bit (profiling on) plan_finish also appends the CTA's record (recorder.cuh) to the
// recorder whose address and tag the plan's header holds; without it none of that is compiled in.
//
// Where the Triton version returns tuples, these return the small structs PlanCta and PlanItem. Usage:
//
//   template <int PLACE> __global__ void my_kernel(..., const int32_t* plan, int64_t* state) {
//     const l2topo::PlanCta cta = l2topo::plan_start<PLACE>(plan, state);
//     l2topo::PlanItem next = l2topo::plan_next<PLACE>(plan, state, cta.sm, 0);
//     int64_t n_done = 0;
//     while (next.item >= 0) {
//       ...the CTA works on next.item...
//       ++n_done;
//       next = l2topo::plan_next<PLACE>(plan, state, cta.sm, next.phase);
//     }
//     l2topo::plan_finish<PLACE>(plan, state, cta.sm, cta.t0, n_done);
//   }
//
// Block-cooperative: every thread of the CTA calls every function, in the same order (plan_next holds
// __syncthreads outside direct mode, so never call it from divergent code). Thread 0 does the atomics and
// broadcasts the item through __shared__ memory with __syncthreads; the scans run on warp 0 (its 32 lanes read
// the cursors at once and reduce with shuffles or a ballot), so the CTA's thread count must be a multiple of
// 32. Every thread gets the same item and phase, so the loop above stays uniform.
#pragma once
#include <cstdint>
#include <cuda/atomic>
#include "layout.h"
#include "protocol.cuh"
#include "recorder.cuh"

namespace l2topo {

constexpr int MAX_SLOTS = PLAN_MAX_SLOTS;  // the width of the steal scan (layout.h)

constexpr int PHASE_FIRST = 0;  // items below PLAN_N_FIRST by block index; bits PHASE_COUNT_SHIFT+: how many taken
constexpr int PHASE_SHARE = 1;  // this SM's static share
constexpr int PHASE_TAIL = 2;   // the dynamic tail
constexpr int PHASE_STEAL = 3;  // the share of the SM with the most unclaimed items
constexpr int PHASE_DONE = 4;
constexpr int PHASE_KIND_MASK = 7;
constexpr int PHASE_COUNT_SHIFT = 3;

struct PlanCta {
  int64_t sm;  // %smid
  int64_t t0;  // %globaltimer at plan_start, ns
};

struct PlanItem {
  int64_t item;   // item id, -1 when none is left
  int64_t phase;  // pass back to the next plan_next call (opaque; queues mode packs its claim here)
};

// Queues mode's packing of the claim into the phase (as in triton_kernels/placement.py): the next index in the
// claimed range (bits 0-31), the items left in it (bits 32-55), its queue + 1 (bits 56-62); negative: done.
constexpr int Q_LEFT_SHIFT = 32;
constexpr int Q_QUEUE_SHIFT = 56;
constexpr int64_t Q_MASK_INDEX = (int64_t{1} << 32) - 1;
constexpr int64_t Q_MASK_LEFT = (int64_t{1} << 24) - 1;
constexpr int MAX_QUEUES = PLAN_MAX_QUEUES;  // the width of the queue scan (layout.h)

namespace detail {
__device__ __forceinline__ unsigned long long* as_u64(int64_t* p) { return reinterpret_cast<unsigned long long*>(p); }

__device__ __forceinline__ int thread_rank() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

__device__ __forceinline__ int64_t block_rank() {
  return blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
}

__device__ __forceinline__ int64_t grid_size() {
  return static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z;
}

// Whether the plan has items to claim (in shares or the tail) beyond those taken by block index.
__device__ __forceinline__ bool has_claims(const int32_t* plan) {
  return plan[PLAN_N_STATIC] + plan[PLAN_N_TAIL] > 0;
}

// A plan without the magic word is not read any further: its sizes could point anywhere. A plan built for
// another mode is refused as well.
__device__ __forceinline__ bool plan_ok(const int32_t* plan, int mode) {
  return plan[PLAN_MAGIC] == PLAN_MAGIC_VALUE && plan[PLAN_N_SLOTS] >= 0 && plan[PLAN_N_SLOTS] <= MAX_SLOTS &&
         plan[PLAN_MODE] == mode;
}

// Cursors move under other CTAs' atomics: read them from L2, never from a stale L1 line.
__device__ __forceinline__ int64_t cursor_now(int64_t* state, int slot) {
  return cuda::atomic_ref<int64_t, cuda::thread_scope_device>(state[STATE_CURSORS + slot])
      .load(cuda::memory_order_relaxed);
}

// Item at the next index of `slot`'s share, or -1 once that share is exhausted. Relaxed: the claimed index
// orders nothing else (the plan is read-only during the launch).
__device__ inline int64_t claim_share(const int32_t* plan, int64_t* state, int slot, int n_slots) {
  const int64_t lo = plan[PLAN_HEADER + slot];
  const int64_t hi = plan[PLAN_HEADER + slot + 1];
  const int64_t i = static_cast<int64_t>(atomicAdd(as_u64(state + STATE_CURSORS + slot), 1ull));
  // exactly one claim per share counts it drained: the one that took its last item (an empty share: the first)
  if (i == (hi - lo > 0 ? hi - lo - 1 : 0)) atomicAdd(as_u64(state + STATE_TAIL), 1ull << STATE_DRAINED_SHIFT);
  return i < hi - lo ? plan[PLAN_HEADER + n_slots + 1 + lo + i] : -1;
}

// Phases PHASE_SHARE and PHASE_TAIL, on thread 0: this SM's share, then the tail. Returns phase PHASE_STEAL
// once both are empty.
__device__ inline PlanItem share_or_tail(const int32_t* plan, int64_t* state, int64_t sm, int64_t phase) {
  const int n_slots = plan[PLAN_N_SLOTS];
  if (phase == PHASE_SHARE) {
    if (sm < n_slots) {  // an SM the plan does not know has no share
      const int64_t item = claim_share(plan, state, static_cast<int>(sm), n_slots);
      if (item >= 0) return {item, PHASE_SHARE};
    }
    phase = PHASE_TAIL;
  }
  if (phase == PHASE_TAIL) {
    // the tail index (low bits) and, with it, the count of drained shares (triton_kernels/placement.py)
    const unsigned long long claimed = atomicAdd(as_u64(state + STATE_TAIL), 1ull);
    const int64_t t = static_cast<int64_t>(claimed & ((1ull << STATE_DRAINED_SHIFT) - 1));
    if (t < plan[PLAN_N_TAIL]) return {plan[PLAN_HEADER + n_slots + 1 + plan[PLAN_N_STATIC] + t], PHASE_TAIL};
    if (static_cast<int64_t>(claimed >> STATE_DRAINED_SHIFT) >= n_slots) return {-1, PHASE_DONE};  // no victim
    phase = PHASE_STEAL;
  }
  return {-1, phase};
}

// Phase 2, on all of warp 0: find the slot with the most unclaimed items (ties: the lowest slot, as
// tl.argmax), claim one of its items on lane 0, retry while any slot has items left. The loop ends: a failed
// claim means that slot's cursor passed its share for good, so there are at most n_slots failures.
__device__ inline PlanItem steal(const int32_t* plan, int64_t* state, int lane) {
  constexpr unsigned FULL = 0xffffffffu;
  const int n_slots = plan[PLAN_N_SLOTS];
  // Every share drained: no victim, no scan of every cursor (triton_kernels/placement.py says what it cost).
  // Read on lane 0 and shuffled, so that every lane takes the same way.
  int64_t drained = 0;
  if (lane == 0) {
    drained = cuda::atomic_ref<int64_t, cuda::thread_scope_device>(state[STATE_TAIL])
                  .load(cuda::memory_order_relaxed) >> STATE_DRAINED_SHIFT;
  }
  if (__shfl_sync(FULL, drained, 0) >= n_slots) return {-1, PHASE_DONE};
  while (true) {
    // All loads first, then the arithmetic: the lane's (up to) 8 cursor reads are in flight together.
    int64_t cursor[MAX_SLOTS / 32];
#pragma unroll
    for (int k = 0; k < MAX_SLOTS / 32; ++k) {
      const int s = lane + 32 * k;
      cursor[k] = s < n_slots ? cursor_now(state, s) : 0;
    }
    int64_t best_left = 0;
    int best_slot = MAX_SLOTS;
#pragma unroll
    for (int k = 0; k < MAX_SLOTS / 32; ++k) {
      const int s = lane + 32 * k;
      const int64_t left = s < n_slots ? plan[PLAN_HEADER + s + 1] - plan[PLAN_HEADER + s] - cursor[k] : 0;
      if (left > best_left) {
        best_left = left;
        best_slot = s;
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const int64_t other_left = __shfl_xor_sync(FULL, best_left, d);
      const int other_slot = __shfl_xor_sync(FULL, best_slot, d);
      if (other_left > best_left || (other_left == best_left && other_slot < best_slot)) {
        best_left = other_left;
        best_slot = other_slot;
      }
    }
    if (best_left <= 0) return {-1, PHASE_DONE};  // every lane saw the same maximum
    int64_t item = -1;
    if (lane == 0) item = claim_share(plan, state, best_slot, n_slots);
    item = __shfl_sync(FULL, item, 0);
    if (item >= 0) return {item, PHASE_STEAL};
  }
}

// The j-th queue a CTA of home queue `home` tries: its own group's queues from home on, then the other groups'.
__device__ __forceinline__ int queue_order(int home, int j, int n_queues, int group_queues) {
  const int width = group_queues > 0 ? group_queues : 1;
  const int groups = n_queues / width > 0 ? n_queues / width : 1;
  return ((home / width + j / width) % groups) * width + (home % width + j) % width;
}

// On warp 0: the first queue in this CTA's order with items left, or -1 when every queue is empty.
__device__ inline int open_queue(const int32_t* plan, int64_t* state, int home, int lane) {
  const int n_slots = plan[PLAN_N_SLOTS];
  const int n_queues = plan[PLAN_N_QUEUES];
  const int group_queues = plan[PLAN_GROUP_QUEUES];
  const int32_t* offsets = plan + PLAN_HEADER + n_slots;
#pragma unroll
  for (int k = 0; k < MAX_QUEUES / 32; ++k) {
    const int j = lane + 32 * k;
    bool open = false;
    if (j < n_queues) {
      const int q = queue_order(home, j, n_queues, group_queues);
      open = cursor_now(state, q) < offsets[q + 1] - offsets[q];
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, open);
    if (ballot) return queue_order(home, 32 * k + __ffs(ballot) - 1, n_queues, group_queues);
  }
  return -1;
}

// Queues mode on warp 0 (thread 0 claims): the next item of the claimed range, else a new claim.
__device__ inline PlanItem next_queued(const int32_t* plan, int64_t* state, int64_t sm, int64_t phase, int lane) {
  const int n_slots = plan[PLAN_N_SLOTS];
  const int n_queues = plan[PLAN_N_QUEUES];
  const int32_t* offsets = plan + PLAN_HEADER + n_slots;
  const int32_t* items = offsets + n_queues + 1;
  const int64_t left = (phase >> Q_LEFT_SHIFT) & Q_MASK_LEFT;
  int64_t queue = (phase >> Q_QUEUE_SHIFT) - 1;  // -1: nothing claimed yet
  if (left > 0) {  // the claimed range still has items: one load of the item id, no atomic
    const int64_t index = phase & Q_MASK_INDEX;
    return {items[offsets[queue] + index],
            ((queue + 1) << Q_QUEUE_SHIFT) | ((left - 1) << Q_LEFT_SHIFT) | (index + 1)};
  }
  const int home = sm < n_slots ? plan[PLAN_HEADER + sm] : 0;  // an SM the plan does not know starts at 0
  if (queue < 0) queue = home;  // the first claim: the home queue has items for almost every CTA
  const int64_t chunk = plan[PLAN_CHUNK];
  while (true) {
    if (queue < 0) queue = open_queue(plan, state, home, lane);
    if (queue < 0) return {-1, -1};  // every queue is empty: done
    int64_t got = 0;
    if (lane == 0) got = static_cast<int64_t>(atomicAdd(as_u64(state + STATE_CURSORS + queue),
                                                        static_cast<unsigned long long>(chunk)));
    got = __shfl_sync(0xffffffffu, got, 0);
    const int64_t size = offsets[queue + 1] - offsets[queue];
    if (got < size) {
      const int64_t n_got = chunk < size - got ? chunk : size - got;
      return {items[offsets[queue] + got], ((queue + 1) << Q_QUEUE_SHIFT) | ((n_got - 1) << Q_LEFT_SHIFT) | (got + 1)};
    }
    queue = -1;
  }
}
}  // namespace detail

template <int PLACE>
__device__ inline PlanCta plan_start(const int32_t* plan, int64_t* state) {
  if constexpr ((PLACE & PLACE_MODE_MASK) == PLACE_DIRECT) {
    if constexpr ((PLACE & PLACE_RECORD) != 0) return {sm_id(), global_ns()};  // the record needs them
    return {0, 0};
  } else {
    // Every thread reads the plan itself (the same words), so every thread sees the same verdict; only thread
    // 0's t0 is used.
    const bool ok = detail::plan_ok(plan, PLACE & PLACE_MODE_MASK);
    if (detail::thread_rank() == 0 && !ok) atomicExch(detail::as_u64(state + STATE_ERROR), 1ull);
    return {ok ? sm_id() : -1, global_ns()};  // sm -1 tells plan_next and plan_finish: a bad plan
  }
}

template <int PLACE>
__device__ inline PlanItem plan_next(const int32_t* plan, int64_t* state, int64_t sm, int64_t phase) {
  if constexpr ((PLACE & PLACE_MODE_MASK) == PLACE_DIRECT) {
    // CTA b takes item b on the first call: the grid is exactly one CTA per item. No barrier is needed.
    return {phase == 0 ? detail::block_rank() : -1, PHASE_DONE};
  } else {
    if (sm < 0) return {-1, PHASE_DONE};  // every thread got sm -1 from plan_start: uniform
    if constexpr ((PLACE & PLACE_MODE_MASK) == PLACE_SHARES) {
      if ((phase & PHASE_KIND_MASK) == PHASE_FIRST) {
        // Items below PLAN_N_FIRST: CTA b takes b, b + grid, ... with no atomic and no barrier (every thread
        // reads the same plan words, so every thread agrees); then, if the plan has nothing to claim, done.
        const int64_t k = detail::block_rank() + (phase >> PHASE_COUNT_SHIFT) * detail::grid_size();
        if (k < plan[PLAN_N_FIRST]) return {k, phase + (int64_t{1} << PHASE_COUNT_SHIFT)};
        if (!detail::has_claims(plan)) return {-1, PHASE_DONE};
        phase = PHASE_SHARE;
      }
    }
    __shared__ PlanItem next;
    const int rank = detail::thread_rank();
    __syncthreads();  // every thread has read the previous call's `next` before it is overwritten
    if (rank < 32) {
      PlanItem mine{-1, PHASE_DONE};
      if constexpr ((PLACE & PLACE_MODE_MASK) == PLACE_QUEUES) {
        mine = detail::next_queued(plan, state, sm, phase, rank);
      } else {
        if (rank == 0) mine = detail::share_or_tail(plan, state, sm, phase);
        mine.item = __shfl_sync(0xffffffffu, mine.item, 0);
        mine.phase = __shfl_sync(0xffffffffu, mine.phase, 0);
        if (mine.phase == PHASE_STEAL && mine.item < 0) mine = detail::steal(plan, state, rank);
      }
      if (rank == 0) next = mine;
    }
    __syncthreads();
    return next;
  }
}

template <int PLACE>
__device__ inline void plan_finish(const int32_t* plan, int64_t* state, int64_t sm, int64_t t0, int64_t n_done) {
  if constexpr ((PLACE & PLACE_RECORD) != 0) {
    if (sm >= 0) {  // a bad plan (sm -1, the same in every thread) holds no recorder address to trust
      const int64_t address = (static_cast<int64_t>(plan[PLAN_REC_HI]) << 32) |
                              static_cast<int64_t>(static_cast<uint32_t>(plan[PLAN_REC_LO]));
      record_cta<true>(recorder_at(address), plan[PLAN_REC_TAG], sm, t0, n_done, -1);
    }
  }
  if constexpr ((PLACE & PLACE_MODE_MASK) == PLACE_SHARES) {
    // The CTA's last plan_next call ended with __syncthreads after its last item (or, with nothing to claim,
    // made no shared write to wait for), so thread 0 alone finishes.
    if (detail::thread_rank() != 0) return;
    const bool ok = sm >= 0;  // a bad plan (sm -1): no claim was made, nothing to count or reset
    const int n_slots = plan[PLAN_N_SLOTS];
    if (ok && sm < n_slots) {
      int64_t* stats = state + STATE_CURSORS + n_slots + sm;  // statistic k of SM sm: stats[k * n_slots]
      atomicAdd(detail::as_u64(stats + STAT_ITEMS * n_slots), static_cast<unsigned long long>(n_done));
      atomicAdd(detail::as_u64(stats + STAT_BUSY_NS * n_slots), static_cast<unsigned long long>(global_ns() - t0));
      atomicAdd(detail::as_u64(stats + STAT_CTAS * n_slots), 1ull);
    }
    if (!ok || !detail::has_claims(plan)) return;  // no cursor was touched: no count, no reset
    // Why the last CTA out may reset the state without racing anyone: every CTA makes all its claims (the last
    // one being the failed claim that returned -1) before this increment, and acq_rel orders them before it
    // (release) and this CTA's resets after it (acquire). The CTA that sees grid - 1 is therefore the last to
    // touch the cursors in this launch, and the next launch starts after this one ends in stream order.
    const unsigned long long grid = static_cast<unsigned long long>(detail::grid_size());
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> finished(*detail::as_u64(state + STATE_FINISHED));
    if (finished.fetch_add(1ull, cuda::memory_order_acq_rel) == grid - 1) {
      for (int s = 0; s < n_slots; ++s) state[STATE_CURSORS + s] = 0;
      state[STATE_TAIL] = 0;
      state[STATE_FINISHED] = 0;
    }
  }
}

}  // namespace l2topo
