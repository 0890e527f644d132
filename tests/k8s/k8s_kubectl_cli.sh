#!/usr/bin/env bash
# `keel k8s status|logs|delete` through the real kubectl, against a stand-in
# API server (tests/k8s/kube_stand_in.py: discovery, the jobs and pods as the
# training-operator and mpi-operator write them, pod logs, DELETE; on a port
# the kernel picks) that records every request: the status of a running, a
# failed and a missing job; the logs of every pod and of one; delete removing
# exactly the job and its keel-labelled etcd Deployment and Service, never a
# same-named object without keel's label nor another job's; a bad name or
# namespace refused before kubectl runs; kubectl missing, or failing, in one
# line. Then `keel k8s manifest JOB.env`: the YAML of the JSON spec of the
# same values, and every bad line refused (a $(...) never run).
source "$KEEL_SRC/tests/lib.sh"
K=$KEEL_BIN
command -v kubectl >/dev/null || fail "kubectl not found: run scripts/install-deps.sh (Debian: kubernetes-client)"

SRV=$TMP/server
mkdir -p "$SRV"
python3 "$KEEL_SRC/tests/k8s/kube_stand_in.py" "$SRV" 2>"$TMP/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do [ -s "$SRV/port" ] && break; sleep 0.1; done
[ -s "$SRV/port" ] || fail "the stand-in API server did not start: $(cat "$TMP/server.log")"
kubeconfig() { # FILE PORT: a kubeconfig naming the server at 127.0.0.1:PORT
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster:
    server: http://127.0.0.1:$2
contexts:
- name: stand-in
  context: {cluster: stand-in, user: tester}
current-context: stand-in
users:
- name: tester
  user: {}
EOF
}
kubeconfig "$TMP/kubeconfig" "$(cat "$SRV/port")"
export KUBECONFIG=$TMP/kubeconfig KUBECACHEDIR=$TMP/kube-cache HOME=$TMP
unset KEEL_KUBECTL
# what the stand-in was asked since the last `asked_reset`: "METHOD PATH" lines, or with a query "... ?k=v&..."
asked() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    q = "&".join(f"{k}={v}" for k, v in sorted(r["query"].items()) if k not in ("timeout", "limit"))
    print(r["method"], r["path"] + ("?" + q if q else ""))' "$SRV/requests.jsonl" 2>/dev/null || true; }
asked_reset() { : >"$SRV/requests.jsonl"; }
asked_nothing() { [ ! -s "$SRV/requests.jsonl" ] || fail "$1: kubectl ran: $(asked | head -3)"; }

# ---- status ----
asked_reset
"$K" k8s status llama --namespace training >"$TMP/out" 2>"$TMP/err" || fail "status of a running job: exit $? ($(cat "$TMP/err"))"
[ ! -s "$TMP/err" ] || fail "status: stderr: $(cat "$TMP/err")"
grep -qx 'PyTorchJob llama in namespace training' "$TMP/out" &&
  grep -qx 'state:    Running (PyTorchJobRunning: PyTorchJob training/llama is running.)' "$TMP/out" &&
  grep -qx 'replicas: Master 1 active, 0 succeeded, 0 failed; Worker 2 active, 0 succeeded, 0 failed' "$TMP/out" &&
  grep -Eq '^llama-master-0 +Running +1/1 +0 +ip-10-0-1-12\.ec2\.internal +[5-9]m$' "$TMP/out" &&
  grep -Eq '^llama-worker-1 +Running +1/1 +2 +ip-10-0-1-14\.ec2\.internal +[5-9]m$' "$TMP/out" ||
  fail "status of a running job: $(cat "$TMP/out")"
[ "$(grep -c -- '-etcd' "$TMP/out")" = 0 ] || fail "status lists the etcd pod: $(cat "$TMP/out")"
asked | grep -qx 'GET /apis/kubeflow.org/v1/namespaces/training/pytorchjobs/llama' &&
  asked | grep -qx 'GET /api/v1/namespaces/training/pods?labelSelector=training.kubeflow.org/job-name=llama' ||
  fail "status asked: $(asked)"
pass "status of a running job: state, replicas, a line per pod (kubectl get pytorchjobs.v1.kubeflow.org, pods -l)"

rc=0
"$K" k8s status broken -n training >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && [ ! -s "$TMP/err" ] &&
  grep -qx 'state:    Failed (PyTorchJobFailed: PyTorchJob broken is failed because 1 Worker replica(s) failed.)' "$TMP/out" &&
  grep -qx 'replicas: Worker 0 active, 0 succeeded, 1 failed' "$TMP/out" &&
  grep -Eq '^broken-worker-0 +Failed +0/1 +0 ' "$TMP/out" || fail "status of a failed job: exit $rc: $(cat "$TMP/out" "$TMP/err")"
pass "status of a failed job: exit 1, its last true condition (Failed, not the Running before it)"

"$K" k8s status tiny >"$TMP/out" 2>"$TMP/err" || fail "status in the current namespace: $(cat "$TMP/err")"
grep -qx 'PyTorchJob tiny in namespace default' "$TMP/out" &&
  grep -Eq '^tiny-worker-0 +Pending \(ContainerCreating\) +0/1 +0 +- +[0-9]+[sm]$' "$TMP/out" ||
  fail "status in the current namespace: $(cat "$TMP/out")"
"$K" k8s status mpi -n training --kind MPIJob >"$TMP/out" 2>"$TMP/err" || fail "status of an MPIJob: $(cat "$TMP/err")"
grep -qx 'replicas: Launcher 1 active, 0 succeeded, 0 failed; Worker 2 active, 0 succeeded, 0 failed' "$TMP/out" &&
  grep -Eq '^mpi-launcher-q8z4k +Running ' "$TMP/out" || fail "status of an MPIJob: $(cat "$TMP/out")"
pass "status: kubectl's current namespace, pods waiting for their container; an MPIJob (mpijobs.v2beta1.kubeflow.org)"

expect_input_error "status of a missing job" \
  'keel k8s status: no PyTorchJob nope in namespace training \(kubectl: Error from server \(NotFound\): pytorchjobs.kubeflow.org "nope" not found\)' \
  "$K" k8s status nope -n training
expect_input_error "status in a missing namespace" 'no PyTorchJob llama in namespace elsewhere .*namespaces "elsewhere" not found' \
  "$K" k8s status llama -n elsewhere
expect_input_error "an MPIJob asked for as a PyTorchJob" 'no PyTorchJob mpi in namespace training' \
  "$K" k8s status mpi -n training

# ---- logs ----
asked_reset
"$K" k8s logs llama -n training >"$TMP/out" 2>"$TMP/err" || fail "logs of every pod: $(cat "$TMP/err")"
cat >"$TMP/want" <<'EOF'
[pod/llama-master-0/pytorch] keel agent: round 0: 3 nodes
[pod/llama-master-0/pytorch] step 1 loss 10.37
[pod/llama-master-0/pytorch] step 2 loss 9.81
[pod/llama-worker-0/pytorch] keel agent: round 0: 3 nodes
[pod/llama-worker-1/pytorch] keel agent: round 0: 3 nodes
[pod/llama-worker-1/pytorch] keel agent: rank 2 restarted
EOF
# kubectl's order of the pods is its own (1.20 puts the master last): each pod's lines in order, by pod
bypod() { sort -s -k1,1 "$1"; }
diff <(bypod "$TMP/want") <(bypod "$TMP/out") >"$TMP/diff" || fail "logs of every pod: $(cat "$TMP/diff")"
[ "$(asked | grep -c '/log?container=pytorch')" = 3 ] || fail "logs asked: $(asked)"
cp "$TMP/out" "$TMP/logs-all"
"$K" k8s logs llama -n training --follow >"$TMP/out" 2>"$TMP/err" && # the pods' streams at once
  [ "$(bypod "$TMP/logs-all")" = "$(bypod "$TMP/out")" ] || fail "logs --follow of every pod: $(cat "$TMP/err" "$TMP/out")"
asked | grep -q 'log?container=pytorch&follow=true' || fail "logs --follow asked: $(asked)"
asked_reset
"$K" k8s logs llama -n training --node 1 --tail 1 >"$TMP/out" 2>"$TMP/err" || fail "logs of one pod: $(cat "$TMP/err")"
[ "$(cat "$TMP/out")" = "keel agent: rank 2 restarted" ] || fail "logs --node 1 --tail 1: $(cat "$TMP/out")"
asked | grep -qx 'GET /api/v1/namespaces/training/pods/llama-worker-1/log?container=pytorch&tailLines=1' ||
  fail "logs --node 1 asked: $(asked)"
"$K" k8s logs llama -n training --node master >"$TMP/out" && [ "$(wc -l <"$TMP/out")" = 3 ] &&
  "$K" k8s logs llama -n training --pod llama-worker-0 --follow >"$TMP/out2" &&
  [ "$(cat "$TMP/out2")" = "keel agent: round 0: 3 nodes" ] || fail "logs --node master / --pod: $(cat "$TMP/out" "$TMP/out2")"
"$K" k8s logs mpi -n training --kind MPIJob >"$TMP/out" 2>"$TMP/err" || fail "logs of an MPIJob: $(cat "$TMP/err")"
printf '[pod/mpi-launcher-q8z4k/launcher] keel: train: 3 ranks\n[pod/mpi-launcher-q8z4k/launcher] step 1 loss 10.37\n' >"$TMP/want"
diff "$TMP/want" "$TMP/out" >"$TMP/diff" || fail "logs of an MPIJob's launcher: $(cat "$TMP/diff")"
pass "logs: every pod prefixed (-c pytorch --prefix -l job-name), one pod (--node I|master, --pod, --tail), an MPIJob's launcher"
expect_input_error "logs of a missing pod" 'keel k8s logs: no pod llama-worker-7 in namespace training \(kubectl: .*not found' \
  "$K" k8s logs llama -n training --node 7
expect_input_error "logs of a job without pods" 'keel k8s logs: no pods of PyTorchJob llama2 in namespace training' \
  "$K" k8s logs llama2 -n training
expect_input_error "logs of another job's pod" "logs: --pod 'mpi-worker-0' is not a pod of llama" \
  "$K" k8s logs llama -n training --pod mpi-worker-0

# ---- delete: the job and what keel rendered for it, nothing else ----
asked_reset
"$K" k8s delete llama -n training >"$TMP/out" 2>"$TMP/err" || fail "delete: $(cat "$TMP/err")"
printf '%s\n' 'pytorchjob.kubeflow.org "llama" deleted' 'deployment.apps "llama-etcd" deleted' 'service "llama-etcd" deleted' >"$TMP/want"
diff "$TMP/want" "$TMP/out" >"$TMP/diff" || fail "delete says: $(cat "$TMP/diff")"
asked | grep '^DELETE' >"$TMP/deleted" || true
printf '%s\n' 'DELETE /apis/kubeflow.org/v1/namespaces/training/pytorchjobs/llama' \
  'DELETE /apis/apps/v1/namespaces/training/deployments/llama-etcd' 'DELETE /api/v1/namespaces/training/services/llama-etcd' >"$TMP/want"
diff "$TMP/want" "$TMP/deleted" >"$TMP/diff" || fail "delete removed: $(cat "$TMP/diff")"
asked | grep -qx 'GET /apis/apps/v1/namespaces/training/deployments?fieldSelector=metadata.name=llama-etcd&labelSelector=app.kubernetes.io/managed-by=keel,app.kubernetes.io/instance=llama,app.kubernetes.io/name=etcd' ||
  fail "delete listed the etcd Deployment without keel's labels and its name: $(asked)"
kubectl get deployments.apps llama2-etcd -n training -o name >/dev/null 2>&1 &&
  kubectl get deployments.apps llama-etcd -n default -o name >/dev/null 2>&1 ||
  fail "delete removed another job's etcd, or one in another namespace"
pass "delete: the PyTorchJob and its keel-labelled etcd Deployment and Service, three DELETEs and nothing else"

asked_reset
"$K" k8s delete other -n training >"$TMP/out" 2>"$TMP/err" || fail "delete beside a foreign etcd: $(cat "$TMP/err")"
printf '%s\n' 'pytorchjob.kubeflow.org "other" deleted' 'service "other-etcd" deleted' >"$TMP/want"
diff "$TMP/want" "$TMP/out" >"$TMP/diff" || fail "delete beside a foreign etcd says: $(cat "$TMP/diff")"
! asked | grep -q '^DELETE .*deployments' || fail "delete removed a Deployment keel did not label: $(asked)"
kubectl get deployments.apps other-etcd -n training -o name >/dev/null 2>&1 || fail "other-etcd (not keel's) is gone"
pass "delete leaves a same-named etcd Deployment without keel's label alone"
asked_reset
expect_input_error "delete of a missing job" 'keel k8s delete: no PyTorchJob other in namespace training, nor an etcd of keel.s for it; nothing deleted' \
  "$K" k8s delete other -n training
! asked | grep -q '^DELETE .*deployments\|^DELETE .*services' || fail "a second delete removed more: $(asked)"
asked_reset
"$K" k8s delete mpi -n training --kind MPIJob >"$TMP/out" 2>"$TMP/err" || fail "delete an MPIJob: $(cat "$TMP/err")"
[ "$(asked | grep -c '^DELETE')" = 1 ] && asked | grep -qx 'DELETE /apis/kubeflow.org/v2beta1/namespaces/training/mpijobs/mpi' ||
  fail "delete of an MPIJob removed: $(asked | grep '^DELETE')"
asked_reset
"$K" k8s delete llama2 -n training --keep-etcd >"$TMP/out" 2>"$TMP/err" || fail "delete --keep-etcd: $(cat "$TMP/err")"
[ "$(asked | grep -c '^DELETE')" = 1 ] && grep -qx 'kept llama2-etcd (--keep-etcd)' "$TMP/out" || fail "--keep-etcd: $(cat "$TMP/out")"
pass "delete: an MPIJob alone; --keep-etcd keeps the etcd; a job not there is exit 2 and deletes nothing"

# ---- refused before kubectl runs ----
asked_reset
expect_input_error "a name that is not a DNS-1035 label" "'Llama_1' is not a job's name: a DNS-1035 label" "$K" k8s status Llama_1
expect_input_error "a name that is an option" "'--kubeconfig=/x' is not a job's name" "$K" k8s delete -- --kubeconfig=/x
expect_input_error "a namespace that is not a DNS-1123 label" "delete: --namespace 'a;b' is not a namespace's name" \
  "$K" k8s delete llama2 --namespace 'a;b'
expect_input_error "a pod name that is not one" "logs: --pod 'llama-\\\$\(id\)' is not a pod of llama" \
  "$K" k8s logs llama --pod 'llama-$(id)'
expect_input_error "a kind keel does not render" "status: --kind 'TFJob': want PyTorchJob or MPIJob" "$K" k8s status llama --kind TFJob
expect_input_error "--pod with --node" "logs: --pod and --node both name a pod" "$K" k8s logs llama --pod llama-x --node 1
expect_input_error "--keep-etcd with an MPIJob" "delete: --keep-etcd: an MPIJob has no etcd" \
  "$K" k8s delete mpi --kind MPIJob --keep-etcd
expect_input_error "no name" "want the job's name" "$K" k8s status
asked_nothing "bad input"
pass "bad input: exit 2 in one line, and the stand-in saw no request"

# ---- kubectl missing, or failing ----
expect_input_error "kubectl missing" \
  'cannot run /nonexistent/kubectl: No such file or directory; install kubectl \(Debian: apt-get install kubernetes-client\)' \
  env KEEL_KUBECTL=/nonexistent/kubectl "$K" k8s status llama2 -n training
expect_input_error "kubectl not on PATH" 'cannot run kubectl: No such file or directory' \
  env PATH=/nonexistent "$K" k8s logs llama2 -n training
asked_nothing "kubectl missing"
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kubeconfig "$TMP/kubeconfig-closed" "$closed"
rc=0
KUBECONFIG=$TMP/kubeconfig-closed "$K" k8s status llama2 -n training >"$TMP/out" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && [ "$(wc -l <"$TMP/err")" = 1 ] &&
  grep -q "keel k8s status: kubectl failed (exit 1): The connection to the server 127.0.0.1:$closed was refused" "$TMP/err" ||
  fail "no cluster: exit $rc: $(cat "$TMP/err")"
pass "no cluster: exit 1, kubectl's own line (not its client-go log lines): $(cat "$TMP/err")"

# ---- keel k8s manifest JOB.env: the AWS guide's variables ----
cat >"$TMP/job.env" <<'EOF'
# the AWS EKS FSDP guide's env_vars, for keel
export IMAGE_URI=registry.example.com/keel:0.1
export NUM_NODES=4   # p5.48xlarge
export GPU_PER_NODE=8
export EFA_PER_NODE=32
export FI_PROVIDER=efa
JOB_NAME=llama-fsdp
NAMESPACE='training'
CHECKPOINT_CLAIM="fsx-claim"
CHECKPOINT_DIR=/fsx
KEEL_CONFIG=/fsx/configs/llama-7b.json
SHM_SIZE_GIB=64
RUN_ID=llama-fsdp-1
EOF
cat >"$TMP/job.json" <<'EOF'
{"name": "llama-fsdp", "namespace": "training", "image": "registry.example.com/keel:0.1", "nodes": 4,
 "nprocPerNode": 8, "gpusPerNode": 8, "efaPerNode": 32, "checkpointClaim": "fsx-claim",
 "checkpointMountPath": "/fsx", "config": "/fsx/configs/llama-7b.json", "shmSizeGiB": 64, "runId": "llama-fsdp-1"}
EOF
"$K" k8s manifest "$TMP/job.env" >"$TMP/env.yaml" 2>"$TMP/err" || fail "manifest JOB.env: $(cat "$TMP/err")"
"$K" k8s manifest "$TMP/job.json" >"$TMP/json.yaml" || fail "manifest JOB.json"
cmp -s "$TMP/env.yaml" "$TMP/json.yaml" || fail "the .env and JSON specs render differently: $(diff "$TMP/json.yaml" "$TMP/env.yaml" | head)"
grep -q '^kind: "PyTorchJob"$' "$TMP/env.yaml" || fail "no PyTorchJob from JOB.env"
"$K" k8s manifest "$TMP/job.env" --out "$TMP/env-out" 2>/dev/null && [ -f "$TMP/env-out/pytorchjob.yaml" ] || fail "JOB.env --out"
pass "manifest JOB.env: the same YAML as the JSON spec of the same values"
envbad() { # NAME PATTERN LINE...: a .env of the lines refused in one line naming the file
  local name=$1 pattern=$2
  shift 2
  printf '%s\n' JOB_NAME=j IMAGE_URI=k CHECKPOINT_CLAIM=c "$@" >"$TMP/bad.env"
  expect_input_error "$name" "bad.env:$pattern" "$K" k8s manifest "$TMP/bad.env" --out "$TMP/bad-out"
  [ ! -e "$TMP/bad-out" ] || fail "$name: --out was made"
}
envbad 'a command substitution' "4: NUM_NODES: '\\\$' in the value: keel reads no shell expansion" "NUM_NODES=\$(touch $TMP/pwned)"
envbad 'one in quotes' "4: NAMESPACE: '\\\$' in the value" "NAMESPACE=\"\$(touch $TMP/pwned)\""
envbad 'backticks' "4: NAMESPACE: '\`' in the value" "NAMESPACE=\`touch $TMP/pwned\`"
[ ! -e "$TMP/pwned" ] || fail "a .env line ran a command"
envbad 'an unknown variable' "4: NUM_NODE: not a variable keel reads" NUM_NODE=2
envbad 'the guide.s instance type' '4: INSTANCE_TYPE: keel renders no nodeSelector' INSTANCE_TYPE=p5.48xlarge
envbad 'a bad value' "4: NUM_NODES: 'two' is not a whole number" NUM_NODES=two
envbad 'out of range' '4: NUM_NODES \(nodes\): 0 is not a whole number 1..1000' NUM_NODES=0
envbad 'blanks around =' "4: NUM_NODES: want '=' right after the name" 'NUM_NODES = 2'
envbad 'an open quote' "4: NAMESPACE: the value's ' is not closed" "NAMESPACE='x"
envbad 'twice' '5: NUM_NODES: set again \(first on line 4\)' NUM_NODES=1 NUM_NODES=2
printf 'JOB_NAME=j\nIMAGE_URI=k\nNUM_NODES=1\n' >"$TMP/bad.env"
expect_input_error "a missing variable" 'bad.env: CHECKPOINT_CLAIM \(checkpointClaim\): missing' "$K" k8s manifest "$TMP/bad.env"
[ ! -e "$TMP/pwned" ] || fail "a .env line ran a command"
pass "manifest JOB.env: every bad line refused naming the file, the line and the variable; no \$(...) run"

"$K" k8s --help >"$TMP/help" && grep -q "keel k8s status NAME" "$TMP/help" && grep -q "keel k8s logs NAME" "$TMP/help" &&
  grep -q "keel k8s delete NAME" "$TMP/help" || fail "keel k8s --help lacks status/logs/delete"
pass "keel k8s --help shows status, logs, delete"
