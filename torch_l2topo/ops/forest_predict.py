"""forest_predict(forest, x): tree-ensemble inference, a Triton walk on a GPU and a pure-torch walk on the CPU.

    forest = Forest.from_sklearn(model).to("cuda")      # once
    proba = forest_predict(forest, x)                    # model.predict_proba(x) (predict for regressors)

The op `torch.ops.torch_l2topo.forest_predict` returns (base + every tree's leaf row, per output) / divisor,
through the forest's link. On CUDA the kernel of triton_kernels/forest.py walks, adds the tree chunks and applies
the link in one launch; elsewhere the same walk in PyTorch ops in the forest's own precision, so the CPU path
reproduces the library's predictions. A custom op with no mutated argument (torch.compile keeps it whole; CUDA
graphs capture it); an eager call skips the dispatcher (policy.direct_call). Eager calls under "auto" of fewer
than EAGER_MAX_STEPS walk steps run the C++ eager kernel (ops/eager_kernels.py) once it is built: its whole
call costs less host time than the Triton launch. Work: items are (sample block, tree chunk) pairs, about
ITEMS_PER_SM per SM; `policy=` places them (policy.py), and per-partition copies let each SM walk the copy homed
in its partition (docs/ops.md).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .eager_kernels import eager_device
from .forest import TRANSFORMS, Forest
from .policy import AUTO, check_policy, device_properties, direct_call, launch_placed, pow2, traced, triton_launcher

try:
    from ..triton_kernels.forest import forest_kernel
except ImportError:  # no Triton: the CPU walk only
    forest_kernel = None

LANES = 128            # (sample, tree) walks per program: one per thread at 4 warps
MAX_BLOCK_S = 32       # samples per program; the rest of the lanes walk different trees of the same samples
ITEMS_PER_SM = 8       # chunk the trees until the launch has this many items per SM (when samples are few)
MAX_GPU_OUTPUTS = 64   # outputs (classes) the kernel accumulates in registers
# Partial sums the last chunk of a block loads at once (chunks x samples x outputs). Wider was slower on the H200
# (4,096: 16.3 against 11.6 us per call at 132 samples; bench_ops_kernels.py --only forest_sum):
# the sum's registers are the whole kernel's, and the walks lose occupancy to them.
SUM_VALUES = 1024
CPU_WALKS = 1 << 22    # (sample, tree) walks the CPU path holds at once (its index tensors: 32 MB each)
# Eager calls of fewer walk steps (samples x trees x depth) run the C++ eager kernel (eager_forest). Set on the H200
# (benchmarks/bench_eager_forest.py): at up to 9.8M steps every call took 0.24-0.37x the Triton kernel's
# eager call (its host time: 58-108 us there); from 39M steps on the Triton kernel's GPU time (108 us and up) is
# about the same or the shorter, by up to 1.34x, and the host time is hidden behind it.
EAGER_MAX_STEPS = 1 << 24
LINKS = {name: code for code, name in enumerate(TRANSFORMS)}  # Forest.transform -> the kernel's LINK code

_counters: dict = {}   # (device, stream) -> chunk_counters' eager buffer
# the current stream's handle without building a Stream object (as Triton and Inductor read it): 3-4 us less
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) \
    or (lambda index: torch.cuda.current_stream(index).cuda_stream)


def forest_predict(forest: Forest, x: torch.Tensor, *, policy: str = "auto") -> torch.Tensor:
    """The forest's prediction for the rows of x (n_samples, n_features): (n_samples,) or (n_samples, outputs).
    x is compared in float32 (as scikit-learn and xgboost do); x and the forest must be on the same device
    (forest.to(device) once)."""
    check_policy(policy)
    if not isinstance(forest, Forest):
        raise TypeError(f"forest_predict takes a Forest (Forest.from_sklearn, Forest.from_xgboost_json); got "
                        f"{type(forest).__name__}")
    if x.dim() != 2 or x.size(1) != forest.n_features:
        raise ValueError(f"x must be (n_samples, {forest.n_features}); got shape {tuple(x.shape)}")
    if not (x.dtype.is_floating_point or x.dtype in (torch.int32, torch.int64, torch.int16, torch.int8,
                                                     torch.uint8, torch.bool)):
        raise TypeError(f"x must be a real tensor; got {x.dtype}")
    if x.device != forest.device:
        raise ValueError(f"x is on {x.device} but the forest on {forest.device}: move the forest once with "
                         f"forest.to({str(x.device)!r})")
    if x.is_cuda and forest.n_outputs > MAX_GPU_OUTPUTS:
        raise ValueError(f"forest_predict on a GPU handles up to {MAX_GPU_OUTPUTS} outputs; this forest has "
                         f"{forest.n_outputs} (run it on the CPU)")
    if x.dtype is not torch.float32 or not x.is_contiguous():  # (two dispatcher calls even when they return x:
        x = x.to(torch.float32).contiguous()                     # 2 us of a 15-36 us eager call)
    if not direct_call(x):
        out = torch.ops.torch_l2topo.forest_predict(*_op_args(forest, x, policy))
    else:
        out = eager_forest(forest, x) if policy == AUTO and x.is_cuda else None
        if out is None:
            out = _forest_predict(*_op_args(forest, x, policy))
    return out[:, 0] if forest.squeeze else out


def _op_args(forest: Forest, x: torch.Tensor, policy: str) -> tuple:
    return (forest.nodes, forest.values, forest.roots, forest.groups, forest.base, x, forest.depth, forest.divisor,
            policy, forest.sm_partition, forest.transform)


def eager_forest(forest: Forest, x: torch.Tensor, max_steps: int = EAGER_MAX_STEPS) -> Optional[torch.Tensor]:
    """The prediction of an eager "auto" call on CUDA float32 rows x on the C++ eager kernel (eager_kernels.py),
    split as the Triton kernel's launch would be; None (the Triton kernel runs the call, and raises what there is
    to raise) where the C++ module is not loaded yet, for calls of max_steps walk steps or more, and for
    calls the module does not take (under CUDA graph capture among them: cuda_ext/eager_bindings.cpp)."""
    run = eager_device(x.get_device()).forest
    n, n_trees = x.shape[0], forest.roots.shape[-1]
    copies = forest.sm_partition is not None
    if run is None or n == 0 or n * n_trees * forest.depth >= max_steps or forest.transform not in LINKS \
            or forest.n_outputs > MAX_GPU_OUTPUTS or copies != (forest.roots.dim() == 2 and forest.roots.shape[0] == 2):
        return None
    block_s, _, _, n_chunks, trees_per_chunk, _, _ = _shape(n, n_trees, sm_count(x.get_device()), forest.n_outputs)
    return run(forest.nodes, forest.values, forest.roots, forest.groups, forest.base, x, forest.depth,
               1.0 / forest.divisor, LINKS[forest.transform], block_s, n_chunks, trees_per_chunk, forest.sm_partition)


def apply_link(raw: torch.Tensor, link: str) -> torch.Tensor:
    """The link in PyTorch ops (the CPU path): what the kernel applies before it stores."""
    if link == "sigmoid":
        return torch.sigmoid(raw)
    if link == "sigmoid_pair":
        p = torch.sigmoid(raw)
        return torch.cat([1 - p, p], dim=1)
    if link == "softmax":
        return torch.softmax(raw, dim=1)
    if link == "exp":
        return torch.exp(raw)
    return raw


def _runs_on_triton(x) -> bool:
    return x.is_cuda and forest_kernel is not None


def work_split(n_samples: int, n_trees: int, n_sm: int) -> tuple:
    """(BLOCK_S, BLOCK_T, sample blocks, tree chunks, trees per chunk): LANES walks per program; the trees cut
    into chunks (whole BLOCK_T tiles) until there are ITEMS_PER_SM items per SM, or one tile per chunk."""
    block_s = min(MAX_BLOCK_S, pow2(max(n_samples, 1)))
    block_t = LANES // block_s
    n_blocks = -(-n_samples // block_s)
    wanted = -(-ITEMS_PER_SM * n_sm // n_blocks)
    n_chunks = max(1, min(wanted, -(-n_trees // block_t)))
    trees_per_chunk = -(-n_trees // (n_chunks * block_t)) * block_t
    return block_s, block_t, n_blocks, -(-n_trees // trees_per_chunk), trees_per_chunk


@functools.lru_cache(maxsize=4096)
def _shape(n_samples: int, n_trees: int, n_sm: int, n_outputs: int) -> tuple:
    """work_split, OUT_PAD and SUM_CHUNKS (a power of two) of a launch, cached: host time is most of a small
    call."""
    split = work_split(n_samples, n_trees, n_sm)
    out_pad = pow2(n_outputs)
    return (*split, out_pad, 1 << (max(1, SUM_VALUES // (split[0] * out_pad)).bit_length() - 1))


def sm_count(index: int) -> int:
    """SMs of CUDA device `index`."""
    return device_properties(index).multi_processor_count


def launch_kernel(nodes, values, roots, groups, base, x, depth: int, divisor: float, n_sm: int,
                  policy: str, sm_partition: Optional[torch.Tensor] = None, link: str = "identity") -> torch.Tensor:
    """The kernel over every (sample block, tree chunk) item, placed as `policy` says: the sums (n_samples,
    n_outputs) over divisor through `link` (one of LINKS; "sigmoid_pair": (n_samples, 2)), float32. sm_partition:
    each SM's copy of per-partition copies (roots (2, n_trees)), or None."""
    n, n_features = x.shape
    n_trees, n_outputs = roots.shape[-1], base.numel()
    sm_part = sm_partition if sm_partition is not None else roots  # never read with REPLICAS 1
    # symbolic sizes (torch.compile, opcheck: the fake implementation is this body) cannot key a cache
    shape = _shape.__wrapped__ if traced(x) else _shape
    block_s, block_t, n_blocks, n_chunks, trees_per_chunk, out_pad, sum_chunks = shape(n, n_trees, n_sm, n_outputs)
    out = torch.empty((n, 2 if link == "sigmoid_pair" else n_outputs), dtype=torch.float32, device=x.device)
    chunked = n_chunks > 1
    # one chunk: the kernel stores the prediction straight away (partial and the counters are never read)
    partial = torch.empty((n_chunks, n, n_outputs), dtype=torch.float32, device=x.device) if chunked else out
    counts = chunk_counters(x, n_blocks if chunked else 0)

    def launch(grid, plan, state, place):
        triton_launcher(forest_kernel, out)[(grid,)](
            nodes, values, roots, groups, base, x, out, partial, counts, n, n_features, n_trees, trees_per_chunk,
            n_chunks, depth, n_outputs, values.shape[1], 1.0 / divisor, sm_part, sm_part.numel(), plan, state,
            BLOCK_S=block_s, BLOCK_T=block_t, OUT_PAD=out_pad, VECTOR_LEAVES=values.shape[1] > 1,
            REPLICAS=1 if sm_partition is None else 2, PLACE=place, SUM_CHUNKS=sum_chunks, LINK=LINKS[link],
            num_warps=4)

    launch_placed("forest_predict", policy, launch, n_blocks * n_chunks, out)
    return out


def chunk_counters(like: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """int32 counters, at least n_blocks of them and zero, for a chunked launch on like's device (the kernel
    zeroes each again once its block's chunks are added). Eager: one buffer per (device, stream), kept (no memset
    per call; two streams never share one). Under CUDA graph capture: the graph's own, zeroed by a memset the
    graph replays, so no graph shares a buffer with eager calls or other graphs. Traced or fake: a tensor for the
    shapes (nothing launches)."""
    if traced(like) or (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        return torch.zeros(max(n_blocks, 1), dtype=torch.int32, device=like.device) if n_blocks \
            else torch.empty(1, dtype=torch.int32, device=like.device)
    key = (like.device, _raw_stream(like.device.index) if like.is_cuda else 0)
    counts = _counters.get(key)
    if counts is None or counts.numel() < n_blocks:
        counts = _counters[key] = torch.zeros(max(n_blocks, 1024), dtype=torch.int32, device=like.device)
    return counts


def reference_walk(nodes, values, roots, groups, base, x, depth: int) -> torch.Tensor:
    """The raw sums in PyTorch ops, in values' dtype: trees added in order, starting from base."""
    n = x.shape[0]
    acc = base.expand(n, base.numel()).clone()
    if n == 0:
        return acc
    packed = nodes[:, 0]
    feature = (packed & 0x7FFFFFFF).long()
    default_left = packed < 0
    threshold = nodes[:, 1].contiguous().view(torch.float32)
    left, right = nodes[:, 2].long(), nodes[:, 3].long()
    chunk = max(1, CPU_WALKS // n)
    for first in range(0, roots.numel(), chunk):
        node = roots[first:first + chunk].long().expand(n, -1)
        for _ in range(depth):
            value = x.gather(1, feature[node])
            go_left = (value <= threshold[node]) | (torch.isnan(value) & default_left[node])
            node = torch.where(go_left, left[node], right[node])
        rows = values[nodes[node, 1].long()]  # (n, trees, leaf_width)
        # index_add_ adds the trees one after the other, in order: the libraries' own summation order
        if values.shape[1] == 1:
            acc.index_add_(1, groups[first:first + chunk].long(), rows[:, :, 0])
        else:
            acc.unsqueeze(1).index_add_(1, torch.zeros_like(node[0]), rows)
    return acc


def _forest_predict(nodes: torch.Tensor, values: torch.Tensor, roots: torch.Tensor, groups: torch.Tensor,
                    base: torch.Tensor, x: torch.Tensor, depth: int, divisor: float, policy: str,
                    sm_partition: Optional[torch.Tensor] = None, link: str = "identity") -> torch.Tensor:
    """The prediction of a laid-out forest (forest.py) for float32 rows x: its sums (n_samples, n_outputs) over
    divisor, through `link` (one of LINKS; "sigmoid_pair" gives (n_samples, 2)). sm_partition: per-partition
    copies (roots (2, n_trees)): each SM walks its own (Forest.per_partition)."""
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}; got {link!r}")
    if sm_partition is not None:
        if roots.dim() != 2 or roots.shape[0] != 2:
            raise ValueError(f"per-partition copies need roots of shape (2, n_trees); got {tuple(roots.shape)}")
        roots, sm_partition = roots.contiguous(), sm_partition.contiguous()  # the kernel reads row p at p * n_trees
    if not _runs_on_triton(x) or x.shape[0] == 0:
        raw = reference_walk(nodes, values, roots.reshape(-1, roots.shape[-1])[0], groups, base, x, depth)
        return apply_link(raw if divisor == 1.0 else raw / divisor, link)
    return launch_kernel(nodes, values, roots, groups, base, x, depth, divisor, sm_count(x.device.index), policy,
                         sm_partition, link)


_forest_predict_op = torch.library.custom_op("torch_l2topo::forest_predict", _forest_predict, mutates_args=())
_forest_predict_op.register_fake(_forest_predict)  # the body on fake tensors: allocations only
