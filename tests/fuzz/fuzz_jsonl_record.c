/* tests/fuzz/fuzz_jsonl_record.c: one line of a JSON Lines input through
 * jsonl_record_text (src/data/jsonl.c), what `keel data prepare` runs on every
 * record. The first byte picks the key of the text ("text", "content", "a",
 * "é"); the rest is the line, in a buffer of exactly its size (no NUL after
 * it). A blank line must be all JSON whitespace; a record's text a NUL-ended
 * string no longer than the line (escapes only shrink); a failure one error
 * line. */
#include "data/jsonl.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    static const char *const keys[] = {"text", "content", "a", "\xc3\xa9"};
    const char *key = keys[data[0] % 4];
    size_t len = size - 1;
    char *line = malloc(len ? len : 1);
    if (!line) abort();
    memcpy(line, data + 1, len);
    bool is_record;
    char *text, why[1024] = "";
    size_t text_len;
    keel_status st = jsonl_record_text(line, len, key, &is_record, &text, &text_len, why, sizeof why);
    if (st == KEEL_OK) {
        if (is_record != (text != NULL)) abort();
        if (is_record && (strlen(text) != text_len || text_len > len)) abort();
        for (size_t i = 0; !is_record && i < len; i++)
            if (!strchr(" \t\r\n", line[i]) || !line[i]) abort();
        keel_free(text);
    } else {
        if (!why[0] || text) abort();
        keel_errorf("%s", why); /* as keel data prepare prints it, behind the file and line */
        fuzz_expect_error_line(st, "jsonl_record_text");
    }
    free(line);
    return 0;
}
