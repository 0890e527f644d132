#!/usr/bin/env bash
# scripts/fuzz.sh: run keel's fuzz harnesses (tests/fuzz: every file parser
# under libFuzzer with ASan + UBSan).
#
#   scripts/fuzz.sh                         every harness for an hour, two at a time
#   scripts/fuzz.sh --time 600 hf ckpt      those two, 10 minutes each
#   scripts/fuzz.sh --replay                every seed and regression input once
#   scripts/fuzz.sh --build build-asan/fuzz --time 20 config   (what ctest's fuzz label runs)
#
# --build DIR: the harnesses' build (default: build-fuzz/, configured and
# built here with clang from tests/fuzz/CMakeLists.txt; a sanitized keel
# build makes them in BUILD/fuzz). New inputs go to DIR/corpus/<harness>/
# (reused by the next run), crashes to DIR/artifacts/<harness>/ — add each
# crash to tests/fuzz/regressions/<harness>/ once it is fixed. The last line
# of each harness is libFuzzer's count: runs, coverage (cov: edges, ft:
# features), corpus. Exit 1 when a harness found something.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
ALL=(tokenizer_model tokenizer_text hf ckpt token_shard config node_config cluster_spec jsonl_record decompress tokenizer_json chat_record parquet prompts task completions k8s_spec k8s_status etcd)
build="" time_s=3600 jobs=2 replay=false harnesses=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --time) time_s=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --replay) replay=true; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${ALL[@]}")
for h in "${harnesses[@]}"; do
  [ -f "$SRC/tests/fuzz/fuzz_$h.c" ] || { echo "fuzz.sh: no harness '$h' (harnesses: ${ALL[*]})" >&2; exit 2; }
done
if [ -z "$build" ]; then
  build=$SRC/build-fuzz
  command -v clang >/dev/null || { echo "fuzz.sh: clang not found: run scripts/install-deps.sh" >&2; exit 2; }
  cmake -S "$SRC/tests/fuzz" -B "$build" -DCMAKE_C_COMPILER=clang >/dev/null
  cmake --build "$build" -j"$jobs" >/dev/null
fi
build=$(cd "$build" && pwd)

# One harness: replay its seeds and regressions, or fuzz it for time_s.
run_one() {
  local h=$1 bin=$build/fuzz_$h log=$build/logs/$h$($replay && echo .replay).log
  local seeds=$SRC/tests/fuzz/corpus/$h regressions=$SRC/tests/fuzz/regressions/$h
  [ -x "$bin" ] || { echo "$h: $bin not built" >&2; return 1; }
  mkdir -p "$build/logs" "$build/corpus/$h" "$build/artifacts/$h" "$regressions"
  local common=(-timeout=10 -rss_limit_mb=2048 -artifact_prefix="$build/artifacts/$h/" -print_final_stats=1)
  local rc=0
  if $replay; then
    "$bin" "${common[@]}" -runs=0 "$seeds" "$regressions" >"$log" 2>&1 || rc=$?
  else
    "$bin" "${common[@]}" -max_total_time="$time_s" -dict="$SRC/tests/fuzz/$h.dict" \
      "$build/corpus/$h" "$seeds" "$regressions" >"$log" 2>&1 || rc=$?
  fi
  local stats
  stats=$(grep -E '^#[0-9]+[[:space:]]+(INITED|DONE|pulse|NEW|REDUCE)' "$log" | tail -1 || true)
  if [ "$rc" = 0 ]; then
    echo "ok   $h: ${stats:-no stats} ($(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') runs; log $log)"
  else
    echo "FAIL $h: exit $rc ($log):"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written|failed .* without one error line|left .* behind' "$log" | head -8
  fi
  return $rc
}

status=0 pids=()
for h in "${harnesses[@]}"; do
  if [ "$jobs" -le 1 ]; then run_one "$h" || status=1; continue; fi
  run_one "$h" & pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
