/* tests/fuzz/fuzz_task.c: a task file of keel eval --task
 * (keel_infer_parse_task, src/infer/task.c) — the input, in a buffer of
 * exactly its size. Success must give at least one question, each with a
 * context, at least one choice and an answer among them; a failure gives
 * none and one error line. */
#include "keel/infer.h"

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_quiet();
    char *text = malloc(size ? size : 1);
    if (!text) abort();
    memcpy(text, data, size);
    keel_task_item *items;
    int n;
    keel_status st = keel_infer_parse_task(text, size, "task.jsonl", &items, &n);
    if (st == KEEL_OK) {
        if (n < 1 || !items) abort();
        for (int i = 0; i < n; i++) {
            const keel_task_item *it = &items[i];
            if (!it->context || it->n_choices < 1 || it->answer < 0 || it->answer >= it->n_choices) abort();
            for (int c = 0; c < it->n_choices; c++)
                if (!it->choices[c] || strlen(it->choices[c]) > size) abort();
        }
        keel_task_items_free(items, n);
    } else {
        if (items || n) abort();
        fuzz_expect_error_line(st, "keel_infer_parse_task");
    }
    free(text);
    return 0;
}
