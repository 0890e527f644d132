#!/bin/bash
# tests/cuemu/translate.sh IN.cu OUT.cpp: a .cu file of keel as host C++ for
# the CUDA emulator (cuemu.cpp). Two mechanical edits, nothing else:
#   K<<<config>>>(args)             cuemu::launch(K, "K", config)(args)
#   extern __shared__ [__align__(n)] T smem[];
#                                   T *const smem = (T *)cuemu::dynamic_smem();
# Each launch and each dynamic shared array must be on one line, so the count
# of edits is checked against the count of `<<<` and `extern __shared__`.
set -euo pipefail
in=$1 out=$2
launches=$(grep -c '<<<' "$in" || true)
shared=$(grep -c 'extern __shared__' "$in" || true)
sed -E \
  -e 's/([A-Za-z_][A-Za-z_0-9]*)(<[^<>]*>)?<<<(.*)>>>\(/cuemu::launch(\1\2, "\1", \3)(/' \
  -e 's/extern __shared__ (__align__\([0-9]+\) )?([A-Za-z_][A-Za-z_0-9 ]*[A-Za-z_0-9]) smem\[\];/\2 *const smem = (\2 *)cuemu::dynamic_smem();/' \
  "$in" >"$out.tmp"
left=$(grep -c -E '<<<|extern __shared__' "$out.tmp" || true)
done_edits=$(grep -c -E 'cuemu::launch\(|cuemu::dynamic_smem\(\)' "$out.tmp" || true)
if [ "$left" != 0 ] || [ "$done_edits" != $((launches + shared)) ]; then
  echo "translate.sh: $in: $((launches + shared)) launches and dynamic shared arrays, $done_edits translated, $left left" >&2
  rm -f "$out.tmp"
  exit 1
fi
{ echo "#line 1 \"$in\""; cat "$out.tmp"; } >"$out"
rm -f "$out.tmp"
