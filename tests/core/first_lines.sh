#!/usr/bin/env bash
# Every source file opens with one comment line that names it and says what it
# holds — src/X/Y.c with "X/Y.c:", a public header include/keel/X.h with "X:"
# (its module) — so a file moved or renamed without its first line is caught.
source "$KEEL_SRC/tests/lib.sh"
cd "$KEEL_SRC"
bad=0 n=0
while IFS= read -r f; do
  n=$((n + 1))
  case $f in
    include/keel/tokenizer.h) want=tokenizer ;; # the data module's second public header
    include/keel/*) want=$(basename "$f" .h) ;;
    src/*) want=${f#src/} ;;
  esac
  line=$(head -n 1 "$f")
  case $line in
    "/* $want:"* | "/* $want "* | "// $want:"*) ;;
    *) echo "FAIL: $f: the first line does not name it ('$want:'): $line"; bad=$((bad + 1)) ;;
  esac
  [ "${#line}" -gt $(( ${#want} + 12 )) ] || { echo "FAIL: $f: the first line says nothing of what it holds: $line"; bad=$((bad + 1)); }
done < <(find src include -name '*.[ch]' -o -name '*.cu' -o -name '*.cpp' -o -name '*.cc' -o -name '*.cuh' | sort)
[ "$bad" = 0 ] || fail "$bad file(s) without a true first line"
pass "$n source files each open by naming themselves and their job"
