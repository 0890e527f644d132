/* comm/queue.h: the operation queue shared by the front end (comm.c,
 * caller threads) and the MPI backend (mpi.c, comm thread only). */
#ifndef KEEL_DIST_COMM_INTERNAL_H
#define KEEL_DIST_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>

#include "keel/comm.h"

typedef enum {
    OP_ALLGATHER,
    OP_REDUCE_SCATTER,
    OP_ALLREDUCE,
    OP_BROADCAST,
    OP_BARRIER,
    OP_SENDRECV,
    OP_SPLIT,
    OP_FREE,
} op_kind;

typedef struct engine engine;

struct keel_comm {
    engine *eng;
    MPI_Comm mpi;  /* touched only by the comm thread (a handle value is just copied) */
    int rank, size;
    int outstanding; /* requests issued on this group and not yet waited (under eng->mu) */
    bool is_world;
};

/* One queued operation. The i-forms allocate it and keel_comm_wait frees it;
 * the blocking forms keep it on their stack. */
struct keel_comm_req {
    op_kind kind;
    keel_comm *comm;
    const void *send;
    void *recv;
    size_t count;       /* elements per rank (allgather, reduce-scatter) or in all */
    keel_comm_dtype dtype;
    keel_comm_op op;
    int root;
    int dest, source;   /* OP_SENDRECV: group ranks, -1 for none */
    int color, key;     /* OP_SPLIT in */
    MPI_Comm child;     /* OP_SPLIT out */
    int child_rank, child_size;
    bool done;          /* under eng->mu */
    uint64_t seq;       /* its place in this process's issue order, from 1 (under eng->mu) */
    keel_comm_req *next;
};

struct engine {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* comm thread: queue became non-empty or stop */
    pthread_cond_t done_cv;   /* issuers: an operation finished (broadcast) */
    keel_comm_req *head, *tail;
    bool stop;
    bool started;             /* backend_start finished (under mu) */
    keel_status start_status;
    int live_groups;          /* split groups not yet freed */
    keel_comm_stats stats;    /* written by the comm thread under mu */
    /* backend state, comm thread only */
    MPI_Comm world_dup;
    int world_rank, world_size;
    int local_size;           /* world ranks on this machine */
    int local_rank;           /* this one's place among them */
    char *ring_scratch[2];    /* RING_SEGMENT_BYTES each */
};

/* Comm thread only. backend_start initialises MPI (and sets world_*), then
 * backend_run executes one operation to completion, adding to *stats;
 * backend_stop undoes backend_start. */
keel_status backend_start(engine *eng);
void backend_run(engine *eng, keel_comm_req *req, keel_comm_stats *stats);
void backend_stop(engine *eng);

/* ring.c, comm thread only. Bytes of one chunk per point-to-point message;
 * also the size of each of the two scratch buffers. */
#ifndef RING_SEGMENT_BYTES
#define RING_SEGMENT_BYTES ((size_t)1 << 20)
#endif
/* recv (count) = op over the ranks of comm of send[rank*count ..]. */
void ring_reduce_scatter(char *const scratch[2], MPI_Comm comm, int rank, int size,
                         const void *send, void *recv, size_t count, keel_comm_dtype dtype,
                         keel_comm_op op);
/* recv (count) = op over the ranks of send (count); send == recv allowed. */
void ring_allreduce(char *const scratch[2], MPI_Comm comm, int rank, int size, const void *send,
                    void *recv, size_t count, keel_comm_dtype dtype, keel_comm_op op);

#endif
