#!/usr/bin/env bash
# scripts/gpu-check.sh: the one prepared script a GPU machine runs.
# Every stage has its own time limit and records its result, so one stage
# failing never loses the others; everything goes to OUT (default
# ./gpu-check): results.json, and logs.tar.gz with every stage's log and the
# runs' metrics.jsonl and summary.json. Under 8 minutes on an H200.
#
#   stages  build     keel and gpu_parity for sm_90 (or take a pack, below)
#           parity    tests/cuda/gpu_parity.c: every CUDA kernel against its CPU reference
#           health    keel health --checks gpu on the real NVML
#           losses    50 steps of configs/tiny.json: cpu fp32, cuda fp32, cuda bf16;
#                     each step's loss compared with the CPU's
#           nccl      FSDP on GPUs: keel train --nproc (MPI from the pack, NCCL): 1 rank
#                     (and under --launcher local: NCCL bootstrapped over Gloo, keel agent's way)
#                     against the one-process GPU run, bf16 gathers and reduce-scatters
#                     against the CPU; 2 ranks against 1 where the machine has 2 GPUs,
#                     else more ranks than GPUs refused
#           roundtrip a checkpoint written on the GPU resumed on the CPU, and the reverse
#           bench     tokens/s and MFU: a 1.1B Llama (dim 2048, 22 layers, 32 heads,
#                     4 KV heads, ffn 5632, T 2048) and Llama 2 7B checkpointing the
#                     fewest blocks that fit (keel plan --memory: the GPU's free memory
#                     less 2 GiB), keel --device cuda beside bench/torch_gpu.py; each
#                     keel run's second step profiled (train.profile_steps): the calls
#                     that took 1% of it or more, with their TFLOP/s
#
#   bash scripts/gpu-check.sh [OUT]            build here (needs keel's build dependencies)
#   bash scripts/gpu-check.sh --pack DIR       on a machine with them: build for sm_90 and
#                                              pack keel, gpu_parity, their libraries
#                                              (not glibc, cuBLASLt or NCCL) and OpenMPI's
#                                              launcher with its plugins into DIR
#   bash scripts/gpu-check.sh --from DIR [OUT] on the GPU machine: run from such a pack
# A GPU machine without keel's dependencies (no package registry: the device
# tool's machines) runs from a pack made here and carried (see docs/gpus.md).
# GPU_CHECK_STAGES="parity losses" runs only those; GPU_CHECK_SECONDS (540)
# bounds the whole run: a stage gets what is left if that is less than its
# own limit (a stage with no time left fails at once and says so in its log).
#
# A rehearsal without a GPU: GPU_CHECK_EMULATOR=BUILD (a test build, which has
# keel-cuemu: tests/cuemu) runs the stages on the host CUDA emulator instead
# of a build or pack — parity at its small shapes, the runs on
# tests/cuemu/micro.json — so the script's own logic runs end to end before
# device time is spent; results.json says "emulated": true, and the bench
# stage refuses (nothing timed there is a GPU number).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stages=${GPU_CHECK_STAGES:-"build parity health losses nccl roundtrip bench"}

build_gpu() { # DIR: configure and build keel + gpu_parity for sm_90 there
  cmake -S "$root" -B "$1" -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON -DKEEL_CUDA_ARCHITECTURES=90 &&
    cmake --build "$1" -j "$(nproc)" --target keel gpu_parity
}

if [ "${1:-}" = --pack ]; then
  pack=${2:?--pack DIR}
  build=$root/build-gpu
  build_gpu "$build" >/dev/null || { echo "gpu-check --pack: the build failed (cmake --build $build)" >&2; exit 1; }
  s=$pack/stage
  rm -rf "$pack" && mkdir -p "$s/bin" "$s/lib/openmpi" "$s/lib/pmix" "$s/share" "$s/etc"
  cp "$build/keel" "$build/tests/gpu_parity" "$s/bin/"
  # OpenMPI (keel --nproc runs mpirun), relocated by the OPAL_*/PMIX_* variables --from sets:
  # Debian's layout, found from its mpirun
  ompi=$(dirname "$(readlink -f "$(command -v mpirun)")")
  ompi_lib=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
  pmix=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libpmix.so.2 /{print $NF; exit}')")")
  [ -d "$ompi_lib" ] && [ -x "$ompi/orted" ] && [ -d "$pmix/pmix" ] ||
    { echo "gpu-check --pack: OpenMPI's plugins not found (mpirun $ompi, pkglibdir '$ompi_lib', pmix '$pmix')" >&2; exit 1; }
  cp "$ompi/orterun" "$s/bin/mpirun" && cp "$ompi/orted" "$s/bin/"
  cp "$ompi_lib"/*.so "$s/lib/openmpi/" && cp "$pmix"/pmix/*.so "$s/lib/pmix/"
  cp -r "$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')" "$s/share/openmpi"
  cp -r "$pmix/../share" "$s/share/pmix" 2>/dev/null || mkdir -p "$s/share/pmix"
  cp "$(ompi_info --path sysconfdir --parsable | sed -n 's/^path:sysconfdir://p')"/* "$s/etc/" 2>/dev/null
  # every library these load but glibc's own, cuBLASLt and NCCL (the GPU machine's CUDA has them)
  ldd "$s"/bin/* "$s"/lib/openmpi/*.so "$s"/lib/pmix/*.so 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libcublasLt|libnccl)\.so|ld-linux' |
    xargs -I{} cp -L {} "$s/lib/"
  tar -C "$pack/stage" -cf - . | xz -T0 -6 >"$pack/keel-gpu.tar.xz" && rm -rf "$pack/stage"
  echo "gpu-check: packed $(du -h "$pack/keel-gpu.tar.xz" | cut -f1) into $pack/keel-gpu.tar.xz"
  exit 0
fi

from=""
if [ "${1:-}" = --from ]; then from=${2:?--from DIR}; shift 2; fi
out=${1:-${OUT:-$root/gpu-check}}
logs=$out/logs # bundled into OUT/logs.tar.gz at the end: a device call brings back only a few files
mkdir -p "$logs"
deadline=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-540} )) # a device call may run 600 s: finish inside it
results=()
# results.json and logs.tar.gz are rewritten after every result, so a run cut
# short still brings back what it found
record() {
  results+=("\"$1\": $2")
  echo "gpu-check: $1: $2" >&2
  write_results
}
want() { [[ " $stages " == *" $1 "* ]]; }
# limit SECONDS: SECONDS, or what is left before the deadline if less (at least 1: timeout 0 would mean none)
limit() { local left=$(( deadline - $(date +%s) - 10 )); [ "$left" -lt "$1" ] && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
write_results() {
  {
    echo "{"
    for i in "${!results[@]}"; do printf '  %s%s\n' "${results[$i]}" "$([ "$i" -lt $(( ${#results[@]} - 1 )) ] && echo ,)"; done
    echo "}"
  } >"$out/results.json"
  for d in "${run_dir:-/nonexistent}"/*/; do
    [ -d "$d" ] || continue
    n=$(basename "$d")
    cp "$d/metrics.jsonl" "$logs/$n.metrics.jsonl" 2>/dev/null
    cp "$d/summary.json" "$logs/$n.summary.json" 2>/dev/null
    cp "$d/profile.json" "$logs/$n.profile.json" 2>/dev/null
  done
  tar -C "$out" -czf "$out/logs.tar.gz" logs
}
trap 'write_results; rm -rf "$logs"' EXIT
trap 'exit 143' TERM INT

{ date -u; nvidia-smi 2>&1 | head -15; nvcc --version 2>&1 | tail -2; nproc; ldd --version 2>&1 | head -1; } >"$logs/machine.log"

# ---- build (or unpack) ---------------------------------------------------------
t0=$(date +%s)
tiny_config=$root/configs/tiny.json
emulated=${GPU_CHECK_EMULATOR:-}
if [ -n "$emulated" ]; then
  keel=$emulated/keel-cuemu parity=$emulated/tests/gpu_parity_cuemu
  [ -x "$keel" ] && [ -x "$parity" ] && [ -e "$emulated/cuemu/libnccl.so.2" ] ||
    { record build "{\"ok\": false, \"emulated\": true, \"why\": \"no keel-cuemu in $emulated (a build with -DKEEL_CUDA_EMULATOR=ON)\"}"; exit 1; }
  export LD_LIBRARY_PATH="$emulated/cuemu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" KEEL_GPU_PARITY_SHAPES=small
  # a sanitized build: the leaks that are not keel's suppressed, as the tests do (tests/lib.sh)
  if grep -q '^KEEL_SANITIZE:BOOL=ON' "$emulated/CMakeCache.txt" 2>/dev/null; then
    export ASAN_OPTIONS=fast_unwind_on_malloc=0 OMPI_MCA_mca_base_component_disable_dlclose=1 \
      LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
  fi
  tiny_config=$root/tests/cuemu/micro.json
  record build "{\"ok\": true, \"emulated\": true, \"from\": \"$emulated\"}"
elif [ -n "$from" ]; then
  bin=/tmp/keel-gpu && rm -rf "$bin" && mkdir -p "$bin"
  unpack() { # xz where it is installed, else Python's lzma
    if command -v xz >/dev/null; then xz -dc "$from/keel-gpu.tar.xz" | tar -C "$bin" -xf -
    else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$from/keel-gpu.tar.xz" "$bin"; fi
  }
  if unpack 2>"$logs/build.log"; then
    # the pack's libraries (Debian 12's libstdc++, expat, ...) for keel and OpenMPI only: PyTorch
    # (bench/torch_gpu.py) runs on the machine's own, which may be newer than the pack's
    system_ld=${LD_LIBRARY_PATH:-}
    export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    # cuBLASLt (opened on the first GEMM): the toolkit's, else the one PyTorch's wheels carry
    # (nvidia/cu13/lib or nvidia/cublas/lib in site-packages)
    lt=$(find /usr/local/cuda/lib64/ /usr/local/cuda/ /usr/lib/x86_64-linux-gnu/ /opt/ \
           $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
           -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    [ -n "$lt" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$lt")"
    echo "cuBLASLt: ${lt:-not found}" >>"$logs/build.log"
    nccl=$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /usr/local/cuda/ /usr/lib/x86_64-linux-gnu/ /opt/ \
             $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
             -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nccl" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$nccl")"
    echo "NCCL: ${nccl:-not found}" >>"$logs/build.log"
    # the packed OpenMPI, wherever it was unpacked (keel finds mpirun on PATH)
    export PATH="$bin/bin:$PATH" OPAL_PREFIX="$bin" OPAL_EXEC_PREFIX="$bin" OPAL_BINDIR="$bin/bin" \
      OPAL_LIBDIR="$bin/lib" OPAL_PKGLIBDIR="$bin/lib/openmpi" OPAL_DATAROOTDIR="$bin/share" OPAL_DATADIR="$bin/share" \
      OPAL_PKGDATADIR="$bin/share/openmpi" OPAL_SYSCONFDIR="$bin/etc" PMIX_PREFIX="$bin" PMIX_EXEC_PREFIX="$bin" \
      PMIX_LIBDIR="$bin/lib" PMIX_PKGLIBDIR="$bin/lib/pmix" PMIX_DATAROOTDIR="$bin/share" \
      PMIX_DATADIR="$bin/share/pmix" PMIX_PKGDATADIR="$bin/share/pmix" PMIX_SYSCONFDIR="$bin/share/pmix"
    keel=$bin/bin/keel parity=$bin/bin/gpu_parity
    ldd "$keel" >>"$logs/build.log" 2>&1
    if ldd "$keel" | grep -q 'not found'; then
      record build "{\"ok\": false, \"from\": \"$from\", \"log\": \"build.log\", \"missing\": \"$(ldd "$keel" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')\"}"
      exit 1
    fi
    record build "{\"ok\": true, \"from\": \"$from\", \"seconds\": $(( $(date +%s) - t0 )), \"cublaslt\": \"${lt:-not found}\", \"nccl\": \"${nccl:-not found}\"}"
  else
    record build "{\"ok\": false, \"from\": \"$from\", \"log\": \"build.log\"}"
    exit 1
  fi
else
  build=$root/build-gpu keel=$root/build-gpu/keel parity=$root/build-gpu/tests/gpu_parity
  if build_gpu "$build" >"$logs/build.log" 2>&1; then
    record build "{\"ok\": true, \"seconds\": $(( $(date +%s) - t0 ))}"
  else
    record build "{\"ok\": false, \"log\": \"build.log\"}"
    exit 1
  fi
fi
export KEEL_BIN=$keel

# ---- parity ----------------------------------------------------------------------
if want parity; then
  # seconds on a GPU; the emulator under the sanitizers takes minutes
  timeout "$(limit "$([ -n "$emulated" ] && echo 400 || echo 120)")" "$parity" >"$logs/parity.log" 2>&1
  rc=$?
  record parity "{\"exit\": $rc, \"passed\": $([ $rc = 0 ] && echo true || echo false), \"failures\": $(grep -c '^FAIL' "$logs/parity.log"), \"log\": \"parity.log\"}"
  # the tensor-core attention has never run before this: if it fails its parity, every later
  # stage trains on the CUDA-core kernels, so the runs and the bench still say something
  if grep -q '^FAIL attention tensor cores' "$logs/parity.log"; then
    export KEEL_CUDA_ATTENTION=simt
    record attention_path '"simt: the tensor-core kernels failed their parity"'
  fi
fi

# ---- health ------------------------------------------------------------------------
if want health; then
  timeout "$(limit 60)" "$keel" health --checks gpu --json --dir /tmp >"$logs/health.json" 2>"$logs/health.log"
  record health "{\"exit\": $?, \"report\": \"health.json\"}"
fi

run_dir=/tmp/gpu-check-runs && rm -rf "$run_dir" && mkdir -p "$run_dir"
train() { # NAME SECONDS ARGS...: keel train, its log in OUT/NAME.log
  local name=$1 limit=$2; shift 2
  timeout "$(limit "$limit")" "$keel" train "$@" --run-dir "$run_dir/$name" >"$logs/$name.log" 2>&1
}

# ---- losses: GPU runs follow the CPU fp32 run -------------------------------------------
compare_losses() { # REF RUN TOLERANCE: max |loss diff| / loss over the steps, as JSON
  python3 - "$run_dir/$1/metrics.jsonl" "$run_dir/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "step" in r}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
steps = sorted(set(a) & set(b))
rel = max((abs(a[s] - b[s]) / abs(a[s]) for s in steps), default=float("inf"))
print(json.dumps({"steps": len(steps), "max_rel_diff": rel, "tolerance": tol, "passed": len(steps) >= 50 and rel <= tol,
                  "first": [a.get(1), b.get(1)], "last": [a.get(50), b.get(50)]}))
PY
}
if want losses; then
  tiny=("$tiny_config" --set train.steps=50)
  train cpu-fp32 180 "${tiny[@]}" --set train.threads="$(nproc)"
  train cuda-fp32 120 "${tiny[@]}" --device cuda
  train cuda-bf16 120 "${tiny[@]}" --device cuda --set fsdp.mixed_precision=bf16
  # fp32: the same math in another summation order; bf16: GEMM inputs rounded to 8 bits of mantissa
  record losses_fp32 "$(compare_losses cpu-fp32 cuda-fp32 2e-3 2>>"$logs/compare.log" || echo '{"passed": false, "log": "cuda-fp32.log"}')"
  record losses_bf16 "$(compare_losses cpu-fp32 cuda-bf16 3e-2 2>>"$logs/compare.log" || echo '{"passed": false, "log": "cuda-bf16.log"}')"
fi

# ---- nccl: FSDP ranks on GPUs ---------------------------------------------------------------
if want nccl; then
  tiny=("$tiny_config" --set train.steps=50)
  # MPI alone first (a CPU run of 2 ranks): a failure here is the launcher, not NCCL
  train mpi-cpu 60 "${tiny[@]}" --set train.steps=3 --nproc 2
  record nccl_mpi_cpu "{\"exit\": $?, \"log\": \"mpi-cpu.log\"}"
  [ -d "$run_dir/cuda-fp32" ] || train cuda-fp32 120 "${tiny[@]}" --device cuda
  train nccl-1 150 "${tiny[@]}" --device cuda --nproc 1
  # world size 1 exercises NCCL's API; its copies leave the one-process run's math as it was
  record nccl_1rank "$(compare_losses cuda-fp32 nccl-1 1e-4 2>>"$logs/compare.log" || echo '{"passed": false, "log": "nccl-1.log"}')"
  # started by keel's own launcher (keel agent's way, no mpirun): NCCL's unique id over Gloo
  train nccl-1-local 150 "${tiny[@]}" --device cuda --nproc 1 --launcher local
  record nccl_1rank_local "$(compare_losses nccl-1 nccl-1-local 1e-6 2>>"$logs/compare.log" || echo '{"passed": false, "log": "nccl-1-local.log"}')"
  # the compute stream's waits for collectives, timed on the GPU (comm_stall_s): medians over the steps
  record nccl_1rank_comm_wait "$(python3 - "$run_dir/nccl-1/metrics.jsonl" <<'PY' 2>/dev/null || echo null
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "comm_wait_s" in r]
print(json.dumps({"comm_wait_s_median": statistics.median(r["comm_wait_s"] for r in rows),
                  "step_s_median": statistics.median(r["step_s"] for r in rows), "steps": len(rows)}))
PY
)"
  train nccl-1-bf16 150 "${tiny[@]}" --device cuda --nproc 1 --set fsdp.mixed_precision=bf16 --set fsdp.reduce_dtype=bf16
  [ -d "$run_dir/cpu-fp32" ] &&
    record nccl_1rank_bf16 "$(compare_losses cpu-fp32 nccl-1-bf16 3e-2 2>>"$logs/compare.log" || echo '{"passed": false, "log": "nccl-1-bf16.log"}')"
  if [ -n "$emulated" ]; then gpus=${CUEMU_DEVICES:-1}; else gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
  if [ "$gpus" -ge 2 ]; then # 2 ranks ≡ 1 rank (NCCL's sums in another order than one GPU's)
    # the same global batch: half the micro-batch on each of the 2 ranks
    mb=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["train"]["micro_batch_size"] // 2)' "$tiny_config")
    train nccl-2 150 "${tiny[@]}" --device cuda --nproc 2 --set train.micro_batch_size="$mb"
    record nccl_2ranks "$(compare_losses nccl-1 nccl-2 2e-3 2>>"$logs/compare.log" || echo '{"passed": false, "log": "nccl-2.log"}')"
    # ranks keel's own launcher started (keel agent's way, no mpirun): NCCL's unique id over Gloo, the same sums
    train nccl-2-local 150 "${tiny[@]}" --device cuda --nproc 2 --launcher local --set train.micro_batch_size="$mb"
    record nccl_2ranks_local "$(compare_losses nccl-2 nccl-2-local 1e-6 2>>"$logs/compare.log" || echo '{"passed": false, "log": "nccl-2-local.log"}')"
  else
    train nccl-too-many 60 "${tiny[@]}" --device cuda --nproc $(( gpus + 1 ))
    rc=$?
    record nccl_more_ranks_than_gpus "{\"exit\": $rc, \"refused\": $([ $rc = 2 ] && grep -q 'one rank per GPU' "$logs/nccl-too-many.log" && echo true || echo false)}"
  fi
fi

# ---- roundtrip: GPU -> CPU -> GPU through checkpoints ------------------------------------
if want roundtrip; then
  # saved synchronously: an asynchronous save of step 10 may not have committed when a leg
  # kills itself at step 12 (the emulator's rehearsal caught it), and the next leg starts over
  rt=("$tiny_config" --set train.steps=30 --set checkpoint.every_steps=10 --set checkpoint.async=false)
  KEEL_FAULT=kill@12 train roundtrip 120 "${rt[@]}" --device cuda
  mv "$logs/roundtrip.log" "$logs/roundtrip-1-gpu.log"
  KEEL_FAULT=kill@22 train roundtrip 120 "${rt[@]}" --device cpu --set train.threads="$(nproc)"
  mv "$logs/roundtrip.log" "$logs/roundtrip-2-cpu.log"
  train roundtrip 120 "${rt[@]}" --device cuda
  mv "$logs/roundtrip.log" "$logs/roundtrip-3-gpu.log"
  train roundtrip-ref 180 "${rt[@]}" --device cpu --set train.threads="$(nproc)"
  g2c=$(grep -c 'resuming from .*step_00000010' "$logs/roundtrip-2-cpu.log")
  c2g=$(grep -c 'resuming from .*step_00000020' "$logs/roundtrip-3-gpu.log")
  cmp=$(compare_losses roundtrip-ref roundtrip 2e-3 2>/dev/null | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["max_rel_diff"])' 2>/dev/null || echo null)
  final=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["final_loss"])' "$run_dir/roundtrip/summary.json" 2>/dev/null || echo null)
  record roundtrip "{\"gpu_to_cpu\": $([ "$g2c" -ge 1 ] && echo true || echo false), \"cpu_to_gpu\": $([ "$c2g" -ge 1 ] && echo true || echo false), \"final_loss\": $final, \"max_rel_diff_vs_cpu_run\": $cmp}"
fi

# ---- bench: keel beside PyTorch on the same GPU -------------------------------------------
bench_keel() { # NAME SECONDS ARGS...: the median tokens/s and MFU of a keel run, as JSON, with where its
  # second step's time went (train.profile_steps: that step is left out of the median); keel's exit status
  local name=$1 rc=0; shift
  train "$name" "$@" --set train.profile_steps=1 || rc=$?
  python3 - "$run_dir/$name/summary.json" "$run_dir/$name/profile.json" <<'PY' 2>/dev/null || echo '{"ok": false}'
import json, os, sys
s = json.load(open(sys.argv[1]))
r = {"tokens_per_s": s["tokens_per_s_median"], "mfu": s["mfu_median"], "steps": s["steps"]}
if os.path.exists(sys.argv[2]):  # the calls that took 1% of the step or more: [op, share, TFLOP/s]
    p = json.load(open(sys.argv[2]))
    r["profile_step_s"] = p["step_s"]
    r["profile"] = [[o["op"], round(o["share"], 4), round(o.get("tflops_per_s", 0), 1)]
                    for o in p["ops"] if o["share"] >= 0.01]
print(json.dumps(r))
PY
  return $rc
}
checkpoint_blocks_7b() { # the fewest checkpointed blocks of Llama 2 7B that fit in GPU 0's free memory less
  # 2 GiB (keel plan --memory): true, false or a count; true when the plan cannot say
  local free_mib
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  [[ $free_mib =~ ^[0-9]+$ ]] || { echo true; return; }
  # exit 1 (nothing fits) still writes the plan
  "$keel" plan "$root/configs/llama2-7b.json" --device h200 --per-node 1 --set fsdp.mixed_precision=bf16 \
    --memory "$(awk -v m="$free_mib" 'BEGIN {printf "%.2f", m / 1024 - 2}')" --json >"$logs/plan-7b.json" \
    2>"$logs/plan-7b.log"
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["recommendation"]
print(json.dumps(r["activation_checkpointing"]) if r["fits"] else "true")' "$logs/plan-7b.json" 2>/dev/null || echo true
}
bench_torch() { # NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  LD_LIBRARY_PATH=${system_ld-${LD_LIBRARY_PATH:-}} timeout "$(limit "$limit")" python3 "$root/bench/torch_gpu.py" "$@" \
    >"$logs/$name.json" 2>"$logs/$name.log" &&
    cat "$logs/$name.json" || echo '{"ok": false}'
}
if want bench && [ -n "$emulated" ]; then
  record bench '"not on the emulator: nothing timed there is a GPU number"'
elif want bench; then
  # the same --set keys for keel and bench/torch_gpu.py
  small=("$root/configs/llama2-7b.json" --set model.dim=2048 --set model.n_layers=22 --set model.n_heads=32
         --set model.n_kv_heads=4 --set model.max_seq_len=2048 --set train.micro_batch_size=4)
  record bench_1b_keel "$(bench_keel bench-1b 80 "${small[@]}" --device cuda --set train.steps=8 \
                          --set fsdp.mixed_precision=bf16)"
  record bench_1b_torch "$(bench_torch bench-1b-torch 80 "${small[@]}" --steps 6 --warmup 2)"
  # Llama 2 7B: the fewest checkpointed blocks that fit (keel plan); every block if that run fails
  # (the plan too tight); PyTorch checkpoints the same blocks. 4 sequences of 4096 tokens a step
  # (micro-batch 1, accumulation 4), as a run's optimizer step would have at least: one sequence
  # a step would time AdamW over 6.7 B parameters (~50 ms of HBM) once per 4096 tokens
  ac=$(checkpoint_blocks_7b)
  seven=("$root/configs/llama2-7b.json" --device cuda --set train.steps=6 --set fsdp.mixed_precision=bf16
         --set train.grad_accum_steps=4)
  r=$(bench_keel bench-7b 120 "${seven[@]}" --set fsdp.activation_checkpointing="$ac") ||
    if [ "$ac" != true ]; then
      record bench_7b_failed_at "\"$ac\""
      ac=true
      r=$(bench_keel bench-7b-all 120 "${seven[@]}" --set fsdp.activation_checkpointing=true)
    fi
  record bench_7b_checkpointing "$ac"
  record bench_7b_keel "$r"
  case $ac in true) torch_ac=(--checkpoint-activations) ;; false) torch_ac=() ;; *) torch_ac=(--checkpoint-blocks "$ac") ;; esac
  record bench_7b_torch "$(bench_torch bench-7b-torch 120 "$root/configs/llama2-7b.json" --steps 4 --warmup 2 \
                           --set train.grad_accum_steps=4 "${torch_ac[@]}")"
  # what the tensor cores bring to attention: the 1B bench on the CUDA-core kernels (last: least needed)
  record bench_1b_keel_simt "$(KEEL_CUDA_ATTENTION=simt bench_keel bench-1b-simt 80 "${small[@]}" --device cuda \
                               --set train.steps=8 --set fsdp.mixed_precision=bf16)"
fi

# every GPU run's backend allocations after its first step, per rank (want 0: no cudaMalloc in a step)
record allocations_in_steps "$(python3 - "$run_dir" <<'PY' 2>/dev/null || echo null
import glob, json, os, sys
out = {}
for p in sorted(glob.glob(sys.argv[1] + "/*/summary.json")):
    s = json.load(open(p))
    if s.get("device") == "cuda":
        out[os.path.basename(os.path.dirname(p))] = [r.get("backend_allocations_in_steps") for r in s["ranks"]]
print(json.dumps(out))
PY
)"
