#!/usr/bin/env bash
# No two source files call each other in a circle, inside a module or across
# modules: from the objects of this build (nm), file A depends on file B when
# A references a symbol B defines (a function, or data); the dependencies
# must form no loop. Catches what includes cannot show: a private header's
# functions defined in two files that call back into each other. The checker
# is first shown two objects that call each other, and must fail on them.
source "$KEEL_SRC/tests/lib.sh"
: "${KEEL_BUILD:?KEEL_BUILD must point at the build directory}"
command -v nm >/dev/null || fail "nm not found (binutils)"

cat >"$TMP/circles.py" <<'PY'
import collections, os, subprocess, sys
sys.path.insert(0, os.path.join(os.environ["KEEL_SRC"], "tests", "core"))
from loops import loops
# argv: NAME=OBJECT ...; prints each loop with the symbols that close it
objs = dict(a.split("=", 1) for a in sys.argv[1:])
defs, refs = {}, collections.defaultdict(set)
for name, o in objs.items():
    for line in subprocess.run(["nm", "-P", o], capture_output=True, text=True, check=True).stdout.splitlines():
        p = line.split()
        if len(p) < 2: continue
        sym, kind = p[0], p[1]
        if kind == "U": refs[name].add(sym)
        elif kind in "TDBRCVW": defs.setdefault(sym, name)
edges = collections.defaultdict(lambda: collections.defaultdict(set))
for name, syms in refs.items():
    for s in syms:
        if s in defs and defs[s] != name: edges[name][defs[s]].add(s)
cycles = loops({name: edges[name].keys() for name in objs})
for comp in cycles:
    print("FAIL: these files call each other in a loop: " + " ".join(comp))
    for a in comp:
        for b in comp:
            if b in edges[a]: print(f"  {a} -> {b}: {', '.join(sorted(edges[a][b])[:4])}")
print(f"{len(objs)} objects, {sum(len(e) for e in edges.values())} file dependencies")
sys.exit(1 if cycles else 0)
PY

# the checker fails on a loop it is shown
printf 'int b(void);\nint a(void) { return b(); }\n' >"$TMP/a.c"
printf 'int a(void);\nint b(void) { return 1; }\nint c(void) { return a(); }\n' >"$TMP/b.c"
printf 'int a(void);\nint d(void) { return a(); }\n' >"$TMP/d.c"
for f in a b d; do cc -c "$TMP/$f.c" -o "$TMP/$f.o"; done
if python3 "$TMP/circles.py" a.c="$TMP/a.o" b.c="$TMP/b.o" d.c="$TMP/d.o" >"$TMP/self" 2>&1; then
  fail "the checker missed a.c <-> b.c: $(cat "$TMP/self")"
fi
grep -q "a loop: a.c b.c$" "$TMP/self" || fail "the checker named the wrong loop: $(cat "$TMP/self")"
python3 "$TMP/circles.py" a.c="$TMP/a.o" d.c="$TMP/d.o" >/dev/null || fail "the checker failed a tree without a loop"
pass "the checker catches a loop of two files and passes one without"

# this build's objects: every source of the tree, compiled here
args=()
cd "$KEEL_SRC"
while IFS= read -r src; do
  o=$KEEL_BUILD/CMakeFiles/keelcore_objs.dir/$src.o
  [ -f "$o" ] || o=$KEEL_BUILD/CMakeFiles/keel.dir/$src.o
  [ -f "$o" ] || fail "no object for $src under $KEEL_BUILD: build it first"
  args+=("$src=$o")
done < <(find src -name '*.c' | sort)
for src in src/cuda/*.cu; do # where the build has nvcc
  o=$KEEL_BUILD/src/cuda/CMakeFiles/keel_cuda.dir/$(basename "$src").o
  [ -f "$o" ] && args+=("$src=$o")
done
python3 "$TMP/circles.py" "${args[@]}" >"$TMP/out" || { cat "$TMP/out"; fail "source files call each other in a loop"; }
pass "no call loop among this build's files: $(tail -1 "$TMP/out")"
