#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every kernel of the package, on the local
# GPU; logs to ${1:-$OUT/sanitizer}/<tool>.log and one summary line per tool (SANITIZER_TIMEOUT_S bounds each
# tool; SANITIZER_TOOLS picks some).
#   bash benchmarks/run_sanitizer.sh [LOG_DIR]
set -u
dir=${1:-$OUT/sanitizer}
mkdir -p "$dir"
python3 -m torch_l2topo calibrate --out "$dir/calibration.npz" > "$dir/calibration.txt" 2>&1  # outside the sanitizer
# One cudaMalloc per tensor: memcheck then sees an access past a tensor's end instead of inside a cached block.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check no"
  timeout "${SANITIZER_TIMEOUT_S:-600}" compute-sanitizer --tool "$tool" $extra --print-limit 50 --log-file "$dir/$tool.log" \
    python3 benchmarks/sanitize_kernels.py "$dir/calibration.npz" > "$dir/$tool.out" 2>&1
  echo "$tool: exit $? | $(grep -hE '(ERROR|RACECHECK) SUMMARY' "$dir/$tool.log" | tail -1) | $(grep -c '^ok ' "$dir/$tool.out") kernels ok, $(grep -c '^FAILED' "$dir/$tool.out") failed"
done | tee "$dir/summary.txt"
