#!/usr/bin/env bash
# Every GPU measurement behind benchmarks/results/, in one call on the device machine (an H100 or one or two H200s;
# the result files of the older steps are named _h200: rename them after the GPU that ran them).
# Writes everything under $OUT/r and packs it as $OUT/r.tgz. Steps are independent: one failing does not
# stop the others (each logs to $OUT/r/<step>.log). Back here, the result files go to benchmarks/results/<benchmark>/
# and `python benchmarks/tabulate_runs.py FILE...` appends their rows to the tables.
#   bash benchmarks/run_h200_suite.sh [steps...]     steps: tests noise trust placement partition green replication
#                                                    fingerprints sanitizer ops ops-full profiler whole-model
#                                                    overhead first-call
# ops-full: the ops' full grid (docs/ops_full_grid.md) in slices, $OPS_FULL of them (default all ten:
# "embedding_bag:1/4 ... forest:6/6"), packing $OUT/r.tgz after each, so a call that runs out of time still
# returns the slices it finished (the device tool returns a few files per call: one archive).
set -u
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
if ls .whl/*.whl > /dev/null 2>&1; then  # HolisticTraceAnalysis for the profiler's checks: its wheels, carried in .whl/
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 MAX_JOBS=16
R=$OUT/r
mkdir -p "$R/calibrations" "$R/trust"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
steps=${*:-tests noise trust placement partition}
run() { echo "== $1 $(date +%T)"; }
pack() { (cd "$OUT" && tar czf r.tgz r); }
OPS_FULL=${OPS_FULL:-"embedding_bag:1/4 embedding_bag:2/4 embedding_bag:3/4 embedding_bag:4/4 forest:1/6 forest:2/6 forest:3/6 forest:4/6 forest:5/6 forest:6/6"}
for step in $steps; do
  run "$step"
  case $step in
    tests) python3 -m pytest -q -p no:cacheprovider -m gpu tests --timeout 300 2>&1 | tee "$R/gpu_tests.log" | tail -15 ;;
    noise) for d in $(seq 0 $((NGPU - 1))); do
             (cd benchmarks && python3 bench_noise.py --device $d --out "$R/noise_h200_gpu$d.json" --raw "$R/noise_gpu$d.npz" > "$R/noise_gpu$d.log" 2>&1; tail -12 "$R/noise_gpu$d.log") &
           done; wait ;;
    trust) for d in $(seq 0 $((NGPU - 1))); do
             (cd benchmarks && python3 bench_trust.py --device $d --out "$R/trust_h200_gpu$d.json" --raw "$R/trust/gpu$d.npz" 2>&1 | tee "$R/trust_gpu$d.log" | tail -6)
           done ;;
    placement) (cd benchmarks && python3 bench_placement.py --device 0 --out "$R/placement_h200.json" 2>&1 | tee "$R/placement.log" | tail -60) ;;
    partition) (cd benchmarks && python3 bench_partition_map.py --device 0 --out "$R/partition_map_h200.json" 2>&1 | tee "$R/partition.log" | tail -12) ;;
    green) (cd benchmarks && python3 bench_green.py --device 0 --out "$R/green_h200.json" 2>&1 | tee "$R/green.log" | tail -8) ;;
    replication) (cd benchmarks && python3 bench_replication.py --device 0 --out "$R/replication_h200.json" 2>&1 | tee "$R/replication.log" | tail -8) ;;
    fingerprints) (cd benchmarks && python3 collect_fingerprints.py collect --out "$R/fingerprints" --rounds 2 2>&1 | tee "$R/collect.log" | tail -6) ;;
    sanitizer) bash benchmarks/run_sanitizer.sh "$R/sanitizer" ;;
    ops) (cd benchmarks && python3 bench_ops_kernels.py --only host --only tiles --out "$R/ops_kernels_h200.json" 2>&1 | tee "$R/ops_kernels.log" | tail -4
          python3 bench_ops_kernels.py --only forest_copies --reps 7 --out "$R/ops_forest_copies_h200.json" 2>&1 | tee "$R/copies.log" | tail -7
          python3 bench_ops.py --reps 9 --out "$R/ops_h200.json" 2>&1 | tee "$R/ops.log" | tail -40
          python3 bench_eager_kernel.py --out "$R/eager_kernel_h200.json" > "$R/eager_kernel.log" 2>&1; tail -1 "$R/eager_kernel.log"
          python3 diagnose/diag_eager_host.py --out "$R/eager_host_h200.json" > "$R/eager_host.log" 2>&1; tail -1 "$R/eager_host.log") ;;
    ops-full) mkdir -p "$R/ops_full"
              for slice in $OPS_FULL; do
                op=${slice%%:*} part=${slice#*:}; short=${op/embedding_bag/eb}; name="ops_full_h200_${short}_${part%%/*}"
                (cd benchmarks && python3 bench_ops.py --grid full --only "$op" --part "$part" --reps 5 \
                   --out "$R/ops_full/$name.json" > "$R/ops_full/$name.log" 2>&1; tail -2 "$R/ops_full/$name.log")
                pack
              done ;;
    profiler) (cd benchmarks && python3 bench_profiler.py --device 0 --reps 8 --adjacent-blocks 8 --heavy-reps 2 \
                 --out "$R/profiler.json" 2>&1 | tee "$R/profiler.log" | tail -8) ;;
    whole-model) (cd benchmarks && python3 bench_whole_model.py --device 0 --reps 6 --out "$R/whole_model.json" 2>&1 |
                    tee "$R/whole_model.log" | grep -E "twins /|coverage") ;;
    overhead) (cd benchmarks && python3 bench_placement.py --device 0 --only overhead --out "$R/placement_overhead.json" \
                 2>&1 | tee "$R/overhead.log" | grep "overhead ") ;;
    first-call) for backend in triton auto; do
                  [ $backend = auto ] && python3 -m torch_l2topo build > "$R/build.log" 2>&1
                  python3 benchmarks/diagnose/diag_partition_map_first_call.py --device 0 --backend $backend \
                    --out "$R/partition_map_first_call_$backend.json" 2>&1 | tee "$R/first_call_$backend.log" | tail -16
                done ;;
  esac
  cp benchmarks/results/*.jsonl "$R/" 2>/dev/null  # the tables the benchmarks appended to here
  pack
done
cd "$OUT" && tar czf r.tgz r && rm -rf r && ls -la "$OUT"
