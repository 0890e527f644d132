/* tests/cuemu/fake_nccl.c: test infrastructure, not part of keel — a stand-in
 * for the NCCL functions src/backend/cuda_nccl.c uses, built as libnccl.so.2
 * for the CUDA emulator (cuemu.h), so keel's CUDA backend can run its
 * collectives with no GPU, as several processes (MPI ranks) on one host.
 *
 * A communicator is a POSIX shared-memory segment: ncclGetUniqueId creates
 * it and writes its name into the id; ncclCommInitRank maps it and waits for
 * every rank; rank 0 then unlinks the name, so nothing is left in /dev/shm
 * whatever happens later. The segment holds a header (the barrier's counters,
 * each rank's current collective) and one fixed-size slot per rank; messages
 * longer than a slot go in chunks, two barriers each (slots full; slots read).
 *
 * A collective only checks its arguments on the calling thread: the exchange
 * runs later on the process's device thread (cuemu_enqueue), in stream order,
 * like a kernel. Sums run in ascending rank order, bf16 in fp32 rounded once,
 * so every rank gets the same bits. Every wait gives up after
 * CUEMU_NCCL_TIMEOUT_S seconds (default 120) through cuemu_fail, naming the
 * ranks that did not arrive: a test fails, never hangs. */
#define _POSIX_C_SOURCE 200809L /* shm_open, clock_gettime, posix_fallocate under -std=c17 */

#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuemu.h"

enum { MAX_RANKS = 8 };
#define SLOT_BYTES ((size_t)4 << 20)
#define HEADER_BYTES ((size_t)4096)
#define SEGMENT_BYTES (HEADER_BYTES + MAX_RANKS * SLOT_BYTES)
#define NAME_PREFIX "/cuemu-nccl-"
#define MAGIC "cuemu-nccl 1"

/* The segment is shared by processes: its atomics must not hide a lock. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "process-shared atomics need lock-free atomics");

enum kind { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE };
static const char *const KIND_NAME[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce"};

/* One rank's line of the header, a cache line of its own (ranks spin on each other's). */
struct rank_state {
    _Alignas(64) _Atomic uint64_t arrived; /* barriers entered: a rank waits until all have entered as many */
    /* its current collective, written before that collective's first barrier, read after it */
    uint64_t count;
    int32_t kind, type;
};

struct header {
    char magic[16];
    _Atomic int nranks;      /* 0 until the first rank joins */
    _Atomic uint32_t joined; /* a bit per rank */
    struct rank_state rank[MAX_RANKS];
};
_Static_assert(sizeof(struct header) <= HEADER_BYTES, "the header outgrew its page");

struct ncclComm {
    unsigned char *segment; /* SEGMENT_BYTES, the header first */
    int rank, nranks;
    double timeout_s;
    uint64_t epoch;           /* barriers this rank has entered */
    uint64_t seq;             /* collectives run; both counters move on the device thread only after init */
    _Atomic unsigned pending; /* collectives issued and not yet run */
    char name[NCCL_UNIQUE_ID_BYTES];
};

static struct header *header_of(const struct ncclComm *c) { return (struct header *)c->segment; }
static unsigned char *slot(const struct ncclComm *c, int rank) {
    return c->segment + HEADER_BYTES + (size_t)rank * SLOT_BYTES;
}

/* ---- errors --------------------------------------------------------------- */

static char g_last_error[1024]; /* one for the process, like NCCL's */

static ncclResult_t error(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t error(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return r;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return g_last_error;
}

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return error(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ---- waiting -------------------------------------------------------------- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

struct waiter {
    double start;
    unsigned spins;
};

/* One pause of a wait: yields first (a peer on this CPU may be what we wait
 * for), then sleeps briefly so ranks on an oversubscribed host don't starve
 * each other. False once the wait has lasted timeout_s. */
static bool pause_or_give_up(struct waiter *w, double timeout_s) {
    if (w->spins++ < 100) {
        sched_yield();
        return true;
    }
    if (now_s() - w->start > timeout_s) return false;
    nanosleep(&(struct timespec){.tv_nsec = 50 * 1000}, NULL);
    return true;
}

/* Enters c's next barrier and waits until every rank has entered it; false
 * if some did not within the timeout. Ranks are never more than one barrier
 * apart, so "entered at least as many" is "is here". */
static bool barrier(struct ncclComm *c) {
    struct header *h = header_of(c);
    uint64_t epoch = ++c->epoch;
    atomic_store(&h->rank[c->rank].arrived, epoch);
    struct waiter w = {now_s(), 0};
    for (int q = 0; q < c->nranks;) {
        if (atomic_load(&h->rank[q].arrived) >= epoch) q++;
        else if (!pause_or_give_up(&w, c->timeout_s)) return false;
    }
    return true;
}

/* "1, 3": the ranks that have not entered the barrier this rank is waiting in */
static void absent_ranks(const struct ncclComm *c, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int q = 0; q < c->nranks && used < size; q++)
        if (atomic_load(&header_of(c)->rank[q].arrived) < c->epoch)
            used += (size_t)snprintf(buf + used, size - used, "%s%d", used ? ", " : "", q);
}

/* ---- communicators -------------------------------------------------------- */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic unsigned counter;
    if (!id) return error(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    char name[64];
    int fd = -1;
    /* a name left by a dead process whose pid was reused is skipped, not reused */
    for (int tries = 0; fd < 0 && tries < 1000; tries++) {
        snprintf(name, sizeof name, NAME_PREFIX "%ld-%u", (long)getpid(), atomic_fetch_add(&counter, 1));
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno != EEXIST)
            return error(ncclSystemError, "ncclGetUniqueId: shm_open(%s): %s", name, strerror(errno));
    }
    if (fd < 0) return error(ncclSystemError, "ncclGetUniqueId: every shared-memory name tried exists");
    /* sparse: a slot's pages are taken when its rank joins (ncclCommInitRank) */
    void *p = ftruncate(fd, (off_t)SEGMENT_BYTES) == 0
                  ? mmap(NULL, HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    int saved = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return error(ncclSystemError, "ncclGetUniqueId: sizing or mapping %s: %s", name, strerror(saved));
    }
    memcpy(((struct header *)p)->magic, MAGIC, sizeof MAGIC); /* the rest is zero, as ftruncate made it */
    munmap(p, HEADER_BYTES);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, name, strlen(name) + 1);
    return ncclSuccess;
}

static ncclResult_t read_timeout(double *timeout_s) {
    const char *v = getenv("CUEMU_NCCL_TIMEOUT_S");
    *timeout_s = 120;
    if (!v || !*v) return ncclSuccess;
    char *end;
    double s = strtod(v, &end);
    if (*end || !(s > 0 && s <= 1e9)) /* the negation also refuses NaN */
        return error(ncclInvalidUsage, "ncclCommInitRank: CUEMU_NCCL_TIMEOUT_S=%s is not a number of seconds > 0", v);
    *timeout_s = s;
    return ncclSuccess;
}

/* Maps the id's segment into c and registers c's rank; no waiting. */
static ncclResult_t join(struct ncclComm *c, const ncclUniqueId *id) {
    if (!memchr(id->internal, '\0', sizeof id->internal) ||
        strncmp(id->internal, NAME_PREFIX, strlen(NAME_PREFIX)) != 0)
        return error(ncclInvalidArgument, "ncclCommInitRank: the id is not one this library's ncclGetUniqueId made");
    memcpy(c->name, id->internal, sizeof c->name);
    int fd = shm_open(c->name, O_RDWR, 0);
    if (fd < 0)
        return error(ncclSystemError,
                     "ncclCommInitRank: shm_open(%s): %s (the communicator is complete already, or the id is stale)",
                     c->name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != (off_t)SEGMENT_BYTES) {
        close(fd);
        return error(ncclInvalidArgument, "ncclCommInitRank: %s is not a segment of this library", c->name);
    }
    /* Reserving the slot now turns a full /dev/shm into this error rather than a SIGBUS mid-collective. */
    int e = posix_fallocate(fd, (off_t)(HEADER_BYTES + (size_t)c->rank * SLOT_BYTES), (off_t)SLOT_BYTES);
    if (e) {
        close(fd);
        return error(ncclSystemError, "ncclCommInitRank: reserving rank %d's %zu MiB in %s: %s (is /dev/shm full?)",
                     c->rank, SLOT_BYTES >> 20, c->name, strerror(e));
    }
    void *p = mmap(NULL, SEGMENT_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    close(fd);
    if (p == MAP_FAILED) return error(ncclSystemError, "ncclCommInitRank: mmap(%s): %s", c->name, strerror(e));
    c->segment = p;
    struct header *h = header_of(c);
    if (memcmp(h->magic, MAGIC, sizeof MAGIC) != 0)
        return error(ncclInvalidArgument, "ncclCommInitRank: %s is not a segment of this library", c->name);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&h->nranks, &expected, c->nranks) && expected != c->nranks)
        return error(ncclInvalidArgument, "ncclCommInitRank: rank %d says nranks %d, another rank said %d",
                     c->rank, c->nranks, expected);
    if (atomic_fetch_or(&h->joined, 1u << c->rank) & (1u << c->rank))
        return error(ncclInvalidArgument, "ncclCommInitRank: rank %d joined twice", c->rank);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return error(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    if (nranks > MAX_RANKS)
        return error(ncclInvalidUsage, "ncclCommInitRank: nranks %d: the emulated NCCL supports at most %d ranks",
                     nranks, MAX_RANKS);
    if (nranks < 1) return error(ncclInvalidArgument, "ncclCommInitRank: nranks %d < 1", nranks);
    if (rank < 0 || rank >= nranks)
        return error(ncclInvalidArgument, "ncclCommInitRank: rank %d out of range [0, %d)", rank, nranks);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return error(ncclSystemError, "ncclCommInitRank: out of memory");
    c->rank = rank;
    c->nranks = nranks;
    ncclResult_t r = read_timeout(&c->timeout_s);
    if (r == ncclSuccess) r = join(c, &id);
    if (r != ncclSuccess) {
        if (c->segment) munmap(c->segment, SEGMENT_BYTES);
        free(c);
        return r;
    }
    if (!barrier(c)) {
        char absent[64];
        absent_ranks(c, absent, sizeof absent);
        shm_unlink(c->name); /* no one else will: the communicator is never made */
        cuemu_fail("fake NCCL: ncclCommInitRank (rank %d of %d): ranks %s did not join within %g s "
                   "(CUEMU_NCCL_TIMEOUT_S)", rank, nranks, absent, c->timeout_s);
    }
    /* every rank has it mapped: the name can go */
    if (rank == 0) shm_unlink(c->name);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return error(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    /* as NCCL's, it lets the collectives issued on comm finish first */
    struct waiter w = {now_s(), 0};
    while (atomic_load(&comm->pending))
        if (!pause_or_give_up(&w, comm->timeout_s))
            cuemu_fail("fake NCCL: ncclCommDestroy (rank %d of %d): %u collectives issued on it did not run within "
                       "%g s (CUEMU_NCCL_TIMEOUT_S)", comm->rank, comm->nranks, atomic_load(&comm->pending),
                       comm->timeout_s);
    munmap(comm->segment, SEGMENT_BYTES);
    free(comm);
    return ncclSuccess;
}

/* ---- the reductions ------------------------------------------------------- */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclBfloat16: return 2;
    default: return 0;
    }
}

static const char *type_name(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    default: return "an unsupported type";
    }
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even; NaNs are truncated instead and kept quiet: rounding
 * one whose payload is all in the low 16 bits would make an infinity */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

enum { BLOCK = 1024 }; /* elements summed at a time, on the stack */

/* dst[i] = src[0][i] + src[1][i] + ... in that order. src are slots
 * (aligned); dst is the caller's buffer, written with memcpy. */
static void reduce(unsigned char *dst, const unsigned char *const *src, int nsrc, size_t n, ncclDataType_t t) {
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        if (t == ncclFloat64) {
            double acc[BLOCK];
            memcpy(acc, src[0] + i0 * 8, m * 8);
            for (int q = 1; q < nsrc; q++) {
                const double *s = (const double *)src[q] + i0;
                for (size_t i = 0; i < m; i++) acc[i] += s[i];
            }
            memcpy(dst + i0 * 8, acc, m * 8);
        } else if (t == ncclFloat32) {
            float acc[BLOCK];
            memcpy(acc, src[0] + i0 * 4, m * 4);
            for (int q = 1; q < nsrc; q++) {
                const float *s = (const float *)src[q] + i0;
                for (size_t i = 0; i < m; i++) acc[i] += s[i];
            }
            memcpy(dst + i0 * 4, acc, m * 4);
        } else {
            float acc[BLOCK];
            uint16_t out[BLOCK];
            for (size_t i = 0; i < m; i++) acc[i] = bf16_to_f32(((const uint16_t *)src[0])[i0 + i]);
            for (int q = 1; q < nsrc; q++) {
                const uint16_t *s = (const uint16_t *)src[q] + i0;
                for (size_t i = 0; i < m; i++) acc[i] += bf16_to_f32(s[i]);
            }
            for (size_t i = 0; i < m; i++) out[i] = f32_to_bf16(acc[i]);
            memcpy(dst + i0 * 2, out, m * 2);
        }
    }
}

/* ---- the collectives ------------------------------------------------------ */

struct work {
    struct ncclComm *comm;
    enum kind kind;
    const unsigned char *send;
    unsigned char *recv;
    size_t count;
    ncclDataType_t type;
    bool agreed; /* every rank is in the same collective: checked at its first barrier */
};

/* A barrier inside w; at the first, every rank's collective must be w's. */
static void step(struct work *w) {
    struct ncclComm *c = w->comm;
    if (!barrier(c)) {
        char absent[64];
        absent_ranks(c, absent, sizeof absent);
        cuemu_fail("fake NCCL: %s (collective %llu on its communicator, rank %d of %d, count %zu): ranks %s did not "
                   "arrive within %g s (CUEMU_NCCL_TIMEOUT_S)", KIND_NAME[w->kind], (unsigned long long)c->seq,
                   c->rank, c->nranks, w->count, absent, c->timeout_s);
    }
    if (w->agreed) return;
    const struct header *h = header_of(c);
    for (int q = 0; q < c->nranks; q++) {
        const struct rank_state *s = &h->rank[q];
        if (s->kind != (int32_t)w->kind || s->type != (int32_t)w->type || s->count != w->count)
            cuemu_fail("fake NCCL: collective %llu on a communicator: rank %d called %s(count %zu, %s) but rank %d "
                       "called %s(count %llu, %s); every rank must issue the same collectives in the same order",
                       (unsigned long long)c->seq, c->rank, KIND_NAME[w->kind], w->count, type_name(w->type), q,
                       KIND_NAME[s->kind], (unsigned long long)s->count, type_name((ncclDataType_t)s->type));
    }
    w->agreed = true;
}

/* On the device thread. Each chunk: fill this rank's slot, barrier, read
 * every rank's slot, barrier (after which the slots may be refilled). */
static void run(void *arg) {
    struct work *w = arg;
    struct ncclComm *c = w->comm;
    struct rank_state *me = &header_of(c)->rank[c->rank];
    c->seq++;
    me->kind = (int32_t)w->kind;
    me->type = (int32_t)w->type;
    me->count = w->count;
    size_t es = type_size(w->type), bytes = w->count * es;
    const unsigned char *src[MAX_RANKS];
    switch (w->kind) {
    case ALL_GATHER:
        for (size_t off = 0; off < bytes; off += SLOT_BYTES) {
            size_t len = bytes - off < SLOT_BYTES ? bytes - off : SLOT_BYTES;
            memcpy(slot(c, c->rank), w->send + off, len);
            step(w);
            for (int q = 0; q < c->nranks; q++) memcpy(w->recv + (size_t)q * bytes + off, slot(c, q), len);
            step(w);
        }
        break;
    case REDUCE_SCATTER: {
        /* a chunk carries a piece of every rank's block; in place, this
         * rank's block is in the slot before recv (inside send) is written */
        size_t piece = SLOT_BYTES / (size_t)c->nranks / es * es;
        for (size_t off = 0; off < bytes; off += piece) {
            size_t len = bytes - off < piece ? bytes - off : piece;
            for (int p = 0; p < c->nranks; p++)
                memcpy(slot(c, c->rank) + (size_t)p * len, w->send + (size_t)p * bytes + off, len);
            step(w);
            for (int q = 0; q < c->nranks; q++) src[q] = slot(c, q) + (size_t)c->rank * len;
            reduce(w->recv + off, src, c->nranks, len / es, w->type);
            step(w);
        }
        break;
    }
    case ALL_REDUCE:
        for (size_t off = 0; off < bytes; off += SLOT_BYTES) {
            size_t len = bytes - off < SLOT_BYTES ? bytes - off : SLOT_BYTES;
            memcpy(slot(c, c->rank), w->send + off, len);
            step(w);
            for (int q = 0; q < c->nranks; q++) src[q] = slot(c, q);
            reduce(w->recv + off, src, c->nranks, len / es, w->type);
            step(w);
        }
        break;
    }
    free(w);
    atomic_fetch_sub(&c->pending, 1); /* last: ncclCommDestroy may free c once it reads 0 */
}

static bool overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

/* Checks a collective's arguments and queues it on stream; never touches the buffers. */
static ncclResult_t issue(enum kind kind, const void *send, void *recv, size_t count, ncclDataType_t type,
                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char *what = KIND_NAME[kind];
    if (!comm) return error(ncclInvalidArgument, "%s: comm is NULL", what);
    size_t es = type_size(type);
    if (!es)
        return error(ncclInvalidArgument, "%s: datatype %d is not emulated (ncclFloat32, ncclFloat64 and "
                     "ncclBfloat16 are)", what, (int)type);
    if (op != ncclSum)
        return error(ncclInvalidArgument, "%s: reduction op %d is not emulated (ncclSum is)", what, (int)op);
    if (count == 0) return ncclSuccess;
    size_t n = (size_t)comm->nranks;
    if (count > SIZE_MAX / es / n) return error(ncclInvalidArgument, "%s: count %zu overflows size_t", what, count);
    if (!send || !recv) return error(ncclInvalidArgument, "%s: %s is NULL", what, send ? "recvbuff" : "sendbuff");
    size_t bytes = count * es, r = (size_t)comm->rank;
    uintptr_t s = (uintptr_t)send, d = (uintptr_t)recv;
    bool bad = kind == ALL_GATHER       ? s != d + r * bytes && overlap(s, bytes, d, n * bytes)
               : kind == REDUCE_SCATTER ? d != s + r * bytes && overlap(s, n * bytes, d, bytes)
                                        : s != d && overlap(s, bytes, d, bytes);
    if (bad) return error(ncclInvalidArgument, "%s: sendbuff and recvbuff overlap other than in place", what);
    struct work *w = malloc(sizeof *w);
    if (!w) return error(ncclSystemError, "%s: out of memory", what);
    *w = (struct work){comm, kind, send, recv, count, type, false};
    atomic_fetch_add(&comm->pending, 1);
    cuemu_enqueue(stream, what, run, w);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return issue(ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return issue(REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return issue(ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, comm, stream);
}
