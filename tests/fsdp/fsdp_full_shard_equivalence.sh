#!/usr/bin/env bash
# FULL_SHARD on 1-4 ranks (oversubscribed on 2 cores), tied and untied heads:
# 10 steps follow the unsharded run (loss rel <= 1e-5 every step, parameters
# |dp|/|p| <= 1e-5), and each rank's persistent state is exactly 16 bytes per
# padded parameter / W. Odd shapes make every unit need padding.
source "$KEEL_SRC/tests/lib.sh"
prog=$KEEL_BUILD/tests/mpi_fsdp_equivalence
[ -x "$prog" ] || fail "$prog not built"
mpi_env
for W in 1 2 3 4; do
  for tied in 0 1; do
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$W" "$prog" 10 "$tied" >"$TMP/out" 2>&1 \
      || { cat "$TMP/out"; fail "W=$W tied=$tied"; }
    pass "$(grep "^W=$W tied" "$TMP/out")"
  done
done
