/* hf/hf.c: Hugging Face LlamaForCausalLM directories (config.json +
 * safetensors) to and from keel's canonical parameter vector. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "keel/hf.h"
#include "keel/model.h"
#include "keel/tokenizer.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

#define ST_MAX_HEADER (100 << 20) /* the safetensors library's own limit */
#define MAX_FFN_MULTIPLE (1 << 20) /* model.multiple_of's range */
#define MAX_FFN_DIM_MULTIPLIER 64.0 /* model.ffn_dim_multiplier's range */

/* ---- small helpers ---------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n, cap;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->s ? b->s + b->n : NULL, room, fmt, ap);
        va_end(ap);
        KEEL_CHECK(k >= 0, "vsnprintf failed");
        if ((size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = keel_xrealloc(b->s, b->cap, "string buffer");
    }
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = keel_xmalloc(n, "path");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static keel_status write_all(int fd, const void *data, size_t bytes) {
    const char *p = data;
    while (bytes > 0) {
        size_t chunk = bytes < ((size_t)1 << 30) ? bytes : ((size_t)1 << 30);
        ssize_t n = write(fd, p, chunk);
        if (n < 0) {
            if (errno == EINTR) continue;
            return KEEL_ERR_IO;
        }
        p += n;
        bytes -= (size_t)n;
    }
    return KEEL_OK;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* dir/name := a ++ b, durably: tmp file in dir, fsync, rename. */
static keel_status write_file(const char *dir, const char *name, const void *a, size_t a_bytes,
                              const void *b, size_t b_bytes) {
    char *path = join(dir, name);
    size_t n = strlen(path) + 32;
    char *tmp = keel_xmalloc(n, "tmp path");
    snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
    keel_status st = KEEL_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        keel_errorf("%s: cannot create: %s", tmp, strerror(errno));
        st = KEEL_ERR_IO;
    } else {
        st = write_all(fd, a, a_bytes);
        if (st == KEEL_OK && b_bytes) st = write_all(fd, b, b_bytes);
        int saved = errno;
        if (st == KEEL_OK && fsync(fd) != 0) st = KEEL_ERR_IO, saved = errno;
        if (close(fd) != 0 && st == KEEL_OK) st = KEEL_ERR_IO, saved = errno;
        if (st == KEEL_OK && rename(tmp, path) != 0) st = KEEL_ERR_IO, saved = errno;
        if (st != KEEL_OK) {
            keel_errorf("%s: write failed: %s", path, strerror(saved));
            unlink(tmp);
        }
    }
    keel_free(tmp);
    keel_free(path);
    return st;
}

/* The whole of a (small) file as a NUL-terminated string; one-line error if
 * it cannot be read. */
static keel_status read_text(const char *path, const char *what, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        keel_errorf("%s: cannot open %s: %s", path, what, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (256L << 20)) {
        fclose(f);
        keel_errorf("%s: not a %s (size %ld bytes)", path, what, n);
        return KEEL_ERR_INPUT;
    }
    char *buf = keel_xmalloc((size_t)n + 1, what);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *out = buf;
    return KEEL_OK;
}

static cJSON *parse_json_file(const char *path, const char *what) {
    char *text;
    if (read_text(path, what, &text) != KEEL_OK) return NULL;
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

/* ---- the feed-forward size ------------------------------------------------ */

bool keel_hf_ffn_params(int dim, int64_t intermediate_size, int *multiple_of,
                        double *ffn_dim_multiplier) {
    int64_t I = intermediate_size;
    if (dim < 1 || I < 1 || I > INT32_MAX) return false;
    keel_model_config c = {.dim = dim};
    int64_t h = 2 * (4 * (int64_t)dim) / 3;
    /* Llama's own rule first: Meta's multiple_of 256 (Llama 2 7B and 13B,
     * TinyLlama), else the largest power of two that rounds h up to I, then
     * the smallest divisor of I that does. */
    c.ffn_dim_multiplier = 0;
    for (int k = -1; k <= 20; k++) {
        int m = k < 0 ? 256 : MAX_FFN_MULTIPLE >> k;
        if (I % m) continue;
        c.multiple_of = m;
        if (keel_model_ffn_hidden(&c) == I) goto found;
    }
    for (int64_t m = I - h + 1 > 1 ? I - h + 1 : 1; m <= I && m <= MAX_FFN_MULTIPLE; m++) {
        if (I % m) continue;
        c.multiple_of = (int)m;
        if (keel_model_ffn_hidden(&c) == I) goto found;
    }
    /* Otherwise (I below Llama's 8/3 dim, or not reachable by rounding) a
     * multiplier with multiple_of 1: (int64_t)(x * h) == I. */
    c.multiple_of = 1;
    for (int k = 0; k < 3; k++) {
        double x = ((double)I + (k == 0 ? 0.5 : k == 1 ? 0.25 : 0.75)) / (double)h;
        if (!(x > 0 && x <= MAX_FFN_DIM_MULTIPLIER)) break;
        c.ffn_dim_multiplier = x;
        if (keel_model_ffn_hidden(&c) == I) goto found;
    }
    return false;
found:
    *multiple_of = c.multiple_of;
    *ffn_dim_multiplier = c.ffn_dim_multiplier;
    return true;
}

/* ---- export ------------------------------------------------------------------ */

typedef struct {
    char *dir;          /* where files go: out_dir, or its staging directory */
    char **files;       /* names written so far (removed on failure) */
    int n_files, cap_files;
} export_ctx;

static keel_status export_write(export_ctx *x, const char *name, const void *a, size_t a_bytes,
                                const void *b, size_t b_bytes) {
    keel_status st = write_file(x->dir, name, a, a_bytes, b, b_bytes);
    if (st != KEEL_OK) return st;
    if (x->n_files == x->cap_files) {
        x->cap_files = x->cap_files * 2 + 8;
        x->files = keel_xrealloc(x->files, sizeof(char *) * (size_t)x->cap_files, "file list");
    }
    x->files[x->n_files++] = keel_xstrdup(name);
    return KEEL_OK;
}

static bool is_vector(const keel_tensor_info *t) { return t->cols == 1 && t->is_norm_or_embedding; }

/* One safetensors file holding tensors [first, last) of the layout, whose
 * data is one contiguous slice of params. */
static keel_status write_shard(export_ctx *x, const char *name, const keel_model_layout *lay,
                               int first, int last, const float *params) {
    strbuf h = {0};
    sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t begin = lay->tensors[first].offset, off = 0;
    for (int i = first; i < last; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        int64_t bytes = 4 * t->rows * t->cols;
        KEEL_CHECK(t->offset - begin == off / 4, "tensors are not contiguous");
        if (is_vector(t))
            sb_printf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],", t->name, (long long)t->rows);
        else
            sb_printf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],", t->name,
                      (long long)t->rows, (long long)t->cols);
        sb_printf(&h, "\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + bytes));
        off += bytes;
    }
    sb_printf(&h, "}");
    while (h.n % 8) sb_printf(&h, " ");
    size_t total = 8 + h.n;
    uint8_t *head = keel_xmalloc(total, "safetensors header");
    uint64_t n = h.n;
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)(n >> (8 * i));
    memcpy(head + 8, h.s, h.n);
    keel_free(h.s);
    keel_status st = export_write(x, name, head, total, params + begin, (size_t)off);
    keel_free(head);
    return st;
}

static keel_status write_config(export_ctx *x, const keel_model_layout *lay, int bos, int eos) {
    const keel_model_config *c = &lay->cfg;
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddBoolToObject(j, "attention_bias", false);
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddNumberToObject(j, "bos_token_id", bos);
    cJSON_AddNumberToObject(j, "eos_token_id", eos);
    cJSON_AddNumberToObject(j, "head_dim", lay->HS);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "hidden_size", lay->C);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddNumberToObject(j, "intermediate_size", lay->F);
    cJSON_AddNumberToObject(j, "max_position_embeddings", lay->T);
    cJSON_AddBoolToObject(j, "mlp_bias", false);
    cJSON_AddStringToObject(j, "model_type", "llama");
    cJSON_AddNumberToObject(j, "num_attention_heads", lay->NH);
    cJSON_AddNumberToObject(j, "num_hidden_layers", lay->L);
    cJSON_AddNumberToObject(j, "num_key_value_heads", lay->NKV);
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->norm_eps);
    cJSON_AddNullToObject(j, "rope_scaling");
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    cJSON_AddBoolToObject(j, "use_cache", true);
    cJSON_AddNumberToObject(j, "vocab_size", lay->V);
    /* keel's own spelling of intermediate_size, so an import is exact. */
    cJSON_AddNumberToObject(j, "keel_multiple_of", c->multiple_of);
    cJSON_AddNumberToObject(j, "keel_ffn_dim_multiplier", c->ffn_dim_multiplier);
    cJSON_AddStringToObject(j, "keel_version", KEEL_VERSION);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    /* cJSON indents with tabs; write transformers' two spaces (no value
     * here holds a tab). */
    strbuf b = {0};
    for (const char *p = text; *p; p++) {
        if (*p != '\t') sb_printf(&b, "%c", *p);
        else sb_printf(&b, "%s", p > text && p[-1] == ':' ? " " : "  ");
    }
    sb_printf(&b, "\n");
    free(text);
    keel_status st = export_write(x, "config.json", b.s, b.n, NULL, 0);
    keel_free(b.s);
    return st;
}

static keel_status write_index(export_ctx *x, const keel_model_layout *lay, const int *shard_of,
                               char names[][64]) {
    int64_t total = 0;
    for (int i = 0; i < lay->n_tensors; i++) total += 4 * lay->tensors[i].rows * lay->tensors[i].cols;
    strbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {\n",
              (long long)total);
    for (int i = 0; i < lay->n_tensors; i++)
        sb_printf(&b, "    \"%s\": \"%s\"%s\n", lay->tensors[i].name, names[shard_of[i]],
                  i + 1 < lay->n_tensors ? "," : "");
    sb_printf(&b, "  }\n}\n");
    keel_status st = export_write(x, "model.safetensors.index.json", b.s, b.n, NULL, 0);
    keel_free(b.s);
    return st;
}

static keel_status copy_tokenizer(export_ctx *x, const char *src, const keel_model_layout *lay) {
    char *data = NULL;
    FILE *f = fopen(src, "rb");
    if (!f) {
        keel_errorf("%s: cannot open tokenizer: %s", src, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    keel_status st = KEEL_OK;
    if (n < 0) {
        keel_errorf("%s: cannot read tokenizer: %s", src, strerror(errno));
        st = KEEL_ERR_INPUT;
    } else {
        data = keel_xmalloc((size_t)n + 1, "tokenizer copy");
        if (fread(data, 1, (size_t)n, f) != (size_t)n) {
            keel_errorf("%s: cannot read tokenizer: short read", src);
            st = KEEL_ERR_INPUT;
        }
    }
    fclose(f);
    if (st == KEEL_OK) st = export_write(x, "tokenizer.model", data, (size_t)n, NULL, 0);
    keel_free(data);
    if (st != KEEL_OK) return st;
    strbuf b = {0};
    sb_printf(&b,
              "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": true,\n"
              "  \"add_eos_token\": false,\n  \"model_max_length\": %d\n}\n",
              lay->T);
    st = export_write(x, "tokenizer_config.json", b.s, b.n, NULL, 0);
    keel_free(b.s);
    return st;
}

/* 0: absent, 1: an empty directory, -1: anything else (error printed). */
static int out_dir_state(const char *out_dir) {
    struct stat s;
    if (stat(out_dir, &s) != 0) {
        if (errno == ENOENT) return 0;
        keel_errorf("%s: cannot use as the export directory: %s", out_dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(s.st_mode)) {
        keel_errorf("%s: exists and is not a directory; choose a new export directory", out_dir);
        return -1;
    }
    DIR *d = opendir(out_dir);
    if (!d) {
        keel_errorf("%s: cannot read directory: %s", out_dir, strerror(errno));
        return -1;
    }
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    if (!empty) {
        keel_errorf("%s: directory is not empty; export into a new or empty directory", out_dir);
        return -1;
    }
    return 1;
}

keel_status keel_hf_export(const keel_model_config *cfg, const float *params,
                           const char *tokenizer_model_path, const char *out_dir,
                           int64_t max_shard_bytes) {
    if (max_shard_bytes < 0) {
        keel_errorf("%s: max shard size %lld must be >= 0 (0 = one file)", out_dir,
                    (long long)max_shard_bytes);
        return KEEL_ERR_INPUT;
    }
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    int bos = 1, eos = 2;
    if (tokenizer_model_path) {
        keel_tokenizer *tok;
        if (keel_tokenizer_load(tokenizer_model_path, &tok) != KEEL_OK) {
            keel_model_layout_free(&lay);
            return KEEL_ERR_INPUT;
        }
        int tv = keel_tokenizer_vocab_size(tok);
        if (keel_tokenizer_bos_id(tok) >= 0) bos = keel_tokenizer_bos_id(tok);
        if (keel_tokenizer_eos_id(tok) >= 0) eos = keel_tokenizer_eos_id(tok);
        keel_tokenizer_free(tok);
        if (tv != lay.V) {
            keel_errorf("%s: tokenizer has %d pieces but the model's vocab_size is %d; export with "
                        "the tokenizer the model was trained with", tokenizer_model_path, tv, lay.V);
            keel_model_layout_free(&lay);
            return KEEL_ERR_INPUT;
        }
    }

    /* out_dir without trailing slashes, so out_dir.tmp.PID is its sibling. */
    char *out = keel_xstrdup(out_dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    int state = out_dir_state(out);
    if (state < 0) {
        keel_free(out);
        keel_model_layout_free(&lay);
        return KEEL_ERR_INPUT;
    }
    export_ctx x = {0};
    bool staged = state == 0;
    if (staged) {
        size_t n = strlen(out) + 32;
        x.dir = keel_xmalloc(n, "staging path");
        snprintf(x.dir, n, "%s.tmp.%d", out, (int)getpid());
        if (mkdir(x.dir, 0755) != 0) {
            int e = errno;
            keel_errorf("%s: cannot create export directory: %s", x.dir, strerror(e));
            keel_free(x.dir);
            keel_free(out);
            keel_model_layout_free(&lay);
            return e == ENOENT || e == ENOTDIR ? KEEL_ERR_INPUT : KEEL_ERR_IO;
        }
    } else {
        x.dir = keel_xstrdup(out);
    }

    /* Shards: tensors in canonical order, a new file whenever the next tensor
     * would push this one past max_shard_bytes. */
    int *shard_of = keel_xmalloc(sizeof(int) * (size_t)lay.n_tensors, "shard map");
    int n_shards = 0;
    int64_t total = 0, in_shard = 0;
    for (int i = 0; i < lay.n_tensors; i++) total += 4 * lay.tensors[i].rows * lay.tensors[i].cols;
    bool split = max_shard_bytes > 0 && total > max_shard_bytes;
    for (int i = 0; i < lay.n_tensors; i++) {
        int64_t bytes = 4 * lay.tensors[i].rows * lay.tensors[i].cols;
        if (i == 0 || (split && in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
            n_shards++;
            in_shard = 0;
        }
        shard_of[i] = n_shards - 1;
        in_shard += bytes;
    }
    char(*names)[64] = keel_xmalloc(sizeof(char[64]) * (size_t)n_shards, "shard names");
    for (int s = 0; s < n_shards; s++) {
        if (split) snprintf(names[s], 64, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        else snprintf(names[s], 64, "model.safetensors");
    }

    keel_status st = KEEL_OK;
    for (int s = 0, first = 0; st == KEEL_OK && s < n_shards; s++) {
        int last = first;
        while (last < lay.n_tensors && shard_of[last] == s) last++;
        st = write_shard(&x, names[s], &lay, first, last, params);
        first = last;
    }
    if (st == KEEL_OK && split) st = write_index(&x, &lay, shard_of, names);
    if (st == KEEL_OK && tokenizer_model_path) st = copy_tokenizer(&x, tokenizer_model_path, &lay);
    if (st == KEEL_OK) st = write_config(&x, &lay, bos, eos);
    if (st == KEEL_OK) {
        fsync_dir(x.dir);
        if (staged) {
            if (rename(x.dir, out) != 0) {
                keel_errorf("%s: cannot move the export into place from %s: %s", out, x.dir,
                            strerror(errno));
                st = KEEL_ERR_IO;
            } else {
                char *parent = join(out, "..");
                fsync_dir(parent);
                keel_free(parent);
            }
        }
    }
    if (st != KEEL_OK) { /* leave nothing behind */
        for (int i = 0; i < x.n_files; i++) {
            char *p = join(x.dir, x.files[i]);
            unlink(p);
            keel_free(p);
        }
        if (staged) rmdir(x.dir);
    } else {
        keel_log_info("exported %lld parameters to %s (%d safetensors file%s)", (long long)lay.n_params,
                      out, n_shards, n_shards == 1 ? "" : "s");
    }
    for (int i = 0; i < x.n_files; i++) keel_free(x.files[i]);
    keel_free(x.files);
    keel_free(x.dir);
    keel_free(names);
    keel_free(shard_of);
    keel_free(out);
    keel_model_layout_free(&lay);
    return st;
}

/* ---- import: config.json ------------------------------------------------- */

/* config[key] as an integer >= min; *present false (and *out untouched) when
 * absent or null and !required. */
static bool json_int(const cJSON *root, const char *path, const char *key, bool required,
                     int64_t min, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) keel_errorf("%s: no \"%s\"; a LlamaForCausalLM config needs it", path, key);
        return !required;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)min ||
        v->valuedouble > 2147483647.0) {
        keel_errorf("%s: \"%s\" must be an integer >= %lld", path, key, (long long)min);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool json_double(const cJSON *root, const char *path, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble)) {
        keel_errorf("%s: \"%s\" must be a positive number", path, key);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* A key that must be absent or have the value keel implements. */
static bool json_bool_is(const cJSON *root, const char *path, const char *key, bool want,
                         const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) {
        keel_errorf("%s: \"%s\" must be true or false", path, key);
        return false;
    }
    if (cJSON_IsTrue(v) != want) {
        keel_errorf("%s: \"%s\": %s is not supported: %s", path, key, want ? "false" : "true", why);
        return false;
    }
    return true;
}

/* rope_scaling (transformers 4) or rope_parameters (5): only the default. */
static bool rope_ok(const cJSON *root, const char *path, double *theta) {
    const char *keys[] = {"rope_scaling", "rope_parameters"};
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (!r || cJSON_IsNull(r)) continue;
        if (!cJSON_IsObject(r)) {
            keel_errorf("%s: \"%s\" must be an object or null", path, keys[i]);
            return false;
        }
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
        if (!type) type = cJSON_GetObjectItemCaseSensitive(r, "type");
        if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)) {
            keel_errorf("%s: \"%s\" type %s is not supported: keel implements default RoPE only",
                        path, keys[i], cJSON_IsString(type) ? type->valuestring : "(not a string)");
            return false;
        }
        if (!type && i == 0) {
            keel_errorf("%s: \"rope_scaling\" is set; keel implements default RoPE only", path);
            return false;
        }
        if (!json_double(r, path, "rope_theta", theta)) return false;
    }
    return true;
}

static keel_status import_config(const char *hf_dir, keel_model_config *out) {
    char *path = join(hf_dir, "config.json");
    cJSON *root = parse_json_file(path, "Hugging Face config");
    keel_status st = KEEL_ERR_INPUT;
    int64_t C = 0, F = 0, L = 0, NH = 0, V = 0, NKV = -1, T = 2048, head_dim = -1;
    double eps = 1e-6, theta = 10000.0; /* LlamaConfig's defaults */
    bool tied = false;
    const cJSON *v;
    if (!root) goto done;
    v = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, "llama") == 0)) {
        keel_errorf("%s: model_type %s is not \"llama\"; keel imports LlamaForCausalLM checkpoints",
                    path, cJSON_IsString(v) ? v->valuestring : "(not a string)");
        goto done;
    }
    if (!v) {
        keel_errorf("%s: no \"model_type\"; expected a LlamaForCausalLM config (\"llama\")", path);
        goto done;
    }
    if (!json_int(root, path, "hidden_size", true, 1, &C) ||
        !json_int(root, path, "intermediate_size", true, 1, &F) ||
        !json_int(root, path, "num_hidden_layers", true, 1, &L) ||
        !json_int(root, path, "num_attention_heads", true, 1, &NH) ||
        !json_int(root, path, "vocab_size", true, 2, &V) ||
        !json_int(root, path, "num_key_value_heads", false, 1, &NKV) ||
        !json_int(root, path, "max_position_embeddings", false, 1, &T) ||
        !json_int(root, path, "head_dim", false, 1, &head_dim) ||
        !json_double(root, path, "rms_norm_eps", &eps) ||
        !json_double(root, path, "rope_theta", &theta) || !rope_ok(root, path, &theta) ||
        !json_bool_is(root, path, "attention_bias", false, "keel's projections have no bias") ||
        !json_bool_is(root, path, "mlp_bias", false, "keel's projections have no bias"))
        goto done;
    v = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) {
            keel_errorf("%s: \"tie_word_embeddings\" must be true or false", path);
            goto done;
        }
        tied = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, "silu") == 0)) {
        keel_errorf("%s: hidden_act %s is not supported: keel's MLP is SwiGLU (\"silu\")", path,
                    cJSON_IsString(v) ? v->valuestring : "(not a string)");
        goto done;
    }
    if (NKV < 0) NKV = NH;
    if (head_dim > 0 && head_dim * NH != C) {
        keel_errorf("%s: head_dim %lld is not hidden_size / num_attention_heads = %lld / %lld; keel "
                    "needs head_dim * num_attention_heads == hidden_size",
                    path, (long long)head_dim, (long long)C, (long long)NH);
        goto done;
    }
    /* intermediate_size as keel's (multiple_of, ffn_dim_multiplier): keel's
     * own export says which; otherwise derive a pair that reproduces it. */
    int multiple_of = 0;
    double mult = 0;
    {
        const cJSON *hm = cJSON_GetObjectItemCaseSensitive(root, "keel_multiple_of");
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(root, "keel_ffn_dim_multiplier");
        if (cJSON_IsNumber(hm) && hm->valuedouble >= 1 && hm->valuedouble <= MAX_FFN_MULTIPLE &&
            hm->valuedouble == floor(hm->valuedouble) && cJSON_IsNumber(hx) &&
            hx->valuedouble >= 0 && hx->valuedouble <= MAX_FFN_DIM_MULTIPLIER && C <= INT32_MAX) {
            int hint_m = (int)hm->valuedouble;
            keel_model_config c = {.dim = (int)C, .multiple_of = hint_m,
                                   .ffn_dim_multiplier = hx->valuedouble};
            if (keel_model_ffn_hidden(&c) == F) multiple_of = hint_m, mult = hx->valuedouble;
        }
    }
    if (!multiple_of && !keel_hf_ffn_params((int)C, F, &multiple_of, &mult)) {
        keel_errorf("%s: intermediate_size %lld cannot be expressed with keel's model.multiple_of / "
                    "model.ffn_dim_multiplier at hidden_size %lld",
                    path, (long long)F, (long long)C);
        goto done;
    }
    /* keel's own checks, ranges included, through its config parser. */
    {
        cJSON *j = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(j, "model");
        cJSON_AddNumberToObject(m, "dim", (double)C);
        cJSON_AddNumberToObject(m, "n_layers", (double)L);
        cJSON_AddNumberToObject(m, "n_heads", (double)NH);
        cJSON_AddNumberToObject(m, "n_kv_heads", (double)NKV);
        cJSON_AddNumberToObject(m, "vocab_size", (double)V);
        cJSON_AddNumberToObject(m, "multiple_of", multiple_of);
        cJSON_AddNumberToObject(m, "ffn_dim_multiplier", mult);
        cJSON_AddNumberToObject(m, "norm_eps", eps);
        cJSON_AddNumberToObject(m, "rope_theta", theta);
        cJSON_AddNumberToObject(m, "max_seq_len", (double)T);
        cJSON_AddBoolToObject(m, "tie_embeddings", tied);
        char *text = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        keel_config kc;
        keel_config_defaults(&kc);
        st = keel_config_load_string(&kc, text, path);
        free(text);
        if (st == KEEL_OK) {
            kc.source = keel_xstrdup(path);
            kc.data.synthetic = true; /* the data section is not ours to check */
            st = keel_config_finalize(&kc);
        }
        if (st == KEEL_OK) {
            /* Exact values, not their round trip through text. */
            kc.model.norm_eps = eps;
            kc.model.rope_theta = theta;
            kc.model.ffn_dim_multiplier = mult;
            KEEL_CHECK(keel_model_ffn_hidden(&kc.model) == F, "ffn size %d != %lld",
                       keel_model_ffn_hidden(&kc.model), (long long)F);
            *out = kc.model;
        }
        keel_config_free(&kc);
    }
done:
    cJSON_Delete(root);
    keel_free(path);
    return st;
}

/* ---- import: safetensors ---------------------------------------------------- */

typedef struct {
    char *name;      /* as the weight map spells it */
    char *path;
    int fd;
    int64_t data_start, data_bytes;
    cJSON *header;
} st_file;

static void st_close(st_file *f) {
    if (f->fd >= 0) close(f->fd);
    cJSON_Delete(f->header);
    keel_free(f->name);
    keel_free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

static keel_status read_at(const st_file *f, void *dst, size_t bytes, int64_t at, const char *tensor) {
    char *p = dst;
    while (bytes > 0) {
        size_t chunk = bytes < ((size_t)1 << 30) ? bytes : ((size_t)1 << 30);
        ssize_t n = pread(f->fd, p, chunk, (off_t)at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            keel_errorf("%s: read failed (tensor %s): %s", f->path, tensor, strerror(errno));
            return KEEL_ERR_IO;
        }
        if (n == 0) {
            keel_errorf("%s: truncated: tensor %s's data is cut short", f->path, tensor);
            return KEEL_ERR_INPUT;
        }
        p += n;
        bytes -= (size_t)n;
        at += n;
    }
    return KEEL_OK;
}

static keel_status st_open(st_file *f, const char *dir, const char *name) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->name = keel_xstrdup(name);
    f->path = join(dir, name);
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
    keel_status st = read_at(f, len8, 8, 0, "(header)");
    if (st != KEEL_OK) return st;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    if (n > (uint64_t)ST_MAX_HEADER) {
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
    st = read_at(f, text, n, 8, "(header)");
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

/* Read tensor t of the layout from f into dst (fp32). */
static keel_status st_read_tensor(const st_file *f, const keel_tensor_info *t, float *dst) {
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
    bool vec = is_vector(t);
    int64_t want[2] = {t->rows, t->cols};
    bool shape_ok = vec ? (ns == 1 && shape[0] == t->rows)
                        : (ns == 2 && shape[0] == t->rows && shape[1] == t->cols);
    if (!shape_ok) {
        char got_s[160], want_s[64];
        shape_str(got_s, sizeof got_s, shape, ns);
        shape_str(want_s, sizeof want_s, want, vec ? 1 : 2);
        keel_errorf("%s: tensor %s has shape %s but config.json implies %s", f->path, t->name, got_s,
                    want_s);
        return KEEL_ERR_INPUT;
    }
    int64_t n = t->rows * t->cols;
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
    if (esize == 4) return read_at(f, dst, (size_t)n * 4, at, t->name);
    bool bf16 = dtype->valuestring[0] == 'B';
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = keel_xmalloc(sizeof(uint16_t) * CHUNK, "tensor conversion buffer");
    keel_status st = KEEL_OK;
    for (int64_t i = 0; st == KEEL_OK && i < n; i += CHUNK) {
        int64_t k = n - i < CHUNK ? n - i : CHUNK;
        st = read_at(f, buf, (size_t)k * 2, at + 2 * i, t->name);
        for (int64_t j = 0; st == KEEL_OK && j < k; j++)
            dst[i + j] = bf16 ? keel_bf16_to_float(buf[j]) : f16_to_float(buf[j]);
    }
    keel_free(buf);
    return st;
}

/* The shard file a weight map names, opened once. */
static keel_status shard_for(const char *hf_dir, const char *index_path, const cJSON *map,
                             const char *tensor, st_file *files, int *n_files, st_file **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(map, tensor);
    if (!v) {
        keel_errorf("%s: missing tensor %s (not in weight_map)", index_path, tensor);
        return KEEL_ERR_INPUT;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0] || strchr(v->valuestring, '/') ||
        !strcmp(v->valuestring, "..") || !strcmp(v->valuestring, ".")) {
        keel_errorf("%s: weight_map entry of %s must be a file name in the same directory", index_path,
                    tensor);
        return KEEL_ERR_INPUT;
    }
    for (int i = 0; i < *n_files; i++)
        if (!strcmp(files[i].name, v->valuestring)) {
            *out = &files[i];
            return KEEL_OK;
        }
    st_file *f = &files[(*n_files)++];
    *out = f;
    return st_open(f, hf_dir, v->valuestring);
}

static keel_status import_weights(const char *hf_dir, const keel_model_layout *lay, float *params) {
    char *single = join(hf_dir, "model.safetensors");
    char *index_path = join(hf_dir, "model.safetensors.index.json");
    st_file *files = keel_xcalloc(sizeof(st_file) * (size_t)(lay->n_tensors + 1), "safetensors files");
    int n_files = 0;
    cJSON *index = NULL;
    const cJSON *map = NULL;
    keel_status st = KEEL_OK;
    if (file_exists(single)) {
        st = st_open(&files[n_files++], hf_dir, "model.safetensors");
    } else if (file_exists(index_path)) {
        index = parse_json_file(index_path, "safetensors index");
        map = index ? cJSON_GetObjectItemCaseSensitive(index, "weight_map") : NULL;
        if (!index) {
            st = KEEL_ERR_INPUT;
        } else if (!cJSON_IsObject(map)) {
            keel_errorf("%s: no \"weight_map\" object", index_path);
            st = KEEL_ERR_INPUT;
        }
    } else {
        keel_errorf("%s: no model.safetensors or model.safetensors.index.json (keel reads "
                    "safetensors checkpoints only)", hf_dir);
        st = KEEL_ERR_INPUT;
    }
    for (int i = 0; st == KEEL_OK && i < lay->n_tensors; i++) {
        const keel_tensor_info *t = &lay->tensors[i];
        st_file *f = &files[0];
        if (map) st = shard_for(hf_dir, index_path, map, t->name, files, &n_files, &f);
        if (st == KEEL_OK) st = st_read_tensor(f, t, params + t->offset);
    }
    for (int i = 0; i < n_files; i++) st_close(&files[i]);
    keel_free(files);
    cJSON_Delete(index);
    keel_free(single);
    keel_free(index_path);
    return st;
}

keel_status keel_hf_import(const char *hf_dir, keel_model_config *cfg_out, float **params_out) {
    keel_model_config cfg;
    keel_status st = import_config(hf_dir, &cfg);
    if (st != KEEL_OK) return st;
    keel_model_layout lay;
    keel_model_layout_init(&lay, &cfg);
    float *params = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "imported parameters");
    st = import_weights(hf_dir, &lay, params);
    if (st == KEEL_OK) {
        *cfg_out = cfg;
        *params_out = params;
    } else {
        keel_free(params);
    }
    keel_model_layout_free(&lay);
    return st;
}
