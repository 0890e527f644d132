/* comm/queue.h: the operation queue shared by the front end (comm.c,
 * caller threads) and the transports that run it on the comm thread: MPI
 * (mpi.c) under mpirun or srun, Gloo (gloo.c) for ranks started on their
 * own. */
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
    OP_WINDOW_REDUCE_SCATTER,
    OP_SPLIT,
    OP_FREE,
} op_kind;

typedef struct engine engine;

struct keel_comm {
    engine *eng;
    /* the transport's handle of the group, touched only by the comm thread */
    MPI_Comm mpi;      /* mpi: the communicator (a handle value is just copied) */
    int *members;      /* gloo: the world rank of each group rank */
    uint64_t tag;      /* gloo: the group's name in message slots, the same on its every rank */
    uint64_t ops;      /* gloo: operations the group has run (the slot's other part) */
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
    keel_comm *child;   /* OP_SPLIT out: the transport fills its handle, rank and size */
    /* OP_WINDOW_REDUCE_SCATTER: the window, its slot, the parts' stride, and
     * its transfer (window.c's: comm.c calls no window code) */
    keel_comm_window *win;
    void (*run)(engine *eng, const keel_comm_req *req);
    int slot;
    uint32_t gen;       /* the slot's generation this rank published */
    size_t stride;
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
    uint64_t window_op;       /* a node window's wait in progress on a caller (under mu; 0: none) */
    /* transport state, comm thread only */
    const struct transport *tp;
    keel_comm *world;         /* filled by tp->start: its handle, rank and size */
    int local_size;           /* world ranks on this machine */
    int local_rank;           /* this one's place among them */
    char *ring_scratch[2];    /* RING_SEGMENT_BYTES each */
    void *gloo;               /* gloo.c's connection to the other ranks */
    void (*on_lost)(void *);  /* keel_comm_on_peer_lost's: a transport calls it before it ends the process */
    void *on_lost_ctx;
};

/* What moves the bytes, on the comm thread only. start connects this process
 * to the others (eng->world's handle, rank and size, eng->local_*), stop
 * undoes it. exchange sends send_bytes to group rank dest while recv_bytes
 * come from source (-1: nothing that way); messages between two ranks of a
 * group arrive in the order they were sent, and tag (0 or 1) keeps two
 * streams of one operation apart. await_peers returns once every rank of the
 * group has reached it, mostly asleep. allgather and broadcast run the
 * operation of req whole. A transport that loses a peer says so in one line
 * and ends the process (exit KEEL_EXIT_PEER_LOST): collectives return KEEL_OK
 * or do not return. */
typedef struct transport {
    const char *name;
    keel_status (*start)(engine *eng);
    void (*stop)(engine *eng);
    void (*split)(keel_comm *parent, int color, int key, keel_comm *child);
    void (*free_group)(keel_comm *c);
    void (*await_peers)(keel_comm *c);
    void (*exchange)(keel_comm *c, const void *send, size_t send_bytes, int dest, void *recv, size_t recv_bytes,
                     int source, int tag);
    void (*allgather)(engine *eng, const keel_comm_req *req);
    void (*broadcast)(engine *eng, const keel_comm_req *req);
} transport;

extern const transport keel_transport_mpi, keel_transport_gloo;

/* Elements of one message at most (KEEL_COMM_MAX_COUNT lowers it, so tests
 * can take the path that cuts a collective into pieces). */
size_t comm_max_count(void);

/* A peer is gone (its line already logged): the trainer's keel_comm_on_peer_lost
 * callback, then the process ends with KEEL_EXIT_PEER_LOST. */
_Noreturn void comm_end_lost(engine *eng);

/* Queue a copy of req on its group's comm thread; *out is its handle for
 * keel_comm_wait (the i-forms, window.c's reduce-scatter too). */
keel_status comm_run_async(keel_comm_req req, keel_comm_req **out);

/* ring.c's element-wise out = a op b (out may alias a or b). */
void ring_combine(void *out, const void *a, const void *b, size_t n, keel_comm_dtype dtype, keel_comm_op op);

/* ring.c's all-gather: every rank's `count` elements into recv, rank after
 * rank, around the ring (the transports without one of their own). */
void ring_allgather_blocks(engine *eng, const keel_comm_req *req);

/* ring.c, comm thread only. Bytes of one chunk per point-to-point message;
 * also the size of each of the two scratch buffers. */
#ifndef RING_SEGMENT_BYTES
#define RING_SEGMENT_BYTES ((size_t)1 << 20)
#endif
/* recv (count) = op over the ranks of c of send[rank*count ..]. */
void ring_reduce_scatter(char *const scratch[2], keel_comm *c, const void *send, void *recv, size_t count,
                         keel_comm_dtype dtype, keel_comm_op op);
/* recv (count) = op over the ranks of send (count); send == recv allowed. */
void ring_allreduce(char *const scratch[2], keel_comm *c, const void *send, void *recv, size_t count,
                    keel_comm_dtype dtype, keel_comm_op op);

#endif
