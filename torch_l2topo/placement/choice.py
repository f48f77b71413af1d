"""What "auto" tries and how it decides: candidates as (policy, CTAs per SM) pairs, their pruning, the trial
schedule, the rule that no choice may be slower than a plain launch, and the decision in words.

Pure Python and numpy (no GPU), so CI tests it on recorded-style timings. The launcher (sm_aware.py) runs
the trials and feeds the timings back; the occupancy that bounds the CTAs per SM comes from occupancy.py.

Why pairs: a persistent grid with one CTA per SM runs an SM's items one after another, where a plain launch
runs up to 32 CTAs per SM at once (a latency-bound chase at 16 items per SM lost that way: docs/results.md).
So a persistent candidate gets as many CTAs per SM as the compiled kernel can hold (registers, shared
memory, warps) but never more than the items can fill; "plain" and "partition_queues" keep the hardware's
concurrency by construction (one program per item or chunk of items). Where an SM cannot hold all its items'
programs at once (more items per SM than the kernel's resident CTAs), "partition_queues" is also tried with
several items per claim: the same waves with a fraction of the claims on the queue counters (claims one item
at a time cost a short kernel measurably at many items per SM).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from ..errors import check_choice
from .plans import POLICIES, POLICY_TABLE

PLAIN = "plain"
QUEUES = "partition_queues"
DEFAULT_TRIALS = 8  # timed rounds: with 4 candidates, 36 trial launches (9 rounds) before the choice
DEFAULT_TOLERANCE = 0.01
MAX_TRIAL_LAUNCHES = 40  # (1 untimed + trials) x candidates stays below this: trials must stay cheap
MAX_CANDIDATES = 5       # so that every candidate still gets MAX_TRIAL_LAUNCHES // 5 - 1 = 7 timed rounds


@dataclass(frozen=True, order=True)
class Candidate:
    """A policy and, for a persistent policy (shares mode), the CTAs per SM of its grid (None otherwise: one
    program per item, or per chunk of items); for "partition_queues", the items a program claims at once."""

    policy: str
    ctas_per_sm: int | None = None
    chunk: int = 1

    def __post_init__(self):
        check_choice("policy", self.policy, POLICIES)
        persistent = POLICY_TABLE[self.policy].mode == POLICY_TABLE["dynamic"].mode
        if persistent != (self.ctas_per_sm is not None):
            raise ValueError(f"{self.policy!r} takes CTAs per SM only if it is a persistent policy "
                             f"(got {self.ctas_per_sm!r})")
        if persistent and (isinstance(self.ctas_per_sm, bool) or self.ctas_per_sm < 1):
            raise ValueError(f"ctas_per_sm must be >= 1, got {self.ctas_per_sm!r}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"chunk must be an integer >= 1, got {self.chunk!r}")
        if self.chunk != 1 and self.policy != QUEUES:
            raise ValueError(f"only {QUEUES!r} claims several items at once, not {self.policy!r}")

    @property
    def label(self) -> str:
        if self.ctas_per_sm is not None:
            return f"{self.policy} x{self.ctas_per_sm}"
        return self.policy if self.chunk == 1 else f"{self.policy} c{self.chunk}"

    @property
    def plan_key(self) -> tuple:
        """What its plan depends on: the policy, the items per claim and, for a policy that hands each program an
        item by its id (POLICY_TABLE's by_program), the CTAs per SM (the grid)."""
        return self.policy, self.chunk, self.ctas_per_sm if POLICY_TABLE[self.policy].by_program else None

    def grid(self, n_sm: int, n_items: int) -> int:
        """CTAs of a launch: one per item (plain), one per chunk (queues), ctas_per_sm per SM (persistent)."""
        if self.ctas_per_sm is not None:
            return self.ctas_per_sm * n_sm
        return max(-(-int(n_items) // self.chunk), 1)


def persistent_ctas(max_ctas_per_sm: int | None, n_items: int, n_sm: int) -> int:
    """CTAs per SM of a persistent candidate: as many as the kernel can hold at once (max_ctas_per_sm; None:
    unknown, taken as 1), but never more than the items can fill (ceil(items per SM))."""
    fill = max(-(-int(n_items) // n_sm), 1)
    return max(1, min(fill, max_ctas_per_sm or 1))


def claim_chunk(max_ctas_per_sm: int | None, n_items: int, n_sm: int) -> int:
    """Items per claim that keep a queues launch's waves: ceil(items per SM / resident CTAs per SM), 1 where an SM
    holds all its items' programs at once (or its occupancy is unknown)."""
    per_sm = -(-int(n_items) // n_sm)
    return max(1, -(-per_sm // max_ctas_per_sm)) if max_ctas_per_sm else 1


def candidates(policies, *, has_classes: bool, n_items: int, n_sm: int, max_ctas_per_sm: int | None,
               chunk: int = 1) -> tuple[Candidate, ...]:
    """The pruned candidates "auto" times for one workload, "plain" first (the reference every other must beat):
    of `policies`, the affinity ones only when items have classes, each persistent one once, at
    persistent_ctas(); "partition_queues" at `chunk` items per claim and, where claim_chunk() is larger, also at
    that; "measured" and "fastest" never (POLICY_TABLE's `auto`). At most MAX_CANDIDATES of them: the chunked
    queues candidate comes right after the unchunked one, ahead of the persistent policies."""
    for p in policies:
        check_choice("candidate policy", p, POLICIES)
    ctas = persistent_ctas(max_ctas_per_sm, n_items, n_sm)
    out = [Candidate(PLAIN)]
    for p in dict.fromkeys(policies):
        spec = POLICY_TABLE[p]
        if p == PLAIN or not spec.auto or (spec.affinity and not has_classes):
            continue
        if p == QUEUES:
            out += [Candidate(p, chunk=c) for c in dict.fromkeys((chunk, claim_chunk(max_ctas_per_sm, n_items, n_sm)))]
        else:
            out.append(Candidate(p, ctas if spec.mode == POLICY_TABLE["dynamic"].mode else None))
    return tuple(out[:MAX_CANDIDATES])


def trial_rounds(n_candidates: int, trials: int = DEFAULT_TRIALS) -> int:
    """Timed rounds for n_candidates: `trials`, fewer where the untimed round and the timed ones would pass
    MAX_TRIAL_LAUNCHES (at least one)."""
    return max(1, min(trials, MAX_TRIAL_LAUNCHES // max(n_candidates, 1) - 1))


def trial_schedule(cands, trials: int) -> list:
    """(candidate, timed) of the launches "auto" spends on trials: one untimed round over the candidates first
    (it compiles each mode and loads every plan: the first launches of a plan run slower than later ones), then
    trial_rounds() timed rounds: interleaving spreads clock and cache drift over all candidates alike."""
    rounds = trial_rounds(len(cands), trials)
    return [(c, False) for c in cands] + [(c, True) for _ in range(rounds) for c in cands]


def host_extra(host_ms: dict | None) -> dict:
    """Per candidate, the host time its launch costs beyond plain's (median ms, never negative; 0 without host
    times): what an eager call pays on the host for it, e.g. the queue cursors' reset before a queues launch."""
    medians = {c: statistics.median(t) for c, t in (host_ms or {}).items() if len(t)}
    plain = medians.get(Candidate(PLAIN))
    return {c: max(0.0, m - plain) for c, m in medians.items()} if plain is not None else {}


def choose(timings: dict, tolerance: float = DEFAULT_TOLERANCE, host_ms: dict | None = None):
    """The candidate with the lowest median time among those that beat plain clearly: by more than `tolerance`
    (a fraction) in median, and with their upper quartile below plain's median (short kernels time noisily: one
    lucky trial must not decide). Plain when none does: no choice is slower than a plain launch. A candidate
    whose median is lowest but whose spread reaches past plain's median does not hide a steadier one that also
    wins. Without plain timed, the lowest median. Keys are Candidates; candidates without timings are ignored.
    host_ms (ms per trial launch of each candidate on the host): a candidate's host time beyond plain's
    (host_extra) is added to its GPU times, so that an eager call never trades GPU time for more host time."""
    extra = host_extra(host_ms)
    timings = {c: [x + extra.get(c, 0.0) for x in t] for c, t in timings.items()}
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
    discarded: int = 0  # timed trials left out: the host queued them for longer than the GPU spin covered
    host_extra: dict = field(default_factory=dict)  # ms of host time per launch beyond plain's (host_extra())

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
                + (f"  +{self.host_extra[c] * 1e3:.1f} us host" if self.host_extra.get(c, 0) >= 5e-4 else "")
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
        left = f" ({self.discarded} left out: host slower than the spin)" if self.discarded else ""
        return "\n".join([head, f"{self.launches} trial launches, medians over the timed ones{left}{occ}:", *rows])

    def as_dict(self) -> dict:
        """JSON-friendly: labels for candidates."""
        return {"policy": self.chosen.policy, "ctas_per_sm": self.chosen.ctas_per_sm, "chunk": self.chosen.chunk,
                "chosen": self.chosen.label, "medians": {c.label: m for c, m in self.medians.items()},
                "launches": self.launches, "discarded": self.discarded, "max_ctas_per_sm": self.max_ctas_per_sm,
                "host_extra_ms": {c.label: m for c, m in self.host_extra.items()}}
