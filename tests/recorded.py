"""The recorded H200 calibrations behind the CPU tests, and which of them tuned which constant.

tests/data/calibrations/ holds real calibrations of four H200s (uuid hashes in the names), each
with both backends and several modes. Two of them tuned constants: localize.SEPARATION_IN_NOISE and
fingerprint.DEFAULT_THRESHOLD (and hashed.DEFAULT_HASH_THRESHOLD) were chosen on TUNING_GPUS
(benchmarks/bench_fingerprint.py, benchmarks/results/fingerprint/fingerprint_h200_cpu.json). Tests that check those
constants use TEST_GPUS only, so a constant that merely fits the data it was tuned on fails them.
"""
from pathlib import Path

from torch_l2topo import Topology
from torch_l2topo.identity.fingerprint import DeviceSignature

CALIBRATIONS = Path(__file__).resolve().parent / "data" / "calibrations"
TUNING_GPUS = ("d557bc", "f78934")
TEST_GPUS = ("1e5731", "d00e55")

# The labelled fingerprint collection (issue 11): fingerprint.DEFAULT_THRESHOLD and AMBIGUITY_FACTOR were fit
# on pairs inside TUNING_SESSIONS (benchmarks/bench_fingerprint.py keeps the same split); tests of the
# decision use pairs with at least one calibration from another session.
ROOT = Path(__file__).resolve().parents[1]
COLLECTION_MANIFEST = ROOT / "tests" / "data" / "fingerprints" / "manifest.csv"
TUNING_SESSIONS = ("2026-11-30T05:37", "2026-11-30T21:34")


def load_collection() -> list:
    """fingerprint_eval.Records of every row of the collection manifest."""
    from torch_l2topo.identity.evaluation import load_collection as load

    return load(COLLECTION_MANIFEST, ROOT)


def gpu_of(name: str) -> str:
    """'h200-1e5731-cuda-waves' -> '1e5731'."""
    return name.split("-")[1]


def load_all() -> dict:
    """{file stem: Topology} of every recorded calibration."""
    paths = sorted(CALIBRATIONS.glob("*.npz"))
    assert len(paths) >= 32, f"recorded calibrations missing under {CALIBRATIONS}"
    return {p.stem: Topology.load(p) for p in paths}


def with_changes(sig: DeviceSignature, **changes) -> DeviceSignature:
    """A copy of a signature with some fields replaced (another model, length, vector)."""
    fields = dict(name=sig.name, sm_count=sig.sm_count, cc=sig.cc, vector=sig.vector)
    fields.update(changes)
    return DeviceSignature(**fields)
