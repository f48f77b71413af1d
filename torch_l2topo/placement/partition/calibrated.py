"""What partition maps take from a calibration, derived once and kept on disk: each SM's calibrated near and far
latency (analysis/labels.py's sm_labels) and the SM pairs that time the blocks (pairs.choose_pairs).

Deriving them fits the calibration's NUCA model and pairs SMs with scipy: the import alone is most of a second,
and a process's first partition_map would pay it. They depend only on the calibration and the code that derives
them, so calibrated() keeps them in the calibration cache's directory (derived/), in a file named by the
calibration's digest (Topology.digest), the package version and the source of the deriving modules (DERIVED_BY):
a new calibration, or code that could derive otherwise, never reads another's file. A file that cannot be read is
derived again and replaced; one that cannot be written costs the next process the derivation, never the map.
Docs: docs/usage.md ("Placing work").
"""
from __future__ import annotations

import hashlib
import io
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ProbeError
from ...files import atomic_write
from ...measure.cache import cache_dir
from ...version import __version__
from .pairs import Pairs, choose_pairs

# the package modules that derive the data, relative to the package (tests/test_partition_map.py checks that
# derive() imports no other)
DERIVED_BY = ("analysis/__init__.py", "analysis/labels.py", "analysis/nuca.py", "labelings.py",
              "placement/partition/pairs.py", "placement/partition/calibrated.py")
_PACKAGE = Path(__file__).resolve().parents[2]
_FIELDS = ("near", "far", "sms", "margin", "best")

log = logging.getLogger("torch_l2topo")


@dataclass(frozen=True, eq=False)
class Calibrated:
    """near, far: (n_sm,) float64, each SM's calibrated mean latency to the lines homed in its own and in the other
    partition (labels.SMLabels.near_cycles, far_cycles; NaN for undecided SMs). pairs: choose_pairs'."""

    near: np.ndarray
    far: np.ndarray
    pairs: Pairs


def derive(topology) -> Calibrated:
    """The Calibrated of a calibration, computed (imports scipy). ProbeError if it shows no two partitions."""
    from ...analysis.labels import sm_labels

    labels = sm_labels(topology)
    if not labels.partitions.found:
        raise ProbeError(f"the calibration shows no two L2 partitions ({labels.partitions.reason}): there is "
                         "nothing to map")
    pairs = choose_pairs(topology.line_cycles, labels.partition, labels.line_partition)
    return Calibrated(labels.near_cycles, labels.far_cycles, pairs)


def calibrated(topology, use_cache: bool = True) -> Calibrated:
    """derive(topology), read from the file kept for this calibration (derived_path) where there is one, else
    derived and kept there (use_cache=False: derived, nothing read or written)."""
    if not use_cache:
        return derive(topology)
    path = derived_path(topology)
    hit = _read(path, topology.n_sm)
    if hit is not None:
        return hit
    got = derive(topology)
    try:
        atomic_write(path, _to_bytes(got), durable=False)  # a file lost in a crash is only derived again
    except OSError as exc:
        log.warning("torch_l2topo: the partition maps' calibrated pairs are not kept (%s: %s); the next process "
                    "derives them again", exc.filename or path, exc.strerror or exc)
    return got


def derived_path(topology) -> Path:
    """Where calibrated() keeps a calibration's Calibrated: named by the calibration's digest, the package version
    and the source of DERIVED_BY."""
    h = hashlib.sha256(f"{topology.digest()}:{__version__}".encode())
    for name in DERIVED_BY:
        h.update((_PACKAGE / name).read_bytes())
    return cache_dir() / "derived" / f"partition-pairs-{h.hexdigest()[:32]}.npz"


def _to_bytes(c: Calibrated) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, near=c.near, far=c.far, sms=c.pairs.sms, margin=c.pairs.margin, best=np.array(c.pairs.best))
    return buf.getvalue()


def _read(path: Path, n_sm: int) -> Calibrated | None:
    """The Calibrated kept at `path`, or None: no file, or one that is unreadable or holds arrays of other shapes
    (logged in one line: it is then replaced)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            near, far, sms, margin, best = (z[k] for k in _FIELDS)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("torch_l2topo: ignoring unreadable %s (%s); deriving it again", path, exc)
        return None
    if not (near.shape == far.shape == (n_sm,) and sms.ndim == 2 and sms.shape[1] == 2 and sms.dtype.kind == "i"
            and margin.shape == (len(sms),) and best.shape == (2,) and np.all((sms >= 0) & (sms < n_sm))):
        log.warning("torch_l2topo: ignoring %s, whose arrays do not fit a calibration of %d SMs; deriving it again",
                    path, n_sm)
        return None
    return Calibrated(near, far, Pairs(sms=sms, margin=margin, best=(int(best[0]), int(best[1]))))
