/* comm/mpi.c: runs queued operations with OpenMPI; comm thread only. */
#include <limits.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#include "queue.h"

/* Waiting for peers: poll MPI_Test for PEER_SPIN_S (a peer that is about to
 * arrive costs no sleep latency), then sleep between polls, 10 µs at first,
 * doubling up to PEER_SLEEP_MAX_NS: a late peer then costs this rank ~1% of a
 * core instead of a whole one, and adds at most ~100 µs per barrier round. */
#define PEER_SPIN_S 20e-6
#define PEER_SLEEP_MIN_NS 10000L
#define PEER_SLEEP_MAX_NS 100000L

/* MPI counts are ints: a collective over more elements than this goes in
 * pieces (KEEL_COMM_MAX_COUNT lowers it, so tests can take that path). */
static size_t max_count(void) {
    static size_t cached;
    if (!cached) {
        const char *env = getenv("KEEL_COMM_MAX_COUNT");
        long long v = env ? atoll(env) : 0;
        cached = v > 0 && v < INT_MAX ? (size_t)v : (size_t)INT_MAX;
    }
    return cached;
}

/* ---- start / stop ------------------------------------------------------------ */

keel_status backend_start(engine *eng) {
    int provided = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        keel_errorf("MPI_Init_thread failed");
        return KEEL_ERR_IO;
    }
    if (provided < MPI_THREAD_FUNNELED) {
        keel_errorf("MPI gives thread level %d, keel's comm thread needs MPI_THREAD_FUNNELED",
                    provided);
        MPI_Finalize();
        return KEEL_ERR_IO;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &eng->world_dup);
    MPI_Comm_rank(eng->world_dup, &eng->world_rank);
    MPI_Comm_size(eng->world_dup, &eng->world_size);
    /* the ranks that share this machine's memory and cores, whatever the launcher */
    MPI_Comm node;
    MPI_Comm_split_type(eng->world_dup, MPI_COMM_TYPE_SHARED, eng->world_rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &eng->local_size);
    MPI_Comm_rank(node, &eng->local_rank);
    MPI_Comm_free(&node);
    for (int i = 0; i < 2; i++)
        eng->ring_scratch[i] = keel_xmalloc(RING_SEGMENT_BYTES, "ring scratch segment");
    /* nanosleep(10 µs) would otherwise sleep 60 µs: the default slack is 50 µs. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    return KEEL_OK;
}

void backend_stop(engine *eng) {
    for (int i = 0; i < 2; i++) keel_free(eng->ring_scratch[i]);
    MPI_Comm_free(&eng->world_dup);
    MPI_Finalize();
}

/* ---- one operation ----------------------------------------------------------- */

static MPI_Datatype mpi_type(keel_comm_dtype dtype) {
    switch (dtype) {
    case KEEL_COMM_F32: return MPI_FLOAT;
    case KEEL_COMM_BF16: return MPI_UINT16_T;
    case KEEL_COMM_F64: return MPI_DOUBLE;
    }
    KEEL_CHECK(false, "unknown dtype %d", (int)dtype);
}

/* Returns once every rank of comm has reached this point, mostly asleep. */
static void await_peers(MPI_Comm comm, int size) {
    if (size == 1) return;
    MPI_Request barrier;
    MPI_Ibarrier(comm, &barrier);
    int arrived = 0;
    double t0 = keel_now_s();
    while (!arrived && keel_now_s() - t0 < PEER_SPIN_S)
        MPI_Test(&barrier, &arrived, MPI_STATUS_IGNORE);
    long sleep_ns = PEER_SLEEP_MIN_NS;
    while (!arrived) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = sleep_ns};
        nanosleep(&ts, NULL);
        sleep_ns = sleep_ns * 2 < PEER_SLEEP_MAX_NS ? sleep_ns * 2 : PEER_SLEEP_MAX_NS;
        MPI_Test(&barrier, &arrived, MPI_STATUS_IGNORE);
    }
}

/* Every rank's `count` elements into recv, rank after rank, in pieces of at
 * most max_count() elements: piece k of each rank's block lands at stride
 * `count` through a datatype resized to that stride (MPI_Aint: 64-bit). */
static void allgather(const keel_comm_req *req, MPI_Datatype type) {
    keel_comm *c = req->comm;
    size_t esize = keel_comm_dtype_size(req->dtype), count = req->count, piece_max = max_count();
    const char *own = (const char *)req->recv + (size_t)c->rank * count * esize;
    bool in_place = req->send == own;
    for (size_t lo = 0; lo < count; lo += piece_max) {
        int n = (int)(count - lo < piece_max ? count - lo : piece_max);
        MPI_Datatype piece, strided;
        MPI_Type_contiguous(n, type, &piece);
        MPI_Type_create_resized(piece, 0, (MPI_Aint)(count * esize), &strided);
        MPI_Type_commit(&strided);
        const void *send = in_place ? MPI_IN_PLACE : (const char *)req->send + lo * esize;
        MPI_Allgather(send, n, type, (char *)req->recv + lo * esize, 1, strided, c->mpi);
        MPI_Type_free(&strided);
        MPI_Type_free(&piece);
    }
}

static void broadcast(const keel_comm_req *req, MPI_Datatype type) {
    size_t esize = keel_comm_dtype_size(req->dtype), piece_max = max_count();
    for (size_t lo = 0; lo < req->count; lo += piece_max) {
        int n = (int)(req->count - lo < piece_max ? req->count - lo : piece_max);
        MPI_Bcast((char *)req->recv + lo * esize, n, type, req->root, req->comm->mpi);
    }
}

/* send (count) to dest while recv (count) comes from source, in pieces; -1: that side is empty. */
static void sendrecv(const keel_comm_req *req, MPI_Datatype type) {
    size_t esize = keel_comm_dtype_size(req->dtype), piece_max = max_count();
    int dest = req->dest >= 0 ? req->dest : MPI_PROC_NULL, source = req->source >= 0 ? req->source : MPI_PROC_NULL;
    for (size_t lo = 0; lo < req->count; lo += piece_max) {
        int n = (int)(req->count - lo < piece_max ? req->count - lo : piece_max);
        /* an empty side sends or receives 0 elements: OpenMPI refuses a NULL buffer with a count */
        MPI_Sendrecv(req->send ? (const char *)req->send + lo * esize : NULL, req->send ? n : 0, type, dest, 0,
                     req->recv ? (char *)req->recv + lo * esize : NULL, req->recv ? n : 0, type, source, 0,
                     req->comm->mpi, MPI_STATUS_IGNORE);
    }
}

static void transfer(engine *eng, keel_comm_req *req) {
    keel_comm *c = req->comm;
    MPI_Datatype type = mpi_type(req->dtype);
    switch (req->kind) {
    case OP_ALLGATHER: allgather(req, type); break;
    case OP_REDUCE_SCATTER: /* ring.c says why not MPI's */
        ring_reduce_scatter(eng->ring_scratch, c->mpi, c->rank, c->size, req->send, req->recv,
                            req->count, req->dtype, req->op);
        break;
    case OP_ALLREDUCE:
        ring_allreduce(eng->ring_scratch, c->mpi, c->rank, c->size, req->send, req->recv,
                       req->count, req->dtype, req->op);
        break;
    case OP_BROADCAST: broadcast(req, type); break;
    case OP_SENDRECV: sendrecv(req, type); break;
    case OP_BARRIER: break; /* await_peers was the barrier */
    case OP_SPLIT:
    case OP_FREE: KEEL_CHECK(false, "group operation %d reached transfer()", (int)req->kind);
    }
}

/* The local array an operation reads or writes, in bytes. */
static uint64_t payload_bytes(const keel_comm_req *req) {
    uint64_t bytes = (uint64_t)req->count * keel_comm_dtype_size(req->dtype);
    if (req->kind == OP_ALLGATHER || req->kind == OP_REDUCE_SCATTER)
        bytes *= (uint64_t)req->comm->size;
    if (req->kind == OP_SENDRECV) bytes *= (uint64_t)(req->dest >= 0) + (req->source >= 0);
    return req->kind == OP_BARRIER ? 0 : bytes;
}

void backend_run(engine *eng, keel_comm_req *req, keel_comm_stats *stats) {
    keel_comm *c = req->comm;
    if (req->kind == OP_SPLIT) {
        MPI_Comm_split(c->mpi, req->color, req->key, &req->child);
        MPI_Comm_rank(req->child, &req->child_rank);
        MPI_Comm_size(req->child, &req->child_size);
        return;
    }
    if (req->kind == OP_FREE) {
        MPI_Comm_free(&c->mpi);
        return;
    }
    double t0 = keel_now_s();
    await_peers(c->mpi, c->size);
    double t1 = keel_now_s();
    transfer(eng, req);
    double t2 = keel_now_s();
    stats->ops++;
    stats->bytes += payload_bytes(req);
    stats->peer_wait_s += t1 - t0;
    stats->transfer_s += t2 - t1;
}
