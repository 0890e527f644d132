#!/usr/bin/env bash
# keel train refuses a run that does not fit in this machine's memory before
# it allocates anything: exit 2, one line, and when checkpointing more blocks
# would make it fit, the line names the fewest that do — which the dry run's
# totals confirm (that count fits, one fewer does not). A model whose state
# alone does not fit gets no such advice. The shape is sized to the machine:
# 64 Ki-token sequences of 16 narrow blocks, a micro-batch whose activations
# with nothing checkpointed are twice MemAvailable (every block checkpointed:
# about a third of it).
source "$KEEL_SRC/tests/lib.sh"
CFG=$KEEL_SRC/tests/train/micro.json
shape=(--set model.n_layers=16 --set model.max_seq_len=65536 --set train.steps=1)
total() { "$KEEL_BIN" train "$CFG" "${shape[@]}" "$@" --dry-run | awk '/^  total/ {print $2}'; }
# 8 sequences need this many GiB with nothing checkpointed
per8=$(total --set train.micro_batch_size=8)
avail=$(awk '/^MemAvailable/ {print $2 / 2^20}' /proc/meminfo)
B=$(python3 -c "import math, sys; print(math.ceil(8 * 2 * float(sys.argv[1]) / float(sys.argv[2])))" "$avail" "$per8")
shape+=(--set train.micro_batch_size="$B")

rc=0
"$KEEL_BIN" train "$CFG" "${shape[@]}" --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 2 ] || fail "micro-batch $B of 64 Ki tokens: exit $rc, want 2 (stderr: $(cat "$TMP/err"))"
[ "$(wc -l <"$TMP/err")" = 1 ] || fail "want one line, got: $(cat "$TMP/err")"
[ ! -e "$TMP/run/metrics.jsonl" ] || fail "the refused run trained"
line=$(cat "$TMP/err")
[[ $line =~ "is available: checkpoint the first "([0-9]+)" of 16 blocks (--set fsdp.activation_checkpointing="([0-9a-z]+)"), or lower" ]] ||
  fail "the refusal does not name a count of blocks: $line"
K=${BASH_REMATCH[1]} v=${BASH_REMATCH[2]}
[[ $line =~ "but "([0-9.]+)" GiB is available" ]] || fail "no available memory in: $line"
had=${BASH_REMATCH[1]}
at=$(total --set fsdp.activation_checkpointing="$v") below=$(total --set fsdp.activation_checkpointing=$((K - 1)))
# the line rounds to 0.1 GiB; a block's activations here are several GiB
python3 -c "import sys; k, b, had = map(float, sys.argv[1:]); assert k <= had + 0.06 < b + 0.12, (k, b, had)" \
  "$at" "$below" "$had" || fail "checkpointing $K blocks needs $at GiB, $((K - 1)) need $below, $had available"
pass "micro-batch $B: refused in one line naming $K of 16 blocks ($at GiB of $had; $((K - 1)) blocks: $below)"

# the state alone does not fit: no count of blocks helps, none is named
expect_input_error "Llama 2 7B in one process" "is available: lower train.micro_batch_size" \
  "$KEEL_BIN" train "$KEEL_SRC/configs/llama2-7b.json" --run-dir "$TMP/7b"
