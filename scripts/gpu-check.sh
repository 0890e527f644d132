#!/usr/bin/env bash
# scripts/gpu-check.sh: the one prepared script a GPU machine runs (issue 14):
# build keel with the CUDA backend for sm_90, run the kernels' parity tests
# against the CPU references, and write every log and a JSON of results to
# OUT (default ./gpu-check). What the backend cannot do yet is listed as
# missing in the JSON, never faked. Under 8 minutes on the device machine.
#
#   bash scripts/gpu-check.sh [OUT]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=${1:-${OUT:-$root/gpu-check}}
mkdir -p "$out"
build=$root/build-gpu
results=()
record() { results+=("\"$1\": $2"); }
{
  date -u; nvidia-smi 2>&1 | head -15; nvcc --version 2>&1 | tail -2
} >"$out/machine.log"
t0=$(date +%s)
if cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON -DKEEL_CUDA_ARCHITECTURES=90 \
     >"$out/configure.log" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" --target keel gpu_parity >"$out/build.log" 2>&1; then
  record build "{\"ok\": true, \"seconds\": $(( $(date +%s) - t0 ))}"
  "$build/tests/gpu_parity" >"$out/gpu_parity.log" 2>&1
  rc=$?
  record gpu_parity "{\"exit\": $rc, \"passed\": $([ $rc = 0 ] && echo true || echo false), \"log\": \"gpu_parity.log\"}"
else
  record build "{\"ok\": false, \"log\": \"configure.log, build.log\"}"
fi
record missing '["the model and FSDP on the CUDA backend (device cuda refuses to train)", "cuBLASLt GEMMs", "flash attention", "the output projection fused with the cross-entropy", "NCCL collectives", "50-step GPU run vs CPU losses", "GPU<->CPU checkpoint round trip", "tokens/s and MFU bench vs PyTorch"]'
{
  echo "{"
  for i in "${!results[@]}"; do printf '  %s%s\n' "${results[$i]}" "$([ "$i" -lt $(( ${#results[@]} - 1 )) ] && echo ,)"; done
  echo "}"
} >"$out/results.json"
cat "$out/results.json"
