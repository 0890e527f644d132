/* comm: collectives between ranks — all-gather, reduce-scatter, all-reduce,
 * broadcast, barrier — blocking and non-blocking, over process groups.
 * Transports: OpenMPI for ranks that mpirun or srun started; Gloo's TCP
 * pairs (KEEL_TRANSPORT=gloo) for ranks started on their own, which find each
 * other through a store (KEEL_RANK, KEEL_WORLD_SIZE, KEEL_STORE,
 * KEEL_STORE_PREFIX, KEEL_HOST: docs/kubernetes.md). The reductions are
 * keel's own rings on either, so results are bitwise the same. comm moves and
 * sums flat arrays; it never knows what a parameter is.
 *
 *     keel_comm *world, *shard;
 *     if (keel_comm_init(&world) != KEEL_OK) return 1;
 *     int r = keel_comm_rank(world);
 *     keel_comm_split(world, r / 2, r, &shard);          // groups of 2 ranks
 *     keel_comm_req *gather;                             // (n bf16 per rank)
 *     keel_comm_iallgather(shard, my_shard, unit, n, KEEL_COMM_BF16, &gather);
 *     compute_previous_unit();                           // the gather runs meanwhile
 *     keel_comm_wait(gather);                            // unit = every rank's shard
 *     keel_comm_free(shard);
 *     keel_comm_finalize(world);
 *
 * Progress: one comm thread per process. OpenMPI advances a non-blocking
 * collective only inside MPI calls, so an MPI_Iallgather started before a
 * long GEMM would sit still until the next MPI_Wait. keel therefore starts a
 * dedicated comm thread in keel_comm_init; that thread calls MPI_Init_thread
 * (MPI_THREAD_FUNNELED: it is MPI's "main thread"), makes every MPI call of the
 * process, and calls MPI_Finalize. The calling (compute) threads never touch
 * MPI: each keel_comm_* call appends an operation to a FIFO queue and, for the
 * blocking forms, sleeps on a condition variable until it is done. The comm
 * thread runs the operations one at a time to completion, so an operation
 * progresses at full speed whatever the compute thread is doing. All-gather,
 * broadcast and barrier are OpenMPI's blocking collectives; reduce-scatter and
 * all-reduce are keel's own ring over MPI point-to-point (src/comm/ring.c):
 * OpenMPI 4.1's were 2.5-6x slower here, as every call faults in a fresh
 * full-size temporary (a 64 MB reduce-scatter: 16,386 page faults, 59 ms).
 *
 * Waiting for late peers without spinning: an MPI blocking collective
 * busy-polls while the other ranks have not reached it yet, which would steal
 * a core from the compute threads of this rank (and, oversubscribed, of the
 * others). So the comm thread first waits for every rank of the group to
 * arrive (MPI_Ibarrier, polled for 20 µs, then with sleeps of 10 µs growing to
 * 100 µs) and only then starts the transfer. The cost is one small barrier per
 * operation plus at most ~100 µs of wake-up latency per barrier round; the
 * gain is an idle comm thread while the peers are still computing.
 * keel_comm_get_stats reports both parts.
 *
 * Ordering rule (what MPI collectives require): operations run in issue
 * order, one at a time, on every rank. Every rank must issue the operations of
 * all its groups in the same program order (SPMD). Issue from one thread, or
 * serialise the issuing threads yourself: concurrent issuers would race for
 * queue positions and could order two collectives differently on two ranks.
 *
 * Buffers: the caller owns every buffer. From the issue of a non-blocking
 * operation until its keel_comm_wait returns, the send buffer must stay valid
 * and unmodified and the receive buffer must not be touched.
 *
 * Errors: MPI is fail-stop here (MPI_ERRORS_ARE_FATAL): a dead peer aborts the
 * job; under Gloo a rank whose peer closed its connection says so in one line
 * and exits KEEL_EXIT_PEER_LOST (within milliseconds of the peer's death). So
 * collectives return KEEL_OK or do not return. Misuse (bad root, a
 * group freed with operations outstanding, ...) is a bug and trips KEEL_CHECK.
 * Element counts per rank must fit in an int (MPI's count type).
 */
#ifndef KEEL_COMM_H
#define KEEL_COMM_H

#include "keel/core.h"

/* A process group (an MPI communicator). keel_comm_init returns the world;
 * keel_comm_split makes subgroups (FSDP's shard group and replica group). */
typedef struct keel_comm keel_comm;
/* The handle of a non-blocking operation; keel_comm_wait consumes it. */
typedef struct keel_comm_req keel_comm_req;

/* Element types (enums only grow at the end). BF16 is the bit pattern of a
 * bfloat16 in a uint16_t: all-gather and broadcast move it untouched; BF16
 * reductions travel as bf16 and combine each pair of elements in fp32,
 * rounding the result to the nearest even bf16, so a sum over W ranks is
 * rounded W-1 times (as NCCL does). Use F32 where that matters.
 *
 * Reductions are deterministic: element i of chunk c (the part rank c ends up
 * owning) is summed in ring order starting after rank c — ((x[c+1] + x[c+2])
 * + ...) + x[c] — so a given group size and count give bitwise the same
 * result on every run, and all-reduce gives bitwise the same array on every
 * rank. */
typedef enum { KEEL_COMM_F32 = 0, KEEL_COMM_BF16 = 1, KEEL_COMM_F64 = 2 } keel_comm_dtype;
typedef enum { KEEL_COMM_SUM = 0, KEEL_COMM_MAX = 1 } keel_comm_op;

/* Bytes of one element of dtype. */
static inline size_t keel_comm_dtype_size(keel_comm_dtype dtype) {
    switch (dtype) {
    case KEEL_COMM_F32: return 4;
    case KEEL_COMM_BF16: return 2;
    case KEEL_COMM_F64: return 8;
    }
    KEEL_CHECK(false, "unknown dtype %d", (int)dtype);
}

/* ---- the world and groups ------------------------------------------------ */

/* The transport keel_comm_init takes: "mpi" or "gloo" (KEEL_TRANSPORT). */
const char *keel_comm_transport(void);

/* Start the comm thread, initialise MPI on it and return the world group in
 * *world (a duplicate of MPI_COMM_WORLD, so keel's traffic never matches
 * anyone else's). Call once per process. KEEL_ERR_IO if MPI cannot give
 * MPI_THREAD_FUNNELED. Async signals (SIGINT, SIGTERM, SIGUSR1/2, SIGHUP,
 * SIGALRM, SIGQUIT) are blocked on the comm thread, so they reach the
 * caller's threads. The world is freed by keel_comm_finalize. Under Gloo:
 * connect to the other ranks instead; KEEL_ERR_INPUT (one line naming the
 * variable) when KEEL_* does not say where this rank stands. */
keel_status keel_comm_init(keel_comm **world);
/* Run every queued operation, finalise MPI, stop the comm thread and free
 * world. Every other group must be freed and every request waited first.
 * Collective over the world. */
keel_status keel_comm_finalize(keel_comm *world);

/* fn(ctx) is called once, on the comm thread, just before a transport that
 * lost a peer ends the process (Gloo; exit KEEL_EXIT_PEER_LOST): the trainer
 * says goodbye in its heartbeat there, so its watcher blames the rank that
 * died, not this one. fn must not call comm. c is any group. NULL: none. */
void keel_comm_on_peer_lost(keel_comm *c, void (*fn)(void *ctx), void *ctx);

/* This process's rank in c (0-based) and the number of ranks in c. */
int keel_comm_rank(const keel_comm *c);
int keel_comm_size(const keel_comm *c);
/* Ranks of the world on this machine (they share its cores and memory),
 * whatever launched them; c is any group. */
int keel_comm_local_size(const keel_comm *c);
/* This process's place among them (0 .. local_size-1, by world rank): which
 * of the machine's GPUs it takes. */
int keel_comm_local_rank(const keel_comm *c);

/* Collective over parent: ranks passing the same color form one new group,
 * ordered by key (ties by parent rank). *child is owned by the caller; free it
 * with keel_comm_free. Groups may be uneven (3 ranks, color = rank / 2: sizes
 * 2 and 1). color must be >= 0. */
keel_status keel_comm_split(keel_comm *parent, int color, int key, keel_comm **child);
/* Collective over c: free a group made by keel_comm_split (never the world).
 * All its requests must have been waited. NULL is a no-op. */
keel_status keel_comm_free(keel_comm *c);

/* ---- collectives ----------------------------------------------------------
 * Each has a blocking form and a non-blocking i-form that returns a request in
 * *req at once (the operation is queued behind the ones issued before it).
 * count is the number of elements per rank where it says so. */

/* recv (size*count) = the send (count) of every rank, rank r's at r*count.
 * In place: send == recv + rank*count elements (the own chunk already there).
 * Otherwise send and recv must not overlap. */
keel_status keel_comm_allgather(keel_comm *c, const void *send, void *recv, size_t count,
                                keel_comm_dtype dtype);
keel_status keel_comm_iallgather(keel_comm *c, const void *send, void *recv, size_t count,
                                 keel_comm_dtype dtype, keel_comm_req **req);

/* recv (count) = op over all ranks of their send[rank*count .. (rank+1)*count)
 * (send holds size*count). In place: recv == send + rank*count elements (the
 * rank's own slice; FSDP's unit gradients); any other overlap is an error. */
keel_status keel_comm_reduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                     keel_comm_dtype dtype, keel_comm_op op);
keel_status keel_comm_ireduce_scatter(keel_comm *c, const void *send, void *recv, size_t count,
                                      keel_comm_dtype dtype, keel_comm_op op, keel_comm_req **req);

/* recv (count) = op over all ranks of send (count). In place: send == recv. */
keel_status keel_comm_allreduce(keel_comm *c, const void *send, void *recv, size_t count,
                                keel_comm_dtype dtype, keel_comm_op op);
keel_status keel_comm_iallreduce(keel_comm *c, const void *send, void *recv, size_t count,
                                 keel_comm_dtype dtype, keel_comm_op op, keel_comm_req **req);
/* *value = op over all ranks of *value (fp64: a loss, a squared norm, a max). */
keel_status keel_comm_allreduce_scalar(keel_comm *c, double *value, keel_comm_op op);

/* buf (count) on every rank = buf of rank root. */
keel_status keel_comm_broadcast(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype,
                                int root);
keel_status keel_comm_ibroadcast(keel_comm *c, void *buf, size_t count, keel_comm_dtype dtype,
                                 int root, keel_comm_req **req);

/* Returns (or completes) once every rank of c has reached it. */
/* Point to point, issued like a collective: every rank of the group calls it
 * at the same place in its sequence (it waits for all of them); this rank
 * sends `count` elements to group rank `dest` while `count` arrive from
 * `source` into recv. -1 for dest or source: nothing goes or comes that way
 * (its buffer may be NULL). The pairs must match: rank r sends to d exactly
 * when d receives from r. */
keel_status keel_comm_sendrecv(keel_comm *c, const void *send, int dest, void *recv, int source, size_t count,
                               keel_comm_dtype dtype);
keel_status keel_comm_isendrecv(keel_comm *c, const void *send, int dest, void *recv, int source, size_t count,
                                keel_comm_dtype dtype, keel_comm_req **req);
keel_status keel_comm_barrier(keel_comm *c);
/* Is the network between the ranks sound: all-reduce 16 MB of known values
 * (small integers: exact in any order), check every sum (every rank agrees),
 * best of 4 timed. *detail: "W rank(s): all-reduce of 16 MB exact|WRONG, bus
 * bandwidth X GB/s". Collective. */
bool keel_comm_probe(keel_comm *c, double *bus_gbps, char *detail, size_t detail_n);
keel_status keel_comm_ibarrier(keel_comm *c, keel_comm_req **req);

/* ---- requests ------------------------------------------------------------ */

/* Block (sleeping, not spinning) until req's operation is done, then free req.
 * Every request must be waited exactly once. */
keel_status keel_comm_wait(keel_comm_req *req);
/* *done = whether req's operation has finished; never blocks, never frees.
 * Operations finish in issue order: once a request tests done, so have all
 * the requests issued before it in this process. */
keel_status keel_comm_test(keel_comm_req *req, bool *done);

/* ---- node windows ---------------------------------------------------------- */

/* Slots of memory that every rank of a group maps at once, one copy on the
 * machine (comm/window.c): an all-gather between ranks that share a machine
 * without copying anything. Each rank writes its own part of a slot in place
 * and reads the others' parts where they lie. Per slot, every rank of the
 * group calls, in the same order as the others:
 *   claim    wait until every rank has released the slot's last contents
 *            (then this rank may write its part)
 *   publish  this rank's part is written
 *   await    wait until every rank has published (then the slot is read)
 *   release  this rank reads the slot no more
 * The waits sleep on the slot's counters and count as operations of the
 * process's sequence (keel_comm_stats' issued and waiting), so a hung peer is
 * named as it is in a collective; a peer whose process has been gone for 5 s
 * ends this one as a lost peer does (exit KEEL_EXIT_PEER_LOST) — a backstop
 * for a rank that nothing else watches (keel train's watch is faster). */
typedef struct keel_comm_window keel_comm_window;
/* Collective over c: n slots of bytes[s] bytes each (0: no memory), page
 * aligned. NULL on every rank when they do not share a machine (or its
 * /dev/shm: another host, another mount namespace, too little room) or c has
 * one rank: the caller uses its own memory and the collectives instead. */
keel_comm_window *keel_comm_window_create(keel_comm *c, const size_t *bytes, int n);
void keel_comm_window_free(keel_comm_window *w); /* each rank its own mapping; NULL is fine */
void *keel_comm_window_slot(const keel_comm_window *w, int s);
void keel_comm_window_claim(keel_comm_window *w, int s);
void keel_comm_window_publish(keel_comm_window *w, int s);
void keel_comm_window_await(keel_comm_window *w, int s);
void keel_comm_window_release(keel_comm_window *w, int s);
/* A reduce-scatter in a window, instead of publish, await and release:
 * slot s holds every rank's part, `stride` elements apart (part k from
 * element k * stride), each `size` x count elements; this rank's part is
 * published at once, and the comm thread (in issue order, like any
 * operation) waits for the others', sums this rank's slice — elements
 * [rank * count, (rank + 1) * count) — of every part into its own part's
 * slice, in the ring's order of sums (keel_comm_ireduce_scatter's result
 * bit for bit), and releases the slot. The result stays until this rank
 * writes its part again (each rank writes only its own part). Sums only. */
keel_status keel_comm_window_ireduce_scatter(keel_comm_window *w, int s, size_t stride, size_t count,
                                            keel_comm_dtype dtype, keel_comm_req **req);

/* ---- statistics ----------------------------------------------------------- */

typedef struct {
    uint64_t ops;        /* collectives run by this process's comm thread (all groups) */
    uint64_t bytes;      /* their local buffer sizes: the gathered/reduced/broadcast array */
    double transfer_s;   /* comm thread time in collectives once all peers had arrived */
    double peer_wait_s;  /* comm thread time waiting (mostly asleep) for peers to arrive */
    double cpu_s;        /* CPU time the comm thread spent in both: what it took from a core */
    /* Where this process is in the sequence of operations, numbered from 1 in
     * issue order over all groups (every rank issues the same sequence, so
     * operation k is the same collective on every rank): the last one issued,
     * the one the comm thread is running (0: idle; or a node window's wait
     * in progress on a caller, which waits for its peers as one does), the one a caller is
     * blocked waiting for (0: none). A hung rank's peers run the collective
     * it never issued. */
    uint64_t issued, running, waiting;
} keel_comm_stats;

/* Process-wide counters since keel_comm_init (c is any live group). */
void keel_comm_get_stats(const keel_comm *c, keel_comm_stats *out);

#endif
