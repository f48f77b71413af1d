"""What docs/usage.md says about `@triton.autotune` with `@sm_aware` holds: either order fails at decoration, with
the very message the page quotes, and no kernel is launched. Needs Triton (decoration only, no GPU)."""
import re
from pathlib import Path

import pytest

from torch_l2topo import PlacementError, sm_aware

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start  # noqa: E402

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
CONFIGS = [triton.Config({}, num_warps=1), triton.Config({}, num_warps=4)]


@triton.jit
def fill_items(out_ptr, n, plan_ptr, state_ptr, PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while item >= 0:
        tl.store(out_ptr + item, 1.0)
        n_done += 1
        item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


def _quoted(error: str) -> str:
    """The message usage.md quotes for `error` (`Error: message`, in backticks; the page wraps lines)."""
    text = " ".join(USAGE.read_text().split())
    found = re.findall(rf"`{error}: ([^`]+)`", text)
    assert len(found) == 1, f"usage.md quotes {error} {len(found)} times"
    return found[0]


def test_the_kernel_alone_is_accepted():
    """The control: the same kernel without the autotuner decorates fine (so the failures below are the stacking)."""
    assert sm_aware(num_warps=4)(fill_items).fn is fill_items


def test_sm_aware_above_autotune_is_refused_with_the_documented_message():
    tuned = triton.autotune(configs=CONFIGS, key=["n"])(fill_items)
    with pytest.raises(PlacementError) as caught:
        sm_aware(tuned)
    assert str(caught.value) == _quoted("PlacementError")


def test_autotune_above_sm_aware_fails_with_the_documented_message():
    with pytest.raises(AttributeError) as caught:
        triton.autotune(configs=CONFIGS, key=["n"])(sm_aware(fill_items))
    assert str(caught.value) == _quoted("AttributeError")
