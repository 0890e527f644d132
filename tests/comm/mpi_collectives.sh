#!/usr/bin/env bash
# comm's collectives under real OpenMPI on 1, 2, 3 and 4 ranks (oversubscribed
# on this machine), with the build's tests/mpi_collectives.
# The program checks exact results of every collective (also cut into pieces
# below MPI's int counts, KEEL_COMM_MAX_COUNT), uneven groups,
# in-order completion of many outstanding requests, progress during
# compute and node windows (slots every rank maps, read in place); it prints "ok: N ranks ..." on rank 0 when every rank passed.
# Under ASan, OpenMPI's own leaks at MPI_Finalize are suppressed with
# tests/lsan.supp (keel's leaks are still reported).
source "$KEEL_SRC/tests/lib.sh"
KEEL_MPI_LEAKS=1 mpi_env # the leak check of every rank (tests/lib.sh)
prog=$KEEL_BUILD/tests/mpi_collectives
[ -x "$prog" ] || fail "$prog not built"
for np in 1 2 3 4; do
  rc=0
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$np" "$prog" \
    </dev/null >"$TMP/out.$np" 2>"$TMP/err.$np" || rc=$?
  cat "$TMP/out.$np"
  if [ "$rc" != 0 ] || ! grep -q "^ok: $np ranks" "$TMP/out.$np"; then
    cat "$TMP/err.$np" >&2
    fail "mpi_collectives on $np ranks: exit $rc"
  fi
  pass "$np ranks"
done
# MPI counts are ints: collectives beyond KEEL_COMM_MAX_COUNT elements (INT_MAX
# by default) go in pieces, all-gathers through a datatype strided by the
# whole block; a small limit sends every test collective that way (results
# only: the progress timing is the runs above's).
rc=0
KEEL_COMM_MAX_COUNT=1000 timeout 300 mpirun --allow-run-as-root --oversubscribe -x KEEL_COMM_MAX_COUNT -np 3 "$prog" \
  </dev/null >"$TMP/out.pieces" 2>"$TMP/err.pieces" || rc=$?
cat "$TMP/out.pieces"
[ "$rc" = 0 ] && grep -q "^ok: 3 ranks" "$TMP/out.pieces" || { cat "$TMP/err.pieces" >&2; fail "collectives in pieces of 1000 elements: exit $rc"; }
pass "3 ranks, collectives in pieces of at most 1000 elements"

