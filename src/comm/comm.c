/* comm/comm.c: the public comm API — a FIFO of operations that one comm thread
 * per process executes in issue order (see include/keel/comm.h for why) over
 * the transport the launcher implies. */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue.h"

/* MPI_Init may run once per process, so may keel_comm_init. */
static atomic_bool g_initialised;

void keel_comm_on_peer_lost(keel_comm *c, void (*fn)(void *ctx), void *ctx) {
    pthread_mutex_lock(&c->eng->mu); /* the comm thread reads it under the same lock */
    c->eng->on_lost = fn, c->eng->on_lost_ctx = ctx;
    pthread_mutex_unlock(&c->eng->mu);
}

/* ---- one operation, on any transport ---------------------------------------- */

/* send (count) to dest while recv (count) comes from source, in pieces of at
 * most comm_max_count() elements and 1 GiB; -1: that side is empty. */
static void sendrecv(const keel_comm_req *req) {
    size_t esize = keel_comm_dtype_size(req->dtype), piece_max = comm_max_count();
    if (piece_max > ((size_t)1 << 30) / esize) piece_max = ((size_t)1 << 30) / esize;
    for (size_t lo = 0; lo < req->count; lo += piece_max) {
        size_t n = req->count - lo < piece_max ? req->count - lo : piece_max;
        req->comm->eng->tp->exchange(req->comm, req->send ? (const char *)req->send + lo * esize : NULL, n * esize,
                                     req->dest, req->recv ? (char *)req->recv + lo * esize : NULL, n * esize,
                                     req->source, 0);
    }
}

static void transfer(engine *eng, keel_comm_req *req) {
    keel_comm *c = req->comm;
    switch (req->kind) {
    case OP_ALLGATHER: eng->tp->allgather(eng, req); break;
    case OP_REDUCE_SCATTER: /* ring.c says why not MPI's */
        ring_reduce_scatter(eng->ring_scratch, c, req->send, req->recv, req->count, req->dtype, req->op);
        break;
    case OP_ALLREDUCE:
        ring_allreduce(eng->ring_scratch, c, req->send, req->recv, req->count, req->dtype, req->op);
        break;
    case OP_BROADCAST: eng->tp->broadcast(eng, req); break;
    case OP_SENDRECV: sendrecv(req); break;
    case OP_WINDOW_REDUCE_SCATTER: req->run(eng, req); break;
    case OP_BARRIER: break; /* await_peers was the barrier */
    case OP_SPLIT:
    case OP_FREE: KEEL_CHECK(false, "group operation %d reached transfer()", (int)req->kind);
    }
}

/* The local array an operation reads or writes, in bytes. */
static uint64_t payload_bytes(const keel_comm_req *req) {
    uint64_t bytes = (uint64_t)req->count * keel_comm_dtype_size(req->dtype);
    if (req->kind == OP_ALLGATHER || req->kind == OP_REDUCE_SCATTER || req->kind == OP_WINDOW_REDUCE_SCATTER)
        bytes *= (uint64_t)req->comm->size;
    if (req->kind == OP_SENDRECV) bytes *= (uint64_t)(req->dest >= 0) + (req->source >= 0);
    return req->kind == OP_BARRIER ? 0 : bytes;
}

/* The calling thread's CPU time: where the comm thread shares cores with the
 * compute, its wall time counts the moments it was not running too. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_op(engine *eng, keel_comm_req *req, keel_comm_stats *stats) {
    keel_comm *c = req->comm;
    if (req->kind == OP_SPLIT) {
        eng->tp->split(c, req->color, req->key, req->child);
        return;
    }
    if (req->kind == OP_FREE) {
        eng->tp->free_group(c);
        return;
    }
    double t0 = keel_now_s(), cpu0 = thread_cpu_s();
    if (req->kind != OP_WINDOW_REDUCE_SCATTER) eng->tp->await_peers(c); /* a window's counters are its own */
    double t1 = keel_now_s();
    transfer(eng, req);
    double t2 = keel_now_s();
    stats->ops++;
    stats->bytes += payload_bytes(req);
    stats->peer_wait_s += t1 - t0;
    stats->transfer_s += t2 - t1;
    stats->cpu_s += thread_cpu_s() - cpu0;
}

/* ---- the comm thread ------------------------------------------------------ */

static void *comm_thread(void *arg) {
    engine *eng = arg;
    keel_block_async_signals();
    keel_status st = eng->tp->start(eng);
    pthread_mutex_lock(&eng->mu);
    eng->start_status = st;
    eng->started = true;
    pthread_cond_broadcast(&eng->done_cv);
    pthread_mutex_unlock(&eng->mu);
    if (st != KEEL_OK) return NULL;

    pthread_mutex_lock(&eng->mu);
    for (;;) {
        while (!eng->head && !eng->stop) pthread_cond_wait(&eng->work_cv, &eng->mu);
        if (!eng->head) break; /* stop, and the queue is drained */
        keel_comm_req *req = eng->head;
        eng->head = req->next;
        if (!eng->head) eng->tail = NULL;
        eng->stats.running = req->seq;
        pthread_mutex_unlock(&eng->mu);

        keel_comm_stats add = {0}; /* what this operation adds to the counters */
        run_op(eng, req, &add);

        pthread_mutex_lock(&eng->mu);
        eng->stats.ops += add.ops;
        eng->stats.bytes += add.bytes;
        eng->stats.transfer_s += add.transfer_s;
        eng->stats.peer_wait_s += add.peer_wait_s;
        eng->stats.cpu_s += add.cpu_s;
        eng->stats.running = 0;
        req->done = true;
        pthread_cond_broadcast(&eng->done_cv);
    }
    pthread_mutex_unlock(&eng->mu);
    eng->tp->stop(eng);
    return NULL;
}

/* ---- queue ---------------------------------------------------------------- */

static void submit(keel_comm_req *req) {
    engine *eng = req->comm->eng;
    req->done = false;
    req->next = NULL;
    pthread_mutex_lock(&eng->mu);
    KEEL_CHECK(!eng->stop, "operation issued after keel_comm_finalize");
    req->comm->outstanding++;
    req->seq = ++eng->stats.issued;
    if (eng->tail) eng->tail->next = req;
    else eng->head = req;
    eng->tail = req;
    pthread_cond_signal(&eng->work_cv);
    pthread_mutex_unlock(&eng->mu);
}

static void wait_done(keel_comm_req *req) {
    engine *eng = req->comm->eng;
    pthread_mutex_lock(&eng->mu);
    if (!req->done) eng->stats.waiting = req->seq;
    while (!req->done) pthread_cond_wait(&eng->done_cv, &eng->mu);
    eng->stats.waiting = 0;
    KEEL_CHECK(req->comm->outstanding > 0, "request waited twice");
    req->comm->outstanding--;
    pthread_mutex_unlock(&eng->mu);
}

/* Blocking forms run the request from the caller's stack; i-forms hand a heap
 * copy to the caller. */
static keel_status run_blocking(keel_comm_req *req) {
    submit(req);
    wait_done(req);
    return KEEL_OK;
}

keel_status comm_run_async(keel_comm_req req, keel_comm_req **out) {
    KEEL_CHECK(out, "NULL request pointer");
    keel_comm_req *heap = keel_xmalloc(sizeof *heap, "comm request");
    *heap = req;
    submit(heap);
    *out = heap;
    return KEEL_OK;
}

keel_status keel_comm_wait(keel_comm_req *req) {
    KEEL_CHECK(req, "NULL request");
    wait_done(req);
    keel_free(req);
    return KEEL_OK;
}

keel_status keel_comm_test(keel_comm_req *req, bool *done) {
    KEEL_CHECK(req && done, "NULL argument");
    engine *eng = req->comm->eng;
    pthread_mutex_lock(&eng->mu);
    *done = req->done;
    pthread_mutex_unlock(&eng->mu);
    return KEEL_OK;
}

/* ---- world and groups ----------------------------------------------------- */

/* KEEL_TRANSPORT: "gloo" for ranks started on their own (keel agent, keel
 * train --launcher local), else MPI's launcher started them. */
static const transport *chosen_transport(void) {
    const char *t = getenv("KEEL_TRANSPORT");
    return t && !strcmp(t, "gloo") ? &keel_transport_gloo : &keel_transport_mpi;
}

const char *keel_comm_transport(void) { return chosen_transport()->name; }

static void engine_free(engine *eng) {
    for (int i = 0; i < 2; i++) keel_free(eng->ring_scratch[i]);
    keel_free(eng->world);
    keel_free(eng);
}

keel_status keel_comm_init(keel_comm **world) {
    KEEL_CHECK(world, "NULL world pointer");
    KEEL_CHECK(!atomic_exchange(&g_initialised, true), "keel_comm_init called twice");
    const char *t = getenv("KEEL_TRANSPORT");
    if (t && strcmp(t, "gloo") && strcmp(t, "mpi")) {
        keel_errorf("KEEL_TRANSPORT=\"%s\" is not a transport: use mpi (ranks started by mpirun or srun) or gloo "
                    "(ranks started on their own, with KEEL_RANK, KEEL_WORLD_SIZE and KEEL_STORE)", t);
        return KEEL_ERR_INPUT;
    }
    engine *eng = keel_xcalloc(sizeof *eng, "comm engine");
    eng->tp = chosen_transport();
    eng->world = keel_xcalloc(sizeof *eng->world, "comm group");
    *eng->world = (keel_comm){.eng = eng, .is_world = true};
    for (int i = 0; i < 2; i++) eng->ring_scratch[i] = keel_xmalloc(RING_SEGMENT_BYTES, "ring scratch segment");
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->work_cv, NULL);
    pthread_cond_init(&eng->done_cv, NULL);
    if (pthread_create(&eng->thread, NULL, comm_thread, eng) != 0) {
        keel_errorf("cannot start the comm thread");
        engine_free(eng);
        return KEEL_ERR_IO;
    }
    pthread_mutex_lock(&eng->mu);
    while (!eng->started) pthread_cond_wait(&eng->done_cv, &eng->mu);
    keel_status st = eng->start_status;
    pthread_mutex_unlock(&eng->mu);
    if (st != KEEL_OK) {
        pthread_join(eng->thread, NULL);
        engine_free(eng);
        return st;
    }
    *world = eng->world;
    return KEEL_OK;
}

keel_status keel_comm_finalize(keel_comm *world) {
    KEEL_CHECK(world && world->is_world, "keel_comm_finalize takes the world group");
    engine *eng = world->eng;
    pthread_mutex_lock(&eng->mu);
    KEEL_CHECK(eng->live_groups == 0, "%d groups not freed before finalize", eng->live_groups);
    KEEL_CHECK(world->outstanding == 0, "%d world requests never waited", world->outstanding);
    eng->stop = true;
    pthread_cond_signal(&eng->work_cv);
    pthread_mutex_unlock(&eng->mu);
    pthread_join(eng->thread, NULL);
    pthread_cond_destroy(&eng->done_cv);
    pthread_cond_destroy(&eng->work_cv);
    pthread_mutex_destroy(&eng->mu);
    engine_free(eng);
    return KEEL_OK;
}

int keel_comm_rank(const keel_comm *c) { return c->rank; }
int keel_comm_size(const keel_comm *c) { return c->size; }
int keel_comm_local_size(const keel_comm *c) { return c->eng->local_size; }
int keel_comm_local_rank(const keel_comm *c) { return c->eng->local_rank; }

keel_status keel_comm_split(keel_comm *parent, int color, int key, keel_comm **child) {
    KEEL_CHECK(parent && child, "NULL argument");
    KEEL_CHECK(color >= 0, "split color %d must be >= 0", color);
    keel_comm *c = keel_xcalloc(sizeof *c, "comm group");
    c->eng = parent->eng;
    keel_comm_req req = {.kind = OP_SPLIT, .comm = parent, .color = color, .key = key, .child = c};
    run_blocking(&req);
    pthread_mutex_lock(&parent->eng->mu);
    parent->eng->live_groups++;
    pthread_mutex_unlock(&parent->eng->mu);
    *child = c;
    return KEEL_OK;
}

keel_status keel_comm_free(keel_comm *c) {
    if (!c) return KEEL_OK;
    KEEL_CHECK(!c->is_world, "free the world with keel_comm_finalize");
    engine *eng = c->eng;
    pthread_mutex_lock(&eng->mu);
    KEEL_CHECK(c->outstanding == 0, "group freed with %d requests never waited", c->outstanding);
    pthread_mutex_unlock(&eng->mu);
    keel_comm_req req = {.kind = OP_FREE, .comm = c};
    run_blocking(&req);
    pthread_mutex_lock(&eng->mu);
    eng->live_groups--;
    pthread_mutex_unlock(&eng->mu);
    keel_free(c);
    return KEEL_OK;
}

/* ---- collectives ---------------------------------------------------------- */

static void check_dtype_op(keel_comm_dtype dtype, keel_comm_op op) {
    KEEL_CHECK(dtype == KEEL_COMM_F32 || dtype == KEEL_COMM_BF16 || dtype == KEEL_COMM_F64,
               "unknown dtype %d", (int)dtype);
    KEEL_CHECK(op == KEEL_COMM_SUM || op == KEEL_COMM_MAX, "unknown reduction %d", (int)op);
}

/* MPI counts are ints: the number of elements one MPI call names must fit
 * (the same limit on every transport: a program runs on either). */
static void check_count(size_t count) {
    KEEL_CHECK(count <= (size_t)INT32_MAX, "%zu elements exceed MPI's int count", count);
}

static bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

static keel_comm_req allgather_req(keel_comm *c, const void *send, void *recv, size_t count,
                                   keel_comm_dtype dtype) {
    KEEL_CHECK(c && send && recv, "NULL argument");
    check_dtype_op(dtype, KEEL_COMM_SUM);
    check_count(count);
    size_t chunk_bytes = count * keel_comm_dtype_size(dtype);
    const char *own = (const char *)recv + (size_t)c->rank * chunk_bytes;
    KEEL_CHECK(send == own || !overlap(send, chunk_bytes, recv, chunk_bytes * (size_t)c->size),
               "all-gather send overlaps recv without being the own chunk");
    return (keel_comm_req){.kind = OP_ALLGATHER, .comm = c, .send = send, .recv = recv,
                           .count = count, .dtype = dtype};
}

keel_status keel_comm_allgather(keel_comm *c, const void *send, void *recv, size_t count,
                                keel_comm_dtype dtype) {
    keel_comm_req req = allgather_req(c, send, recv, count, dtype);
    return run_blocking(&req);
}

keel_status keel_comm_iallgather(keel_comm *c, const void *send, void *recv, size_t count,
                                 keel_comm_dtype dtype, keel_comm_req **req) {
    return comm_run_async(allgather_req(c, send, recv, count, dtype), req);
}

static keel_comm_req reduce_scatter_req(keel_comm *c, const void *send, void *recv, size_t count,
                                        keel_comm_dtype dtype, keel_comm_op op) {
    KEEL_CHECK(c && send && recv, "NULL argument");
    check_dtype_op(dtype, op);
    check_count(count);
    size_t chunk_bytes = count * keel_comm_dtype_size(dtype);
    bool in_place = (const char *)recv == (const char *)send + chunk_bytes * (size_t)c->rank;
    KEEL_CHECK(in_place || !overlap(send, chunk_bytes * (size_t)c->size, recv, chunk_bytes),
               "reduce-scatter send and recv overlap (in place is recv = send + rank * count)");
    return (keel_comm_req){.kind = OP_REDUCE_SCATTER, .comm = c, .send = send, .recv = recv,
                           .count = count, .dtype = dtype, .op = op};
}

keel_status keel_comm_reduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                     keel_comm_dtype dtype, keel_comm_op op) {
    keel_comm_req req = reduce_scatter_req(c, send, recv, count, dtype, op);
    return run_blocking(&req);
}

keel_status keel_comm_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                      keel_comm_dtype dtype, keel_comm_op op, keel_comm_req **req) {
    return comm_run_async(reduce_scatter_req(c, send, recv, count, dtype, op), req);
}

static keel_comm_req allreduce_req(keel_comm *c, const void *send, void *recv, size_t count,
                                   keel_comm_dtype dtype, keel_comm_op op) {
    KEEL_CHECK(c && send && recv, "NULL argument");
    check_dtype_op(dtype, op);
    check_count(count);
    size_t bytes = count * keel_comm_dtype_size(dtype);
    KEEL_CHECK(send == recv || !overlap(send, bytes, recv, bytes),
               "all-reduce send and recv overlap without being equal");
    return (keel_comm_req){.kind = OP_ALLREDUCE, .comm = c, .send = send, .recv = recv,
                           .count = count, .dtype = dtype, .op = op};
}

keel_status keel_comm_allreduce(keel_comm *c, const void *send, void *recv, size_t count,
                                keel_comm_dtype dtype, keel_comm_op op) {
    keel_comm_req req = allreduce_req(c, send, recv, count, dtype, op);
    return run_blocking(&req);
}

keel_status keel_comm_iallreduce(keel_comm *c, const void *send, void *recv, size_t count,
                                 keel_comm_dtype dtype, keel_comm_op op, keel_comm_req **req) {
    return comm_run_async(allreduce_req(c, send, recv, count, dtype, op), req);
}

keel_status keel_comm_allreduce_scalar(keel_comm *c, double *value, keel_comm_op op) {
    return keel_comm_allreduce(c, value, value, 1, KEEL_COMM_F64, op);
}

static keel_comm_req broadcast_req(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype,
                                   int root) {
    KEEL_CHECK(c && buf, "NULL argument");
    check_dtype_op(dtype, KEEL_COMM_SUM);
    check_count(count);
    KEEL_CHECK(root >= 0 && root < c->size, "broadcast root %d not in a group of %d", root,
               c->size);
    return (keel_comm_req){.kind = OP_BROADCAST, .comm = c, .recv = buf, .count = count,
                           .dtype = dtype, .root = root};
}

keel_status keel_comm_broadcast(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype,
                                int root) {
    keel_comm_req req = broadcast_req(c, buf, count, dtype, root);
    return run_blocking(&req);
}

keel_status keel_comm_ibroadcast(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype,
                                 int root, keel_comm_req **req) {
    return comm_run_async(broadcast_req(c, buf, count, dtype, root), req);
}

static keel_comm_req sendrecv_req(keel_comm *c, const void *send, int dest, void *recv, int source,
                                  size_t count, keel_comm_dtype dtype) {
    KEEL_CHECK(c, "NULL group");
    check_dtype_op(dtype, KEEL_COMM_SUM);
    check_count(count);
    KEEL_CHECK(dest >= -1 && dest < c->size && source >= -1 && source < c->size,
               "sendrecv to %d from %d in a group of %d", dest, source, c->size);
    KEEL_CHECK((dest < 0 || send) && (source < 0 || recv), "NULL buffer");
    size_t bytes = count * keel_comm_dtype_size(dtype);
    KEEL_CHECK(dest < 0 || source < 0 || !overlap(send, bytes, recv, bytes), "sendrecv buffers overlap");
    return (keel_comm_req){.kind = OP_SENDRECV, .comm = c, .send = send, .recv = recv, .count = count,
                           .dtype = dtype, .dest = dest, .source = source};
}

keel_status keel_comm_sendrecv(keel_comm *c, const void *send, int dest, void *recv, int source, size_t count,
                               keel_comm_dtype dtype) {
    keel_comm_req req = sendrecv_req(c, send, dest, recv, source, count, dtype);
    return run_blocking(&req);
}

keel_status keel_comm_isendrecv(keel_comm *c, const void *send, int dest, void *recv, int source, size_t count,
                                keel_comm_dtype dtype, keel_comm_req **req) {
    return comm_run_async(sendrecv_req(c, send, dest, recv, source, count, dtype), req);
}

keel_status keel_comm_barrier(keel_comm *c) {
    KEEL_CHECK(c, "NULL group");
    keel_comm_req req = {.kind = OP_BARRIER, .comm = c};
    return run_blocking(&req);
}

keel_status keel_comm_ibarrier(keel_comm *c, keel_comm_req **req) {
    KEEL_CHECK(c, "NULL group");
    return comm_run_async((keel_comm_req){.kind = OP_BARRIER, .comm = c}, req);
}

void keel_comm_get_stats(const keel_comm *c, keel_comm_stats *out) {
    engine *eng = c->eng;
    pthread_mutex_lock(&eng->mu);
    *out = eng->stats;
    if (!out->running) out->running = eng->window_op; /* it runs on the caller, and waits for the same peers */
    pthread_mutex_unlock(&eng->mu);
}
