/* comm/etcd.c: keel/etcd.h's calls over HTTP with libcurl — one POST of a
 * JSON request per call to the v3 gateway, its answer read by etcd_json.c,
 * an etcd that does not answer retried with backoff for the handle's
 * retry_s. */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keel/etcd.h"

#define REQUEST_TIMEOUT_S 10L
#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 2.0

struct keel_etcd {
    CURL *curl;
    char endpoint[256]; /* host:port, as given without the scheme */
    char base[300];     /* http://host:port */
    double retry_s;
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

keel_status keel_etcd_open(const char *endpoint, double retry_s, keel_etcd **out) {
    *out = NULL;
    const char *hostport = strncmp(endpoint, "http://", 7) ? endpoint : endpoint + 7;
    size_t n = strlen(hostport);
    while (n > 0 && hostport[n - 1] == '/') n--;
    const char *colon = memrchr(hostport, ':', n);
    if (!strncmp(endpoint, "https://", 8) || n == 0 || n >= 256 || !colon || colon == hostport || colon == hostport + n - 1 ||
        strspn(colon + 1, "0123456789") != (size_t)(hostport + n - colon - 1) || memchr(hostport, '/', n)) {
        keel_errorf("etcd endpoint \"%s\" is not host:port (e.g. etcd-service:2379 or 10.0.0.5:2379; http:// may "
                    "lead, https is not spoken)", endpoint);
        return KEEL_ERR_INPUT;
    }
    pthread_once(&g_curl_once, curl_init_once);
    keel_etcd *e = keel_xcalloc(sizeof *e, "etcd client");
    snprintf(e->endpoint, sizeof e->endpoint, "%.*s", (int)n, hostport);
    snprintf(e->base, sizeof e->base, "http://%s", e->endpoint);
    e->retry_s = retry_s;
    if (!(e->curl = curl_easy_init())) {
        keel_free(e);
        keel_errorf("etcd: libcurl could not start");
        return KEEL_ERR_IO;
    }
    *out = e;
    return KEEL_OK;
}

void keel_etcd_close(keel_etcd *e) {
    if (!e) return;
    curl_easy_cleanup(e->curl);
    keel_free(e);
}

const char *keel_etcd_endpoint(const keel_etcd *e) { return e->endpoint; }

typedef struct {
    char *data;
    size_t n, cap;
} buffer;

static size_t on_body(char *p, size_t size, size_t count, void *arg) {
    buffer *b = arg;
    size_t n = size * count;
    if (b->n + n > ((size_t)64 << 20)) return 0; /* 64 MiB: no answer keel asks for is that large */
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->data = keel_xrealloc(b->data, b->cap, "etcd answer");
    }
    memcpy(b->data + b->n, p, n);
    b->n += n;
    return n;
}

/* POST req (consumed) to path; *reply is etcd's answer. An unreachable etcd
 * is retried until retry_s has passed. */
static keel_status call(keel_etcd *e, const char *path, cJSON *req, keel_etcd_reply *reply) {
    char *body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    char url[400];
    snprintf(url, sizeof url, "%s%s", e->base, path);
    double start = keel_now_s(), backoff = BACKOFF_MIN_S;
    keel_status st = KEEL_ERR_IO;
    for (;;) {
        buffer b = {0};
        long code = 0;
        curl_easy_reset(e->curl);
        curl_easy_setopt(e->curl, CURLOPT_URL, url);
        curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(e->curl, CURLOPT_TIMEOUT, REQUEST_TIMEOUT_S);
        curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT, 3L);
        curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e->curl, CURLOPT_PROTOCOLS_STR, "http");
        CURLcode rc = curl_easy_perform(e->curl);
        curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &code);
        if (rc == CURLE_OK) {
            char why[256];
            st = keel_etcd_parse_reply(b.data ? b.data : "", b.n, reply, why, sizeof why);
            if (st != KEEL_OK)
                keel_errorf("etcd at %s answered %s with HTTP %ld that is not etcd's v3 API (%s): is %s an etcd 3.4 "
                            "or newer?", e->endpoint, path, code, why, e->endpoint);
            else if (reply->error[0] || code != 200) {
                keel_errorf("etcd at %s refused %s (HTTP %ld): %s", e->endpoint, path, code,
                            reply->error[0] ? reply->error : "no reason given");
                keel_etcd_reply_free(reply);
                st = KEEL_ERR_IO;
            }
            keel_free(b.data);
            break;
        }
        keel_free(b.data);
        double waited = keel_now_s() - start;
        if (waited + backoff > e->retry_s) {
            keel_errorf("etcd at %s does not answer (%s) after %.0f s of retries: check the endpoint "
                        "(PET_RDZV_ENDPOINT, --rdzv-endpoint) and that etcd runs there", e->endpoint,
                        curl_easy_strerror(rc), waited);
            break;
        }
        keel_sleep_s(backoff);
        backoff = backoff * 2 < BACKOFF_MAX_S ? backoff * 2 : BACKOFF_MAX_S;
    }
    cJSON_free(body);
    return st;
}

/* ---- requests ------------------------------------------------------------------ */

static void add_b64(cJSON *obj, const char *name, const void *data, size_t n) {
    char *text = keel_xmalloc(4 * ((n + 2) / 3) + 1, "base64");
    keel_base64_encode(data, n, text);
    cJSON_AddStringToObject(obj, name, text);
    keel_free(text);
}

static void add_int(cJSON *obj, const char *name, int64_t v) {
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)v);
    cJSON_AddStringToObject(obj, name, text);
}

/* The smallest key above every key that starts with prefix: etcd's range_end. */
static void add_prefix_end(cJSON *obj, const char *prefix) {
    size_t n = strlen(prefix);
    char *end = keel_xstrdup(prefix);
    while (n > 0 && (unsigned char)end[n - 1] == 0xff) n--;
    if (n == 0) add_b64(obj, "range_end", "", 1); /* "\0": every key */
    else {
        end[n - 1]++;
        add_b64(obj, "range_end", end, n);
    }
    keel_free(end);
}

static cJSON *put_request(const char *key, const void *value, size_t n, int64_t lease) {
    cJSON *put = cJSON_CreateObject();
    add_b64(put, "key", key, strlen(key));
    add_b64(put, "value", value, n);
    if (lease) add_int(put, "lease", lease);
    return put;
}

keel_status keel_etcd_put(keel_etcd *e, const char *key, const void *value, size_t n, int64_t lease) {
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/kv/put", put_request(key, value, n, lease), &r);
    if (st == KEEL_OK) keel_etcd_reply_free(&r);
    return st;
}

/* A transaction: if compare then put (key, value, lease) else nothing. */
static keel_status txn_put(keel_etcd *e, cJSON *compare, const char *key, const void *value, size_t n, int64_t lease,
                           bool *done) {
    cJSON *req = cJSON_CreateObject(), *cmp = cJSON_AddArrayToObject(req, "compare");
    cJSON_AddItemToArray(cmp, compare);
    cJSON *success = cJSON_AddArrayToObject(req, "success"), *op = cJSON_CreateObject();
    cJSON_AddItemToObject(op, "requestPut", put_request(key, value, n, lease));
    cJSON_AddItemToArray(success, op);
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/kv/txn", req, &r);
    if (st != KEEL_OK) return st;
    *done = r.succeeded;
    keel_etcd_reply_free(&r);
    return KEEL_OK;
}

keel_status keel_etcd_create(keel_etcd *e, const char *key, const void *value, size_t n, int64_t lease,
                             bool *created) {
    cJSON *cmp = cJSON_CreateObject();
    cJSON_AddStringToObject(cmp, "target", "CREATE");
    add_b64(cmp, "key", key, strlen(key));
    add_int(cmp, "createRevision", 0);
    return txn_put(e, cmp, key, value, n, lease, created);
}

keel_status keel_etcd_swap(keel_etcd *e, const char *key, const char *expect, const char *value, bool *swapped) {
    cJSON *cmp = cJSON_CreateObject();
    cJSON_AddStringToObject(cmp, "target", "VALUE");
    cJSON_AddStringToObject(cmp, "result", "EQUAL");
    add_b64(cmp, "key", key, strlen(key));
    add_b64(cmp, "value", expect, strlen(expect));
    return txn_put(e, cmp, key, value, strlen(value), 0, swapped);
}

static keel_status range(keel_etcd *e, const char *key, bool prefix, keel_etcd_reply *r) {
    cJSON *req = cJSON_CreateObject();
    add_b64(req, "key", key, strlen(key));
    if (prefix) add_prefix_end(req, key);
    return call(e, "/v3/kv/range", req, r);
}

keel_status keel_etcd_get(keel_etcd *e, const char *key, keel_etcd_kv *kv, bool *found) {
    keel_etcd_reply r;
    keel_status st = range(e, key, false, &r);
    if (st != KEEL_OK) return st;
    *found = false;
    for (int i = 0; i < r.n_kvs && !*found; i++)
        if (!strcmp(r.kvs[i].key, key)) *kv = r.kvs[i], r.kvs[i] = (keel_etcd_kv){0}, *found = true;
    keel_etcd_reply_free(&r);
    return KEEL_OK;
}

keel_status keel_etcd_list(keel_etcd *e, const char *prefix, keel_etcd_kv **kvs, int *n) {
    keel_etcd_reply r;
    keel_status st = range(e, prefix, true, &r);
    if (st != KEEL_OK) return st;
    *kvs = r.kvs, *n = r.n_kvs;
    return KEEL_OK;
}

keel_status keel_etcd_delete_prefix(keel_etcd *e, const char *prefix, int64_t *deleted) {
    KEEL_CHECK(prefix[0], "deleting every key of etcd");
    cJSON *req = cJSON_CreateObject();
    add_b64(req, "key", prefix, strlen(prefix));
    add_prefix_end(req, prefix);
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/kv/deleterange", req, &r);
    if (st != KEEL_OK) return st;
    if (deleted) *deleted = r.deleted;
    keel_etcd_reply_free(&r);
    return KEEL_OK;
}

keel_status keel_etcd_lease_grant(keel_etcd *e, int ttl_s, int64_t *id) {
    cJSON *req = cJSON_CreateObject();
    cJSON_AddNumberToObject(req, "TTL", ttl_s);
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/lease/grant", req, &r);
    if (st != KEEL_OK) return st;
    *id = r.lease_id;
    keel_etcd_reply_free(&r);
    if (*id) return KEEL_OK;
    keel_errorf("etcd at %s granted a lease without an ID", e->endpoint);
    return KEEL_ERR_IO;
}

keel_status keel_etcd_lease_keepalive(keel_etcd *e, int64_t id, bool *alive) {
    cJSON *req = cJSON_CreateObject();
    add_int(req, "ID", id);
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/lease/keepalive", req, &r);
    if (st != KEEL_OK) return st;
    *alive = r.ttl > 0;
    keel_etcd_reply_free(&r);
    return KEEL_OK;
}

keel_status keel_etcd_lease_revoke(keel_etcd *e, int64_t id) {
    cJSON *req = cJSON_CreateObject();
    add_int(req, "ID", id);
    keel_etcd_reply r;
    keel_status st = call(e, "/v3/lease/revoke", req, &r);
    if (st == KEEL_OK) keel_etcd_reply_free(&r);
    return st;
}
