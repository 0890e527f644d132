#!/usr/bin/env bash
# The module floors of docs/ARCHITECTURE.md hold in every #include of src/
# and include/ (.c, .h, .cu, .cuh, .cpp): a file includes headers of its own
# module, of a module on its floor one way (never in a loop), or of a module
# below it (core -> kernels/cuda/comm -> backend/model/data ->
# fsdp/optim/ckpt/hf -> run/plan -> train/resil/monitor -> cli/cluster/k8s); train
# and resil — the workers and the supervisor — never include each other (they
# meet only in run); and no two files include each other's headers in a loop.
# An include counts however it is written: "keel/x.h" or <keel/x.h>, "x.h"
# beside the file, spaces after '#', indented inside #ifdef. KEEL_LAYERS_ROOT
# checks another tree (tests/core/module_layers_selftest.sh).
source "$KEEL_SRC/tests/lib.sh"
root=${KEEL_LAYERS_ROOT:-$KEEL_SRC}
python3 - "$root" <<'PY' || fail "the includes break the module floors (above)"
import os, re, sys, collections
sys.path.insert(0, os.path.join(os.environ["KEEL_SRC"], "tests", "core"))
from loops import loops
root = sys.argv[1]
FLOOR = {"core": 0, "kernels": 1, "cuda": 1, "comm": 1, "backend": 2, "model": 2, "data": 2,
         "fsdp": 3, "optim": 3, "ckpt": 3, "hf": 3, "run": 4, "plan": 4, "infer": 4,
         "train": 5, "resil": 5, "monitor": 5, "cluster": 6, "k8s": 6, "cli": 6}
OWNER = {"include/keel/tokenizer.h": "data", "include/keel/etcd.h": "comm"}  # a second public header of a module
NEVER = {("train", "resil"), ("resil", "train")}
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)
EXT = (".c", ".h", ".cu", ".cuh", ".cpp", ".cc")

def module(path):  # path relative to root
    if path in OWNER: return OWNER[path]
    if path.startswith("include/keel/"): return os.path.basename(path).rsplit(".", 1)[0]
    if path.startswith("src/"): return path.split("/")[1]
    return None

def resolve(src, kind, name):
    """The tree file an include names, as the compiler finds it (-I include -I src), or None."""
    dirs = ([os.path.dirname(src)] if kind == '"' else []) + ["include", "src"]
    for d in dirs:
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, p)): return p
    return None

files = sorted(os.path.relpath(os.path.join(d, f), root)
               for top in ("src", "include") for d, _, fs in os.walk(os.path.join(root, top))
               for f in fs if f.endswith(EXT))
bad, mod_edges, file_edges = [], collections.defaultdict(set), collections.defaultdict(set)
for f in files:
    m = module(f)
    if m not in FLOOR:
        bad.append(f"{f}: module '{m}' has no floor (add it to docs/ARCHITECTURE.md and this test)"); continue
    text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
    for match in INCLUDE.finditer(text):
        kind, name = match.groups()
        line = text.count("\n", 0, match.start()) + 1
        target = resolve(f, kind, name)
        if target is None:
            if name.startswith("keel/"): bad.append(f"{f}:{line}: includes {name}, which is not in the tree")
            continue  # a system or library header
        file_edges[f].add(target)
        t = module(target)
        if t == m: continue
        if t not in FLOOR:
            bad.append(f"{f}:{line}: includes {name} of unknown module '{t}'"); continue
        if FLOOR[t] > FLOOR[m]:
            bad.append(f"{f}:{line}: {m} (floor {FLOOR[m]}) includes {name} of {t} (floor {FLOOR[t]}), a module above it")
        if (m, t) in NEVER:
            bad.append(f"{f}:{line}: {m} includes {name}: train and resil meet only in run")
        mod_edges[m].add(t)

for comp in loops(mod_edges): bad.append("modules include each other in a loop: " + " ".join(comp))
for comp in loops(file_edges): bad.append("files include each other in a loop: " + " ".join(comp))
for b in bad: print("FAIL:", b)
n_edges = sum(len(v) for v in mod_edges.values())
if not bad: print(f"{len(files)} files, {n_edges} module dependencies, all downward or one way on a floor, no loop")
sys.exit(1 if bad else 0)
PY
pass "module floors hold"
