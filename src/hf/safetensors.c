/* hf/safetensors.c: the safetensors format — headers, split plans, the index, reading tensors as fp32. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

cJSON *safetensors_read_json_object(const char *path, const char *what) {
    char *text;
    if (keel_read_file_quiet(path, MAX_JSON_BYTES, &text, NULL) != KEEL_OK) {
        if (errno == EFBIG) keel_errorf("%s: not a %s (larger than %d MiB)", path, what, MAX_JSON_BYTES >> 20);
        else keel_errorf("%s: cannot open %s: %s", path, what, strerror(errno));
        return NULL;
    }
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        int line = 1;
        for (const char *p = text; at && p < at && *p; p++) line += *p == '\n';
        keel_errorf("%s: invalid JSON near line %d", path, line);
    } else if (!cJSON_IsObject(root)) {
        keel_errorf("%s: must be a JSON object", path);
        cJSON_Delete(root);
        root = NULL;
    }
    keel_free(text);
    return root;
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

/* Open dir/name and parse its header; f needs file_close either way. */
static keel_status file_open(st_file *f, const char *dir, const char *name) {
    memset(f, 0, sizeof *f);
    f->name = keel_xstrdup(name);
    f->path = keel_path_join(dir, name);
    f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        keel_errorf("%s: cannot open safetensors file: %s", f->path, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    struct stat s;
    if (fstat(f->fd, &s) != 0) {
        keel_errorf("%s: cannot stat: %s", f->path, strerror(errno));
        return KEEL_ERR_IO;
    }
    int64_t size = (int64_t)s.st_size;
    uint8_t len8[8];
    if (size < 8) {
        keel_errorf("%s: truncated: %lld bytes, not even the 8-byte header length", f->path,
                    (long long)size);
        return KEEL_ERR_INPUT;
    }
    keel_status st = keel_pread_all(f->fd, len8, 8, 0, f->path);
    if (st != KEEL_OK) return st;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    if (n > (uint64_t)MAX_HEADER_BYTES) {
        keel_errorf("%s: bad safetensors header: its length %llu exceeds 100 MiB (not a safetensors "
                    "file?)", f->path, (unsigned long long)n);
        return KEEL_ERR_INPUT;
    }
    if ((int64_t)n > size - 8) {
        keel_errorf("%s: truncated: the header needs %llu bytes but the file has %lld after the "
                    "length", f->path, (unsigned long long)n, (long long)(size - 8));
        return KEEL_ERR_INPUT;
    }
    char *text = keel_xmalloc(n + 1, "safetensors header");
    st = keel_pread_all(f->fd, text, n, 8, f->path);
    if (st == KEEL_OK) {
        text[n] = 0;
        f->header = cJSON_ParseWithLength(text, n);
        if (!f->header || !cJSON_IsObject(f->header)) {
            keel_errorf("%s: bad safetensors header: not a JSON object (not a safetensors file?)",
                        f->path);
            st = KEEL_ERR_INPUT;
        }
    }
    keel_free(text);
    f->data_start = 8 + (int64_t)n;
    f->data_bytes = size - f->data_start;
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

/* A JSON array of non-negative integers, into v (at most max); -1 if not. */
static int json_int_array(const cJSON *a, int64_t *v, int max) {
    if (!cJSON_IsArray(a)) return -1;
    int n = 0;
    for (const cJSON *e = a->child; e; e = e->next) {
        if (n == max || !cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble > 9.0e15)
            return -1;
        v[n++] = (int64_t)e->valuedouble;
    }
    return n;
}

static void shape_str(char *out, size_t size, const int64_t *shape, int n) {
    size_t k = (size_t)snprintf(out, size, "[");
    for (int i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(out + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(out + k, size - k, "]");
}

/* Read tensor t from f into dst (fp32). */
static keel_status file_read_tensor(const st_file *f, const safetensors_tensor *t, float *dst) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(f->header, t->name);
    if (!e) {
        keel_errorf("%s: missing tensor %s", f->path, t->name);
        return KEEL_ERR_INPUT;
    }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    int64_t shape[8], offs[3];
    int ns = json_int_array(cJSON_GetObjectItemCaseSensitive(e, "shape"), shape, 8);
    int no = json_int_array(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), offs, 3);
    if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || ns < 0 || no != 2) {
        keel_errorf("%s: bad safetensors header: tensor %s needs dtype, shape and data_offsets",
                    f->path, t->name);
        return KEEL_ERR_INPUT;
    }
    int esize = !strcmp(dtype->valuestring, "F32") ? 4
              : (!strcmp(dtype->valuestring, "F16") || !strcmp(dtype->valuestring, "BF16")) ? 2 : 0;
    if (!esize) {
        keel_errorf("%s: tensor %s has unsupported dtype %s; keel reads F32, F16 and BF16", f->path,
                    t->name, dtype->valuestring);
        return KEEL_ERR_INPUT;
    }
    bool shape_ok = ns == t->ndim && shape[0] == t->shape[0] && (ns == 1 || shape[1] == t->shape[1]);
    if (!shape_ok) {
        char got_s[160], want_s[64];
        shape_str(got_s, sizeof got_s, shape, ns);
        shape_str(want_s, sizeof want_s, t->shape, t->ndim);
        keel_errorf("%s: tensor %s has shape %s but config.json implies %s", f->path, t->name, got_s,
                    want_s);
        return KEEL_ERR_INPUT;
    }
    int64_t n = safetensors_f32_bytes(t) / 4;
    if (offs[1] < offs[0] || offs[1] - offs[0] != n * esize) {
        keel_errorf("%s: bad safetensors header: tensor %s's data_offsets [%lld, %lld] do not hold "
                    "%lld %s values", f->path, t->name, (long long)offs[0], (long long)offs[1],
                    (long long)n, dtype->valuestring);
        return KEEL_ERR_INPUT;
    }
    if (offs[1] > f->data_bytes) {
        keel_errorf("%s: truncated: tensor %s ends at data byte %lld but the file holds %lld", f->path,
                    t->name, (long long)offs[1], (long long)f->data_bytes);
        return KEEL_ERR_INPUT;
    }
    int64_t at = f->data_start + offs[0];
    if (esize == 4) return keel_pread_all(f->fd, dst, (size_t)n * 4, at, f->path);
    bool bf16 = dtype->valuestring[0] == 'B';
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = keel_xmalloc(sizeof(uint16_t) * CHUNK, "tensor conversion buffer");
    keel_status st = KEEL_OK;
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
        d->index = safetensors_read_json_object(d->index_path, "safetensors index");
        d->map = d->index ? cJSON_GetObjectItemCaseSensitive(d->index, "weight_map") : NULL;
        if (!d->index) {
            st = KEEL_ERR_INPUT;
        } else if (!cJSON_IsObject(d->map)) {
            keel_errorf("%s: no \"weight_map\" object", d->index_path);
            st = KEEL_ERR_INPUT;
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
    if (!cJSON_IsString(v) || !v->valuestring[0] || strchr(v->valuestring, '/') ||
        !strcmp(v->valuestring, "..") || !strcmp(v->valuestring, ".")) {
        keel_errorf("%s: weight_map entry of %s must be a file name in the same directory",
                    d->index_path, tensor);
        return KEEL_ERR_INPUT;
    }
    for (int i = 0; i < d->n_files; i++)
        if (!strcmp(d->files[i].name, v->valuestring)) {
            *out = &d->files[i];
            return KEEL_OK;
        }
    return add_file(d, v->valuestring, out);
}

keel_status safetensors_read(safetensors_dir *d, const safetensors_tensor *t, float *dst) {
    st_file *f;
    keel_status st = file_for(d, t->name, &f);
    return st == KEEL_OK ? file_read_tensor(f, t, dst) : st;
}
