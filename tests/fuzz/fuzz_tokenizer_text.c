/* tests/fuzz/fuzz_tokenizer_text.c: text through a valid model
 * (tests/fuzz/data/tok.model: BPE with byte fallback, user-defined symbols,
 * a custom normalization and denormalization charsmap, whitespace as
 * suffix). The first byte chooses: even, the rest is a line to encode (then
 * decode, and the ids must be in range); odd, the rest is ids (2 bytes each,
 * some out of range) to decode. */
#include "keel/tokenizer.h"

#include "fuzz.h"

#ifndef KEEL_FUZZ_DATA
#error "KEEL_FUZZ_DATA: the directory of tok.model (tests/fuzz/CMakeLists.txt sets it)"
#endif

static keel_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (keel_tokenizer_load(KEEL_FUZZ_DATA "/tok.model", &tok) != KEEL_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    int V = keel_tokenizer_vocab_size(tok);
    char *text;
    size_t len;
    keel_status st;
    if (data[0] % 2 == 0) {
        keel_ids ids = {0};
        st = keel_tokenizer_encode(tok, (const char *)data + 1, size - 1, &ids);
        fuzz_expect_error_line(st, "keel_tokenizer_encode");
        for (size_t k = 0; st == KEEL_OK && k < ids.n; k++)
            if (ids.ids[k] < 0 || ids.ids[k] >= V) abort();
        if (st == KEEL_OK && keel_tokenizer_decode_len(tok, ids.ids, ids.n, &text, &len) == KEEL_OK) keel_free(text);
        keel_ids_free(&ids);
        return 0;
    }
    size_t n = (size - 1) / 2;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        unsigned v = data[1 + 2 * i] | (unsigned)data[2 + 2 * i] << 8;
        ids[i] = (int32_t)(v % (unsigned)(V + 4)) - 2; /* a few below 0 and past V - 1 */
    }
    st = keel_tokenizer_decode_len(tok, ids, n, &text, &len);
    fuzz_expect_error_line(st, "keel_tokenizer_decode_len");
    if (st == KEEL_OK) {
        if (strlen(text) > len) abort();
        keel_free(text);
    }
    free(ids);
    return 0;
}
