#!/usr/bin/env bash
# Training on chat shards (keel data prepare --format chat: a loss mask on the answers)
# averages the loss over the kept targets of the whole step, whoever holds them: the same
# global batch of 4 sequences as 1 rank x 4, 1 rank x 2 x 2 accumulation steps, 2 ranks x 2
# and 2 ranks x 1 x 2 accumulation steps (FULL_SHARD) gives every step's loss within 1e-5
# relative and the same final loss. Averaging per micro-batch or per rank instead would not:
# the kept targets differ from one micro-batch to the next (checked here too). And a run on the
# same conversations prepared without a mask (as JSON Lines text) trains on more targets: its
# first loss differs. With data.document_mask the loss changes and 2 ranks still match 1; on
# the synthetic source it is refused. And the trainer's divisor is the kept targets': a step of every sample
# at lr 0 has the loss `keel eval` gives the same (unchanged) model over those samples, and
# eval's token count is the kept targets counted from the shard here.
source "$KEEL_SRC/tests/lib.sh"
mpi_env
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"
cd "$TMP"
python3 - <<'EOF'
import json, random
r = random.Random(5)
words = open("/usr/share/common-licenses/GPL-3").read().split()
say = lambda n: " ".join(r.choice(words) for _ in range(n))
with open("conv.jsonl", "w") as f, open("text.jsonl", "w") as g:
    for i in range(400):
        m = [{"role": "system", "content": say(8)}] if i % 3 == 0 else []
        for _ in range(r.randint(1, 3)):
            m += [{"role": "user", "content": say(r.randint(5, 30))},
                  {"role": "assistant", "content": say(r.randint(1, 25))}]
        f.write(json.dumps({"messages": m}) + "\n")
        g.write(json.dumps({"text": "\n".join(x["content"] for x in m)}) + "\n")
EOF
spm_train --input=/usr/share/common-licenses/GPL-3 --model_prefix=tok --vocab_size=500 --model_type=bpe \
  --character_coverage=1.0 >spm.log 2>&1 || fail "spm_train: $(tail -2 spm.log)"
"$KEEL_BIN" data prepare --format chat --chat-template llama2 --model tok.model --input conv.jsonl --out chat \
  >prep.log 2>&1 || fail "prepare chat: $(tail -2 prep.log)"
"$KEEL_BIN" data prepare --model tok.model --input text.jsonl --out text >prep2.log 2>&1 || fail "prepare text"
cat >mask.json <<EOF
{
  "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 500,
            "multiple_of": 32, "max_seq_len": 64},
  "train": {"steps": 6, "micro_batch_size": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 1, "threads": 1},
  "data": {"path": "$TMP/chat"}
}
EOF
run() { # NAME [ARGS...]
  local name=$1; shift
  "$KEEL_BIN" train mask.json --run-dir "$name" "$@" >"$name.log" 2>&1 || { cat "$name.log"; fail "$name"; }
}
run one
run accum --set train.micro_batch_size=2 --set train.grad_accum_steps=2
run ranks --nproc 2 --set train.micro_batch_size=2
run ranks_accum --nproc 2 --set train.micro_batch_size=1 --set train.grad_accum_steps=2
run plain --set "data.path=$TMP/text"
python3 - <<'EOF' || fail "the masked loss depends on how the step is split"
import json
load = lambda r: [json.loads(l)["loss"] for l in open(f"{r}/metrics.jsonl") if '"step"' in l]
one = load("one")
assert len(one) == 6
for other in ("accum", "ranks", "ranks_accum"):
    worst = max(abs(a - b) / a for a, b in zip(one, load(other)))
    assert worst <= 1e-5, f"{other}: losses differ from 1 rank x 4 by {worst:.2e} relative"
    print(f"ok   {other}: every step's loss within {worst:.1e} of 1 rank x 4 sequences")
text = load("plain")
assert abs(text[0] - one[0]) > 1e-3 * one[0], f"unmasked first loss {text[0]} = masked {one[0]}"
print(f"ok   without the mask the first loss is another: {text[0]:.4f} against {one[0]:.4f}")
EOF
# the kept targets of the first step's two micro-batches of 2 differ, so averaging them per
# micro-batch would give another loss: read the first 4 sequences' masks as the trainer does
python3 - "$TMP/chat" <<'EOF' || fail "the check's premise"
import glob, struct, sys
f = open(sorted(glob.glob(sys.argv[1] + "/train-*.bin"))[0], "rb").read()
version, tb, n = struct.unpack_from("<IIQ", f, 8)
flags = struct.unpack_from("<I", f, 28)[0]
assert version == 2 and flags == 3, (version, flags)  # a loss mask, then document starts
bits = f[64 + tb * n:]
kept = [sum(bits[p // 8] >> (p % 8) & 1 for p in range(s * 64 + 1, s * 64 + 65)) for s in range(64)]
assert len(set(kept)) > 4, kept
share = sum(kept) / (64 * 64)
assert 0.05 < share < 0.95, share
print(f"ok   kept targets per sequence vary ({min(kept)} to {max(kept)} of 64; {share:.0%} kept overall)")
EOF

# ---- one step over every sample at lr 0 = keel eval over the same samples -------------------
"$KEEL_BIN" data prepare --format chat --chat-template llama2 --model tok.model --input conv.jsonl --out small \
  --max-tokens 3000 >prep3.log 2>&1 || fail "prepare small: $(tail -2 prep3.log)"
read -r samples kept < <(python3 - "$TMP/small" <<'EOF'
import glob, struct, sys
f = open(sorted(glob.glob(sys.argv[1] + "/train-*.bin"))[0], "rb").read()
version, tb, n = struct.unpack_from("<IIQ", f, 8)
bits = f[64 + tb * n:]
samples = (n - 1) // 64
print(samples, sum(bits[p // 8] >> (p % 8) & 1 for s in range(samples) for p in range(s * 64 + 1, s * 64 + 65)))
EOF
)
[ "$samples" -ge 20 ] || fail "the small set has $samples samples"
run whole --set "data.path=$TMP/small" --set train.steps=1 --set train.micro_batch_size="$samples" \
  --set train.lr=0 --set train.min_lr=0
"$KEEL_BIN" eval whole --data small >eval.json 2>eval.log || fail "keel eval: $(cat eval.log)"
python3 - "$kept" <<'EOF' || fail "the step's loss is not the mean over its kept targets"
import json, sys
train = [json.loads(l)["loss"] for l in open("whole/metrics.jsonl") if '"step"' in l][0]
ev = json.load(open("eval.json"))
assert ev["tokens"] == int(sys.argv[1]), f"eval counted {ev['tokens']} targets, the shard keeps {sys.argv[1]}"
assert abs(train - ev["loss"]) <= 1e-5 * ev["loss"], f"step loss {train}, eval {ev['loss']}"
print(f"ok   one step over all {ev['tokens']} kept targets at lr 0: loss {train:.6f}, keel eval {ev['loss']:.6f}")
EOF

# ---- data.document_mask: attention inside each document -------------------------------------
# on the text shards: a chat prompt after a conversation's start is masked out of the loss, and
# what it reads changes only positions after it, so there masking shows only where an answer
# shares a window with its conversation's start
run docs --set "data.path=$TMP/text" --set data.document_mask=true
run docs_ranks --nproc 2 --set train.micro_batch_size=2 --set "data.path=$TMP/text" --set data.document_mask=true
python3 - <<'EOF' || fail "document masking"
import json
load = lambda r: [json.loads(l)["loss"] for l in open(f"{r}/metrics.jsonl") if '"step"' in l]
one, docs, ranks = load("plain"), load("docs"), load("docs_ranks")
worst = max(abs(a - b) / a for a, b in zip(docs, ranks))
assert worst <= 1e-5, f"document masking on 2 ranks differs by {worst:.2e}"
assert abs(docs[0] - one[0]) > 1e-5 * one[0], f"document masking did not change the first loss ({docs[0]})"
print(f"ok   data.document_mask: first loss {docs[0]:.6f} (without: {one[0]:.6f}); 2 ranks within {worst:.1e}")
EOF
expect_input_error "document_mask on the synthetic source" "synthetic source has no documents" \
  "$KEEL_BIN" train mask.json --run-dir bad_docs --set data.path=null --set data.synthetic.seed=1 \
  --set data.document_mask=true
