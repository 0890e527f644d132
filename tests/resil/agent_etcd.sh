#!/usr/bin/env bash
# keel agent: one agent per node meets the others in a real etcd (started
# here, on free ports) and starts its node's ranks, which talk over Gloo and
# find each other through the same etcd. On this machine, each agent a node:
#   1. two nodes x one rank end with mpirun's params_xxh3 for 2 ranks;
#   2. a rank killed mid-run: the agents form the next round, the ranks resume
#      from memory, and the run ends bit-identical to the undisturbed one; a
#      rank frozen (SIGSTOP) is a hang node 0's agent names, with the same end;
#   3. a node killed whole (agent and ranks) with --nnodes 1:2: the job goes on
#      on the node left, resharded from memory, and ends as the undisturbed run;
#   4. a node that comes late (1:2, one node running) is admitted at the next
#      round, which the running node starts for it;
#   5. etcd killed mid-run: training goes on; a rank killed meanwhile makes the
#      agents wait for etcd, and once it is back they form the next round;
#   6. a finished run id is refused, --reset clears its keys (and no other's);
#   7. bad input: one line, exit 2 (min > max, a flag contradicting its PET_
#      variable, a rendezvous backend that is not etcd, no endpoint, an etcd
#      that does not answer).
source "$KEEL_SRC/tests/lib.sh"
command -v etcd >/dev/null || fail "etcd not found: run scripts/install-deps.sh"
cleanup() { kill_leftovers; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$TMP"; }
trap cleanup EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
CFG=$KEEL_SRC/tests/train/micro.json
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CLIENT=$(free_port) PEER=$(free_port)
EP=127.0.0.1:$CLIENT
start_etcd() {
  etcd --name keel-test --data-dir "$TMP/etcd" --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
    --listen-peer-urls "http://127.0.0.1:$PEER" --initial-advertise-peer-urls "http://127.0.0.1:$PEER" \
    --initial-cluster "keel-test=http://127.0.0.1:$PEER" >>"$TMP/etcd.log" 2>&1 &
  ETCD=$!
  for _ in $(seq 1 100); do ETCDCTL_API=3 etcdctl --endpoints "$EP" endpoint health >/dev/null 2>&1 && return; sleep 0.1; done
  fail "etcd did not start: $(tail -3 "$TMP/etcd.log")"
}
start_etcd
keys() { ETCDCTL_API=3 etcdctl --endpoints "$EP" get --prefix "$1" --keys-only | grep -c . || true; }

# agent NAME ID RUN ARGS...: an agent in the background, its pid in AGENT_<NAME>
agent() {
  local name=$1 id=$2 run=$3
  shift 3
  "$KEEL_BIN" agent "$CFG" --run-dir "$run" --rdzv-endpoint "$EP" --rdzv-id "$id" --node "$name" \
    --host 127.0.0.1 --nproc-per-node 1 --last-call 1 "$@" >"$TMP/$id-$name.out" 2>&1 &
  eval "AGENT_$name=$!"
}
# finish ID NAME...: every agent exits 0; finish_with CODE ID NAME...: with CODE
finish_with() {
  local want=$1 id=$2 name pid rc
  shift 2
  for name in "$@"; do
    pid=$(eval echo "\$AGENT_$name")
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = "$want" ] || fail "$id: agent $name exited $rc, want $want: $(grep -v '^step' "$TMP/$id-$name.out" | tail -5)"
  done
}
finish() { finish_with 0 "$@"; }
xxh() { json "$1/summary.json" "j['params_xxh3']"; }
steps=(--set train.steps=80 --set checkpoint.every_steps=20)

# 1. two nodes = mpirun's two ranks
mpi_env
"$KEEL_BIN" train "$CFG" "${steps[@]}" --nproc 2 --run-dir "$TMP/ref" >"$TMP/ref.out" 2>&1 || fail "mpirun reference: $(tail -3 "$TMP/ref.out")"
want=$(xxh "$TMP/ref")
agent a plain "$TMP/plain" --nnodes 2 "${steps[@]}"
agent b plain "$TMP/plain" --nnodes 2 "${steps[@]}"
finish plain a b
[ "$(xxh "$TMP/plain")" = "$want" ] || fail "two agents: params_xxh3 $(xxh "$TMP/plain"), mpirun's $want"
grep -q '"event":"rendezvous".*round 0: 2 node(s) x 1 rank(s) = world 2' "$TMP/plain/events.jsonl" ||
  fail "no rendezvous event: $(cat "$TMP/plain/events.jsonl")"
pass "2 agents x 1 rank over etcd + Gloo: mpirun's params_xxh3 $want"

# 2. a rank killed: the next round resumes from memory, bit-identical
agent a rank "$TMP/rank" --nnodes 2 "${steps[@]}"
agent b rank "$TMP/rank" --nnodes 2 "${steps[@]}"
pid=$(wait_train_step "$TMP/rank" 1 40)
kill -9 "$pid"
finish rank a b
[ "$(xxh "$TMP/rank")" = "$want" ] || fail "a rank killed: params_xxh3 $(xxh "$TMP/rank"), undisturbed $want"
grep -q '"event":"failure","cause":"crash","rank":1' "$TMP/rank/events.jsonl" || fail "the crash is not named"
grep -q '"event":"resumed".*from memory' "$TMP/rank/events.jsonl" || fail "not resumed from memory"
grep -q '"event":"rendezvous".*round 1: 2 node' "$TMP/rank/events.jsonl" || fail "no round 1"
"$KEEL_BIN" status "$TMP/rank" | grep -q "^restarts 1 " || fail "keel status: $("$KEEL_BIN" status "$TMP/rank" | head -3)"
pass "rank 1 killed in step 40+: round 1 on both nodes, resumed from memory, params_xxh3 as undisturbed"

# 2b. a rank frozen (SIGSTOP): node 0's agent holds every rank to the hang
# rules, names it, and the next round resumes bit-identical
agent a hang "$TMP/hang" --nnodes 2 "${steps[@]}" --set resilience.hang_timeout_s=3
agent b hang "$TMP/hang" --nnodes 2 "${steps[@]}" --set resilience.hang_timeout_s=3
pid=$(wait_train_step "$TMP/hang" 1 40)
kill -STOP "$pid"
finish hang a b
[ "$(xxh "$TMP/hang")" = "$want" ] || fail "a rank frozen: params_xxh3 $(xxh "$TMP/hang"), undisturbed $want"
grep -q '"event":"failure","cause":"hang","rank":1' "$TMP/hang/events.jsonl" ||
  fail "the hang is not named: $(grep failure "$TMP/hang/events.jsonl")"
pass "rank 1 frozen: $(grep -o '"cause":"hang".*' "$TMP/hang/events.jsonl" | head -1 | cut -c1-150)"

# 3. a node killed whole, --nnodes 1:2: the job goes on on one node, resharded
agent a node "$TMP/node" --nnodes 1:2 "${steps[@]}"
agent b node "$TMP/node" --nnodes 1:2 "${steps[@]}"
wait_train_step "$TMP/node" 1 40 >/dev/null
victim=$(pgrep -P "$AGENT_b")
kill -9 "$AGENT_b" $victim
finish node a
grep -q '"event":"rendezvous".*round 1: 1 node(s) x 1 rank(s) = world 1: a' "$TMP/node/events.jsonl" ||
  fail "no round on the node left: $(grep rendezvous "$TMP/node/events.jsonl")"
grep -q '"event":"resumed".*resharded from 2 rank' "$TMP/node/events.jsonl" ||
  fail "not resharded: $(grep resumed "$TMP/node/events.jsonl")"
final_loss_near "$TMP/ref" "$TMP/node" 80 "on 1 node"
pass "node b killed (agent and rank): round 1 on node a alone, resharded from 2 ranks' snapshots"

# 4. a node that comes late is admitted at the next round (the global batch
# stays: 1 rank accumulates 2 micro-batches of 4, then 2 ranks take one each)
late=(--nnodes 1:2 --set train.steps=200 --set checkpoint.every_steps=20 --set train.micro_batch_size=4
      --set train.grad_accum_steps=2)
agent a late "$TMP/late" "${late[@]}"
wait_train_step "$TMP/late" 0 30 >/dev/null
agent b late "$TMP/late" "${late[@]}"
finish late a b
grep -q '"event":"node_joined".*node b is waiting to join' "$TMP/late/events.jsonl" || fail "no node_joined event"
grep -q '"event":"rendezvous".*round 1: 2 node(s) x 1 rank(s) = world 2' "$TMP/late/events.jsonl" ||
  fail "b was not admitted: $(grep rendezvous "$TMP/late/events.jsonl")"
pass "node b came while a trained alone: admitted at round 1 (world 2), the run completed"

# 5. etcd killed mid-run: training goes on; a rank killed while etcd is down
# makes the agents wait for it, and once it is back (same data) they form the
# next round and the run ends bit-identical to the undisturbed one
agent a etcd "$TMP/etcd-run" --nnodes 2 "${steps[@]}"
agent b etcd "$TMP/etcd-run" --nnodes 2 "${steps[@]}"
wait_train_step "$TMP/etcd-run" 0 30 >/dev/null
kill -9 "$ETCD"
wait "$ETCD" 2>/dev/null || true
before=$(hb step "$TMP/etcd-run" 0)
sleep 1.5
after=$(hb step "$TMP/etcd-run" 0)
[ "$after" -gt "$before" ] || fail "training stood still while etcd was down (step $before -> $after)"
kill -9 "$(hb pid "$TMP/etcd-run" 1)"
sleep 3
start_etcd
finish etcd a b
grep -q '"event":"rendezvous".*round 1: 2 node' "$TMP/etcd-run/events.jsonl" ||
  fail "no round after etcd came back: $(grep -v checkpoint "$TMP/etcd-run/events.jsonl")"
[ "$(xxh "$TMP/etcd-run")" = "$want" ] || fail "etcd restarted: params_xxh3 $(xxh "$TMP/etcd-run"), undisturbed $want"
pass "etcd killed mid-run: training went on (step $before -> $after); a rank killed meanwhile, etcd back 3 s" \
  "later: round 1 formed, params_xxh3 as undisturbed"

# 5b. the supervisor's policy across rounds (node 0 decides on what the failed round's agents recorded)
# - an absurd learning rate diverges: round 1 rolls back, round 2 skips the step's data window, the
#   third divergence stops the job; every agent exits 1 with the reason, and the run id is refused after
ev() { grep -c "\"event\":\"$2\"" "$TMP/$1/events.jsonl" || true; }
div=(--nnodes 2 --set train.steps=50 --set checkpoint.every_steps=5 --set train.lr=10 --set train.min_lr=10
     --set train.warmup_steps=0 --set train.grad_clip=0 --set resilience.backoff_s=0.1)
agent a div "$TMP/div" "${div[@]}"
agent b div "$TMP/div" "${div[@]}"
finish_with 1 div a b
[ "$(ev div rollback)" = 1 ] && [ "$(ev div skip_data)" = 1 ] && [ "$(ev div stop)" = 1 ] ||
  fail "divergence: rollback $(ev div rollback), skip_data $(ev div skip_data), stop $(ev div stop): $(grep -v checkpoint "$TMP/div/events.jsonl" | tail -8)"
grep -q "keel: error: the loss diverged again in step [0-9]* after step [0-9]*'s data window was skipped" "$TMP"/div-?.out ||
  fail "node 0 did not say why: $(tail -3 "$TMP"/div-?.out)"
grep -q "keel: error: node 0 ([ab]) stopped the job: the loss diverged again" "$TMP"/div-?.out ||
  fail "node 1 did not say why: $(tail -3 "$TMP"/div-?.out)"
[ "$(json "$TMP/div/supervisor.json" 'len(j["skip_data_steps"])')" = 1 ] ||
  fail "no skipped window in supervisor.json: $(cat "$TMP/div/supervisor.json")"
expect_input_error "a stopped run id" "^keel: error: run id div was stopped \\(the loss diverged again" \
  "$KEEL_BIN" agent "$CFG" --run-dir "$TMP/div" --rdzv-endpoint "$EP" --rdzv-id div --nnodes 2
pass "divergence under the agents: rollback, skip of the window, stop (exit 1 on both nodes, the run id refused after)"
# - a rank killed in the same step at every try: resilience.crash_loop (3) failures in a row without
#   progress stop the job, with the policy's backoff between the tries
KEEL_FAULT=kill@6:1 agent a loop "$TMP/loop" --nnodes 2 "${steps[@]}" --set resilience.backoff_s=0.2
KEEL_FAULT=kill@6:1 agent b loop "$TMP/loop" --nnodes 2 "${steps[@]}" --set resilience.backoff_s=0.2
finish_with 1 loop a b
grep -q "keel: error: crash loop: 3 failures in a row in step 6 or before" "$TMP"/loop-?.out ||
  fail "no crash loop: $(grep -v '^step' "$TMP"/loop-?.out | tail -3)"
grep -q '"event":"rendezvous".*round 2: 2 node' "$TMP/loop/events.jsonl" && ! grep -q '"event":"rendezvous".*round 3' "$TMP/loop/events.jsonl" ||
  fail "want rounds 0-2 and a stop before round 3: $(grep rendezvous "$TMP/loop/events.jsonl")"
pass "rank 1 killed in step 6 at every try: $(grep -ho 'crash loop: [^;]*' "$TMP"/loop-?.out | head -1)"
# - after a failure each agent runs its node's health checks: a node that fails one leaves the job,
#   and with --nnodes 1:2 the other goes on alone
KEEL_FAULT=kill@6:1 agent a sick "$TMP/sick" --nnodes 1:2 "${steps[@]}"
KEEL_FAULT=kill@6:1 agent b sick "$TMP/sick" --nnodes 1:2 "${steps[@]}" --set resilience.gemm_floor_gflops=1e9
finish sick a
finish_with 1 sick b
grep -q "keel: error: agent: this node (b) failed the gemm health check after a failure: it leaves the job" "$TMP/sick-b.out" ||
  fail "node b did not leave: $(grep -v '^step' "$TMP/sick-b.out" | tail -3)"
grep -q '"event":"node_excluded","cause":"health","node":"b"' "$TMP/sick/events.jsonl" &&
  grep -q '"event":"rendezvous".*round 1: 1 node(s) x 1 rank(s) = world 1: a' "$TMP/sick/events.jsonl" ||
  fail "no node_excluded event, or no round on a alone: $(grep -v checkpoint "$TMP/sick/events.jsonl" | tail -6)"
pass "node b failed its gemm check after rank 1 was killed: it left, a finished alone"

# - node 0 compares the ranks' compute times: rank 1 throttled to a quarter of its speed (stopped
#   60 ms of every 80) is named in a straggler event, and the run goes on to the end
slow=(--nnodes 2 --set train.steps=14 --set model.dim=256 --set model.max_seq_len=128 --set train.threads=1
      --set resilience.straggler_steps=3)
agent a slow "$TMP/slow" "${slow[@]}"
agent b slow "$TMP/slow" "${slow[@]}"
wait_train_step "$TMP/slow" 0 2 >/dev/null
p1=$(wait_train_step "$TMP/slow" 1 2)
bash -c 'while kill -STOP "$1" 2>/dev/null; do sleep 0.06; kill -CONT "$1" 2>/dev/null; sleep 0.02; done' \
  throttle "$p1" </dev/null >/dev/null 2>&1 &
throttle=$!
finish slow a b
kill "$throttle" 2>/dev/null || true
wait "$throttle" 2>/dev/null || true
grep -q '"event":"straggler".*"cause":"straggler","rank":1' "$TMP/slow/events.jsonl" ||
  fail "no straggler event for rank 1: $(grep -v checkpoint "$TMP/slow/events.jsonl" | tail -5)"
pass "rank 1 throttled: $(grep -o '"detail":"rank 1 on [^"]*' "$TMP/slow/events.jsonl" | head -1 | cut -c11-130)"

# every agent that ended took its node's snapshots with it (another test's segment_of lists /dev/shm)
for run in plain rank hang node late etcd-run div loop sick slow; do
  [ -z "$(segments "$TMP/$run")" ] || fail "$run: snapshot segments left in /dev/shm: $(segments "$TMP/$run")"
done
pass "no run left a snapshot segment in /dev/shm"

# 6. a finished run id is refused; --reset clears it and nothing else
expect_input_error "a finished run id" "^keel: error: run id plain already finished" \
  "$KEEL_BIN" agent "$CFG" --run-dir "$TMP/again" --rdzv-endpoint "$EP" --rdzv-id plain --nnodes 1
other=$(keys /keel/rank/)
"$KEEL_BIN" agent --reset --rdzv-endpoint "$EP" --rdzv-id plain >"$TMP/reset.out" || fail "--reset"
[ "$(keys /keel/plain/)" = 0 ] && [ "$(keys /keel/rank/)" = "$other" ] && [ "$other" -gt 0 ] ||
  fail "--reset: $(cat "$TMP/reset.out"); plain has $(keys /keel/plain/) keys, rank $(keys /keel/rank/) (was $other)"
pass "$(cat "$TMP/reset.out"); run id rank keeps its $other"

# 7. bad input
A=("$KEEL_BIN" agent "$CFG" --run-dir "$TMP/bad")
expect_input_error "min above max" '^keel: error: --nnodes "3:2": give N nodes or MIN:MAX' \
  "${A[@]}" --rdzv-endpoint "$EP" --nnodes 3:2
expect_input_error "a flag against its variable" '^keel: error: --nnodes 2 contradicts PET_NNODES=3' \
  env PET_NNODES=3 "${A[@]}" --rdzv-endpoint "$EP" --nnodes 2
expect_input_error "a c10d rendezvous" '^keel: error: PET_RDZV_BACKEND=c10d: keel agent meets in etcd' \
  env PET_RDZV_BACKEND=c10d PET_NNODES=1 "${A[@]}" --rdzv-endpoint "$EP"
expect_input_error "no endpoint" '^keel: error: keel agent: no etcd to meet in' "${A[@]}" --nnodes 1
expect_input_error "WORLD_SIZE against the shape" '^keel: error: WORLD_SIZE=8 contradicts 2 node\(s\) x 1' \
  env WORLD_SIZE=8 "${A[@]}" --rdzv-endpoint "$EP" --nnodes 2
expect_input_error "an etcd that does not answer" '^keel: error: etcd at 127.0.0.1:1 does not answer .* after 2 s of retries' \
  "${A[@]}" --rdzv-endpoint 127.0.0.1:1 --nnodes 1 --rdzv-timeout 2
expect_input_error "an endpoint that is no host:port" '^keel: error: etcd endpoint "https://x:1" is not host:port' \
  "${A[@]}" --rdzv-endpoint https://x:1 --nnodes 1
[ ! -e "$TMP/bad" ] || fail "a refused agent created its run directory"
