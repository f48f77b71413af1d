"""How an op call launches: straight to its implementation or through the dispatcher, and under which placement.

The ops' `policy=` takes the placement policies and "auto". Each op kernel runs its item loop on the placement
helpers with PLACE a constexpr, so a plain launch (PLACE_DIRECT) compiles to a kernel written without them.
`launch_placed` runs one call:
- "plain", and every call that cannot hold host state (inside torch.compile, under fake or functional tensors,
  during CUDA graph capture before a decision exists): a plain launch, one program per item;
- another policy, in eager mode: through a placement.sm_aware.Placement of that policy kept per op (plans at
  fixed addresses, so a graph captured later replays them);
- "auto": a plain launch. These ops' items (bags, tree chunks) read data homed in both L2 partitions, and
  Placement's own "auto" chose a persistent grid that ran slower than plain (docs/ops.md, "Placement").
The ops are torch.library custom ops whose fake implementation is their own body: `triton_launcher` gives it the
kernel on real tensors (launched through lean_launch) and a launcher that launches nothing on fake ones.
`direct_call` says when an eager call may skip the dispatcher (its cost is more than a small kernel's) and run
the implementation itself. Docs: docs/ops.md ("torch.compile, CUDA graphs, opcheck").
"""
from __future__ import annotations

import functools

import torch

from ..errors import check_choice
from ..layout import PLACE_DIRECT
from ..measure.lean_launch import lean
from ..placement.plans import POLICIES

AUTO = "auto"
PLAIN = "plain"
POLICY_CHOICES = (*POLICIES, AUTO)

_placements: dict = {}    # (op, policy) -> Placement
_unread: dict = {}        # device -> (plan, state) of plain launches


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): the ops' tile and block sizes."""
    return 1 << max(0, int(n) - 1).bit_length()


@functools.lru_cache(maxsize=None)
def device_properties(index: int):
    """torch.cuda.get_device_properties(index), read once: a read costs microseconds, and the ops' launch shapes
    read the SM count and the L2's size on every call."""
    return torch.cuda.get_device_properties(index)


def check_policy(policy: str) -> str:
    check_choice("policy", policy, POLICY_CHOICES)
    return policy


# Tensors whose ops run as a plain tensor's: nn.Parameter disables __torch_function__ (a module's frozen table)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def direct_call(*tensors) -> bool:
    """True when calling an op's implementation directly does what the dispatcher would do (module doc)."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active()):
        return False
    grad = torch.is_grad_enabled()
    return all(t is None or (type(t) in PLAIN_TENSORS and not (grad and t.requires_grad)) for t in tensors)


def traced(tensor) -> bool:
    """A fake, functional or otherwise traced tensor, or a call inside compilation or a dispatch mode: where an
    op's body may allocate but must not launch or keep tensors."""
    return type(tensor) is not torch.Tensor or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()


class _NoLaunch:
    """What the ops' fake implementations launch: nothing (their outputs are allocated before the launch)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def triton_launcher(kernel, like: torch.Tensor):
    """`kernel` on real tensors, launched through lean_launch (without Triton's per-launch check of the kernel's
    globals); under fake or traced tensors (the op's fake implementation, which is the op's own body run for
    shapes) a launcher that launches nothing (module doc)."""
    return _NoLaunch() if traced(like) else lean(kernel)


def _eager(tensor) -> bool:
    """A real CUDA tensor outside compilation and capture: where Placement (host state, events) may run."""
    return not traced(tensor) and tensor.is_cuda and not torch.cuda.is_current_stream_capturing()


def _unread_plan(like: torch.Tensor, eager: bool) -> tuple:
    """(plan, state) of a plain launch: never read (PLACE_DIRECT), but typed as the helpers declare them (int32,
    int64: Triton 3.6 type-checks the helpers' other modes too); kept per device in eager mode."""
    if not eager:
        return (torch.empty(0, dtype=torch.int32, device=like.device),
                torch.empty(0, dtype=torch.int64, device=like.device))
    key = (like.device.type, like.device.index)
    if key not in _unread:
        _unread[key] = (torch.empty(1, dtype=torch.int32, device=like.device),
                        torch.empty(1, dtype=torch.int64, device=like.device))
    return _unread[key]


def launch_placed(op: str, policy: str, launch, n_items: int, like: torch.Tensor) -> None:
    """launch(grid, plan, state, place) once over n_items items on `like`'s device, as policy says (module doc)."""
    eager = _eager(like)
    if policy in (PLAIN, AUTO) or not eager:
        launch(n_items, *_unread_plan(like, eager), PLACE_DIRECT)
        return
    placement = _placements.get((op, policy))
    if placement is None:
        from ..placement.sm_aware import Placement

        placement = _placements[(op, policy)] = Placement(policy=policy)
    placement(launch, n_items=n_items, device=like.device)
