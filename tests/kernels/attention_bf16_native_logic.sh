#!/usr/bin/env bash
# The AVX512_BF16 path of flash attention (src/kernels/attention_bf16.c: its
# packing, its microkernel, the wrapper that maps each tile product onto
# them) checked on every machine, not only on those with AVX512_BF16:
# attention_bf16.c is compiled with scalar stand-ins for its intrinsics
# (tests/kernels/avx512_bf16_shim.h) and without its target pragmas, the
# dispatch is told the CPU has AVX512_BF16, and test_attention_bf16 runs on
# it under AddressSanitizer + UBSan (a packing offset or a scratch size off
# by one shows there). The instructions themselves are checked where the CPU
# has them: test_attention_bf16 (native).
source "$KEEL_SRC/tests/lib.sh"
: "${KEEL_BUILD:?KEEL_BUILD must point at the build directory}"
sed -e '/#pragma GCC/d' -e '/#pragma clang/d' -e '/apply_to = function)/d' \
    -e 's|#include <immintrin.h>|#include "avx512_bf16_shim.h"|' \
    "$KEEL_SRC/src/kernels/attention_bf16.c" > "$TMP/attention_bf16_shim.c"
grep -q 'avx512_bf16_shim.h' "$TMP/attention_bf16_shim.c" || fail "attention_bf16.c no longer includes <immintrin.h>"
! grep -q 'pragma' "$TMP/attention_bf16_shim.c" || fail "a target pragma is left: $(grep pragma "$TMP/attention_bf16_shim.c")"
cat > "$TMP/isa_bf16.c" <<'C'
#include "keel/kernels.h"
keel_isa isa_bf16(void) { return KEEL_ISA_AVX512_BF16; }
C
# shellcheck disable=SC2046  # pkg-config prints a word list
${CC:-cc} -std=c17 -O2 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -Wno-psabi \
    -D_GNU_SOURCE -fno-math-errno -ffp-contract=fast -march=x86-64-v3 \
    -I"$KEEL_SRC/include" -I"$KEEL_SRC/src" -I"$KEEL_SRC/tests/kernels" -Dkeel_isa_active=isa_bf16 \
    "$KEEL_SRC/tests/kernels/test_attention_bf16.c" "$TMP/attention_bf16_shim.c" \
    "$KEEL_SRC/src/kernels/attention.c" "$TMP/isa_bf16.c" "$KEEL_BUILD/libkeelcore.a" \
    $(pkg-config --cflags --libs ompi-c) -L/usr/lib/x86_64-linux-gnu/openblas-pthread -lopenblas \
    -ldnnl -lgomp -lcjson -lxxhash -lpthread -lm -o "$TMP/native_logic" 2>"$TMP/cc.log" \
    || fail "compile: $(tail -5 "$TMP/cc.log")"
"$TMP/native_logic" >"$TMP/out" 2>&1 || fail "$(grep -v '^ok' "$TMP/out" | tail -5)"
grep -q 'AVX512_BF16 microkernel' "$TMP/out" || fail "the microkernel path did not run: $(head -1 "$TMP/out")"
pass "the AVX512_BF16 path on scalar stand-ins: $(grep -c '^ok' "$TMP/out") checks of test_attention_bf16, $(tail -1 "$TMP/out")"
