"""The ops' Triton kernels without a GPU: they compile for sm_90 with the loads they were designed around (16-byte
vector loads of embedding rows and of tree node records), the host's tile and work-split choices hold their
bounds, and in Triton's interpreter each kernel matches an independent oracle (torch's embedding_bag in fp64;
xgboost's recorded margins and scikit-learn's predict_proba) on the cases that exercise its masks: empty bags,
padding, per-sample weights, include_last_offset, strided tables, bags longer than a tile, out-of-range entries,
a single sample, tree chunks.

On CI (CI=true) a missing Triton is a failure, not a skip (as in test_placement_kernels_compile.py).
"""
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kernel_compile import sm90_ptx

try:
    import triton
    import triton.language as tl
except ImportError:  # the tests that need it skip (or fail on CI) on their own
    triton = None

ROOT = Path(__file__).resolve().parents[1]
XGBOOST = ROOT / "tests" / "data" / "xgboost"
VECTOR_LOAD = re.compile(r"ld\.global[\w.]*\.v4\.b32")
ATOMIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:atom|red)\.", re.M)
bags = importlib.import_module("torch_l2topo.ops.embedding_bag")
forests = importlib.import_module("torch_l2topo.ops.forest_predict")


def _compile(kernel, types: dict, constexprs: dict, aligned: tuple, num_warps: int, options: dict = None):
    """The kernel's PTX for sm_90; `aligned` arguments specialised as multiples of 16 (as Triton does at launch
    for 16-byte aligned pointers and integers divisible by 16); `options` as a launch passes them."""
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return sm90_ptx(kernel, signature, constexprs, num_warps, attrs, options)


ROW_TYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
BAG_TYPES = dict(input_ptr="*i64", offsets_ptr="*i64", weight_ptr="*fp32", psw_ptr="*fp32", out_ptr="*fp32",
                 n_bags="i32", n_indices="i64", n_offsets="i32", n_rows="i32", dim="i32", stride_w="i32",
                 padding_idx="i32", plan_ptr="*i32", state_ptr="*i64")


FOREST_TYPES = dict(nodes_ptr="*i32", values_ptr="*fp32", roots_ptr="*i32", groups_ptr="*i32", base_ptr="*fp32",
                    x_ptr="*fp32", out_ptr="*fp32", partial_ptr="*fp32", counts_ptr="*i32", scale="fp32",
                    sm_part_ptr="*i32", plan_ptr="*i32",
                    state_ptr="*i64", **{n: "i32" for n in ("n_samples", "n_features", "n_trees", "trees_per_chunk",
                                                            "n_chunks", "depth", "n_outputs", "leaf_width", "n_sm")})


# every row type and size with per-sample weights (sum), the other modes on the target shape
KERNEL_CASES = [(t, b, 0) for t in ROW_TYPES for b in (32, 256, 1024)] + [("fp32", 256, 1), ("fp32", 256, 2)]


@pytest.mark.parametrize("row_type,row_bytes,mode", KERNEL_CASES)
def test_embedding_bag_kernel_loads_rows_in_16_byte_vectors(row_type, row_bytes, mode):
    from torch_l2topo.triton_kernels.embedding_bag import embedding_bag_kernel

    dim = row_bytes // ROW_TYPES[row_type]
    rows, block_d, num_warps = bags.tile_config(65536 * 32, 65536, dim, ROW_TYPES[row_type])
    group = bags.bags_per_program(65536, rows, block_d, ROW_TYPES[row_type])  # 8 bags of 32-byte rows, else 1
    ptx = _compile(embedding_bag_kernel, BAG_TYPES | dict(weight_ptr=f"*{row_type}", psw_ptr=f"*{row_type}",
                                                           out_ptr=f"*{row_type}"),
                   dict(MODE=mode, HAS_PSW=mode == 0, CHECK=True, ROWS=rows, BAGS=group, BLOCK_D=block_d, PLACE=0),
                   ("input_ptr", "offsets_ptr", "weight_ptr", "psw_ptr", "out_ptr", "dim", "stride_w"), num_warps)
    # every row element of the tile arrives through 16-byte loads: elements per thread / (16 B / element size)
    per_thread = group * rows * block_d // (32 * num_warps)
    assert len(VECTOR_LOAD.findall(ptx)) == max(1, per_thread * ROW_TYPES[row_type] // 16), ptx.count("ld.global")
    # the plain launch (PLACE_DIRECT) reads no plan and makes no atomic
    assert not ATOMIC.search(ptx)


def test_the_checked_kernel_asserts_its_checks_and_nothing_else():
    # What the op launches when checking (CHECK, debug=True, sanitize_overflow=False) calls __assertfail for the
    # two checks alone; without debug=True Triton drops the asserts; debug alone would add overflow asserts on
    # the index arithmetic (what sanitize_overflow=False keeps out)
    from torch_l2topo.triton_kernels.embedding_bag import embedding_bag_kernel

    rows, block_d, num_warps = bags.tile_config(65536 * 32, 65536, 64, 4)

    def asserts(check: bool, **options) -> int:
        ptx = _compile(embedding_bag_kernel, BAG_TYPES, dict(MODE=0, HAS_PSW=False, CHECK=check, ROWS=rows, BAGS=1,
                                                             BLOCK_D=block_d, PLACE=0),
                       ("input_ptr", "offsets_ptr", "weight_ptr", "out_ptr", "dim", "stride_w"), num_warps, options)
        return len(re.findall(r"call(?:\.uni)?\s+__assertfail", ptx))

    launched = asserts(True, debug=True, sanitize_overflow=False)
    assert launched >= 2 and asserts(True) == 0 and asserts(False, debug=True, sanitize_overflow=False) == 0
    assert asserts(True, debug=True) > launched


def test_embedding_bag_backward_adds_with_atomics_only():
    from torch_l2topo.triton_kernels.embedding_bag import embedding_bag_backward_kernel

    rows, block_d, num_warps = bags.tile_config(65536 * 32, 65536, 64, 4)
    types = dict(BAG_TYPES, grad_ptr="*fp32", grad_weight_ptr="*fp32", grad_psw_ptr="*fp32")
    ptx = _compile(embedding_bag_backward_kernel, types, dict(MEAN=False, HAS_PSW=False, NEED_WEIGHT=True,
                                                              NEED_PSW=False, ROWS=rows, BLOCK_D=block_d),
                   ("input_ptr", "offsets_ptr", "grad_ptr", "grad_weight_ptr", "dim"), num_warps)
    # the gradient elements a thread holds go out as 16-byte vector reductions (Triton 3.9 writes red.add.v4.f32,
    # 3.6 atom.add.v4.f32 with the result unused), and no (entries x dim) intermediate is stored
    vector_adds = re.findall(r"(?:red|atom)\.global[\w.]*\.add\.v4\.f32", ptx)
    assert len(vector_adds) == rows * block_d // (32 * num_warps) // 4
    assert len(ATOMIC.findall(ptx)) == rows * block_d // (32 * num_warps) // 4
    assert not re.search(r"\bst\.global", ptx)


def test_embedding_bag_tiles_keep_rows_in_flight():
    # the H200 target shape: a 32-row bag of 64 fp32 in one step on one warp (the measured fastest), one per program
    assert bags.tile_config(65536 * 32, 65536, 64, 4) == (32, 64, 1)
    assert bags.bags_per_program(65536, 32, 64, 4) == 1
    # short bags share a program up to a full tile, while the launch keeps MIN_PROGRAMS programs
    assert bags.bags_per_program(16384, 4, 32, 4) == 16 and bags.bags_per_program(65536, 1, 64, 4) == 32
    assert bags.bags_per_program(2048, 1, 64, 4) == 2 and bags.bags_per_program(1, 1, 64, 4) == 1
    for n_bags, rows, block_d, itemsize in [(10 ** 6, 1, 8, 2), (5000, 2, 64, 4), (3, 1, 1024, 4)]:
        group = bags.bags_per_program(n_bags, rows, block_d, itemsize)
        assert group & (group - 1) == 0 and group * rows * block_d * itemsize <= max(bags.TILE_BYTES,
                                                                                      rows * block_d * itemsize)
        assert group == 1 or n_bags // group >= bags.MIN_PROGRAMS
    # tiles are counted in bytes: the bf16 rows of 256 B of the table also take a 32-row bag in one step
    assert bags.tile_config(65536 * 32, 65536, 128, 2) == (32, 128, 1)
    for n_indices, n_bags, dim in [(1, 1, 8), (65536, 65536, 8), (10 ** 6, 10, 256), (256, 1, 512), (5, 4, 33)]:
        for itemsize in (2, 4):
            rows, block_d, num_warps = bags.tile_config(n_indices, n_bags, dim, itemsize)
            assert block_d >= dim and block_d & (block_d - 1) == 0 and rows & (rows - 1) == 0
            assert rows * block_d * itemsize <= max(bags.TILE_BYTES, block_d * itemsize)
            assert 1 <= num_warps <= bags.MAX_WARPS


def test_forest_kernel_walks_with_one_record_load_per_step():
    from torch_l2topo.triton_kernels.forest import forest_kernel

    for block_s, vector_leaves, replicas in ((32, False, 1), (1, False, 1), (8, True, 1), (32, False, 2)):
        constexprs = dict(BLOCK_S=block_s, BLOCK_T=forests.LANES // block_s, OUT_PAD=4, VECTOR_LEAVES=vector_leaves,
                          REPLICAS=replicas, PLACE=0, SUM_CHUNKS=8, LINK=forests.LINKS["identity"])
        ptx = _compile(forest_kernel, FOREST_TYPES, constexprs, ("nodes_ptr", "values_ptr", "x_ptr", "out_ptr"), 4)
        assert len(VECTOR_LOAD.findall(ptx)) == 1  # the 16-byte node record, once per step
        # per-partition copies read the SM's copy once (%smid); one copy reads no SM id at all
        assert ptx.count("%smid") == (1 if replicas == 2 else 0)
        # the chunk count, the only atomic of a plain launch: one acq_rel add after a CTA barrier, and the last
        # chunk's reads of the partial sums past L1
        atomics = ATOMIC.findall(ptx)
        assert len(atomics) == 1 and re.search(r"atom\.[\w.]*acq_rel[\w.]*\.add", ptx), atomics
        assert re.search(r"bar\.sync[^\n]*\n(?:(?!ld\.global|st\.global)[^\n]*\n)*?[^\n]*atom\.", ptx)
        assert re.search(r"ld\.global\.cg", ptx)
        assert "setp.nan.f32" in ptx and "setp.le.f32" in ptx  # NaN goes its default way; x <= threshold
        assert not re.search(r"setp\.[\w.]*ftz", ptx)  # no flush to zero: thresholds next to 0 are denormals


def test_forest_links_compile_and_match_the_host_codes():
    # the kernel's LINK codes are the host's (LINKS, in Forest's TRANSFORMS order), and each link compiles into the
    # kernel's store: the exponential of sigmoid, softmax and exp (ex2 in PTX), none for identity
    from torch_l2topo.triton_kernels import forest as kernels
    from torch_l2topo.triton_kernels.forest import forest_kernel

    assert {name: getattr(kernels, f"LINK_{name.upper()}").value for name in forests.LINKS} == forests.LINKS
    for name, code in forests.LINKS.items():
        constexprs = dict(BLOCK_S=1, BLOCK_T=forests.LANES, OUT_PAD=4, VECTOR_LEAVES=False, REPLICAS=1, PLACE=0,
                          SUM_CHUNKS=256, LINK=code)
        ptx = _compile(forest_kernel, FOREST_TYPES, constexprs, ("nodes_ptr", "values_ptr", "x_ptr", "out_ptr"), 4)
        assert ("ex2.approx" in ptx) == (name != "identity"), name


def test_forest_work_split():
    for n, n_trees, n_sm in [(1, 2000, 132), (7, 10, 132), (1024, 500, 132), (10 ** 6, 2000, 132), (3, 1, 1)]:
        block_s, block_t, n_blocks, n_chunks, per_chunk = forests.work_split(n, n_trees, n_sm)
        assert block_s * block_t == forests.LANES and n_blocks * block_s >= n
        assert per_chunk % block_t == 0 and (n_chunks - 1) * per_chunk < n_trees <= n_chunks * per_chunk
    # batch 1 on an H200: trees cut into ITEMS_PER_SM items per SM; a large batch: one chunk
    assert forests.work_split(1, 2000, 132)[3] == -(-2000 // forests.LANES)  # 16: one tile each, fewer than 8 x 132
    wanted = forests.ITEMS_PER_SM * 132  # whole tiles per chunk: at most this many chunks, at least half
    assert wanted / 2 < forests.work_split(1, 10 ** 6, 132)[3] <= wanted
    assert forests.work_split(10 ** 6, 2000, 132)[3] == 1


# ---- the kernels in Triton's interpreter ---------------------------------------------------------------------
# The interpreter is chosen when @triton.jit runs (TRITON_INTERPRET=1), so this runs in a subprocess. The op
# dispatches to Triton on CUDA tensors only, so the host launchers are called directly with CPU tensors.

def _interpreter_embedding_bag():
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    wide = torch.randn(50, 40)
    cases = [  # (weight, input, offsets, mode, psw, padding, include_last_offset)
        (wide[:, :24], torch.randint(0, 50, (40,)), [0, 0, 3, 10, 10, 25, 39], "sum", True, 5, False),
        (wide, torch.randint(0, 50, (40,)), [0, 0, 3, 10, 10, 25, 39], "mean", False, 7, False),
        (wide, torch.randint(0, 50, (40,)), [0, 3, 3, 40], "max", False, 2, True),
        (wide[:, :8], torch.randint(0, 50, (300,)), [0, 299], "mean", False, -1, False),  # bags longer than a tile
        (wide[:, :33], torch.randint(0, 50, (9,)).int(), [0, 1, 1, 5], "sum", False, -1, False),
    ]
    # each case one bag per program (the default here) and 4 (bags of unequal lengths in one tile, a last group
    # that the bags do not fill)
    for dtype, group in ((torch.float32, 1), (torch.float32, 4), (torch.bfloat16, 1), (torch.float16, 4)):
        for weight, input, offsets, mode, with_psw, padding, last in cases:
            weight = weight.to(dtype)
            offsets = torch.tensor(offsets, dtype=input.dtype)
            psw = torch.rand(input.numel()).to(dtype) if with_psw else None
            n_bags = offsets.numel() - 1 if last else offsets.numel()
            out = torch.empty(n_bags, weight.size(1), dtype=dtype)
            bags.launch_kernel(input, offsets, weight, psw, out, False, bags.MODES[mode],
                               padding % 50 if padding >= 0 else -1, "plain", bags=group)
            expected = F.embedding_bag(input, weight.double(), offsets, mode=mode, include_last_offset=last,
                                       per_sample_weights=None if psw is None else psw.double(),
                                       padding_idx=None if padding < 0 else padding)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
    # out-of-range entries are skipped, never read; checked, they and invalid offsets fail the kernel's assert
    # (the interpreter raises an AssertionError with the kernel's message). The interpreter ignores the
    # launch's debug=True, which on a GPU compiles the assert in: its builder's own option turns asserts on.
    import dataclasses

    from triton.runtime.interpreter import interpreter_builder

    interpreter_builder.options = dataclasses.replace(interpreter_builder.options, debug=True)
    weight, input = wide, torch.tensor([1, 99, 2, -3, 4])
    out = torch.empty(2, 40)
    bags.launch_kernel(input, torch.tensor([0, 3]), weight, None, out, False, bags.MODES["mean"], -1, "plain")
    torch.testing.assert_close(out, torch.stack([(weight[1] + weight[2]) / 2, weight[4]]))
    for offsets, group in (([0, 3], 1), ([0, 3], 4), ([0, 0], 1), ([1, 3], 2), ([0, 4, 3], 1), ([0, 4, 3], 4),
                           ([0, 6], 2)):  # a bad index; first offset; decreasing; past the end
        try:
            bags.launch_kernel(input, torch.tensor(offsets), weight, None, torch.empty(len(offsets), 40), True,
                               bags.MODES["mean"], -1, "plain", bags=group)
        except Exception as exc:  # the interpreter wraps the AssertionError in an InterpreterError
            assert "AssertionError" in repr(exc) and "embedding_bag: an index is outside" in str(exc), exc
        else:
            raise AssertionError(f"offsets {offsets}, {group} bags per program: the checked kernel did not assert")
    for offsets in ([0, 2], [0, 0, 2, 5]):  # valid: empty bags, the last offset at the input's end
        for group in (1, 4):
            bags.launch_kernel(torch.tensor([1, 2, 3, 4, 5]), torch.tensor(offsets), weight, None,
                               torch.empty(len(offsets), 40), True, bags.MODES["sum"], -1, "plain", bags=group)


def _interpreter_embedding_bag_backward():
    import torch
    import torch.nn.functional as F

    torch.manual_seed(1)
    input = torch.randint(0, 30, (60,))
    offsets = torch.tensor([0, 0, 7, 20, 20, 59])
    for mode, with_psw, padding in (("sum", True, 4), ("mean", False, 9), ("sum", False, -1)):
        weight = torch.randn(30, 24, dtype=torch.float64, requires_grad=True)
        psw = torch.rand(60, dtype=torch.float64, requires_grad=True) if with_psw else None
        out = F.embedding_bag(input, weight, offsets, mode=mode, per_sample_weights=psw,
                              padding_idx=None if padding < 0 else padding)
        grad = torch.randn(out.shape, dtype=torch.float64)
        out.backward(grad)
        got_w, got_p = bags._backward_op(input, offsets, grad.float(), weight.detach().float(),
                                         None if psw is None else psw.detach().float(), 30, bags.MODES[mode],
                                         padding, True, with_psw)
        torch.testing.assert_close(got_w.double(), weight.grad, rtol=1e-5, atol=1e-5)
        if with_psw:
            torch.testing.assert_close(got_p.double(), psw.grad, rtol=1e-5, atol=1e-5)


def _interpreter_forest():
    import torch

    from torch_l2topo.ops import Forest

    cases = (("binary_d6_nan", 1), ("multiclass_d4", 132), ("regression_d9", 4), ("poisson_d5", 4))
    for case, n_sm in cases:
        recorded = np.load(XGBOOST / f"{case}.npz")
        forest = Forest.from_xgboost_json(XGBOOST / f"{case}.json", layout="blocks")
        for n in (1, 37):  # one tree chunk, and several (the last chunk of each block adds them)
            x = torch.from_numpy(recorded["x"][:n])
            args = (forest.nodes, forest.values, forest.roots, forest.groups, forest.base, x, forest.depth, 1.0, n_sm,
                    "plain")
            raw = forests.launch_kernel(*args)
            expected = torch.from_numpy(recorded["margin"][:n]).reshape(raw.shape)
            torch.testing.assert_close(raw, expected, rtol=1e-5, atol=1e-5)  # chunks change the float32 order
            linked = forests.launch_kernel(*args, link=forest.transform)
            linked = linked[:, 0] if forest.squeeze else linked
            torch.testing.assert_close(linked, torch.from_numpy(recorded["prediction"][:n]).float(), rtol=1e-5,
                                       atol=1e-5)
    # there were chunked launches (their counters exist), and each left its block counters at zero for the next
    assert forests._counters and all(int(c.count_nonzero()) == 0 for c in forests._counters.values())
    try:
        from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    except ImportError:
        return
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    model = RandomForestClassifier(n_estimators=9, max_depth=5, random_state=0).fit(x, (x[:, 0] > 0) + (x[:, 1] > 0))
    forest = Forest.from_sklearn(model, layout="dfs").to("cpu")
    mean = forests.launch_kernel(forest.nodes, forest.values.float(), forest.roots, forest.groups,
                                 forest.base.float(), torch.from_numpy(x[:50]), forest.depth, 9.0, 2, "plain")
    np.testing.assert_allclose(mean.numpy(), model.predict_proba(x[:50]), atol=1e-6)
    # the binary pair [1 - p, p] of boosted trees, from one chunk (one sample) and from several
    dense = np.nan_to_num(x)  # scikit-learn's gradient boosting takes no NaN
    boosted = GradientBoostingClassifier(n_estimators=20, max_depth=3, random_state=0).fit(dense, dense[:, 0] > 0)
    pair = Forest.from_sklearn(boosted, layout="dfs")
    assert pair.transform == "sigmoid_pair"
    for n in (1, 50):
        got = forests.launch_kernel(pair.nodes, pair.values.float(), pair.roots, pair.groups, pair.base.float(),
                                    torch.from_numpy(dense[:n]), pair.depth, 1.0, 2, "plain", link="sigmoid_pair")
        np.testing.assert_allclose(got.numpy(), boosted.predict_proba(dense[:n]), atol=1e-6)
    _interpreter_forest_copies(forest, torch.from_numpy(x[:50]), mean)


if triton is not None:
    @triton.jit
    def _stand_in_sm():  # %smid is PTX, which the interpreter cannot run (module level: the jit needs `tl` here)
        return (tl.program_id(0) % 3).to(tl.int64)


def _interpreter_forest_copies(forest, x, expected):
    # per-partition copies (REPLICAS 2), each program on a stand-in SM (program id % 3), the SMs walking copies
    # 0, 1, 1: the one-copy kernel's sums, bit for bit (a column-major roots array once broke exactly this)
    import torch

    import torch_l2topo.triton_kernels.forest as kernels
    from torch_l2topo.ops.forest import replicated_records

    kernels.sm_id = _stand_in_sm
    n_blocks = 3 * -(-forest.nodes.shape[0] // 16) + 8
    homes = np.random.default_rng(3).choice(np.array([0, 1], np.int8), size=n_blocks)
    records, roots = replicated_records(forest.nodes.numpy(), forest.roots.numpy(), homes, n_blocks * 16)
    got = forests.launch_kernel(torch.from_numpy(records), forest.values.float(), torch.from_numpy(roots),
                                forest.groups, forest.base.float(), x, forest.depth, 9.0, 2, "plain",
                                torch.tensor([0, 1, 1], dtype=torch.int32))
    assert torch.equal(got, expected)


def _interpreter_forest_mask():
    # a hand-built forest (no loader checked it) whose root tests feature 5 of rows of 5 features: the x load is
    # masked, so the walk sees 0 and goes left (leaf 1.0), never the 100 stored just past the row (right: 2.0)
    import torch

    threshold = int(np.float32(50).view(np.int32))
    nodes = torch.tensor([[5, threshold, 1, 2], [0, 0, 1, 1], [0, 1, 2, 2]], dtype=torch.int32)
    row = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 100.0]])[:, :5]  # one contiguous row, its buffer one longer
    got = forests.launch_kernel(nodes, torch.tensor([[1.0], [2.0]]), torch.zeros(1, dtype=torch.int32),
                                torch.zeros(1, dtype=torch.int32), torch.zeros(1), row, 1, 1.0, 1, "plain")
    assert got.tolist() == [[1.0]], got


def _interpreter_main():
    _interpreter_embedding_bag()
    _interpreter_embedding_bag_backward()
    _interpreter_forest()
    _interpreter_forest_mask()
    print("interpreter ops ok")


def test_kernels_in_the_triton_interpreter():
    triton = pytest.importorskip("triton")
    if tuple(int(v) for v in re.findall(r"\d+", triton.__version__)[:2]) < (3, 7):
        pytest.skip("Triton < 3.7's interpreter breaks with numpy >= 2.4 (tensor indices); Triton 3.9 runs it")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert out.returncode == 0 and "interpreter ops ok" in out.stdout, out.stdout + out.stderr


if __name__ == "__main__":
    _interpreter_main()
