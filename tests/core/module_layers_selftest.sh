#!/usr/bin/env bash
# The layering test cannot be fooled: on a small tree of its own, each way of
# writing an upward or looping include makes tests/core/module_layers.sh fail
# with the line that says why, and the clean tree passes.
source "$KEEL_SRC/tests/lib.sh"

base=$TMP/base
mkdir -p "$base"/include/keel "$base"/src/{core,cuda,run,plan,train,resil}
for m in core cuda run plan train resil; do echo "/* keel/$m.h */" >"$base/include/keel/$m.h"; done
printf '#include "keel/core.h"\n#include <stdio.h>\n' >"$base/src/core/ok.c"
printf '#include "keel/core.h"\n#include "keel/run.h"\n' >"$base/src/train/ok.c"
printf '#include "keel/plan.h"\n' >"$base/src/run/ok.c" # one way on a floor
printf '#include "keel/core.h"\n' >"$base/src/cuda/ok.cu"

layers() { KEEL_LAYERS_ROOT=$1 bash "$KEEL_SRC/tests/core/module_layers.sh" >"$TMP/out" 2>&1; }
layers "$base" || fail "the clean tree fails: $(cat "$TMP/out")"
pass "a clean tree passes"

# case NAME PATTERN FILE TEXT: the base tree with FILE holding TEXT must fail,
# naming PATTERN
case_fails() {
  local name=$1 pattern=$2 file=$3 text=$4 tree=$TMP/$1
  rm -rf "$tree" && cp -r "$base" "$tree"
  mkdir -p "$(dirname "$tree/$file")" && printf '%b' "$text" >"$tree/$file"
  if layers "$tree"; then fail "$name: passed: $(cat "$TMP/out")"; fi
  grep -Eq "$pattern" "$TMP/out" || fail "$name: the failure does not say /$pattern/: $(cat "$TMP/out")"
  pass "$name: $(grep -E "$pattern" "$TMP/out" | head -1)"
}
case_fails angle_brackets 'core.*includes keel/train.h of train' src/core/up.c '#include <keel/train.h>\n'
case_fails spaces_after_hash 'core.*includes keel/train.h of train' src/core/up.c '#  include   "keel/train.h"\n'
case_fails indented_in_ifdef 'core.*includes keel/train.h of train' src/core/up.c \
  '#ifdef X\n#  ifdef Y\n    #include "keel/train.h"\n#  endif\n#endif\n'
case_fails cuda_file 'cuda \(floor 1\) includes keel/train.h' src/cuda/k.cu '#include "keel/train.h"\n'
cp /dev/null "$base/src/train/x.h" # the target of the next case
case_fails relative_path 'core.*includes ../train/x.h of train' src/core/up.c '#include "../train/x.h"\n'
case_fails floor_loop 'modules include each other in a loop: plan run' src/plan/back.c '#include "keel/run.h"\n'
case_fails train_resil 'train and resil meet only in run' src/train/sup.c '#include "keel/resil.h"\n'
case_fails unknown_module "module 'extra' has no floor" src/extra/x.c '#include "keel/core.h"\n'
mkdir -p "$base/src/train" && printf '#include "b.h"\n' >"$base/src/train/a.h"
case_fails file_loop 'files include each other in a loop: src/train/a.h src/train/b.h' src/train/b.h '#include "a.h"\n'
pass "every way of breaking the floors is caught"
