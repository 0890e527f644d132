/* etcd: a client of etcd's v3 API as JSON over HTTP (the gRPC gateway of
 * etcd 3.4+), libcurl + cJSON — where ranks and agents that no launcher
 * started meet (keel agent's rendezvous, comm's Gloo store). Keys are text;
 * values are bytes. A handle belongs to one thread.
 *
 *     keel_etcd *e;
 *     if (keel_etcd_open("10.0.0.5:2379", 30, &e) != KEEL_OK) return 2;  // one line said why
 *     int64_t lease;
 *     keel_etcd_lease_grant(e, 10, &lease);                  // gone 10 s after the last keep-alive
 *     bool mine;
 *     keel_etcd_create(e, "/keel/job/round", "0", 1, 0, &mine);   // put if absent
 *     keel_etcd_close(e);
 *
 * Every call retries an etcd that does not answer (connection refused or
 * timed out), with backoff from 0.1 s to 2 s, for the handle's retry_s; then
 * it fails with one line naming the endpoint and the fix (KEEL_ERR_IO). An
 * answer etcd gives that is not what its API promises is KEEL_ERR_IO too. */
#ifndef KEEL_ETCD_H
#define KEEL_ETCD_H

#include "keel/core.h"

typedef struct keel_etcd keel_etcd;

typedef struct {
    char *key;           /* NUL-ended */
    char *value;         /* value_len bytes, plus a NUL after them */
    size_t value_len;
    int64_t create_revision, mod_revision, lease;
} keel_etcd_kv;

/* endpoint: "host:port" or "http://host:port" (PET_RDZV_ENDPOINT's form). */
keel_status keel_etcd_open(const char *endpoint, double retry_s, keel_etcd **out);
void keel_etcd_close(keel_etcd *e);
const char *keel_etcd_endpoint(const keel_etcd *e);

/* key = value (lease 0: none). */
keel_status keel_etcd_put(keel_etcd *e, const char *key, const void *value, size_t n, int64_t lease);
/* key = value only if key does not exist; *created says which. */
keel_status keel_etcd_create(keel_etcd *e, const char *key, const void *value, size_t n, int64_t lease,
                             bool *created);
/* key = value only if its value is now `expect` (a string); *swapped says which. */
keel_status keel_etcd_swap(keel_etcd *e, const char *key, const char *expect, const char *value, bool *swapped);
/* *found = whether key exists; if so *kv is it (free with keel_etcd_kv_free). */
keel_status keel_etcd_get(keel_etcd *e, const char *key, keel_etcd_kv *kv, bool *found);
/* Every key that starts with prefix, in key order (free with keel_etcd_kvs_free). */
keel_status keel_etcd_list(keel_etcd *e, const char *prefix, keel_etcd_kv **kvs, int *n);
/* Delete every key that starts with prefix (never ""); *deleted how many (may be NULL). */
keel_status keel_etcd_delete_prefix(keel_etcd *e, const char *prefix, int64_t *deleted);

/* A lease of ttl_s seconds; its keys go when it is neither kept alive nor revoked in time. */
keel_status keel_etcd_lease_grant(keel_etcd *e, int ttl_s, int64_t *id);
/* Renew it; *alive false when it had already expired. */
keel_status keel_etcd_lease_keepalive(keel_etcd *e, int64_t id, bool *alive);
keel_status keel_etcd_lease_revoke(keel_etcd *e, int64_t id);

void keel_etcd_kv_free(keel_etcd_kv *kv);
void keel_etcd_kvs_free(keel_etcd_kv *kvs, int n);

/* ---- the wire (etcd_json.c): pure functions, fuzzed (tests/fuzz/fuzz_etcd.c) ---- */

/* What one answer of etcd's says: the fields keel reads, whichever call. */
typedef struct {
    char error[256];     /* etcd refused: its message ("" when it did not) */
    int64_t revision;    /* header.revision */
    bool succeeded;      /* a transaction's compare held */
    int64_t deleted;     /* deleterange */
    int64_t lease_id, ttl; /* lease grant / keepalive (ttl <= 0: the lease has expired) */
    keel_etcd_kv *kvs;   /* range, or a transaction's range responses */
    int n_kvs;
} keel_etcd_reply;

/* Parse an answer's body (n bytes, not NUL-ended). KEEL_ERR_IO with *why
 * when it is not one of etcd's: not JSON, a field of the wrong type, a key or
 * value that is not base64. */
keel_status keel_etcd_parse_reply(const char *body, size_t n, keel_etcd_reply *out, char *why, size_t why_n);
void keel_etcd_reply_free(keel_etcd_reply *r);
/* Standard base64 (RFC 4648, padded): out gets 4 * ((n + 2) / 3) chars and a NUL. */
void keel_base64_encode(const void *in, size_t n, char *out);
/* Decode n chars into out (room for 3 * (n / 4) bytes); false on anything
 * that is not padded standard base64. */
bool keel_base64_decode(const char *in, size_t n, void *out, size_t *out_n);

#endif
