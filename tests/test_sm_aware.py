"""@sm_aware and the placement launcher without a GPU: kernels written without the helpers are refused at
decoration, the policy choice on recorded-style timings, the auto trial flow, the plan tensor's
growth/capture rule (the refusal of a calibration of another GPU: tests/test_calibration_for.py)."""
import numpy as np
import pytest

from torch_l2topo import PlacementError
from torch_l2topo.placement.slots import MAX_SLOTS, PlanSlot, plan_capacity
from torch_l2topo.placement.sm_aware import (
    DEFAULT_CANDIDATES,
    HIGH_PARALLELISM,
    Placement,
    WorkloadKey,
    candidate_policies,
    choose_policy,
    trial_schedule,
    workload_key,
)

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from torch_l2topo.placement.sm_aware import check_kernel, sm_aware  # noqa: E402  (after the Triton check)
from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start  # noqa: E402


# ---- decoration ---------------------------------------------------------------------------------------------
@triton.jit
def good_kernel(out_ptr, plan_ptr, state_ptr):
    sm, t0 = plan_start(plan_ptr, state_ptr)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0)
    n_done = 0
    while item >= 0:
        tl.store(out_ptr + item, 1)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done)


@triton.jit
def no_plan_args(out_ptr, n):
    tl.store(out_ptr + tl.program_id(0), n)


@triton.jit
def plan_args_not_last(plan_ptr, state_ptr, out_ptr):
    sm, t0 = plan_start(plan_ptr, state_ptr)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0)
    plan_finish(plan_ptr, state_ptr, sm, t0, 0)


@triton.jit
def no_helpers(out_ptr, plan_ptr, state_ptr):
    # takes the plan tensors but strides over program ids: plan_start/plan_next/plan_finish never called
    tl.store(out_ptr + tl.program_id(0), tl.load(plan_ptr))


@triton.jit
def no_finish(out_ptr, plan_ptr, state_ptr):
    sm, t0 = plan_start(plan_ptr, state_ptr)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0)
    tl.store(out_ptr + item, 1)


def test_a_kernel_built_on_the_helpers_is_accepted_bare_and_with_options():
    bare = sm_aware(good_kernel)
    assert bare.fn is good_kernel and bare.policy == "auto" and bare.ctas_per_sm == 1
    assert bare.occupancy == 4  # 1 CTA x Triton's default 4 warps
    tuned = sm_aware(policy="dynamic", ctas_per_sm=2, num_warps=8)(good_kernel)
    assert tuned.policy == "dynamic" and tuned.num_warps == 8 and tuned.occupancy == 16


@pytest.mark.parametrize("fn, needle", [(no_plan_args, "plan_ptr, state_ptr"),
                                        (plan_args_not_last, "plan_ptr, state_ptr"),
                                        (no_helpers, "plan_start, plan_next, plan_finish"),
                                        (no_finish, "plan_finish")])
def test_a_kernel_without_the_helpers_gets_a_clear_error(fn, needle):
    with pytest.raises(PlacementError, match=needle):
        sm_aware(fn)


def test_a_plain_function_is_refused():
    def not_jitted(out_ptr, plan_ptr, state_ptr):
        pass

    with pytest.raises(PlacementError, match="@triton.jit"):
        check_kernel(not_jitted)


def test_options_are_checked_at_decoration():
    with pytest.raises(ValueError, match="policy"):
        sm_aware(policy="fastest_please")(good_kernel)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        sm_aware(ctas_per_sm=0)(good_kernel)
    with pytest.raises(ValueError, match="candidate"):
        sm_aware(candidates=("dynamic", "nope"))(good_kernel)


def test_a_call_inside_torch_compile_is_a_graph_break_that_still_launches(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(Placement, "__call__", lambda self, launch, **kw: calls.append(kw))
    kernel = sm_aware(policy="dynamic")(good_kernel)

    @torch.compile(backend="eager")
    def step(x):
        kernel(x, n_items=7)
        return x + 1

    assert torch.equal(step(torch.zeros(3)), torch.ones(3))
    assert calls and calls[0]["n_items"] == 7


# ---- the policy choice --------------------------------------------------------------------------------------
def test_a_clear_winner_beyond_tolerance_is_chosen():
    timings = {"dynamic": [1.00, 1.02, 0.99], "weighted": [0.90, 0.91, 0.95], "uniform": [1.10, 1.2, 1.05]}
    assert choose_policy(timings, 0.01) == "weighted"


def test_within_tolerance_dynamic_is_kept():
    timings = {"dynamic": [1.00, 1.01, 1.00], "weighted": [0.995, 0.996, 0.999]}
    assert choose_policy(timings, 0.01) == "dynamic"
    assert choose_policy(timings, 0.0) == "weighted"


def test_the_median_decides_not_one_lucky_trial():
    timings = {"dynamic": [1.0, 1.0, 1.0], "partition_affine": [0.5, 1.3, 1.2]}
    assert choose_policy(timings, 0.01) == "dynamic"


def test_a_noisy_winner_is_not_trusted():
    """Shaped like the H200 gather at 64 warps/SM: a candidate whose median wins but whose spread reaches
    past dynamic's median is not chosen."""
    timings = {"dynamic": [0.191, 0.190, 0.193, 0.189, 0.192], "measured": [0.175, 0.181, 0.178, 0.24, 0.26]}
    assert choose_policy(timings, 0.01) == "dynamic"
    timings["measured"] = [0.175, 0.181, 0.178, 0.180, 0.182]
    assert choose_policy(timings, 0.01) == "measured"


def test_without_dynamic_the_fastest_wins_and_untimed_candidates_are_ignored():
    assert choose_policy({"uniform": [2.0], "weighted": [1.5], "measured": []}, 0.01) == "weighted"


def test_no_timings_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        choose_policy({}, 0.01)
    with pytest.raises(ValueError, match="at least one"):
        choose_policy({"dynamic": [], "weighted": []}, 0.01)


def test_affinity_candidates_need_classes_and_low_parallelism():
    with_classes = candidate_policies(DEFAULT_CANDIDATES, True, 4)
    assert with_classes[0] == "dynamic" and "partition_affine" in with_classes and "affine_weighted" in with_classes
    for has_classes, parallelism in ((False, 4), (True, HIGH_PARALLELISM), (True, 64)):
        got = candidate_policies(DEFAULT_CANDIDATES, has_classes, parallelism)
        assert got[0] == "dynamic" and not {"partition_affine", "affine_weighted"} & set(got), got
    assert candidate_policies(("weighted",), False, None) == ("dynamic", "weighted")  # dynamic is the reference


def test_plain_is_always_a_candidate_and_launches_one_cta_per_item():
    for has_classes, parallelism in ((False, 4), (True, HIGH_PARALLELISM)):
        assert "plain" in candidate_policies(DEFAULT_CANDIDATES, has_classes, parallelism)
    p = Placement(policy="plain")
    assert p.grid(n_items=1000) == 1000 and p.grid(n_items=0) == 1
    assert Placement().grid(policy="plain", n_items=7) == 7
    with pytest.raises(ValueError, match="n_items"):
        p.grid()


def test_declared_occupancy_and_mlp_decide_the_parallelism():
    assert Placement(occupancy=2, mlp=8)._parallelism() == 16
    assert sm_aware(good_kernel)._parallelism() == 4  # 1 CTA x 4 warps, one load each
    assert sm_aware(occupancy=64)(good_kernel)._parallelism() == 64


def test_trials_are_interleaved_after_one_untimed_round():
    schedule = trial_schedule(("dynamic", "weighted"), 2)
    assert schedule == [("dynamic", False), ("weighted", False), ("dynamic", True), ("weighted", True),
                        ("dynamic", True), ("weighted", True)]


class _Event:
    """A CUDA event stand-in: done or not, and the ms from a start event."""

    def __init__(self, done, ms=0.0):
        self.done, self.ms = done, ms

    def query(self):
        return self.done

    def elapsed_time(self, end):
        return end.ms


def test_auto_reads_only_completed_events_and_decides_once_all_are_in():
    p = Placement(policy="auto", trials=2, candidates=("dynamic", "weighted"))
    key = workload_key(100)
    entry = p._entry(0, key, 100, None, 1.0)
    assert [p._next_policy(entry) for _ in range(6)] == trial_schedule(("dynamic", "weighted"), 2)
    assert p._next_policy(entry) == ("dynamic", False)  # trials done, events not read: plain dynamic
    entry.pending = [("dynamic", _Event(True), _Event(True, 1.0)), ("weighted", _Event(True), _Event(True, 0.8)),
                     ("dynamic", _Event(True), _Event(True, 1.0)), ("weighted", _Event(False), _Event(False))]
    p._read_timings(key, entry)
    assert entry.chosen is None and len(entry.pending) == 1 and key not in p.decisions  # never waits
    entry.pending = [("weighted", _Event(True), _Event(True, 0.80))]
    p._read_timings(key, entry)
    assert entry.chosen == "weighted" and p._next_policy(entry) == ("weighted", False)
    decision = p.decisions[key]
    assert decision["policy"] == "weighted" and decision["medians"] == pytest.approx({"dynamic": 1.0, "weighted": 0.80})
    assert p._capture_policy(entry) == "weighted"


def test_before_a_decision_a_capture_uses_dynamic():
    p = Placement(policy="auto")
    assert p._capture_policy(p._entry(0, workload_key(10), 10, None, 1.0)) == "dynamic"
    assert Placement(policy="uniform")._capture_policy(None) == "uniform"


def test_workload_keys_hash_the_content_of_item_classes():
    import torch

    classes = np.array([0, 1, 2, 1])
    assert workload_key(4, classes) == workload_key(4, torch.tensor([0, 1, 2, 1])) == workload_key(4, [0, 1, 2, 1])
    assert workload_key(4, classes) != workload_key(4, np.array([1, 1, 2, 1]))
    assert workload_key(4) == WorkloadKey(4, None, 1.0) != workload_key(4, loads_per_item=2)
    assert workload_key(4, loads_per_item=np.ones(4)) != workload_key(4, loads_per_item=np.full(4, 2.0))


# ---- the plan tensor ----------------------------------------------------------------------------------------
def test_the_plan_tensor_keeps_its_address_while_plans_fit():
    assert plan_capacity(0, 140, False) == 140
    assert plan_capacity(500, 140, False) == 500
    assert plan_capacity(500, 500, False) == 500
    assert plan_capacity(500, 501, False) == 501


def test_nothing_is_loaded_during_capture():
    for capacity, needed in ((0, 140), (500, 140), (500, 900)):
        with pytest.raises(PlacementError, match="launch the kernel once .* before capturing"):
            plan_capacity(capacity, needed, True)


def test_plans_wider_than_the_steal_scan_are_refused():
    with pytest.raises(PlacementError, match=f"1..{MAX_SLOTS}"):
        PlanSlot("cuda:0", MAX_SLOTS + 1)
    with pytest.raises(PlacementError):
        PlanSlot("cuda:0", 0)


def test_fast_key_names_a_workload_by_identity_and_never_by_a_recycled_id():
    import torch

    from torch_l2topo.placement.sm_aware import _fast_key

    classes = np.zeros(10, np.int8)
    key, objects, refs = _fast_key(torch.device("cuda", 0), 10, classes, 1.0)
    assert key == (0, 10, id(classes), 1.0) and objects == (classes, 1.0) and refs[0]() is classes
    assert _fast_key(torch.device("cuda", 0), 10, [0, 1], 1.0) is None  # a list: no identity to trust
    del classes, objects
    assert refs[0]() is None  # a new array that reuses the id will not match the stored reference
