/* data/prepare: `keel data prepare` — text files to train/val token shards.
 * The document, BOS/EOS and split rules are stated in keel/data.h. */
#include "keel/data.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_SHARD_TOKENS (64ull << 20)
/* Documents are cut into chunks of about this many tokens (at line ends) so
 * that one huge document cannot swing the val share. */
#define CHUNK_MAX_TOKENS 65536

typedef struct {
    int32_t *v;
    size_t n, cap;
} tokbuf;

static void tokbuf_append(tokbuf *b, const int32_t *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        b->v = keel_xrealloc(b->v, cap * sizeof *b->v, "token buffer");
        b->cap = cap;
    }
    memcpy(b->v + b->n, src, n * sizeof *src);
    b->n += n;
}

/* Tokens of one split, written out as a shard file whenever shard_tokens
 * have gathered. */
typedef struct {
    const char *name; /* "train" or "val" */
    const char *dir;
    uint32_t vocab_size;
    uint64_t shard_tokens;
    tokbuf pending;    /* tokens of the file not yet written */
    uint64_t n_files;  /* files written */
    uint64_t n_tokens; /* tokens appended, written or pending */
} split_writer;

static void shard_path(char *path, size_t size, const char *dir, const char *split,
                       uint64_t index) {
    snprintf(path, size, "%s/" KEEL_SHARD_NAME_FMT, dir, split, index);
}

static keel_status flush_file(split_writer *w) {
    if (w->pending.n == 0) return KEEL_OK;
    char path[PATH_MAX];
    shard_path(path, sizeof path, w->dir, w->name, w->n_files);
    keel_status st = keel_shard_write(path, w->pending.v, w->pending.n, w->vocab_size);
    if (st != KEEL_OK) return st;
    w->n_files++;
    w->pending.n = 0;
    return KEEL_OK;
}

static keel_status split_append(split_writer *w, const int32_t *tokens, size_t n) {
    w->n_tokens += n;
    while (n > 0) {
        size_t room = (size_t)(w->shard_tokens - w->pending.n);
        size_t take = n < room ? n : room;
        tokbuf_append(&w->pending, tokens, take);
        tokens += take;
        n -= take;
        if (w->pending.n == w->shard_tokens) {
            keel_status st = flush_file(w);
            if (st != KEEL_OK) return st;
        }
    }
    return KEEL_OK;
}

/* Remove the files this run wrote (after a failure). */
static void remove_written(const split_writer *w) {
    char path[PATH_MAX];
    for (uint64_t i = 0; i < w->n_files; i++) {
        shard_path(path, sizeof path, w->dir, w->name, i);
        unlink(path);
    }
}

typedef struct {
    const keel_tokenizer *tok;
    int32_t bos_id, eos_id; /* -1 = none */
    double val_fraction;
    split_writer train, val;
    tokbuf chunk;       /* the document-chunk being gathered */
    keel_ids line;      /* ids of one line */
    uint64_t n_documents;
} preparer;

/* Send the gathered chunk to the split that leaves val's share of all tokens
 * so far closest to val_fraction (ties go to train). */
static keel_status end_chunk(preparer *p) {
    if (p->chunk.n == 0) return KEEL_OK;
    double n = (double)p->chunk.n;
    double target = p->val_fraction * ((double)(p->train.n_tokens + p->val.n_tokens) + n);
    double val_now = (double)p->val.n_tokens;
    split_writer *w = fabs(val_now + n - target) < fabs(val_now - target) ? &p->val : &p->train;
    keel_status st = split_append(w, p->chunk.v, p->chunk.n);
    p->chunk.n = 0;
    return st;
}

static keel_status end_document(preparer *p) {
    if (p->eos_id >= 0) tokbuf_append(&p->chunk, &p->eos_id, 1);
    return end_chunk(p);
}

static bool is_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

static keel_status tokenize_file(preparer *p, const char *input) {
    FILE *f = fopen(input, "r");
    if (!f) {
        keel_errorf("cannot read input %s: %s", input, strerror(errno));
        return KEEL_ERR_INPUT;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    bool in_document = false;
    keel_status st = KEEL_OK;
    while (st == KEEL_OK && (got = getline(&line, &line_cap, f)) >= 0) {
        size_t len = (size_t)got;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (is_blank(line, len)) {
            if (in_document) st = end_document(p);
            in_document = false;
            continue;
        }
        if (!in_document) {
            in_document = true;
            p->n_documents++;
            if (p->bos_id >= 0) tokbuf_append(&p->chunk, &p->bos_id, 1);
        }
        st = keel_tokenizer_encode(p->tok, line, len, &p->line);
        if (st != KEEL_OK) break;
        tokbuf_append(&p->chunk, p->line.ids, p->line.n);
        if (p->chunk.n >= CHUNK_MAX_TOKENS) st = end_chunk(p);
    }
    if (st == KEEL_OK && ferror(f)) {
        keel_errorf("cannot read input %s: %s", input, strerror(errno));
        st = KEEL_ERR_IO;
    }
    if (st == KEEL_OK && in_document) st = end_document(p); /* a file ends a document */
    free(line);
    fclose(f);
    return st;
}

/* ---- the output directory ------------------------------------------------- */

/* mkdir -p */
static keel_status make_dirs(const char *dir) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        keel_errorf("--out %s: path too long", dir);
        return KEEL_ERR_INPUT;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            keel_errorf("cannot create --out directory %s: %s", path, strerror(errno));
            return KEEL_ERR_INPUT;
        }
        *p = saved;
        if (saved == '\0') break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        keel_errorf("--out %s exists and is not a directory", dir);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

static bool is_shard_name(const char *name, uint64_t *index, const char **split) {
    static const char *const splits[] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        if (keel_shard_name_parse(name, splits[i], index)) {
            *split = splits[i];
            return true;
        }
    }
    return false;
}

/* Without force: refuse if dir holds any shard. With keep_train/keep_val:
 * remove shards of the old dataset beyond the ones just written. */
static keel_status scan_old_shards(const char *dir, bool remove, uint64_t keep_train,
                                   uint64_t keep_val) {
    DIR *dh = opendir(dir);
    if (!dh) {
        keel_errorf("cannot read --out directory %s: %s", dir, strerror(errno));
        return KEEL_ERR_IO;
    }
    keel_status st = KEEL_OK;
    struct dirent *e;
    uint64_t index;
    const char *split;
    while ((e = readdir(dh)) != NULL) {
        if (!is_shard_name(e->d_name, &index, &split)) continue;
        if (!remove) {
            keel_errorf("--out %s already holds token shards (%s); choose a new directory or "
                        "pass --force to replace them",
                        dir, e->d_name);
            st = KEEL_ERR_INPUT;
            break;
        }
        uint64_t keep = strcmp(split, "train") == 0 ? keep_train : keep_val;
        if (index < keep) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        /* Unlinking the entry readdir just returned is safe: POSIX only leaves
         * it unspecified whether readdir still reports removed entries. */
        if (unlink(path) != 0) {
            keel_errorf("cannot remove old shard %s: %s", path, strerror(errno));
            st = KEEL_ERR_IO;
            break;
        }
    }
    closedir(dh);
    return st;
}

/* ---- the command ---------------------------------------------------------- */

static keel_status check_args(const keel_prepare_args *a) {
    if (!a->model_path) {
        keel_errorf("data prepare: --model (a SentencePiece .model file) is required");
        return KEEL_ERR_INPUT;
    }
    if (!a->out_dir || !a->out_dir[0]) {
        keel_errorf("data prepare: --out DIR is required");
        return KEEL_ERR_INPUT;
    }
    if (a->n_inputs < 1) {
        keel_errorf("data prepare: give at least one text file with --input");
        return KEEL_ERR_INPUT;
    }
    if (!(a->val_fraction >= 0.0 && a->val_fraction < 1.0)) {
        keel_errorf("data prepare: --val-fraction %g is out of range; it must be in [0, 1)",
                    a->val_fraction);
        return KEEL_ERR_INPUT;
    }
    for (int i = 0; i < a->n_inputs; i++) {
        struct stat st;
        if (stat(a->inputs[i], &st) != 0) {
            keel_errorf("data prepare: input %s: %s", a->inputs[i], strerror(errno));
            return KEEL_ERR_INPUT;
        }
        if (S_ISDIR(st.st_mode)) {
            keel_errorf("data prepare: input %s is a directory; give text files", a->inputs[i]);
            return KEEL_ERR_INPUT;
        }
    }
    return KEEL_OK;
}

static void print_split(const split_writer *w) {
    printf("%s: %" PRIu64 " tokens in %" PRIu64 " file%s\n", w->name, w->n_tokens, w->n_files,
           w->n_files == 1 ? "" : "s");
}

static keel_status run(preparer *p, const keel_prepare_args *a) {
    for (int i = 0; i < a->n_inputs; i++) {
        keel_status st = tokenize_file(p, a->inputs[i]);
        if (st != KEEL_OK) return st;
    }
    keel_status st = flush_file(&p->train);
    if (st == KEEL_OK) st = flush_file(&p->val);
    if (st != KEEL_OK) return st;
    if (p->train.n_tokens == 0) {
        if (p->val.n_tokens == 0)
            keel_errorf("data prepare: the inputs hold no text; nothing written");
        else
            keel_errorf("data prepare: all %" PRIu64 " tokens went to val; lower --val-fraction "
                        "or give more documents (blank-line separated)",
                        p->val.n_tokens);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

keel_status keel_data_prepare(const keel_prepare_args *a) {
    keel_status st = check_args(a);
    if (st != KEEL_OK) return st;
    keel_tokenizer *tok;
    st = keel_tokenizer_load(a->model_path, &tok);
    if (st != KEEL_OK) return st;
    st = make_dirs(a->out_dir);
    if (st == KEEL_OK && !a->force) st = scan_old_shards(a->out_dir, false, 0, 0);
    if (st != KEEL_OK) {
        keel_tokenizer_free(tok);
        return st;
    }

    uint64_t shard_tokens = a->shard_tokens ? a->shard_tokens : DEFAULT_SHARD_TOKENS;
    uint32_t vocab_size = (uint32_t)keel_tokenizer_vocab_size(tok);
    preparer p = {
        .tok = tok,
        .bos_id = keel_tokenizer_bos_id(tok),
        .eos_id = keel_tokenizer_eos_id(tok),
        .val_fraction = a->val_fraction,
        .train = {.name = "train", .dir = a->out_dir, .vocab_size = vocab_size,
                  .shard_tokens = shard_tokens},
        .val = {.name = "val", .dir = a->out_dir, .vocab_size = vocab_size,
                .shard_tokens = shard_tokens},
    };
    st = run(&p, a);
    if (st == KEEL_OK && a->force)
        st = scan_old_shards(a->out_dir, true, p.train.n_files, p.val.n_files);
    if (st == KEEL_OK) {
        print_split(&p.train);
        print_split(&p.val);
        printf("total: %" PRIu64 " tokens from %" PRIu64 " documents in %s\n",
               p.train.n_tokens + p.val.n_tokens, p.n_documents, a->out_dir);
        if (a->val_fraction > 0 && p.val.n_tokens == 0)
            keel_log_warn("--val-fraction %g gave no val tokens: the inputs hold too few "
                          "documents (blocks separated by blank lines)",
                          a->val_fraction);
    } else {
        remove_written(&p.train);
        remove_written(&p.val);
    }
    keel_free(p.train.pending.v);
    keel_free(p.val.pending.v);
    keel_free(p.chunk.v);
    keel_ids_free(&p.line);
    keel_tokenizer_free(tok);
    return st;
}
