/* dist/mpi_backend.c: runs queued operations with OpenMPI; comm thread only. */
#include <sys/prctl.h>
#include <time.h>

#include "comm_internal.h"

/* Waiting for peers: poll MPI_Test for PEER_SPIN_S (a peer that is about to
 * arrive costs no sleep latency), then sleep between polls, 10 µs at first,
 * doubling up to PEER_SLEEP_MAX_NS: a late peer then costs this rank ~1% of a
 * core instead of a whole one, and adds at most ~100 µs per barrier round. */
#define PEER_SPIN_S 20e-6
#define PEER_SLEEP_MIN_NS 10000L
#define PEER_SLEEP_MAX_NS 100000L

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

static void transfer(engine *eng, keel_comm_req *req) {
    keel_comm *c = req->comm;
    MPI_Datatype type = mpi_type(req->dtype);
    int count = (int)req->count;
    size_t chunk_bytes = req->count * keel_comm_dtype_size(req->dtype);
    switch (req->kind) {
    case OP_ALLGATHER: {
        const void *own = (const char *)req->recv + (size_t)c->rank * chunk_bytes;
        const void *send = req->send == own ? MPI_IN_PLACE : req->send;
        MPI_Allgather(send, count, type, req->recv, count, type, c->mpi);
        break;
    }
    case OP_REDUCE_SCATTER: /* ring.c says why not MPI's */
        ring_reduce_scatter(eng->ring_scratch, c->mpi, c->rank, c->size, req->send, req->recv,
                            req->count, req->dtype, req->op);
        break;
    case OP_ALLREDUCE:
        ring_allreduce(eng->ring_scratch, c->mpi, c->rank, c->size, req->send, req->recv,
                       req->count, req->dtype, req->op, type);
        break;
    case OP_BROADCAST: MPI_Bcast(req->recv, count, type, req->root, c->mpi); break;
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
