# tests/lib.sh: helpers for keel's script tests (sourced). Each test runs in
# its own temp dir, removed on exit; `fail` prints why and exits non-zero.
set -euo pipefail
: "${KEEL_BIN:?KEEL_BIN must point at the keel binary}"
: "${KEEL_SRC:?KEEL_SRC must point at the source tree}"
TMP=$(mktemp -d /tmp/keel-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "ok   $*"; }
# json FILE EXPR: evaluate a Python expression on the parsed JSON `j`.
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }
# expect_input_error NAME PATTERN CMD...: CMD must exit 2 with exactly one
# stderr line that matches PATTERN (extended regex).
expect_input_error() {
  local name=$1 pattern=$2; shift 2
  local rc=0
  "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  [ "$rc" = 2 ] || fail "$name: exit code $rc, want 2 (stderr: $(cat "$TMP/err"))"
  [ "$(wc -l <"$TMP/err")" = 1 ] || fail "$name: want one stderr line, got: $(cat "$TMP/err")"
  grep -Eq "$pattern" "$TMP/err" || fail "$name: stderr '$(cat "$TMP/err")' lacks /$pattern/"
  pass "$name: $(cat "$TMP/err")"
}
