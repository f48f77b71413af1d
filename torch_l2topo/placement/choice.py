"""What "auto" tries and how it decides: candidates as (policy, CTAs per SM) pairs, their pruning, the trial
schedule, the rule that no choice may be slower than a plain launch, and the decision in words.

Pure Python and numpy (no GPU), so CI tests it on recorded-style timings. The launcher (sm_aware.py) runs
the trials and feeds the timings back; the occupancy that bounds the CTAs per SM comes from occupancy.py.

Why pairs: a persistent grid with one CTA per SM runs an SM's items one after another, where a plain launch
runs up to 32 CTAs per SM at once; on the H200 a latency-bound chase with 16 items per SM lost 1.22x that way.
So a persistent candidate gets as many CTAs per SM as the compiled kernel can hold (registers, shared
memory, warps) but never more than the items can fill; "plain" and "partition_queues" keep the hardware's
concurrency by construction (one program per item or chunk of items).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from ..errors import check_choice
from .plans import POLICIES, POLICY_TABLE

PLAIN = "plain"
DEFAULT_TRIALS = 8  # timed rounds: with 4 candidates, 36 trial launches (9 rounds) before the choice
DEFAULT_TOLERANCE = 0.01
MAX_TRIAL_LAUNCHES = 40  # (1 untimed + trials) x candidates stays below this: trials must stay cheap


@dataclass(frozen=True, order=True)
class Candidate:
    """A policy and, for a persistent policy (shares mode), the CTAs per SM of its grid (None otherwise: one
    program per item, or per chunk of items)."""

    policy: str
    ctas_per_sm: int | None = None

    def __post_init__(self):
        check_choice("policy", self.policy, POLICIES)
        persistent = POLICY_TABLE[self.policy].mode == POLICY_TABLE["dynamic"].mode
        if persistent != (self.ctas_per_sm is not None):
            raise ValueError(f"{self.policy!r} takes CTAs per SM only if it is a persistent policy "
                             f"(got {self.ctas_per_sm!r})")
        if persistent and (isinstance(self.ctas_per_sm, bool) or self.ctas_per_sm < 1):
            raise ValueError(f"ctas_per_sm must be >= 1, got {self.ctas_per_sm!r}")

    @property
    def label(self) -> str:
        return self.policy if self.ctas_per_sm is None else f"{self.policy} x{self.ctas_per_sm}"

    def grid(self, n_sm: int, n_items: int, chunk: int = 1) -> int:
        """CTAs of a launch: one per item (plain), one per chunk (queues), ctas_per_sm per SM (persistent)."""
        if self.ctas_per_sm is not None:
            return self.ctas_per_sm * n_sm
        per = chunk if self.policy == "partition_queues" else 1
        return max(-(-int(n_items) // per), 1)


def persistent_ctas(max_ctas_per_sm: int | None, n_items: int, n_sm: int) -> int:
    """CTAs per SM of a persistent candidate: as many as the kernel can hold at once (max_ctas_per_sm; None:
    unknown, taken as 1), but never more than the items can fill (ceil(items per SM))."""
    fill = max(-(-int(n_items) // n_sm), 1)
    return max(1, min(fill, max_ctas_per_sm or 1))


def candidates(policies, *, has_classes: bool, n_items: int, n_sm: int,
               max_ctas_per_sm: int | None) -> tuple[Candidate, ...]:
    """The pruned candidates "auto" times for one workload, "plain" first (the reference every other must beat):
    of `policies`, the affinity ones only when items have classes, and each persistent one once, at
    persistent_ctas(); "measured" and "fastest" never (POLICY_TABLE's `auto`). At most
    MAX_TRIAL_LAUNCHES // (1 + DEFAULT_TRIALS) of them."""
    for p in policies:
        check_choice("candidate policy", p, POLICIES)
    ctas = persistent_ctas(max_ctas_per_sm, n_items, n_sm)
    out = [Candidate(PLAIN)]
    for p in dict.fromkeys(policies):
        spec = POLICY_TABLE[p]
        if p == PLAIN or not spec.auto or (spec.affinity and not has_classes):
            continue
        out.append(Candidate(p, ctas if spec.mode == POLICY_TABLE["dynamic"].mode else None))
    return tuple(out[:MAX_TRIAL_LAUNCHES // (1 + DEFAULT_TRIALS)])


def trial_schedule(cands, trials: int) -> list:
    """(candidate, timed) of the launches "auto" spends on trials: one untimed round over the candidates first
    (it compiles each mode and loads every plan: on the H200 the first launches of a plan ran up to 40% slower
    than later ones), then `trials` timed rounds: interleaving spreads clock and cache drift over all
    candidates alike."""
    return [(c, False) for c in cands] + [(c, True) for _ in range(trials) for c in cands]


def choose(timings: dict, tolerance: float = DEFAULT_TOLERANCE):
    """The candidate with the lowest median time among those that beat plain clearly: by more than `tolerance`
    (a fraction) in median, and with their upper quartile below plain's median (short kernels time noisily: one
    lucky trial must not decide). Plain when none does: no choice is slower than a plain launch. A candidate
    whose median is lowest but whose spread reaches past plain's median does not hide a steadier one that also
    wins. Without plain timed, the lowest median. Keys are Candidates; candidates without timings are ignored."""
    medians = {c: statistics.median(t) for c, t in timings.items() if len(t)}
    if not medians:
        raise ValueError("choose needs at least one candidate with timings")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    plain = Candidate(PLAIN)
    if plain not in medians:
        return min(medians, key=medians.get)
    for cand in sorted(medians, key=medians.get):
        if cand == plain:
            break
        clear = medians[cand] < medians[plain] * (1 - tolerance)
        if clear and float(np.quantile(timings[cand], 0.75)) < medians[plain]:
            return cand
    return plain


@dataclass(frozen=True)
class Decision:
    """What "auto" did for one workload: the candidates tried with their median ms, the choice, the trial
    launches spent, and the kernel's occupancy limit (CTAs per SM in shares mode; None: unknown)."""

    chosen: Candidate
    medians: dict
    timings: dict
    launches: int
    max_ctas_per_sm: int | None = None

    @property
    def policy(self) -> str:
        return self.chosen.policy

    def ratio(self, candidate: Candidate) -> float:
        """A candidate's median over plain's (nan without plain)."""
        plain = self.medians.get(Candidate(PLAIN))
        return self.medians[candidate] / plain if plain else math.nan

    def explain(self) -> str:
        """The decision in words a user can read."""
        plain = Candidate(PLAIN)
        rows = [f"  {c.label:28s} {m:9.4f} ms" + (f"  {self.ratio(c):.3f}x plain" if plain in self.medians else "")
                + ("  <- chosen" if c == self.chosen else "")
                for c, m in sorted(self.medians.items(), key=lambda cm: cm[1])]
        if self.chosen == plain:
            others = [c for c in self.medians if c != plain]
            best = min(others, key=self.medians.get) if others else None
            head = "plain launch kept: placement did not pay here" + (
                f" (best other: {best.label} at {self.ratio(best):.3f}x plain)" if best else "")
        else:
            head = (f"chose {self.chosen.label} ({POLICY_TABLE[self.chosen.policy].summary}): "
                    f"{self.ratio(self.chosen):.3f}x plain")
        occ = "" if self.max_ctas_per_sm is None else f"; the persistent kernel holds {self.max_ctas_per_sm} CTAs/SM"
        return "\n".join([head, f"{self.launches} trial launches, medians over the timed ones{occ}:", *rows])

    def as_dict(self) -> dict:
        """JSON-friendly: labels for candidates."""
        return {"policy": self.chosen.policy, "ctas_per_sm": self.chosen.ctas_per_sm, "chosen": self.chosen.label,
                "medians": {c.label: m for c, m in self.medians.items()}, "launches": self.launches,
                "max_ctas_per_sm": self.max_ctas_per_sm}
