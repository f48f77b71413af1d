"""Device fingerprinting: which physical GPU made this calibration, from its latency maps alone.

Owns the device signature (the address-independent, offset-free part of a Topology), the distance
between two signatures, the threshold that separates "same GPU" from "another GPU", a registry of known
signatures on disk, and a salted, locality-sensitive hashed export for matching without sharing maps.

What a signature holds, and why (measured on two H200s, 12 calibrations, benchmarks/bench_fingerprint.py):
- chain block: the per-SM chain map (cycles per load over the random 2 MiB ring) minus its median.
  The ring covers every L2 slice many times, so it does not depend on which buffer was probed. Centering
  removes the per-load overhead that differs between backends (Triton ~2 cycles above CUDA).
- side block: the L2 partition side of each SM (the sign of the first left singular vector of the
  double-centered line matrix, oriented so that SM 0 is on side -1), times half the device's far - near
  latency gap. In cycles, so that one SM on the wrong side costs what it costs in latency. The side of
  an SM does not depend on the probed addresses as long as the lines cover both partitions.
- not included: per-SM near/far latency. They average over whichever L2 slices the probed lines happen
  to hit; two disjoint halves of the same 512 lines give per-SM near/far maps 0.2-1.5 cycles RMS apart
  (median 0.7-0.8), about as far as two different H200s are apart (1.2-1.9): they would fingerprint the
  buffer as much as the GPU.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import L2TopoError
from .files import atomic_write
from .topology import Topology

SIGNATURE_VERSION = 1
BLOCKS = ("chain", "side")
_FORMAT = "torch_l2topo/device-signature"
_HASHED_FORMAT = "torch_l2topo/hashed-signature"

# Same-GPU vs other-GPU boundary for distance(), from benchmarks/results/fingerprint_h200_cpu.json (two
# H200s, 6 calibrations each: both backends x three modes, one process per GPU): within-device distances
# 0.009-0.263, between-device 0.981-1.016; calibrate_threshold() puts the boundary at 0.508, 1.93x from
# both. Recalibrations on other days, clocks or drivers were not in that data: widen with
# calibrate_threshold() when they are.
DEFAULT_THRESHOLD = 0.51

# Hashed export: 1024 sign bits over the centered chain map. Measured (same benchmark, 8 salts): within-
# device Hamming fractions 0-0.027, between-device 0.070-0.086; boundary 0.044, 1.6x from both. The two
# H200s' chain maps are 13.7 degrees apart, repeats <= 3.3 degrees, so the fractions sit near 0.076 and
# 0.018 and only their spread (sd ~ sqrt(p(1-p)/bits)) decides: 256 bits let them touch. Fewer bits
# reveal less about the map to whoever holds the salt, but separate less.
HASH_BITS = 1024
DEFAULT_HASH_THRESHOLD = 0.044

# An SM's partition side is only recorded when the two partitions differ by more than this many times the
# calibration's line repeat noise: below that the SVD split is noise (a flat map has no sides).
_SIDE_MIN_GAP_IN_NOISE = 10.0


class RegistryError(L2TopoError):
    """A registry entry is unreadable or invalid, or an entry name is taken or malformed."""


# ---- the signature ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # eq on a numpy field would be ambiguous: compare with distance()
class DeviceSignature:
    """The fingerprint of one GPU: its model and a float vector of 2 * sm_count entries (cycles).

    vector[:sm_count]: chain block (chain map minus its median). vector[sm_count:]: side block (+-gap/2
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
        return {"format": _FORMAT, "version": self.version,
                "device": {"name": self.name, "sm_count": int(self.sm_count), "cc": list(self.cc)},
                "vector": [float(x) for x in self.vector]}

    @classmethod
    def from_dict(cls, d) -> "DeviceSignature":
        """Inverse of to_dict(); raises ValueError saying what is missing or wrong."""
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise ValueError(f"not a device signature (format must be {_FORMAT!r})")
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


def partition_sides(line_cycles) -> tuple[np.ndarray, float]:
    """Each SM's L2 partition side (-1/+1, SM 0 on -1) and the far - near gap in cycles.

    The double-centered SM x line matrix of a two-partition GPU is dominated by one rank-1 term: SMs on
    one side are fast to the lines on that side and slow to the others. Its left singular vector's sign
    is the side. gap: latency to the other side's lines minus to one's own, averaged within each side, then
    over the two sides (0 when the split puts everything on one side).
    """
    lc = np.asarray(line_cycles, dtype=np.float64)
    if lc.ndim != 2 or lc.shape[1] < 2 or not np.all(np.isfinite(lc)):
        raise ValueError(f"line_cycles must be a finite (n_sm, n_lines >= 2) matrix, got shape {lc.shape}")
    d = lc - lc.mean(axis=0) - lc.mean(axis=1, keepdims=True) + lc.mean()
    u, _, vt = np.linalg.svd(d, full_matrices=False)
    side = np.where(u[:, 0] >= 0, 1, -1)
    if side[0] > 0:
        side = -side
    line_side = vt[0] >= 0
    if not line_side.any() or line_side.all() or (side > 0).all() or (side < 0).all():
        return side, 0.0
    # For each SM: mean over the lines of one line-side minus the other; the sign flips with the SM's side.
    contrast = lc[:, line_side].mean(axis=1) - lc[:, ~line_side].mean(axis=1)
    gap = float(abs(contrast[side > 0].mean() - contrast[side < 0].mean()) / 2)
    return side, gap


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
    side, gap = partition_sides(topo.line_cycles)
    if gap <= _SIDE_MIN_GAP_IN_NOISE * float(np.median(topo.line_noise)):
        side_block = np.zeros(topo.n_sm)
    else:
        side_block = side * gap / 2
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


# ---- the registry ----------------------------------------------------------------------------------
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Registry:
    """A directory of known signatures, one `<name>.json` per entry (plain JSON, no pickle).

    Writes are atomic (temporary file in the same directory, then os.replace), so a reader never sees
    half an entry. An entry that cannot be read or validated raises RegistryError naming its file.
    """

    def __init__(self, directory):
        self.directory = Path(directory).expanduser()

    def _path(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith(".json"):
            raise RegistryError(f"registry names are 1-128 characters of letters, digits, '.', '_', '-' "
                                f"starting with a letter or digit (and not ending in .json), got {name!r}")
        return self.directory / f"{name}.json"

    def _entries(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        paths = sorted(p for p in self.directory.glob("*.json") if not p.name.startswith("."))
        for p in paths:
            if not _NAME.fullmatch(p.stem):
                raise RegistryError(f"registry file {p} does not carry a valid entry name")
        return paths

    def names(self) -> list[str]:
        return [p.stem for p in self._entries()]

    def add(self, name: str, sig: DeviceSignature, replace: bool = False) -> Path:
        """Store `sig` under `name`; an existing name is an error unless replace=True."""
        if not isinstance(sig, DeviceSignature):
            raise TypeError(f"expected DeviceSignature, got {type(sig).__name__}")
        path = self._path(name)
        if path.exists() and not replace:
            raise RegistryError(f"registry entry {name!r} exists ({path}); pass replace=True to overwrite")
        return atomic_write(path, json.dumps(sig.to_dict()).encode())

    def remove(self, name: str) -> None:
        path = self._path(name)
        if not path.exists():
            raise KeyError(f"no registry entry named {name!r} in {self.directory}")
        path.unlink()

    def get(self, name: str) -> DeviceSignature:
        path = self._path(name)
        if not path.exists():
            raise KeyError(f"no registry entry named {name!r} in {self.directory}")
        return self._read(path)

    @staticmethod
    def _read(path: Path) -> DeviceSignature:
        try:
            return DeviceSignature.from_dict(json.loads(path.read_text()))
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, TypeError) as exc:
            raise RegistryError(f"registry entry {path} is corrupt: {exc}") from None

    def identify(self, topology_or_signature, threshold: float = DEFAULT_THRESHOLD) -> tuple:
        """(name or None, distance, margin): the nearest entry of the same device model.

        name is None when no compatible entry lies within `threshold`. distance: to the nearest compatible
        entry (inf if there is none). margin: the factor by which that distance clears the threshold on
        the side it falls (threshold / distance for a match, distance / threshold otherwise; 0 with no
        compatible entry). Entries of other models or lengths are skipped, never matched.
        """
        sig = topology_or_signature
        if isinstance(sig, Topology):
            sig = signature(sig)
        if not isinstance(sig, DeviceSignature):
            raise TypeError(f"identify() takes a Topology or DeviceSignature, got {type(sig).__name__}")
        if not threshold > 0:
            raise ValueError(f"threshold must be positive, got {threshold!r}")
        best_name, best = None, math.inf
        for path in self._entries():
            entry = self._read(path)
            if compatible(sig, entry):
                d = distance(sig, entry)
                if d < best:
                    best_name, best = path.stem, d
        if best_name is None:
            return None, math.inf, 0.0
        if best <= threshold:
            return best_name, best, (threshold / best if best > 0 else math.inf)
        return None, best, best / threshold


# ---- salted, locality-sensitive hashed export ------------------------------------------------------
def _salt_bytes(salt) -> bytes:
    if isinstance(salt, str):
        salt = salt.encode()
    if not isinstance(salt, bytes) or len(salt) < 8:
        raise ValueError("salt must be str or bytes of at least 8 bytes (keep it secret between the matchers)")
    return salt


def _hyperplanes(salt: bytes, dim: int, n_bits: int) -> np.ndarray:
    """n_bits random +-1 hyperplanes in `dim` dimensions, derived from the salt alone (SHAKE-256 bytes,
    the same on every machine and numpy version), each centered so that a constant offset added to the
    map cannot flip a bit."""
    key = hmac.new(salt, b"torch_l2topo lsh v1", hashlib.sha256).digest()
    raw = hashlib.shake_256(key + f"{dim}x{n_bits}".encode()).digest((dim * n_bits + 7) // 8)
    planes = np.unpackbits(np.frombuffer(raw, np.uint8))[:dim * n_bits].reshape(n_bits, dim) * 2.0 - 1.0
    return planes - planes.mean(axis=1, keepdims=True)


def export_hashed(sig: DeviceSignature, salt, n_bits: int = HASH_BITS) -> dict:
    """A JSON-able export for matching without sharing the raw maps. Nothing is exported unless called.

    chain: n_bits signs of the centered chain map projected on salt-keyed random hyperplanes (SimHash);
    the fraction of differing bits between two exports estimates the angle between the two maps / pi,
    so noise flips a few bits instead of breaking an exact hash. side: HMAC-SHA256(salt, partition sides),
    matched exactly (sides do not flip under noise). The device model stays in clear: it decides which
    exports may be compared at all. Whoever holds the salt can recompute the hyperplanes and estimate the
    map's direction from the bits (1-bit compressed sensing): the salt is the secret, and fewer bits leak
    less but separate less (see HASH_BITS).
    """
    if not isinstance(sig, DeviceSignature):
        raise TypeError(f"expected DeviceSignature, got {type(sig).__name__}")
    if not isinstance(n_bits, int) or not 8 <= n_bits <= 65536 or n_bits % 8:
        raise ValueError(f"n_bits must be a multiple of 8 in [8, 65536], got {n_bits!r}")
    salt = _salt_bytes(salt)
    bits = (_hyperplanes(salt, sig.sm_count, n_bits) @ sig.block("chain")) > 0
    side = np.sign(sig.block("side")).astype(np.int8)
    return {"format": _HASHED_FORMAT, "version": sig.version,
            "device": {"name": sig.name, "sm_count": int(sig.sm_count), "cc": list(sig.cc)},
            "salt_id": hashlib.sha256(b"torch_l2topo salt id\0" + salt).hexdigest()[:16],
            "n_bits": n_bits, "chain_bits": np.packbits(bits).tobytes().hex(),
            "side": hmac.new(salt, side.tobytes(), hashlib.sha256).hexdigest()}


def hashed_distance(a: dict, b: dict) -> float:
    """Fraction of differing chain bits between two hashed exports; 1.0 when their partition sides differ.

    Raises ValueError for exports of different formats, versions, device models, salts or bit counts.
    """
    for e in (a, b):
        if not isinstance(e, dict) or e.get("format") != _HASHED_FORMAT:
            raise ValueError(f"not a hashed signature export (format must be {_HASHED_FORMAT!r})")
    for key in ("version", "device", "salt_id", "n_bits"):
        if a.get(key) != b.get(key):
            raise ValueError(f"hashed exports differ in {key} ({a.get(key)!r} vs {b.get(key)!r}): "
                             f"only exports of one device model made with one salt can be compared")
    try:
        bits_a = np.unpackbits(np.frombuffer(bytes.fromhex(a["chain_bits"]), np.uint8))
        bits_b = np.unpackbits(np.frombuffer(bytes.fromhex(b["chain_bits"]), np.uint8))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"hashed export has unreadable chain_bits: {exc}") from None
    if bits_a.size != a["n_bits"] or bits_b.size != a["n_bits"]:
        raise ValueError(f"chain_bits do not hold n_bits={a['n_bits']} bits")
    if a.get("side") != b.get("side"):
        return 1.0
    return float(np.mean(bits_a != bits_b))


def match_hashed(a: dict, b: dict, threshold: float = DEFAULT_HASH_THRESHOLD) -> tuple[bool, float]:
    """(same GPU?, hashed_distance) for two exports made with the same salt."""
    d = hashed_distance(a, b)
    return d <= threshold, d
