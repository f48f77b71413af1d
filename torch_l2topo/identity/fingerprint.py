"""Device fingerprints: which physical GPU made this calibration, from its latency maps alone.

Owns the device signature (the address-independent, offset-free part of a Topology), the distance between two
signatures and the decision on a distance (decide(): match, no match, or ambiguous inside the band around the
threshold). registry.py keeps known signatures on disk; hashed.py exports them for matching without sharing
maps; evaluation.py fits and tests the decision on a labelled collection.

A signature holds two blocks, both independent of which buffer was probed:
- chain: the per-SM chain map minus its median (the random ring covers every L2 slice many times; centering
  removes the per-load overhead that differs between backends).
- side: each SM's L2 partition side (labels.sm_labels; -1 for the lowest decided SM's side, 0 undecided)
  times the fixed weight SIDE_CYCLES, so one SM on the wrong side costs about what it costs in latency.
Per-SM near/far latencies are left out: they average over whichever slices the probed lines hit, so they
would fingerprint the buffer as much as the GPU. Docs: docs/fingerprints.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..analysis.labels import sm_labels
from ..topology import Topology

SIGNATURE_VERSION = 2  # 2: the side block's weight is fixed (SIDE_CYCLES), no longer the measured gap / 2
BLOCKS = ("chain", "side")
FORMAT = "torch_l2topo/device-signature"

# The decision band of decide(): calibrate_threshold() on the tuning sessions of the labelled collection,
# tested on every other pair (docs/fingerprints.md, "The study").
DEFAULT_THRESHOLD = 0.51
AMBIGUITY_FACTOR = 1.93

# Cycles per SM of the side block: about half the near - far gap of the recorded H200s (docs/fingerprints.md).
SIDE_CYCLES = 15.5

# An SM's partition side is only recorded when the two partitions differ by more than this many times the
# calibration's line repeat noise: below that a split is noise (a flat map has no sides).
_SIDE_MIN_GAP_IN_NOISE = 10.0


@dataclass(frozen=True, eq=False)  # eq on a numpy field would be ambiguous: compare with distance()
class DeviceSignature:
    """The fingerprint of one GPU: its model and a float vector of 2 * sm_count entries (cycles).

    vector[:sm_count]: chain block (chain map minus its median). vector[sm_count:]: side block (+-SIDE_CYCLES
    per SM, 0 everywhere when no partition structure was found). See the module docstring.
    """

    name: str
    sm_count: int
    cc: tuple
    vector: np.ndarray
    version: int = SIGNATURE_VERSION

    def __post_init__(self):
        object.__setattr__(self, "cc", tuple(int(x) for x in self.cc))
        object.__setattr__(self, "vector", np.asarray(self.vector, dtype=np.float64))
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("signature device name must be a non-empty string")
        if not isinstance(self.sm_count, (int, np.integer)) or self.sm_count < 1:
            raise ValueError(f"signature sm_count must be a positive integer, got {self.sm_count!r}")
        if self.vector.shape != (len(BLOCKS) * self.sm_count,):
            raise ValueError(f"signature vector must have shape ({len(BLOCKS) * self.sm_count},) for "
                             f"{self.sm_count} SMs, got {self.vector.shape}")
        if not np.all(np.isfinite(self.vector)):
            raise ValueError("signature vector holds NaN or infinite values")

    @property
    def model(self) -> tuple:
        return (self.name, int(self.sm_count), self.cc)

    def block(self, name: str) -> np.ndarray:
        i = BLOCKS.index(name)
        return self.vector[i * self.sm_count:(i + 1) * self.sm_count]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": self.version,
                "device": {"name": self.name, "sm_count": int(self.sm_count), "cc": list(self.cc)},
                "vector": [float(x) for x in self.vector]}

    @classmethod
    def from_dict(cls, d) -> "DeviceSignature":
        """Inverse of to_dict(); raises ValueError saying what is missing or wrong."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a device signature (format must be {FORMAT!r})")
        if d.get("version") != SIGNATURE_VERSION:
            raise ValueError(f"signature version {d.get('version')!r}, this torch_l2topo reads {SIGNATURE_VERSION}")
        dev = d.get("device")
        if not isinstance(dev, dict) or not all(k in dev for k in ("name", "sm_count", "cc")):
            raise ValueError("signature lacks device name, sm_count or cc")
        vec = d.get("vector")
        if not isinstance(vec, list) or not all(isinstance(x, (int, float)) for x in vec):
            raise ValueError("signature vector must be a list of numbers")
        if not isinstance(dev["cc"], list) or not all(isinstance(x, int) for x in dev["cc"]):
            raise ValueError("signature cc must be a list of integers")
        return cls(name=dev["name"], sm_count=dev["sm_count"], cc=tuple(dev["cc"]), vector=np.array(vec, float),
                   version=d["version"])


def signature(topo: Topology) -> DeviceSignature:
    """The DeviceSignature of one calibration (see the module docstring for what it holds)."""
    if not isinstance(topo, Topology):
        raise TypeError(f"signature() takes a Topology, got {type(topo).__name__}")
    dev = topo.meta.get("device")
    if not isinstance(dev, dict) or not all(k in dev for k in ("name", "sm_count", "cc")):
        raise ValueError("the calibration's meta['device'] lacks name, sm_count or cc: cannot tell the GPU model")
    if int(dev["sm_count"]) != topo.n_sm:
        raise ValueError(f"the calibration covers {topo.n_sm} SMs but its device reports {dev['sm_count']}")
    chain = topo.chain_cycles.astype(np.float64)
    labels = sm_labels(topo)
    side = np.select([labels.partition == 0, labels.partition == 1], [-1.0, 1.0], 0.0)
    gap = labels.gap_cycles
    if gap <= _SIDE_MIN_GAP_IN_NOISE * float(np.median(topo.line_noise)):
        side_block = np.zeros(topo.n_sm)
    else:
        side_block = side * SIDE_CYCLES
    return DeviceSignature(name=str(dev["name"]), sm_count=topo.n_sm, cc=tuple(dev["cc"]),
                           vector=np.concatenate([chain - np.median(chain), side_block]))


def _check_compatible(a: DeviceSignature, b: DeviceSignature) -> None:
    for s in (a, b):
        if not isinstance(s, DeviceSignature):
            raise TypeError(f"expected DeviceSignature, got {type(s).__name__}")
    if a.version != b.version:
        raise ValueError(f"signature versions differ ({a.version} vs {b.version}): recompute both")
    if a.model != b.model:
        raise ValueError(f"signatures of different device models cannot be compared: {a.model} vs {b.model}")
    if a.vector.shape != b.vector.shape:
        raise ValueError(f"signatures differ in length: {a.vector.size} vs {b.vector.size}")


def compatible(a: DeviceSignature, b: DeviceSignature) -> bool:
    """True when distance(a, b) is defined: same signature version, device model and length."""
    try:
        _check_compatible(a, b)
    except ValueError:
        return False
    return True


def distance(a: DeviceSignature, b: DeviceSignature) -> float:
    """RMS over the signature entries of a - b, after removing each block's median difference (cycles).

    Raises ValueError for signatures of different versions, device models or lengths: they are refused,
    never compared. A constant added to any block (per-load overhead, a whole-map shift) changes nothing.
    """
    _check_compatible(a, b)
    total = 0.0
    for name in BLOCKS:
        d = a.block(name) - b.block(name)
        total += float(np.sum((d - np.median(d)) ** 2))
    return math.sqrt(total / a.vector.size)


MATCH, NO_MATCH, AMBIGUOUS = "match", "no match", "ambiguous"


def decide(best: float, runner_up: float = math.inf, threshold: float = DEFAULT_THRESHOLD,
           factor: float = AMBIGUITY_FACTOR) -> str:
    """The verdict for a query whose nearest entry lies at `best` and whose nearest entry of another device
    at `runner_up` (inf when there is none): MATCH, NO_MATCH or AMBIGUOUS.

    The band [threshold / factor, threshold * factor] is the range of distances the fit never saw a pair
    in (calibrate_threshold(): its edges are the largest within-device and the smallest between-device
    distance of the tuning data): a distance in it is too close to call. Below the band it is a match,
    unless a second device also lies within the threshold (two candidates: the map cannot tell which, or
    one GPU was enrolled twice under two uuids). factor=1 gives a plain threshold decision.
    """
    if not threshold > 0 or not factor >= 1:
        raise ValueError(f"need threshold > 0 and factor >= 1, got {threshold!r}, {factor!r}")
    if best > threshold * factor:
        return NO_MATCH
    if best > threshold / factor or runner_up <= threshold:
        return AMBIGUOUS
    return MATCH


def calibrate_threshold(within, between) -> tuple[float, float]:
    """A same/different boundary from measured distances: (threshold, margin).

    threshold: geometric mean of the largest within-device and the smallest between-device distance
    (distances are ratios of noise to signal, so the boundary sits the same factor from both);
    half the smallest between-device distance when every within-device distance is 0.
    margin: the factor by which the threshold clears the nearer of the two (>1; 1 would be on the edge).
    Raises ValueError when the two sets overlap: no threshold separates them.
    """
    w = np.asarray(list(within), dtype=np.float64)
    b = np.asarray(list(between), dtype=np.float64)
    if w.size == 0 or b.size == 0:
        raise ValueError("need at least one within-device and one between-device distance")
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))) or w.min() < 0 or b.min() < 0:
        raise ValueError("distances must be finite and non-negative")
    hi_w, lo_b = float(w.max()), float(b.min())
    if hi_w >= lo_b:
        raise ValueError(f"within-device distances (max {hi_w:.4g}) reach the between-device ones "
                         f"(min {lo_b:.4g}): no threshold separates them")
    threshold = math.sqrt(hi_w * lo_b) if hi_w > 0 else lo_b / 2
    margin = min(threshold / hi_w if hi_w > 0 else math.inf, lo_b / threshold)
    return threshold, margin
