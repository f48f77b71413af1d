"""Grow the fingerprint collection: calibrate every visible GPU, label it, and merge the result into the repo.

collect (on a GPU machine): for every visible GPU, `--rounds` calibrations per backend (calibrate(force=True),
waves mode, a private cache; check=False so that a map failing its self-checks is kept and flagged rather
than lost, after calibrate's own retries), each saved with the uuid replaced by its hash as
<session>-<machine>-gpu<i>-<backend>-<mode>-r<k>-<uuid hash>.npz, and one manifest row per calibration
(fingerprint_eval.COLUMNS: uuid and board serial hashes, date, session, machine, backend, mode) appended to
<out>/manifest.csv. The machine label is --machine, else a hash of the host name. Then it prints how far
apart this session's GPUs are, and identifies each against the committed collection (one registry entry per
device).

merge (here, after copying the output back): copies the .npz files into tests/data/fingerprints/ and
adds their rows to its manifest; rows already there (same file) are skipped, so merging twice is harmless.

    python benchmarks/collect_fingerprints.py collect --out $OUT/fingerprints [--machine A] [--rounds 2]
    python benchmarks/collect_fingerprints.py merge <copied output>/fingerprints
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import itertools
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from common import command_line, private_cache

from torch_l2topo.identity.evaluation import read_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "tests" / "data" / "fingerprints"
MANIFEST = COLLECTION / "manifest.csv"
BACKENDS = ("triton", "cuda")


def collect(out: Path, machine: str, rounds: int, mode: str) -> list[dict]:
    with private_cache("collect"):  # never the user's cache, and none left behind
        return _collect(out, machine, rounds, mode)


def _collect(out: Path, machine: str, rounds: int, mode: str) -> list[dict]:
    import torch

    import torch_l2topo

    session = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M")
    out.mkdir(parents=True, exist_ok=True)
    rows, topos = [], []
    for index in range(torch.cuda.device_count()):
        t0 = time.perf_counter()
        for backend in BACKENDS:
            for r in range(rounds):
                try:
                    topo = torch_l2topo.calibrate(index, backend=backend, mode=mode, force=True, check=False)
                except torch_l2topo.L2TopoError as exc:  # no map at all (SMs held, no backend): say, go on
                    print(f"gpu{index} {backend:6s} r{r}: not calibrated: {exc}", flush=True)
                    continue
                m = topo.meta
                name = f"{session.replace(':', '')}-{machine}-gpu{index}-{backend}-{mode}-r{r}-{m['uuid_hash']}.npz"
                topo.export_copy(command=command_line(), machine=machine, session=session).save(out / name)
                rows.append({"file": name, "member": "", "uuid_hash": m["uuid_hash"],
                             "serial_hash": m.get("serial_hash") or "", "date": m["date"], "session": session,
                             "machine": machine, "gpu_index": index, "backend": backend, "mode": mode,
                             "source": "benchmarks/collect_fingerprints.py"})
                topos.append((index, topo))
                print(f"gpu{index} {backend:6s} r{r}: uuid hash {m['uuid_hash']} serial hash "
                      f"{m.get('serial_hash') or 'unknown'} trusted {m['trust']['trusted']} "
                      f"({time.perf_counter() - t0:.1f} s on this GPU so far)", flush=True)
    manifest = out / "manifest.csv"
    previous = read_manifest(manifest) if manifest.exists() else []
    write_manifest(manifest, previous + rows)
    print(f"wrote {len(rows)} calibrations and their manifest rows to {out}")
    compare_within_session(topos)
    identify_against_collection(topos)
    return rows


def compare_within_session(topos) -> None:
    """Print how far apart the GPUs of this session are (first calibration each), with their serial hashes:
    two device indices with one map and one serial would be one board seen twice."""
    from torch_l2topo.identity.fingerprint import decide, distance, signature

    first = {}
    for index, topo in topos:
        first.setdefault(index, topo)
    for (i, a), (j, b) in itertools.combinations(sorted(first.items()), 2):
        d = distance(signature(a), signature(b))
        sa, sb = a.meta.get("serial_hash"), b.meta.get("serial_hash")
        same = "unknown" if not (sa and sb) else "the same" if sa == sb else "different"
        print(f"gpu{i} vs gpu{j} of this session: distance {d:.3f} ({decide(d)}); board serials {same}")


def identify_against_collection(topos) -> None:
    """Print what the committed collection says about each GPU just calibrated (first calibration per GPU)."""
    from torch_l2topo.identity.evaluation import device_of, load_collection
    from torch_l2topo.identity.registry import Registry

    if not MANIFEST.exists():
        return
    enrolled = {}
    for rec in load_collection(MANIFEST, ROOT):
        if rec.trusted and rec.signature is not None:
            enrolled.setdefault(device_of(rec), rec)
    with tempfile.TemporaryDirectory() as tmp:
        reg = Registry(tmp)
        for i, rec in enumerate(enrolled.values()):
            reg.add(f"{i:02d}-{rec.row['session'][:10]}-{rec.uuid_hash[:6]}", rec.signature,
                    uuid_hash=rec.uuid_hash, serial_hash=rec.serial_hash)
        seen = set()
        for index, topo in topos:
            if index not in seen:
                seen.add(index)
                print(f"gpu{index} against the collection ({len(enrolled)} devices): "
                      + reg.identify(topo).explain().replace("\n", "\n    "))


def merge(src: Path) -> int:
    """Copy src's .npz files into the collection and add src's manifest rows not already there."""
    rows = read_manifest(src / "manifest.csv")
    have = read_manifest(MANIFEST) if MANIFEST.exists() else []
    known = {r["file"] for r in have}
    added = []
    for row in rows:
        dest = COLLECTION / Path(row["file"]).name
        rel = str(dest.relative_to(ROOT))
        if rel in known:
            continue
        if not dest.exists():
            shutil.copyfile(src / Path(row["file"]).name, dest)
        elif _digest(dest) != _digest(src / Path(row["file"]).name):
            raise SystemExit(f"{dest} exists with other contents: not overwritten")
        added.append(dict(row, file=rel))
    write_manifest(MANIFEST, have + added)
    print(f"merged {len(added)} new rows ({len(rows) - len(added)} already present) into {MANIFEST}")
    return len(added)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="calibrate every visible GPU (needs GPUs)")
    c.add_argument("--out", required=True, type=Path, help="output directory (manifest.csv is appended to)")
    c.add_argument("--machine", help="machine label (default: 'host-' + a hash of the host name)")
    c.add_argument("--rounds", type=int, default=2, help="calibrations per backend and GPU (within-session pairs)")
    c.add_argument("--mode", default="waves", help="calibration mode (waves: the default calibrate() mode)")
    m = sub.add_parser("merge", help="merge a collect output directory into tests/data/fingerprints/")
    m.add_argument("src", type=Path)
    args = p.parse_args(argv)
    if args.command == "collect":
        machine = args.machine or "host-" + hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
        if not machine.replace("-", "").replace("_", "").isalnum():
            sys.exit(f"machine label must be letters, digits, '-' or '_', got {machine!r}")
        collect(args.out, machine, args.rounds, args.mode)
    else:
        merge(args.src)


if __name__ == "__main__":
    main()
