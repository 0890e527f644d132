/* ckpt/checkpoint.c: the sharded checkpoint format — shard files, manifest,
 * commit by rename, LATEST, listing, verification, resharding reads. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "keel/ckpt.h"
#include "keel/fsdp.h"

typedef struct {
    char magic[8];
    uint32_t version, rank, ranks, arrays;
    uint64_t step, floats;
    uint8_t pad[24];
} shard_header;
_Static_assert(sizeof(shard_header) == KEEL_CKPT_HEADER_BYTES, "checkpoint header is 64 bytes");

void keel_ckpt_dir(char *out, size_t n, const char *run_dir, int64_t step, bool tmp) {
    snprintf(out, n, "%s/checkpoints/step_%08lld%s", run_dir, (long long)step, tmp ? ".tmp" : "");
}

static void shard_name(char *out, size_t n, int rank, int ranks) {
    snprintf(out, n, "shard-%05d-of-%05d.bin", rank, ranks);
}

struct keel_ckpt_writer {
    int fd;
    char path[4200];
    XXH3_state_t *hash;
    int64_t floats_left;   /* of the KEEL_CKPT_ARRAYS arrays still to come */
    int64_t bytes;         /* the whole file's */
    keel_status st;        /* the first failure (reported at finish) */
    int err;
};

/* Hash what goes into the file as it is written; the write is quiet (finish
 * words the one error line, errno kept). */
static void write_hashed(keel_ckpt_writer *w, const void *data, size_t bytes) {
    if (w->st != KEEL_OK) return;
    XXH3_64bits_update(w->hash, data, bytes);
    if ((w->st = keel_write_all(w->fd, data, bytes, NULL)) != KEEL_OK) w->err = errno;
}

keel_status keel_ckpt_shard_begin(const char *dir, int rank, int ranks, int64_t step, int64_t floats,
                                  keel_ckpt_writer **out) {
    char name[64];
    shard_name(name, sizeof name, rank, ranks);
    keel_status st = keel_mkdirs(dir);
    if (st != KEEL_OK) return st;
    keel_ckpt_writer *w = keel_xcalloc(sizeof *w, "checkpoint writer");
    snprintf(w->path, sizeof w->path, "%s/%s", dir, name);
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        keel_errorf("%s: cannot create: %s", w->path, strerror(errno));
        keel_free(w);
        return KEEL_ERR_IO;
    }
    shard_header hd = {.version = KEEL_CKPT_VERSION, .rank = (uint32_t)rank, .ranks = (uint32_t)ranks,
                       .arrays = KEEL_CKPT_ARRAYS, .step = (uint64_t)step, .floats = (uint64_t)floats};
    memcpy(hd.magic, KEEL_CKPT_MAGIC, 8);
    w->hash = XXH3_createState();
    KEEL_CHECK(w->hash && XXH3_64bits_reset(w->hash) == XXH_OK, "XXH3 state");
    w->floats_left = floats * KEEL_CKPT_ARRAYS;
    w->bytes = (int64_t)sizeof hd + (int64_t)sizeof(float) * w->floats_left;
    write_hashed(w, &hd, sizeof hd);
    *out = w;
    return KEEL_OK;
}

keel_status keel_ckpt_shard_append(keel_ckpt_writer *w, const float *values, int64_t n) {
    KEEL_CHECK(n <= w->floats_left, "%lld floats past the end of %s", (long long)n, w->path);
    w->floats_left -= n;
    if (values) {
        write_hashed(w, values, sizeof(float) * (size_t)n);
        return w->st;
    }
    static const float zeros[4096];
    for (int64_t done = 0; done < n && w->st == KEEL_OK; done += 4096)
        write_hashed(w, zeros, sizeof(float) * (size_t)(n - done < 4096 ? n - done : 4096));
    return w->st;
}

keel_status keel_ckpt_shard_finish(keel_ckpt_writer *w, keel_ckpt_file *file) {
    KEEL_CHECK(w->st != KEEL_OK || w->floats_left == 0, "%s: %lld floats never written", w->path,
               (long long)w->floats_left);
    if (w->st == KEEL_OK && fsync(w->fd) != 0) w->st = KEEL_ERR_IO, w->err = errno;
    if (close(w->fd) != 0 && w->st == KEEL_OK) w->st = KEEL_ERR_IO, w->err = errno;
    file->xxh3 = XXH3_64bits_digest(w->hash);
    file->bytes = w->bytes;
    if (w->st != KEEL_OK)
        keel_errorf("%s: checkpoint write failed: %s (%lld bytes needed; older checkpoints are "
                    "untouched)", w->path, strerror(w->err), (long long)file->bytes);
    keel_status st = w->st;
    XXH3_freeState(w->hash);
    keel_free(w);
    return st;
}

void keel_ckpt_shard_abort(keel_ckpt_writer *w) {
    if (w->st != KEEL_OK) /* the file's own failure is said here; a source's was said by the source */
        keel_errorf("%s: checkpoint write failed: %s (%lld bytes needed)", w->path, strerror(w->err),
                    (long long)w->bytes);
    close(w->fd);
    unlink(w->path);
    XXH3_freeState(w->hash);
    keel_free(w);
}

keel_status keel_ckpt_write_shard(const char *dir, int rank, int ranks, int64_t step,
                                  const float *const arrays[KEEL_CKPT_ARRAYS], int64_t floats,
                                  keel_ckpt_file *file) {
    keel_ckpt_writer *w;
    keel_status st = keel_ckpt_shard_begin(dir, rank, ranks, step, floats, &w);
    if (st != KEEL_OK) return st;
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++) keel_ckpt_shard_append(w, arrays[a], floats);
    return keel_ckpt_shard_finish(w, file);
}

char *keel_ckpt_manifest_json(const keel_ckpt_meta *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "keel-checkpoint");
    cJSON_AddNumberToObject(o, "version", KEEL_CKPT_VERSION);
    cJSON_AddStringToObject(o, "keel_version", KEEL_VERSION);
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(o, "created", when);
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "global_batch", (double)m->global_batch);
    cJSON *world = cJSON_AddObjectToObject(o, "world");
    cJSON_AddNumberToObject(world, "size", m->world_size);
    cJSON_AddStringToObject(world, "strategy", m->strategy);
    cJSON_AddNumberToObject(world, "shard_ranks", m->plan->shard_ranks);
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddNumberToObject(data, "seed", (double)m->seed);
    cJSON_AddNumberToObject(data, "next_step", (double)m->step);
    cJSON_AddNumberToObject(data, "samples_consumed", (double)m->step * (double)m->global_batch);
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddNumberToObject(rng, "seed", (double)m->seed);
    cJSON_AddStringToObject(rng, "note", "keel keeps no random state: the data order is a function of (seed, "
                                         "step), LoRA's dropout masks of (seed, step, sample)");
    cJSON *lr = cJSON_AddObjectToObject(o, "lr_schedule");
    cJSON_AddNumberToObject(lr, "step", (double)m->step);
    cJSON_AddNumberToObject(lr, "next_lr", m->next_lr);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(m->config_json));
    if (m->lora_base) {
        cJSON *lora = cJSON_AddObjectToObject(o, "lora");
        cJSON_AddStringToObject(lora, "note", "the files hold LoRA adapters; the base is not copied: it is read from "
                                              "\"base\", which must still hold the checkpoint of identity \"base_id\"");
        cJSON_AddStringToObject(lora, "base", m->lora_base);
        cJSON_AddStringToObject(lora, "base_id", m->lora_base_id);
    }
    cJSON *arrays = cJSON_AddArrayToObject(o, "arrays");
    const char *names[KEEL_CKPT_ARRAYS] = {"params", "adamw_m", "adamw_v"};
    for (int i = 0; i < KEEL_CKPT_ARRAYS; i++) cJSON_AddItemToArray(arrays, cJSON_CreateString(names[i]));
    cJSON *units = cJSON_AddArrayToObject(o, "units");
    for (int u = 0; u < m->plan->n_units; u++) {
        const keel_fsdp_unit *x = &m->plan->units[u];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "offset", (double)x->offset);
        cJSON_AddNumberToObject(j, "logical", (double)x->logical);
        cJSON_AddNumberToObject(j, "padded", (double)x->padded);
        cJSON_AddNumberToObject(j, "shard", (double)x->shard);
        cJSON_AddNumberToObject(j, "shard_offset", (double)x->shard_offset);
        cJSON_AddItemToArray(units, j);
    }
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    for (int r = 0; r < m->plan->shard_ranks; r++) {
        char name[64], hex[17];
        shard_name(name, sizeof name, r, m->plan->shard_ranks);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->files[r].xxh3);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", name);
        cJSON_AddNumberToObject(j, "bytes", (double)m->files[r].bytes);
        cJSON_AddStringToObject(j, "xxh3", hex);
        cJSON_AddItemToArray(files, j);
    }
    if (m->n_carried > 0) {
        cJSON *carried = cJSON_AddArrayToObject(o, "carried_files");
        for (int i = 0; i < m->n_carried; i++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->carried[i].xxh3);
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "name", m->carried[i].name);
            cJSON_AddNumberToObject(j, "bytes", (double)m->carried[i].bytes);
            cJSON_AddStringToObject(j, "xxh3", hex);
            cJSON_AddItemToArray(carried, j);
        }
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

void keel_ckpt_remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

keel_status keel_ckpt_commit_dir(const char *tmp, const char *dir, const char *manifest_json) {
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    keel_status st = keel_write_file_atomic(path, manifest_json, strlen(manifest_json));
    if (st != KEEL_OK) return st;
    if (keel_path_exists(dir)) { /* an unusable one from before a resume: keep it aside */
        char aside[4200];
        snprintf(aside, sizeof aside, "%s.replaced", dir);
        keel_ckpt_remove_tree(aside);
        if (rename(dir, aside) == 0) keel_log_warn("%s existed (not usable at resume); kept as %s", dir, aside);
    }
    return keel_commit_dir(tmp, dir);
}

keel_status keel_ckpt_commit(const char *run_dir, int64_t step, const char *manifest_json) {
    char tmp[4096], dir[4096], path[4200];
    keel_ckpt_dir(tmp, sizeof tmp, run_dir, step, true);
    keel_ckpt_dir(dir, sizeof dir, run_dir, step, false);
    keel_status st = keel_ckpt_commit_dir(tmp, dir, manifest_json);
    if (st != KEEL_OK) return st;
    char latest[64];
    int n = snprintf(latest, sizeof latest, "step_%08lld\n", (long long)step);
    snprintf(path, sizeof path, "%s/checkpoints/LATEST", run_dir);
    return keel_write_file_atomic(path, latest, (size_t)n);
}

/* step_NNNNNNNN (committed) or step_NNNNNNNN.tmp: the step, or -1. */
static int64_t parse_step(const char *name, bool *tmp) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    if (end == name + 5 || v < 0) return -1;
    *tmp = !strcmp(end, ".tmp");
    return *tmp || *end == 0 ? v : -1;
}

/* Every step_* entry under RUN/checkpoints: steps and whether each is a .tmp. */
static int scan(const char *run_dir, int64_t **steps, bool **tmps) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s/checkpoints", run_dir);
    *steps = NULL;
    *tmps = NULL;
    DIR *d = opendir(parent);
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        bool tmp;
        int64_t s = parse_step(e->d_name, &tmp);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = keel_xrealloc(*steps, sizeof(int64_t) * (size_t)cap, "checkpoint list");
            *tmps = keel_xrealloc(*tmps, sizeof(bool) * (size_t)cap, "checkpoint list");
        }
        (*steps)[n] = s;
        (*tmps)[n++] = tmp;
    }
    closedir(d);
    return n;
}

void keel_ckpt_clean_tmp(const char *run_dir) {
    int64_t *steps;
    bool *tmps;
    int n = scan(run_dir, &steps, &tmps);
    char dir[4096];
    for (int i = 0; i < n; i++)
        if (tmps[i]) {
            keel_ckpt_dir(dir, sizeof dir, run_dir, steps[i], true);
            keel_ckpt_remove_tree(dir);
        }
    keel_free(steps);
    keel_free(tmps);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

int keel_ckpt_list(const char *run_dir, int64_t **out) {
    int64_t *steps;
    bool *tmps;
    int n = scan(run_dir, &steps, &tmps), k = 0;
    for (int i = 0; i < n; i++)
        if (!tmps[i]) steps[k++] = steps[i];
    keel_free(tmps);
    if (k > 1) qsort(steps, (size_t)k, sizeof(int64_t), cmp_desc);
    /* LATEST first: it names the last commit even if a newer directory appeared by hand. */
    int64_t latest = keel_ckpt_latest(run_dir);
    for (int i = 0; i < k && latest >= 0; i++)
        if (steps[i] == latest) {
            memmove(steps + 1, steps, sizeof(int64_t) * (size_t)i);
            steps[0] = latest;
            break;
        }
    *out = steps;
    return k;
}

int64_t keel_ckpt_latest(const char *run_dir) {
    char path[4200], *text;
    snprintf(path, sizeof path, "%s/checkpoints/LATEST", run_dir);
    if (keel_read_file_quiet(path, 64, &text, NULL) != KEEL_OK) return -1; /* absent before the first commit */
    bool tmp;
    text[strcspn(text, "\n")] = 0;
    int64_t latest = parse_step(text, &tmp);
    keel_free(text);
    return latest;
}

void keel_ckpt_retain(const char *run_dir, int keep_last, int64_t keep) {
    if (keep_last <= 0) return;
    int64_t *steps;
    int n = keel_ckpt_list(run_dir, &steps);
    if (n > 1) qsort(steps, (size_t)n, sizeof(int64_t), cmp_desc);
    char dir[4096];
    for (int i = keep_last; i < n; i++)
        if (steps[i] != keep && steps[i] < keep) {
            keel_ckpt_dir(dir, sizeof dir, run_dir, steps[i], false);
            keel_ckpt_remove_tree(dir);
        }
    keel_free(steps);
}

/* ---- reading ---------------------------------------------------------------- */

static const cJSON *get(const cJSON *o, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* What a manifest may claim: sizes beyond these are not a checkpoint keel
 * wrote (a shard of 2^62 floats, 10^6 shard ranks), and every product and
 * sum below is checked against overflow as well. */
#define MAX_SHARD_RANKS (1 << 20)
#define MAX_FLOATS ((int64_t)1 << 50)
#define MAX_MANIFEST_BYTES ((size_t)256 << 20)

#define DAMAGED_HINT "the checkpoint is damaged or not keel's; use another (keel ckpt list)"

/* One line naming the manifest and the field. */
static keel_status bad_manifest(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static keel_status bad_manifest(const char *path, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    keel_errorf("%s: %s; " DAMAGED_HINT, path, what);
    return KEEL_ERR_INPUT;
}

/* o[key] as an integer in [lo, hi] (keel_json_int), else one line naming it. */
static bool get_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *path,
                    const char *where) {
    if (keel_json_int(get(o, key), lo, hi, out)) return true;
    bad_manifest(path, "%s\"%s\" must be an integer in [%lld, %lld]", where, key, (long long)lo, (long long)hi);
    return false;
}

/* Units must tile the canonical vector (offset = the logical sizes before)
 * and each rank's shard buffer (shard_offset = the shards before), with
 * padded = shard x shard ranks >= logical: then every read lands inside
 * the file the manifest sizes. A unit may be empty (LoRA adapters have none
 * for the embedding and head): no read lands in it. */
static keel_status parse_units(const cJSON *units, const char *path, keel_ckpt *c) {
    c->plan = keel_xcalloc(sizeof *c->plan, "checkpoint plan");
    c->plan->n_units = cJSON_GetArraySize(units);
    c->plan->shard_ranks = c->shard_ranks;
    c->plan->units = keel_xcalloc(sizeof(keel_fsdp_unit) * (size_t)c->plan->n_units, "checkpoint units");
    int64_t params = 0, shard_total = 0;
    int i = 0;
    const cJSON *u;
    cJSON_ArrayForEach(u, units) {
        keel_fsdp_unit *x = &c->plan->units[i];
        char where[48];
        snprintf(where, sizeof where, "unit %d: ", i++);
        if (!cJSON_IsObject(u)) return bad_manifest(path, "%snot an object", where);
        if (!get_int(u, "offset", 0, MAX_FLOATS, &x->offset, path, where) ||
            !get_int(u, "logical", 0, MAX_FLOATS, &x->logical, path, where) || /* 0: an adapter set's empty unit */
            !get_int(u, "padded", 0, MAX_FLOATS, &x->padded, path, where) ||
            !get_int(u, "shard", 0, MAX_FLOATS, &x->shard, path, where) ||
            !get_int(u, "shard_offset", 0, MAX_FLOATS, &x->shard_offset, path, where))
            return KEEL_ERR_INPUT;
        int64_t padded;
        if (__builtin_mul_overflow(x->shard, (int64_t)c->shard_ranks, &padded) || padded != x->padded ||
            x->logical > x->padded)
            return bad_manifest(path, "%spadded %lld is not shard %lld x %d shard ranks, or is below logical %lld",
                                where, (long long)x->padded, (long long)x->shard, c->shard_ranks,
                                (long long)x->logical);
        if (x->offset != params || x->shard_offset != shard_total)
            return bad_manifest(path, "%soffset %lld, shard_offset %lld: the units must follow each other (%lld, %lld)",
                                where, (long long)x->offset, (long long)x->shard_offset, (long long)params,
                                (long long)shard_total);
        if (__builtin_add_overflow(params, x->logical, &params) ||
            __builtin_add_overflow(shard_total, x->shard, &shard_total) || shard_total > MAX_FLOATS)
            return bad_manifest(path, "%sthe units add up to more than %lld floats", where, (long long)MAX_FLOATS);
    }
    c->plan->shard_total = shard_total;
    return KEEL_OK;
}

/* A file entry: its name, its size (the header and three arrays of
 * shard_total floats) and its XXH3 (16 hex digits). */
static keel_status parse_file(const cJSON *fj, int j, const char *path, keel_ckpt *c) {
    char where[48], name[64];
    snprintf(where, sizeof where, "file %d: ", j);
    shard_name(name, sizeof name, j, c->shard_ranks);
    const cJSON *n = get(fj, "name"), *x = get(fj, "xxh3");
    if (!cJSON_IsObject(fj)) return bad_manifest(path, "%snot an object", where);
    if (n && !(cJSON_IsString(n) && !strcmp(n->valuestring, name)))
        return bad_manifest(path, "%s\"name\" must be \"%s\"", where, name);
    size_t hex = cJSON_IsString(x) ? strspn(x->valuestring, "0123456789abcdefABCDEF") : 0;
    if (!cJSON_IsString(x) || hex != 16 || x->valuestring[16])
        return bad_manifest(path, "%s\"xxh3\" must be 16 hex digits", where);
    int64_t want = KEEL_CKPT_HEADER_BYTES + (int64_t)sizeof(float) * KEEL_CKPT_ARRAYS * c->plan->shard_total;
    if (!get_int(fj, "bytes", 0, INT64_MAX, &c->files[j].bytes, path, where)) return KEEL_ERR_INPUT;
    if (c->files[j].bytes != want)
        return bad_manifest(path, "%s\"bytes\" %lld is not the %lld of a header and %d arrays of %lld floats", where,
                            (long long)c->files[j].bytes, (long long)want, KEEL_CKPT_ARRAYS,
                            (long long)c->plan->shard_total);
    c->files[j].xxh3 = strtoull(x->valuestring, NULL, 16);
    return KEEL_OK;
}

/* A carried file's name: a plain file name of the checkpoint directory that
 * is neither the manifest nor a shard's (no '/', no leading '.', letters,
 * digits, '.', '_', '-'). */
static bool carried_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof(((keel_ckpt_carried *)0)->name) || name[0] == '.' ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
        return false;
    return strcmp(name, "manifest.json") != 0 && strncmp(name, "shard-", 6) != 0;
}

/* "carried_files" (absent: none): at most KEEL_CKPT_MAX_CARRIED entries of
 * a name (carried_name_ok, each once), bytes and XXH3. */
static keel_status parse_carried(const cJSON *list, const char *path, keel_ckpt *c) {
    if (!list) return KEEL_OK;
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > KEEL_CKPT_MAX_CARRIED)
        return bad_manifest(path, "\"carried_files\" must be a list of at most %d files", KEEL_CKPT_MAX_CARRIED);
    c->carried = keel_xcalloc(sizeof(keel_ckpt_carried) * KEEL_CKPT_MAX_CARRIED, "carried files");
    const cJSON *fj;
    cJSON_ArrayForEach(fj, list) {
        char where[48];
        snprintf(where, sizeof where, "carried file %d: ", c->n_carried);
        keel_ckpt_carried *f = &c->carried[c->n_carried];
        const cJSON *n = get(fj, "name"), *x = get(fj, "xxh3");
        if (!cJSON_IsObject(fj)) return bad_manifest(path, "%snot an object", where);
        if (!cJSON_IsString(n) || !carried_name_ok(n->valuestring))
            return bad_manifest(path, "%s\"name\" must be a plain file name of the checkpoint (not the "
                                "manifest's or a shard's)", where);
        for (int i = 0; i < c->n_carried; i++)
            if (!strcmp(c->carried[i].name, n->valuestring))
                return bad_manifest(path, "%s%s is listed twice", where, n->valuestring);
        size_t hex = cJSON_IsString(x) ? strspn(x->valuestring, "0123456789abcdefABCDEF") : 0;
        if (!cJSON_IsString(x) || hex != 16 || x->valuestring[16])
            return bad_manifest(path, "%s\"xxh3\" must be 16 hex digits", where);
        if (!get_int(fj, "bytes", 0, (int64_t)1 << 40, &f->bytes, path, where)) return KEEL_ERR_INPUT;
        snprintf(f->name, sizeof f->name, "%s", n->valuestring);
        f->xxh3 = strtoull(x->valuestring, NULL, 16);
        c->n_carried++;
    }
    return KEEL_OK;
}

keel_status keel_ckpt_parse_manifest(const char *text, size_t len, const char *dir, keel_ckpt *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    cJSON *m = cJSON_ParseWithLength(text, len);
    c->manifest = m;
    const cJSON *format = get(m, "format"), *world = get(m, "world"), *units = get(m, "units"),
                *files = get(m, "files");
    const cJSON *strategy = get(world, "strategy");
    int64_t version, shard_ranks, world_size;
    keel_status st = KEEL_ERR_INPUT;
    if (!cJSON_IsObject(m) || !cJSON_IsString(format) || strcmp(format->valuestring, "keel-checkpoint")) {
        bad_manifest(path, "not a keel checkpoint manifest (not JSON, or no \"format\": \"keel-checkpoint\")");
        goto fail;
    }
    if (!get_int(m, "version", 0, INT32_MAX, &version, path, "") ||
        !get_int(m, "step", 0, INT64_MAX, &c->step, path, "") ||
        !get_int(m, "global_batch", 0, INT64_MAX, &c->global_batch, path, ""))
        goto fail;
    if (!cJSON_IsObject(world)) {
        bad_manifest(path, "\"world\" must be an object (size, strategy, shard_ranks)");
        goto fail;
    }
    if (!get_int(world, "shard_ranks", 1, MAX_SHARD_RANKS, &shard_ranks, path, "world: ") ||
        !get_int(world, "size", 1, MAX_SHARD_RANKS, &world_size, path, "world: "))
        goto fail;
    if (version != KEEL_CKPT_VERSION) {
        bad_manifest(path, "version %lld is not supported (this keel reads version %d)", (long long)version,
                     KEEL_CKPT_VERSION);
        goto fail;
    }
    if (!cJSON_IsString(strategy) || strlen(strategy->valuestring) >= sizeof c->strategy) {
        bad_manifest(path, "world: \"strategy\" must be a name");
        goto fail;
    }
    if (!cJSON_IsArray(units) || cJSON_GetArraySize(units) < 1) {
        bad_manifest(path, "\"units\" must be a list of at least one unit");
        goto fail;
    }
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) != shard_ranks) {
        bad_manifest(path, "\"files\" must list the %lld shard files", (long long)shard_ranks);
        goto fail;
    }
    c->shard_ranks = (int)shard_ranks;
    c->world_size = (int)world_size;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy->valuestring);
    if ((st = parse_units(units, path, c)) != KEEL_OK) goto fail;
    c->files = keel_xcalloc(sizeof(keel_ckpt_file) * (size_t)c->shard_ranks, "checkpoint files");
    int j = 0;
    const cJSON *fj;
    cJSON_ArrayForEach(fj, files) {
        if ((st = parse_file(fj, j++, path, c)) != KEEL_OK) goto fail;
    }
    if ((st = parse_carried(get(m, "carried_files"), path, c)) != KEEL_OK) goto fail;
    return KEEL_OK;
fail:
    keel_ckpt_close(c);
    return KEEL_ERR_INPUT;
}

keel_status keel_ckpt_check_shard_header(const keel_ckpt *c, int j, const void *head, size_t len,
                                         int64_t file_bytes, const char *path) {
    shard_header hd;
    if (file_bytes != c->files[j].bytes) {
        keel_errorf("%s: %lld bytes, the manifest says %lld (truncated or foreign); " DAMAGED_HINT, path,
                    (long long)file_bytes, (long long)c->files[j].bytes);
        return KEEL_ERR_INPUT;
    }
    if (len < sizeof hd) {
        keel_errorf("%s: truncated: no %d-byte header; " DAMAGED_HINT, path, KEEL_CKPT_HEADER_BYTES);
        return KEEL_ERR_INPUT;
    }
    memcpy(&hd, head, sizeof hd);
    if (memcmp(hd.magic, KEEL_CKPT_MAGIC, 8) || hd.version != KEEL_CKPT_VERSION || hd.rank != (uint32_t)j ||
        hd.ranks != (uint32_t)c->shard_ranks || hd.arrays != KEEL_CKPT_ARRAYS || hd.step != (uint64_t)c->step ||
        hd.floats != (uint64_t)c->plan->shard_total) {
        keel_errorf("%s: wrong header (not shard %d of %d of step %lld with %lld floats an array); " DAMAGED_HINT,
                    path, j, c->shard_ranks, (long long)c->step, (long long)c->plan->shard_total);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

keel_status keel_ckpt_open(const char *dir, keel_ckpt *c) {
    memset(c, 0, sizeof *c);
    char path[4200], why[160];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text;
    size_t len;
    if (keel_read_regular(path, MAX_MANIFEST_BYTES, &text, &len, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: no manifest: %s", path, why);
        return KEEL_ERR_INPUT;
    }
    keel_status st = keel_ckpt_parse_manifest(text, len, dir, c);
    keel_free(text);
    if (st != KEEL_OK) return st;
    for (int j = 0; j < c->shard_ranks; j++) {
        char name[64];
        shard_name(name, sizeof name, j, c->shard_ranks);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        struct stat sb = {0};
        shard_header hd;
        int fd;
        st = keel_open_read(path, false, &fd, why, sizeof why);
        if (st != KEEL_OK) {
            keel_errorf("%s: %s", path, st == KEEL_ERR_INPUT && errno == ENOENT ? "missing" : why);
        } else {
            size_t got = 0;
            if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof hd &&
                keel_pread_all(fd, &hd, sizeof hd, 0, NULL) == KEEL_OK)
                got = sizeof hd;
            close(fd);
            st = keel_ckpt_check_shard_header(c, j, &hd, got, (int64_t)sb.st_size, path);
        }
        if (st != KEEL_OK) {
            keel_ckpt_close(c);
            return KEEL_ERR_INPUT;
        }
    }
    for (int i = 0; i < c->n_carried; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, c->carried[i].name);
        struct stat sb = {0};
        int fd;
        st = keel_open_read(path, false, &fd, why, sizeof why);
        if (st != KEEL_OK) {
            keel_errorf("%s: %s (the manifest lists it as carried); " DAMAGED_HINT, path,
                        st == KEEL_ERR_INPUT && errno == ENOENT ? "missing" : why);
        } else {
            bool sized = fstat(fd, &sb) == 0 && sb.st_size == c->carried[i].bytes;
            close(fd);
            if (!sized) {
                keel_errorf("%s: %lld bytes, the manifest says %lld; " DAMAGED_HINT, path, (long long)sb.st_size,
                            (long long)c->carried[i].bytes);
                st = KEEL_ERR_INPUT;
            }
        }
        if (st != KEEL_OK) {
            keel_ckpt_close(c);
            return KEEL_ERR_INPUT;
        }
    }
    return KEEL_OK;
}

void keel_ckpt_close(keel_ckpt *c) {
    cJSON_Delete(c->manifest);
    if (c->plan) keel_free(c->plan->units);
    keel_free(c->plan);
    keel_free(c->files);
    keel_free(c->carried);
    memset(c, 0, sizeof *c);
}

static void shard_path(char *out, size_t n, const keel_ckpt *c, int j) {
    char name[64];
    shard_name(name, sizeof name, j, c->shard_ranks);
    snprintf(out, n, "%s/%s", c->dir, name);
}

/* XXH3 of the open file fd, which must be `bytes` long (a file longer or
 * shorter than the manifest says is damaged too): false when it is not or a
 * read fails. */
static bool hash_file(int fd, int64_t bytes, uint64_t *got) {
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    const int64_t cap = 8 << 20;
    char *buf = keel_xmalloc((size_t)(bytes < cap ? (bytes > 0 ? bytes : 1) : cap), "checksum buffer");
    struct stat sb;
    bool ok = fstat(fd, &sb) == 0 && sb.st_size == bytes;
    for (int64_t at = 0; ok && at < bytes; at += cap) {
        size_t n = (size_t)(bytes - at < cap ? bytes - at : cap);
        ok = keel_pread_all(fd, buf, n, at, NULL) == KEEL_OK;
        XXH3_64bits_update(h, buf, n);
    }
    *got = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    keel_free(buf);
    return ok;
}

keel_status keel_ckpt_verify_file(const keel_ckpt *c, int j) {
    char path[4200], why[160];
    shard_path(path, sizeof path, c, j);
    int fd;
    if (keel_open_read(path, false, &fd, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: shard %d cannot be opened: %s", c->dir, j, why);
        return KEEL_ERR_INPUT;
    }
    uint64_t got;
    bool ok = hash_file(fd, c->files[j].bytes, &got);
    close(fd);
    if (!ok || got != c->files[j].xxh3) {
        keel_errorf("%s: shard %d of %d fails its checksum (xxh3 %016llx, manifest %016llx): the file "
                    "is damaged", c->dir, j, c->shard_ranks, (unsigned long long)got,
                    (unsigned long long)c->files[j].xxh3);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

keel_status keel_ckpt_verify_carried(const keel_ckpt *c, int i) {
    char path[4200], why[160];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->carried[i].name);
    int fd;
    if (keel_open_read(path, false, &fd, why, sizeof why) != KEEL_OK) {
        keel_errorf("%s: carried file cannot be opened: %s", path, why);
        return KEEL_ERR_INPUT;
    }
    uint64_t got;
    bool ok = hash_file(fd, c->carried[i].bytes, &got);
    close(fd);
    if (!ok || got != c->carried[i].xxh3) {
        keel_errorf("%s: fails its checksum (xxh3 %016llx, manifest %016llx): the file is damaged", path,
                    (unsigned long long)got, (unsigned long long)c->carried[i].xxh3);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

char *keel_ckpt_carried_path(const keel_ckpt *c, const char *name) {
    for (int i = 0; i < c->n_carried; i++)
        if (!strcmp(c->carried[i].name, name)) return keel_path_join(c->dir, name);
    return NULL;
}

/* The units may differ from the layout's (fsdp.unit block or matrix): reads
 * cross saved units, so only the parameter count and the unit ranges' tiling
 * of the canonical vector must hold. */
keel_status keel_ckpt_check_layout(const keel_ckpt *c, const keel_model_layout *lay) {
    int64_t saved = 0;
    bool ok = true;
    for (int u = 0; u < c->plan->n_units; u++) {
        ok = ok && c->plan->units[u].offset == saved;
        saved += c->plan->units[u].logical;
    }
    if (!ok || saved != lay->n_params) {
        keel_errorf("%s: holds a model of %lld parameters in %d units, the config's model has %lld; "
                    "set the model keys to the checkpoint's (its manifest.json \"config\")",
                    c->dir, (long long)saved, c->plan->n_units, (long long)lay->n_params);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* The saved unit holding canonical index i. */
static int unit_of(const keel_ckpt *c, int64_t i) {
    for (int u = 0; u < c->plan->n_units; u++)
        if (i >= c->plan->units[u].offset && i < c->plan->units[u].offset + c->plan->units[u].logical) return u;
    return -1;
}

/* [begin, begin + len) inside saved unit u. */
static keel_status read_in_unit(const keel_ckpt *c, int a, int u, int64_t begin, int64_t len, float *dst) {
    const keel_fsdp_unit *x = &c->plan->units[u];
    int64_t pos = begin - x->offset; /* in the unit's padded vector */
    while (len > 0) {
        int j = (int)(pos / x->shard);
        int64_t within = pos % x->shard, n = x->shard - within < len ? x->shard - within : len;
        int64_t at = KEEL_CKPT_HEADER_BYTES +
                     (int64_t)sizeof(float) * ((int64_t)a * c->plan->shard_total + x->shard_offset + within);
        char path[4200], why[160];
        shard_path(path, sizeof path, c, j);
        int fd;
        if (keel_open_read(path, false, &fd, why, sizeof why) != KEEL_OK) {
            keel_errorf("%s: cannot open checkpoint shard: %s", path, why);
            return KEEL_ERR_INPUT;
        }
        /* A unit's slice of a 70B model is gigabytes: keel_pread_all loops. */
        keel_status st = keel_pread_all(fd, dst, sizeof(float) * (size_t)n, at, path);
        close(fd);
        if (st != KEEL_OK) return st;
        dst += n, pos += n, len -= n;
    }
    return KEEL_OK;
}

keel_status keel_ckpt_read(const keel_ckpt *c, int a, int64_t begin, int64_t len, float *dst) {
    while (len > 0) {
        int u = unit_of(c, begin);
        KEEL_CHECK(u >= 0, "checkpoint read at %lld is past the model", (long long)begin);
        const keel_fsdp_unit *x = &c->plan->units[u];
        int64_t n = x->offset + x->logical - begin < len ? x->offset + x->logical - begin : len;
        keel_status st = read_in_unit(c, a, u, begin, n, dst);
        if (st != KEEL_OK) return st;
        begin += n, len -= n, dst += n;
    }
    return KEEL_OK;
}

void keel_ckpt_files_for(const keel_ckpt *c, const keel_param_range *ranges, int n, bool *used) {
    memset(used, 0, sizeof(bool) * (size_t)c->shard_ranks);
    for (int r = 0; r < n; r++)
        for (int u = 0; u < c->plan->n_units; u++) { /* every saved unit the range overlaps */
            const keel_fsdp_unit *x = &c->plan->units[u];
            int64_t lo = ranges[r].begin > x->offset ? ranges[r].begin : x->offset;
            int64_t hi = ranges[r].begin + ranges[r].len, end = x->offset + x->logical;
            if (hi > end) hi = end;
            if (lo >= hi) continue;
            for (int64_t j = (lo - x->offset) / x->shard; j <= (hi - 1 - x->offset) / x->shard && j < c->shard_ranks; j++)
                used[j] = true;
        }
}

char *keel_ckpt_config_json(const keel_ckpt *c) {
    const cJSON *cfg = get(c->manifest, "config");
    return cJSON_IsObject(cfg) ? cJSON_Print(cfg) : NULL;
}

keel_status keel_ckpt_load_params(const keel_ckpt *c, const keel_model_layout *lay, float *params) {
    keel_status st = keel_ckpt_check_layout(c, lay);
    for (int j = 0; st == KEEL_OK && j < c->shard_ranks; j++) st = keel_ckpt_verify_file(c, j);
    for (int u = 0; st == KEEL_OK && u < lay->n_units; u++)
        st = keel_ckpt_read(c, 0, lay->unit_offset[u], lay->unit_size[u], params + lay->unit_offset[u]);
    return st;
}

void keel_ckpt_identity(const keel_ckpt *c, char out[17]) {
    char *files = cJSON_PrintUnformatted(get(c->manifest, "files"));
    snprintf(out, 17, "%016llx", (unsigned long long)XXH3_64bits(files ? files : "", files ? strlen(files) : 0));
    free(files);
}

const char *keel_ckpt_lora_base_id(const keel_ckpt *c) {
    const cJSON *id = get(get(c->manifest, "lora"), "base_id");
    return cJSON_IsString(id) ? id->valuestring : NULL;
}
