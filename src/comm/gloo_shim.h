/* comm/gloo_shim.h: the C face of the C++ shim over Gloo (gloo_shim.cc):
 * connect this rank to the others through a store, then exchange bytes with
 * any of them. Gloo has no C API; this is all of it keel uses. Comm thread
 * only. Every call that fails writes one line into err and says so in its
 * result: it never throws, and it never ends the process. */
#ifndef KEEL_COMM_GLOO_SHIM_H
#define KEEL_COMM_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_gloo keel_gloo;

/* A store of keel's (comm/gloo.c: etcd's): set returns 0 or -1; get copies
 * the value into buf (cap bytes) and returns 1 with *n its length (> cap:
 * call again with room for *n), 0 when the key does not exist yet, -1 when
 * the store failed (it said why on stderr). */
typedef struct {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *data, size_t n);
    int (*get)(void *ctx, const char *key, void *buf, size_t cap, size_t *n);
} keel_gloo_store;

/* A full mesh of TCP connections between `size` ranks, rank `rank` here,
 * whose addresses meet in a store — the file store in directory `store_dir`
 * (one every rank sees) when `store` is NULL — under `prefix` (one per
 * attempt: a key of an earlier attempt is never read). This rank listens on
 * `host`'s address (a name or an address; NULL: this machine's host name).
 * Waits at most connect_s seconds for the others. */
keel_gloo *keel_gloo_connect(const keel_gloo_store *store, const char *store_dir, const char *prefix,
                             const char *host, int rank, int size, double connect_s, char *err, size_t err_n);
/* Sends send_bytes to world rank dest while recv_bytes come from world rank
 * source (-1: nothing that way); both done on return. Messages with the same
 * slot between two ranks arrive in the order they were sent. -1, or the
 * world rank whose connection failed with err (it closed: the peer died, or
 * its host went away). */
int keel_gloo_exchange(keel_gloo *g, const void *send, size_t send_bytes, int dest, void *recv, size_t recv_bytes,
                       int source, uint64_t slot, char *err, size_t err_n);
void keel_gloo_close(keel_gloo *g);

#ifdef __cplusplus
}
#endif

#endif
