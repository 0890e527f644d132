/* hf/hf.c: Hugging Face LlamaForCausalLM directories (config.json +
 * safetensors) to and from keel's canonical parameter vector: the Llama
 * mapping (tensor names and shapes, config.json); the file format is
 * safetensors.c's. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf/safetensors.h"
#include "keel/hf.h"
#include "keel/model.h"
#include "keel/tokenizer.h"
#define MAX_FFN_MULTIPLE (1 << 20) /* model.multiple_of's range */
#define MAX_FFN_DIM_MULTIPLIER 64.0 /* model.ffn_dim_multiplier's range */

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

/* name is in x->dir now: remember it (removed if the export fails). */
static void export_wrote(export_ctx *x, const char *name) {
    if (x->n_files == x->cap_files) {
        x->cap_files = x->cap_files * 2 + 8;
        x->files = keel_xrealloc(x->files, sizeof(char *) * (size_t)x->cap_files, "file list");
    }
    x->files[x->n_files++] = keel_xstrdup(name);
}

static keel_status export_write(export_ctx *x, const char *name, const void *data, size_t bytes) {
    char *path = keel_path_join(x->dir, name);
    keel_status st = keel_write_file_atomic(path, data, bytes);
    keel_free(path);
    if (st == KEEL_OK) export_wrote(x, name);
    return st;
}

/* A layout tensor as Hugging Face stores it: norm weights (and other
 * column vectors of the norm/embedding kind) are 1-dimensional. */
static safetensors_tensor hf_tensor(const keel_tensor_info *t) {
    bool vector = t->cols == 1 && t->is_norm_or_embedding;
    return (safetensors_tensor){.name = t->name, .ndim = vector ? 1 : 2, .shape = {t->rows, t->cols}};
}

/* One safetensors file holding tensors [first, last) of the layout, each read
 * from the source into buf (room for the largest tensor) and streamed into a
 * durable file. */
static keel_status write_shard(export_ctx *x, const char *name, const keel_model_layout *lay,
                               const safetensors_tensor *t, int first, int last, keel_param_source read,
                               void *ctx, float *buf) {
    size_t head_bytes;
    uint8_t *head = safetensors_header(t + first, last - first, &head_bytes);
    char *path = keel_path_join(x->dir, name);
    keel_atomic_file f;
    keel_status st = keel_atomic_begin(&f, path);
    if (st == KEEL_OK) st = keel_write_all(f.fd, head, head_bytes, path);
    for (int i = first; i < last && st == KEEL_OK; i++) {
        const keel_tensor_info *ti = &lay->tensors[i];
        st = read(ctx, ti->offset, ti->rows * ti->cols, buf);
        if (st == KEEL_OK) st = keel_write_all(f.fd, buf, (size_t)safetensors_f32_bytes(&t[i]), path);
    }
    if (st == KEEL_OK) st = keel_atomic_commit(&f);
    else keel_atomic_abort(&f);
    if (st == KEEL_OK) export_wrote(x, name);
    keel_free(path);
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
    if (bos >= 0) cJSON_AddNumberToObject(j, "bos_token_id", bos);
    else cJSON_AddNullToObject(j, "bos_token_id");
    if (eos >= 0) cJSON_AddNumberToObject(j, "eos_token_id", eos);
    else cJSON_AddNullToObject(j, "eos_token_id");
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
    if (c->rope_scaling.on) { /* as Llama 3.1's config.json spells it */
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddNumberToObject(rs, "factor", c->rope_scaling.factor);
        cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_scaling.high_freq_factor);
        cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_scaling.low_freq_factor);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                c->rope_scaling.original_max_position_embeddings);
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
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
    char *json = keel_xmalloc(2 * strlen(text) + 2, "config.json");
    size_t n = 0;
    for (const char *p = text; *p; p++) {
        if (*p != '\t') json[n++] = *p;
        else if (p > text && p[-1] == ':') json[n++] = ' ';
        else json[n++] = ' ', json[n++] = ' ';
    }
    json[n++] = '\n';
    free(text);
    keel_status st = export_write(x, "config.json", json, n);
    keel_free(json);
    return st;
}

static keel_status copy_file(export_ctx *x, const char *src, const char *name) {
    char *data;
    size_t bytes;
    if (keel_read_file_quiet(src, 0, &data, &bytes) != KEEL_OK) {
        keel_errorf("%s: cannot read tokenizer: %s", src, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    keel_status st = export_write(x, name, data, bytes);
    keel_free(data);
    return st;
}

/* The tokenizer under the name Hugging Face gives it (file_name: tokenizer.model or
 * tokenizer.json) and a tokenizer_config.json: for a tokenizer.json the one beside it (it names
 * BOS and EOS) or, when it has none, a minimal one. */
static keel_status copy_tokenizer(export_ctx *x, const char *src, const char *file_name,
                                  const keel_model_layout *lay) {
    keel_status st = copy_file(x, src, file_name);
    if (st != KEEL_OK) return st;
    char json[256];
    if (strcmp(file_name, "tokenizer.json") == 0) {
        char *config = keel_tokenizer_config_path(src);
        if (config) st = copy_file(x, config, "tokenizer_config.json");
        keel_free(config);
        if (config) return st;
        int n = snprintf(json, sizeof json,
                         "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"model_max_length\": %d\n}\n",
                         lay->T);
        return export_write(x, "tokenizer_config.json", json, (size_t)n);
    }
    /* A SentencePiece model kept as Hugging Face names it (an import's) has its own
     * tokenizer_config.json beside it; any other .model gets a minimal one. */
    const char *base = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
    char *config = strcmp(base, "tokenizer.model") == 0 ? keel_tokenizer_config_path(src) : NULL;
    if (config) {
        st = copy_file(x, config, "tokenizer_config.json");
        keel_free(config);
        return st;
    }
    int n = snprintf(json, sizeof json,
                     "{\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"add_bos_token\": true,\n"
                     "  \"add_eos_token\": false,\n  \"model_max_length\": %d\n}\n",
                     lay->T);
    return export_write(x, "tokenizer_config.json", json, (size_t)n);
}

/* ---- generation_config.json ------------------------------------------------ */

#define MAX_GENERATION_CONFIG_BYTES ((size_t)1 << 20)

/* One token id of generation_config.json (key): absent or null, an integer in
 * [0, V), or — eos_token_id — a list of them (Llama 3.x Instruct stops at
 * several). *id gets a single integer, else stays; ids/n (may be NULL) get
 * every id, at most KEEL_HF_MAX_EOS. */
static bool generation_id_ok(const cJSON *root, const char *key, int V, int *id, int32_t *ids, int *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    int64_t x;
    if (!v || cJSON_IsNull(v)) return true;
    if (keel_json_int(v, 0, V - 1, &x)) {
        *id = (int)x;
        if (ids) ids[(*n)++] = (int32_t)x;
        return true;
    }
    if (!cJSON_IsArray(v) || strcmp(key, "eos_token_id") != 0 || cJSON_GetArraySize(v) < 1 ||
        cJSON_GetArraySize(v) > KEEL_HF_MAX_EOS)
        return false;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!keel_json_int(e, 0, V - 1, &x)) return false;
        if (ids) ids[(*n)++] = (int32_t)x;
    }
    return true;
}

/* generation_config.json's text[0, len) (path names it): a JSON object whose
 * bos_token_id, eos_token_id and pad_token_id are token ids below V. *bos and
 * *eos get its single ids (untouched when absent, null or a list), eos_ids
 * (may be NULL) every eos id. `fix` ends the one error line. */
static keel_status check_generation_config(const char *text, size_t len, const char *path, int V, int *bos,
                                           int *eos, int32_t *eos_ids, int *n_eos, const char *fix) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    keel_status st = KEEL_ERR_INPUT;
    int pad = -1;
    if (n_eos) *n_eos = 0;
    if (!cJSON_IsObject(root)) {
        keel_errorf("%s: not a JSON object (a generation config); %s", path, fix);
    } else if (!generation_id_ok(root, "bos_token_id", V, bos, NULL, NULL) ||
               !generation_id_ok(root, "eos_token_id", V, eos, eos_ids, n_eos) ||
               !generation_id_ok(root, "pad_token_id", V, &pad, NULL, NULL)) {
        keel_errorf("%s: bos_token_id, eos_token_id and pad_token_id must be token ids below vocab_size %d "
                    "(eos_token_id may be a list of up to %d of them) or null; %s", path, V, KEEL_HF_MAX_EOS, fix);
    } else {
        st = KEEL_OK;
    }
    cJSON_Delete(root);
    return st;
}

keel_status keel_hf_generation_config(const char *text, size_t len, const char *path, int V, int *bos,
                                      int32_t *eos, int *n_eos) {
    int one_eos = -1;
    *bos = -1;
    return check_generation_config(text, len, path, V, bos, &one_eos, eos, n_eos, "fix the file or leave it out");
}

/* generation_config.json: the one given (gen, carried through byte for byte)
 * or, as transformers' GenerationConfig.from_model_config saves it, one with
 * the model's BOS and EOS (a null one left out). */
static keel_status write_generation_config(export_ctx *x, const char *gen, size_t gen_len, int bos, int eos) {
    if (gen) return export_write(x, "generation_config.json", gen, gen_len);
    char json[160];
    int n = snprintf(json, sizeof json, "{\n  \"_from_model_config\": true");
    if (bos >= 0) n += snprintf(json + n, sizeof json - (size_t)n, ",\n  \"bos_token_id\": %d", bos);
    if (eos >= 0) n += snprintf(json + n, sizeof json - (size_t)n, ",\n  \"eos_token_id\": %d", eos);
    n += snprintf(json + n, sizeof json - (size_t)n, "\n}\n");
    return export_write(x, "generation_config.json", json, (size_t)n);
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

/* Every file of the export into x->dir: the safetensors file(s) (tensors in
 * canonical order, split by max_shard_bytes) and their index, the tokenizer,
 * config.json. *n_files counts the safetensors files. */
static keel_status write_export(export_ctx *x, const keel_model_layout *lay, keel_param_source read, void *ctx,
                                int64_t max_shard_bytes, const char *tokenizer_model_path,
                                const char *tokenizer_file, const char *gen, size_t gen_len, int bos, int eos,
                                int *n_files) {
    safetensors_tensor *t = keel_xmalloc(sizeof *t * (size_t)lay->n_tensors, "tensor list");
    int *file_of = keel_xmalloc(sizeof(int) * (size_t)lay->n_tensors, "shard map");
    int64_t largest = 0;
    for (int i = 0; i < lay->n_tensors; i++) {
        t[i] = hf_tensor(&lay->tensors[i]);
        if (lay->tensors[i].rows * lay->tensors[i].cols > largest) largest = lay->tensors[i].rows * lay->tensors[i].cols;
    }
    float *buf = keel_xmalloc(sizeof(float) * (size_t)largest, "tensor buffer");
    bool indexed;
    *n_files = safetensors_plan_files(t, lay->n_tensors, max_shard_bytes, file_of, &indexed);
    keel_status st = KEEL_OK;
    for (int f = 0, first = 0; st == KEEL_OK && f < *n_files; f++) {
        int last = first;
        while (last < lay->n_tensors && file_of[last] == f) last++;
        char name[64];
        safetensors_file_name(name, f, *n_files, indexed);
        st = write_shard(x, name, lay, t, first, last, read, ctx, buf);
        first = last;
    }
    if (st == KEEL_OK && indexed) {
        size_t len;
        char *index = safetensors_index_json(t, lay->n_tensors, file_of, *n_files, &len);
        st = export_write(x, SAFETENSORS_INDEX, index, len);
        keel_free(index);
    }
    if (st == KEEL_OK && tokenizer_model_path) st = copy_tokenizer(x, tokenizer_model_path, tokenizer_file, lay);
    if (st == KEEL_OK) st = write_config(x, lay, bos, eos);
    if (st == KEEL_OK) st = write_generation_config(x, gen, gen_len, bos, eos);
    keel_free(buf);
    keel_free(file_of);
    keel_free(t);
    return st;
}

/* The tokenizer export copies: its Hugging Face file name and BOS/EOS (a
 * tokenizer.json's -1, null, included), and a vocabulary that fits the
 * model's V (smaller is a padded embedding: said once, exported). */
static keel_status export_tokenizer(const char *path, int V, const char **file_name, int *bos, int *eos) {
    keel_tokenizer *tok;
    if (keel_tokenizer_load(path, &tok) != KEEL_OK) return KEEL_ERR_INPUT;
    int tv = keel_tokenizer_vocab_size(tok);
    *file_name = keel_tokenizer_file_name(tok); /* a string literal: outlives tok */
    bool json = strcmp(*file_name, "tokenizer.json") == 0;
    if (json || keel_tokenizer_bos_id(tok) >= 0) *bos = keel_tokenizer_bos_id(tok);
    if (json || keel_tokenizer_eos_id(tok) >= 0) *eos = keel_tokenizer_eos_id(tok);
    keel_tokenizer_free(tok);
    if (tv > V) {
        keel_errorf("%s: tokenizer has %d pieces but the model's vocab_size is %d; export with "
                    "the tokenizer the model was trained with", path, tv, V);
        return KEEL_ERR_INPUT;
    }
    if (tv < V)
        keel_log_warn("%s: tokenizer has %d tokens, the model's vocab_size is %d: the embedding's last %d rows "
                      "are padding no token uses", path, tv, V, V - tv);
    return KEEL_OK;
}

/* Into out_dir — a new directory (staged as out_dir.tmp.PID, renamed when
 * every file is durable) or an empty one — the files write(x, arg, n_files)
 * writes; on failure nothing is left behind. */
static keel_status export_dir(const char *out_dir, keel_status (*write)(export_ctx *x, void *arg, int *n_files),
                              void *arg, int *n_files) {
    /* out_dir without trailing slashes, so out_dir.tmp.PID is its sibling. */
    char *out = keel_xstrdup(out_dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    int state = out_dir_state(out);
    if (state < 0) {
        keel_free(out);
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
            return e == ENOENT || e == ENOTDIR ? KEEL_ERR_INPUT : KEEL_ERR_IO;
        }
    } else {
        x.dir = keel_xstrdup(out);
    }
    keel_status st = write(&x, arg, n_files);
    /* Every file is durable in x.dir; a staged export then moves into place. */
    if (st == KEEL_OK) st = staged ? keel_commit_dir(x.dir, out) : keel_fsync_dir(x.dir);
    if (st != KEEL_OK) { /* leave nothing behind */
        for (int i = 0; i < x.n_files; i++) {
            char *p = keel_path_join(x.dir, x.files[i]);
            unlink(p);
            keel_free(p);
        }
        if (staged) rmdir(x.dir);
    }
    for (int i = 0; i < x.n_files; i++) keel_free(x.files[i]);
    keel_free(x.files);
    keel_free(x.dir);
    keel_free(out);
    return st;
}

typedef struct {
    const keel_model_layout *lay;
    keel_param_source read;
    void *ctx;
    int64_t max_shard_bytes;
    const char *tokenizer_model_path, *tokenizer_file, *gen;
    size_t gen_len;
    int bos, eos;
} export_args;

static keel_status write_model(export_ctx *x, void *arg, int *n_files) {
    const export_args *a = arg;
    return write_export(x, a->lay, a->read, a->ctx, a->max_shard_bytes, a->tokenizer_model_path, a->tokenizer_file,
                        a->gen, a->gen_len, a->bos, a->eos, n_files);
}

keel_status keel_hf_export(const keel_model_config *cfg, keel_param_source read, void *ctx,
                           const char *tokenizer_model_path, const char *generation_config_path,
                           const char *out_dir, int64_t max_shard_bytes) {
    if (max_shard_bytes < 0) {
        keel_errorf("%s: max shard size %lld must be >= 0 (0 = one file)", out_dir,
                    (long long)max_shard_bytes);
        return KEEL_ERR_INPUT;
    }
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    int bos = 1, eos = 2;
    const char *tokenizer_file = "tokenizer.model";
    char *gen = NULL, why[160];
    size_t gen_len = 0;
    keel_status st = KEEL_OK;
    if (generation_config_path) { /* read and checked before anything is written */
        if (keel_read_regular(generation_config_path, MAX_GENERATION_CONFIG_BYTES, &gen, &gen_len, why,
                              sizeof why) != KEEL_OK) {
            keel_errorf("%s: cannot read the generation config: %s", generation_config_path, why);
            st = KEEL_ERR_INPUT;
        } else {
            st = check_generation_config(gen, gen_len, generation_config_path, lay.V, &bos, &eos, NULL, NULL,
                                         "export without it or fix it");
        }
    }
    if (st == KEEL_OK && tokenizer_model_path)
        st = export_tokenizer(tokenizer_model_path, lay.V, &tokenizer_file, &bos, &eos);
    if (st != KEEL_OK) {
        keel_free(gen);
        keel_model_layout_free(&lay);
        return st;
    }

    export_args args = {&lay, read, ctx, max_shard_bytes, tokenizer_model_path, tokenizer_file, gen, gen_len, bos, eos};
    int n_files = 0;
    st = export_dir(out_dir, write_model, &args, &n_files);
    if (st == KEEL_OK)
        keel_log_info("exported %lld parameters to %s (%d safetensors file%s)", (long long)lay.n_params, out_dir,
                      n_files, n_files == 1 ? "" : "s");
    keel_free(gen);
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
    if (!keel_json_int(v, min, INT32_MAX, out)) {
        keel_errorf("%s: \"%s\" must be an integer in [%lld, %d]", path, key, (long long)min, INT32_MAX);
        return false;
    }
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

/* A number the rope_scaling object must have. */
static bool rope_number(const cJSON *r, const char *path, const char *section, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble)) {
        keel_errorf("%s: \"%s\" of type llama3 needs \"%s\" as a positive number", path, section, key);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* rope_scaling (transformers 4) or rope_parameters (5): default RoPE, or
 * Llama 3's scaling (type llama3) into *scaling. */
static bool rope_ok(const cJSON *root, const char *path, double *theta, keel_rope_scaling *scaling) {
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
        if (!type && i == 0) {
            keel_errorf("%s: \"rope_scaling\" has no \"rope_type\"; keel implements default RoPE and llama3",
                        path);
            return false;
        }
        if (type && cJSON_IsString(type) && strcmp(type->valuestring, "llama3") == 0) {
            double original;
            if (!rope_number(r, path, keys[i], "factor", &scaling->factor) ||
                !rope_number(r, path, keys[i], "low_freq_factor", &scaling->low_freq_factor) ||
                !rope_number(r, path, keys[i], "high_freq_factor", &scaling->high_freq_factor) ||
                !rope_number(r, path, keys[i], "original_max_position_embeddings", &original))
                return false;
            if (original != floor(original) || original > (1 << 24)) {
                keel_errorf("%s: \"%s\": original_max_position_embeddings %g is not a whole number of "
                            "positions up to 16777216", path, keys[i], original);
                return false;
            }
            scaling->on = true;
            scaling->type = KEEL_ROPE_SCALING_LLAMA3;
            scaling->original_max_position_embeddings = (int)original;
        } else if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)) {
            keel_errorf("%s: \"%s\" type %s is not supported: keel implements default RoPE and llama3",
                        path, keys[i], cJSON_IsString(type) ? type->valuestring : "(not a string)");
            return false;
        }
        if (!json_double(r, path, "rope_theta", theta)) return false;
    }
    return true;
}

/* The model config.json's root describes (finalized), or one line. */
static keel_status config_from_json(const cJSON *root, const char *path, keel_model_config *out) {
    keel_status st = KEEL_ERR_INPUT;
    int64_t C = 0, F = 0, L = 0, NH = 0, V = 0, NKV = -1, T = 2048, head_dim = -1;
    double eps = 1e-6, theta = 10000.0; /* LlamaConfig's defaults */
    keel_rope_scaling scaling = {.on = false};
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
        !json_double(root, path, "rope_theta", &theta) || !rope_ok(root, path, &theta, &scaling) ||
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
        int64_t hint;
        if (keel_json_int(hm, 1, MAX_FFN_MULTIPLE, &hint) && cJSON_IsNumber(hx) && hx->valuedouble >= 0 &&
            hx->valuedouble <= MAX_FFN_DIM_MULTIPLIER && C <= INT32_MAX) {
            int hint_m = (int)hint;
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
        if (scaling.on) {
            cJSON *rs = cJSON_AddObjectToObject(m, "rope_scaling");
            cJSON_AddStringToObject(rs, "type", "llama3");
            cJSON_AddNumberToObject(rs, "factor", scaling.factor);
            cJSON_AddNumberToObject(rs, "low_freq_factor", scaling.low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", scaling.high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", scaling.original_max_position_embeddings);
        }
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
            if (scaling.on) kc.model.rope_scaling = scaling;
            kc.model.ffn_dim_multiplier = mult;
            KEEL_CHECK(keel_model_ffn_hidden(&kc.model) == F, "ffn size %d != %lld",
                       keel_model_ffn_hidden(&kc.model), (long long)F);
            *out = kc.model;
        }
        keel_config_free(&kc);
    }
done:
    return st;
}

keel_status keel_hf_parse_config(const char *text, size_t len, const char *path, keel_model_config *out) {
    cJSON *root = safetensors_parse_json_object(text, len, path);
    keel_status st = root ? config_from_json(root, path, out) : KEEL_ERR_INPUT;
    cJSON_Delete(root);
    return st;
}

static keel_status import_config(const char *hf_dir, keel_model_config *out) {
    char *path = keel_path_join(hf_dir, "config.json");
    cJSON *root = safetensors_read_json_object(path, "Hugging Face config");
    keel_status st = root ? config_from_json(root, path, out) : KEEL_ERR_INPUT;
    cJSON_Delete(root);
    keel_free(path);
    return st;
}

/* ---- import: safetensors ---------------------------------------------------- */

struct keel_hf_reader {
    safetensors_dir *dir;
    keel_model_layout lay;
    float *scratch;     /* a tensor asked for in part; allocated on first need */
};

keel_status keel_hf_open(const char *hf_dir, keel_model_config *cfg_out, keel_hf_reader **out) {
    keel_model_config cfg;
    *out = NULL;
    keel_status st = import_config(hf_dir, &cfg);
    safetensors_dir *d = NULL;
    if (st == KEEL_OK) st = safetensors_open_dir(hf_dir, &d);
    if (st != KEEL_OK) return st;
    keel_hf_reader *r = keel_xcalloc(sizeof *r, "hf reader");
    r->dir = d;
    keel_model_layout_init(&r->lay, &cfg);
    /* Every tensor there, of a dtype keel reads and its shape, inside its file,
     * before anything is allocated for it or written: a bad file is one line
     * now, never a half-written import. */
    for (int i = 0; i < r->lay.n_tensors && st == KEEL_OK; i++) {
        safetensors_tensor t = hf_tensor(&r->lay.tensors[i]);
        st = safetensors_check(d, &t);
    }
    if (st != KEEL_OK) {
        keel_hf_close(r);
        return st;
    }
    *cfg_out = cfg;
    *out = r;
    return KEEL_OK;
}

void keel_hf_close(keel_hf_reader *r) {
    if (!r) return;
    safetensors_close_dir(r->dir);
    keel_model_layout_free(&r->lay);
    keel_free(r->scratch);
    keel_free(r);
}

keel_status keel_hf_read(void *reader, int64_t begin, int64_t len, float *dst) {
    keel_hf_reader *r = reader;
    const keel_model_layout *lay = &r->lay;
    int i = 0;
    while (i + 1 < lay->n_tensors && lay->tensors[i + 1].offset <= begin) i++;
    keel_status st = KEEL_OK;
    for (int64_t done = 0; done < len && st == KEEL_OK; i++) {
        const keel_tensor_info *ti = &lay->tensors[i];
        int64_t size = ti->rows * ti->cols, from = begin + done - ti->offset;
        int64_t take = size - from < len - done ? size - from : len - done;
        safetensors_tensor t = hf_tensor(ti);
        if (from == 0 && take == size) { /* a whole tensor: straight into dst */
            st = safetensors_read(r->dir, &t, dst + done);
        } else {
            if (!r->scratch) {
                int64_t largest = 0;
                for (int k = 0; k < lay->n_tensors; k++)
                    if (lay->tensors[k].rows * lay->tensors[k].cols > largest)
                        largest = lay->tensors[k].rows * lay->tensors[k].cols;
                r->scratch = keel_try_malloc(sizeof(float) * (size_t)largest);
                if (!r->scratch) {
                    keel_errorf("%s: a tensor of %lld values needs more memory than there is", ti->name,
                                (long long)largest);
                    return KEEL_ERR_INPUT;
                }
            }
            st = safetensors_read(r->dir, &t, r->scratch);
            if (st == KEEL_OK) memcpy(dst + done, r->scratch + from, sizeof(float) * (size_t)take);
        }
        done += take;
    }
    return st;
}

keel_status keel_hf_import(const char *hf_dir, keel_model_config *cfg_out, float **params_out) {
    keel_model_config cfg;
    keel_hf_reader *r;
    keel_status st = keel_hf_open(hf_dir, &cfg, &r);
    if (st != KEEL_OK) return st;
    float *params = keel_try_malloc(sizeof(float) * (size_t)r->lay.n_params);
    if (!params) {
        keel_errorf("%s: its %lld parameters need more memory than there is", hf_dir, (long long)r->lay.n_params);
        keel_hf_close(r);
        return KEEL_ERR_INPUT;
    }
    st = keel_hf_read(r, 0, r->lay.n_params, params);
    if (st == KEEL_OK) {
        *cfg_out = cfg;
        *params_out = params;
    } else {
        keel_free(params);
    }
    keel_hf_close(r);
    return st;
}

/* ---- import: the files carried beside the weights ---------------------------- */

#define MAX_TOKENIZER_BYTES ((size_t)1 << 30) /* as the tokenizer loader's */

/* hf_dir/name into the next slot of c, when it is there: 0 absent, 1 read, -1
 * unreadable (one line naming it and the fix). */
static int read_carried_file(const char *hf_dir, const char *name, size_t max_bytes, keel_hf_carried *c) {
    char *path = keel_path_join(hf_dir, name), why[160];
    int got = 0;
    if (keel_path_exists(path)) {
        keel_hf_file *f = &c->files[c->n_files];
        if (keel_read_regular(path, max_bytes, &f->data, &f->bytes, why, sizeof why) != KEEL_OK) {
            keel_errorf("%s: cannot read it: %s; fix it, or import a copy of %s without it", path, why, hf_dir);
            got = -1;
        } else {
            f->name = name;
            c->n_files++;
            got = 1;
        }
    }
    keel_free(path);
    return got;
}

/* The tokenizer among c's files (file index t, its config at index cfg_i or
 * -1) loads with keel's loader and has no id at or past V; *tokens gets its
 * vocabulary size. */
static keel_status check_carried_tokenizer(const char *hf_dir, const keel_hf_carried *c, int t, int cfg_i, int V,
                                           int *tokens) {
    char *path = keel_path_join(hf_dir, c->files[t].name);
    char *config_path = cfg_i >= 0 ? keel_path_join(hf_dir, c->files[cfg_i].name) : NULL;
    keel_tokenizer *tok;
    keel_error_capture(true);
    keel_status st = keel_tokenizer_load_buffers(c->files[t].data, c->files[t].bytes, path,
                                                 cfg_i >= 0 ? c->files[cfg_i].data : NULL,
                                                 cfg_i >= 0 ? c->files[cfg_i].bytes : 0, config_path, &tok);
    keel_error_capture(false);
    if (st != KEEL_OK) {
        keel_errorf("%s; keel carries only a tokenizer it reads: fix it, or import a copy of %s without it",
                    keel_last_error(), hf_dir);
    } else {
        *tokens = keel_tokenizer_vocab_size(tok);
        keel_tokenizer_free(tok);
        if (*tokens > V) {
            keel_errorf("%s: the tokenizer has %d tokens but config.json's vocab_size is %d (ids past the "
                        "embedding); import the tokenizer of this model, or a copy of %s without it",
                        path, *tokens, V, hf_dir);
            st = KEEL_ERR_INPUT;
        }
    }
    keel_free(config_path);
    keel_free(path);
    return st;
}

keel_status keel_hf_read_carried(const char *hf_dir, const keel_model_config *cfg, keel_hf_carried *out) {
    memset(out, 0, sizeof *out);
    keel_hf_carried c = {0};
    int t = -1, cfg_i = -1, got;
    const char *kinds[2] = {"tokenizer.json", "tokenizer.model"}; /* the first there wins */
    for (int k = 0; k < 2 && t < 0; k++) {
        if ((got = read_carried_file(hf_dir, kinds[k], MAX_TOKENIZER_BYTES, &c)) < 0) goto fail;
        if (got) t = c.n_files - 1;
    }
    if (t >= 0) {
        if ((got = read_carried_file(hf_dir, "tokenizer_config.json", MAX_TOKENIZER_BYTES, &c)) < 0) goto fail;
        if (got) cfg_i = c.n_files - 1;
        if (check_carried_tokenizer(hf_dir, &c, t, cfg_i, cfg->vocab_size, &c.tokenizer_tokens) != KEEL_OK)
            goto fail;
        c.tokenizer = c.files[t].name;
    }
    if ((got = read_carried_file(hf_dir, "generation_config.json", MAX_GENERATION_CONFIG_BYTES, &c)) < 0) goto fail;
    if (got) {
        const keel_hf_file *g = &c.files[c.n_files - 1];
        char *path = keel_path_join(hf_dir, g->name), fix[4200];
        snprintf(fix, sizeof fix, "fix it, or import a copy of %s without it (export then writes one)", hf_dir);
        int bos = -1, eos = -1;
        keel_status st = check_generation_config(g->data, g->bytes, path, cfg->vocab_size, &bos, &eos, NULL, NULL, fix);
        keel_free(path);
        if (st != KEEL_OK) goto fail;
    }
    *out = c;
    return KEEL_OK;
fail:
    keel_hf_carried_free(&c);
    return KEEL_ERR_INPUT;
}

void keel_hf_carried_free(keel_hf_carried *c) {
    for (int i = 0; i < c->n_files; i++) keel_free(c->files[i].data);
    memset(c, 0, sizeof *c);
}

/* ---- export: LoRA adapters as PEFT saves them --------------------------------- */

typedef struct {
    const keel_model_layout *lora;
    keel_param_source read;
    void *ctx;
    const char *base;
} peft_args;

/* adapter_model.safetensors (PEFT's names: "base_model.model." + keel's) and
 * adapter_config.json. */
static keel_status write_peft(export_ctx *x, void *arg, int *n_files) {
    const peft_args *a = arg;
    const keel_model_layout *ll = a->lora;
    const keel_lora_config *lc = &ll->lora;
    int n = ll->n_tensors;
    safetensors_tensor *t = keel_xmalloc(sizeof *t * (size_t)n, "tensor list");
    char(*names)[96] = keel_xmalloc(sizeof *names * (size_t)n, "tensor names");
    int64_t largest = 1;
    for (int i = 0; i < n; i++) {
        const keel_tensor_info *ti = &ll->tensors[i];
        snprintf(names[i], sizeof names[i], "base_model.model.%s", ti->name);
        t[i] = (safetensors_tensor){.name = names[i], .ndim = 2, .shape = {ti->rows, ti->cols}};
        largest = ti->rows * ti->cols > largest ? ti->rows * ti->cols : largest;
    }
    float *buf = keel_xmalloc(sizeof(float) * (size_t)largest, "tensor buffer");
    keel_status st = write_shard(x, "adapter_model.safetensors", ll, t, 0, n, a->read, a->ctx, buf);
    *n_files = 1;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    if (a->base) cJSON_AddStringToObject(c, "base_model_name_or_path", a->base);
    else cJSON_AddNullToObject(c, "base_model_name_or_path");
    cJSON_AddNumberToObject(c, "r", lc->rank);
    cJSON_AddNumberToObject(c, "lora_alpha", lc->alpha);
    cJSON_AddNumberToObject(c, "lora_dropout", lc->dropout);
    cJSON *targets = cJSON_AddArrayToObject(c, "target_modules");
    for (int i = 0; i < KEEL_LORA_TARGETS; i++)
        if (lc->targets & (1u << i)) cJSON_AddItemToArray(targets, cJSON_CreateString(keel_lora_target_name(i)));
    cJSON_AddStringToObject(c, "bias", "none");
    cJSON_AddBoolToObject(c, "fan_in_fan_out", false);
    cJSON_AddBoolToObject(c, "inference_mode", true);
    cJSON_AddBoolToObject(c, "use_rslora", false);
    cJSON_AddBoolToObject(c, "use_dora", false);
    cJSON_AddNullToObject(c, "modules_to_save");
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    if (st == KEEL_OK) st = export_write(x, "adapter_config.json", text, strlen(text));
    free(text);
    keel_free(buf);
    keel_free(names);
    keel_free(t);
    return st;
}

keel_status keel_hf_export_peft(const keel_model_layout *lora, keel_param_source read, void *ctx, const char *base,
                                const char *out_dir) {
    KEEL_CHECK(lora->lora.on, "a PEFT export of an adapter layout");
    peft_args args = {lora, read, ctx, base};
    int n_files;
    keel_status st = export_dir(out_dir, write_peft, &args, &n_files);
    if (st == KEEL_OK)
        keel_log_info("exported %lld adapter parameters to %s (adapter_model.safetensors, adapter_config.json)",
                      (long long)lora->n_params, out_dir);
    return st;
}

/* ---- import: LoRA adapters as PEFT saves them ---------------------------------- */

/* A key of adapter_config.json that keel implements in one way only: absent,
 * null, or `want` (false, "none", an empty list or object). */
static bool peft_only(const cJSON *root, const char *path, const char *key, const char *why) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    bool fine = !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child) ||
                (cJSON_IsString(v) && !strcmp(v->valuestring, "none"));
    if (!fine) keel_errorf("%s: \"%s\" is set, and keel %s; export the adapter without it", path, key, why);
    return fine;
}

keel_status keel_hf_parse_peft_config(const char *text, size_t len, const char *path, keel_lora_config *out) {
    cJSON *root = safetensors_parse_json_object(text, len, path);
    if (!root) return KEEL_ERR_INPUT;
    *out = (keel_lora_config){.on = true};
    keel_status st = KEEL_ERR_INPUT;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(root, "lora_dropout");
    const cJSON *targets = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    int64_t r = 0;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA")) {
        keel_errorf("%s: \"peft_type\" must be \"LORA\": keel imports LoRA adapters only", path);
    } else if (!json_int(root, path, "r", true, 1, &r)) {
    } else if (r > 1 << 16) {
        keel_errorf("%s: \"r\" %lld is larger than keel's largest rank %d", path, (long long)r, 1 << 16);
    } else if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble >= 0) || !(alpha->valuedouble <= 1e6)) {
        keel_errorf("%s: \"lora_alpha\" must be a number in [0, 1e6]", path);
    } else if (drop && !cJSON_IsNull(drop) &&
               (!cJSON_IsNumber(drop) || !(drop->valuedouble >= 0) || !(drop->valuedouble <= 0.99))) {
        keel_errorf("%s: \"lora_dropout\" must be a number in [0, 0.99]", path);
    } else if (!cJSON_IsArray(targets) || !targets->child) {
        keel_errorf("%s: \"target_modules\" must be a list of module names (keel does not match a pattern)", path);
    } else if (peft_only(root, path, "use_dora", "has no DoRA") &&
               peft_only(root, path, "use_rslora", "scales by alpha / r, not alpha / sqrt(r)") &&
               peft_only(root, path, "fan_in_fan_out", "stores A (r, in) and B (out, r)") &&
               peft_only(root, path, "bias", "trains no biases") &&
               peft_only(root, path, "modules_to_save", "trains the adapters alone") &&
               peft_only(root, path, "layers_to_transform", "adapts every layer") &&
               peft_only(root, path, "rank_pattern", "gives every target one rank") &&
               peft_only(root, path, "alpha_pattern", "gives every target one alpha")) {
        st = KEEL_OK;
        const cJSON *t;
        cJSON_ArrayForEach(t, targets) {
            int found = -1;
            for (int i = 0; i < KEEL_LORA_TARGETS && cJSON_IsString(t); i++)
                if (!strcmp(t->valuestring, keel_lora_target_name(i))) found = i;
            if (found < 0) {
                char name[80];
                safetensors_printable(name, sizeof name, cJSON_IsString(t) ? t->valuestring : "(not a string)");
                keel_errorf("%s: target_modules entry %s is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, "
                            "up_proj, down_proj (the matrices keel adapts)", path, name);
                st = KEEL_ERR_INPUT;
                break;
            }
            out->targets |= 1u << found;
        }
        out->rank = (int)r;
        out->alpha = alpha->valuedouble;
        out->dropout = cJSON_IsNumber(drop) ? drop->valuedouble : 0;
    }
    cJSON_Delete(root);
    return st;
}

keel_status keel_hf_read_peft(const char *dir, const keel_model_layout *lora, float *params) {
    safetensors_dir *d;
    keel_status st = safetensors_open_file(dir, "adapter_model.safetensors", &d);
    for (int i = 0; i < lora->n_tensors && st == KEEL_OK; i++) {
        const keel_tensor_info *ti = &lora->tensors[i];
        char name[96];
        snprintf(name, sizeof name, "base_model.model.%s", ti->name);
        safetensors_tensor t = {.name = name, .ndim = 2, .shape = {ti->rows, ti->cols}};
        st = safetensors_read(d, &t, params + ti->offset);
    }
    if (d) safetensors_close_dir(d);
    return st;
}
