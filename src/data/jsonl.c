/* data/jsonl.c: a JSON Lines record (one line, one object) to the text of its
 * document, parsed with cJSON (see jsonl.h). */
#include "data/jsonl.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* cJSON_Parse* records the last error's position in a global of its own, so
 * two threads parsing at once race on it; parsing is a small share of the
 * work next to encoding the text, so it is done one record at a time. */
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

const char *jsonl_json_type(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "not a JSON value";
}

/* "malformed JSON record at byte N of M (near '...')": where parsing stopped, 1-based. */
static void say_malformed(const char *line, size_t len, size_t at, const char *what, char *why,
                          size_t why_n) {
    enum { NEAR = 24 };
    if (at >= len) at = len ? len - 1 : 0;
    size_t from = at > NEAR / 2 ? at - NEAR / 2 : 0;
    size_t n = len - from < NEAR ? len - from : NEAR;
    snprintf(why, why_n, "malformed JSON record%s at byte %zu of %zu (near '%.*s'); each line must "
             "be one whole JSON object (JSON Lines)", what, at + 1, len, (int)n, line + from);
}

void jsonl_member_names(const cJSON *v, char *out, size_t out_n) {
    size_t used = 0;
    int n = 0;
    out[0] = '\0';
    for (const cJSON *m = v->child; m && used < out_n; m = m->next, n++) {
        int w = n == 4 ? snprintf(out + used, out_n - used, ", ...")
                       : snprintf(out + used, out_n - used, "%s\"%.40s\"", n ? ", " : "",
                                  m->string ? m->string : "");
        if (w < 0) break;
        used += (size_t)w;
        if (n == 4) break;
    }
}

keel_status jsonl_record_object(const char *line, size_t len, const char *holds, cJSON **rec,
                                char *why, size_t why_n) {
    *rec = NULL;
    size_t first = 0;
    while (first < len && is_json_space(line[first])) first++;
    if (first == len) return KEEL_OK; /* a blank line holds no record */

    const char *end = NULL;
    pthread_mutex_lock(&parse_mu);
    cJSON *v = cJSON_ParseWithLengthOpts(line, len, &end, false);
    pthread_mutex_unlock(&parse_mu);
    size_t at = end && end >= line && end <= line + len ? (size_t)(end - line) : len;
    if (!v) {
        say_malformed(line, len, at, "", why, why_n);
        return KEEL_ERR_INPUT;
    }
    while (at < len && is_json_space(line[at])) at++;
    if (at < len) {
        say_malformed(line, len, at, ": more after the object", why, why_n);
    } else if (!cJSON_IsObject(v)) {
        snprintf(why, why_n, "the record is %s, not a JSON object; each line must be one object "
                 "with %s", jsonl_json_type(v), holds);
    } else {
        *rec = v;
        return KEEL_OK;
    }
    cJSON_Delete(v);
    return KEEL_ERR_INPUT;
}

keel_status jsonl_record_text(const char *line, size_t len, const char *key, bool *is_record,
                              char **text, size_t *text_len, char *why, size_t why_n) {
    *is_record = false;
    *text = NULL;
    *text_len = 0;
    char holds[600];
    snprintf(holds, sizeof holds, "the document's text at \"%.500s\"", key);
    cJSON *rec;
    keel_status st = jsonl_record_object(line, len, holds, &rec, why, why_n);
    if (st != KEEL_OK || !rec) return st;
    st = KEEL_ERR_INPUT;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, key);
    if (!v) {
        char names[200];
        jsonl_member_names(rec, names, sizeof names);
        snprintf(why, why_n, "the record has no \"%s\" key (%s%s); name the key that holds the "
                 "text with --text-key", key, names[0] ? "its keys: " : "it is empty", names);
        goto done;
    }
    if (!cJSON_IsString(v) || !v->valuestring) {
        snprintf(why, why_n, "\"%s\" is %s, not a string; it must hold the document's text (or "
                 "name another key with --text-key)", key, jsonl_json_type(v));
        goto done;
    }
    *text_len = strlen(v->valuestring);
    *text = keel_xmalloc(*text_len + 1, "record text");
    memcpy(*text, v->valuestring, *text_len + 1);
    *is_record = true;
    st = KEEL_OK;
done:
    cJSON_Delete(rec);
    return st;
}
