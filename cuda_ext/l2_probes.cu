// CUDA backend of the per-SM L2 probes: the chain probe and the line probe.
// Semantics match triton_kernels/l2_probes.py; torch_l2topo/measure/probes.py launches either.
// One warp per CTA, lane 0 does all the work: the probes are single dependent load chains.
#include "l2_probes.h"
#include "protocol.cuh"

namespace l2topo {

// Per SM: warm loads, then a timed pass over its whole ring. starts[sm] is the word where SM `sm` starts: the
// buffer holds LINE_WORDS independent rings, one per 8-byte word, so SMs of one wave chase different random
// orders. SMs 0 to n_first - 1 make n_warm_first warm loads (whole passes over every ring bring every word
// into L2: a load fetches one 32-byte sector, so one ring alone leaves the others' sectors in DRAM); the others
// only n_warm, to settle their chase. out[sm] = (clock64 cycles, globaltimer
// ns, final address - start address, globaltimer at the start) of the timed pass; after a whole pass the
// chase is back where it started, which the host checks.
__global__ void __launch_bounds__(32) chain_probe_kernel(ProbeLaunch launch, const int64_t* starts,
                                                         int64_t* out, int64_t n_loads, int64_t n_warm_first,
                                                         int64_t n_first, int64_t n_warm) {
  if (threadIdx.x != 0) return;
  const int64_t sm = claim_sm(launch.ctrl, launch.n_sm, launch.wave, launch.timeout_ns);
  if (sm < 0) return;
  int64_t p = starts[sm];
  const int64_t warm = sm < n_first ? n_warm_first : n_warm;
  for (int64_t i = 0; i < warm; ++i) p = chase(p);
  const int64_t begin = p;
  const int64_t t0 = clock_after(p);
  const int64_t g0 = global_ns();
  for (int64_t i = 0; i < n_loads; ++i) p = chase(p);
  const int64_t t1 = clock_after(p);
  const int64_t g1 = global_ns();
  out[sm * OUT_WORDS + 0] = t1 - t0;
  out[sm * OUT_WORDS + 1] = g1 - g0;
  out[sm * OUT_WORDS + 2] = p - begin;
  out[sm * OUT_WORDS + 3] = g0;
  finish_turn(launch.ctrl);
}

// Per SM and line: n_warm loads, then n_timed dependent loads timed with clock64. Each line holds its own
// address, so the chase stays on one line. SMs start at different lines (rotation by position in the wave)
// so SMs of one wave never load the same line at once. per_sm[sm] = (cycles, ns, lines whose chase left the line,
// globaltimer at the start).
__global__ void __launch_bounds__(32) line_probe_kernel(ProbeLaunch launch, const int64_t* lines,
                                                        int64_t* cycles, int64_t* per_sm, int64_t n_lines,
                                                        int64_t n_warm, int64_t n_timed) {
  if (threadIdx.x != 0) return;
  const int64_t sm = claim_sm(launch.ctrl, launch.n_sm, launch.wave, launch.timeout_ns);
  if (sm < 0) return;
  const int64_t rot = ((sm % launch.wave) * n_lines) / launch.wave;
  const int64_t g_start = global_ns();
  const int64_t c_start = clock_after(g_start);
  int64_t broken = 0;
  for (int64_t j = 0; j < n_lines; ++j) {
    const int64_t k = (j + rot) % n_lines;
    const int64_t home = reinterpret_cast<int64_t>(lines + k * LINE_WORDS);
    int64_t p = home;
    for (int64_t w = 0; w < n_warm; ++w) p = chase(p);
    const int64_t t0 = clock_after(p);
    for (int64_t r = 0; r < n_timed; ++r) p = chase(p);
    const int64_t t1 = clock_after(p);
    cycles[sm * n_lines + k] = t1 - t0;
    broken += (p != home);
  }
  const int64_t c_end = clock_after(broken);
  const int64_t g_end = global_ns();
  per_sm[sm * OUT_WORDS + 0] = c_end - c_start;
  per_sm[sm * OUT_WORDS + 1] = g_end - g_start;
  per_sm[sm * OUT_WORDS + 2] = broken;
  per_sm[sm * OUT_WORDS + 3] = g_start;
  finish_turn(launch.ctrl);
}

cudaError_t launch_chain_probe(const ProbeLaunch& launch, const int64_t* starts, int64_t* out,
                               int64_t n_loads, int64_t n_warm_first, int64_t n_first, int64_t n_warm,
                               cudaStream_t stream) {
  chain_probe_kernel<<<static_cast<unsigned>(launch.grid), 32, 0, stream>>>(launch, starts, out, n_loads,
                                                                            n_warm_first, n_first, n_warm);
  return cudaGetLastError();
}

cudaError_t launch_line_probe(const ProbeLaunch& launch, const int64_t* lines, int64_t* cycles,
                              int64_t* per_sm, int64_t n_lines, int64_t n_warm, int64_t n_timed,
                              cudaStream_t stream) {
  line_probe_kernel<<<static_cast<unsigned>(launch.grid), 32, 0, stream>>>(launch, lines, cycles, per_sm,
                                                                           n_lines, n_warm, n_timed);
  return cudaGetLastError();
}

}  // namespace l2topo
