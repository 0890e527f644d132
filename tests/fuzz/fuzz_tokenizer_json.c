/* tests/fuzz/fuzz_tokenizer_json.c: Hugging Face tokenizer.json files — the
 * input is the file (keel_tokenizer_load_buffer, what keel_tokenizer_load
 * parses one with: JSON goes to src/data/tokenizer_hf.c); a tokenizer that
 * loads then encodes a few fixed lines (spaces, digits, contractions,
 * special-token text, "▁", invalid UTF-8, a long run) and decodes the
 * encodings and its first ids. The ids must be in range and every failure
 * one line. */
#include "keel/tokenizer.h"

#include "fuzz.h"

static const char *const LINES[] = {
    "Hello world, it's 2024!",
    "  two  spaces\tand a tab \r",
    "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 e\xcc\x81 \xe1\xa0\x8e\xc2\x85",
    "\xff\xfe bad \xc3 utf8 \xed\xa0\x80",
    "",
    "<|begin_of_text|>x<|eot_id|> <s>a</s> <mask> <unk>",
    "\xe2\x96\x81 already\xe2\x96\x81\x65scaped <0x41>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "1234567 WE'RE ab abc",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    keel_tokenizer *tok;
    keel_status st = keel_tokenizer_load_buffer(data, size, "fuzz/tokenizer.json", &tok);
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
    /* every token, once (the first 4096) */
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
