/* tests/fuzz/fuzz_prompts.c: a prompts file of keel generate --prompts
 * (keel_infer_parse_prompts, src/infer/prompts.c) — the input, in a buffer of
 * exactly its size. Success must give at least one prompt, each either a
 * NUL-ended text or ids >= 0 (never both, never neither); a failure gives
 * none and one error line. */
#include "keel/infer.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *text = malloc(size ? size : 1);
    if (!text) abort();
    memcpy(text, data, size);
    keel_gen_prompt *p;
    int n;
    keel_status st = keel_infer_parse_prompts(text, size, "prompts.jsonl", "prompt", &p, &n);
    if (st == KEEL_OK) {
        if (n < 1 || !p) abort();
        for (int i = 0; i < n; i++) {
            if (!p[i].text == !p[i].ids) abort();
            if (p[i].text && strlen(p[i].text) > size) abort();
            for (int j = 0; p[i].ids && j < p[i].n_ids; j++)
                if (p[i].ids[j] < 0) abort();
        }
        keel_gen_prompts_free(p, n);
    } else {
        if (p || n) abort();
        fuzz_expect_error_line(st, "keel_infer_parse_prompts");
    }
    free(text);
    return 0;
}
