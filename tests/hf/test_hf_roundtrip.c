/* test_hf_roundtrip: keel_hf_export / keel_hf_import.
 *  - random fp32 parameters of a GQA model, untied and tied, round-trip
 *    bit-identically with every config field, as one model.safetensors and
 *    split into several shards + model.safetensors.index.json;
 *  - the files are what transformers expects (config keys, tensor names and
 *    shapes, no lm_head when tied, 8-byte aligned header, index weight_map);
 *  - a config.json without keel's hints still imports to the same shapes;
 *    intermediate_size -> (multiple_of, ffn_dim_multiplier) is exact over a
 *    sweep;
 *  - hand-written F16 and BF16 files (reversed tensor order, unpadded header,
 *    an extra rotary_emb.inv_freq) import to the exact fp32 values;
 *  - the SentencePiece model is copied (with tokenizer_config.json);
 *  - bad inputs are one-line errors naming the file (and tensor): missing
 *    tensor, wrong shape, truncated data or header, unsupported dtype, bad
 *    header JSON, missing shard, bad config.json values, a non-empty export
 *    directory, a tokenizer of another vocabulary.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "keel/hf.h"
#include "keel/model.h"

#include "../testlib.h"

static char root[256];

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rng(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}
static float rng_normal(void) {
    double u1 = (rng() + 1.0) / 4294967297.0, u2 = rng() / 4294967296.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

static const char *path_in(const char *dir, const char *name) {
    static char bufs[16][1024];
    static int next;
    char *p = bufs[next++ % 16];
    snprintf(p, 1024, "%s/%s", dir, name);
    return p;
}

static const char *new_dir(const char *name) {
    static char bufs[16][512];
    static int next;
    char *p = bufs[next++ % 16];
    snprintf(p, 512, "%s/%s", root, name);
    return p;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    if (len) *len = got;
    return s;
}

static void spill(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *s = slurp(from, &n);
    if (!s) abort();
    spill(to, s, n);
    free(s);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static keel_model_config make_cfg(int dim, int layers, int heads, int kv, int vocab, int multiple_of,
                                  double mult, int T, bool tied) {
    keel_config c;
    keel_config_defaults(&c);
    c.model = (keel_model_config){.dim = dim, .n_layers = layers, .n_heads = heads, .n_kv_heads = kv,
                                  .vocab_size = vocab, .multiple_of = multiple_of,
                                  .ffn_dim_multiplier = mult, .norm_eps = 1e-5,
                                  .rope_theta = 500000.0, .max_seq_len = T, .tie_embeddings = tied};
    c.data.synthetic = true;
    if (keel_config_finalize(&c) != KEEL_OK) abort();
    keel_model_config m = c.model;
    keel_config_free(&c);
    return m;
}

static float *random_params(const keel_model_config *cfg, int64_t *n_out) {
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    float *p = malloc(sizeof(float) * (size_t)lay.n_params);
    for (int64_t i = 0; i < lay.n_params; i++) p[i] = 0.3f * rng_normal();
    p[0] = -0.0f, p[1] = 1e-40f, p[2] = 3.4e38f; /* -0, a subnormal, near max */
    *n_out = lay.n_params;
    keel_model_layout_free(&lay);
    return p;
}

static bool cfg_equal(const keel_model_config *a, const keel_model_config *b) {
    return a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->vocab_size == b->vocab_size &&
           a->multiple_of == b->multiple_of && a->ffn_dim_multiplier == b->ffn_dim_multiplier &&
           a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
           a->max_seq_len == b->max_seq_len && a->tie_embeddings == b->tie_embeddings;
}

/* Import dir and expect exactly (cfg, params). */
static void expect_import_equal(const char *what, const char *dir, const keel_model_config *cfg,
                                const float *params, int64_t n) {
    keel_model_config got;
    float *p = NULL;
    keel_status st = keel_hf_import(dir, &got, &p);
    EXPECT(st == KEEL_OK, "%s: import", what);
    if (st != KEEL_OK) return;
    EXPECT(cfg_equal(&got, cfg), "%s: config equal (dim %d L %d NH %d NKV %d V %d mo %d mult %g eps %g "
           "theta %g T %d tied %d)", what, got.dim, got.n_layers, got.n_heads, got.n_kv_heads,
           got.vocab_size, got.multiple_of, got.ffn_dim_multiplier, got.norm_eps, got.rope_theta,
           got.max_seq_len, got.tie_embeddings);
    EXPECT(memcmp(p, params, sizeof(float) * (size_t)n) == 0, "%s: %lld parameters bit-identical",
           what, (long long)n);
    keel_free(p);
}

/* The header of a safetensors file as JSON (NULL if unreadable); *len8 the
 * header length. */
static cJSON *st_header(const char *path, uint64_t *len8) {
    size_t n;
    char *s = slurp(path, &n);
    if (!s || n < 8) {
        free(s);
        return NULL;
    }
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)(uint8_t)s[i] << (8 * i);
    *len8 = h;
    cJSON *j = h <= n - 8 ? cJSON_ParseWithLength(s + 8, h) : NULL;
    free(s);
    return j;
}

/* Run fn-like expression with stderr captured and expect KEEL_ERR_INPUT with a
 * one-line message containing a and b. */
#define EXPECT_ERROR(what, call, a, b)                                                         \
    do {                                                                                       \
        capture_begin();                                                                       \
        keel_status st_ = (call);                                                              \
        const char *msg_ = capture_end();                                                      \
        EXPECT(st_ == KEEL_ERR_INPUT && count_lines(msg_) == 1 && strstr(msg_, (a)) &&         \
                   strstr(msg_, (b)),                                                          \
               "%s: status %d, one line naming '%s' and '%s': %.*s", what, (int)st_, (a), (b), \
               (int)strcspn(msg_, "\n"), msg_);                                              \
    } while (0)

/* ---- hand-written safetensors files ------------------------------------------- */

typedef struct {
    const char *dtype;        /* for every tensor (F32 from p32, F16/BF16 from p16) */
    const float *p32;
    const uint16_t *p16;
    const char *skip;         /* tensor left out */
    const char *bad_shape;    /* tensor whose shape is transposed */
    const char *bad_dtype;    /* tensor written with dtype "F64" (same bytes) */
    bool reverse, extra, pad;
    const char *header_override; /* raw header text instead of the real one */
} st_opts;

static void write_st(const char *path, const keel_model_layout *lay, const st_opts *o) {
    char *h = malloc(1 << 20);
    size_t hn = (size_t)snprintf(h, 1 << 20, "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"hand\"}");
    int esize = strcmp(o->dtype, "F32") ? 2 : 4;
    int64_t off = 0;
    int order[1024];
    int n = 0;
    for (int k = 0; k < lay->n_tensors; k++) {
        int i = o->reverse ? lay->n_tensors - 1 - k : k;
        if (o->skip && !strcmp(o->skip, lay->tensors[i].name)) continue;
        order[n++] = i;
    }
    for (int k = 0; k < n; k++) {
        const keel_tensor_info *t = &lay->tensors[order[k]];
        int64_t bytes = esize * t->rows * t->cols;
        const char *dt = o->bad_dtype && !strcmp(o->bad_dtype, t->name) ? "I16" : o->dtype;
        if (t->cols == 1)
            hn += (size_t)snprintf(h + hn, (1 << 20) - hn, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],",
                                   t->name, dt, (long long)t->rows);
        else if (o->bad_shape && !strcmp(o->bad_shape, t->name))
            hn += (size_t)snprintf(h + hn, (1 << 20) - hn, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],",
                                   t->name, dt, (long long)t->cols, (long long)t->rows);
        else
            hn += (size_t)snprintf(h + hn, (1 << 20) - hn, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],",
                                   t->name, dt, (long long)t->rows, (long long)t->cols);
        hn += (size_t)snprintf(h + hn, (1 << 20) - hn, "\"data_offsets\":[%lld,%lld]}", (long long)off,
                               (long long)(off + bytes));
        off += bytes;
    }
    if (o->extra) {
        hn += (size_t)snprintf(h + hn, (1 << 20) - hn,
                               ",\"model.layers.0.self_attn.rotary_emb.inv_freq\":{\"dtype\":\"F32\","
                               "\"shape\":[2],\"data_offsets\":[%lld,%lld]}",
                               (long long)off, (long long)(off + 8));
        off += 8;
    }
    hn += (size_t)snprintf(h + hn, (1 << 20) - hn, "}");
    while (o->pad && hn % 8) h[hn++] = ' ';
    if (o->header_override) hn = (size_t)snprintf(h, 1 << 20, "%s", o->header_override);
    FILE *f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(h, 1, hn, f);
    for (int k = 0; k < n; k++) {
        const keel_tensor_info *t = &lay->tensors[order[k]];
        size_t cnt = (size_t)(t->rows * t->cols);
        if (esize == 4) fwrite(o->p32 + t->offset, 4, cnt, f);
        else fwrite(o->p16 + t->offset, 2, cnt, f);
    }
    if (o->extra && !o->header_override) {
        float inv[2] = {1.0f, 0.01f};
        fwrite(inv, 4, 2, f);
    }
    fclose(f);
    free(h);
}

/* A directory holding cfg's config.json (from a real export) and nothing else. */
static const char *dir_with_config(const char *name, const char *config_src_dir) {
    const char *d = new_dir(name);
    remove_tree(d);
    mkdir(d, 0755);
    copy_file(path_in(config_src_dir, "config.json"), path_in(d, "config.json"));
    return d;
}

static float f16_decode(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(s ? -v : v);
}

/* ---- tests -------------------------------------------------------------------- */

static void test_roundtrip(const char *name, const keel_model_config *cfg) {
    printf("== round trip: %s\n", name);
    int64_t n;
    float *params = random_params(cfg, &n);
    char dname[64];
    snprintf(dname, sizeof dname, "%s_one", name);
    const char *one = new_dir(dname);
    EXPECT(keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, NULL, one, 0) == KEEL_OK, "%s: export to a new directory", name);
    EXPECT(count_entries(one, "") == 3 && count_entries(root, dname) == 1,
           "%s: exactly config.json + model.safetensors + generation_config.json, no staging directory left", name);
    char *gen = slurp(path_in(one, "generation_config.json"), NULL);
    EXPECT(gen && !strcmp(gen, "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n"),
           "%s: generation_config.json from config.json's BOS/EOS (1, 2): %s", name, gen ? gen : "(none)");
    free(gen);
    expect_import_equal(name, one, cfg, params, n);

    /* The file as transformers reads it. */
    uint64_t hlen = 0;
    cJSON *h = st_header(path_in(one, "model.safetensors"), &hlen);
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    bool names_ok = h && cJSON_GetArraySize(h) == lay.n_tensors + 1 && hlen % 8 == 0;
    const cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
    names_ok &= meta && cJSON_IsString(cJSON_GetObjectItem(meta, "format")) &&
                !strcmp(cJSON_GetObjectItem(meta, "format")->valuestring, "pt");
    for (int i = 0; names_ok && i < lay.n_tensors; i++) {
        const keel_tensor_info *t = &lay.tensors[i];
        const cJSON *e = cJSON_GetObjectItem(h, t->name), *shape = cJSON_GetObjectItem(e, "shape");
        names_ok = e && !strcmp(cJSON_GetObjectItem(e, "dtype")->valuestring, "F32") &&
                   cJSON_GetArraySize(shape) == (t->cols == 1 ? 1 : 2) &&
                   cJSON_GetArrayItem(shape, 0)->valuedouble == (double)t->rows &&
                   (t->cols == 1 || cJSON_GetArrayItem(shape, 1)->valuedouble == (double)t->cols);
    }
    EXPECT(names_ok, "%s: header: %d F32 tensors with HF names and shapes, format pt, %llu bytes (8-aligned)",
           name, lay.n_tensors, (unsigned long long)hlen);
    EXPECT((cJSON_GetObjectItem(h, "lm_head.weight") != NULL) == !cfg->tie_embeddings,
           "%s: lm_head.weight %s", name, cfg->tie_embeddings ? "absent (tied)" : "present");
    cJSON_Delete(h);

    char *text = slurp(path_in(one, "config.json"), NULL);
    cJSON *c = cJSON_Parse(text);
    free(text);
    const char *s_arch = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "architectures"), 0)->valuestring;
    EXPECT(!strcmp(s_arch, "LlamaForCausalLM") &&
               !strcmp(cJSON_GetObjectItem(c, "model_type")->valuestring, "llama") &&
               cJSON_GetObjectItem(c, "intermediate_size")->valueint == lay.F &&
               cJSON_GetObjectItem(c, "num_key_value_heads")->valueint == lay.NKV &&
               cJSON_GetObjectItem(c, "max_position_embeddings")->valueint == cfg->max_seq_len &&
               cJSON_IsTrue(cJSON_GetObjectItem(c, "tie_word_embeddings")) == cfg->tie_embeddings &&
               !strcmp(cJSON_GetObjectItem(c, "torch_dtype")->valuestring, "float32") &&
               !strcmp(cJSON_GetObjectItem(c, "hidden_act")->valuestring, "silu") &&
               cJSON_GetObjectItem(c, "bos_token_id")->valueint == 1 &&
               cJSON_GetObjectItem(c, "eos_token_id")->valueint == 2 &&
               cJSON_GetObjectItem(c, "rope_theta")->valuedouble == cfg->rope_theta &&
               cJSON_GetObjectItem(c, "rms_norm_eps")->valuedouble == cfg->norm_eps,
           "%s: config.json has LlamaForCausalLM's keys (intermediate_size %d)", name, lay.F);

    /* Without keel's hints the shapes (and everything else) still come back. */
    const char *nohint = dir_with_config(strcat(dname, "_nohint"), one);
    cJSON_DeleteItemFromObject(c, "keel_multiple_of");
    cJSON_DeleteItemFromObject(c, "keel_ffn_dim_multiplier");
    text = cJSON_Print(c);
    spill(path_in(nohint, "config.json"), text, strlen(text));
    free(text);
    copy_file(path_in(one, "model.safetensors"), path_in(nohint, "model.safetensors"));
    keel_model_config got;
    float *p = NULL;
    EXPECT(keel_hf_import(nohint, &got, &p) == KEEL_OK && keel_model_ffn_hidden(&got) == lay.F &&
               got.dim == cfg->dim && got.tie_embeddings == cfg->tie_embeddings &&
               memcmp(p, params, sizeof(float) * (size_t)n) == 0,
           "%s: config.json without keel_* keys: intermediate_size %d from multiple_of %d, "
           "ffn_dim_multiplier %g; parameters bit-identical", name, lay.F, got.multiple_of,
           got.ffn_dim_multiplier);
    keel_free(p);
    cJSON_Delete(c);

    /* Split: several shards + index. */
    snprintf(dname, sizeof dname, "%s_split", name);
    const char *split = new_dir(dname);
    int64_t biggest = 0;
    for (int i = 0; i < lay.n_tensors; i++)
        if (lay.tensors[i].rows * lay.tensors[i].cols > biggest) biggest = lay.tensors[i].rows * lay.tensors[i].cols;
    int64_t max_shard = 4 * biggest + 8; /* many files; the embedding fits one by itself */
    EXPECT(keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, NULL, split, max_shard) == KEEL_OK, "%s: split export (%lld bytes max)",
           name, (long long)max_shard);
    int shards = count_entries(split, "model-");
    char first[64];
    snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", shards);
    EXPECT(shards >= 3 && count_entries(split, "model.safetensors.index.json") == 1 &&
               count_entries(split, "model.safetensors") == 1 /* the index only */ &&
               access(path_in(split, first), F_OK) == 0,
           "%s: %d shards named model-0000K-of-%05d + index, no model.safetensors", name, shards, shards);
    text = slurp(path_in(split, "model.safetensors.index.json"), NULL);
    c = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItem(c, "weight_map");
    EXPECT(cJSON_GetArraySize(map) == lay.n_tensors &&
               cJSON_GetObjectItem(cJSON_GetObjectItem(c, "metadata"), "total_size")->valuedouble ==
                   4.0 * (double)lay.n_params,
           "%s: index maps %d tensors, total_size %lld", name, lay.n_tensors, 4 * (long long)lay.n_params);
    cJSON_Delete(c);
    snprintf(dname, sizeof dname, "%s split", name);
    expect_import_equal(dname, split, cfg, params, n);

    /* A shard file gone; then a truncated shard. */
    snprintf(dname, sizeof dname, "%s_split2", name);
    const char *split2 = new_dir(dname);
    keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, NULL, split2, max_shard);
    char second[64];
    snprintf(second, sizeof second, "model-00002-of-%05d.safetensors", shards);
    remove(path_in(split2, second));
    p = (float *)&p;
    EXPECT_ERROR("missing shard", keel_hf_import(split2, &got, &p), second, "cannot open");
    EXPECT(p == (float *)&p, "missing shard: *params_out untouched on error");
    keel_model_layout_free(&lay);
    free(params);
}

static void test_ffn_sweep(void) {
    printf("== intermediate_size -> multiple_of, ffn_dim_multiplier\n");
    int dims[] = {2, 8, 64, 288, 4096};
    int bad = 0, checked = 0, impossible = 0;
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int64_t I = 1; I <= 3000; I += (I < 400 ? 1 : 7)) {
            int m;
            double x;
            if (!keel_hf_ffn_params(dims[d], I, &m, &x)) {
                impossible++;
                continue;
            }
            keel_model_config c = {.dim = dims[d], .multiple_of = m, .ffn_dim_multiplier = x};
            checked++;
            bad += keel_model_ffn_hidden(&c) != I || m < 1 || m > (1 << 20) || x < 0 || x > 64;
        }
    EXPECT(bad == 0, "%d sizes reproduced exactly, %d wrong, %d not expressible", checked, bad, impossible);
    struct { int dim; int64_t I; int mo; } real[] = {
        {4096, 11008, 256}, /* Llama 2 7B */
        {5120, 13824, 256}, /* Llama 2 13B */
        {8192, 28672, 0},   /* Llama 2 70B, Llama 3 70B */
        {4096, 14336, 0},   /* Llama 3 8B */
        {2048, 5632, 256},  /* TinyLlama */
        {288, 768, 256},    /* keel's default dims */
    };
    for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
        int m = 0;
        double x = -1;
        bool ok = keel_hf_ffn_params(real[i].dim, real[i].I, &m, &x);
        keel_model_config c = {.dim = real[i].dim, .multiple_of = m, .ffn_dim_multiplier = x};
        EXPECT(ok && keel_model_ffn_hidden(&c) == real[i].I && (real[i].mo == 0 || m == real[i].mo),
               "dim %d intermediate %lld: multiple_of %d ffn_dim_multiplier %g", real[i].dim,
               (long long)real[i].I, m, x);
    }
}

static void test_half_precision(const keel_model_config *cfg, const char *src_dir) {
    printf("== F16 and BF16 files (%s)\n", cfg->tie_embeddings ? "tied" : "untied");
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    uint16_t *bits = malloc(sizeof(uint16_t) * (size_t)lay.n_params);
    float *want = malloc(sizeof(float) * (size_t)lay.n_params);
    for (int pass = 0; pass < 2; pass++) {
        bool bf16 = pass == 1;
        for (int64_t i = 0; i < lay.n_params; i++) {
            uint16_t b;
            do b = (uint16_t)rng();
            while (bf16 ? ((b & 0x7f80) == 0x7f80) : ((b & 0x7c00) == 0x7c00)); /* finite only */
            bits[i] = b;
        }
        if (!bf16) bits[0] = 0x0001, bits[1] = 0x8000, bits[2] = 0x7bff, bits[3] = 0x03ff; /* subnormals, max */
        for (int64_t i = 0; i < lay.n_params; i++)
            want[i] = bf16 ? keel_bf16_to_float(bits[i]) : f16_decode(bits[i]);
        const char *d = dir_with_config(bf16 ? "bf16" : "f16", src_dir);
        st_opts o = {.dtype = bf16 ? "BF16" : "F16", .p16 = bits, .reverse = true, .extra = true};
        write_st(path_in(d, "model.safetensors"), &lay, &o);
        expect_import_equal(bf16 ? "BF16 file (reversed order, unpadded, extra inv_freq)"
                                 : "F16 file (reversed order, unpadded, extra inv_freq, subnormals)",
                            d, cfg, want, lay.n_params);
    }
    free(bits);
    free(want);
    keel_model_layout_free(&lay);
}

static void test_bad_weights(const keel_model_config *cfg, const char *src_dir) {
    printf("== bad safetensors files\n");
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    int64_t n;
    float *params = random_params(cfg, &n);
    keel_model_config got;
    float *p = NULL;
    const char *d = dir_with_config("bad", src_dir);
    const char *file = path_in(d, "model.safetensors");
    st_opts o = {.dtype = "F32", .p32 = params, .pad = true};

    o.skip = "model.layers.1.mlp.up_proj.weight";
    write_st(file, &lay, &o);
    EXPECT_ERROR("missing tensor", keel_hf_import(d, &got, &p), file, "missing tensor model.layers.1.mlp.up_proj.weight");
    o.skip = NULL;

    o.bad_shape = "model.layers.0.self_attn.k_proj.weight";
    write_st(file, &lay, &o);
    EXPECT_ERROR("wrong shape", keel_hf_import(d, &got, &p), "model.layers.0.self_attn.k_proj.weight has shape", file);
    o.bad_shape = NULL;

    o.bad_dtype = "model.norm.weight";
    write_st(file, &lay, &o);
    EXPECT_ERROR("unsupported dtype", keel_hf_import(d, &got, &p), "model.norm.weight has unsupported dtype I16", file);
    o.bad_dtype = NULL;

    o.header_override = "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", ";
    write_st(file, &lay, &o);
    EXPECT_ERROR("bad header JSON", keel_hf_import(d, &got, &p), "bad safetensors header", file);
    o.header_override = NULL;

    o.header_override = "{\"model.embed_tokens.weight\": {\"dtype\": \"F32\", \"shape\": [2]}}";
    write_st(file, &lay, &o);
    EXPECT_ERROR("header entry without data_offsets", keel_hf_import(d, &got, &p), "bad safetensors header", file);
    o.header_override = NULL;

    /* Truncations of a good file: in the data, in the header, in the length. */
    write_st(file, &lay, &o);
    size_t len;
    char *good = slurp(file, &len);
    spill(file, good, len - 5);
    const char *last = lay.tensors[lay.n_tensors - 1].name;
    EXPECT_ERROR("truncated data", keel_hf_import(d, &got, &p), "truncated", last);
    spill(file, good, 100);
    EXPECT_ERROR("truncated header", keel_hf_import(d, &got, &p), "truncated", file);
    spill(file, good, 5);
    EXPECT_ERROR("truncated length", keel_hf_import(d, &got, &p), "truncated", file);
    spill(file, "\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
    EXPECT_ERROR("absurd header length", keel_hf_import(d, &got, &p), "bad safetensors header", file);
    spill(file, good, len);
    remove(file);
    EXPECT_ERROR("no weights at all", keel_hf_import(d, &got, &p), "no model.safetensors", d);
    spill(path_in(d, "model.safetensors.index.json"), "{\"metadata\": {}, \"weight_map\": {}}", 34);
    EXPECT_ERROR("index without the tensor", keel_hf_import(d, &got, &p), "model.safetensors.index.json",
                 "missing tensor model.embed_tokens.weight");
    const char *evil = "{\"weight_map\": {\"model.embed_tokens.weight\": \"../x.safetensors\"}}";
    spill(path_in(d, "model.safetensors.index.json"), evil, strlen(evil));
    EXPECT_ERROR("index naming another directory", keel_hf_import(d, &got, &p), "model.safetensors.index.json",
                 "file name in the same directory");
    free(good);
    free(params);
    keel_model_layout_free(&lay);
}

/* config.json with one key changed (value is JSON text; NULL deletes it). */
static void expect_bad_config(const char *what, const char *src_dir, const char *key, const char *value,
                              const char *want) {
    const char *d = dir_with_config("badcfg", src_dir);
    copy_file(path_in(src_dir, "model.safetensors"), path_in(d, "model.safetensors"));
    char *text = slurp(path_in(d, "config.json"), NULL);
    cJSON *c = cJSON_Parse(text);
    free(text);
    cJSON_DeleteItemFromObject(c, key);
    if (value) cJSON_AddItemToObject(c, key, cJSON_Parse(value));
    text = cJSON_Print(c);
    spill(path_in(d, "config.json"), text, strlen(text));
    free(text);
    cJSON_Delete(c);
    keel_model_config got;
    float *p = NULL;
    EXPECT_ERROR(what, keel_hf_import(d, &got, &p), path_in(d, "config.json"), want);
}

static void test_bad_config(const char *src_dir) {
    printf("== bad config.json\n");
    expect_bad_config("model_type mistral", src_dir, "model_type", "\"mistral\"", "mistral");
    expect_bad_config("no hidden_size", src_dir, "hidden_size", NULL, "hidden_size");
    expect_bad_config("hidden_size a string", src_dir, "hidden_size", "\"64\"", "hidden_size");
    expect_bad_config("heads not dividing", src_dir, "num_attention_heads", "5", "num_attention_heads");
    expect_bad_config("kv heads not dividing", src_dir, "num_key_value_heads", "3", "n_kv_heads");
    expect_bad_config("gelu", src_dir, "hidden_act", "\"gelu\"", "hidden_act gelu");
    expect_bad_config("rope scaling", src_dir, "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8}",
                      "llama3");
    expect_bad_config("rope_parameters yarn", src_dir, "rope_parameters", "{\"rope_type\": \"yarn\"}", "yarn");
    expect_bad_config("attention bias", src_dir, "attention_bias", "true", "attention_bias");
    expect_bad_config("head_dim", src_dir, "head_dim", "32", "head_dim 32");
    expect_bad_config("impossible intermediate_size", src_dir, "intermediate_size", "2000000000",
                      "intermediate_size 2000000000");
    expect_bad_config("max_position_embeddings huge", src_dir, "max_position_embeddings", "100000000",
                      "max_seq_len");
    const char *d = new_dir("nothing");
    mkdir(d, 0755);
    keel_model_config got;
    float *p = NULL;
    EXPECT_ERROR("no config.json", keel_hf_import(d, &got, &p), path_in(d, "config.json"), "cannot open");
    spill(path_in(d, "config.json"), "{\"model_type\": \"llama\",", 24);
    EXPECT_ERROR("config.json not JSON", keel_hf_import(d, &got, &p), path_in(d, "config.json"), "invalid JSON");
}

/* ---- tokenizer ------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;
static void put(buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}
static void put_varint(buf *b, uint64_t v) {
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(b, &c, 1);
    } while (v);
}
static void put_uint(buf *b, uint32_t field, uint64_t v) { put_varint(b, (uint64_t)field << 3), put_varint(b, v); }
static void put_bytes(buf *b, uint32_t field, const void *data, size_t n) {
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, data, n);
}
static void put_msg(buf *b, uint32_t field, buf *m) {
    put_bytes(b, field, m->p, m->n);
    free(m->p);
    *m = (buf){0};
}
static void put_piece(buf *b, const char *s, float score, int type) {
    buf p = {0};
    put_bytes(&p, 1, s, strlen(s));
    uint32_t bits;
    memcpy(&bits, &score, 4);
    put_varint(&p, 2 << 3 | 5);
    put(&p, &bits, 4);
    if (type != 1) put_uint(&p, 3, (uint64_t)type);
    put_msg(b, 1, &p);
}

/* A BPE SentencePiece model of `vocab` pieces: <unk>, <s>, </s>, then "p3".. */
static void write_tokenizer(const char *path, int vocab) {
    buf m = {0}, t = {0}, ns = {0};
    put_uint(&t, 3, 2); /* BPE */
    put_msg(&m, 2, &t);
    put_bytes(&ns, 1, "identity", 8);
    put_msg(&m, 3, &ns);
    put_piece(&m, "<unk>", 0, 2);
    put_piece(&m, "<s>", 0, 3);
    put_piece(&m, "</s>", 0, 3);
    for (int i = 3; i < vocab; i++) {
        char s[16];
        snprintf(s, sizeof s, "p%d", i);
        put_piece(&m, s, (float)-i, 1);
    }
    spill(path, m.p, m.n);
    free(m.p);
}

static void test_tokenizer_and_dirs(const keel_model_config *cfg) {
    printf("== tokenizer copy, export directories\n");
    int64_t n;
    float *params = random_params(cfg, &n);
    const char *tok = new_dir("tok.model");
    write_tokenizer(tok, cfg->vocab_size);
    const char *d = new_dir("with_tok");
    mkdir(d, 0755); /* an existing empty directory is fine */
    EXPECT(keel_hf_export(cfg, keel_params_from_buffer, (void *)params, tok, NULL, d, 0) == KEEL_OK, "export with tokenizer into an empty directory");
    size_t a, b;
    char *orig = slurp(tok, &a), *copy = slurp(path_in(d, "tokenizer.model"), &b);
    EXPECT(copy && a == b && memcmp(orig, copy, a) == 0, "tokenizer.model copied byte for byte (%zu bytes)", a);
    free(orig);
    free(copy);
    char *tc = slurp(path_in(d, "tokenizer_config.json"), NULL);
    cJSON *j = tc ? cJSON_Parse(tc) : NULL;
    EXPECT(j && !strcmp(cJSON_GetObjectItem(j, "tokenizer_class")->valuestring, "LlamaTokenizer"),
           "tokenizer_config.json: tokenizer_class LlamaTokenizer");
    cJSON_Delete(j);
    free(tc);
    EXPECT(count_entries(d, "") == 5, "5 files: config.json, model.safetensors, tokenizer.model, "
           "tokenizer_config.json, generation_config.json (no tmp files)");
    expect_import_equal("with tokenizer", d, cfg, params, n);

    EXPECT_ERROR("export into a non-empty directory", keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, NULL, d, 0), d, "not empty");
    const char *f = path_in(d, "config.json");
    EXPECT_ERROR("export onto a file", keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, NULL, f, 0), f, "not a directory");
    const char *tok2 = new_dir("tok2.model");
    write_tokenizer(tok2, cfg->vocab_size + 1);
    const char *d2 = new_dir("tok_mismatch");
    EXPECT_ERROR("tokenizer of another vocabulary", keel_hf_export(cfg, keel_params_from_buffer, (void *)params, tok2, NULL, d2, 0), tok2,
                 "vocab_size");
    EXPECT(count_entries(root, "tok_mismatch") == 0, "nothing created after a failed export");

    /* A tokenizer smaller than the vocabulary is a padded embedding: exported. */
    const char *tok3 = new_dir("tok3.model");
    write_tokenizer(tok3, cfg->vocab_size - 2);
    const char *d3 = new_dir("tok_padded");
    capture_begin();
    keel_status st = keel_hf_export(cfg, keel_params_from_buffer, (void *)params, tok3, NULL, d3, 0);
    const char *warned = capture_end();
    EXPECT(st == KEEL_OK && count_entries(d3, "tokenizer.model") == 1 && strstr(warned, "padding"),
           "a tokenizer of vocab_size - 2 pieces: exported, with a warning: %s", warned);

    /* generation_config.json given: copied byte for byte; without a tokenizer its ids go into config.json. */
    const char *gen = new_dir("generation_config.json");
    static const char gen_text[] = "{\n  \"bos_token_id\": 7,\n  \"eos_token_id\": [8, 9],\n  \"do_sample\": true,\n"
                                   "  \"temperature\": 0.6\n}\n";
    spill(gen, gen_text, sizeof gen_text - 1);
    const char *d4 = new_dir("with_gen");
    EXPECT(keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, gen, d4, 0) == KEEL_OK,
           "export with a generation_config.json");
    char *copy4 = slurp(path_in(d4, "generation_config.json"), NULL), *cfg4 = slurp(path_in(d4, "config.json"), NULL);
    cJSON *j4 = cfg4 ? cJSON_Parse(cfg4) : NULL;
    EXPECT(copy4 && !strcmp(copy4, gen_text), "generation_config.json copied byte for byte");
    EXPECT(j4 && cJSON_GetObjectItem(j4, "bos_token_id")->valuedouble == 7 &&
               cJSON_GetObjectItem(j4, "eos_token_id")->valuedouble == 2,
           "config.json: its bos_token_id (7); its eos_token_id, a list, leaves the default (2)");
    cJSON_Delete(j4);
    free(copy4);
    free(cfg4);
    static const char *bad_gen[][2] = {{"{\"bos_token_id\": 1", "not a JSON object"},
                                       {"[1, 2]", "not a JSON object"},
                                       {"{\"eos_token_id\": 1000}", "token ids below vocab_size"},
                                       {"{\"eos_token_id\": [1, -1]}", "token ids below vocab_size"},
                                       {"{\"pad_token_id\": \"x\"}", "token ids below vocab_size"}};
    for (size_t i = 0; i < sizeof bad_gen / sizeof bad_gen[0]; i++) {
        spill(gen, bad_gen[i][0], strlen(bad_gen[i][0]));
        const char *d5 = new_dir("bad_gen");
        EXPECT_ERROR(bad_gen[i][0], keel_hf_export(cfg, keel_params_from_buffer, (void *)params, NULL, gen, d5, 0),
                     gen, bad_gen[i][1]);
        EXPECT(count_entries(root, "bad_gen") == 0, "nothing created after a refused generation_config.json");
    }
    free(params);
}

/* The streaming paths: the reader serves any range (inside a tensor, across
 * tensors) as the whole import has it; an export whose source fails midway
 * leaves nothing behind and says why once. */
typedef struct {
    const float *params;
    int64_t fail_at; /* a read touching this parameter fails */
} failing_source;

static keel_status read_failing(void *ctx, int64_t begin, int64_t len, float *dst) {
    failing_source *f = ctx;
    if (f->fail_at >= begin && f->fail_at < begin + len) {
        keel_errorf("source: parameter %lld is unreadable", (long long)f->fail_at);
        return KEEL_ERR_IO;
    }
    memcpy(dst, f->params + begin, sizeof(float) * (size_t)len);
    return KEEL_OK;
}

static void test_streaming(const keel_model_config *cfg, const char *dir) {
    printf("== streaming\n");
    keel_model_config got;
    float *whole;
    EXPECT(keel_hf_import(dir, &got, &whole) == KEEL_OK, "whole import");
    keel_hf_reader *r;
    EXPECT(keel_hf_open(dir, &got, &r) == KEEL_OK, "open a reader");
    keel_model_layout lay;
    keel_model_layout_init(&lay, cfg);
    float *part = keel_xmalloc(sizeof(float) * (size_t)lay.n_params, "part");
    int64_t t1 = lay.tensors[1].offset, t3 = lay.tensors[3].offset;
    int64_t ranges[][2] = {{t1 + 5, 7}, {t1 + 3, t3 - t1 + 9}, {0, lay.n_params}, {lay.n_params - 1, 1}};
    bool same = true;
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        same &= keel_hf_read(r, ranges[i][0], ranges[i][1], part) == KEEL_OK &&
                !memcmp(part, whole + ranges[i][0], sizeof(float) * (size_t)ranges[i][1]);
    }
    EXPECT(same, "ranges inside one tensor, across tensors, all, the last: as the whole import has them");
    keel_hf_close(r);
    failing_source src = {whole, t3 + 1};
    const char *out = path_in(root, "failing_export");
    capture_begin();
    keel_status st = keel_hf_export(cfg, read_failing, &src, NULL, NULL, out, 0);
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_IO && count_lines(err) == 1 && strstr(err, "unreadable") && count_entries(root, "failing_export") == 0,
           "a source failing midway: one line (%s), nothing left behind", err);
    keel_free(part);
    keel_free(whole);
    keel_model_layout_free(&lay);
}

int main(void) {
    keel_log_set_level(KEEL_LOG_WARN);
    if (!temp_dir_create(root, sizeof root, "hf")) return 1;
    keel_model_config untied = make_cfg(32, 2, 4, 2, 50, 16, 1.3, 16, false);
    keel_model_config tied = make_cfg(48, 3, 6, 3, 70, 32, 0, 24, true);
    test_roundtrip("untied_gqa", &untied);
    test_roundtrip("tied_gqa", &tied);
    test_ffn_sweep();
    char ref[512], ref_tied[512];
    snprintf(ref, sizeof ref, "%s", new_dir("untied_gqa_one"));
    snprintf(ref_tied, sizeof ref_tied, "%s", new_dir("tied_gqa_one"));
    test_half_precision(&untied, ref);
    test_half_precision(&tied, ref_tied);
    test_bad_weights(&untied, ref);
    test_bad_config(ref);
    test_tokenizer_and_dirs(&untied);
    test_streaming(&untied, ref);
    remove_tree(root);
    return test_summary("test_hf_roundtrip");
}
