#!/usr/bin/env bash
# `keel data prepare --val-fraction` on ~3 MB of real text (Debian changelogs
# from /usr/share/doc, each distinct document once) with a real SentencePiece
# model: val and train document lengths come from one distribution (two-sample
# KS statistic below its alpha = 0.001 bound; the old token-quota rule gave
# 0.36 against 0.03 here), val holds ~10% of the tokens; a document's split
# depends on its text alone (the same documents reordered over many files,
# with CRLF ends and other separators, land in the same splits; the same
# order over many files gives the same files); --threads 1, 2, 3 give
# bit-identical files, chunks of a huge document included; the summary
# reports MB/s; another --split-seed draws another val set.
source "$KEEL_SRC/tests/lib.sh"
command -v spm_train >/dev/null || fail "spm_train not found (run scripts/install-deps.sh)"
check() { python3 "$KEEL_SRC/tests/data/split_check.py" "$@"; }

# ---- the corpus and its layouts ---------------------------------------------
mapfile -t changelogs < <(find /usr/share/doc -name changelog.Debian.gz -type f | sort)
(( ${#changelogs[@]} >= 50 )) || fail "only ${#changelogs[@]} changelog.Debian.gz files under /usr/share/doc"
check corpus "$TMP" "${changelogs[@]}" || fail "building the corpus"
[ "$(stat -c %s "$TMP/corpus.txt")" -gt 1000000 ] || fail "under 1 MB of distinct changelog text"
spm_train --input="$TMP/corpus.txt" --model_prefix="$TMP/tok" --vocab_size=2000 --model_type=bpe \
    --character_coverage=1.0 --byte_fallback=true >"$TMP/spm.log" 2>&1 \
    || fail "spm_train: $(tail -2 "$TMP/spm.log")"
mkdir "$TMP/out"
prepare() { # NAME ARGS...: prepare into $TMP/out/NAME, the summary in $TMP/out/NAME.txt
    local out=$TMP/out/$1; shift
    "$KEEL_BIN" data prepare --model "$TMP/tok.model" --out "$out" "$@" >"$out.txt" \
        || fail "prepare $*: exit $?"
}

# ---- val and train documents alike (only options the old rule had) ----------
prepare d --input "$TMP/corpus.txt" --val-fraction 0.1
cat "$TMP/out/d.txt"
check ks "$TMP/out/d" || fail "the split is biased (above)"
pass "val and train document lengths agree"
grep -Eq '^split: [0-9]+ of [0-9]+ document chunks to val \(--val-fraction 0.1, --split-seed 0\)$' \
    "$TMP/out/d.txt" || fail "summary lacks the split line"
grep -Eq '^text: [0-9.]+ MB in [0-9.]+ s: [0-9.]+ MB/s on [0-9]+ threads?$' "$TMP/out/d.txt" \
    || fail "summary lacks MB/s"

# ---- a document's split is a function of its text ---------------------------
prepare shuffled --input "$TMP"/shuffled/*.txt --val-fraction 0.1
check same-docs "$TMP/out/d" "$TMP/out/shuffled" || fail "reordered inputs put documents in other splits"
pass "same splits with the documents reordered over $(ls "$TMP/shuffled" | wc -l) files"

# ---- any thread count, any file layout: the same bytes ------------------------
# Small shards so that each split spans several files; all.txt holds a huge
# document (several 65536-token chunks, each hashed on its own).
for t in 1 2 3; do
    prepare "t$t" --input "$TMP/all.txt" --val-fraction 0.1 --shard-tokens 200000 --threads "$t"
    grep -q "on $t thread" "$TMP/out/t$t.txt" || fail "--threads $t: $(tail -1 "$TMP/out/t$t.txt")"
done
[ "$(ls "$TMP/out/t1" | grep -c '^val-')" -ge 1 ] && [ "$(ls "$TMP/out/t1" | grep -c '^train-')" -ge 3 ] \
    || fail "expected several shard files: $(ls "$TMP/out/t1" | tr '\n' ' ')"
diff -r "$TMP/out/t1" "$TMP/out/t2" >/dev/null || fail "--threads 2 wrote other files than --threads 1"
diff -r "$TMP/out/t1" "$TMP/out/t3" >/dev/null || fail "--threads 3 wrote other files than --threads 1"
pass "--threads 1, 2, 3: bit-identical ($(ls "$TMP/out/t1" | wc -l) files)"
prepare pieces --input "$TMP"/pieces/*.txt --val-fraction 0.1 --shard-tokens 200000 --threads 2
diff -r "$TMP/out/t1" "$TMP/out/pieces" >/dev/null || fail "all.txt cut into files wrote other files"
pass "one file or $(ls "$TMP/pieces" | wc -l) files in the same order: bit-identical"
huge_chunks=$(( $(sed -n 's/^split: [0-9]* of \([0-9]*\) .*/\1/p' "$TMP/out/t1.txt") \
              - $(sed -n 's/^total: .* from \([0-9]*\) documents.*/\1/p' "$TMP/out/t1.txt") + 1 ))
(( huge_chunks >= 3 )) || fail "the huge document made $huge_chunks chunks, expected several"

# ---- the seed -----------------------------------------------------------------
prepare seed1 --input "$TMP/corpus.txt" --val-fraction 0.1 --split-seed 1
grep -q -- '--split-seed 1)$' "$TMP/out/seed1.txt" || fail "summary does not name seed 1"
check other-val "$TMP/out/d" "$TMP/out/seed1" || fail "--split-seed 1 drew the same val set as 0"
pass "data_split_by_hash"
