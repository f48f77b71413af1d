"""The `policy=` argument of the ops: validated against the placement policies, resolved to the launch used.

Every op accepts the placement layer's policies and "auto". Until the ops' kernels run their item loop through
the placement helpers (contract v2: plan_start / plan_next / plan_finish, issue 16), only the plain launch
exists: "auto" resolves to it (the issue's rule: where placement does not pay, or cannot run, an op runs as a
plain launch) and a named placement policy is a clear PlacementError, never a silent plain launch.
"""
from __future__ import annotations

from ..errors import PlacementError, check_choice
from ..placement.plans import POLICIES

AUTO = "auto"
PLAIN = "plain"
POLICY_CHOICES = (*POLICIES, AUTO)


def resolve_policy(policy: str, op: str) -> str:
    """The launch an op call runs with: "plain" for "plain" and "auto"; other policies are not available yet."""
    check_choice("policy", policy, POLICY_CHOICES)
    if policy in (PLAIN, AUTO):
        return PLAIN
    raise PlacementError(f"{op}: policy {policy!r} is not available yet (the ops' kernels are plain launches "
                         f"until they run on the placement helpers); use policy='auto' or 'plain'")
