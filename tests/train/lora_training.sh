#!/usr/bin/env bash
# train.lora: adapters on a frozen base from init_from. A base trained 12 steps, then LoRA on
# q/v/down with dropout:
# - the run trains the adapters' parameters only (summary's trained_params), its checkpoints
#   hold them (a fraction of the base's bytes), and the base's checkpoint is untouched;
# - RUN/weights.bin is the merged model: the matrices without adapters (embedding, k_proj,
#   norms, head) are the base's bit for bit, the adapted ones moved;
# - killed in step 7 and resumed from its step-4 checkpoint, the run ends bit-identical to one run straight through
#   (dropout masks included);
# - on 2 ranks full_shard, shard_grad_op and no_shard end bit-identical to each other, and they,
#   hybrid_shard on 4 ranks and 2 accumulated micro-batches end within 1e-5 of one process; a
#   2-rank checkpoint resumes on 1 process (resharded); a rank killed mid-run resumes from the
#   in-memory snapshot and the run ends bit-identical to an undisturbed one; shard_grad_op
#   gathers the frozen base once and then only the adapters, step after step;
# - every adapter checkpoint records its base (init_from and its identity): a copy of the base
#   elsewhere resumes, a base with other contents is refused (exit 2, one line);
# - `keel ckpt verify` passes an adapter checkpoint, `keel ckpt export` refuses it (not a whole model);
#   `--format peft` writes adapter_model.safetensors + adapter_config.json with PEFT's names and shapes,
#   `--merge` the model the run's final weights are; where the venv of scripts/setup-torch.sh has peft,
#   PEFT loads the adapters onto the exported base and its merge equals keel's; `keel ckpt import
#   --from-peft` reads them back (export again: the same file), and a run started from them with
#   train.lora.init_from holds the model they came from; adapters of another model, rank or base
#   are refused in one line; `keel generate` from
#   the adapter checkpoint merges it into its base and generates what the run's final weights do;
# - activation checkpointing changes nothing (bit-identical), bf16 trains to a nearby loss;
# - bad input exits 2 in one line naming the key: no init_from, a rank larger than a
#   target's smaller side, no targets, an unknown target.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
cd "$TMP"
CFG=$KEEL_SRC/tests/train/micro.json
"$KEEL_BIN" train "$CFG" --set train.steps=12 --set checkpoint.every_steps=6 --set checkpoint.keep_last=0 --run-dir base >base.log 2>&1 ||
  fail "the base did not train: $(tail -2 base.log)"
BASE=$TMP/base/checkpoints/step_00000012
sum_before=$(cat "$BASE"/* | md5sum)
L=(--set init_from="$BASE" --set 'train.lora={"rank": 4, "alpha": 8, "dropout": 0.1, "targets": ["q_proj", "v_proj", "down_proj"]}'
   --set train.lr=1e-2 --set train.warmup_steps=1 --set train.micro_batch_size=4)
lora() { # NAME STEPS [ARGS...]: a LoRA run into NAME
  local name=$1 steps=$2; shift 2
  "$KEEL_BIN" train "$CFG" "${L[@]}" --set train.steps="$steps" --set checkpoint.every_steps=4 "$@" \
    --run-dir "$name" >"$name.log" 2>&1 || fail "LoRA run $name: $(grep -m1 -i 'error' "$name.log" || tail -2 "$name.log")"
}
lora one 8
(KEEL_FAULT=kill@7 "$KEEL_BIN" train "$CFG" "${L[@]}" --set train.steps=8 --set checkpoint.every_steps=4 \
  --run-dir part >part.log 2>&1; exit $?) 2>/dev/null && fail "the run meant to be killed in step 7 finished"
lora part 8
[ "$(cat "$BASE"/* | md5sum)" = "$sum_before" ] || fail "the base's checkpoint changed"
cmp -s one/weights.bin part/weights.bin || fail "stopped at step 4 and resumed, the run is not the straight one's"
grep -q '"resumed"' part/events.jsonl || fail "the second launch did not resume"
lora ckpt 8 --set fsdp.activation_checkpointing=true
cmp -s one/weights.bin ckpt/weights.bin || fail "activation checkpointing changed the LoRA run"
for s in full_shard shard_grad_op no_shard; do
  lora "r2-$s" 8 --nproc 2 --set train.micro_batch_size=2 --set fsdp.strategy=$s --set train.profile_steps=2
done
cmp -s r2-full_shard/weights.bin r2-shard_grad_op/weights.bin && cmp -s r2-full_shard/weights.bin r2-no_shard/weights.bin ||
  fail "the strategies disagree on 2 ranks"
# shard_grad_op keeps the frozen base gathered from step to step: a step gathers the adapters
# alone, one unit a block; full_shard gathers the base's units and the adapters forward and backward
gathers() { json "$1/profile.json" "sum(o['calls'] for o in j['ops'] if o['op'] == 'all_gather')"; }
NL=$(json "$CFG" 'j["model"]["n_layers"]')
[ "$(gathers r2-shard_grad_op)" = $(( 2 * NL )) ] ||
  fail "shard_grad_op gathered $(gathers r2-shard_grad_op) times in 2 steps, want the adapters' $(( 2 * NL ))"
[ "$(gathers r2-full_shard)" -gt $(( 4 * NL )) ] || fail "full_shard gathered only $(gathers r2-full_shard) times in 2 steps"
pass "shard_grad_op gathers the frozen base once, the adapters each step ($(gathers r2-shard_grad_op) gathers in 2 steps, full_shard $(gathers r2-full_shard))"
lora r4-hybrid 8 --nproc 4 --set train.micro_batch_size=1 --set fsdp.strategy=hybrid_shard --set fsdp.shard_group_size=2
lora accum 8 --set train.micro_batch_size=2 --set train.grad_accum_steps=2
# rank 1 killed mid-run: the supervisor relaunches from the in-memory snapshot (the adapters' state)
lora calm 30 --nproc 2 --set train.micro_batch_size=2
"$KEEL_BIN" train "$CFG" "${L[@]}" --set train.steps=30 --set checkpoint.every_steps=4 --nproc 2 \
  --set train.micro_batch_size=2 --set resilience.backoff_s=0 --run-dir snap >snap.log 2>&1 &
trainer=$!
trap 'kill_leftovers; rm -rf "$TMP"' EXIT
victim=$(wait_train_step "$TMP/snap" 1 10)
kill -9 "$victim"
wait "$trainer" || fail "the run with a killed rank: $(tail -3 snap.log)"
grep -q "resuming from the in-memory snapshot of step" snap.log || fail "no resume from the in-memory snapshot: $(tail -5 snap.log)"
cmp -s calm/weights.bin snap/weights.bin || fail "resumed from memory, the run is not the undisturbed one's"
KEEL_FAULT=kill@7 "$KEEL_BIN" train "$CFG" "${L[@]}" --set train.steps=8 --set checkpoint.every_steps=4 --nproc 2 \
  --set train.micro_batch_size=2 --set resilience.max_restarts=0 --run-dir re >re.log 2>&1 &&
  fail "the 2-rank run meant to be killed in step 7 finished"
lora re 8 # the same global batch on 1 process: from the 2-rank checkpoint
grep -q '"resumed"' re/events.jsonl || fail "the 1-process launch did not resume the 2-rank checkpoint"
lora bf16 8 --set fsdp.mixed_precision=bf16

python3 - "$BASE" <<'PY' || fail "the LoRA runs"
import array, glob, json, sys
def weights(run):
    a = array.array("f"); a.frombytes(open(f"{run}/weights.bin", "rb").read()[64:]); return a
def losses(run): return [json.loads(l)["loss"] for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
m = json.load(open("one/config.json"))["model"]
C, L, F, V, KV = m["dim"], m["n_layers"], 192, m["vocab_size"], m["n_kv_heads"] * m["dim"] // m["n_heads"]
s = json.load(open("one/summary.json"))
want = L * (4 * C + C * 4 + 4 * C + KV * 4 + 4 * F + C * 4)  # A (4, in) and B (out, 4) of q, v and down
assert s["trained_params"] == want and s["n_params"] > 40 * want, (s["trained_params"], want, s["n_params"])
size = lambda d: sum(__import__("os").path.getsize(f) for f in glob.glob(f"{d}/*.bin"))
assert size("one/checkpoints/step_00000008") * 20 < size(sys.argv[1]), "the adapters' checkpoint is not small"
base, one = weights("base"), weights("one")
# canonical order: embedding (V, C), then per layer norm, q, k, v, o, norm, gate, up, down; norm, head
off, moved, kept = V * C, [], []
assert base[:off] == one[:off], "the embedding moved"
for l in range(L):
    for name, n in [("norm1", C), ("q", C * C), ("k", KV * C), ("v", KV * C), ("o", C * C), ("norm2", C),
                    ("gate", F * C), ("up", F * C), ("down", C * F)]:
        same = base[off:off + n] == one[off:off + n]
        (kept if same else moved).append(name)
        assert same == (name not in ("q", "v", "down")), (l, name, same)
        off += n
assert base[off:] == one[off:], "the head moved"
l1 = losses("one")
assert l1[-1] < l1[0], ("LoRA did not lower the loss", l1)
for run in ("r2-full_shard", "re", "r4-hybrid", "accum"):
    d = max(abs(x - y) for x, y in zip(weights(run), one))
    assert d < 1e-5, (run, d)
lb = losses("bf16")
assert abs(lb[-1] - l1[-1]) < 0.05 * l1[-1], (lb, l1)
print(f"ok   LoRA: {s['trained_params']} of {s['n_params']} parameters trained, loss {l1[0]:.4f} -> {l1[-1]:.4f} "
      f"(bf16 {lb[-1]:.4f}); the merged weights move only q, v and down")
PY

# keel ckpt knows an adapter checkpoint: listed and verified as committed, refused where a whole model is needed
"$KEEL_BIN" ckpt verify one/checkpoints/step_00000008 >verify.log 2>&1 || fail "keel ckpt verify: $(cat verify.log)"
rc=0
"$KEEL_BIN" ckpt export one/checkpoints/step_00000008 --format safetensors --out exported >export.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "holds LoRA adapters" export.log && [ ! -e exported ] ||
  fail "exporting adapters as a whole model: $(cat export.log)"

# the base: recorded in every adapter checkpoint; a copy elsewhere resumes, another base is refused
python3 - "$BASE" <<'PY' || fail "the adapter checkpoint's record of its base"
import json, sys
lora = json.load(open("one/checkpoints/step_00000008/manifest.json"))["lora"]
assert lora["base"] == sys.argv[1] and len(lora["base_id"]) == 16, lora
PY
cp -r one moved && cp -r "$BASE" base-copy
"$KEEL_BIN" train "$CFG" "${L[@]}" --set init_from="$TMP/base-copy" --set train.steps=10 --set checkpoint.every_steps=4 \
  --run-dir moved >moved.log 2>&1 || fail "a copy of the base elsewhere: $(grep -m1 error moved.log)"
rc=0
"$KEEL_BIN" train "$CFG" "${L[@]}" --set init_from="$TMP/base/checkpoints/step_00000006" --set train.steps=10 \
  --run-dir one >other.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "is not the base" other.log && [ "$(grep -c . other.log)" -le 2 ] ||
  fail "resuming on another base: exit $rc, $(cat other.log)"
echo "ok   another base refused: $(grep -m1 error other.log | cut -c1-160)..."

# export: the adapters as PEFT saves them, and merged into the base as a Hugging Face model
"$KEEL_BIN" ckpt export one/checkpoints/step_00000008 --format peft --out peft >peft.log 2>&1 ||
  fail "export --format peft: $(cat peft.log)"
"$KEEL_BIN" ckpt export one/checkpoints/step_00000008 --format safetensors --merge --out merged >merge.log 2>&1 ||
  fail "export --merge: $(cat merge.log)"
"$KEEL_BIN" ckpt export "$BASE" --format safetensors --out basehf >basehf.log 2>&1 || fail "export the base"
python3 - "$BASE" <<'PY' || fail "the exported adapters and merged model"
import array, json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v)
        a = array.array("f"); a.frombytes(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = (v["shape"], a)
    return out
cfg = json.load(open("peft/adapter_config.json"))
assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"], cfg["lora_dropout"], cfg["target_modules"], cfg["base_model_name_or_path"]) == \
    ("LORA", 4, 8, 0.1, ["q_proj", "v_proj", "down_proj"], sys.argv[1]), cfg
t = tensors("peft/adapter_model.safetensors")
C, F = 64, 192
want = {f"base_model.model.model.layers.{l}.{m}.{p}.lora_{ab}.weight": shape for l in range(2)
        for m, p, shapes in (("self_attn", "q_proj", ([4, C], [C, 4])), ("self_attn", "v_proj", ([4, C], [32, 4])),
                             ("mlp", "down_proj", ([4, F], [C, 4]))) for ab, shape in zip("AB", shapes)}
assert {k: v[0] for k, v in t.items()} == want, sorted(t)
# the merged export is the run's final weights (step 8's adapters on the base), tensor for tensor
w = array.array("f"); w.frombytes(open("one/weights.bin", "rb").read()[64:])
m = tensors("merged/model.safetensors")
names = ["model.embed_tokens.weight"] + [f"model.layers.{l}.{s}.weight" for l in range(2) for s in (
    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")] + ["model.norm.weight", "lm_head.weight"]
at = 0
for name in names:
    a = m[name][1]
    assert a == w[at:at + len(a)], name
    at += len(a)
assert at == len(w)
print(f"ok   PEFT export: {len(t)} adapter tensors with PEFT's names and shapes; --merge equals the run's final weights")
PY
torch_python="${KEEL_TORCH_VENV:-/opt/keel-torch}/bin/python"
# (PeftModel, not just `import peft`: the export directory here named peft/ imports as an empty
# namespace package where the venv has no peft)
if [ -x "$torch_python" ] && "$torch_python" -c "from peft import PeftModel" 2>/dev/null; then
  "$torch_python" - <<'PY' 2>peft-live.err || fail "PEFT does not load keel's adapters as keel merges them: $(tail -3 peft-live.err)"
import torch, transformers, peft
from safetensors.torch import load_file
base = transformers.AutoModelForCausalLM.from_pretrained("basehf", dtype=torch.float32)
merged = peft.PeftModel.from_pretrained(base, "peft").merge_and_unload().state_dict()
ref = load_file("merged/model.safetensors")
worst = max((merged[k] - ref[k]).abs().max().item() for k in ref)
assert worst <= 1e-6, worst
print(f"ok   PEFT {peft.__version__} loads the adapters onto transformers' model; its merge is keel's (max diff {worst:.1e})")
PY
else
  echo "ok   (no $torch_python with peft: SKIP of the live PEFT load; scripts/setup-torch.sh and pip install peft)"
fi
# import: PEFT's files back as an adapter checkpoint on the base, which starts a run (train.lora.init_from)
"$KEEL_BIN" ckpt import --from-peft peft --base "$BASE" --out imported >import.log 2>&1 || fail "import --from-peft: $(cat import.log)"
"$KEEL_BIN" ckpt export imported --format peft --out peft-again >/dev/null 2>&1 || fail "export the imported adapters"
cmp -s peft/adapter_model.safetensors peft-again/adapter_model.safetensors || fail "export(import(export)) changed the adapters"
lora cont 1 --set train.lora.init_from="$TMP/imported" --set train.lr=0 --set train.min_lr=0
cmp -s <(tail -c +65 cont/weights.bin) <(tail -c +65 one/weights.bin) ||
  fail "a run started from the imported adapters (lr 0) does not hold the model they came from"
"$KEEL_BIN" train "$CFG" --set train.steps=1 --set model.dim=32 --set checkpoint.every_steps=1 --run-dir narrow \
  >narrow.log 2>&1 || fail "the narrow base"
rc=0
"$KEEL_BIN" ckpt import --from-peft peft --base narrow --out nope >nope.log 2>&1 || rc=$?
[ $rc -eq 2 ] && [ ! -e nope ] && [ "$(grep -c . nope.log)" -le 2 ] || fail "adapters of another model: exit $rc, $(cat nope.log)"
echo "ok   adapters onto another model refused: $(grep -m1 error nope.log | cut -c1-150)..."
rc=0
"$KEEL_BIN" train "$CFG" "${L[@]}" --set train.lora.init_from="$TMP/imported" --set train.lora.rank=2 --run-dir bad-rank \
  >bad-rank.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "train.lora.rank" bad-rank.log || fail "adapters of another rank: exit $rc, $(cat bad-rank.log)"
rc=0
"$KEEL_BIN" train "$CFG" "${L[@]}" --set init_from="$TMP/base/checkpoints/step_00000006" --set train.lora.init_from="$TMP/imported" \
  --run-dir bad-base >bad-base.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "another base" bad-base.log || fail "adapters of another base: exit $rc, $(cat bad-base.log)"

# generation from the adapter checkpoint: merged into its base on loading, as the run's final weights are
printf '{"prompt": [1, 5, 9, 13, 2, 7]}\n{"prompt": [3, 3, 4]}\n' >prompts.jsonl
"$KEEL_BIN" generate one --prompts prompts.jsonl --max-new-tokens 12 --ignore-eos --json >gen-run.jsonl 2>gen.log &&
"$KEEL_BIN" generate one/checkpoints/step_00000008 --prompts prompts.jsonl --max-new-tokens 12 --ignore-eos --json \
  >gen-ckpt.jsonl 2>>gen.log || fail "keel generate: $(cat gen.log)"
cmp -s gen-run.jsonl gen-ckpt.jsonl && grep -q "merged into its base" gen.log ||
  fail "generating from the adapter checkpoint is not generating from the run's merged weights"
rc=0
"$KEEL_BIN" ckpt export "$BASE" --format peft --out nope >nope.log 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "not LoRA adapters" nope.log && [ ! -e nope ] || fail "a whole model as PEFT: exit $rc, $(cat nope.log)"

# bad input: exit 2, one line naming the key
bad() { # WHAT EXPECT ARGS...
  local what=$1 want=$2; shift 2
  "$KEEL_BIN" train "$CFG" --run-dir "bad-$RANDOM" "$@" >bad.log 2>&1 && fail "$what was accepted"
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "$want" bad.log || fail "$what: exit $rc, $(cat bad.log)"
  echo "ok   $what: $(grep -m1 error bad.log)"
}
bad "LoRA without init_from" "init_from" --set train.lora.rank=4
bad "a rank above k_proj's 32 rows" "train.lora.rank 33" --set init_from="$BASE" --set train.lora.rank=33 \
  --set train.lora.targets=k_proj
bad "no targets" "train.lora.targets" --set init_from="$BASE" --set train.lora.targets='[]'
bad "an unknown target" "lm_head" --set init_from="$BASE" --set train.lora.targets=lm_head
pass "LoRA trains adapters on a frozen base under every strategy, resumes bit-identically and reshards"
