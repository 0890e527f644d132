#!/usr/bin/env bash
# `keel k8s manifest`'s YAML is what a cluster with the Kubeflow operators would
# admit: every document of the examples and of a few more specs (a Master with
# Workers, a Master alone, Workers only, a CPU MPIJob) passes
# tests/k8s/check_manifests.py — the PyTorchJob v1 and MPIJob v2beta1 CRDs'
# openAPIV3Schemas (tests/k8s/crds/, upstream files) made strict
# (additionalProperties: false), the operators' admission rules, and the
# kubernetes client's models for the etcd Deployment and Service and every pod
# template. Then the checker must refuse the same YAML broken the ways a
# renderer breaks (a misspelled field, a wrong apiVersion, the container not
# named pytorch, a Master beside elasticPolicy, a string where a number goes,
# a mount naming no volume, a Service selecting nothing), so a checker that
# passes everything fails here. jsonschema, PyYAML and kubernetes come from
# PyPI, pinned, in a venv made once under $KEEL_CACHE/venv-k8s.
source "$KEEL_SRC/tests/lib.sh"
JSONSCHEMA_VERSION=4.26.0 PYYAML_VERSION=6.0.3 KUBERNETES_VERSION=37.0.2
venv="${KEEL_CACHE:-$KEEL_SRC/.cache}/venv-k8s"
python="$venv/bin/python"
if ! "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('jsonschema') != '$JSONSCHEMA_VERSION' or m.version('PyYAML') != '$PYYAML_VERSION' or m.version('kubernetes') != '$KUBERNETES_VERSION')" 2>/dev/null; then
  base=/usr/bin/python3
  [ -x "$base" ] || base=$(command -v python3)
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$base" -m venv "$venv" >"$TMP/venv.log" 2>&1 || fail "cannot make a venv at $venv: $(tail -n 2 "$TMP/venv.log")"
  "$venv/bin/pip" install -q "jsonschema==$JSONSCHEMA_VERSION" "PyYAML==$PYYAML_VERSION" \
    "kubernetes==$KUBERNETES_VERSION" >>"$TMP/venv.log" 2>&1 ||
    fail "pip install jsonschema PyYAML kubernetes failed: $(tail -n 2 "$TMP/venv.log")"
fi
check() { "$python" "$KEEL_SRC/tests/k8s/check_manifests.py" "$KEEL_SRC/tests/k8s/crds" "$@"; }

# ---- what keel renders passes ---------------------------------------------------------------
base='"image": "registry.example.com/keel@sha256:0123abcd", "checkpointClaim": "ckpt.shared-fs"'
printf '{"name": "fixed", %s, "nodes": 3, "nprocPerNode": 2, "runId": "fixed-1"}' "$base" >"$TMP/fixed.json"
printf '{"name": "alone", %s, "nodes": 1, "namespace": "ml"}' "$base" >"$TMP/alone.json"
printf '{"name": "workers", %s, "nodes": 2, "master": false, "efaPerNode": 1}' "$base" >"$TMP/workers.json"
printf '{"name": "cpu-mpi", "kind": "MPIJob", %s, "nodes": 3, "nprocPerNode": 4, "shmSizeGiB": 2}' "$base" \
  >"$TMP/cpu-mpi.json"
printf '{"name": "e", %s, "elastic": {"minNodes": 1, "maxNodes": 1, "maxRestarts": 0}, "gpusPerNode": 1}' \
  "$base" >"$TMP/e.json"
specs=("$KEEL_SRC/examples/k8s-pytorchjob.json" "$KEEL_SRC/examples/k8s-mpijob.json" "$TMP"/{fixed,alone,workers,cpu-mpi,e}.json)
for spec in "${specs[@]}"; do
  out=$TMP/$(basename "$spec" .json).yaml
  "$KEEL_BIN" k8s manifest "$spec" >"$out" || fail "keel k8s manifest $spec failed"
done
check "$TMP"/*.yaml >"$TMP/check.log" || fail "rendered manifests refused: $(grep -v ': ok' "$TMP/check.log")"
pass "$(wc -l <"$TMP/check.log") specs' manifests pass the CRD schemas, the admission rules and the core models"

# ---- the checker refuses broken YAML ------------------------------------------------------------
pt=$TMP/k8s-pytorchjob.yaml mpi=$TMP/k8s-mpijob.yaml fixed=$TMP/fixed.yaml
mkdir "$TMP/broken"
declare -A wants
n=0
broken() { # NAME FILE SED WANT: FILE edited by SED, which the checker must refuse naming WANT
  local name=$1 file=$2 edit=$3 want=$4 out
  out=$TMP/broken/$((n++)).yaml
  sed "$edit" "$file" >"$out"
  cmp -s "$file" "$out" && fail "$name: the edit changed nothing (is the YAML still as this test expects?)"
  wants[$out]="$name|$want"
}
broken "misspelled nprocPerNode" "$pt" 's/nprocPerNode:/nprocPerNod:/' "'nprocPerNod' was unexpected"
broken "apiVersion kubeflow.org/v2" "$pt" 's#"kubeflow.org/v1"#"kubeflow.org/v2"#' "no served CRD version"
broken "container not named pytorch" "$pt" 's/- name: "pytorch"/- name: "torch"/' "container with name pytorch"
broken "a Master beside elasticPolicy" "$pt" 's/^    Worker:/    Master:/' "must be configured if elastic policy"
broken "unknown rendezvous backend" "$pt" 's/rdzvBackend: "etcd"/rdzvBackend: "etcd3"/' "rdzvBackend"
broken "misspelled mountPath" "$pt" 's#mountPath: "/dev/shm"#mountPat: "/dev/shm"#' "'mountPat' was unexpected"
broken "a mount naming no volume" "$pt" '/- name: "dshm"/{N;/emptyDir/s/"dshm"/"shm"/}' "names no volume"
broken "Master replicas 2" "$fixed" '/Master:/{n;s/replicas: 1/replicas: 2/}' "must be 1"
broken "misspelled readinessProbe" "$pt" 's/readinessProbe:/readinesProbe:/' "not a field of the model"
broken "Service selecting nothing" "$pt" '/kind: "Service"/,$s/instance: "llama-fsdp"/instance: "x"/' "selects none"
broken "slotsPerWorker as a string" "$mpi" 's/slotsPerWorker: 8/slotsPerWorker: "8"/' "is not of type 'integer'"
broken "MPIJob apiVersion v1" "$mpi" 's#"kubeflow.org/v2beta1"#"kubeflow.org/v1"#' "no served CRD version"
broken "Worker restartPolicy Always" "$mpi" 's/restartPolicy: "Never"/restartPolicy: "Always"/' "not supported"
broken "MPIJob without cleanPodPolicy" "$mpi" '/runPolicy:/,/cleanPodPolicy/d' "cleanPodPolicy"
# one run of the checker for all (loading the models and the CRDs is most of its time)
check "$TMP"/broken/*.yaml >"$TMP/broken.log" && fail "the checker passed every broken file"
for out in "${!wants[@]}"; do
  name=${wants[$out]%%|*} want=${wants[$out]#*|}
  grep -q "^$out: ok" "$TMP/broken.log" && fail "$name: the checker passed it"
  grep "^$out: " "$TMP/broken.log" | grep -q -- "$want" ||
    fail "$name: the checker's reasons lack '$want': $(grep "^$out: " "$TMP/broken.log")"
  pass "refused: $name"
done
