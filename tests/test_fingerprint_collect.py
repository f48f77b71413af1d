"""benchmarks/collect_fingerprints.py on CPU: collect with a stand-in for the GPUs, then merge twice."""
import os
import sys
import tempfile

import pytest
from recorded import ROOT, load_collection

from torch_l2topo import Topology, load_example
from torch_l2topo.identity.evaluation import read_manifest

sys.path.insert(0, str(ROOT / "benchmarks"))
import collect_fingerprints as cf  # noqa: E402

GPUS = {0: ("h200-d557bc-cuda-waves", "0123456789ab", "aaaaaaaaaaaa"),  # d557bc's map under a new uuid
        1: ("h200-1e5731-cuda-waves", "1e5731f1cbe2", None)}


@pytest.fixture
def two_gpus(monkeypatch):
    import torch

    import torch_l2topo

    def calibrate(index, backend, mode, force, check):
        assert force and not check  # a fresh map every time; a disturbed one is kept and flagged
        name, uuid, serial = GPUS[index]
        topo = load_example(name)
        topo.meta.update(uuid_hash=uuid, serial_hash=serial, backend=backend,
                         trust={"trusted": True, "problems": [], "notes": []})
        return topo

    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(GPUS))
    monkeypatch.setattr(torch_l2topo, "calibrate", calibrate)


def test_collect_then_merge_twice(two_gpus, tmp_path, monkeypatch, capsys):
    out, temp = tmp_path / "out", tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TORCH_L2TOPO_CACHE", str(tmp_path / "users-cache"))
    cf.main(["collect", "--out", str(out), "--machine", "test-rig", "--rounds", "1"])
    # its private cache is gone, and the user's is set again
    assert not list(temp.iterdir()) and os.environ["TORCH_L2TOPO_CACHE"] == str(tmp_path / "users-cache")
    printed = capsys.readouterr().out
    assert "gpu0 against the collection" in printed and "same GPU, new UUID" in printed
    assert "gpu0 vs gpu1 of this session" in printed and "(no match)" in printed
    rows = read_manifest(out / "manifest.csv")
    assert [(r["gpu_index"], r["backend"]) for r in sorted(rows, key=lambda r: (r["gpu_index"], r["backend"]))] == \
        [("0", "cuda"), ("0", "triton"), ("1", "cuda"), ("1", "triton")]
    assert {r["serial_hash"] for r in rows} == {"aaaaaaaaaaaa", ""} and {r["machine"] for r in rows} == {"test-rig"}
    for r in rows:
        meta = Topology.load(out / r["file"]).meta
        assert meta["device"]["uuid"].startswith("sha256:") and meta["machine"] == "test-rig"

    collection = tmp_path / "repo" / "tests" / "data" / "fingerprints"
    collection.mkdir(parents=True)
    monkeypatch.setattr(cf, "ROOT", tmp_path / "repo")
    monkeypatch.setattr(cf, "COLLECTION", collection)
    monkeypatch.setattr(cf, "MANIFEST", collection / "manifest.csv")
    assert cf.merge(out) == 4
    assert cf.merge(out) == 0  # merging again adds nothing
    merged = read_manifest(collection / "manifest.csv")
    assert len(merged) == 4 and all(r["file"].startswith("tests/data/fingerprints/") for r in merged)
    from torch_l2topo.identity.evaluation import load_collection as load

    assert {r.uuid_hash for r in load(collection / "manifest.csv", tmp_path / "repo")} == {"0123456789ab",
                                                                                            "1e5731f1cbe2"}


def test_committed_manifest_rows_are_unique():
    rows = read_manifest(ROOT / "tests" / "data" / "fingerprints" / "manifest.csv")
    assert len({(r["file"], r["member"]) for r in rows}) == len(rows) == len(load_collection())
