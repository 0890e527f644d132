/* data/dataset.c: a split of token shards (or the synthetic source) served in
 * the world-size-independent global sample order of DESIGN §4.
 *
 * The shards of a split form one logical token stream; sample i is tokens
 * [i*T, i*T + T + 1) of it, so n_samples = (n_tokens - 1) / T. Global position
 * g (= step*G + first + j) maps to epoch e = g / n_samples and sample
 * perm_e[g % n_samples], where perm_e is a Fisher–Yates shuffle drawn from
 * xoshiro256** seeded by (seed, e). Nothing depends on how [0, G) is split
 * into ranks or micro-batches, so a resume on any world size continues the
 * same stream. A mixture (data.sources) maps g to a source and one of its
 * sample numbers (data/mixture.h) and reads that source's split in its own
 * order, seeded by (seed, source). */
#include "keel/data.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "data/mixture.h"
#include "data/rng.h"

#define SYNTHETIC_DEFAULT_BRANCHING 4
#define SYNTHETIC_MAX_DEFAULT_VOCAB 64

struct keel_data {
    int seq_len;   /* T */
    uint64_t seed; /* shuffle seed */
    bool synthetic;

    /* token shards */
    char *path;             /* directory or file, for messages */
    keel_shard **shards;    /* (n_shards) */
    uint64_t *shard_start;  /* (n_shards + 1) first stream position of each shard */
    int n_shards;
    uint64_t n_tokens;
    uint64_t n_samples;
    uint64_t *perm;         /* (n_samples) order of epoch perm_epoch; NULL until first use */
    uint64_t perm_epoch;

    /* synthetic source */
    int syn_vocab;          /* tokens in [0, syn_vocab) */
    int syn_branching;      /* successors per token */
    uint64_t syn_stream;    /* seed of the sample stream (split and shuffle seed mixed in) */
    int32_t *successors;    /* (syn_vocab, syn_branching) */

    /* a mixture (data.sources) */
    keel_data **sources;    /* (n_sources) each source's split, in its own order */
    double *weights;        /* (n_sources) as configured */
    int n_sources;
    keel_mixture *mix;
};

/* ---- sample order --------------------------------------------------------- */

/* Make d->perm the permutation of `epoch`. Positions only move forward in a
 * run, so caching one epoch costs one shuffle per epoch. */
static void ensure_perm(keel_data *d, uint64_t epoch) {
    if (d->perm && d->perm_epoch == epoch) return;
    if (!d->perm) d->perm = keel_xmalloc(d->n_samples * sizeof *d->perm, "sample permutation");
    xoshiro256 rng;
    xoshiro_seed(&rng, hash2(d->seed, epoch));
    for (uint64_t i = 0; i < d->n_samples; i++) d->perm[i] = i;
    for (uint64_t i = d->n_samples - 1; i > 0; i--) {
        uint64_t j = xoshiro_below(&rng, i + 1);
        uint64_t tmp = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = tmp;
    }
    d->perm_epoch = epoch;
}

/* Copy stream tokens [first, first + n), which may span shard files, into
 * out (unless NULL) and their KEEL_TOKEN_* flags into flags (unless NULL). */
static void read_stream(const keel_data *d, uint64_t first, uint64_t n, int32_t *out, uint8_t *flags) {
    /* Last shard whose start is <= first. */
    int lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->shard_start[mid] <= first) lo = mid;
        else hi = mid - 1;
    }
    for (int s = lo; n > 0; s++) {
        KEEL_CHECK(s < d->n_shards, "stream read past the end");
        uint64_t offset = first - d->shard_start[s];
        uint64_t avail = d->shard_start[s + 1] - first;
        uint64_t take = n < avail ? n : avail;
        if (out) keel_shard_read(d->shards[s], offset, take, out), out += take;
        if (flags) keel_shard_read_flags(d->shards[s], offset, take, flags), flags += take;
        first += take;
        n -= take;
    }
}

/* One synthetic sample: a walk on a random graph where every token has
 * syn_branching successors, so the best possible loss is ln(branching). */
static void synthetic_sample(const keel_data *d, uint64_t g, int32_t *out) {
    uint64_t vocab = (uint64_t)d->syn_vocab, branching = (uint64_t)d->syn_branching;
    int32_t token = (int32_t)(hash3(d->syn_stream, g, 0) % vocab);
    out[0] = token;
    for (int pos = 1; pos <= d->seq_len; pos++) {
        uint64_t choice = hash3(d->syn_stream, g, (uint64_t)pos) % branching;
        token = d->successors[(uint64_t)token * branching + choice];
        out[pos] = token;
    }
}

/* Row g of d's order: its seq_len + 1 tokens into out (unless NULL) and their
 * flags into flags (unless NULL). */
static void fetch_row(keel_data *d, uint64_t g, int32_t *out, uint8_t *flags) {
    size_t row = (size_t)d->seq_len + 1;
    if (d->mix) {
        int s;
        uint64_t sample;
        keel_mixture_locate(d->mix, g, &s, &sample);
        fetch_row(d->sources[s], sample, out, flags);
    } else if (d->synthetic) {
        if (out) synthetic_sample(d, g, out);
        if (flags) memset(flags, KEEL_TOKEN_TRAIN, row);
    } else {
        ensure_perm(d, g / d->n_samples);
        read_stream(d, d->perm[g % d->n_samples] * (uint64_t)d->seq_len, row, out, flags);
    }
}

void keel_data_fetch(keel_data *d, uint64_t step, uint64_t global_batch, uint64_t first, int n,
                     int32_t *out, uint8_t *flags) {
    KEEL_CHECK(n >= 0 && first + (uint64_t)n <= global_batch,
               "fetch [%" PRIu64 ", +%d) outside the global batch of %" PRIu64, first, n,
               global_batch);
    size_t row = (size_t)d->seq_len + 1;
    for (int j = 0; j < n; j++)
        fetch_row(d, step * global_batch + first + (uint64_t)j, out + (size_t)j * row,
                  flags ? flags + (size_t)j * row : NULL);
}

uint64_t keel_data_targets_in(const uint8_t *flags, int rows, int seq_len) {
    uint64_t n = 0;
    for (int j = 0; j < rows; j++)
        for (int t = 1; t <= seq_len; t++) n += (flags[(size_t)j * (seq_len + 1) + t] & KEEL_TOKEN_TRAIN) != 0;
    return n;
}

uint64_t keel_data_step_targets(keel_data *d, uint64_t step, uint64_t global_batch) {
    uint64_t T = (uint64_t)d->seq_len;
    if (!keel_data_has_mask(d)) return global_batch * T;
    uint8_t *flags = keel_xmalloc(T + 1, "a sample's token flags");
    uint64_t n = 0;
    for (uint64_t g = step * global_batch; g < (step + 1) * global_batch; g++) {
        fetch_row(d, g, NULL, flags);
        n += keel_data_targets_in(flags, 1, (int)T);
    }
    keel_free(flags);
    return n;
}

int keel_data_n_sources(const keel_data *d) { return d->n_sources; }
const char *keel_data_source_path(const keel_data *d, int i) { return d->sources[i]->path; }
double keel_data_source_weight(const keel_data *d, int i) { return d->weights[i]; }

void keel_data_count_sources(keel_data *d, uint64_t step, uint64_t global_batch, uint64_t *rows) {
    for (uint64_t g = step * global_batch; g < (step + 1) * global_batch; g++) {
        int s;
        uint64_t sample;
        keel_mixture_locate(d->mix, g, &s, &sample);
        rows[s]++;
    }
}

bool keel_data_has_mask(const keel_data *d) {
    for (int i = 0; i < d->n_sources; i++)
        if (keel_data_has_mask(d->sources[i])) return true;
    for (int i = 0; i < d->n_shards; i++)
        if (keel_shard_stored(d->shards[i]) & KEEL_SHARD_FLAG_LOSS_MASK) return true;
    return false;
}

bool keel_data_has_doc_starts(const keel_data *d) {
    if (d->synthetic) return false;
    for (int i = 0; i < d->n_sources; i++)
        if (!keel_data_has_doc_starts(d->sources[i])) return false;
    for (int i = 0; i < d->n_shards; i++)
        if (!(keel_shard_stored(d->shards[i]) & KEEL_SHARD_FLAG_DOC_STARTS)) return false;
    return true;
}

uint64_t keel_data_n_samples(const keel_data *d) {
    return d->synthetic || d->mix ? UINT64_MAX : d->n_samples;
}

void keel_data_close(keel_data *d) {
    if (!d) return;
    for (int i = 0; i < d->n_sources; i++) keel_data_close(d->sources[i]);
    keel_free(d->sources);
    keel_free(d->weights);
    keel_mixture_free(d->mix);
    for (int i = 0; i < d->n_shards; i++) keel_shard_close(d->shards[i]);
    keel_free(d->shards);
    keel_free(d->shard_start);
    keel_free(d->perm);
    keel_free(d->successors);
    keel_free(d->path);
    keel_free(d);
}

/* ---- opening token shards ------------------------------------------------- */

/* Count `split`'s shards in dir and check they are numbered 0..count-1.
 * Returns KEEL_OK with *count = 0 if there are none. */
static keel_status count_split_files(const char *dir, const char *split, int *count) {
    *count = 0;
    DIR *dh = opendir(dir);
    if (!dh) {
        keel_errorf("cannot read data directory %s: %s", dir, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    uint64_t n = 0, max_index = 0, index;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        if (!keel_shard_name_parse(e->d_name, split, &index)) continue;
        n++;
        if (index > max_index) max_index = index;
    }
    closedir(dh);
    if (n == 0) return KEEL_OK;
    if (n > INT_MAX) {
        keel_errorf("%s holds %" PRIu64 " %s shards, more than keel can open", dir, n, split);
        return KEEL_ERR_INPUT;
    }
    if (max_index + 1 != n) {
        /* Name the first missing file: a gap means a lost or half-copied dataset. */
        char path[PATH_MAX];
        struct stat st;
        for (uint64_t i = 0; i <= max_index; i++) {
            snprintf(path, sizeof path, "%s/" KEEL_SHARD_NAME_FMT, dir, split, i);
            if (stat(path, &st) != 0) break;
        }
        keel_errorf("%s is missing (the %s shards of %s must be numbered 0, 1, ... without "
                    "gaps); re-run `keel data prepare`",
                    path, split, dir);
        return KEEL_ERR_INPUT;
    }
    *count = (int)n;
    return KEEL_OK;
}

/* Open the shard files of d (paths already decided) and check that they agree
 * with each other and with the model. */
static keel_status open_shards(keel_data *d, char **paths, const char *split, int vocab_size) {
    d->shards = keel_xcalloc((size_t)d->n_shards * sizeof *d->shards, "shard list");
    d->shard_start = keel_xcalloc(((size_t)d->n_shards + 1) * sizeof *d->shard_start,
                                  "shard offsets");
    for (int i = 0; i < d->n_shards; i++) {
        keel_status st = keel_shard_open(paths[i], &d->shards[i]);
        if (st != KEEL_OK) return st;
        uint32_t v = keel_shard_vocab_size(d->shards[i]), v0 = keel_shard_vocab_size(d->shards[0]);
        if (v != v0) {
            keel_errorf("%s has vocab_size %" PRIu32 " but %s has %" PRIu32 "; all shards of a "
                        "dataset must come from one tokenizer (re-run `keel data prepare`)",
                        paths[i], v, paths[0], v0);
            return KEEL_ERR_INPUT;
        }
        d->shard_start[i + 1] = d->shard_start[i] + keel_shard_n_tokens(d->shards[i]);
    }
    d->n_tokens = d->shard_start[d->n_shards];
    uint32_t data_vocab = keel_shard_vocab_size(d->shards[0]);
    if (data_vocab != (uint32_t)vocab_size) {
        keel_errorf("%s: the token shards have vocab_size %" PRIu32 " but model.vocab_size is "
                    "%d; set model.vocab_size to %" PRIu32 " or prepare the data with the "
                    "model's tokenizer",
                    d->path, data_vocab, vocab_size, data_vocab);
        return KEEL_ERR_INPUT;
    }
    if (d->n_tokens < (uint64_t)d->seq_len + 1) {
        keel_errorf("%s: the %s split has %" PRIu64 " tokens, fewer than one sample needs "
                    "(model.max_seq_len + 1 = %d); add data or shorten model.max_seq_len",
                    d->path, split, d->n_tokens, d->seq_len + 1);
        return KEEL_ERR_INPUT;
    }
    d->n_samples = (d->n_tokens - 1) / (uint64_t)d->seq_len;
    return KEEL_OK;
}

keel_status keel_data_open_path(const char *path, const char *split, int seq_len, int vocab_size,
                                uint64_t seed, keel_data **out) {
    KEEL_CHECK(strcmp(split, "train") == 0 || strcmp(split, "val") == 0, "split '%s'", split);
    KEEL_CHECK(seq_len >= 1 && vocab_size >= 1, "seq_len %d, vocab_size %d", seq_len, vocab_size);
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        keel_errorf("data path %s: %s; create it with `keel data prepare`", path,
                    strerror(errno));
        return KEEL_ERR_INPUT;
    }
    bool is_dir = S_ISDIR(st.st_mode);
    int n_files = 1;
    if (is_dir) {
        keel_status status = count_split_files(path, split, &n_files);
        if (status != KEEL_OK) return status;
        if (n_files == 0 && strcmp(split, "train") == 0) {
            keel_errorf("%s holds no train-*.bin token shards; create them with "
                        "`keel data prepare --out %s`",
                        path, path);
            return KEEL_ERR_INPUT;
        }
    } else if (strcmp(split, "train") != 0) {
        n_files = 0; /* a single file is the train split only */
    }
    if (n_files == 0) return KEEL_OK; /* no val split */

    char **paths = keel_xcalloc((size_t)n_files * sizeof *paths, "shard paths");
    for (int i = 0; i < n_files; i++) {
        if (!is_dir) {
            paths[i] = keel_xstrdup(path);
            continue;
        }
        size_t bytes = strlen(path) + strlen(split) + 32;
        paths[i] = keel_xmalloc(bytes, "shard path");
        snprintf(paths[i], bytes, "%s/" KEEL_SHARD_NAME_FMT, path, split, (uint64_t)i);
    }
    keel_data *d = keel_xcalloc(sizeof *d, "keel_data");
    d->seq_len = seq_len;
    d->seed = seed;
    d->path = keel_xstrdup(path);
    d->n_shards = n_files;
    keel_status status = open_shards(d, paths, split, vocab_size);
    for (int i = 0; i < n_files; i++) keel_free(paths[i]);
    keel_free(paths);
    if (status != KEEL_OK) {
        keel_data_close(d);
        return status;
    }
    keel_log_debug("data %s (%s): %" PRIu64 " tokens in %d files, %" PRIu64 " samples of %d",
                   path, split, d->n_tokens, d->n_shards, d->n_samples, seq_len);
    *out = d;
    return KEEL_OK;
}

/* ---- the synthetic source ------------------------------------------------- */

/* Successor table: row t lists `branching` distinct tokens drawn by hashing
 * (seed, t, attempt), so the chain is fixed by the seed alone. */
static int32_t *build_successors(uint64_t seed, int vocab, int branching) {
    int32_t *table = keel_xmalloc((size_t)vocab * (size_t)branching * sizeof *table,
                                  "synthetic successor table");
    for (int t = 0; t < vocab; t++) {
        int32_t *row = table + (size_t)t * (size_t)branching;
        uint64_t attempt = 0;
        for (int j = 0; j < branching;) {
            int32_t candidate = (int32_t)(hash3(seed, (uint64_t)t, attempt++) % (uint64_t)vocab);
            bool seen = false;
            for (int k = 0; k < j && !seen; k++) seen = row[k] == candidate;
            if (!seen) row[j++] = candidate;
        }
    }
    return table;
}

static keel_status open_synthetic(const keel_data_config *cfg, const char *split, int seq_len,
                                  int vocab_size, uint64_t seed, keel_data **out) {
    int vocab = cfg->synthetic_vocab > 0 ? cfg->synthetic_vocab
                : vocab_size < SYNTHETIC_MAX_DEFAULT_VOCAB ? vocab_size
                                                           : SYNTHETIC_MAX_DEFAULT_VOCAB;
    int branching = cfg->synthetic_branching > 0 ? cfg->synthetic_branching
                                                 : SYNTHETIC_DEFAULT_BRANCHING;
    if (vocab > vocab_size) {
        keel_errorf("data.synthetic.vocab = %d exceeds model.vocab_size = %d; lower it or set "
                    "it to 0 (= min(model.vocab_size, %d))",
                    vocab, vocab_size, SYNTHETIC_MAX_DEFAULT_VOCAB);
        return KEEL_ERR_INPUT;
    }
    if (branching > vocab) {
        keel_errorf("data.synthetic.branching = %d exceeds the %d tokens the synthetic source "
                    "uses; lower it or raise data.synthetic.vocab",
                    branching, vocab);
        return KEEL_ERR_INPUT;
    }
    keel_data *d = keel_xcalloc(sizeof *d, "keel_data");
    d->synthetic = true;
    d->seq_len = seq_len;
    d->seed = seed;
    d->syn_vocab = vocab;
    d->syn_branching = branching;
    /* The chain (which tokens follow which) comes from data.synthetic.seed;
     * the walks through it from the shuffle seed and the split, so val walks
     * differ from train walks on the same chain. */
    d->syn_stream = hash3(cfg->synthetic_seed, seed, strcmp(split, "val") == 0 ? 2 : 1);
    d->successors = build_successors(cfg->synthetic_seed, vocab, branching);
    *out = d;
    return KEEL_OK;
}

/* ---- a mixture of datasets ------------------------------------------------ */

/* Each source's split (train, or val: the sources that have one, with their
 * weights), seeded by (seed, source index), under one mixture order. */
static keel_status open_mixture(const keel_data_sources *list, const char *split, int seq_len, int vocab_size,
                                uint64_t seed, keel_data **out) {
    keel_data *d = keel_xcalloc(sizeof *d, "keel_data");
    d->seq_len = seq_len;
    d->seed = seed;
    d->path = keel_xstrdup("data.sources");
    d->sources = keel_xcalloc(sizeof *d->sources * (size_t)list->n, "data sources");
    d->weights = keel_xcalloc(sizeof *d->weights * (size_t)list->n, "data source weights");
    const char **names = keel_xcalloc(sizeof *names * (size_t)list->n, "data source names");
    keel_status st = KEEL_OK;
    for (int i = 0; i < list->n && st == KEEL_OK; i++) {
        keel_data *src = NULL;
        st = keel_data_open_path(list->v[i].path, split, seq_len, vocab_size, hash2(seed, (uint64_t)i + 1), &src);
        if (st == KEEL_OK && src) { /* its errors name its path; a source without a val split skips validation */
            d->sources[d->n_sources] = src;
            d->weights[d->n_sources] = list->v[i].weight;
            names[d->n_sources++] = list->v[i].path;
        }
    }
    if (st == KEEL_OK && d->n_sources == 0 && strcmp(split, "val") == 0) { /* no val split anywhere */
        keel_free(names);
        keel_data_close(d);
        return KEEL_OK;
    }
    if (st == KEEL_OK) st = keel_mixture_new(d->weights, d->n_sources, hash2(seed, 0), names, &d->mix);
    keel_free(names);
    if (st != KEEL_OK) {
        keel_data_close(d);
        return st;
    }
    *out = d;
    return KEEL_OK;
}

/* ---- opening from the config ---------------------------------------------- */

static keel_status check_tokenizer(const char *tokenizer_path, int vocab_size) {
    keel_tokenizer *tok;
    keel_status st = keel_tokenizer_load(tokenizer_path, &tok);
    if (st != KEEL_OK) return st;
    int tok_vocab = keel_tokenizer_vocab_size(tok);
    keel_tokenizer_free(tok);
    /* A tokenizer smaller than the embedding is a padded vocabulary (transformers'
     * resize_token_embeddings leaves one, and `keel ckpt import` takes one); a larger one
     * has ids the model has no row for. */
    if (tok_vocab > vocab_size) {
        keel_errorf("data.tokenizer %s has %d tokens but model.vocab_size is %d; set "
                    "model.vocab_size to %d or use the model's tokenizer",
                    tokenizer_path, tok_vocab, vocab_size, tok_vocab);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

keel_status keel_data_open(const keel_data_config *cfg, const char *split, int seq_len,
                           int vocab_size, uint64_t seed, keel_data **out) {
    KEEL_CHECK(strcmp(split, "train") == 0 || strcmp(split, "val") == 0, "split '%s'", split);
    KEEL_CHECK(seq_len >= 1 && vocab_size >= 1, "seq_len %d, vocab_size %d", seq_len, vocab_size);
    *out = NULL;
    if (cfg->tokenizer) {
        keel_status st = check_tokenizer(cfg->tokenizer, vocab_size);
        if (st != KEEL_OK) return st;
    }
    /* data.path wins over the synthetic source (as in the config docs). */
    if (cfg->path) return keel_data_open_path(cfg->path, split, seq_len, vocab_size, seed, out);
    if (cfg->sources.n) return open_mixture(&cfg->sources, split, seq_len, vocab_size, seed, out);
    if (cfg->synthetic) return open_synthetic(cfg, split, seq_len, vocab_size, seed, out);
    keel_errorf("no training data: set data.path (from `keel data prepare`), data.sources or data.synthetic");
    return KEEL_ERR_INPUT;
}
