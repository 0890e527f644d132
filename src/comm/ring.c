/* comm/ring.c: keel's own ring reduce-scatter (and all-reduce on top of it),
 * run by the comm thread over its transport's point-to-point exchange (MPI's
 * or Gloo's), and the ring all-gather that Gloo's all-gather is.
 *
 * Why not MPI_Reduce_scatter_block / MPI_Allreduce: OpenMPI 4.1's tuned
 * algorithms allocate full-size temporaries on every call and spend most of
 * their time faulting them in: 64 MB of fp32 over 2 ranks took 47-59 ms
 * (reduce-scatter, 16,386 page faults = 67 MB per call) and 35-38 ms
 * (all-reduce, 8,193 faults), where one 32 MB transfer (5 ms) plus one 32 MB
 * sum (3 ms) is all the work a 2-rank reduce-scatter has. The ring below moves the
 * bandwidth-optimal (W-1)/W of the buffer, reuses two 1 MiB scratch segments,
 * and sums each segment while it is still in cache.
 *
 * The order of the sums is fixed: chunk c is accumulated starting at rank
 * c+1 and going around the ring, ending with rank c's own values, so a given
 * group size and count give bitwise the same result on every run, and an
 * all-reduce gives bitwise the same array on every rank. */
#include <string.h>

#include "queue.h"

#define SEGMENT_BYTES RING_SEGMENT_BYTES

/* ---- element-wise out = a op b (out may alias a or b) ---------------------- */

static void combine_f32(float *out, const float *a, const float *b, size_t n, keel_comm_op op) {
    if (op == KEEL_COMM_SUM)
        for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) out[i] = a[i] > b[i] ? a[i] : b[i];
}

static void combine_f64(double *out, const double *a, const double *b, size_t n,
                        keel_comm_op op) {
    if (op == KEEL_COMM_SUM)
        for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) out[i] = a[i] > b[i] ? a[i] : b[i];
}

static void combine_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                         keel_comm_op op) {
    if (op == KEEL_COMM_SUM)
        for (size_t i = 0; i < n; i++) out[i] = keel_bf16_from_float(keel_bf16_to_float(a[i]) + keel_bf16_to_float(b[i]));
    else
        for (size_t i = 0; i < n; i++) out[i] = keel_bf16_to_float(a[i]) > keel_bf16_to_float(b[i]) ? a[i] : b[i];
}

void ring_combine(void *out, const void *a, const void *b, size_t n, keel_comm_dtype dtype, keel_comm_op op) {
    switch (dtype) {
    case KEEL_COMM_F32: combine_f32(out, a, b, n, op); return;
    case KEEL_COMM_F64: combine_f64(out, a, b, n, op); return;
    case KEEL_COMM_BF16: combine_bf16(out, a, b, n, op); return;
    }
    KEEL_CHECK(false, "unknown dtype %d", (int)dtype);
}

/* ---- the ring ----------------------------------------------------------------- */

typedef struct {
    keel_comm *comm;
    int rank, size;
    const char *src;      /* the whole input: `size` chunks of `total` elements in all */
    char *dst;            /* where this rank's reduced chunk goes */
    size_t total;         /* elements */
    size_t esize;
    keel_comm_dtype dtype;
    keel_comm_op op;
    char *scratch[2];     /* SEGMENT_BYTES each */
} ring;

/* Chunk c is elements [total*c/size, total*(c+1)/size): equal chunks when
 * size divides total (reduce-scatter), sizes differing by one otherwise. */
static size_t chunk_begin(const ring *g, int c) {
    return g->total * (size_t)c / (size_t)g->size;
}

/* Bytes of chunk c inside the segment [lo, lo + SEGMENT_BYTES) of every chunk. */
static size_t seg_len(const ring *g, int c, size_t lo) {
    size_t len = (chunk_begin(g, c + 1) - chunk_begin(g, c)) * g->esize;
    if (lo >= len) return 0;
    return len - lo < SEGMENT_BYTES ? len - lo : SEGMENT_BYTES;
}

static const char *src_at(const ring *g, int c, size_t lo) {
    return g->src + chunk_begin(g, c) * g->esize + lo;
}

/* One segment around the ring: at step s this rank sends its partial of chunk
 * r-s-1 to r+1 and receives the partial of chunk r-s-2 from r-1, adding its
 * own values; after size-1 steps the chunk it received last is its own,
 * complete. */
static void ring_segment(const ring *g, size_t lo) {
    int r = g->rank, p = g->size, next = (r + 1) % p, prev = (r + p - 1) % p;
    for (int s = 0; s < p - 1; s++) {
        int c_send = ((r - s - 1) % p + p) % p, c_recv = ((r - s - 2) % p + p) % p;
        const char *send = s == 0 ? src_at(g, c_send, lo) : g->scratch[(s + 1) % 2];
        char *recv = g->scratch[s % 2];
        size_t send_len = seg_len(g, c_send, lo), recv_len = seg_len(g, c_recv, lo);
        g->comm->eng->tp->exchange(g->comm, send, send_len, next, recv, recv_len, prev, 0);
        char *out = s == p - 2 ? g->dst + lo : recv; /* at the last step c_recv == r */
        ring_combine(out, recv, src_at(g, c_recv, lo), recv_len / g->esize, g->dtype, g->op);
    }
}

static void ring_run(const ring *g) {
    size_t own_bytes = (chunk_begin(g, g->rank + 1) - chunk_begin(g, g->rank)) * g->esize;
    if (g->size == 1) {
        if (g->dst != g->src) memmove(g->dst, g->src, own_bytes);
        return;
    }
    size_t longest = (g->total + (size_t)g->size - 1) / (size_t)g->size * g->esize;
    for (size_t lo = 0; lo < longest; lo += SEGMENT_BYTES) ring_segment(g, lo);
}

void ring_reduce_scatter(char *const scratch[2], keel_comm *c, const void *send, void *recv, size_t count,
                         keel_comm_dtype dtype, keel_comm_op op) {
    ring g = {.comm = c, .rank = c->rank, .size = c->size, .src = send, .dst = recv,
              .total = count * (size_t)c->size, .esize = keel_comm_dtype_size(dtype),
              .dtype = dtype, .op = op, .scratch = {scratch[0], scratch[1]}};
    ring_run(&g);
}

/* The all-gather half of an all-reduce, in place around the ring: at step s
 * this rank passes chunk r-s on to r+1 and takes chunk r-s-1 from r-1, in
 * messages of at most a segment (sizes are size_t; an MPI count is an int). */
static void ring_allgather(const ring *g, char *buf) {
    int r = g->rank, p = g->size, next = (r + 1) % p, prev = (r + p - 1) % p;
    /* every rank sends the same number of messages at every step (empty ones
     * where its chunk is shorter), so sends and receives pair up */
    size_t longest = (g->total + (size_t)p - 1) / (size_t)p * g->esize;
    for (int s = 0; s < p - 1; s++) {
        int c_send = ((r - s) % p + p) % p, c_recv = ((r - s - 1) % p + p) % p;
        size_t send_len = (chunk_begin(g, c_send + 1) - chunk_begin(g, c_send)) * g->esize;
        size_t recv_len = (chunk_begin(g, c_recv + 1) - chunk_begin(g, c_recv)) * g->esize;
        char *send = buf + chunk_begin(g, c_send) * g->esize, *recv = buf + chunk_begin(g, c_recv) * g->esize;
        for (size_t lo = 0; lo < longest; lo += SEGMENT_BYTES) {
            size_t n_send = lo < send_len ? (send_len - lo < SEGMENT_BYTES ? send_len - lo : SEGMENT_BYTES) : 0;
            size_t n_recv = lo < recv_len ? (recv_len - lo < SEGMENT_BYTES ? recv_len - lo : SEGMENT_BYTES) : 0;
            g->comm->eng->tp->exchange(g->comm, send + lo, n_send, next, recv + lo, n_recv, prev, 1);
        }
    }
}

/* All-reduce = ring reduce-scatter into this rank's chunk of recv (in place
 * too: a rank writes its chunk only at the last step, after its last read of
 * it), then a ring all-gather of the chunks. */
void ring_allreduce(char *const scratch[2], keel_comm *c, const void *send, void *recv, size_t count,
                    keel_comm_dtype dtype, keel_comm_op op) {
    ring g = {.comm = c, .rank = c->rank, .size = c->size, .src = send, .total = count,
              .esize = keel_comm_dtype_size(dtype), .dtype = dtype, .op = op,
              .scratch = {scratch[0], scratch[1]}};
    g.dst = (char *)recv + chunk_begin(&g, c->rank) * g.esize;
    ring_run(&g);
    if (c->size > 1) ring_allgather(&g, recv);
}

/* Rank r's block is chunk r of the whole (size * count elements: chunk c
 * begins at c * count), so the all-gather is the all-reduce's second half. */
void ring_allgather_blocks(engine *eng, const keel_comm_req *req) {
    (void)eng;
    keel_comm *c = req->comm;
    ring g = {.comm = c, .rank = c->rank, .size = c->size, .total = req->count * (size_t)c->size,
              .esize = keel_comm_dtype_size(req->dtype)};
    char *own = (char *)req->recv + (size_t)c->rank * req->count * g.esize;
    if (req->send != own) memcpy(own, req->send, req->count * g.esize);
    if (c->size > 1) ring_allgather(&g, req->recv);
}
