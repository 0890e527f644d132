/* comm/gloo.c: the Gloo transport, for ranks that no MPI launcher started
 * (keel agent's workers, keel train --launcher local): each learns its place
 * from KEEL_RANK and KEEL_WORLD_SIZE and finds the others through the store
 * KEEL_STORE names (gloo_shim.h). Gloo moves bytes between two ranks; the
 * collectives are keel's own rings over that (ring.c), so a result is bitwise
 * the MPI transport's for the same group. A group is a list of world ranks on
 * the one full mesh, and its messages carry a slot made of the group's tag
 * and its operation count, so two groups never read each other's bytes.
 * Comm thread only. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/gloo_shim.h"
#include "keel/etcd.h"
#include "queue.h"

/* A rank that waits longer than this for the others to connect gives up
 * (the trainer's start-up deadline is usually the shorter). */
#define CONNECT_S 600.0

/* Message streams inside one operation: the ring's two, the barrier's. */
enum { STREAM_RING_0 = 0, STREAM_RING_1 = 1, STREAM_BARRIER = 2 };

static _Noreturn void lost(engine *eng, int rank, const char *why) {
    keel_errorf("comm: lost rank %d (%s): it died or its host went away; this rank ends the attempt (exit %d)", rank,
                why, KEEL_EXIT_PEER_LOST);
    comm_end_lost(eng);
}

static void gloo_exchange(keel_comm *c, const void *send, size_t send_bytes, int dest, void *recv, size_t recv_bytes,
                          int source, int tag) {
    if (dest >= 0 && dest == c->rank) { /* to itself (Gloo has no pair for that): then from itself too */
        KEEL_CHECK(source == c->rank && recv_bytes == send_bytes, "a rank sends to itself but receives otherwise");
        memmove(recv, send, send_bytes);
        return;
    }
    uint64_t slot = (c->tag << 34) | ((c->ops & 0xffffffffu) << 2) | (uint64_t)tag;
    char err[512];
    int failed = keel_gloo_exchange(c->eng->gloo, send, send_bytes, dest >= 0 ? c->members[dest] : -1, recv,
                                    recv_bytes, source >= 0 ? c->members[source] : -1, slot, err, sizeof err);
    if (failed >= 0) lost(c->eng, failed, err);
}

/* A dissemination barrier: in round k every rank tells rank + 2^k it has
 * arrived and hears it from rank - 2^k; Gloo's waits sleep. Every operation
 * starts here, so this is where the group's operation count moves. */
static void gloo_await_peers(keel_comm *c) {
    c->ops++;
    char mark = 1, got;
    for (int k = 1; k < c->size; k *= 2)
        gloo_exchange(c, &mark, 1, (c->rank + k) % c->size, &got, 1, (c->rank - k + c->size) % c->size,
                      STREAM_BARRIER);
}

/* From the root along the ring, a segment at a time: rank root+1 passes
 * segment i on while segment i+1 comes (messages of a pair arrive in order). */
static void gloo_broadcast(engine *eng, const keel_comm_req *req) {
    (void)eng;
    keel_comm *c = req->comm;
    int p = c->size, v = (c->rank - req->root + p) % p, next = (c->rank + 1) % p, prev = (c->rank + p - 1) % p;
    size_t bytes = req->count * keel_comm_dtype_size(req->dtype), seg = RING_SEGMENT_BYTES;
    size_t n_seg = (bytes + seg - 1) / seg;
    char *buf = req->recv;
    if (p == 1) return;
    for (size_t i = 0; i <= n_seg; i++) {
        /* at step i: the root sends segment i, a middle rank forwards i-1 and takes i, the last takes i */
        size_t s = v == 0 ? i : i - 1, r = i;
        bool sending = v < p - 1 && (v == 0 ? i < n_seg : i >= 1), taking = v > 0 && i < n_seg;
        size_t s_len = sending ? (bytes - s * seg < seg ? bytes - s * seg : seg) : 0;
        size_t r_len = taking ? (bytes - r * seg < seg ? bytes - r * seg : seg) : 0;
        if (sending || taking)
            gloo_exchange(c, buf + (sending ? s * seg : 0), s_len, sending ? next : -1, buf + (taking ? r * seg : 0),
                          r_len, taking ? prev : -1, STREAM_RING_0);
    }
}

/* Ranks of the same color, ordered by (key, parent rank): every rank learns
 * every rank's (color, key) by an all-gather on the parent. */
static void gloo_split(keel_comm *parent, int color, int key, keel_comm *child) {
    int32_t mine[2] = {color, key}, *all = keel_xmalloc(sizeof(int32_t) * 2 * (size_t)parent->size, "split");
    gloo_await_peers(parent);
    keel_comm_req req = {.kind = OP_ALLGATHER, .comm = parent, .send = mine, .recv = all, .count = 1,
                         .dtype = KEEL_COMM_F64};
    ring_allgather_blocks(parent->eng, &req);
    int n = 0;
    child->members = keel_xmalloc(sizeof(int) * (size_t)parent->size, "group members");
    for (int k = 0; k < parent->size; k++) {
        if (all[2 * k] != color) continue;
        int at = n++; /* insertion by (key, parent rank): parent ranks come in order */
        while (at > 0 && all[2 * child->members[at - 1] + 1] > all[2 * k + 1]) {
            child->members[at] = child->members[at - 1];
            at--;
        }
        child->members[at] = k;
    }
    for (int i = 0; i < n; i++) {
        if (child->members[i] == parent->rank) child->rank = i;
        child->members[i] = parent->members[child->members[i]];
    }
    child->size = n;
    /* the tag names the group by its parent and color; 30 bits (the slot's top) */
    child->tag = (keel_hash64(parent->tag * 0x9e3779b97f4a7c15ull + (uint64_t)color + 1) & 0x3fffffffu) | 1;
    child->ops = 0;
    keel_free(all);
}

static void gloo_free_group(keel_comm *c) {
    keel_free(c->members);
    c->members = NULL;
}

static void gloo_allgather(engine *eng, const keel_comm_req *req) { ring_allgather_blocks(eng, req); }

/* The etcd store: keys under the agent's prefix, as etcd keys. */
static int etcd_set(void *ctx, const char *key, const void *data, size_t n) {
    return keel_etcd_put(ctx, key, data, n, 0) == KEEL_OK ? 0 : -1;
}

static int etcd_get(void *ctx, const char *key, void *buf, size_t cap, size_t *n) {
    keel_etcd_kv kv;
    bool found;
    if (keel_etcd_get(ctx, key, &kv, &found) != KEEL_OK) return -1;
    if (!found) return 0;
    *n = kv.value_len;
    if (kv.value_len <= cap) memcpy(buf, kv.value, kv.value_len);
    keel_etcd_kv_free(&kv);
    return 1;
}

/* An integer environment variable in [lo, hi], or -1 with the error line. */
static int env_int(const char *name, int lo, int hi) {
    const char *v = getenv(name);
    char *end;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || n < lo || n > hi) {
        keel_errorf("KEEL_TRANSPORT=gloo: %s=\"%s\" is %s: set it to a number from %d to %d (keel agent and "
                    "keel train --launcher local set it for the ranks they start)", name, v ? v : "",
                    v ? "not a number in range" : "not set", lo, hi);
        return -1;
    }
    return (int)n;
}

/* The ranks of this machine: those whose host name is this one's. */
static void find_local(engine *eng) {
    keel_comm *w = eng->world;
    char(*names)[64] = keel_xcalloc((size_t)w->size * sizeof *names, "host names");
    char mine[64] = {0};
    gethostname(mine, sizeof mine - 1);
    gloo_await_peers(w);
    keel_comm_req req = {.kind = OP_ALLGATHER, .comm = w, .send = mine, .recv = names, .count = 8,
                         .dtype = KEEL_COMM_F64};
    ring_allgather_blocks(eng, &req);
    eng->local_size = eng->local_rank = 0;
    for (int r = 0; r < w->size; r++)
        if (!strncmp(names[r], mine, sizeof mine)) eng->local_rank += r < w->rank, eng->local_size++;
    keel_free(names);
}

static keel_status gloo_start(engine *eng) {
    keel_comm *w = eng->world;
    const char *store = getenv("KEEL_STORE"), *prefix = getenv("KEEL_STORE_PREFIX");
    int size = env_int("KEEL_WORLD_SIZE", 1, 1 << 20);
    int rank = size < 1 ? -1 : env_int("KEEL_RANK", 0, size - 1);
    if (rank < 0) return KEEL_ERR_INPUT;
    bool etcd = store && !strncmp(store, "etcd://", 7);
    if (!store || !(etcd || !strncmp(store, "file:", 5)) || !store[etcd ? 7 : 5]) {
        keel_errorf("KEEL_TRANSPORT=gloo: KEEL_STORE=\"%s\" is not a store: give file:DIR, a directory every rank "
                    "sees, or etcd://HOST:PORT", store ? store : "");
        return KEEL_ERR_INPUT;
    }
    keel_etcd *client = NULL;
    if (etcd) {
        keel_status st = keel_etcd_open(store + 7, CONNECT_S, &client);
        if (st != KEEL_OK) return st;
    }
    keel_gloo_store callbacks = {.ctx = client, .set = etcd_set, .get = etcd_get};
    char err[512];
    eng->gloo = keel_gloo_connect(etcd ? &callbacks : NULL, store + 5, prefix && *prefix ? prefix : "keel",
                                  getenv("KEEL_HOST"), rank, size, CONNECT_S, err, sizeof err);
    keel_etcd_close(client); /* the store is for meeting: once connected, Gloo's pairs are all */
    if (!eng->gloo) {
        keel_errorf("rank %d of %d could not reach the others through %s: %s", rank, size, store, err);
        return KEEL_ERR_IO;
    }
    w->rank = rank, w->size = size, w->tag = 0, w->ops = 0;
    w->members = keel_xmalloc(sizeof(int) * (size_t)size, "world members");
    for (int r = 0; r < size; r++) w->members[r] = r;
    find_local(eng);
    return KEEL_OK;
}

static void gloo_stop(engine *eng) {
    keel_gloo_close(eng->gloo);
    eng->gloo = NULL;
    gloo_free_group(eng->world);
}

const transport keel_transport_gloo = {
    .name = "gloo",
    .start = gloo_start,
    .stop = gloo_stop,
    .split = gloo_split,
    .free_group = gloo_free_group,
    .await_peers = gloo_await_peers,
    .exchange = gloo_exchange,
    .allgather = gloo_allgather,
    .broadcast = gloo_broadcast,
};
