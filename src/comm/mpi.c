/* comm/mpi.c: the MPI transport (OpenMPI), for ranks that mpirun or srun
 * started; comm thread only. */
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
size_t comm_max_count(void) {
    static size_t cached;
    if (!cached) {
        const char *env = getenv("KEEL_COMM_MAX_COUNT");
        long long v = env ? atoll(env) : 0;
        cached = v > 0 && v < INT_MAX ? (size_t)v : (size_t)INT_MAX;
    }
    return cached;
}

/* ---- start / stop ------------------------------------------------------------ */

static keel_status mpi_start(engine *eng) {
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
    keel_comm *w = eng->world;
    MPI_Comm_dup(MPI_COMM_WORLD, &w->mpi);
    MPI_Comm_rank(w->mpi, &w->rank);
    MPI_Comm_size(w->mpi, &w->size);
    /* the ranks that share this machine's memory and cores, whatever the launcher */
    MPI_Comm node;
    MPI_Comm_split_type(w->mpi, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &eng->local_size);
    MPI_Comm_rank(node, &eng->local_rank);
    MPI_Comm_free(&node);
    /* nanosleep(10 µs) would otherwise sleep 60 µs: the default slack is 50 µs. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    return KEEL_OK;
}

static void mpi_stop(engine *eng) {
    MPI_Comm_free(&eng->world->mpi);
    MPI_Finalize();
}

static void mpi_split(keel_comm *parent, int color, int key, keel_comm *child) {
    MPI_Comm_split(parent->mpi, color, key, &child->mpi);
    MPI_Comm_rank(child->mpi, &child->rank);
    MPI_Comm_size(child->mpi, &child->size);
}

static void mpi_free_group(keel_comm *c) { MPI_Comm_free(&c->mpi); }

/* ---- one operation ----------------------------------------------------------- */

static MPI_Datatype mpi_type(keel_comm_dtype dtype) {
    switch (dtype) {
    case KEEL_COMM_F32: return MPI_FLOAT;
    case KEEL_COMM_BF16: return MPI_UINT16_T;
    case KEEL_COMM_F64: return MPI_DOUBLE;
    }
    KEEL_CHECK(false, "unknown dtype %d", (int)dtype);
}

/* Returns once every rank of c has reached this point, mostly asleep. */
static void mpi_await_peers(keel_comm *c) {
    if (c->size == 1) return;
    MPI_Request barrier;
    MPI_Ibarrier(c->mpi, &barrier);
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
 * most comm_max_count() elements: piece k of each rank's block lands at stride
 * `count` through a datatype resized to that stride (MPI_Aint: 64-bit). */
static void allgather(const keel_comm_req *req, MPI_Datatype type) {
    keel_comm *c = req->comm;
    size_t esize = keel_comm_dtype_size(req->dtype), count = req->count, piece_max = comm_max_count();
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
    size_t esize = keel_comm_dtype_size(req->dtype), piece_max = comm_max_count();
    for (size_t lo = 0; lo < req->count; lo += piece_max) {
        int n = (int)(req->count - lo < piece_max ? req->count - lo : piece_max);
        MPI_Bcast((char *)req->recv + lo * esize, n, type, req->root, req->comm->mpi);
    }
}

/* Bytes both ways (at most INT_MAX each: comm.c cuts larger ones). */
static void mpi_exchange(keel_comm *c, const void *send, size_t send_bytes, int dest, void *recv, size_t recv_bytes,
                         int source, int tag) {
    /* an empty side sends or receives 0 bytes: OpenMPI refuses a NULL buffer with a count */
    MPI_Sendrecv(dest >= 0 ? send : NULL, dest >= 0 ? (int)send_bytes : 0, MPI_BYTE,
                 dest >= 0 ? dest : MPI_PROC_NULL, tag, source >= 0 ? recv : NULL, source >= 0 ? (int)recv_bytes : 0,
                 MPI_BYTE, source >= 0 ? source : MPI_PROC_NULL, tag, c->mpi, MPI_STATUS_IGNORE);
}

static void mpi_allgather(engine *eng, const keel_comm_req *req) {
    (void)eng;
    allgather(req, mpi_type(req->dtype));
}

static void mpi_broadcast(engine *eng, const keel_comm_req *req) {
    (void)eng;
    broadcast(req, mpi_type(req->dtype));
}

const transport keel_transport_mpi = {
    .name = "mpi",
    .start = mpi_start,
    .stop = mpi_stop,
    .split = mpi_split,
    .free_group = mpi_free_group,
    .await_peers = mpi_await_peers,
    .exchange = mpi_exchange,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
};
