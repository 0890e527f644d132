/* ckpt/segment.c: in-memory snapshots — one shared-memory segment per rank
 * (/dev/shm/keel-snap-<run id>-w<world size>-r<rank>) that outlives the process, holding
 * the rank's packed shard (parameters, AdamW m and v) of the newest steps in
 * two slots, with the commit discipline of disk checkpoints: a slot is marked
 * "writing" before its bytes change and "committed" (with its step and the
 * XXH3 of its bytes) only after, so a process killed mid-copy leaves the
 * other slot good. The run id is the XXH3 of the run directory's real path
 * and inode: a directory removed and made again is another run, and a
 * segment names the run directory it belongs to so stale ones can be found.
 *
 * Other runs on the machine share /dev/shm: a segment appears under its name
 * only whole (created under a temporary name, its header written, then
 * renamed), and only a process that sees the filesystem its creator saw (the
 * same mount namespace) may judge it stale — a node of `keel cluster` with a
 * private /tmp cannot see the run directories of the host's runs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#define XXH_STATIC_LINKING_ONLY /* a streaming state on the stack */
#include <xxhash.h>

#include "keel/ckpt.h"

#define SNAP_MAGIC "KEELSNP1"
#define SNAP_VERSION 3
#define HEADER_BYTES 4096
#define SHM_DIR "/dev/shm"

enum { SLOT_EMPTY = 0, SLOT_WRITING = 1, SLOT_COMMITTED = 2 };

typedef struct {
    _Atomic uint32_t state;
    uint32_t pad;
    int64_t step;
    uint64_t xxh3;
} slot_header;

typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t run_id;
    uint32_t uid;
    int32_t rank, world_size;
    int32_t shard_ranks, shard_rank; /* the layout of the packed shard (the checkpoint file's) */
    uint64_t floats; /* per slot */
    uint64_t key;    /* what the state must match to be resumed (the run's configuration) */
    slot_header slot[2];
    char run_dir[2048];
    uint64_t mount_ns; /* the creator's mount namespace: where run_dir means what it says */
} segment_header;
_Static_assert(sizeof(segment_header) <= HEADER_BYTES, "snapshot header");

struct keel_snap {
    int fd;
    char path[512];
    segment_header *h;
    size_t bytes;
    float *data[2];
};

keel_status keel_snap_run_id(const char *run_dir, uint64_t *id, char *real, size_t real_n) {
    char buf[4096];
    struct stat st;
    if (!realpath(run_dir, buf) || stat(buf, &st) != 0) {
        keel_errorf("%s: %s", run_dir, strerror(errno));
        return KEEL_ERR_IO;
    }
    XXH3_state_t *s = XXH3_createState();
    KEEL_CHECK(s && XXH3_64bits_reset(s) == XXH_OK, "XXH3 state");
    XXH3_64bits_update(s, buf, strlen(buf));
    uint64_t ino = (uint64_t)st.st_ino, dev = (uint64_t)st.st_dev;
    XXH3_64bits_update(s, &ino, sizeof ino);
    XXH3_64bits_update(s, &dev, sizeof dev);
    *id = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    if (real) snprintf(real, real_n, "%s", buf);
    return KEEL_OK;
}

static void segment_path(char *out, size_t n, uint64_t run_id, int world_size, int rank, bool replica) {
    snprintf(out, n, SHM_DIR "/keel-snap-%016llx-w%d-%c%d", (unsigned long long)run_id, world_size,
             replica ? 'b' : 'r', rank);
}

/* Map an open segment of `bytes` (read-only: another world's, only read). */
static keel_status map_segment(keel_snap *s, bool writable) {
    /* this rank's own (writable): populated, one call mapping every page instead of a fault per
     * page on the first copy; another world's are read only in part */
    void *map = mmap(NULL, s->bytes, PROT_READ | (writable ? PROT_WRITE : 0),
                     MAP_SHARED | (writable ? MAP_POPULATE : 0), s->fd, 0);
    if (map == MAP_FAILED) {
        keel_errorf("%s: cannot map %zu bytes: %s", s->path, s->bytes, strerror(errno));
        return KEEL_ERR_IO;
    }
    s->h = map;
    s->data[0] = (float *)((char *)map + HEADER_BYTES);
    s->data[1] = s->data[0] + (s->bytes - HEADER_BYTES) / (2 * sizeof(float));
    return KEEL_OK;
}

static size_t segment_bytes(int64_t floats) { return HEADER_BYTES + 2 * sizeof(float) * (size_t)floats; }

/* This process's mount namespace (0 where /proc cannot say). */
static uint64_t mount_namespace(void) {
    struct stat st;
    return stat("/proc/self/ns/mnt", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

#define TMP_PREFIX "keel-snaptmp-"

/* A fresh segment at s->path: allocated, mapped and its header written under
 * a temporary name, then renamed over whatever was there, so no other
 * process ever sees it half made. */
static keel_status create_segment(keel_snap *s, uint64_t id, const char *real, const keel_snap_shape *shape,
                                  uint64_t key) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, SHM_DIR "/" TMP_PREFIX "%d-%s", (int)getpid(), strrchr(s->path, '/') + 1);
    s->fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd < 0) {
        keel_errorf("%s: cannot create: %s (is /dev/shm mounted?)", tmp, strerror(errno));
        return KEEL_ERR_IO;
    }
    /* every page is allocated now: a tmpfs that fills up later would kill the writer with SIGBUS */
    int err = posix_fallocate(s->fd, 0, (off_t)s->bytes);
    keel_status st = KEEL_OK;
    if (err != 0) {
        keel_errorf("%s: cannot allocate %.1f MB: %s (" SHM_DIR " too small? resilience.snapshot_every_steps 0 "
                    "turns snapshots off)", s->path, (double)s->bytes / 1e6, strerror(err));
        st = KEEL_ERR_IO;
    }
    if (st == KEEL_OK) st = map_segment(s, true);
    if (st == KEEL_OK) {
        memset(s->h, 0, sizeof *s->h);
        memcpy(s->h->magic, SNAP_MAGIC, 8);
        s->h->version = SNAP_VERSION, s->h->header_bytes = HEADER_BYTES, s->h->run_id = id;
        s->h->uid = (uint32_t)getuid(), s->h->rank = shape->rank, s->h->world_size = shape->world_size;
        s->h->shard_ranks = shape->shard_ranks, s->h->shard_rank = shape->shard_rank;
        s->h->floats = (uint64_t)shape->floats, s->h->key = key;
        snprintf(s->h->run_dir, sizeof s->h->run_dir, "%s", real);
        s->h->mount_ns = mount_namespace();
        if (rename(tmp, s->path) != 0) {
            keel_errorf("%s: cannot rename into place: %s", s->path, strerror(errno));
            munmap(s->h, s->bytes);
            st = KEEL_ERR_IO;
        }
    }
    if (st != KEEL_OK) {
        close(s->fd);
        unlink(tmp);
    }
    return st;
}

keel_status keel_snap_open(const char *run_dir, const keel_snap_shape *shape, uint64_t key, bool replica,
                           keel_snap **out) {
    int rank = shape->rank, world_size = shape->world_size;
    int64_t floats = shape->floats;
    *out = NULL;
    uint64_t id;
    char real[2048];
    keel_status st = keel_snap_run_id(run_dir, &id, real, sizeof real);
    if (st != KEEL_OK) return st;
    keel_snap *s = keel_xcalloc(sizeof *s, "snapshot");
    segment_path(s->path, sizeof s->path, id, world_size, rank, replica);
    s->bytes = segment_bytes(floats);
    s->fd = open(s->path, O_RDWR | O_CLOEXEC);
    bool fresh = s->fd < 0;
    if (!fresh) { /* a segment of another shape (world size, model) or version is not ours to read: start it over */
        struct stat fs;
        segment_header h;
        fresh = fstat(s->fd, &fs) != 0 || (size_t)fs.st_size != s->bytes ||
                pread(s->fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, SNAP_MAGIC, 8) ||
                h.version != SNAP_VERSION || h.run_id != id || h.rank != rank || h.world_size != world_size ||
                h.shard_ranks != shape->shard_ranks || h.shard_rank != shape->shard_rank ||
                h.floats != (uint64_t)floats || h.key != key;
        if (fresh) close(s->fd);
    }
    if (fresh && (st = create_segment(s, id, real, shape, key)) != KEEL_OK) {
        keel_free(s);
        return st;
    }
    if (!fresh && (st = map_segment(s, true)) != KEEL_OK) {
        close(s->fd);
        keel_free(s);
        return st;
    }
    *out = s;
    return KEEL_OK;
}

int keel_snap_steps(const keel_snap *s, int64_t steps[2]) {
    int n = 0;
    for (int i = 0; i < 2; i++)
        if (atomic_load_explicit(&s->h->slot[i].state, memory_order_acquire) == SLOT_COMMITTED)
            steps[n++] = s->h->slot[i].step;
    if (n == 2 && steps[0] < steps[1]) {
        int64_t t = steps[0];
        steps[0] = steps[1], steps[1] = t;
    }
    return n;
}

/* The slot to write next: an empty one, else the older committed one. */
static int next_slot(const keel_snap *s) {
    const slot_header *a = &s->h->slot[0], *b = &s->h->slot[1];
    if (atomic_load(&a->state) != SLOT_COMMITTED) return 0;
    if (atomic_load(&b->state) != SLOT_COMMITTED) return 1;
    return a->step <= b->step ? 0 : 1;
}

float *keel_snap_begin(keel_snap *s, int64_t step, int *slot) {
    /* a committed step at or after this one is from a timeline a relaunch
     * abandoned (it resumed from an older step): never to be offered again */
    for (int i = 0; i < 2; i++)
        if (atomic_load(&s->h->slot[i].state) == SLOT_COMMITTED && s->h->slot[i].step >= step)
            atomic_store_explicit(&s->h->slot[i].state, SLOT_EMPTY, memory_order_release);
    *slot = next_slot(s);
    atomic_store_explicit(&s->h->slot[*slot].state, SLOT_WRITING, memory_order_release);
    return s->data[*slot];
}

static void commit(keel_snap *s, int slot, int64_t step, uint64_t xxh3) {
    slot_header *x = &s->h->slot[slot];
    x->xxh3 = xxh3;
    x->step = step;
    atomic_store_explicit(&x->state, SLOT_COMMITTED, memory_order_release);
}

void keel_snap_commit(keel_snap *s, int slot, int64_t step) {
    commit(s, slot, step, XXH3_64bits(s->data[slot], sizeof(float) * s->h->floats));
}

/* n bytes that nothing reads soon: streaming stores, which skip the caches
 * (and the read of each line a plain store does first). Ordered before a
 * later store only by an sfence. */
static void stream_copy(char *dst, const char *src, size_t n) {
#ifdef __SSE2__
    size_t i = (16 - ((uintptr_t)dst & 15)) & 15;
    if (i > n) i = n;
    memcpy(dst, src, i);
    for (; i + 16 <= n; i += 16) _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
    memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const keel_snap_piece *)a)->at, y = ((const keel_snap_piece *)b)->at;
    return (x > y) - (x < y);
}

/* A piece at a time of FILL_CHUNK bytes: hashed (which brings it into the
 * cache) and then streamed into the slot from there. */
#define FILL_CHUNK (64 << 10)

void keel_snap_fill(keel_snap *s, int slot, int64_t step, keel_snap_piece *pieces, int n) {
    qsort(pieces, (size_t)n, sizeof *pieces, by_offset);
    char *slot_bytes = (char *)s->data[slot];
    XXH3_state_t h;
    KEEL_CHECK(XXH3_64bits_reset(&h) == XXH_OK, "XXH3 state");
    size_t done = 0; /* bytes of the slot hashed */
    for (int i = 0; i < n; i++) {
        size_t at = sizeof(float) * (size_t)pieces[i].at, bytes = sizeof(float) * (size_t)pieces[i].n;
        KEEL_CHECK(at >= done && at + bytes <= sizeof(float) * s->h->floats, "snapshot piece %d out of place", i);
        XXH3_64bits_update(&h, slot_bytes + done, at - done); /* padding between pieces, as it is */
        const char *src = (const char *)pieces[i].src;
        for (size_t lo = 0; lo < bytes; lo += FILL_CHUNK) {
            size_t k = bytes - lo < FILL_CHUNK ? bytes - lo : FILL_CHUNK;
            XXH3_64bits_update(&h, src + lo, k);
            stream_copy(slot_bytes + at + lo, src + lo, k);
        }
        done = at + bytes;
    }
    XXH3_64bits_update(&h, slot_bytes + done, sizeof(float) * s->h->floats - done);
#ifdef __SSE2__
    _mm_sfence(); /* the streamed bytes before the commit */
#endif
    commit(s, slot, step, XXH3_64bits_digest(&h));
}

keel_status keel_snap_get(const keel_snap *s, int64_t step, const float **data) {
    for (int i = 0; i < 2; i++) {
        const slot_header *x = &s->h->slot[i];
        if (atomic_load_explicit(&x->state, memory_order_acquire) != SLOT_COMMITTED || x->step != step) continue;
        if (XXH3_64bits(s->data[i], sizeof(float) * s->h->floats) != x->xxh3) {
            keel_errorf("%s: the snapshot of step %lld fails its checksum (damaged memory?)", s->path,
                        (long long)step);
            return KEEL_ERR_INPUT;
        }
        *data = s->data[i];
        return KEEL_OK;
    }
    keel_errorf("%s: no committed snapshot of step %lld", s->path, (long long)step);
    return KEEL_ERR_INPUT;
}

const char *keel_snap_path(const keel_snap *s) { return s->path; }

void keel_snap_mapping(const keel_snap *s, void **base, size_t *bytes) {
    *base = s->h;
    *bytes = s->bytes;
}

void keel_snap_close(keel_snap *s, bool remove) {
    if (!s) return;
    if (remove) unlink(s->path);
    munmap(s->h, s->bytes);
    close(s->fd);
    keel_free(s);
}

/* Every segment of keel's in /dev/shm, and its header. */
static int each_segment(void (*fn)(void *ctx, const char *path, const segment_header *h), void *ctx) {
    DIR *d = opendir(SHM_DIR);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "keel-snap-", 10)) continue;
        char path[512];
        snprintf(path, sizeof path, SHM_DIR "/%s", e->d_name);
        segment_header h;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool ok = fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h;
        if (fd >= 0) close(fd);
        if (!ok) memset(&h, 0, sizeof h);
        h.run_dir[sizeof h.run_dir - 1] = 0;
        fn(ctx, path, &h);
        n++;
    }
    closedir(d);
    return n;
}

typedef struct {
    uint64_t run_id; /* remove this run's segments (0: only stale ones) */
    int keep_world;  /* > 0: only this run's segments of other world sizes */
    int removed;
} sweep;

static void sweep_one(void *ctx, const char *path, const segment_header *h) {
    sweep *w = ctx;
    bool ours = !memcmp(h->magic, SNAP_MAGIC, 8) && h->uid == (uint32_t)getuid();
    if (!ours && memcmp(h->magic, SNAP_MAGIC, 8)) ours = true; /* unreadable or torn: no one can use it */
    if (!ours) return;
    bool remove_it = w->run_id != 0 && h->run_id == w->run_id && h->world_size != w->keep_world;
    if (w->run_id == 0) { /* stale: its run directory is gone, or is another run now */
        /* ...as its creator would see it: a process in another mount namespace cannot tell */
        if (!memcmp(h->magic, SNAP_MAGIC, 8) && h->version == SNAP_VERSION && h->mount_ns != mount_namespace())
            return;
        uint64_t id;
        keel_error_capture(true);
        remove_it = !h->run_dir[0] || keel_snap_run_id(h->run_dir, &id, NULL, 0) != KEEL_OK || id != h->run_id;
        keel_error_capture(false);
    }
    if (remove_it && unlink(path) == 0) w->removed++;
}

/* The run id of run_dir, or false (a directory gone has no segments to find). */
static bool run_id_of(const char *run_dir, uint64_t *id) {
    keel_error_capture(true);
    keel_status st = keel_snap_run_id(run_dir, id, NULL, 0);
    keel_error_capture(false);
    return st == KEEL_OK;
}

/* Unlink run_dir's segments but those of world size keep_world (0: none kept). */
static int remove_of_run(const char *run_dir, int keep_world) {
    sweep w = {.keep_world = keep_world};
    if (!run_id_of(run_dir, &w.run_id)) return 0;
    each_segment(sweep_one, &w);
    return w.removed;
}

int keel_snap_remove_run(const char *run_dir) { return remove_of_run(run_dir, 0); }

int keel_snap_remove_other_worlds(const char *run_dir, int world_size) { return remove_of_run(run_dir, world_size); }

keel_snap_shape keel_snap_get_shape(const keel_snap *s) {
    return (keel_snap_shape){.rank = s->h->rank, .world_size = s->h->world_size, .shard_ranks = s->h->shard_ranks,
                             .shard_rank = s->h->shard_rank, .floats = (int64_t)s->h->floats};
}

typedef struct {
    uint64_t run_id, key;
    int world_size;
    keel_snap **found;
    int n;
} others;

static void open_other(void *ctx, const char *path, const segment_header *h) {
    others *o = ctx;
    if (memcmp(h->magic, SNAP_MAGIC, 8) || h->version != SNAP_VERSION || h->uid != (uint32_t)getuid() ||
        h->run_id != o->run_id || h->key != o->key || h->world_size == o->world_size)
        return;
    keel_snap *s = keel_xcalloc(sizeof *s, "snapshot");
    snprintf(s->path, sizeof s->path, "%s", path);
    s->bytes = segment_bytes((int64_t)h->floats);
    struct stat fs;
    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    keel_error_capture(true);
    bool ok = s->fd >= 0 && fstat(s->fd, &fs) == 0 && (size_t)fs.st_size == s->bytes &&
              map_segment(s, false) == KEEL_OK;
    keel_error_capture(false);
    if (!ok) {
        if (s->fd >= 0) close(s->fd);
        keel_free(s);
        return;
    }
    o->found = keel_xrealloc(o->found, sizeof *o->found * (size_t)(o->n + 1), "snapshots");
    o->found[o->n++] = s;
}

int keel_snap_open_others(const char *run_dir, int world_size, uint64_t key, keel_snap ***out) {
    others o = {.key = key, .world_size = world_size};
    *out = NULL;
    if (!run_id_of(run_dir, &o.run_id)) return 0;
    each_segment(open_other, &o);
    *out = o.found;
    return o.n;
}

int keel_snap_remove_stale(void) {
    sweep w = {0};
    each_segment(sweep_one, &w);
    /* a segment whose creation was cut short (the process died before the rename): old enough to be abandoned */
    DIR *d = opendir(SHM_DIR);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[512];
        struct stat st;
        snprintf(path, sizeof path, SHM_DIR "/%s", e->d_name);
        if (!strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) && stat(path, &st) == 0 &&
            st.st_uid == getuid() && time(NULL) - st.st_mtime > 600 && unlink(path) == 0)
            w.removed++;
    }
    if (d) closedir(d);
    return w.removed;
}
