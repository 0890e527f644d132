#!/bin/bash
# keel's CUDA backend as written — kernels, cuBLASLt and NCCL calls, streams,
# events, pinned copies — trained on the host CUDA emulator (keel-cuemu,
# tests/cuemu/cuemu.cpp) against keel's CPU runs. What scripts/gpu-check.sh
# checks on a GPU, here on every machine, with two stream schedules: the
# compute stream first (the others as late as their waits allow) and the
# others first (as early as their waits allow), so a missing event wait
# between streams changes a loss under one of them. Every comparison is
# against a run on the other device, or another world size.
source "$KEEL_SRC/tests/lib.sh"
: "${KEEL_CUEMU_BIN:?KEEL_CUEMU_BIN must point at keel-cuemu (a CUDA build)}"
: "${KEEL_CUEMU_LIB:?KEEL_CUEMU_LIB must point at the stand-in libraries of the emulator}"
mpi_env
export LD_LIBRARY_PATH=$KEEL_CUEMU_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
CFG=$KEEL_SRC/tests/cuemu/micro.json # head size 64: the tensor-core attention in bf16

run() { # NAME BIN ARGS...: a 6-step run into $TMP/NAME (an emulated step takes seconds)
  local name=$1 bin=$2; shift 2
  timeout 600 "$bin" train "$CFG" --run-dir "$TMP/$name" --set train.steps=6 "$@" >"$TMP/$name.log" 2>&1 ||
    { tail -20 "$TMP/$name.log"; fail "$name: exit $?"; }
}
gpu() { local name=$1; shift; run "$name" "$KEEL_CUEMU_BIN" --device cuda "$@"; }
compare() { # A B TOLERANCE WHAT: per-step losses, max |a - b| / a over the steps both ran
  python3 - "$TMP/$1" "$TMP/$2" "$3" "$4" <<'PY' || fail "$4"
import json, sys
a, b, tol, what = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl")) if "loss" in r}
x, y = losses(a), losses(b)
steps = sorted(set(x) & set(y))
assert len(steps) >= 5, (what, steps)
worst = max(abs(x[s] - y[s]) / x[s] for s in steps)
assert worst <= tol, (what, worst, tol)
print(f"ok   {what}: {len(steps)} steps, loss {x[steps[0]]:.4f} -> {x[steps[-1]]:.4f}, max rel diff {worst:.1e} (tol {tol:g})")
PY
}

# ---- one device ------------------------------------------------------------------
run cpu "$KEEL_BIN"
gpu cuda
grep -q "device cuda: the model and optimizer run there" "$TMP/cuda.log" || fail "keel-cuemu did not train on the device"
grep -q "MFU ?" "$TMP/cuda.log" || fail "a GPU whose peak keel does not know: the console should print MFU ?"
python3 -c 'import json, sys; assert not any("mfu" in json.loads(l) for l in open(sys.argv[1]))' \
  "$TMP/cuda/metrics.jsonl" || fail "a GPU whose peak keel does not know: metrics.jsonl should have no mfu"
# fp32: the same math in other summation orders (cuBLASLt's, the kernels' block sums)
compare cpu cuda 1e-4 "cuda fp32 against the CPU"
run cpu-bf16 "$KEEL_BIN" --set fsdp.mixed_precision=bf16
gpu cuda-bf16 --set fsdp.mixed_precision=bf16
# bf16: the same rounded operands on both sides; a probability near a rounding boundary may round the other way
compare cpu-bf16 cuda-bf16 1e-2 "cuda bf16 (tensor-core attention) against the CPU's bf16"
KEEL_CUDA_ATTENTION=simt gpu cuda-bf16-simt --set fsdp.mixed_precision=bf16
compare cuda-bf16 cuda-bf16-simt 1e-2 "cuda bf16, KEEL_CUDA_ATTENTION=simt (the CUDA-core attention) against the default"
# train.profile_steps on the device: each call waited for, the same losses
gpu cuda-bf16-profiled --set fsdp.mixed_precision=bf16 --set train.profile_steps=2
compare cuda-bf16 cuda-bf16-profiled 0 "cuda bf16 with 2 steps profiled against the run without"
python3 - "$TMP/cuda-bf16-profiled/profile.json" <<'PY' || fail "the profile of a GPU run (above)"
import json, sys
p = json.load(open(sys.argv[1]))
assert (p["device"], p["calls_waited_for"], p["first_step"], p["steps"]) == ("cuda", True, 2, 2), p
ops = {o["op"]: o for o in p["ops"]}
for op in ("gemm_bf16", "attention_forward_bf16", "attention_backward_bf16"):
    assert ops[op]["calls"] > 0 and ops[op]["tflops_per_s"] > 0, (op, ops.get(op))
assert 0 < p["in_calls_s"] <= p["step_s"], p
print(f"ok   the profile on the device: {len(ops)} kinds of call, each waited for")
PY
CUEMU_CUBLASLT_NO_ALGO=1 gpu cuda-plain-gemm
grep -q "a plain CUDA kernel runs it instead" "$TMP/cuda-plain-gemm.log" || fail "the GEMM fallback did not run"
compare cuda cuda-plain-gemm 1e-4 "cuda fp32, keel's own GEMM kernel where cuBLASLt has no algorithm"

# ---- FSDP on NCCL, under both stream schedules --------------------------------------
for schedule in compute-first comm-first; do
  export CUEMU_SCHEDULE=$schedule
  gpu "nccl1-$schedule" --nproc 1
  compare cuda "nccl1-$schedule" 1e-6 "NCCL, 1 rank, $schedule, against the run without NCCL"
  CUEMU_DEVICES=2 gpu "nccl2-$schedule" --nproc 2 --set train.micro_batch_size=1
  compare cuda "nccl2-$schedule" 1e-4 "NCCL, 2 ranks (full_shard), $schedule, against 1 device"
done
CUEMU_DEVICES=2 gpu nccl2-bf16 --nproc 2 --set train.micro_batch_size=1 --set fsdp.mixed_precision=bf16 \
  --set fsdp.reduce_dtype=bf16 --set fsdp.strategy=shard_grad_op
compare cuda-bf16 nccl2-bf16 1e-2 "NCCL, 2 ranks (shard_grad_op, bf16 gathers and reductions) against 1 device"
unset CUEMU_SCHEDULE
# ranks no MPI launcher started (keel agent's, --launcher local): NCCL's unique id goes over Gloo
CUEMU_SCHEDULE=comm-first CUEMU_DEVICES=2 gpu nccl2-gloo --nproc 2 --launcher local --set train.micro_batch_size=1
compare nccl2-comm-first nccl2-gloo 0 "NCCL, 2 ranks started without mpirun (the unique id over Gloo), against mpirun's"

# ---- checkpoints cross devices -------------------------------------------------------------
ckpt=(--set train.steps=10 --set checkpoint.every_steps=5 --set checkpoint.keep_last=0)
run cpu-ckpt "$KEEL_BIN" "${ckpt[@]}"
gpu cuda-ckpt "${ckpt[@]}"
resume_from_step5() { # SRC DST BIN ARGS...: DST resumes from SRC's step-5 checkpoint
  local src=$1 dst=$2; shift 2
  mkdir -p "$TMP/$dst/checkpoints"
  cp "$TMP/$src/config.json" "$TMP/$dst/"
  cp -r "$TMP/$src/checkpoints/step_00000005" "$TMP/$dst/checkpoints/"
  echo step_00000005 >"$TMP/$dst/checkpoints/LATEST"
  run "$dst" "$@" "${ckpt[@]}"
  grep -q "resuming from .*step_00000005" "$TMP/$dst.log" || { tail "$TMP/$dst.log"; fail "$dst did not resume"; }
}
resume_from_step5 cuda-ckpt gpu-to-cpu "$KEEL_BIN"
compare cpu-ckpt gpu-to-cpu 1e-4 "a checkpoint written on the GPU, resumed on the CPU (steps 6-10)"
resume_from_step5 cpu-ckpt cpu-to-gpu "$KEEL_CUEMU_BIN" --device cuda
compare cpu-ckpt cpu-to-gpu 1e-4 "a checkpoint written on the CPU, resumed on the GPU (steps 6-10)"

# ---- FSDP's paths on the device: hybrid groups, matrix units, recomputation, a rank lost ----
# LoRA: adapters on the frozen base of cpu-ckpt's step 5, with dropout
lora=(--set init_from="$TMP/cpu-ckpt/checkpoints/step_00000005" --set train.lora.rank=4 --set train.lora.dropout=0.1
      --set 'train.lora.targets=["q_proj","v_proj","down_proj"]')
run cpu-lora "$KEEL_BIN" "${lora[@]}"
gpu cuda-lora "${lora[@]}"
compare cpu-lora cuda-lora 1e-4 "LoRA (adapters on a frozen base, dropout) against the CPU"
CUEMU_DEVICES=2 gpu nccl2-lora --nproc 2 --set train.micro_batch_size=1 "${lora[@]}"
compare cpu-lora nccl2-lora 1e-4 "LoRA on 2 ranks (NCCL: the base gathered only, the adapters reduce-scattered) against the CPU"

run cpu4 "$KEEL_BIN" --set train.micro_batch_size=4
run cpu4-16 "$KEEL_BIN" --set train.micro_batch_size=4 --set train.steps=16
export CUEMU_DEVICES=4
gpu hybrid4 --nproc 4 --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2 --set train.micro_batch_size=1
compare cpu4 hybrid4 1e-4 "HYBRID_SHARD on 4 ranks (2 x 2: NCCL shard and replica communicators) against the CPU"
gpu matrix-recompute2 --nproc 2 --set fsdp.unit=matrix --set fsdp.activation_checkpointing=1 \
  --set train.micro_batch_size=1 --set train.grad_accum_steps=2
compare cpu4 matrix-recompute2 1e-4 "matrix units, a checkpointed block, 2 accumulated micro-batches, 2 ranks, against the CPU"
# rank 1 killed in step >= 6 of 16: the supervisor restarts both ranks from the newest in-memory
# snapshot (pinned copies of the device shards); every step then follows the CPU's
"$KEEL_CUEMU_BIN" train "$CFG" --device cuda --nproc 2 --run-dir "$TMP/lost" --set train.micro_batch_size=2 \
  --set train.steps=16 --set resilience.snapshot_every_steps=2 --set resilience.backoff_s=0 >"$TMP/lost.log" 2>&1 &
trainer=$!
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
victim=$(wait_train_step "$TMP/lost" 1 6)
kill -9 "$victim"
wait "$trainer" || { tail -20 "$TMP/lost.log"; fail "the run with a lost rank: exit $?"; }
grep -q "resuming from the in-memory snapshot of step" "$TMP/lost.log" ||
  { tail -20 "$TMP/lost.log"; fail "the lost rank's run did not resume from its in-memory snapshot"; }
compare cpu4-16 lost 1e-4 "2 ranks, rank 1 killed at step >= 6, resumed from the in-memory snapshot, against the CPU"
