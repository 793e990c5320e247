#!/bin/bash
# One device call of the LayerNorm benchmark (cuda/cli/layer_norm_bench):
# builds it unless a prebuilt binary is given and runs there, then the
# check, the timing table and ncu of chosen rows. Logs go to $OUT.
#   cuda/cli/layer_norm_device_run.sh [prebuilt-binary] [ncu-steps]
# ncu-steps: "shape|label|kernel-regex;..." (label as the bench prints it).
set -o pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/ln-out}
mkdir -p "$out"
bench=$1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$out/env.txt" 2>&1
if [ -z "$bench" ] || ! "$bench" --no-check --no-time >> "$out/env.txt" 2>&1; then
  echo "building the benchmark here" >> "$out/env.txt"
  cmake -S "$here/cuda" -B /tmp/ln-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLX_RMSNORM_CUDA_ARCHS=90 > "$out/build.log" 2>&1 &&
    cmake --build /tmp/ln-build --target layer_norm_bench -- -j16 >> "$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log"; exit 1; }
  bench=/tmp/ln-build/layer_norm_bench
fi
timeout 200 "$bench" --graphs 15 2>&1 | tee "$out/bench.log" | grep -v "^[0-9]*x[0-9]* *ln bwd new" | tail -60
ncu_cmd=(ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
         --section WarpStateStats --section LaunchStats --section Occupancy
         --launch-skip 1 --launch-count 1)
IFS=';' read -ra steps <<< "$2"
for step in "${steps[@]}"; do
  IFS='|' read -r shape label regex <<< "$step"
  echo "=== $shape | $label | $regex" >> "$out/ncu.txt"
  timeout 60 "${ncu_cmd[@]}" -k "regex:$regex" "$bench" --ncu --shape "$shape" --only "$label" \
    >> "$out/ncu.txt" 2>&1
done
grep -E "^===|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Memory Throughput" "$out/ncu.txt" | head -80
