"""Salted, locality-sensitive hashed export of a device signature: match GPUs without sharing their maps.

Nothing is exported unless export_hashed() is called; whoever holds the salt can compare exports.
"""
from __future__ import annotations

import hashlib
import hmac

import numpy as np

from .fingerprint import DeviceSignature

FORMAT = "torch_l2topo/hashed-signature"

# 1024 sign bits over the centered chain map: the bit count sets the spread (sd ~ sqrt(p(1-p)/bits)) of the
# within- and between-device Hamming fractions, and fewer bits reveal less of the map but separate less.
# 1024 and 0.044 (the geometric boundary): from the fingerprint tuning set (benchmarks/bench_fingerprint.py).
HASH_BITS = 1024
DEFAULT_HASH_THRESHOLD = 0.044


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
    return {"format": FORMAT, "version": sig.version,
            "device": {"name": sig.name, "sm_count": int(sig.sm_count), "cc": list(sig.cc)},
            "salt_id": hashlib.sha256(b"torch_l2topo salt id\0" + salt).hexdigest()[:16],
            "n_bits": n_bits, "chain_bits": np.packbits(bits).tobytes().hex(),
            "side": hmac.new(salt, side.tobytes(), hashlib.sha256).hexdigest()}


def hashed_distance(a: dict, b: dict) -> float:
    """Fraction of differing chain bits between two hashed exports; 1.0 when their partition sides differ.

    Raises ValueError for exports of different formats, versions, device models, salts or bit counts.
    """
    for e in (a, b):
        if not isinstance(e, dict) or e.get("format") != FORMAT:
            raise ValueError(f"not a hashed signature export (format must be {FORMAT!r})")
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
