/* infer/prompts.c: a prompts file — JSON Lines of {"prompt": "..."} or
 * {"prompt": [ids]} — for keel generate --prompts, and the same with "text"
 * for keel eval --text (keel_infer_parse_prompts in keel/infer.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "keel/infer.h"

enum { MAX_PROMPT_IDS = 1 << 24 };


bool keel_gen_prompt_ids(const struct cJSON *list, keel_gen_prompt *p) {
    int n = cJSON_GetArraySize(list);
    if (n < 1 || n > MAX_PROMPT_IDS) return false;
    int32_t *ids = keel_xmalloc(sizeof(int32_t) * (size_t)n, "prompt ids");
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        int64_t x;
        if (!keel_json_int(e, 0, INT32_MAX, &x)) {
            keel_free(ids);
            return false;
        }
        ids[k++] = (int32_t)x;
    }
    p->ids = ids, p->n_ids = n;
    return true;
}

/* "each line must be one object like {"prompt": "text"} or {"prompt": [token ids]}" */
static void shape(char *out, size_t n, const char *key) {
    snprintf(out, n, "each line must be one object like {\"%s\": \"text\"} or {\"%s\": [token ids]}", key, key);
}

/* Each line one object: its `key` a string or ids; other keys are ignored. */
static keel_status one_line(const char *line, size_t len, const char *name, const char *key, int lineno,
                            keel_gen_prompt *p, bool *got) {
    *got = false;
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) return KEEL_OK; /* blank */
    cJSON *rec = cJSON_ParseWithLength(line, len);
    const cJSON *v = cJSON_IsObject(rec) ? cJSON_GetObjectItemCaseSensitive(rec, key) : NULL;
    keel_status st = KEEL_ERR_INPUT;
    char want[160];
    shape(want, sizeof want, key);
    if (!rec) keel_errorf("%s:%d: not JSON; %s", name, lineno, want);
    else if (!cJSON_IsObject(rec)) keel_errorf("%s:%d: not a JSON object; %s", name, lineno, want);
    else if (!v) keel_errorf("%s:%d: no \"%s\" key; %s", name, lineno, key, want);
    else if (cJSON_IsString(v)) {
        *p = (keel_gen_prompt){.text = keel_xstrdup(v->valuestring)};
        st = KEEL_OK;
    } else if (cJSON_IsArray(v) && keel_gen_prompt_ids(v, p)) st = KEEL_OK;
    else keel_errorf("%s:%d: \"%s\" must be a string or a non-empty list of token ids (integers >= 0)", name, lineno, key);
    cJSON_Delete(rec);
    *got = st == KEEL_OK;
    return st;
}

void keel_gen_prompts_free(keel_gen_prompt *prompts, int n) {
    for (int i = 0; prompts && i < n; i++) keel_free((void *)prompts[i].text), keel_free((void *)prompts[i].ids);
    keel_free(prompts);
}

keel_status keel_infer_parse_prompts(const char *text, size_t len, const char *name, const char *key,
                                     keel_gen_prompt **prompts, int *n) {
    *prompts = NULL;
    *n = 0;
    int cap = 0, lineno = 0;
    keel_status st = KEEL_OK;
    for (size_t at = 0; at < len && st == KEEL_OK;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len;
        keel_gen_prompt p = {0};
        bool got;
        lineno++;
        st = one_line(text + at, end - at, name, key, lineno, &p, &got);
        if (got) {
            if (*n == cap) {
                cap = cap ? 2 * cap : 16;
                *prompts = keel_xrealloc(*prompts, sizeof **prompts * (size_t)cap, "prompts");
            }
            (*prompts)[(*n)++] = p;
        }
        at = end + 1;
    }
    if (st == KEEL_OK && *n == 0) {
        char want[160];
        shape(want, sizeof want, key);
        keel_errorf("%s: nothing in it; %s", name, want);
        st = KEEL_ERR_INPUT;
    }
    if (st != KEEL_OK) {
        keel_gen_prompts_free(*prompts, *n);
        *prompts = NULL;
        *n = 0;
    }
    return st;
}
