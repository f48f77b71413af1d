"""hashed.py: salted exports match the same GPU only (on GPUs the hash threshold was not tuned on), reveal
no map, and refuse what cannot be compared."""
import itertools
import json

import numpy as np
import pytest
from recorded import TEST_GPUS, gpu_of, with_changes

from torch_l2topo.identity import hashed as hx

SALTS = ("team-secret-1", b"\x00\x01another-salt", "third salt value")


@pytest.mark.parametrize("salt", SALTS)
def test_hashed_export_matches_same_gpu_only(sigs, salt):
    ex = {k: hx.export_hashed(s, salt) for k, s in sigs.items()}
    for a, b in itertools.combinations(ex, 2):
        if gpu_of(a) not in TEST_GPUS and gpu_of(b) not in TEST_GPUS:
            continue  # both in the tuning set of DEFAULT_HASH_THRESHOLD
        same, d = hx.match_hashed(ex[a], ex[b])
        assert same == (gpu_of(a) == gpu_of(b)), (a, b, d)


def test_hashed_export_reveals_no_map_and_is_deterministic(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    ex = hx.export_hashed(s, "team-secret-1")
    assert ex == hx.export_hashed(s, "team-secret-1")
    assert ex != hx.export_hashed(s, "team-secret-2")
    assert len(bytes.fromhex(ex["chain_bits"])) * 8 == ex["n_bits"] == hx.HASH_BITS
    assert not [v for v in ex.values() if isinstance(v, float)] and "vector" not in ex
    assert json.loads(json.dumps(ex)) == ex  # plain JSON types only, nothing lost on the way


def test_hashed_export_refuses_mismatched_salt_model_or_bits(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    ex = hx.export_hashed(s, "team-secret-1")
    with pytest.raises(ValueError, match="salt_id"):
        hx.hashed_distance(ex, hx.export_hashed(s, "team-secret-2"))
    with pytest.raises(ValueError, match="device"):
        hx.hashed_distance(ex, hx.export_hashed(with_changes(s, name="NVIDIA H100 80GB HBM3"), "team-secret-1"))
    with pytest.raises(ValueError, match="n_bits"):
        hx.hashed_distance(ex, hx.export_hashed(s, "team-secret-1", n_bits=256))
    with pytest.raises(ValueError, match="salt"):
        hx.export_hashed(s, "short")
    with pytest.raises(ValueError, match="multiple of 8"):
        hx.export_hashed(s, "team-secret-1", n_bits=100)
    with pytest.raises(ValueError, match="not a hashed"):
        hx.hashed_distance(ex, s.to_dict())


def test_hashed_export_ignores_a_constant_offset_and_checks_sides(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    shifted = with_changes(s, vector=s.vector + np.r_[np.full(132, 3.0), np.zeros(132)])
    assert hx.hashed_distance(hx.export_hashed(s, "team-secret-1"), hx.export_hashed(shifted, "team-secret-1")) == 0
    flipped = with_changes(s, vector=np.r_[s.block("chain"), -s.block("side")])
    assert hx.hashed_distance(hx.export_hashed(s, "team-secret-1"), hx.export_hashed(flipped, "team-secret-1")) == 1.0
