"""@sm_aware and the placement launcher without a GPU: kernels written without the helpers are refused at
decoration, the auto trial flow (candidates, events read without waiting, the decision), the plan tensor's
growth/capture rule. The choice rule itself is tests/test_choice.py's; the refusal of a calibration of another
GPU is tests/test_calibration_for.py's."""
import numpy as np
import pytest

from torch_l2topo import DeviceError, PlacementError, load_example
from torch_l2topo.placement import sm_aware as sa
from torch_l2topo.placement.choice import Candidate, trial_schedule
from torch_l2topo.placement.slots import MAX_SLOTS, PlanSlot, plan_capacity
from torch_l2topo.placement.sm_aware import Placement, WorkloadKey, workload_key

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from torch_l2topo.placement.sm_aware import check_kernel, sm_aware  # noqa: E402  (after the Triton check)
from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start  # noqa: E402


# ---- decoration ---------------------------------------------------------------------------------------------
@triton.jit
def good_kernel(out_ptr, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        tl.store(out_ptr + item, 1)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def no_plan_args(out_ptr, n):
    tl.store(out_ptr + tl.program_id(0), n)


@triton.jit
def plan_args_out_of_order(state_ptr, plan_ptr, PLACE: tl.constexpr, out_ptr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, 0, PLACE)


@triton.jit
def no_place(out_ptr, plan_ptr, state_ptr):
    tl.store(out_ptr + tl.program_id(0), tl.load(plan_ptr))


@triton.jit
def no_helpers(out_ptr, plan_ptr, state_ptr, PLACE: tl.constexpr):
    # takes the plan tensors but strides over program ids: plan_start/plan_next/plan_finish never called
    tl.store(out_ptr + tl.program_id(0), tl.load(plan_ptr))


@triton.jit
def no_finish(out_ptr, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    tl.store(out_ptr + item, 1)


@triton.jit
def constexpr_after_place(out_ptr, plan_ptr, state_ptr, PLACE: tl.constexpr, BLOCK: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, 0, PLACE)


def test_a_kernel_built_on_the_helpers_is_accepted_bare_and_with_options():
    sm_aware(constexpr_after_place)  # parameters after PLACE are passed by keyword
    bare = sm_aware(good_kernel)
    assert bare.fn is good_kernel and bare.policy == "auto" and bare.ctas_per_sm is None and bare.num_warps == 4
    tuned = sm_aware(policy="dynamic", ctas_per_sm=2, num_warps=8)(good_kernel)
    assert tuned.policy == "dynamic" and tuned.num_warps == 8 and tuned.ctas_per_sm == 2


@pytest.mark.parametrize("fn, needle", [(no_plan_args, "plan_ptr, state_ptr"),
                                        (plan_args_out_of_order, "plan_ptr, state_ptr"),
                                        (no_place, "PLACE"),
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
    with pytest.raises(ValueError, match="persistent policies only"):
        sm_aware(policy="plain", ctas_per_sm=2)(good_kernel)
    with pytest.raises(ValueError, match="chunk"):
        sm_aware(chunk=0)(good_kernel)


def test_a_call_without_a_cuda_tensor_is_a_device_error():
    import torch

    with pytest.raises(DeviceError, match="runs on a CUDA GPU"):
        sm_aware(good_kernel)(torch.zeros(3), n_items=3)


def test_a_call_inside_torch_compile_is_a_graph_break_that_still_launches(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(Placement, "__call__", lambda self, launch, **kw: calls.append(kw))
    monkeypatch.setattr(sa, "cuda_device_of", lambda args, name: "cuda:0")
    kernel = sm_aware(policy="dynamic")(good_kernel)

    @torch.compile(backend="eager")
    def step(x):
        y = x + 1
        kernel(y, n_items=7)
        return y * 2

    assert torch.equal(step(torch.zeros(3)), torch.full((3,), 2.0))
    assert calls and calls[0]["n_items"] == 7
    # Dynamo does not trace into the launch: one break, at the disabled call (eager calls skip that wrapper)
    explained = torch._dynamo.explain(step._torchdynamo_orig_callable)(torch.zeros(3))
    assert explained.graph_break_count == 1 and "disable" in str(explained.break_reasons[0].reason)


# ---- the auto trial flow -------------------------------------------------------------------------------------
class _Event:
    """A CUDA event stand-in: done or not, and the ms from a start event."""

    def __init__(self, done, ms=0.0):
        self.done, self.ms = done, ms

    def query(self):
        return self.done

    def elapsed_time(self, end):
        return end.ms


def _h200(monkeypatch, p):
    """Placement p on a stand-in device 0 with the bundled H200 calibration (no GPU needed for the flow)."""
    from torch_l2topo import device
    from torch_l2topo.placement.plans import SpeedModel

    monkeypatch.setattr(device, "resolve_device", lambda d=None: 0)
    topo = load_example("h200")
    p._devices[0] = (topo, SpeedModel.from_topology(topo))
    return p


def test_auto_schedules_pruned_candidates_reads_only_completed_events_and_decides_once(monkeypatch):
    p = _h200(monkeypatch, Placement(policy="auto", trials=2, max_ctas_per_sm=16))
    key = workload_key(1320, np.arange(1320) % 2)
    entry = p._entry(0, key, 1320, np.arange(1320) % 2, 1.0)
    cands = (Candidate("plain"), Candidate("partition_queues"), Candidate("affine_weighted", 10),
             Candidate("weighted", 10))  # 10 items per SM fill 10 of the 16 CTAs the kernel could hold
    assert [p._next(entry, 0, 1320) for _ in range(12)] == trial_schedule(cands, 2)
    assert p._next(entry, 0, 1320) == (Candidate("plain"), False)  # trials done, events not read: plain
    t = {c: ms for c, ms in zip(cands, (1.0, 0.8, 0.95, 1.1))}
    covered = _Event(True, 0.25)  # the spin's 0.25 ms covered the host's 0.05 ms of queueing
    entry.pending = [(c, _Event(True), _Event(True), _Event(True, t[c]), 0.05) for c in cands] \
        + [(c, _Event(True), _Event(True), _Event(True, t[c]), 0.05) for c in cands[:3]] \
        + [(cands[3], _Event(False), _Event(False), _Event(False), 0.05)]
    entry.pending = [(c, s, covered if e.done else s, e, h) for c, s, _, e, h in entry.pending]
    p._read_timings(key, entry, 0)
    assert entry.chosen is None and len(entry.pending) == 1 and key not in p.decisions  # never waits
    entry.pending = [(cands[3], _Event(True), covered, _Event(True, 1.1), 0.05)]
    p._read_timings(key, entry, 0)
    assert entry.chosen == Candidate("partition_queues") and p._next(entry, 0, 1320) == (entry.chosen, False)
    decision = p.decisions[key]
    assert decision.policy == "partition_queues" and decision.ratio(decision.chosen) == pytest.approx(0.8)
    assert "chose partition_queues" in p.explain() and "0.800x plain" in p.explain()
    assert p._final(entry) == Candidate("partition_queues")


def test_trials_the_host_queued_slower_than_the_spin_covered_are_left_out(monkeypatch):
    """A trial whose host queueing outlasted the spin holds the host's time: the fast candidate's clean trials
    decide, and a candidate with only such trials still gets them rather than none."""
    p = _h200(monkeypatch, Placement(policy="auto", trials=2, max_ctas_per_sm=16))
    key = workload_key(1320, np.arange(1320) % 2)
    entry = p._entry(0, key, 1320, np.arange(1320) % 2, 1.0)
    while entry.schedule or not entry.timings:
        p._next(entry, 0, 1320)
    plain, queues, affine, weighted = entry.timings
    spin = _Event(True, 0.25)

    def trial(c, ms, host_ms):
        return c, _Event(True), spin, _Event(True, ms), host_ms

    # queues: clean at 0.8 ms, but twice its host was slow (0.4 ms > 0.25) and the window read 1.3 ms
    entry.pending = [trial(plain, 1.0, 0.05), trial(plain, 1.0, 0.05), trial(queues, 0.8, 0.05),
                     trial(queues, 1.3, 0.4), trial(queues, 1.3, 0.4), trial(affine, 0.95, 0.05),
                     trial(affine, 0.95, 0.05), trial(weighted, 1.2, 0.4)]
    p._read_timings(key, entry, 0)
    decision = p.decisions[key]
    assert decision.chosen == queues and decision.medians[queues] == pytest.approx(0.8)
    assert decision.medians[weighted] == pytest.approx(1.2) and decision.discarded == 3
    assert "3 left out" in decision.explain()


def test_without_classes_no_affinity_candidate_is_tried(monkeypatch):
    p = _h200(monkeypatch, Placement(policy="auto", max_ctas_per_sm=2))
    entry = p._entry(0, workload_key(132 * 64), 132 * 64, None, 1.0)
    first, _ = p._next(entry, 0, 132 * 64)
    assert first == Candidate("plain") and set(entry.timings) == {Candidate("plain"), Candidate("weighted", 2)}


def test_before_a_decision_no_candidate_is_final_and_a_fixed_policy_has_its_grid(monkeypatch):
    p = _h200(monkeypatch, Placement(policy="auto"))
    assert p._final(p._entry(0, workload_key(10), 10, None, 1.0)) is None
    fixed = _h200(monkeypatch, Placement(policy="uniform", max_ctas_per_sm=4))
    assert fixed._final(fixed._entry(0, workload_key(1000), 1000, None, 1.0)) == Candidate("uniform", 4)
    assert fixed.grid(0, n_items=1000) == 4 * 132 and fixed.grid(0, n_items=100) == 132  # the items fill 1/SM
    assert fixed.grid(0, policy="plain", n_items=1000) == 1000 and fixed.grid(0, policy="plain", n_items=0) == 1
    assert _h200(monkeypatch, Placement(policy="partition_queues", chunk=4)).grid(0, n_items=10) == 3
    assert [Placement.place(p) for p in ("plain", "uniform", "partition_queues")] == [0, 1, 2]
    with pytest.raises(ValueError, match="n_items"):
        fixed.grid(0)


def test_a_by_program_policy_is_planned_for_the_grid_it_launches(monkeypatch):
    """uniform and dynamic hand each program of the grid an item by its id: the plan a fixed policy loads has as
    many such items as its grid has programs, each CTAs-per-SM value gets its own plan, and a policy with SM
    preference (weighted) hands none out by id."""
    loaded = []

    class Slot:  # PlanSlot without a GPU: what was loaded
        def __init__(self, device, n_slots):
            pass

        def load(self, plan):
            loaded.append(plan)

    monkeypatch.setattr(sa, "PlanSlot", Slot)
    p = _h200(monkeypatch, Placement(policy="uniform", max_ctas_per_sm=4))
    entry = p._entry(0, workload_key(1000), 1000, None, 1.0)
    p._slot(0, entry, p._fixed_candidate(entry))
    assert loaded[-1].n_first == p.grid(0, n_items=1000) == 4 * 132
    p._slot(0, entry, Candidate("uniform", 2))
    assert loaded[-1].n_first == 2 * 132 and len(entry.slots) == len(loaded) == 2
    p._slot(0, entry, Candidate("uniform", 4))  # the first plan again: nothing loaded
    assert len(loaded) == 2
    weighted = _h200(monkeypatch, Placement(policy="weighted", max_ctas_per_sm=4))
    entry = weighted._entry(0, workload_key(1000), 1000, None, 1.0)
    weighted._slot(0, entry, weighted._fixed_candidate(entry))
    assert loaded[-1].n_first == 0 and loaded[-1].policy == "weighted"


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


def test_a_settled_workload_is_found_by_identity_and_never_by_a_recycled_id():
    from torch_l2topo.placement.sm_aware import _ident, _Settled

    classes, loads = np.zeros(10, np.int8), np.ones(10)
    assert (_ident(classes), _ident(None), _ident(1.0), _ident(np.float32(2))) == (id(classes), None, 1.0, 2.0)
    settled = _Settled((classes, 1.0), 0, 10, None, classes)
    assert settled.holds(classes, 1.0) and not settled.holds(classes.copy(), 1.0)
    assert _Settled((classes, loads), 0, 10, None, classes).holds(classes, loads)
    assert not _Settled((classes, loads), 0, 10, None, classes).holds(classes, loads.copy())
    with pytest.raises(TypeError):  # a list: no identity to trust, so it is never settled (hashed every call)
        _Settled(([0, 1], 1.0), 0, 10, None, None)
    del classes
    assert not settled.holds(np.zeros(10, np.int8), 1.0)  # a new array that reuses the id does not match


def test_a_decided_call_launches_its_slot_directly_with_the_calls_arguments(monkeypatch):
    """The settled path of SmAwareKernel: the decided slot's grid, plan, state and mode (the record bit off), the
    call's positional arguments first and its keywords after PLACE, num_warps the decorator's; a call with
    another item_class object of the same contents is not the decided one (it takes the full path)."""
    import torch

    kernel = sm_aware(policy="plain", num_warps=2)(good_kernel)
    launches, full = [], []

    class Lean:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, args, kwargs))

    class Slot:
        plan, state, prepared = "plan", "state", 0
        loaded = type("Loaded", (), {"mode": 5})()

        def prepare(self):
            self.prepared += 1

    device = torch.device("cuda", 0)
    monkeypatch.setattr(sa, "cuda_device_of", lambda args, name: device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(sa.Placement, "__call__", lambda self, launch, **kw: full.append(kw))
    kernel._lean = Lean()
    classes, slot = np.zeros(7, np.int8), Slot()
    kernel._settled[(0, 7, id(classes), 1.0)] = sa._Settled((classes, 1.0), 0, 3, slot, classes)
    x = object()
    kernel(x, n_items=7, item_class=classes, BLOCK=64)
    assert launches == [((3,), (x, "plan", "state"), {"BLOCK": 64, "num_warps": 2, "PLACE": 5})]
    assert slot.prepared == 1 and not full
    kernel(x, n_items=7, item_class=classes.copy(), BLOCK=64)
    assert len(launches) == 1 and len(full) == 1 and full[0]["n_items"] == 7


def test_placement_launches_a_decided_workload_through_its_launch_callable(monkeypatch):
    import torch

    p = Placement(policy="plain")
    slot = type("Slot", (), {"plan": "plan", "state": "state", "prepare": lambda self: None,
                             "loaded": type("Loaded", (), {"mode": 1})()})()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    p._settled[(0, 132, None, 1.0)] = sa._Settled((None, 1.0), 0, 132, slot, None)
    got = []
    p(lambda *a: got.append(a), n_items=132, device=torch.device("cuda", 0))
    assert got == [(132, "plan", "state", 1)]
