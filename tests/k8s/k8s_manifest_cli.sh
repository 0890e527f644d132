#!/usr/bin/env bash
# `keel k8s manifest` on the command line: YAML on stdout (documents between
# "---" lines), or --out DIR with etcd.yaml and pytorchjob.yaml (mpijob.yaml)
# written and never overwritten without --force; every bad spec or option is
# exit 2 with one stderr line naming the file, the key and the value, and
# nothing on stdout or in --out.
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN

"$K" k8s manifest "$KEEL_SRC/examples/k8s-pytorchjob.json" >"$TMP/all.yaml" 2>"$TMP/err" || fail "the example: $(cat "$TMP/err")"
[ "$(grep -c '^---$' "$TMP/all.yaml")" = 2 ] || fail "want 3 documents (2 '---' lines): $(grep -c '^---$' "$TMP/all.yaml")"
[ "$(grep -c '^kind: ' "$TMP/all.yaml")" = 3 ] && grep -q '^kind: "PyTorchJob"$' "$TMP/all.yaml" ||
  fail "want Deployment, Service and PyTorchJob: $(grep '^kind: ' "$TMP/all.yaml")"
[ ! -s "$TMP/err" ] || fail "stderr on success: $(cat "$TMP/err")"
pass "stdout: the etcd Deployment and Service, then the PyTorchJob"

"$K" k8s manifest "$KEEL_SRC/examples/k8s-pytorchjob.json" --out "$TMP/dir" 2>"$TMP/err" || fail "--out: $(cat "$TMP/err")"
[ -f "$TMP/dir/etcd.yaml" ] && [ -f "$TMP/dir/pytorchjob.yaml" ] || fail "--out wrote: $(ls "$TMP/dir")"
[ "$(ls -A "$TMP/dir" | wc -l)" = 2 ] || fail "--out left other files: $(ls -A "$TMP/dir")"
before=$(cat "$TMP/dir/pytorchjob.yaml")
expect_input_error "--out over existing files" "pytorchjob.yaml exists|etcd.yaml exists" \
  "$K" k8s manifest "$KEEL_SRC/examples/k8s-pytorchjob.json" --out "$TMP/dir"
[ "$(cat "$TMP/dir/pytorchjob.yaml")" = "$before" ] || fail "a refused --out changed a file"
echo "mine" >"$TMP/dir/etcd.yaml"
"$K" k8s manifest "$KEEL_SRC/examples/k8s-pytorchjob.json" --out "$TMP/dir" --force 2>/dev/null || fail "--force"
grep -q '^kind: "Deployment"$' "$TMP/dir/etcd.yaml" || fail "--force did not replace etcd.yaml"
"$K" k8s manifest "$KEEL_SRC/examples/k8s-mpijob.json" --out "$TMP/mpi" 2>/dev/null || fail "MPIJob --out"
[ "$(ls "$TMP/mpi")" = mpijob.yaml ] || fail "MPIJob --out wrote: $(ls "$TMP/mpi")"
pass "--out: etcd.yaml + pytorchjob.yaml, or mpijob.yaml; never over a file unless --force"

# bad specs: exit 2, one line naming the file and key, nothing written
bad() { # NAME PATTERN SPEC_TEXT
  printf '%s' "$3" >"$TMP/bad.json"
  expect_input_error "$1" "bad.json: .*$2" "$K" k8s manifest "$TMP/bad.json" --out "$TMP/bad-out"
  [ ! -e "$TMP/bad-out" ] || fail "$1: --out was made"
}
b='"name": "job", "checkpointClaim": "ckpt"'
bad "no image" "image: missing" "{$b, \"nodes\": 2}"
bad "GPUs not nprocPerNode" "gpusPerNode: 4 GPUs for nprocPerNode 8" "{$b, \"image\": \"k\", \"nodes\": 1, \"nprocPerNode\": 8, \"gpusPerNode\": 4}"
bad "min > max" "elastic.minNodes: 3 is more than elastic.maxNodes 2" "{$b, \"image\": \"k\", \"elastic\": {\"minNodes\": 3, \"maxNodes\": 2}}"
bad "elastic with a Master" "master: true with elastic" "{$b, \"image\": \"k\", \"master\": true, \"elastic\": {\"minNodes\": 1, \"maxNodes\": 2}}"
bad "name not a DNS label" "name: 'My_Job' is not a DNS-1035 label" "{\"name\": \"My_Job\", \"image\": \"k\", \"nodes\": 1, \"checkpointClaim\": \"c\"}"
bad "misspelled key" "gpuPerNode: unknown key" "{$b, \"image\": \"k\", \"nodes\": 1, \"gpuPerNode\": 1}"
bad "wrong type" "nprocPerNode: want a whole number 1..64, not a string" "{$b, \"image\": \"k\", \"nodes\": 1, \"nprocPerNode\": \"8\"}"
bad "out of range" "efaPerNode: 33 is not a whole number 0..32" "{$b, \"image\": \"k\", \"nodes\": 1, \"efaPerNode\": 33}"
bad "YAML in a value" "image: 'k" "{$b, \"image\": \"k\\\"\\n---\\nkind: Secret\", \"nodes\": 1}"
expect_input_error "missing spec file" "nope.json: cannot read the spec" "$K" k8s manifest "$TMP/nope.json"
expect_input_error "no spec" "want one spec file" "$K" k8s manifest
expect_input_error "unknown option" "unknown option '--outt'" "$K" k8s manifest "$KEEL_SRC/examples/k8s-mpijob.json" --outt x
expect_input_error "--out without a value" "no value for '--out'" "$K" k8s manifest "$KEEL_SRC/examples/k8s-mpijob.json" --out
expect_input_error "--force without --out" "force replaces files of --out" "$K" k8s manifest "$KEEL_SRC/examples/k8s-mpijob.json" --force
expect_input_error "unknown k8s command" "unknown command 'apply'" "$K" k8s apply x
"$K" k8s --help | grep -q "keel k8s manifest SPEC.json" || fail "keel k8s --help"
"$K" --help | grep -q "^  k8s " || fail "keel --help lists k8s"
pass "keel --help lists k8s; keel k8s --help shows the usage"
