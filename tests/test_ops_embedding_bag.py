"""torch_l2topo.ops.embedding_bag on the CPU, against torch.nn.functional.embedding_bag as the oracle: results,
argument checks (the same exception type and message for the same bad call), gradients, policy, the custom op
(opcheck, torch.compile(fullgraph=True) through the fake and decomposed paths). The Triton kernel itself is
checked in Triton's interpreter and compiled for sm_90 in tests/test_ops_kernels.py; on a GPU in
tests/test_ops_gpu.py.
"""
import importlib
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torch_l2topo.ops import embedding_bag

N_ROWS, DIM = 20, 6
bags = importlib.import_module("torch_l2topo.ops.embedding_bag")  # the module (the package exports the function)
eager_ext = importlib.import_module("torch_l2topo.ops.eager_kernels")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fit_eager_rule as fit_rule  # noqa: E402


@pytest.fixture
def table():
    torch.manual_seed(0)
    return torch.randn(N_ROWS, DIM, dtype=torch.float64)


def _bags(seed=1, n=23, offsets=(0, 0, 4, 5, 5, 12, 22)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, N_ROWS, (n,), generator=g), torch.tensor(offsets)


OFFSETS = (0, 0, 4, 5, 5, 12, 22)   # empty bags first, between and at the end: bags of 0, 4, 1, 0, 7, 10, 1 rows
CASES = {  # name: (kwargs besides input, weight, offsets)
    "sum": dict(mode="sum"),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
    "sum padding": dict(mode="sum", padding_idx=3),
    "mean padding": dict(mode="mean", padding_idx=-7),
    "max padding": dict(mode="max", padding_idx=16),
    "per sample weights": dict(mode="sum", per_sample_weights=True),
    "per sample weights padding": dict(mode="sum", per_sample_weights=True, padding_idx=5),
    "include last offset": dict(mode="mean", include_last_offset=True, offsets=(*OFFSETS, 23)),
}
# One rounding of the fp32 (fp64) accumulation to the output dtype, against torch's op run in fp64 on the same
# (rounded) inputs: the oracle is exact to well below these.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11}


def _call(fn, case, table, dtype=torch.float64, int32=False, compute=None):
    """fn(input, weight, offsets, **the case's arguments), weight and weights rounded to dtype, computed in
    `compute` (default: dtype)."""
    kwargs = dict(CASES[case])
    input, offsets = _bags(offsets=kwargs.pop("offsets", OFFSETS))
    if int32:
        input, offsets = input.int(), offsets.int()
    if kwargs.pop("per_sample_weights", False):
        kwargs["per_sample_weights"] = torch.linspace(-1, 2, input.numel()).to(dtype).to(compute or dtype)
    return fn(input, table.to(dtype).to(compute or dtype), offsets, **kwargs)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_matches_torch(case, dtype, table):
    ours = _call(embedding_bag, case, table, dtype)
    assert ours.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(ours.double(), _call(F.embedding_bag, case, table, dtype, compute=torch.float64),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_reference_path_matches_torch(case, dtype, table):
    # the PyTorch-ops path (fp64 tables on a GPU, include_last_offset in fp64; the backward's bag assignment)
    def reference(input, weight, offsets, mode="mean", per_sample_weights=None, padding_idx=None,
                  include_last_offset=False):
        padding = -1 if padding_idx is None else padding_idx % N_ROWS
        return bags.reference_bags(input, offsets, weight, per_sample_weights, bags.MODES[mode], padding,
                                   include_last_offset)

    tol = TOLERANCE[dtype]
    torch.testing.assert_close(_call(reference, case, table, dtype).double(),
                               _call(F.embedding_bag, case, table, dtype, compute=torch.float64), rtol=tol, atol=tol)


def test_padding_cases_have_padding_entries():
    input, _ = _bags()
    for case, kwargs in CASES.items():
        if "padding_idx" in kwargs:
            assert (input == kwargs["padding_idx"] % N_ROWS).any(), case


def test_include_last_offset_ends_the_last_bag_at_the_last_offset(table):
    # offsets[-1] < len(input): entries from offsets[-1] on are in no bag (the CSR meaning torch documents, and
    # what its fp32 CPU path does; its fp64 path reads on to the end of the input)
    input, offsets = torch.arange(10), torch.tensor([0, 2, 4])
    expected = torch.stack([table[0:2].sum(0), table[2:4].sum(0)])
    ours = embedding_bag(input, table, offsets, mode="sum", include_last_offset=True)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(embedding_bag(input, table.float(), offsets, mode="sum", include_last_offset=True),
                               F.embedding_bag(input, table.float(), offsets, mode="sum", include_last_offset=True))


def test_int32_indices_two_d_input_and_default_mode(table):
    assert torch.equal(_call(embedding_bag, "mean", table, int32=True), _call(F.embedding_bag, "mean", table))
    two_d = torch.randint(0, N_ROWS, (5, 4))
    assert torch.equal(embedding_bag(two_d, table), F.embedding_bag(two_d, table))  # mode "mean", torch's default
    psw = torch.rand(5, 4, dtype=torch.float64)
    assert torch.equal(embedding_bag(two_d, table, mode="sum", per_sample_weights=psw),
                       F.embedding_bag(two_d, table, mode="sum", per_sample_weights=psw))


def test_non_contiguous_inputs(table):
    psw = torch.rand(60, dtype=torch.float64)[::3]          # strided per-sample weights
    assert torch.equal(embedding_bag(torch.arange(20), table, torch.tensor([0, 7]), mode="sum", per_sample_weights=psw),
                       F.embedding_bag(torch.arange(20), table, torch.tensor([0, 7]), mode="sum",
                                       per_sample_weights=psw))
    wide = torch.randn(N_ROWS, 2 * DIM, dtype=torch.float64)
    weight = wide[:, ::2]                                   # strided columns
    input = torch.randint(0, N_ROWS, (40,))[::2]            # strided indices
    offsets = torch.tensor([0, 3, 3, 7, 7, 7, 15])
    two_d = torch.randint(0, N_ROWS, (4, 6)).t()            # a transposed bag matrix
    for mode in ("sum", "mean", "max"):
        assert torch.equal(embedding_bag(input, weight, offsets, mode=mode),
                           F.embedding_bag(input, weight, offsets, mode=mode))
        assert torch.equal(embedding_bag(two_d, weight.t().contiguous().t(), mode=mode),
                           F.embedding_bag(two_d, weight, mode=mode))


def test_empty_shapes(table):
    empty = torch.zeros(0, dtype=torch.int64)
    for input, offsets, kwargs in [(empty, torch.tensor([0, 0]), {}),
                                   (empty, torch.tensor([0]), dict(include_last_offset=True)),
                                   (torch.zeros(0, 3, dtype=torch.int64), None, {})]:
        ours, theirs = embedding_bag(input, table, offsets, **kwargs), F.embedding_bag(input, table, offsets, **kwargs)
        assert ours.shape == theirs.shape and torch.equal(ours, theirs)
    # indices but no offsets: no bag. (torch 2.13's own CPU op reads out of bounds here and can crash, so the
    # oracle is the shape its documentation gives: (0, embedding_dim).)
    assert embedding_bag(torch.tensor([1, 2]), table, empty).shape == (0, DIM)


def _error(fn, *args, **kwargs):
    """(exception type, first line of its message): torch appends a tensor's repr to some messages."""
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return type(info.value), str(info.value).splitlines()[0]


BAD_CALLS = {  # name: (input, weight, offsets, kwargs), the weight given as a shape or a tensor
    "index too large": ([1, 20], (N_ROWS, DIM), [0], {}),
    "negative index": ([1, -1, 2], (N_ROWS, DIM), [0], {}),
    "first offset not 0": ([1, 2, 3], (N_ROWS, DIM), [1, 2], {}),
    "last offset past the input": ([1, 2, 3], (N_ROWS, DIM), [0, 4], {}),
    "last offset past the input, last included": ([1, 2, 3], (N_ROWS, DIM), [0, 2, 5],
                                                  dict(include_last_offset=True)),
    "float indices": (torch.tensor([1.0, 2.0]), (N_ROWS, DIM), [0], {}),
    "float offsets": ([1, 2], (N_ROWS, DIM), torch.tensor([0.0]), {}),
    "int16 indices": (torch.tensor([1, 2], dtype=torch.int16), (N_ROWS, DIM), torch.tensor([0], dtype=torch.int16),
                      {}),
    "integer weight": ([1, 2], torch.ones(N_ROWS, DIM, dtype=torch.int64), [0], {}),
    "1-D weight": ([1, 2], (N_ROWS,), [0], {}),
    "3-D input": (torch.zeros(1, 2, 2, dtype=torch.int64), (N_ROWS, DIM), None, {}),
    "2-D input with offsets": (torch.zeros(2, 2, dtype=torch.int64), (N_ROWS, DIM), [0, 2], {}),
    "1-D input without offsets": ([1, 2], (N_ROWS, DIM), None, {}),
    "2-D offsets": ([1, 2], (N_ROWS, DIM), torch.tensor([[0]]), {}),
    "bad mode": ([1, 2], (N_ROWS, DIM), [0], dict(mode="min")),
    "weights with mean": ([1, 2], (N_ROWS, DIM), [0], dict(mode="mean", per_sample_weights=torch.ones(2))),
    "weights with max": ([1, 2], (N_ROWS, DIM), [0], dict(mode="max", per_sample_weights=torch.ones(2))),
    "weights of another shape": ([1, 2], (N_ROWS, DIM), [0], dict(mode="sum", per_sample_weights=torch.ones(3))),
    "weights of another dtype": ([1, 2], (N_ROWS, DIM), [0],
                                 dict(mode="sum", per_sample_weights=torch.ones(2, dtype=torch.float64))),
    "padding index too large": ([1, 2], (N_ROWS, DIM), [0], dict(padding_idx=N_ROWS)),
    "padding index too small": ([1, 2], (N_ROWS, DIM), [0], dict(padding_idx=-N_ROWS - 1)),
    "no offsets, last included": ([1, 2], (N_ROWS, DIM), torch.zeros(0, dtype=torch.int64),
                                  dict(include_last_offset=True)),
}


def _tensors(input, weight, offsets):
    input = torch.tensor(input) if isinstance(input, list) else input
    weight = torch.randn(*weight) if isinstance(weight, tuple) else weight
    offsets = torch.tensor(offsets) if isinstance(offsets, list) else offsets
    return input, weight, offsets


@pytest.mark.parametrize("name", BAD_CALLS)
def test_errors_are_torchs(name):
    input, weight, offsets, kwargs = BAD_CALLS[name]
    input, weight, offsets = _tensors(input, weight, offsets)
    theirs = _error(F.embedding_bag, input, weight, offsets, **kwargs)
    assert _error(embedding_bag, input, weight, offsets, **kwargs) == theirs


def test_tensors_on_another_device_are_a_clear_error(table):
    with pytest.raises(RuntimeError, match="offsets is on meta and weight on cpu"):
        embedding_bag(torch.tensor([1, 2]), table, torch.tensor([0], device="meta"))


def test_decreasing_offsets_are_a_clear_error(table):
    with pytest.raises(RuntimeError, match="non-decreasing"):
        embedding_bag(torch.tensor([1, 2, 3, 4]), table, torch.tensor([0, 3, 2]))


def test_unchecked_call_still_fails_clearly_on_the_cpu(table):
    # check_indices=False skips the wrapper's data checks (for GPU speed); on the CPU torch's op (or the
    # reference's indexing, in fp64 with include_last_offset) still refuses the index
    with pytest.raises(RuntimeError, match="99"):
        embedding_bag(torch.tensor([1, 99]), table, torch.tensor([0]), check_indices=False)
    with pytest.raises(IndexError, match="99"):
        embedding_bag(torch.tensor([1, 99]), table, torch.tensor([0, 2]), include_last_offset=True,
                      check_indices=False)


def _bag_by_bag(input, weight, offsets, mode="sum", per_sample_weights=None, padding_idx=None,
                include_last_offset=False):
    """The gradient oracle: each bag summed or averaged by plain indexing, differentiated by autograd."""
    ends = [*offsets[1:].tolist(), *([] if include_last_offset else [input.numel()])]
    bags = []
    for start, end in zip(offsets.tolist(), ends):
        keep = [j for j in range(start, end) if padding_idx is None or input[j] != padding_idx % weight.size(0)]
        rows = weight[input[keep]]
        if per_sample_weights is not None:
            rows = rows * per_sample_weights[keep, None]
        bags.append(rows.sum(0) / (max(len(keep), 1) if mode == "mean" else 1))
    return torch.stack(bags)


@pytest.mark.parametrize("case", ["sum", "mean", "sum padding", "mean padding", "per sample weights",
                                  "per sample weights padding", "include last offset", "include last offset short"])
def test_gradients_match_autograd(case, table):
    kwargs = dict(CASES.get(case, dict(mode="sum", include_last_offset=True, offsets=(0, 3, 9))))
    input, offsets = _bags(offsets=kwargs.pop("offsets", OFFSETS))
    grads = []
    for fn in (embedding_bag, _bag_by_bag):
        weight = table.clone().requires_grad_()
        psw = None
        if kwargs.get("per_sample_weights") is not None:
            psw = kwargs["per_sample_weights"] = torch.linspace(-1, 2, input.numel(),
                                                                dtype=torch.float64).requires_grad_()
        out = fn(input, weight, offsets, **kwargs)
        out.backward(torch.arange(out.numel(), dtype=torch.float64).reshape(out.shape) / 7)
        grads.append((weight.grad, None if psw is None else psw.grad))
    (ours_w, ours_p), (theirs_w, theirs_p) = grads
    torch.testing.assert_close(ours_w, theirs_w, rtol=1e-12, atol=1e-12)
    if theirs_p is not None:
        torch.testing.assert_close(ours_p, theirs_p, rtol=1e-12, atol=1e-12)


def test_gradients_match_torch(table):
    input, offsets = _bags()
    grads = []
    for fn in (embedding_bag, F.embedding_bag):
        weight = table.clone().requires_grad_()
        psw = torch.linspace(-1, 2, input.numel(), dtype=torch.float64).requires_grad_()
        fn(input, weight, offsets, mode="sum", per_sample_weights=psw, padding_idx=4).square().sum().backward()
        grads += [weight.grad, psw.grad]
    for ours, theirs in zip(grads[:2], grads[2:]):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_max_backward_is_a_clear_error(table):
    out = embedding_bag(torch.tensor([1, 2]), table.clone().requires_grad_(), torch.tensor([0]), mode="max")
    with pytest.raises(NotImplementedError, match="mode 'sum' and 'mean'"):
        out.sum().backward()


def test_policy_is_validated(table):
    input, offsets = _bags()
    expected = F.embedding_bag(input, table, offsets, mode="sum")
    for policy in ("auto", "plain"):
        assert torch.equal(embedding_bag(input, table, offsets, mode="sum", policy=policy), expected)
    # every placement policy is accepted; on the CPU torch's op runs whatever the policy
    assert torch.equal(embedding_bag(input, table, offsets, mode="sum", policy="partition_queues"), expected)
    with pytest.raises(ValueError, match="policy must be one of"):
        embedding_bag(input, table, offsets, policy="fastest-ever")


def test_opcheck():
    input, offsets = _bags()
    weight = torch.randn(N_ROWS, DIM, requires_grad=True)
    psw = torch.rand(input.numel(), requires_grad=True)
    op = torch.ops.torch_l2topo.embedding_bag.default
    for args in [(input, offsets, weight, None, 1, -1, False, False, "auto"),
                 (input, offsets, weight, psw, 0, 3, False, False, "plain"),
                 (input, offsets[:4], weight.detach(), None, 2, -1, True, False, "auto")]:  # max: no backward
        torch.library.opcheck(op, args)


def test_compiles_with_fullgraph(table):
    weight = table.float().requires_grad_()

    def step(input, offsets, psw):
        return embedding_bag(input, weight, offsets, mode="sum", per_sample_weights=psw).square().sum()

    input, offsets = _bags()
    psw = torch.rand(input.numel())
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(input, offsets, psw)
    loss.backward()
    grad, weight.grad = weight.grad, None
    expected = F.embedding_bag(input, weight, offsets, mode="sum", per_sample_weights=psw).square().sum()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, weight.grad)


OPS_RUNS = Path(__file__).resolve().parent / "data" / "ops"
EAGER_RUNS = Path(__file__).resolve().parent / "data" / "eager_kernel"
TORCH, CPP = "F.embedding_bag", "eager C++"
# H200 runs each estimate was not fitted to (the fits: the fp32 "sum" rows of fit_eager_rule.IMPLS' runs), as
# (implementation, runs, rows kept); where the rule sends calls is tested on runs whose eager rows time all three calls
HELD_OUT = {
    "torch's op, full grid, bf16 rows": (TORCH, fit_rule.IMPLS[TORCH][1], lambda row: row["dtype"] == "bfloat16"),
    "torch's op, default grid, H200 87d6e450cf88": (TORCH, [OPS_RUNS / "ops_h200_87d6e450cf88_one_call_graphs.json"],
                                                    None),
    "torch's op, default grid, H200 2b3b032d25ac": (TORCH, [OPS_RUNS / "ops_h200.json"], None),
    "torch's op, default grid, H200 f8be5465b3a1": (
        TORCH, [OPS_RUNS / "ops_h200_f8be5465b3a1_before_torch_op_rule.json"], None),
    "C++ kernel, bf16, mean and max rows": (
        CPP, fit_rule.IMPLS[CPP][1], lambda row: (row["dtype"], row["mode"]) != ("float32", "sum")),
    "C++ kernel, another H200": (CPP, [EAGER_RUNS / "eager_kernel_h200_held_out.json"], None),
    "C++ kernel, a third H200, graphs of 20 calls": (CPP, [EAGER_RUNS / "eager_kernel_h200_graph20.json"], None),
}


def _estimate(terms: tuple, eager: dict, l2: int) -> float:
    itemsize = torch.finfo(getattr(torch, eager["dtype"])).bits // 8
    row_bytes = eager["dim"] * itemsize
    return eager_ext.gpu_us(terms, eager["bag"] * eager["batch"], eager["batch"], row_bytes, eager["rows"] * row_bytes,
                             l2)


@pytest.mark.parametrize("impl", list(fit_rule.IMPLS))
def test_eager_rule_estimates_are_the_documented_fits(impl):
    # the constants are what benchmarks/fit_eager_rule.py fits, and gpu_us is the fit's own sum of terms
    name, runs = fit_rule.IMPLS[impl]
    rows = fit_rule.fitted_rows(impl)
    assert len(rows) >= 60
    terms = getattr(eager_ext, name)
    assert fit_rule.fit(rows, impl) == pytest.approx(terms, rel=5e-3)
    for eager, _, l2 in fit_rule.shape_rows(runs):
        assert _estimate(terms, eager, l2) == pytest.approx(
            sum(c * t for c, t in zip(terms, fit_rule.features(eager, l2))))


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_eager_rule_against_h200_runs_it_was_not_fitted_to(name):
    # A call the rule sends to an eager launch must not be one that the call it displaces ran clearly faster: its
    # p80 more than 2% under the launch's p20 (the eager rows are host-bound, and the host's time moves within a
    # run). Torch's op (until the C++ kernel is built) displaces the Triton kernel's call; the C++ kernel displaces
    # torch's op, the call users would make instead (its rival, the Triton call, is the next test's). The estimate
    # stays within 2x of the launch's measured CUDA-graph time (or 10 us: the fit has no launch floor).
    impl, paths, kept = HELD_OUT[name]
    terms = getattr(eager_ext, fit_rule.IMPLS[impl][0])
    displaced = "plain" if impl == TORCH else TORCH
    sent = []
    for eager, graph, l2 in fit_rule.shape_rows(paths):
        if kept is not None and not kept(eager):
            continue
        estimate = _estimate(terms, eager, l2)
        times = eager["impl"]
        if estimate < bags.EAGER_BELOW_US and eager["mode"] in bags.MODES and "plain" in times:
            sent.append(eager["batch"])
            assert not times[displaced]["p80"] * 1.02 < times[impl]["p20"], eager
        measured_us = fit_rule.measured_us(graph, impl)
        assert estimate / 2 - 10 < measured_us < 2 * estimate + 10, (eager, estimate, measured_us)
    if impl == TORCH or kept is None:  # each such run times small calls eagerly, so the rule was exercised
        assert len(sent) >= 2


def test_the_cpp_kernels_line_beats_torchs_line_on_a_run_neither_was_fitted_to():
    # The two lines the rule could draw once the C++ kernel is built: on its own estimated time (the rule) or on
    # torch's (the rule before it). On the held-out run, each line's choice per shape (the C++ call or the Triton
    # call, timed side by side): the rule's choices take less time in all, and lose less to torch's op at worst.
    # (Torch's line kept 65,536 bags of 2 and 4 rows on a Triton call of 74-78 us where the C++ call took 25-31.)
    chosen = {name: [] for name in ("C++ line", "torch's line")}
    for eager, _, l2 in fit_rule.shape_rows([EAGER_RUNS / "eager_kernel_h200_held_out.json"]):
        times = eager["impl"]
        for name, terms in (("C++ line", eager_ext.EAGER_KERNEL_US), ("torch's line", eager_ext.TORCH_OP_US)):
            call = CPP if _estimate(terms, eager, l2) < bags.EAGER_BELOW_US else "plain"
            chosen[name].append((times[call]["p50"], times[call]["p50"] / times[TORCH]["p50"]))
    total = {name: sum(t for t, _ in picks) for name, picks in chosen.items()}
    worst = {name: max(r for _, r in picks) for name, picks in chosen.items()}
    assert total["C++ line"] < total["torch's line"] and worst["C++ line"] < worst["torch's line"], (total, worst)


def test_tables_beyond_the_l2_cost_torch_more_and_the_cpp_kernel_takes_their_calls():
    # the fp32 calls an earlier fit of torch's time sent to torch's op although the Triton kernel ran them
    # 1.66-1.83x faster: 1,024 bags of 256 rows from 256 MB and 4 GB tables (76-80 us on the GPU for torch, 42-48 us
    # our whole call). Torch's estimate keeps them off torch's op; the C++ kernel's line takes them (34-35 us on the
    # GPU: tests/data/eager_kernel/eager_kernel_h200.json).
    for table_mb in (256, 4096):
        call = (256 * 1024, 1024, 256, table_mb << 20)
        assert eager_ext.gpu_us(eager_ext.TORCH_OP_US, *call, 60 << 20) >= bags.EAGER_BELOW_US
        # the same call on a GPU whose L2 holds the table: no DRAM term
        assert eager_ext.gpu_us(eager_ext.TORCH_OP_US, *call, 8 << 30) < 65
        assert eager_ext.gpu_us(eager_ext.EAGER_KERNEL_US, *call, 60 << 20) < bags.EAGER_BELOW_US


def test_the_cpp_kernels_line_takes_short_bags_torchs_line_left_to_the_triton_kernel():
    # 65,536 bags of 2 and 4 rows of 256 bytes from a 16 MB table: torch's op took 53-67 us on the GPU, the C++
    # kernel 24-31 us and its call 25-31 us, the Triton kernel's eager call 40-80 us (module doc)
    for rows_per_bag in (2, 4):
        call = (rows_per_bag * 65536, 65536, 256, 16 << 20, 60 << 20)
        assert eager_ext.gpu_us(eager_ext.TORCH_OP_US, *call) >= bags.EAGER_BELOW_US
        assert eager_ext.gpu_us(eager_ext.EAGER_KERNEL_US, *call) < bags.EAGER_BELOW_US
    # the target shape (65,536 bags of 32 rows) stays on the Triton kernel under either line
    target = (32 * 65536, 65536, 256, 16 << 20, 60 << 20)
    assert min(eager_ext.gpu_us(t, *target) for t in (eager_ext.TORCH_OP_US, eager_ext.EAGER_KERNEL_US)) > 100


def test_a_frozen_parameter_is_called_directly_like_a_plain_tensor():
    # nn.Parameter disables __torch_function__: calling the op's body does what the dispatcher would do, so a
    # module's frozen table (or any table under no_grad) skips the dispatcher; one that needs a graph does not
    from torch_l2topo.ops.policy import direct_call

    table = torch.randn(10, 4)
    frozen = torch.nn.Parameter(table, requires_grad=False)
    trained = torch.nn.Parameter(table.clone())
    assert direct_call(table, None) and direct_call(frozen, None) and not direct_call(trained, None)
    with torch.no_grad():
        assert direct_call(trained, None)

    class Subclass(torch.Tensor):
        pass

    assert not direct_call(table.as_subclass(Subclass), None)  # a subclass may override what ops do
