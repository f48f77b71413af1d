#!/usr/bin/env bash
# Every GPU measurement behind benchmarks/results/, in one call on a two-GPU H200 machine (the device tool's
# nvidia-h200-x2). Writes everything under $OUT/r and packs it as $OUT/r.tgz.
#   bash benchmarks/run_h200_suite.sh
set -u
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
export PYTHONUNBUFFERED=1 MAX_JOBS=16
R=$OUT/r
mkdir -p "$R/calibrations" "$R/selfloc"
python3 -m pytest -q -p no:cacheprovider -m gpu tests --timeout 300 2>&1 | tee "$R/gpu_tests.log" | tail -4
cd benchmarks
for d in 0 1; do
  python3 bench_calibrate.py --device $d --gpc --cold-runs 3 --out "$R/calibrate_h200_gpu$d.json" \
    --save-dir "$R/calibrations" 2>&1 | tail -18
done
for d in 0 1; do python3 bench_selfloc.py record --device $d --out "$R/selfloc/gpu$d.npz" 2>&1 | tail -2; done
python3 bench_selfloc.py record --device 0 --out "$R/selfloc/gpu0-second-process.npz" 2>&1 | tail -2
for d in 0 1; do python3 bench_fingerprint_gpu.py --device $d --phase restart --out "$R/calibrations" 2>&1 | tail -2; done
for d in 0 1; do
  python3 bench_fingerprint_gpu.py --device $d --phase load --burn-s "${BURN_S:-120}" --out "$R/calibrations" 2>&1 | tail -2 &
done
wait
cd "$OUT" && tar czf r.tgz r && rm -rf r && ls -la "$OUT"
