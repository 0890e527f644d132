/* infer/task.c: a multiple-choice task file — JSON Lines of {"context",
 * "choices", "answer"} — for keel eval --task (keel_infer_parse_task in
 * keel/infer.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "keel/infer.h"

enum { MAX_CHOICES = 1 << 16 };

static const char SHAPE[] = "each line must be {\"context\": \"...\", \"choices\": [\"...\", ...], \"answer\": i}";

static void item_free(keel_task_item *it) {
    keel_free(it->context);
    for (int c = 0; c < it->n_choices; c++) keel_free(it->choices[c]);
    keel_free(it->choices);
}

void keel_task_items_free(keel_task_item *items, int n) {
    for (int i = 0; items && i < n; i++) item_free(&items[i]);
    keel_free(items);
}

/* One question, or *got false for a blank line; a bad one is one line naming `where` and the field. */
static keel_status one_item(const char *line, size_t len, const char *where, keel_task_item *it, bool *got) {
    *got = false;
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) return KEEL_OK;
    cJSON *rec = cJSON_ParseWithLength(line, len);
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(rec, "context");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(rec, "choices");
    const cJSON *answer = cJSON_GetObjectItemCaseSensitive(rec, "answer");
    int n = cJSON_IsArray(choices) ? cJSON_GetArraySize(choices) : 0;
    int64_t a = -1;
    const char *bad = NULL;
    if (!rec) bad = "not JSON";
    else if (!cJSON_IsObject(rec)) bad = "not a JSON object";
    else if (!cJSON_IsString(ctx)) bad = "\"context\" is missing or not a string";
    else if (!cJSON_IsArray(choices) || n < 1 || n > MAX_CHOICES) bad = "\"choices\" is missing, empty or not a list";
    else if (!answer || !keel_json_int(answer, 0, n - 1, &a)) bad = "\"answer\" is missing or not an index into \"choices\"";
    else {
        const cJSON *c;
        cJSON_ArrayForEach(c, choices) if (!cJSON_IsString(c)) bad = "a choice is not a string";
    }
    if (bad) {
        if (answer && cJSON_IsNumber(answer) && !strncmp(bad, "\"answer\"", 8))
            keel_errorf("%s: \"answer\" %g is out of range: %d choice(s), so 0 to %d; %s", where, answer->valuedouble,
                        n, n - 1, SHAPE);
        else keel_errorf("%s: %s; %s", where, bad, SHAPE);
        cJSON_Delete(rec);
        return KEEL_ERR_INPUT;
    }
    *it = (keel_task_item){.context = keel_xstrdup(ctx->valuestring), .n_choices = n, .answer = (int)a};
    it->choices = keel_xmalloc(sizeof(char *) * (size_t)n, "choices");
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, choices) it->choices[k++] = keel_xstrdup(c->valuestring);
    cJSON_Delete(rec);
    *got = true;
    return KEEL_OK;
}

keel_status keel_infer_parse_task(const char *text, size_t len, const char *name, keel_task_item **items, int *n) {
    *items = NULL;
    *n = 0;
    int cap = 0, lineno = 0;
    keel_status st = KEEL_OK;
    for (size_t at = 0; at < len && st == KEEL_OK;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len;
        char where[600];
        snprintf(where, sizeof where, "%.500s:%d", name, ++lineno);
        keel_task_item it;
        bool got;
        st = one_item(text + at, end - at, where, &it, &got);
        if (got) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 64;
                *items = keel_xrealloc(*items, sizeof **items * (size_t)cap, "task items");
            }
            (*items)[(*n)++] = it;
        }
        at = end + 1;
    }
    if (st == KEEL_OK && *n == 0) {
        keel_errorf("%s: no questions; %s", name, SHAPE);
        st = KEEL_ERR_INPUT;
    }
    if (st != KEEL_OK) {
        keel_task_items_free(*items, *n);
        *items = NULL;
        *n = 0;
    }
    return st;
}
