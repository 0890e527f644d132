/* comm/etcd_json.c: the wire of etcd's v3 JSON API — base64 (keys and values
 * travel as it; none of the libraries keel links offers it in its API, and it
 * is twenty lines) and the parse of an answer, which arrives from the network
 * and is held to what the API promises (tests/fuzz/fuzz_etcd.c). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/etcd.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void keel_base64_encode(const void *in, size_t n, char *out) {
    const unsigned char *p = in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = B64[v >> 18 & 63];
        out[o++] = B64[v >> 12 & 63];
        out[o++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    out[o] = 0;
}

static int b64_value(char c) {
    const char *at = c ? strchr(B64, c) : NULL;
    return at ? (int)(at - B64) : -1;
}

bool keel_base64_decode(const char *in, size_t n, void *out, size_t *out_n) {
    unsigned char *p = out;
    size_t o = 0;
    if (n % 4) return false;
    for (size_t i = 0; i < n; i += 4) {
        bool last = i + 4 == n;
        int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=') : 0;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = b64_value(in[i + k])) < 0) return false;
        for (int k = 4 - pad; k < 4; k++) v[k] = 0;
        unsigned w = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
        p[o++] = (unsigned char)(w >> 16);
        if (pad < 2) p[o++] = (unsigned char)(w >> 8);
        if (pad < 1) p[o++] = (unsigned char)w;
    }
    *out_n = o;
    return true;
}

/* ---- the answer ---------------------------------------------------------------- */

/* An int64 as the gateway writes it (a string of digits) or as a number;
 * absent: 0 (proto3 leaves defaults out). */
static bool field_int(const cJSON *obj, const char *name, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = 0;
    if (!v) return true;
    if (cJSON_IsNumber(v)) return keel_json_int(v, INT64_MIN, INT64_MAX, out);
    if (!cJSON_IsString(v) || !v->valuestring[0]) return false;
    char *end;
    errno = 0;
    long long x = strtoll(v->valuestring, &end, 10);
    if (*end || errno) return false;
    *out = x;
    return true;
}

/* base64 text into a malloc'd, NUL-ended copy of its bytes. */
static bool field_bytes(const cJSON *obj, const char *name, char **out, size_t *out_n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    const char *text = cJSON_IsString(v) ? v->valuestring : v ? NULL : "";
    if (!text) return false;
    size_t n = strlen(text);
    *out = keel_xmalloc(n / 4 * 3 + 1, "etcd value");
    if (!keel_base64_decode(text, n, *out, out_n)) {
        keel_free(*out);
        *out = NULL;
        return false;
    }
    (*out)[*out_n] = 0;
    return true;
}

static bool parse_kvs(const cJSON *kvs, keel_etcd_reply *r, char *why, size_t why_n) {
    if (!kvs) return true;
    if (!cJSON_IsArray(kvs)) return snprintf(why, why_n, "\"kvs\" is not a list"), false;
    int n = cJSON_GetArraySize(kvs);
    keel_etcd_kv *all = keel_xrealloc(r->kvs, sizeof *all * (size_t)(r->n_kvs + n) + 1, "etcd kvs");
    r->kvs = all;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, kvs) {
        keel_etcd_kv *out = &r->kvs[r->n_kvs];
        *out = (keel_etcd_kv){0};
        size_t key_n;
        if (!cJSON_IsObject(kv) || !field_bytes(kv, "key", &out->key, &key_n) ||
            !field_bytes(kv, "value", &out->value, &out->value_len) ||
            !field_int(kv, "create_revision", &out->create_revision) ||
            !field_int(kv, "mod_revision", &out->mod_revision) || !field_int(kv, "lease", &out->lease)) {
            keel_etcd_kv_free(out);
            return snprintf(why, why_n, "a key-value of \"kvs\" is not one etcd writes"), false;
        }
        if (strlen(out->key) != key_n) { /* a key with a NUL byte: not one keel writes */
            keel_etcd_kv_free(out);
            return snprintf(why, why_n, "a key holds a NUL byte"), false;
        }
        r->n_kvs++;
    }
    return true;
}

keel_status keel_etcd_parse_reply(const char *body, size_t n, keel_etcd_reply *out, char *why, size_t why_n) {
    *out = (keel_etcd_reply){0};
    cJSON *root = cJSON_ParseWithLength(body, n);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(why, why_n, "the answer is not a JSON object");
        return KEEL_ERR_IO;
    }
    /* keepalive wraps its answer in "result"; an error is {"error": ..., "code": N, "message": ...} */
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, "result");
    if (!cJSON_IsObject(top)) top = root;
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(root, "message");
    if (!cJSON_IsString(err)) err = cJSON_GetObjectItemCaseSensitive(root, "error");
    if (cJSON_IsString(err)) snprintf(out->error, sizeof out->error, "%s", err->valuestring);
    else if (err && !cJSON_IsObject(err)) {
        cJSON_Delete(root);
        snprintf(why, why_n, "\"error\" is not text");
        return KEEL_ERR_IO;
    }
    const cJSON *header = cJSON_GetObjectItemCaseSensitive(top, "header");
    const cJSON *succeeded = cJSON_GetObjectItemCaseSensitive(top, "succeeded");
    bool ok = (!header || cJSON_IsObject(header)) && field_int(header, "revision", &out->revision) &&
              (!succeeded || cJSON_IsBool(succeeded)) && field_int(top, "deleted", &out->deleted) &&
              field_int(top, "ID", &out->lease_id) && field_int(top, "TTL", &out->ttl);
    if (!ok) snprintf(why, why_n, "a field of the answer has the wrong type");
    out->succeeded = cJSON_IsTrue(succeeded);
    if (ok) ok = parse_kvs(cJSON_GetObjectItemCaseSensitive(top, "kvs"), out, why, why_n);
    const cJSON *responses = cJSON_GetObjectItemCaseSensitive(top, "responses"), *resp;
    if (ok && responses && !cJSON_IsArray(responses)) ok = false, snprintf(why, why_n, "\"responses\" is not a list");
    if (ok && responses)
        cJSON_ArrayForEach(resp, responses) {
            const cJSON *range = cJSON_GetObjectItemCaseSensitive(resp, "response_range");
            if (range && !cJSON_IsObject(range)) ok = false, snprintf(why, why_n, "a response_range is not an object");
            if (ok && range) ok = parse_kvs(cJSON_GetObjectItemCaseSensitive(range, "kvs"), out, why, why_n);
            if (!ok) break;
        }
    cJSON_Delete(root);
    if (!ok) keel_etcd_reply_free(out);
    return ok ? KEEL_OK : KEEL_ERR_IO;
}

void keel_etcd_kv_free(keel_etcd_kv *kv) {
    if (!kv) return;
    keel_free(kv->key);
    keel_free(kv->value);
    *kv = (keel_etcd_kv){0};
}

void keel_etcd_kvs_free(keel_etcd_kv *kvs, int n) {
    for (int i = 0; i < n; i++) keel_etcd_kv_free(&kvs[i]);
    keel_free(kvs);
}

void keel_etcd_reply_free(keel_etcd_reply *r) {
    keel_etcd_kvs_free(r->kvs, r->n_kvs);
    r->kvs = NULL;
    r->n_kvs = 0;
}
