#!/usr/bin/env bash
# keel's system packages (Debian 12, apt). Installs only what is missing.
#
#   scripts/install-deps.sh               build/test packages + the corpus tools
#   scripts/install-deps.sh --build-only  build/test packages only (no R, no SWORD)
#   . scripts/install-deps.sh             defines keel_apt_ensure / keel_apt_fetch and
#                                         the package arrays; installs nothing
#
# Quiet when everything is present ("deps: all present"). Never reads stdin.
# Needs root (or passwordless sudo) only when something has to be installed.

# ---- packages ---------------------------------------------------------------
KEEL_BUILD_DEPS=(
    build-essential          # gcc, make, libc headers: keel is C17 (g++: the CUDA emulator of the tests)
    cmake                    # the build (CMakeLists.txt)
    pkg-config               # library discovery for the build
    libopenblas-dev          # cblas.h + libopenblas: the CPU matmuls
    libopenblas-pthread-dev  # pin the pthread variant (libopenblas-dev alone may pick openmp/serial)
    libcjson-dev             # JSON configs and checkpoint metadata
    libxxhash-dev            # fast checksums of shards and checkpoints
    libpcre2-dev             # PCRE2: the regexes of Hugging Face tokenizer.json files
    libdnnl-dev              # oneDNN: the bf16 matmuls of fsdp.mixed_precision
    libmicrohttpd-dev        # the run's HTTP endpoint (/metrics)
    librsvg2-dev             # keel plot --out FILE.png: the plot's SVG drawn by librsvg + cairo
    zlib1g-dev               # keel data prepare reads .gz inputs as it inflates them (zlib)
    libzstd-dev              #   and .zst inputs (libzstd's streaming decompression)
    libsnappy-dev            #   and Parquet pages compressed with Snappy (snappy-c.h; src/data/parquet.c)
    prometheus               # prometheus + promtool: the tests scrape a real run and lint /metrics
    chromium                 # headless: the tests load the dashboard in a real browser
    sentencepiece            # spm_train / spm_encode: train the demo tokenizer, reference encoder
    xxhash                   # xxhsum: tests/train check params_xxh3 against weights.bin
    zstd                     # the zstd CLI: tests/data/data_prepare_formats.sh writes .zst inputs
    python3                  # tests/lib.sh and the train tests read JSON with python3
    python3-venv             # tests/data/tokenizer_matches_hf.sh: a venv for Hugging Face tokenizers
    openmpi-bin              # mpirun: keel's ranks (FSDP) and the MPI tests
    libopenmpi-dev           # mpi.h + libmpi for the comm module
    libgloo-dev              # Gloo: the comm transport of ranks started without mpirun (keel agent)
    libcurl4-openssl-dev     # libcurl: etcd's v3 JSON API (keel agent's rendezvous, the Gloo store)
    etcd-server              # etcd: the tests start one for keel agent's rendezvous
    etcd-client              #   etcdctl: the tests read what keel wrote there
    buildah                  # scripts/build-image.sh: the CPU container image (keel agent as its entry point)
    podman                   #   tests/k8s/agent_containers.sh runs it as a job's pods
    runc                     #   podman's runtime here (crun refuses this machine's hybrid cgroups)
    slurmctld                # the tests' local multi-node Slurm cluster (tests/slurm/cluster.sh)
    slurmd                   #   its nodes (several slurmd on one host)
    slurm-client             #   srun, salloc, scontrol: keel train launches with srun in an allocation
    libpmix-dev              # srun --mpi=pmix for OpenMPI ranks
    libslurm-dev             # slurm/spank.h: the srun --auto-resume plugin (plugins/slurm)
    clang                    # the fuzz harnesses (tests/fuzz, scripts/fuzz.sh): libFuzzer is clang's
    libclang-rt-14-dev       #   its runtime: -fsanitize=fuzzer (with ASan + UBSan) links against it
)
# kubectl: tests/k8s/k8s_kubectl_cli.sh runs the real one (keel k8s status|logs|delete). Debian's
# kubernetes-client conflicts with a kubectl installed another way (the Google Cloud SDK's, a
# snap, a download), so it is asked for only when no kubectl is on PATH.
command -v kubectl >/dev/null 2>&1 || KEEL_BUILD_DEPS+=(kubernetes-client)
KEEL_CORPUS_DEPS=(
    r-base-core              # Rscript: reads the .rda/lazy-load data of the R text packages
    r-cran-janeaustenr       # six Jane Austen novels (only needs r-base-core)
    diatheke                 # SWORD command line: dumps the Bible module as text
    sword-text-web           # World English Bible (modern English, curly quotes)
)
# Pure data, fetched with `apt-get download` + `dpkg -x` by scripts/build_corpus.sh and
# never installed (r-cran-tidytext alone would pull in a dozen R packages; fortunes-de
# would pull in fortune-mod).
# shellcheck disable=SC2034  # used by scripts/build_corpus.sh
KEEL_CORPUS_DATA=(
    r-cran-tidytext          # Great Expectations, War of the Worlds, 20,000 Leagues (extdata/books.rda)
    r-cran-tokenizers        # Moby Dick (lazy-load data)
    fortunes                 # English fortune-cookie quotes
    fortunes-min             # the rest of the English fortunes
    fortunes-de              # German fortunes: non-ASCII text (ä ö ü ß) for the tokenizer tests
)

# ---- functions (safe to source) -------------------------------------------
keel__sudo() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n "$@"
    else echo "deps: ERROR: need root (or passwordless sudo) to run: $*" >&2; return 1
    fi
}

keel__apt_log() { # a log file for apt's chatter; kept (and printed) on failure
    mktemp "${TMPDIR:-/tmp}/keel-apt.XXXXXX.log"
}

keel__apt_fail() { # what log
    echo "deps: ERROR: $1 failed (log: $2); last lines:" >&2
    tail -n 15 "$2" | sed 's/^/deps:   /' >&2
    return 1
}

# apt-get update, at most once per process (and not at all if nothing is missing).
keel__apt_update() {
    [ "${KEEL_APT_UPDATED:-0}" = 1 ] && return 0
    local log try
    keel__sudo true 2>/dev/null \
        || { echo "deps: ERROR: apt-get update needs root (or passwordless sudo)" >&2; return 1; }
    log=$(keel__apt_log)
    for try in 1 2 3; do   # the lists lock may be held by another apt for a moment
        if keel__sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q \
               -o DPkg::Lock::Timeout=600 </dev/null >"$log" 2>&1; then
            KEEL_APT_UPDATED=1; rm -f "$log"; return 0
        fi
        [ $try -lt 3 ] && sleep 10
    done
    keel__apt_fail "apt-get update" "$log"
}

keel_apt_missing() { # prints the named packages that are not installed
    local p
    for p in "$@"; do
        [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || echo "$p"
    done
}

# keel_apt_ensure PKG...: install those of PKG that are missing (no recommends).
keel_apt_ensure() {
    local missing log t0
    mapfile -t missing < <(keel_apt_missing "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "deps: installing ${missing[*]}" >&2
    keel__sudo true 2>/dev/null || {
        echo "deps: ERROR: not root and no passwordless sudo: install as root: apt-get install ${missing[*]}" >&2
        return 1; }
    t0=$SECONDS
    keel__apt_update || return 1
    log=$(keel__apt_log)
    if ! keel__sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" \
            </dev/null >"$log" 2>&1; then
        keel__apt_fail "apt-get install ${missing[*]}" "$log"
        return 1
    fi
    rm -f "$log"
    mapfile -t missing < <(keel_apt_missing "${missing[@]}")
    if [ ${#missing[@]} -ne 0 ]; then
        echo "deps: ERROR: still not installed after apt-get: ${missing[*]}" >&2
        return 1
    fi
    echo "deps: installed in $((SECONDS - t0)) s" >&2
}

# keel_apt_fetch DIR PKG...: download PKG's .deb (no dependencies, no install) and
# unpack it under DIR/PKG/ with dpkg -x. Skips packages already unpacked there.
keel_apt_fetch() {
    local dir=$1 p f deb log todo=(); shift
    for p in "$@"; do [ -f "$dir/$p/.unpacked" ] || todo+=("$p"); done
    [ ${#todo[@]} -eq 0 ] && return 0
    mkdir -p "$dir/debs" || return 1
    for p in "${todo[@]}"; do rm -f "$dir/debs/${p}_"*.deb; done
    log=$(keel__apt_log)
    # one apt-get for all (each run reads the whole package cache: ~1 s of CPU);
    # -o APT::Sandbox::User=root: the _apt user may not be able to write to $dir
    if ! (cd "$dir/debs" && apt-get download -q -o APT::Sandbox::User=root "${todo[@]}" \
              </dev/null >"$log" 2>&1); then
        # no package lists yet, or stale ones naming .debs the mirror no longer has
        keel__apt_update || return 1
        (cd "$dir/debs" && apt-get download -q -o APT::Sandbox::User=root "${todo[@]}" \
             </dev/null >"$log" 2>&1) \
            || { keel__apt_fail "apt-get download ${todo[*]}" "$log"; return 1; }
    fi
    rm -f "$log"
    for p in "${todo[@]}"; do
        deb=
        for f in "$dir/debs/${p}_"*.deb; do [ -e "$f" ] && deb=$f; done
        [ -n "$deb" ] || { echo "deps: ERROR: apt-get download $p produced no .deb" >&2; return 1; }
        rm -rf "${dir:?}/$p"
        dpkg -x "$deb" "$dir/$p" || { echo "deps: ERROR: dpkg -x $deb failed" >&2; return 1; }
        touch "$dir/$p/.unpacked"
    done
}

keel__openblas_check() {
    local arch lib
    arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null)
    lib=/usr/lib/${arch:-x86_64-linux-gnu}/openblas-pthread/libopenblas.so
    if [ ! -e "$lib" ]; then
        echo "deps: ERROR: $lib missing: the pthread OpenBLAS (libopenblas-pthread-dev) is not installed" >&2
        return 1
    fi
}

keel_install_deps_main() {
    local pkgs=("${KEEL_BUILD_DEPS[@]}") arg
    for arg in "$@"; do
        case $arg in
            --build-only) ;;
            -h|--help) sed -n '2,10p' "${BASH_SOURCE[0]}"; return 0 ;;
            *) echo "deps: ERROR: unknown argument: $arg (try --help)" >&2; return 2 ;;
        esac
    done
    [[ " $* " == *" --build-only "* ]] || pkgs+=("${KEEL_CORPUS_DEPS[@]}")
    if [ -z "$(keel_apt_missing "${pkgs[@]}")" ]; then
        keel__openblas_check || return 1
        echo "deps: all present"
        return 0
    fi
    keel_apt_ensure "${pkgs[@]}" || return 1
    keel__openblas_check || return 1
    echo "deps: all present"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -uo pipefail
    keel_install_deps_main "$@"
    exit $?
fi
