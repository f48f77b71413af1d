// torch bindings of the kernel launchers: ops l2topo::chain_probe, line_probe, cluster_probe, whereami and
// partition_probe,
// CUDA only. Every op takes its kernel's arguments in the order of the Triton kernel, then the grid (CTAs),
// so that torch_l2topo/launch.py dispatches both backends alike.
// Shape checks live in torch_l2topo/probes.py (one place for both backends); here only what would
// make a launch unsafe is checked.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cluster_probe.h"
#include "l2_probes.h"
#include "layout.h"
#include "partition_probe.h"
#include "placement_demo.h"
#include "whereami.h"

namespace l2topo {
namespace {

void check_int64_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

ProbeLaunch make_launch(at::Tensor& ctrl, int64_t n_sm, int64_t grid, int64_t wave, int64_t timeout_ns) {
  check_int64_cuda(ctrl, "ctrl");
  TORCH_CHECK(ctrl.numel() >= CLAIMS + n_sm, "ctrl is too short for ", n_sm, " SMs");
  TORCH_CHECK(n_sm > 0 && grid >= n_sm, "need grid >= n_sm > 0, got grid=", grid, " n_sm=", n_sm);
  TORCH_CHECK(wave >= 1 && wave <= n_sm, "need 1 <= wave <= n_sm, got wave=", wave);
  return ProbeLaunch{ctrl.data_ptr<int64_t>(), n_sm, grid, timeout_ns, wave};
}

void chain_probe(at::Tensor ctrl, at::Tensor starts, at::Tensor out, int64_t n_loads, int64_t n_warm_first,
                 int64_t n_first, int64_t n_warm, int64_t n_sm, int64_t wave, int64_t timeout_ns, int64_t grid) {
  const c10::cuda::CUDAGuard guard(ctrl.device());
  const ProbeLaunch launch = make_launch(ctrl, n_sm, grid, wave, timeout_ns);
  check_int64_cuda(starts, "starts");
  check_int64_cuda(out, "out");
  TORCH_CHECK(starts.numel() >= n_sm && out.numel() >= n_sm * OUT_WORDS, "starts/out too short");
  C10_CUDA_CHECK(launch_chain_probe(launch, starts.data_ptr<int64_t>(), out.data_ptr<int64_t>(), n_loads,
                                    n_warm_first, n_first, n_warm, c10::cuda::getCurrentCUDAStream()));
}

void line_probe(at::Tensor ctrl, at::Tensor lines, at::Tensor cycles, at::Tensor per_sm, int64_t n_lines,
                int64_t n_warm, int64_t n_timed, int64_t n_sm, int64_t wave, int64_t timeout_ns,
                int64_t grid) {
  const c10::cuda::CUDAGuard guard(ctrl.device());
  const ProbeLaunch launch = make_launch(ctrl, n_sm, grid, wave, timeout_ns);
  check_int64_cuda(lines, "lines");
  check_int64_cuda(cycles, "cycles");
  check_int64_cuda(per_sm, "per_sm");
  TORCH_CHECK(lines.numel() >= n_lines * LINE_WORDS && cycles.numel() >= n_sm * n_lines &&
                  per_sm.numel() >= n_sm * OUT_WORDS,
              "lines/cycles/per_sm too short");
  C10_CUDA_CHECK(launch_line_probe(launch, lines.data_ptr<int64_t>(), cycles.data_ptr<int64_t>(),
                                   per_sm.data_ptr<int64_t>(), n_lines, n_warm, n_timed,
                                   c10::cuda::getCurrentCUDAStream()));
}

void cluster_probe(at::Tensor out, int64_t cluster, int64_t smem_bytes, int64_t hold_ns, int64_t grid) {
  const c10::cuda::CUDAGuard guard(out.device());
  check_int64_cuda(out, "out");
  TORCH_CHECK(out.numel() == grid, "out must hold one entry per CTA (grid=", grid, ")");
  TORCH_CHECK(cluster >= 1 && grid % cluster == 0, "grid must be a multiple of cluster=", cluster);
  C10_CUDA_CHECK(launch_cluster_probe(out.data_ptr<int64_t>(), grid, cluster, smem_bytes, hold_ns,
                                      c10::cuda::getCurrentCUDAStream()));
}

void whereami(at::Tensor lines, at::Tensor idx, at::Tensor out, int64_t n_warm, int64_t n_timed, int64_t grid) {
  const c10::cuda::CUDAGuard guard(out.device());
  check_int64_cuda(lines, "lines");
  check_int64_cuda(out, "out");
  TORCH_CHECK(idx.is_cuda() && idx.scalar_type() == at::kInt && idx.is_contiguous(), "idx must be CUDA int32");
  const int64_t k = idx.numel();
  TORCH_CHECK(out.dim() == 2 && out.size(0) == grid && out.size(1) == k + 1, "out must have shape (grid, k + 1)");
  C10_CUDA_CHECK(launch_whereami(lines.data_ptr<int64_t>(), idx.data_ptr<int32_t>(), k, n_warm, n_timed,
                                 out.data_ptr<int64_t>(), grid, c10::cuda::getCurrentCUDAStream()));
}

void partition_probe(at::Tensor ctrl, int64_t base, at::Tensor plan, at::Tensor cycles, int64_t n_blocks,
                     int64_t block_bytes, int64_t zero, int64_t n_timed, int64_t n_sm, int64_t wave, int64_t timeout_ns,
                     int64_t grid) {
  const c10::cuda::CUDAGuard guard(ctrl.device());
  const ProbeLaunch launch = make_launch(ctrl, n_sm, grid, wave, timeout_ns);
  check_int64_cuda(plan, "plan");
  TORCH_CHECK(cycles.is_cuda() && cycles.scalar_type() == at::kInt && cycles.is_contiguous(),
              "cycles must be a contiguous CUDA int32 tensor");
  TORCH_CHECK(plan.numel() >= 3 * n_sm && cycles.numel() >= 2 * n_blocks, "plan/cycles too short");
  TORCH_CHECK(base != 0 && block_bytes >= 8 && n_blocks >= 0, "need a storage address, block_bytes >= 8");
  C10_CUDA_CHECK(launch_partition_probe(launch, base, plan.data_ptr<int64_t>(), cycles.data_ptr<int32_t>(), n_blocks,
                                        block_bytes, zero, n_timed, c10::cuda::getCurrentCUDAStream()));
}

void placement_demo(at::Tensor out, at::Tensor count, int64_t n_out, at::Tensor plan, at::Tensor state,
                    int64_t place, int64_t grid) {
  const c10::cuda::CUDAGuard guard(out.device());
  check_int64_cuda(out, "out");
  check_int64_cuda(state, "state");
  TORCH_CHECK(count.is_cuda() && count.scalar_type() == at::kInt && count.is_contiguous(), "count must be CUDA int32");
  TORCH_CHECK(plan.is_cuda() && plan.scalar_type() == at::kInt && plan.is_contiguous(), "plan must be CUDA int32");
  TORCH_CHECK(n_out >= 1 && out.numel() >= n_out, "out must hold n_out >= 1 slots, got n_out=", n_out);
  TORCH_CHECK(plan.numel() >= PLAN_HEADER && state.numel() > STATE_CURSORS, "plan/state shorter than their headers");
  TORCH_CHECK(grid >= 1, "grid must be >= 1, got ", grid);
  TORCH_CHECK(place == PLACE_DIRECT || place == PLACE_SHARES || place == PLACE_QUEUES, "unknown placement mode ",
              place);
  C10_CUDA_CHECK(launch_placement_demo(out.data_ptr<int64_t>(), count.data_ptr<int32_t>(), n_out,
                                       plan.data_ptr<int32_t>(), state.data_ptr<int64_t>(), place, grid,
                                       c10::cuda::getCurrentCUDAStream()));
}

void capped_chase(at::Tensor starts, at::Tensor ends, int64_t n_loads, at::Tensor plan, at::Tensor state,
                  int64_t place, int64_t smem_bytes, int64_t grid) {
  const c10::cuda::CUDAGuard guard(ends.device());
  check_int64_cuda(starts, "starts");
  check_int64_cuda(ends, "ends");
  check_int64_cuda(state, "state");
  TORCH_CHECK(plan.is_cuda() && plan.scalar_type() == at::kInt && plan.is_contiguous(), "plan must be CUDA int32");
  TORCH_CHECK(grid >= 1 && smem_bytes >= 8, "need grid >= 1 and smem_bytes >= 8");
  TORCH_CHECK(place == CAPPED_PLAIN ? starts.numel() >= grid : plan.numel() >= PLAN_HEADER,
              "starts shorter than the grid, or plan shorter than its header");
  C10_CUDA_CHECK(launch_capped_chase(starts.data_ptr<int64_t>(), ends.data_ptr<int64_t>(), n_loads,
                                     plan.data_ptr<int32_t>(), state.data_ptr<int64_t>(), place, smem_bytes, grid,
                                     c10::cuda::getCurrentCUDAStream()));
}

int64_t capped_occupancy(int64_t place, int64_t smem_bytes) {
  const int64_t blocks = capped_chase_occupancy(place, smem_bytes);
  TORCH_CHECK(blocks >= 0, "the CUDA occupancy API failed for mode ", place, " with ", smem_bytes, " B shared");
  return blocks;
}

}  // namespace

TORCH_LIBRARY(l2topo, m) {
  m.def("chain_probe(Tensor(a!) ctrl, Tensor starts, Tensor(b!) out, int n_loads, int n_warm_first, "
        "int n_first, int n_warm, int n_sm, int wave, int timeout_ns, int grid) -> ()");
  m.def("line_probe(Tensor(a!) ctrl, Tensor lines, Tensor(b!) cycles, Tensor(c!) per_sm, int n_lines, "
        "int n_warm, int n_timed, int n_sm, int wave, int timeout_ns, int grid) -> ()");
  m.def("cluster_probe(Tensor(a!) out, int cluster, int smem_bytes, int hold_ns, int grid) -> ()");
  m.def("whereami(Tensor lines, Tensor idx, Tensor(a!) out, int n_warm, int n_timed, int grid) -> ()");
  m.def("partition_probe(Tensor(a!) ctrl, int base, Tensor plan, Tensor(b!) cycles, int n_blocks, int block_bytes, "
        "int zero, int n_timed, int n_sm, int wave, int timeout_ns, int grid) -> ()");
  m.def("placement_demo(Tensor(a!) out, Tensor(b!) count, int n_out, Tensor plan, Tensor(c!) state, int place, "
        "int grid) -> ()");
  m.def("capped_chase(Tensor starts, Tensor(a!) ends, int n_loads, Tensor plan, Tensor(b!) state, int place, "
        "int smem_bytes, int grid) -> ()");
  m.def("capped_occupancy(int place, int smem_bytes) -> int");
}

TORCH_LIBRARY_IMPL(l2topo, CUDA, m) {
  m.impl("chain_probe", &chain_probe);
  m.impl("line_probe", &line_probe);
  m.impl("cluster_probe", &cluster_probe);
  m.impl("whereami", &whereami);
  m.impl("partition_probe", &partition_probe);
  m.impl("placement_demo", &placement_demo);
  m.impl("capped_chase", &capped_chase);
}

TORCH_LIBRARY_IMPL(l2topo, CompositeExplicitAutograd, m) {
  m.impl("capped_occupancy", &capped_occupancy);  // no tensor argument: not dispatched by device
}

}  // namespace l2topo
