// The device-side protocol in CUDA: timers, dependent loads, and the claim / barrier / turn protocol with its
// %globaltimer watchdog. Public API for any CUDA kernel of torch_l2topo or of its users; it mirrors
// triton_kernels/protocol.py function by function, under the same names (that file documents each one;
// tests/test_kernel_sources.py checks that the two lists agree). One difference: claim_sm returns the SM id
// when this CTA may measure and -1 otherwise, where the Triton version returns (sm, go).
// Call everything from one thread of the CTA: the protocol is scalar.
#pragma once
#include <cstdint>
#include "layout.h"

namespace l2topo {

__device__ __forceinline__ int64_t sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

__device__ __forceinline__ int64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
  return static_cast<int64_t>(t);
}

// Read clock64 only once `dep` has arrived. The read is predicated on a compare of `dep`, so it cannot
// issue before the load that produced `dep` completes: a plain clock read (even `asm volatile` with `dep`
// as an unused input) may be scheduled before that load lands, and then one load latency is missing from
// the interval or added to it, depending on how ptxas schedules each side. dep is an address or a count,
// never -1, so the predicate is always true.
__device__ __forceinline__ int64_t clock_after(int64_t dep) {
  int64_t t;
  asm volatile(
      "{\n\t.reg .pred ready;\n\t"
      "setp.ne.s64 ready, %1, -1;\n\t"
      "@ready mov.u64 %0, %%clock64;\n\t"
      "@!ready mov.u64 %0, 0;\n\t}"
      : "=l"(t) : "l"(dep) : "memory");
  return t;
}

// One dependent L2 load: ld.global.cg skips L1, and the next address is the loaded value.
__device__ __forceinline__ int64_t chase(int64_t addr) {
  int64_t next;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(next) : "l"(addr) : "memory");
  return next;
}

// The same load allowed to hit in L1 (ld.global.ca): the L1-hit oracle.
__device__ __forceinline__ int64_t chase_l1(int64_t addr) {
  int64_t next;
  asm volatile("ld.global.ca.u64 %0, [%1];" : "=l"(next) : "l"(addr) : "memory");
  return next;
}

// `addr` itself, but only once `value` has arrived: addr + (value AND zero), with `zero` a runtime 0 the host
// passes. In asm, so nvcc cannot fold the AND: a load from the result waits for the load that made `value`.
// Chains loads of data that are not pointers. Not volatile: it only orders, it reads nothing.
__device__ __forceinline__ int64_t address_after(int64_t addr, int64_t value, int64_t zero) {
  int64_t out;
  asm("{\n\t.reg .b64 m;\n\tand.b64 m, %2, %3;\n\tadd.s64 %0, %1, m;\n\t}"
      : "=l"(out) : "l"(addr), "l"(value), "l"(zero));
  return out;
}

__device__ __forceinline__ void nanosleep(unsigned ns) { __nanosleep(ns); }

namespace detail {
__device__ __forceinline__ int64_t volatile_read(const int64_t* p) {
  return *reinterpret_cast<const volatile int64_t*>(p);
}
}  // namespace detail

__device__ __forceinline__ void fail(int64_t* ctrl, int64_t code, int64_t detail) {
  // First error wins; its detail is written by the same winner only.
  if (atomicCAS(reinterpret_cast<unsigned long long*>(ctrl + ERROR), 0ull,
                static_cast<unsigned long long>(code)) == 0ull) {
    atomicExch(reinterpret_cast<unsigned long long*>(ctrl + ERROR_DETAIL),
               static_cast<unsigned long long>(detail));
  }
}

// Spin until ctrl[word] >= target. The watchdog restarts whenever the word moves, so a long run of waves
// is fine while a stalled one fails after timeout_ns. False on timeout or on another CTA's error.
__device__ inline bool wait_at_least(int64_t* ctrl, int word, int64_t target, int64_t timeout_ns, int64_t code) {
  int64_t last = detail::volatile_read(ctrl + word);
  int64_t since = global_ns();
  while (true) {
    const int64_t seen = detail::volatile_read(ctrl + word);
    const int64_t now = global_ns();
    if (seen >= target) return true;
    if (detail::volatile_read(ctrl + ERROR) != 0) return false;
    nanosleep(POLL_BACKOFF_NS);
    if (seen != last) {
      last = seen;
      since = now;
    } else if (now - since > timeout_ns) {
      fail(ctrl, code, seen);
      return false;
    }
  }
}

// Claim this CTA's SM; wait until every SM is claimed, then for this SM's wave: SMs measure in waves of
// `wave` consecutive SM ids, wave k starting once TURN shows every SM of the earlier waves done (wave=1:
// serialized; wave=n_sm: all at once). Returns the SM id when this CTA may measure, -1 otherwise.
__device__ inline int64_t claim_sm(int64_t* ctrl, int64_t n_sm, int64_t wave, int64_t timeout_ns) {
  const int64_t sm = sm_id();
  if (sm >= n_sm) {
    fail(ctrl, ERR_SMID_RANGE, sm);
    return -1;
  }
  if (atomicCAS(reinterpret_cast<unsigned long long*>(ctrl + CLAIMS + sm), 0ull, 1ull) != 0ull) return -1;
  atomicAdd(reinterpret_cast<unsigned long long*>(ctrl + ARRIVALS), 1ull);
  if (!wait_at_least(ctrl, ARRIVALS, n_sm, timeout_ns, ERR_BARRIER_TIMEOUT)) return -1;
  if (!wait_at_least(ctrl, TURN, (sm / wave) * wave, timeout_ns, ERR_TURN_TIMEOUT)) return -1;
  return sm;
}

// This SM is done: its results are visible before the next wave starts measuring.
__device__ __forceinline__ void finish_turn(int64_t* ctrl) {
  __threadfence();
  atomicAdd(reinterpret_cast<unsigned long long*>(ctrl + TURN), 1ull);
}

}  // namespace l2topo
