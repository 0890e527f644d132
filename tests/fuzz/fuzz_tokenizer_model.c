/* tests/fuzz/fuzz_tokenizer_model.c: SentencePiece .model files — the input is
 * the model (keel_tokenizer_load_buffer, what keel_tokenizer_load parses a
 * file with); a model that loads then encodes a few fixed lines (spaces,
 * user symbols, malformed UTF-8, text its charsmap rewrites) and decodes its
 * first ids and the encodings. */
#include "keel/tokenizer.h"

#include "fuzz.h"

static const char *const LINES[] = {
    "Hello world", "  two  spaces  and\ttab ", "\xef\xac\x81ne \xe2\x85\xa3 caf\xc3\xa9 AB",
    "\xff\xfe bad \xc3 utf8 \xed\xa0\x80", "", "@@<tab>x@@", "\xef\xbc\x90\xef\xbc\x91 \xe3\x80\x80 x",
    "\xe2\x96\x81 already escaped", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    keel_tokenizer *tok;
    keel_status st = keel_tokenizer_load_buffer(data, size, "fuzz.model", &tok);
    fuzz_expect_error_line(st, "keel_tokenizer_load_buffer");
    if (st != KEEL_OK) return 0;
    int V = keel_tokenizer_vocab_size(tok);
    if (V < 1 || keel_tokenizer_bos_id(tok) >= V || keel_tokenizer_eos_id(tok) >= V) abort();
    keel_ids ids = {0};
    char *text;
    size_t len;
    for (size_t i = 0; i < sizeof LINES / sizeof LINES[0]; i++) {
        fuzz_quiet();
        st = keel_tokenizer_encode(tok, LINES[i], strlen(LINES[i]), &ids);
        fuzz_expect_error_line(st, "keel_tokenizer_encode");
        if (st != KEEL_OK) continue;
        for (size_t k = 0; k < ids.n; k++)
            if (ids.ids[k] < 0 || ids.ids[k] >= V) abort();
        st = keel_tokenizer_decode_len(tok, ids.ids, ids.n, &text, &len);
        fuzz_expect_error_line(st, "keel_tokenizer_decode_len");
        if (st == KEEL_OK) keel_free(text);
    }
    /* every piece, once (the first 4096) */
    int n = V < 4096 ? V : 4096;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) all[i] = i;
    fuzz_quiet();
    st = keel_tokenizer_decode_len(tok, all, (size_t)n, &text, &len);
    fuzz_expect_error_line(st, "keel_tokenizer_decode_len");
    if (st == KEEL_OK) keel_free(text);
    free(all);
    keel_ids_free(&ids);
    keel_tokenizer_free(tok);
    return 0;
}
