/* comm/window.c: node windows — slots of memory that every rank of a group maps
 * at once, for ranks that share a machine. A gather into a window copies
 * nothing: each rank writes its own part in place, and every rank reads the
 * others' parts where they lie (one gathered copy on the node, not one per
 * rank). See include/keel/comm.h for the protocol.
 *
 * Why by hand: MPI-3's shared windows (MPI_Win_allocate_shared) would need
 * the comm thread for every call (MPI runs there alone) and do not exist on
 * the Gloo transport; what a window needs is a mapping and four counters a
 * slot, which POSIX shared memory and a futex give directly.
 *
 * The mapping: a header (the creator's token, the group's size, every rank's
 * pid), each rank's counters — published and released, one 32-bit word a
 * slot, a rank's row written by that rank alone, padded to its own cache
 * lines — then the slots, each page-aligned. Rank 0 creates it under /dev/shm,
 * reserves its pages (posix_fallocate: a full tmpfs refuses here rather than
 * killing a rank with SIGBUS mid-step), broadcasts its name, the others open
 * it and check the token, and it is unlinked as soon as every rank has it
 * open, so nothing outlives the group. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "queue.h"

#define LINE 64
#define PAGE 4096
#define NAME_BYTES 64
/* A wait checks that its peers' processes still exist this often, and ends
 * the rank when one has been gone this long: a backstop — keel train's own
 * watch of its peers (train/peers.c, the supervisor) names a lost rank first,
 * with its event, within a second or two. */
#define ALIVE_CHECK_S 1.0
#define LOST_GRACE_S 5.0

typedef struct {
    uint64_t token;
    uint32_t ranks, slots;
} header;

/* What the header keeps of each rank: its process, and the pid namespace the
 * number means something in (a rank in another namespace is not checked). */
typedef struct {
    uint64_t pid_ns;
    int64_t pid;
} member;

struct keel_comm_window {
    keel_comm *comm;
    char *base;
    size_t map_bytes;
    int rank, size, n;
    uint64_t pid_ns;            /* this process's */
    size_t stride;              /* counters a rank's row, padded to whole lines */
    /* where the parts lie, from the mapping's start: the counters
     * ([rank * stride + slot] from each) and the slots */
    size_t published_at, released_at;
    size_t *slot_at, *bytes;    /* (n) each slot's offset and size */
    uint32_t *gen;              /* (n) this rank's claims of each slot */
    uint64_t *seq;              /* (n) the operation number of each slot's gather */
};

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

/* ---- the mapping -------------------------------------------------------------- */

static size_t header_bytes(int size) { return round_up(sizeof(header) + sizeof(member) * (size_t)size, LINE); }

static uint64_t pid_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Where each part lies (w->bytes set); returns the mapping's size. */
static size_t layout(keel_comm_window *w) {
    w->stride = round_up(sizeof(uint32_t) * (size_t)w->n, LINE) / sizeof(uint32_t);
    size_t rows = sizeof(uint32_t) * w->stride * (size_t)w->size;
    w->published_at = header_bytes(w->size);
    w->released_at = w->published_at + rows;
    size_t at = round_up(w->released_at + rows, PAGE);
    for (int s = 0; s < w->n; s++) {
        w->slot_at[s] = at;
        at = round_up(at + w->bytes[s], PAGE);
    }
    return at;
}

static member *members(const keel_comm_window *w) { return (member *)(w->base + sizeof(header)); }

static void check_slot(const keel_comm_window *w, int s) {
    KEEL_CHECK(s >= 0 && s < w->n, "window slot %d of %d", s, w->n);
}

/* Rank 0: make, size and reserve the file; map it. */
static bool create_file(keel_comm_window *w, const char *name, uint64_t token) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return false;
    int err = ftruncate(fd, (off_t)w->map_bytes) ? errno : posix_fallocate(fd, 0, (off_t)w->map_bytes);
    if (!err) {
        void *p = mmap(NULL, w->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) w->base = p;
    }
    close(fd);
    if (!w->base) {
        shm_unlink(name);
        return false;
    }
    *(header *)w->base = (header){.token = token, .ranks = (uint32_t)w->size, .slots = (uint32_t)w->n};
    return true;
}

/* The other ranks: open it, and check it is the one rank 0 made (the same
 * name on another machine's /dev/shm would not hold the token). */
static bool open_file(keel_comm_window *w, const char *name, uint64_t token) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return false;
    struct stat st;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == w->map_bytes) {
        void *p = mmap(NULL, w->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) w->base = p;
    }
    close(fd);
    if (!w->base) return false;
    const header *h = (const header *)w->base;
    if (h->token == token && h->ranks == (uint32_t)w->size && h->slots == (uint32_t)w->n) return true;
    munmap(w->base, w->map_bytes);
    w->base = NULL;
    return false;
}

keel_comm_window *keel_comm_window_create(keel_comm *c, const size_t *bytes, int n) {
    KEEL_CHECK(c && bytes && n > 0, "keel_comm_window_create: bad arguments");
    if (c->size == 1) return NULL; /* nobody to share with */
    keel_comm_window *w = keel_xcalloc(sizeof *w, "window");
    w->comm = c, w->rank = c->rank, w->size = c->size, w->n = n;
    w->slot_at = keel_xmalloc(sizeof(size_t) * (size_t)n, "window slot offsets");
    w->bytes = keel_xmalloc(sizeof(size_t) * (size_t)n, "window slot sizes");
    memcpy(w->bytes, bytes, sizeof(size_t) * (size_t)n);
    w->map_bytes = layout(w);

    /* rank 0's name and token, broadcast as 16-bit words (moved untouched) */
    struct {
        char name[NAME_BYTES];
        uint64_t token;
    } id = {{0}, 0};
    bool ok = true;
    if (w->rank == 0) {
        static atomic_uint made;
        if (getrandom(&id.token, sizeof id.token, 0) != (ssize_t)sizeof id.token) id.token = (uint64_t)keel_now_s();
        snprintf(id.name, sizeof id.name, "/keel-win-%ld-%u-%08x", (long)getpid(), atomic_fetch_add(&made, 1),
                 (unsigned)id.token);
        ok = create_file(w, id.name, id.token);
        if (!ok) id.name[0] = 0;
    }
    KEEL_CHECK(keel_comm_broadcast(c, &id, sizeof id / 2, KEEL_COMM_BF16, 0) == KEEL_OK, "window name");
    if (w->rank != 0) ok = id.name[0] && open_file(w, id.name, id.token);
    double failed = ok ? 0 : 1;
    KEEL_CHECK(keel_comm_allreduce_scalar(c, &failed, KEEL_COMM_MAX) == KEEL_OK, "window check");
    if (w->rank == 0 && id.name[0]) shm_unlink(id.name); /* every rank has it open, or gives up on it */
    if (failed > 0) {
        if (w->base) munmap(w->base, w->map_bytes);
        keel_free(w->slot_at);
        keel_free(w->bytes);
        keel_free(w);
        return NULL;
    }
    w->pid_ns = pid_namespace();
    members(w)[w->rank] = (member){.pid_ns = w->pid_ns, .pid = (int64_t)getpid()};
    w->gen = keel_xcalloc(sizeof(uint32_t) * (size_t)n, "window generations");
    w->seq = keel_xcalloc(sizeof(uint64_t) * (size_t)n, "window operations");
    KEEL_CHECK(keel_comm_barrier(c) == KEEL_OK, "window barrier"); /* every member written */
    return w;
}

void keel_comm_window_free(keel_comm_window *w) {
    if (!w) return;
    munmap(w->base, w->map_bytes);
    keel_free(w->slot_at);
    keel_free(w->bytes);
    keel_free(w->gen);
    keel_free(w->seq);
    keel_free(w);
}

void *keel_comm_window_slot(const keel_comm_window *w, int s) {
    check_slot(w, s);
    return w->bytes[s] ? w->base + w->slot_at[s] : NULL;
}

/* ---- the counters ------------------------------------------------------------- */

/* rows: published_at or released_at */
static _Atomic uint32_t *counter(const keel_comm_window *w, size_t rows, int rank, int s) {
    return (_Atomic uint32_t *)(w->base + rows) + (size_t)rank * w->stride + (size_t)s;
}

static void put(_Atomic uint32_t *a, uint32_t v) {
    atomic_store_explicit(a, v, memory_order_release);
    syscall(SYS_futex, a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static _Noreturn void peer_lost(const keel_comm_window *w, int rank) {
    keel_errorf("comm: lost rank %d (its process %d is gone) while waiting on a node window; this rank ends the "
                "attempt (exit %d)",
                rank, (int)members(w)[rank].pid, KEEL_EXIT_PEER_LOST);
    comm_end_lost(w->comm->eng);
}

/* Until every rank's counter of slot s has reached target (counters wrap:
 * compared as a difference). Sleeps on the word, waking now and then to see
 * that the rank it waits for still exists; while a caller sleeps, the
 * heartbeat names operation seq as the one this rank waits for and runs (a
 * hung peer is the one that never issued it). seq 0: the comm thread, whose
 * running operation names it already. */
static void wait_all(const keel_comm_window *w, size_t rows, int s, uint32_t target, uint64_t seq) {
    engine *eng = w->comm->eng;
    bool marked = false;
    for (int r = 0; r < w->size; r++) {
        _Atomic uint32_t *a = counter(w, rows, r, s);
        double checked = keel_now_s(), gone = 0; /* when rank r's process was first seen gone */
        for (int spin = 0;; spin++) {
            uint32_t v = atomic_load_explicit(a, memory_order_acquire);
            if ((int32_t)(v - target) >= 0) break;
            if (spin < 100) {
                __builtin_ia32_pause();
                continue;
            }
            if (!marked && seq) {
                pthread_mutex_lock(&eng->mu);
                eng->stats.waiting = eng->window_op = seq;
                pthread_mutex_unlock(&eng->mu);
                marked = true;
            }
            struct timespec nap = {0, 100 * 1000 * 1000};
            syscall(SYS_futex, a, FUTEX_WAIT, v, &nap, NULL, 0);
            if (keel_now_s() - checked > ALIVE_CHECK_S) {
                checked = keel_now_s();
                const member *m = &members(w)[r];
                if (m->pid_ns == w->pid_ns && m->pid > 0 && kill((pid_t)m->pid, 0) != 0 && errno == ESRCH) {
                    if (gone == 0) gone = checked;
                    if (checked - gone >= LOST_GRACE_S) peer_lost(w, r);
                }
            }
        }
    }
    if (marked) {
        pthread_mutex_lock(&eng->mu);
        eng->stats.waiting = eng->window_op = 0;
        pthread_mutex_unlock(&eng->mu);
    }
}

void keel_comm_window_claim(keel_comm_window *w, int s) {
    check_slot(w, s);
    engine *eng = w->comm->eng;
    pthread_mutex_lock(&eng->mu); /* numbered with the queue's operations: the same k on every rank */
    w->seq[s] = ++eng->stats.issued;
    pthread_mutex_unlock(&eng->mu);
    uint32_t g = ++w->gen[s];
    wait_all(w, w->released_at, s, g - 1, w->seq[s]);
}

void keel_comm_window_publish(keel_comm_window *w, int s) {
    check_slot(w, s);
    put(counter(w, w->published_at, w->rank, s), w->gen[s]);
}

void keel_comm_window_await(keel_comm_window *w, int s) {
    check_slot(w, s);
    wait_all(w, w->published_at, s, w->gen[s], w->seq[s]);
}

void keel_comm_window_release(keel_comm_window *w, int s) {
    check_slot(w, s);
    put(counter(w, w->released_at, w->rank, s), w->gen[s]);
}

/* ---- reduce-scatter in place ----------------------------------------------------- */

/* This rank's slice of every rank's part, summed into its own part's slice
 * in the ring's order (ring.c): starting at rank r+1 and going around, rank
 * r's own values last — so the result is keel_comm_reduce_scatter's bit for
 * bit. Then the slot is released: its owner may write its part again. On the
 * comm thread, as the operation's transfer. */
static void window_reduce_scatter(engine *eng, const keel_comm_req *req) {
    keel_comm_window *w = req->win;
    int s = req->slot, r = w->rank, W = w->size;
    wait_all(w, w->published_at, s, req->gen, 0);
    size_t esize = keel_comm_dtype_size(req->dtype), bytes = req->count * esize;
    char *base = keel_comm_window_slot(w, s);
#define PART(k, lo) (base + ((size_t)(k) * req->stride + (size_t)r * req->count) * esize + (lo))
    for (size_t lo = 0; lo < bytes; lo += RING_SEGMENT_BYTES) {
        size_t n = (bytes - lo < RING_SEGMENT_BYTES ? bytes - lo : RING_SEGMENT_BYTES) / esize;
        const char *acc = PART((r + 1) % W, lo);
        for (int k = 2; k < W; k++) {
            ring_combine(eng->ring_scratch[0], acc, PART((r + k) % W, lo), n, req->dtype, req->op);
            acc = eng->ring_scratch[0];
        }
        ring_combine(PART(r, lo), acc, PART(r, lo), n, req->dtype, req->op);
    }
#undef PART
    put(counter(w, w->released_at, r, s), req->gen);
}

keel_status keel_comm_window_ireduce_scatter(keel_comm_window *w, int s, size_t stride, size_t count,
                                            keel_comm_dtype dtype, keel_comm_req **req) {
    check_slot(w, s);
    KEEL_CHECK(dtype == KEEL_COMM_F32 || dtype == KEEL_COMM_BF16 || dtype == KEEL_COMM_F64, "unknown dtype %d",
               (int)dtype);
    size_t esize = keel_comm_dtype_size(dtype);
    KEEL_CHECK(count * (size_t)w->size <= stride && stride * (size_t)w->size * esize <= w->bytes[s],
               "window reduce-scatter of %zu elements a rank, parts %zu apart, past slot %d's %zu bytes", count, stride,
               s, w->bytes[s]);
    put(counter(w, w->published_at, w->rank, s), w->gen[s]); /* this rank's part, at once */
    return comm_run_async((keel_comm_req){.kind = OP_WINDOW_REDUCE_SCATTER, .comm = w->comm, .win = w,
                                          .run = window_reduce_scatter, .slot = s, .gen = w->gen[s],
                                          .stride = stride, .count = count, .dtype = dtype, .op = KEEL_COMM_SUM},
                          req);
}
