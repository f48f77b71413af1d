// pybind11 bindings of the eager kernels (eager_bags.cu, eager_forest.cu): the module that
// torch_l2topo/ops/eager_kernels.py builds. Python module functions, not torch.ops ops: a call through torch.ops
// costs microseconds of schema parsing and dispatch, which is the host time this path exists to save.
// - bags: calls the kernel does not take (non-contiguous tensors, mixed index dtypes, other devices or row types)
//   go to torch's own op, which also raises torch's errors for bad arguments.
// - forest: calls the kernel does not take (other dtypes or devices, unaligned records, CUDA graph capture)
//   return None, and forest_predict launches its Triton kernel, which the caller has checked the arguments for.
#include <map>
#include <optional>
#include <utility>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "eager_bags.h"
#include "eager_forest.h"

namespace l2topo {
namespace {

int row_type(const at::Tensor& weight) {
  switch (weight.scalar_type()) {
    case at::kFloat: return ROWS_FP32;
    case at::kBFloat16: return ROWS_BF16;
    case at::kHalf: return ROWS_FP16;
    default: return -1;
  }
}

bool kernel_takes(const at::Tensor& weight, const at::Tensor& input, const at::Tensor& offsets, int64_t mode,
                  bool include_last_offset) {
  const auto index = input.scalar_type();
  // an empty table: torch's op (the kernel reads row 0 in place of a bad index before it asserts)
  return weight.is_cuda() && weight.dim() == 2 && weight.size(0) > 0 && input.dim() == 1 && offsets.dim() == 1 &&
         row_type(weight) >= 0 && (index == at::kLong || index == at::kInt) && offsets.scalar_type() == index &&
         input.device() == weight.device() && offsets.device() == weight.device() && weight.is_contiguous() &&
         input.is_contiguous() && offsets.is_contiguous() && mode >= 0 && mode <= 2 &&
         (!include_last_offset || offsets.size(0) >= 1);
}

// torch.embedding_bag(weight, input, offsets, mode=mode, include_last_offset=...)[0] for 1-D input with offsets
at::Tensor bags(const at::Tensor& weight, const at::Tensor& input, const at::Tensor& offsets, int64_t mode,
                bool include_last_offset) {
  if (!kernel_takes(weight, input, offsets, mode, include_last_offset)) {
    return std::get<0>(at::embedding_bag(weight, input, offsets, false, mode, false, std::nullopt,
                                         include_last_offset, std::nullopt));
  }
  const c10::cuda::CUDAGuard guard(weight.device());
  const int64_t n_offsets = offsets.size(0);
  const int64_t n_bags = include_last_offset ? n_offsets - 1 : n_offsets;
  const int64_t dim = weight.size(1);
  at::Tensor out = at::empty({n_bags, dim}, weight.options());
  C10_CUDA_CHECK(launch_eager_bags(input.const_data_ptr(), offsets.const_data_ptr(), input.scalar_type() == at::kLong,
                                   weight.const_data_ptr(), out.data_ptr(), row_type(weight), static_cast<int>(mode),
                                   input.size(0), n_offsets, n_bags, weight.size(0), dim,
                                   c10::cuda::getCurrentCUDAStream()));
  return out;
}

bool forest_tensor(const at::Tensor& t, const at::Device& device, at::ScalarType dtype) {
  return t.device() == device && t.scalar_type() == dtype && t.is_contiguous();
}

// Zeroed chunk counters for an eager launch of n_blocks sample blocks on the current stream of `device` (the kernel
// leaves them at zero): one buffer per (device, stream), kept, so that two streams never share one. No lock: the
// caller holds the GIL (pybind11's default).
int32_t* chunk_counters(const at::Device& device, int64_t n_blocks) {
  // never destroyed: a static tensor's destructor would run at exit, after CUDA may have shut down
  static auto* buffers = new std::map<std::pair<int, int64_t>, at::Tensor>();
  at::Tensor& counts = (*buffers)[{device.index(), c10::cuda::getCurrentCUDAStream().id()}];
  if (!counts.defined() || counts.numel() < n_blocks) {
    counts = at::zeros({std::max<int64_t>(n_blocks, 1024)}, at::TensorOptions().dtype(at::kInt).device(device));
  }
  return counts.data_ptr<int32_t>();
}

// forest_predict's launch_kernel (ops/forest_predict.py) on the eager kernel: the prediction (n_samples,
// n_outputs), or (n_samples, 2) for the sigmoid pair, float32; None for a call the kernel does not take.
std::optional<at::Tensor> forest(const at::Tensor& nodes, const at::Tensor& values, const at::Tensor& roots,
                                 const at::Tensor& groups, const at::Tensor& base, const at::Tensor& x, int64_t depth,
                                 double scale, int64_t link, int64_t block_s, int64_t n_chunks,
                                 int64_t trees_per_chunk, const std::optional<at::Tensor>& sm_part) {
  const at::Device device = x.device();
  const int64_t n_outputs = base.numel();
  const bool takes = x.is_cuda() && x.dim() == 2 && forest_tensor(x, device, at::kFloat) &&
                     forest_tensor(nodes, device, at::kInt) && nodes.dim() == 2 && nodes.size(1) == 4 &&
                     reinterpret_cast<uintptr_t>(nodes.const_data_ptr()) % 16 == 0 &&
                     forest_tensor(values, device, at::kFloat) && values.dim() == 2 &&
                     forest_tensor(roots, device, at::kInt) && forest_tensor(groups, device, at::kInt) &&
                     forest_tensor(base, device, at::kFloat) && n_outputs >= 1 && n_outputs <= FOREST_MAX_OUTPUTS &&
                     (!sm_part || forest_tensor(*sm_part, device, at::kInt)) && link >= 0 && link <= LINK_EXP &&
                     roots.size(-1) <= INT32_MAX && nodes.size(0) <= INT32_MAX;
  if (!takes) return std::nullopt;
  const c10::cuda::CUDAGuard guard(device);
  // a graph replays no host time, and there the Triton kernel's GPU time is the shorter (ops/forest_predict.py)
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return std::nullopt;
  const int64_t n = x.size(0);
  const auto options = x.options();
  at::Tensor out = at::empty({n, link == LINK_SIGMOID_PAIR ? 2 : n_outputs}, options);
  at::Tensor partial = n_chunks > 1 ? at::empty({n_chunks, n, n_outputs}, options) : out;
  ForestLaunch launch{};
  launch.nodes = nodes.const_data_ptr<int32_t>();
  launch.values = values.const_data_ptr<float>();
  launch.roots = roots.const_data_ptr<int32_t>();
  launch.groups = groups.const_data_ptr<int32_t>();
  launch.base = base.const_data_ptr<float>();
  launch.x = x.const_data_ptr<float>();
  launch.out = out.data_ptr<float>();
  launch.partial = partial.data_ptr<float>();
  launch.counts = n_chunks > 1 ? chunk_counters(device, (n + block_s - 1) / block_s) : nullptr;
  launch.sm_part = sm_part ? sm_part->const_data_ptr<int32_t>() : nullptr;
  launch.n_samples = n;
  launch.n_features = x.size(1);
  launch.n_sm = sm_part ? static_cast<int>(sm_part->numel()) : 0;
  launch.n_trees = static_cast<int>(roots.size(-1));
  launch.trees_per_chunk = static_cast<int>(trees_per_chunk);
  launch.n_chunks = static_cast<int>(n_chunks);
  launch.depth = static_cast<int>(depth);
  launch.n_outputs = static_cast<int>(n_outputs);
  launch.leaf_width = static_cast<int>(values.size(1));
  launch.link = static_cast<int>(link);
  launch.block_s = static_cast<int>(block_s);
  launch.scale = static_cast<float>(scale);
  C10_CUDA_CHECK(launch_eager_forest(launch, c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace
}  // namespace l2topo

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bags", &l2topo::bags, "torch.embedding_bag(weight, input, offsets, mode=mode, include_last_offset=...)[0]",
        pybind11::arg("weight"), pybind11::arg("input"), pybind11::arg("offsets"), pybind11::arg("mode"),
        pybind11::arg("include_last_offset"));
  m.def("forest", &l2topo::forest, "forest_predict's prediction on the eager kernel, or None where it does not run",
        pybind11::arg("nodes"), pybind11::arg("values"), pybind11::arg("roots"), pybind11::arg("groups"),
        pybind11::arg("base"), pybind11::arg("x"), pybind11::arg("depth"), pybind11::arg("scale"),
        pybind11::arg("link"), pybind11::arg("block_s"), pybind11::arg("n_chunks"), pybind11::arg("trees_per_chunk"),
        pybind11::arg("sm_part"));
}
