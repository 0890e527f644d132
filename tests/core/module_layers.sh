#!/usr/bin/env bash
# The module floors of DESIGN §2 hold in the #include lines of src/ and
# include/: a file includes only headers of its own module or of modules
# below it (core -> kernels/cuda/dist/obs -> backend/model/data -> fsdp/optim/ckpt/hf ->
# run/plan -> train/resil/monitor -> cli); modules on one floor may use each other one
# way but never in a loop, and train and resil — the workers and the
# supervisor — never include each other (they meet only in run).
source "$KEEL_SRC/tests/lib.sh"
cd "$KEEL_SRC"

declare -A FLOOR=([core]=0 [kernels]=1 [cuda]=1 [dist]=1 [obs]=1 [backend]=2 [model]=2 [data]=2
                  [fsdp]=3 [optim]=3 [ckpt]=3 [hf]=3 [run]=4 [plan]=4 [train]=5 [resil]=5 [monitor]=5 [cluster]=6 [cli]=6)
# the module a header belongs to: include/keel/X.h is X's (tokenizer.h is
# data's), src/X/... is X's
header_module() {
  case $1 in
    keel/tokenizer.h) echo data ;;
    keel/*.h) basename "$1" .h ;;
    */*) echo "${1%%/*}" ;;
    *) echo "$2" ;; # "comm_internal.h": a header next to the file, its own module
  esac
}
file_module() {
  case $1 in
    include/keel/*) header_module "${1#include/}" ;;
    src/*) local m=${1#src/}; echo "${m%%/*}" ;;
  esac
}

violations=0 edges=$TMP/edges
: >"$edges"
while IFS= read -r file; do
  from=$(file_module "$file")
  [ -n "${FLOOR[$from]:-}" ] || { echo "FAIL: $file: module '$from' has no floor in this test (add it to DESIGN §2 and here)"; violations=$((violations + 1)); continue; }
  while IFS=: read -r line inc; do
    to=$(header_module "$inc" "$from")
    [ "$to" = "$from" ] && continue
    [ -n "${FLOOR[$to]:-}" ] || { echo "FAIL: $file:$line includes \"$inc\" of unknown module '$to'"; violations=$((violations + 1)); continue; }
    if [ "${FLOOR[$to]}" -gt "${FLOOR[$from]}" ]; then
      echo "FAIL: $file:$line: $from (floor ${FLOOR[$from]}) includes \"$inc\" of $to (floor ${FLOOR[$to]}), a module above it"
      violations=$((violations + 1))
    elif [ "${FLOOR[$to]}" = 5 ] && [ "${FLOOR[$from]}" = 5 ]; then
      echo "FAIL: $file:$line: $from includes \"$inc\": train and resil meet only in run"
      violations=$((violations + 1))
    fi
    echo "$from $to" >>"$edges"
  done < <(grep -n '^#include "' "$file" | sed -E 's/^([0-9]+):#include "([^"]+)".*/\1:\2/')
done < <(find src include -name '*.[ch]' | sort)

# no loop among modules (tsort reports one on stderr)
if ! sort -u "$edges" | tsort >/dev/null 2>"$TMP/tsort"; then
  echo "FAIL: the modules include each other in a loop: $(tr '\n' ' ' <"$TMP/tsort")"
  violations=$((violations + 1))
fi
[ "$violations" = 0 ] || fail "$violations include(s) break the module floors"
pass "$(find src include -name '*.[ch]' | wc -l) files, $(sort -u "$edges" | wc -l) module dependencies, all downward, no loop"
