#!/usr/bin/env bash
# keel health's gpu check against its limits, through the NVML stand-in
# (KEEL_NVML_STAND_IN_STATE sets its readings) and a kernel log of our own
# (KEEL_KERNEL_LOG, lines as dmesg and klogctl print them): the first check writes the XID baseline and passes with
# old XIDs in the log; a new XID fails naming the GPU and the XID, an
# application XID does not, nor do old lines rotated out of the log; a new
# boot counts the whole log; a damaged baseline fails and is left as it is;
# each reading over its limit fails on its own, naming GPU, value and key, and
# passes once the node config relaxes that limit; bad limits exit 2 with one line.
source "$KEEL_SRC/tests/lib.sh"
: "${KEEL_NVML_STAND_IN:?KEEL_NVML_STAND_IN must name the NVML stand-in (set by CMake)}"
export KEEL_NVML_LIB=$KEEL_NVML_STAND_IN KEEL_KERNEL_LOG=$TMP/kern.log KEEL_NVML_STAND_IN_STATE=$TMP/state
B=$TMP/baseline/gpu.json
printf 'xid_events=\n' >"$TMP/state" # the stand-in's XID 79 event off: the kernel log is under test
cat >"$KEEL_KERNEL_LOG" <<'EOF'
[    5.120000] nvidia-nvswitch: loading
<4>[  100.500000] NVRM: Xid (PCI:0000:19:00): 48, pid=123, name=python, An uncorrectable double bit error
[  200.250000] NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.
[  250.000000] NVRM: Xid (0000:1a:00): 94, pid=7, Contained ECC error
EOF

gpu() { "$KEEL_BIN" health --checks gpu --gpu-baseline "$B" "$@"; }
expect() { # name rc pattern cmd...: exit rc and the report shows pattern
  local name=$1 want=$2 pattern=$3; shift 3
  local rc=0
  "$@" >"$TMP/out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "$name: exit $rc, want $want: $(cat "$TMP/out")"
  grep -Eq -- "$pattern" "$TMP/out" || fail "$name: report lacks /$pattern/: $(cat "$TMP/out")"
  pass "$name: $(grep -Eo -- "$pattern" "$TMP/out" | head -1)"
}
node_config() { echo "{\"gpu\": {\"baseline\": \"$B\", $1}}" >"$TMP/node.json"; }
state() { printf 'xid_events=\n%s\n' "$1" >"$TMP/state"; }

# ---- XIDs against the baseline
expect "first check: baseline written, 3 old XIDs accepted" 0 \
  "gpu +pass +2 GPU\(s\) within limits: .*XID baseline written to $B: the 3 XID line\(s\) in KEEL_KERNEL_LOG=[^ ]+ so far accepted" gpu
python3 - "$B" <<'PY' || fail "baseline file: $(cat "$B")"
import json, sys
b = json.load(open(sys.argv[1]))
assert b["format"] == "keel-gpu-baseline" and b["version"] == 1 and b["boot_id"], b
by = {x["pci"]: x for x in b["buses"]}
assert by["0000:19:00"]["xids"] == 1 and by["0000:19:00"]["last_s"] == 100.5 and by["0000:1a:00"]["xids"] == 2 and by["0000:1a:00"]["last_s"] == 250, by
assert by["0000:1a:00"]["uuid"].startswith("GPU-00000001") and by["0000:1a:00"]["gpu"] == 1, by
PY
expect "second check: the same log passes" 0 "gpu +pass .*kernel log: 3 XID line\(s\), 3 before the baseline" gpu
echo '[  300.000000] NVRM: Xid (PCI:0000:1a:00): 13, pid=9, name=python, Graphics SM Warp Exception' >>"$KEEL_KERNEL_LOG"
expect "an application XID (13) after the baseline is not the GPU's fault" 0 "gpu +pass .*no new XID" gpu
echo '[  310.000000] NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.' >>"$KEEL_KERNEL_LOG"
expect "a new XID fails, naming GPU and XID" 1 \
  "gpu +FAIL +2 GPU\(s\), 1 problem\(s\): gpu1: 1 XID\(s\) in the kernel log since the baseline \(79\), above gpu.xid_max 0" gpu
expect "--json: the same verdict" 1 '"detail":[[:space:]]+"2 GPU\(s\), 1 problem\(s\): gpu1: 1 XID' gpu --json
node_config '"xid_max": 1'
expect "gpu.xid_max 1 allows it" 0 "gpu +pass " "$KEEL_BIN" health --checks gpu --node-config "$TMP/node.json"
cp "$B" "$TMP/good.json"
python3 - "$B" <<'PY'
import json, sys
b = json.load(open(sys.argv[1])); b["boot_id"] = "an-earlier-boot"; json.dump(b, open(sys.argv[1], "w"))
PY
expect "a new boot: every XID of its log is newer than the baseline" 1 \
  "gpu0: 1 XID\(s\) in the kernel log since the baseline \(48\).*; gpu1: 3 XID\(s\) in the kernel log since the baseline \(79, 94, 79\).*all since this boot" gpu
cp "$TMP/good.json" "$B"
sed -i '/ 100.500000\] \| 200.250000\] \| 250.000000\] /d' "$KEEL_KERNEL_LOG" # old lines rotated out of the ring buffer
expect "old lines rotated out do not hide the new one (times, not counts)" 1 \
  "gpu1: 1 XID\(s\) in the kernel log since the baseline \(79\)" gpu
echo '[  320.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.' >>"$KEEL_KERNEL_LOG"
expect "an XID on a bus NVML no longer lists" 1 \
  "PCI 0000:3b:00 \(no GPU NVML lists: fallen off the bus\?\): 1 XID\(s\) in the kernel log since the baseline \(79\)" gpu
echo 'not json {' >"$B"
expect "a damaged baseline fails, naming the fix" 1 "gpu +FAIL .*$B is not a keel GPU baseline \(.*\): remove it and the next check takes a new one" gpu
[ "$(cat "$B")" = 'not json {' ] || fail "the damaged baseline was overwritten: $(cat "$B")"
pass "the damaged baseline is left as it was"
touch "$TMP/file"
expect "a named baseline that cannot be written fails" 1 \
  "gpu +FAIL .*XID baseline $TMP/file/b.json cannot be written: .*Not a directory" \
  "$KEEL_BIN" health --checks gpu --gpu-baseline "$TMP/file/b.json"
[ ! -e "$TMP/file/b.json" ] || fail "a baseline appeared under a file"
cp "$TMP/good.json" "$B"
expect "the good baseline back: the new XIDs still fail" 1 "gpu1: 1 XID\(s\) in the kernel log since the baseline \(79\)" gpu

# ---- NVML's XID events during the check
printf '[    1.000000] nothing here\n' >"$KEEL_KERNEL_LOG"
rm "$B"
printf 'xid_events=0:48,0:13\n' >"$TMP/state"
expect "an XID event from NVML during the check fails (the application XID 13 left out)" 1 \
  "gpu0: 1 XID event\(s\) from NVML during the check \(48\), above gpu.xid_max 0" gpu
expect "the stand-in's default XID 79 event fails as well" 1 "gpu1: 1 XID event\(s\) from NVML during the check \(79\)" \
  env -u KEEL_NVML_STAND_IN_STATE "$KEEL_BIN" health --checks gpu --gpu-baseline "$B"

# ---- each reading over its limit, then the limit relaxed
breach() { # name state pattern relaxed-limits
  state "$2"
  expect "$1" 1 "gpu +FAIL +2 GPU\(s\), 1 problem\(s\): $3" gpu
  node_config "$4"
  expect "$1, with $4" 0 "gpu +pass " "$KEEL_BIN" health --checks gpu --node-config "$TMP/node.json"
}
breach "too hot" gpu0.temp=95 "gpu0: 95 C, above gpu.temp_max_c 87" '"temp_max_c": 95'
breach "uncorrected ECC" gpu1.ecc_uncorrected=2 \
  "gpu1: 2 uncorrected ECC error\(s\) since the driver loaded, above gpu.ecc_uncorrected_max 0" '"ecc_uncorrected_max": 2'
breach "row remap pending" gpu0.remap_pending=1 \
  "gpu0: a row remap is pending until the GPU is reset \(gpu.fail_on_row_remap_pending\)" '"fail_on_row_remap_pending": false'
breach "row remap failed" gpu0.remap_failure=1 "gpu0: row remapping failed \(gpu.fail_on_row_remap_failure\)" \
  '"fail_on_row_remap_failure": false'
breach "uncorrectable remapped rows" gpu0.remapped_uncorrectable=64 \
  "gpu0: 64 rows remapped for uncorrectable errors, above gpu.remapped_rows_uncorrectable_max 63" \
  '"remapped_rows_uncorrectable_max": 64'
breach "HW thermal slowdown" gpu0.clock_event_reasons=0x41 \
  "gpu0: clocks held down by hw_thermal_slowdown \(0x40, in gpu.clock_events_fail\)" '"clock_events_fail": ["hw_slowdown"]'
breach "HW slowdown and power brake" gpu1.clock_event_reasons=0x89 \
  "gpu1: clocks held down by hw_slowdown, hw_power_brake_slowdown \(0x88, in gpu.clock_events_fail\)" \
  '"clock_events_fail": []'
breach "busy GPU at a low SM clock" gpu0.sm_clock=900 \
  "gpu0: SM clock 900 of 1980 MHz \(0.45\) at 87% busy, below gpu.sm_clock_min_fraction 0.5" '"sm_clock_min_fraction": 0.4'
node_config '"sm_clock_busy_util_pct": 90'
expect "busy from 90%: 87% is not busy" 0 "gpu +pass " "$KEEL_BIN" health --checks gpu --node-config "$TMP/node.json"
state $'gpu1.sm_clock=300\ngpu0.clock_event_reasons=0x4'
expect "an idle GPU downclocked, a busy one at its power cap: healthy" 0 "gpu +pass .*gpu1 38 C, SM 300/1980 MHz, 12% busy" gpu
state $'gpu0.clock_event_reasons=unsupported\ngpu0.temp=unsupported'
expect "readings NVML does not report are not judged" 0 "gpu +pass .*gpu0 \? C" gpu
state $'gpu0.temp=95\ngpu0.ecc_uncorrected=1'
expect "two problems on one GPU: both named" 1 "2 problem\(s\): gpu0: 95 C, above gpu.temp_max_c 87; gpu0: 1 uncorrected ECC" gpu
state ""

# ---- the kernel's own log (klogctl, what dmesg reads)
expect "the kernel's ring buffer" 0 "gpu +pass .*(XID baseline written to $TMP/real.json: the [0-9]+ XID line\(s\) in the kernel log so far accepted|kernel-log XIDs not judged: the kernel log is not readable)" \
  env -u KEEL_KERNEL_LOG "$KEEL_BIN" health --checks gpu --gpu-baseline "$TMP/real.json"

# ---- bad limits: one line naming the file, key, value and fix; exit 2
bad() { # name limits pattern
  echo "{\"gpu\": {$2}}" >"$TMP/bad.json"
  expect_input_error "$1" "$TMP/bad.json: $3" "$KEEL_BIN" health --checks gpu --node-config "$TMP/bad.json"
}
bad "temperature not a number" '"temp_max_c": "hot"' 'gpu.temp_max_c: bad value "hot" \(the hottest a GPU may be, degrees C in 1..200, e.g. 87\)'
bad "negative XID limit" '"xid_max": -1' 'gpu.xid_max: bad value -1 \(.*an integer >= 0'
bad "fraction over 1" '"sm_clock_min_fraction": 1.5' 'gpu.sm_clock_min_fraction: bad value 1.5 \(.*in 0..1'
bad "unknown clock event reason" '"clock_events_fail": ["hw_slowdown", "bogus"]' \
  'gpu.clock_events_fail: bad value \["hw_slowdown","bogus"\] \(.*of: gpu_idle, .*hw_power_brake_slowdown'
bad "XID to ignore not a number" '"xid_ignore": [13, "x"]' 'gpu.xid_ignore: bad value \[13,"x"\]'
bad "flag not a boolean" '"fail_on_row_remap_pending": 1' 'gpu.fail_on_row_remap_pending: bad value 1 \(true or false\)'
bad "empty baseline path" '"baseline": ""' 'gpu.baseline: bad value "" \(the XID baseline'
bad "unknown key" '"temp_max": 80' "gpu: unknown key 'temp_max' \(the gpu check's limits are baseline, xid_max"
echo '{"gpu": 87}' >"$TMP/bad.json"
expect_input_error "gpu not an object" "bad.json: gpu: expected an object" "$KEEL_BIN" health --checks gpu --node-config "$TMP/bad.json"
expect_input_error "empty --gpu-baseline" "gpu-baseline '': expected the XID baseline file's path" "$KEEL_BIN" health --gpu-baseline ''
