/* hf/safetensors.c: the safetensors format — headers, split plans, the index, reading tensors as fp32. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf/safetensors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

#define MAX_HEADER_BYTES (100 << 20) /* the safetensors library's own limit */
#define MAX_JSON_BYTES (256 << 20)   /* an index or config.json larger than this is not one */

int64_t safetensors_f32_bytes(const safetensors_tensor *t) {
    return 4 * t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
}

cJSON *safetensors_parse_json_object(const char *text, size_t len, const char *path) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *p = text; at && p < at && p < text + len; p++) line += *p == '\n';
        keel_errorf("%s: invalid JSON near line %d", path, line);
    } else if (!cJSON_IsObject(root)) {
        keel_errorf("%s: must be a JSON object", path);
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

cJSON *safetensors_read_json_object(const char *path, const char *what) {
    char *text, why[160];
    size_t len;
    if (keel_read_regular(path, MAX_JSON_BYTES, &text, &len, why, sizeof why) != KEEL_OK) {
        if (errno == EFBIG) keel_errorf("%s: not a %s (larger than %d MiB)", path, what, MAX_JSON_BYTES >> 20);
        else keel_errorf("%s: cannot open %s: %s", path, what, why);
        return NULL;
    }
    cJSON *root = safetensors_parse_json_object(text, len, path);
    keel_free(text);
    return root;
}

void safetensors_printable(char *out, size_t size, const char *name) {
    size_t n = 0, len = strlen(name);
    for (; n < len && n + 1 < size; n++) out[n] = (unsigned char)name[n] < 0x20 || name[n] == 0x7f ? '?' : name[n];
    if (n < len && size > 4) memcpy(out + size - 4, "...", 3), n = size - 1;
    out[n] = '\0';
}

/* ---- writing ----------------------------------------------------------------------- */

uint8_t *safetensors_header(const safetensors_tensor *t, int n, size_t *bytes) {
    keel_strbuf h = {0};
    keel_strbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t size = safetensors_f32_bytes(&t[i]);
        if (t[i].ndim == 1)
            keel_strbuf_printf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],", t[i].name, (long long)t[i].shape[0]);
        else
            keel_strbuf_printf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],", t[i].name,
                      (long long)t[i].shape[0], (long long)t[i].shape[1]);
        keel_strbuf_printf(&h, "\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + size));
        off += size;
    }
    keel_strbuf_printf(&h, "}");
    while (h.n % 8) keel_strbuf_printf(&h, " "); /* the data starts 8-byte aligned */
    *bytes = 8 + h.n;
    uint8_t *head = keel_xmalloc(*bytes, "safetensors header");
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    memcpy(head + 8, h.s, h.n);
    keel_free(h.s);
    return head;
}

int safetensors_plan_files(const safetensors_tensor *t, int n, int64_t max_file_bytes, int *file_of,
                           bool *indexed) {
    int64_t total = 0, in_file = 0;
    for (int i = 0; i < n; i++) total += safetensors_f32_bytes(&t[i]);
    *indexed = max_file_bytes > 0 && total > max_file_bytes;
    int n_files = 0;
    for (int i = 0; i < n; i++) {
        int64_t bytes = safetensors_f32_bytes(&t[i]);
        if (i == 0 || (*indexed && in_file > 0 && in_file + bytes > max_file_bytes)) {
            n_files++;
            in_file = 0;
        }
        file_of[i] = n_files - 1;
        in_file += bytes;
    }
    return n_files;
}

void safetensors_file_name(char *out, int i, int n_files, bool indexed) {
    if (indexed) snprintf(out, 64, "model-%05d-of-%05d.safetensors", i + 1, n_files);
    else snprintf(out, 64, SAFETENSORS_SINGLE);
}

char *safetensors_index_json(const safetensors_tensor *t, int n, const int *file_of, int n_files,
                             size_t *len) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += safetensors_f32_bytes(&t[i]);
    keel_strbuf b = {0};
    keel_strbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {\n",
              (long long)total);
    for (int i = 0; i < n; i++) {
        char name[64];
        safetensors_file_name(name, file_of[i], n_files, true);
        keel_strbuf_printf(&b, "    \"%s\": \"%s\"%s\n", t[i].name, name, i + 1 < n ? "," : "");
    }
    keel_strbuf_printf(&b, "  }\n}\n");
    *len = b.n;
    return b.s;
}

/* ---- reading one file ---------------------------------------------------------------- */

typedef struct {
    char *name;      /* as the weight map spells it */
    char *path;
    int fd;
    int64_t data_start, data_bytes;
    cJSON *header;
} st_file;

static void file_close(st_file *f) {
    if (f->fd >= 0) close(f->fd);
    cJSON_Delete(f->header);
    keel_free(f->name);
    keel_free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* Element sizes of the dtypes keel converts; 0 for any other. */
static int dtype_bytes(const char *dtype) {
    return !strcmp(dtype, "F32") ? 4 : !strcmp(dtype, "F16") || !strcmp(dtype, "BF16") ? 2 : 0;
}

/* A header entry's place in the data, for the tiling check. */
typedef struct {
    int64_t begin, end;
    const char *name;
} span;

static int by_offsets(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin != y->begin ? (x->begin > y->begin) - (x->begin < y->begin) : (x->end > y->end) - (x->end < y->end);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const span *)a)->name, ((const span *)b)->name);
}

/* One line "NAME: bad safetensors header: ..." (a tensor's name made printable). */
static keel_status bad_header(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static keel_status bad_header(const char *path, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    keel_errorf("%s: bad safetensors header: %s (not a safetensors file, or a damaged one)", path, what);
    return KEEL_ERR_INPUT;
}

/* One tensor entry: dtype a name, shape integers, data_offsets [begin, end]
 * with end >= begin, and for the dtypes keel reads exactly the bytes the
 * shape needs (products overflow-checked). */
static keel_status check_entry(const cJSON *e, const char *path, span *out) {
    char name[80];
    safetensors_printable(name, sizeof name, e->string);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2)
        return bad_header(path, "tensor %s needs dtype, shape and data_offsets", name);
    int64_t elements = 1, begin, end, d;
    const cJSON *x;
    cJSON_ArrayForEach(x, shape) {
        if (!keel_json_int(x, 0, INT64_MAX, &d))
            return bad_header(path, "tensor %s: shape must be a list of integers >= 0", name);
        if (__builtin_mul_overflow(elements, d, &elements))
            return bad_header(path, "tensor %s: its shape holds more than 2^63 values", name);
    }
    if (!keel_json_int(offs->child, 0, INT64_MAX, &begin) || !keel_json_int(offs->child->next, 0, INT64_MAX, &end) ||
        end < begin)
        return bad_header(path, "tensor %s: data_offsets must be [begin, end], integers with 0 <= begin <= end", name);
    int64_t bytes, esize = dtype_bytes(dtype->valuestring);
    if (esize && (__builtin_mul_overflow(elements, esize, &bytes) || bytes != end - begin))
        return bad_header(path, "tensor %s's data_offsets [%lld, %lld] do not hold %lld %s values", name,
                          (long long)begin, (long long)end, (long long)elements, dtype->valuestring);
    *out = (span){begin, end, e->string};
    return KEEL_OK;
}

/* Every entry checked, no name twice, and the tensors' bytes tiling the
 * data exactly — the first at 0, each where the one before ends, the last
 * at the end of the file — as the safetensors library requires: no two
 * tensors share bytes and nothing reads past the file. */
static keel_status check_header(const cJSON *h, int64_t data_bytes, const char *path) {
    int n = 0;
    for (const cJSON *e = h->child; e; e = e->next) n++;
    span *t = keel_xmalloc(sizeof(span) * (size_t)(n ? n : 1), "safetensors entries");
    keel_status st = KEEL_OK;
    int k = 0;
    for (const cJSON *e = h->child; e && st == KEEL_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") != 0) {
            st = check_entry(e, path, &t[k++]);
            continue;
        }
        bool ok = cJSON_IsObject(e);
        for (const cJSON *m = e->child; ok && m; m = m->next) ok = cJSON_IsString(m);
        if (!ok) st = bad_header(path, "__metadata__ must be an object of strings");
    }
    if (st == KEEL_OK && k > 1) {
        qsort(t, (size_t)k, sizeof *t, by_name);
        for (int i = 1; i < k && st == KEEL_OK; i++) {
            char name[80];
            safetensors_printable(name, sizeof name, t[i].name);
            if (!strcmp(t[i].name, t[i - 1].name)) st = bad_header(path, "tensor %s appears twice", name);
        }
        qsort(t, (size_t)k, sizeof *t, by_offsets);
    }
    for (int i = 0; i < k && st == KEEL_OK; i++) {
        int64_t at = i ? t[i - 1].end : 0;
        char name[80], prev[80];
        safetensors_printable(name, sizeof name, t[i].name);
        safetensors_printable(prev, sizeof prev, i ? t[i - 1].name : "");
        if (t[i].begin != at) {
            if (i) st = bad_header(path, "tensors %s [%lld, %lld] and %s [%lld, %lld] %s: data_offsets must tile "
                                   "the data", prev, (long long)t[i - 1].begin, (long long)t[i - 1].end, name,
                                   (long long)t[i].begin, (long long)t[i].end, t[i].begin < at ? "overlap" : "leave a gap");
            else st = bad_header(path, "the first tensor's data starts at %lld, not 0 (tensor %s)",
                                 (long long)t[i].begin, name);
        } else if (t[i].end > data_bytes) {
            keel_errorf("%s: truncated: tensor %s ends at data byte %lld but the file holds %lld", path, name,
                        (long long)t[i].end, (long long)data_bytes);
            st = KEEL_ERR_INPUT;
        }
    }
    int64_t end = k ? t[k - 1].end : 0;
    if (st == KEEL_OK && end != data_bytes)
        st = bad_header(path, "%lld bytes after the last tensor's data (data_offsets must cover the data exactly)",
                        (long long)(data_bytes - end));
    keel_free(t);
    return st;
}

keel_status safetensors_parse_header(const uint8_t *head, size_t have, int64_t file_bytes, const char *path,
                                     cJSON **header, int64_t *data_start) {
    *header = NULL;
    if (file_bytes < 8) {
        keel_errorf("%s: truncated: %lld bytes, not even the 8-byte header length", path, (long long)file_bytes);
        return KEEL_ERR_INPUT;
    }
    KEEL_CHECK(have >= 8, "%s: %zu bytes of the header given", path, have);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)head[i] << (8 * i);
    if (n > (uint64_t)MAX_HEADER_BYTES)
        return bad_header(path, "its length %llu exceeds 100 MiB", (unsigned long long)n);
    if ((int64_t)n > file_bytes - 8) {
        keel_errorf("%s: truncated: the header needs %llu bytes but the file has %lld after the "
                    "length", path, (unsigned long long)n, (long long)(file_bytes - 8));
        return KEEL_ERR_INPUT;
    }
    KEEL_CHECK(have >= 8 + n, "%s: %zu bytes of a %llu-byte header given", path, have, (unsigned long long)n);
    cJSON *h = cJSON_ParseWithLength((const char *)head + 8, (size_t)n);
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        return bad_header(path, "not a JSON object");
    }
    keel_status st = check_header(h, file_bytes - 8 - (int64_t)n, path);
    if (st != KEEL_OK) {
        cJSON_Delete(h);
        return st;
    }
    *header = h;
    *data_start = 8 + (int64_t)n;
    return KEEL_OK;
}

/* Open dir/name and parse its header; f needs file_close either way. */
static keel_status file_open(st_file *f, const char *dir, const char *name) {
    memset(f, 0, sizeof *f);
    f->name = keel_xstrdup(name);
    f->path = keel_path_join(dir, name);
    char why[160];
    keel_status st = keel_open_read(f->path, false, &f->fd, why, sizeof why);
    if (st != KEEL_OK) {
        keel_errorf("%s: cannot open safetensors file: %s", f->path, why);
        return KEEL_ERR_INPUT;
    }
    struct stat s;
    if (fstat(f->fd, &s) != 0) {
        keel_errorf("%s: cannot stat: %s", f->path, strerror(errno));
        return KEEL_ERR_IO;
    }
    int64_t size = (int64_t)s.st_size;
    uint8_t len8[8];
    if (size >= 8 && (st = keel_pread_all(f->fd, len8, 8, 0, f->path)) != KEEL_OK) return st;
    uint64_t n = 0;
    for (int i = 0; size >= 8 && i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    /* the length and the header, when they fit the file (else the parse says why with 8 bytes) */
    size_t have = size < 8 ? 0 : n <= (uint64_t)MAX_HEADER_BYTES && (int64_t)n <= size - 8 ? 8 + (size_t)n : 8;
    uint8_t *head = keel_xmalloc(have ? have : 1, "safetensors header");
    if (have) memcpy(head, len8, 8);
    if (have > 8) st = keel_pread_all(f->fd, head + 8, have - 8, 8, f->path);
    if (st == KEEL_OK) st = safetensors_parse_header(head, have, size, f->path, &f->header, &f->data_start);
    keel_free(head);
    if (st == KEEL_OK) f->data_bytes = size - f->data_start;
    return st;
}

static float f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: exact */
        memcpy(&u, &f, 4);
        u |= sign;
    } else if (e == 31) {
        u = sign | 0x7f800000u | (m << 13);
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void shape_str(char *out, size_t size, const int64_t *shape, int n, bool more) {
    size_t k = (size_t)snprintf(out, size, "[");
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(out + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(out + k, size - k, "%s]", more ? ", ..." : "");
}

/* Tensor t's entry in f, of a dtype keel reads and t's exact shape: its
 * element size and where its data starts in the file (the header was
 * checked whole when the file was opened: offsets inside the file, sizes
 * matching). */
static keel_status file_find_tensor(const st_file *f, const safetensors_tensor *t, int *esize, int64_t *at) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(f->header, t->name);
    if (!e) {
        keel_errorf("%s: missing tensor %s", f->path, t->name);
        return KEEL_ERR_INPUT;
    }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    *esize = dtype_bytes(dtype->valuestring);
    if (!*esize) {
        char name[40];
        safetensors_printable(name, sizeof name, dtype->valuestring);
        keel_errorf("%s: tensor %s has unsupported dtype %s; keel reads F32, F16 and BF16", f->path, t->name, name);
        return KEEL_ERR_INPUT;
    }
    int64_t shape[4];
    int ns = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(e, "shape")) {
        if (ns < 4) keel_json_int(x, 0, INT64_MAX, &shape[ns]);
        ns++;
    }
    bool shape_ok = ns == t->ndim && shape[0] == t->shape[0] && (ns == 1 || shape[1] == t->shape[1]);
    if (!shape_ok) {
        char got_s[160], want_s[64];
        shape_str(got_s, sizeof got_s, shape, ns < 4 ? ns : 4, ns > 4);
        shape_str(want_s, sizeof want_s, t->shape, t->ndim, false);
        keel_errorf("%s: tensor %s has shape %s but config.json implies %s", f->path, t->name, got_s, want_s);
        return KEEL_ERR_INPUT;
    }
    int64_t begin;
    keel_json_int(cJSON_GetObjectItemCaseSensitive(e, "data_offsets")->child, 0, INT64_MAX, &begin);
    *at = f->data_start + begin;
    return KEEL_OK;
}

/* Read tensor t from f into dst (fp32). */
static keel_status file_read_tensor(const st_file *f, const safetensors_tensor *t, float *dst) {
    int esize;
    int64_t at, n = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
    keel_status st = file_find_tensor(f, t, &esize, &at);
    if (st != KEEL_OK) return st;
    if (esize == 4) return keel_pread_all(f->fd, dst, (size_t)n * 4, at, f->path);
    bool bf16 = esize == 2 && cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f->header, t->name),
                                                               "dtype")->valuestring[0] == 'B';
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = keel_xmalloc(sizeof(uint16_t) * CHUNK, "tensor conversion buffer");
    for (int64_t i = 0; st == KEEL_OK && i < n; i += CHUNK) {
        int64_t k = n - i < CHUNK ? n - i : CHUNK;
        st = keel_pread_all(f->fd, buf, (size_t)k * 2, at + 2 * i, f->path);
        for (int64_t j = 0; st == KEEL_OK && j < k; j++)
            dst[i + j] = bf16 ? keel_bf16_to_float(buf[j]) : f16_to_float(buf[j]);
    }
    keel_free(buf);
    return st;
}

/* ---- reading a directory ------------------------------------------------------------ */

struct safetensors_dir {
    char *dir;
    char *index_path;     /* NULL for a single model.safetensors */
    cJSON *index;
    const cJSON *map;     /* the index's weight_map */
    st_file *files;       /* opened so far */
    int n_files, cap_files;
};

void safetensors_close_dir(safetensors_dir *d) {
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) file_close(&d->files[i]);
    keel_free(d->files);
    cJSON_Delete(d->index);
    keel_free(d->index_path);
    keel_free(d->dir);
    keel_free(d);
}

/* A new slot for dir/name, opened. */
static keel_status add_file(safetensors_dir *d, const char *name, st_file **out) {
    if (d->n_files == d->cap_files) {
        d->cap_files = d->cap_files * 2 + 4;
        d->files = keel_xrealloc(d->files, sizeof(st_file) * (size_t)d->cap_files, "safetensors files");
    }
    *out = &d->files[d->n_files++];
    return file_open(*out, d->dir, name);
}

/* A weight map's file: a plain name in the index's directory (never a path
 * that leaves it; the file itself may be a symlink, as in the Hugging Face
 * cache, but must be a regular file when opened). */
static bool plain_file_name(const char *s) {
    return s[0] && strlen(s) < 256 && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

keel_status safetensors_parse_index(const char *text, size_t len, const char *path, cJSON **index) {
    *index = safetensors_parse_json_object(text, len, path);
    if (!*index) return KEEL_ERR_INPUT;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(*index, "weight_map"), *v;
    keel_status st = KEEL_OK;
    if (!cJSON_IsObject(map)) {
        keel_errorf("%s: no \"weight_map\" object", path);
        st = KEEL_ERR_INPUT;
    }
    for (v = map ? map->child : NULL; v && st == KEEL_OK; v = v->next) {
        if (cJSON_IsString(v) && plain_file_name(v->valuestring)) continue;
        char name[80];
        safetensors_printable(name, sizeof name, v->string);
        keel_errorf("%s: weight_map entry of %s must be a file name in the same directory", path, name);
        st = KEEL_ERR_INPUT;
    }
    if (st != KEEL_OK) {
        cJSON_Delete(*index);
        *index = NULL;
    }
    return st;
}

keel_status safetensors_open_file(const char *dir, const char *name, safetensors_dir **out) {
    safetensors_dir *d = keel_xcalloc(sizeof *d, "safetensors directory");
    d->dir = keel_xstrdup(dir);
    st_file *f;
    keel_status st = add_file(d, name, &f);
    if (st != KEEL_OK) {
        safetensors_close_dir(d);
        d = NULL;
    }
    *out = d;
    return st;
}

keel_status safetensors_open_dir(const char *dir, safetensors_dir **out) {
    safetensors_dir *d = keel_xcalloc(sizeof *d, "safetensors directory");
    d->dir = keel_xstrdup(dir);
    char *single = keel_path_join(dir, SAFETENSORS_SINGLE);
    char *index_path = keel_path_join(dir, SAFETENSORS_INDEX);
    st_file *f;
    keel_status st = KEEL_OK;
    if (keel_path_exists(single)) {
        st = add_file(d, SAFETENSORS_SINGLE, &f);
    } else if (keel_path_exists(index_path)) {
        d->index_path = index_path;
        index_path = NULL;
        char *text, why[160];
        size_t len;
        st = keel_read_regular(d->index_path, MAX_JSON_BYTES, &text, &len, why, sizeof why);
        if (st != KEEL_OK) {
            keel_errorf("%s: cannot open safetensors index: %s", d->index_path, why);
            st = KEEL_ERR_INPUT;
        } else {
            st = safetensors_parse_index(text, len, d->index_path, &d->index);
            keel_free(text);
            if (st == KEEL_OK) d->map = cJSON_GetObjectItemCaseSensitive(d->index, "weight_map");
        }
    } else {
        keel_errorf("%s: no " SAFETENSORS_SINGLE " or " SAFETENSORS_INDEX " (keel reads "
                    "safetensors checkpoints only)", dir);
        st = KEEL_ERR_INPUT;
    }
    keel_free(single);
    keel_free(index_path);
    if (st != KEEL_OK) {
        safetensors_close_dir(d);
        d = NULL;
    }
    *out = d;
    return st;
}

/* The file the weight map names for tensor, opened once. */
static keel_status file_for(safetensors_dir *d, const char *tensor, st_file **out) {
    if (!d->map) {
        *out = &d->files[0];
        return KEEL_OK;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(d->map, tensor);
    if (!v) {
        keel_errorf("%s: missing tensor %s (not in weight_map)", d->index_path, tensor);
        return KEEL_ERR_INPUT;
    }
    for (int i = 0; i < d->n_files; i++)
        if (!strcmp(d->files[i].name, v->valuestring)) {
            *out = &d->files[i];
            if (d->files[i].header) return KEEL_OK;
            file_close(*out); /* it failed before: try again, and say why again */
            return file_open(*out, d->dir, v->valuestring);
        }
    return add_file(d, v->valuestring, out);
}

keel_status safetensors_check(safetensors_dir *d, const safetensors_tensor *t) {
    st_file *f;
    int esize;
    int64_t at;
    keel_status st = file_for(d, t->name, &f);
    return st == KEEL_OK ? file_find_tensor(f, t, &esize, &at) : st;
}

keel_status safetensors_read(safetensors_dir *d, const safetensors_tensor *t, float *dst) {
    st_file *f;
    keel_status st = file_for(d, t->name, &f);
    return st == KEEL_OK ? file_read_tensor(f, t, dst) : st;
}
