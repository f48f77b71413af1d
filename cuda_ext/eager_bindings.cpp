// pybind11 binding of the eager embedding-bag kernel (eager_bags.cu): the module torch_l2topo/ops/eager_bags.py
// builds. A Python module function, not a torch.ops op: a call through torch.ops costs microseconds of schema
// parsing and dispatch, which is the host time this path exists to save. Calls the kernel does not take
// (non-contiguous tensors, mixed index dtypes, other devices or row types) go to torch's own op, which also
// raises torch's errors for bad arguments.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "eager_bags.h"

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

}  // namespace
}  // namespace l2topo

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bags", &l2topo::bags, "torch.embedding_bag(weight, input, offsets, mode=mode, include_last_offset=...)[0]",
        pybind11::arg("weight"), pybind11::arg("input"), pybind11::arg("offsets"), pybind11::arg("mode"),
        pybind11::arg("include_last_offset"));
}
