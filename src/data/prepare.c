/* data/prepare.c: `keel data prepare` — text, JSON Lines and Parquet files to
 * train/val token shards. The document, BOS/EOS and split rules are stated in keel/data.h. */
#include "keel/data.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "data/chat.h"
#include "data/inputs.h"
#include "data/textblocks.h"

#define DEFAULT_SHARD_TOKENS (64ull << 20)
/* Documents are cut into chunks of about this many tokens (at line ends),
 * each hashed for its split on its own, so that one huge document (a novel
 * without blank lines) cannot swing the val share. */
#define CHUNK_MAX_TOKENS 65536

typedef struct {
    int32_t *v;
    uint8_t *flags; /* per token, KEEL_TOKEN_* (a chat mask's 1 is KEEL_TOKEN_TRAIN) */
    size_t n, cap;
} tokbuf;

/* Append n tokens and their flags (NULL: trained on, no document start). */
static void tokbuf_append(tokbuf *b, const int32_t *src, const uint8_t *flags, size_t n) {
    if (n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        b->v = keel_xrealloc(b->v, cap * sizeof *b->v, "token buffer");
        b->flags = keel_xrealloc(b->flags, cap, "token flag buffer");
        b->cap = cap;
    }
    memcpy(b->v + b->n, src, n * sizeof *src);
    if (flags) memcpy(b->flags + b->n, flags, n);
    else memset(b->flags + b->n, KEEL_TOKEN_TRAIN, n);
    b->n += n;
}

/* Tokens of one split, written out as a shard file whenever shard_tokens
 * have gathered. */
typedef struct {
    const char *name; /* "train" or "val" */
    const char *dir;
    uint32_t vocab_size;
    uint64_t shard_tokens;
    uint32_t stored;   /* the bitmaps its files carry (KEEL_SHARD_FLAG_*) */
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
    keel_status st = keel_shard_write(path, w->pending.v, w->pending.flags, w->stored, w->pending.n, w->vocab_size);
    if (st != KEEL_OK) return st;
    w->n_files++;
    w->pending.n = 0;
    return KEEL_OK;
}

static keel_status split_append(split_writer *w, const int32_t *tokens, const uint8_t *flags,
                                size_t n) {
    w->n_tokens += n;
    while (n > 0) {
        size_t room = (size_t)(w->shard_tokens - w->pending.n);
        size_t take = n < room ? n : room;
        tokbuf_append(&w->pending, tokens, flags, take);
        tokens += take;
        flags += take;
        n -= take;
        if (w->pending.n == w->shard_tokens) {
            keel_status st = flush_file(w);
            if (st != KEEL_OK) return st;
        }
    }
    return KEEL_OK;
}

/* Remove the files this run wrote that are still in its staging directory. */
static void remove_written(const split_writer *w) {
    char path[PATH_MAX];
    for (uint64_t i = 0; i < w->n_files; i++) {
        shard_path(path, sizeof path, w->dir, w->name, i);
        unlink(path);
    }
}

/* The state of the serial pass over the encoded lines, in input order. */
typedef struct {
    const keel_tokenizer *tok;
    int32_t bos_id, eos_id; /* -1 = none */
    double val_fraction;
    uint64_t split_seed;
    split_writer train, val;
    tokbuf chunk;          /* the document-chunk being gathered */
    XXH3_state_t *hash;    /* of the chunk's text, seeded with split_seed */
    bool in_document;
    uint64_t n_documents, n_chunks, n_val_chunks;
    uint64_t max_tokens; /* 0: no cap */
    bool capped;         /* max_tokens reached at a document's end: stop reading */
    const chat_template *chat; /* --format chat: records are conversations; else NULL */
    uint64_t n_trained;        /* tokens trained on (chat: whose mask is 1) */
    uint64_t longest;          /* chat: tokens of the longest conversation */
} preparer;

/* A chunk goes to val when its hash, as a fraction of 2^64, is below
 * val_fraction: a coin that depends on the text alone, so neither the order
 * of the inputs nor what came before can bias which documents land in val
 * (filling a token quota sent short documents there). */
static bool chunk_goes_to_val(const preparer *p) {
    uint64_t h = XXH3_64bits_digest(p->hash);
    return (double)(h >> 11) * 0x1.0p-53 < p->val_fraction;
}

static keel_status end_chunk(preparer *p) {
    keel_status st = KEEL_OK;
    if (p->chunk.n > 0) {
        bool val = chunk_goes_to_val(p);
        p->n_chunks++;
        p->n_val_chunks += val;
        for (size_t i = 0; i < p->chunk.n; i++) p->n_trained += p->chunk.flags[i] & KEEL_TOKEN_TRAIN;
        /* each chunk starts a document of its split's stream (what data.document_mask keeps apart) */
        p->chunk.flags[0] |= KEEL_TOKEN_DOC_START;
        st = split_append(val ? &p->val : &p->train, p->chunk.v, p->chunk.flags, p->chunk.n);
    }
    p->chunk.n = 0;
    XXH3_64bits_reset_withSeed(p->hash, p->split_seed);
    return st;
}

static keel_status end_document(preparer *p) {
    p->in_document = false;
    if (p->eos_id >= 0) tokbuf_append(&p->chunk, &p->eos_id, NULL, 1);
    if (p->chat && p->chunk.n > p->longest) p->longest = p->chunk.n;
    keel_status st = end_chunk(p);
    if (p->max_tokens && p->train.n_tokens + p->val.n_tokens >= p->max_tokens) p->capped = true;
    return st;
}

/* One line of the input: a blank line ends a document, any other joins it.
 * A chunk is cut before the line after the one that brought it to
 * CHUNK_MAX_TOKENS, never at the document's end: EOS never makes a chunk of
 * its own. */
static keel_status add_line(preparer *p, const text_block *b, const text_line *l) {
    if (l->blank) return p->in_document ? end_document(p) : KEEL_OK;
    if (!p->in_document) {
        p->in_document = true;
        p->n_documents++;
        if (p->bos_id >= 0) tokbuf_append(&p->chunk, &p->bos_id, NULL, 1);
    } else if (p->chunk.n >= CHUNK_MAX_TOKENS) {
        keel_status st = end_chunk(p);
        if (st != KEEL_OK) return st;
    }
    tokbuf_append(&p->chunk, b->ids + l->first_id, b->mask ? b->mask + l->first_id : NULL, l->n_ids);
    /* The text as the tokenizer saw it, line ends made "\n": a CRLF copy of
     * a document hashes as its LF original. */
    XXH3_64bits_update(p->hash, b->text + l->start, l->len);
    XXH3_64bits_update(p->hash, "\n", 1);
    return KEEL_OK;
}

/* ---- progress on a terminal ------------------------------------------------ */

typedef struct {
    bool on; /* stderr is a terminal */
    double t0_s, last_s;
    uint64_t total_bytes; /* the inputs' size as stored; 0 when a pipe makes it unknown */
    bool shown;           /* a line is on the screen */
} progress;

static void progress_init(progress *pr, const input_list *inputs) {
    *pr = (progress){.on = isatty(STDERR_FILENO) == 1, .t0_s = keel_now_s()};
    pr->last_s = pr->t0_s;
    if (inputs->all_sized) pr->total_bytes = inputs->total_bytes;
}

/* About once a second: documents, MB read of the inputs as stored (so a
 * compressed input counts as read), MB/s and the time left at that pace. */
static void progress_show(progress *pr, uint64_t n_documents, uint64_t raw_bytes) {
    double now = keel_now_s();
    if (!pr->on || now - pr->last_s < 1.0) return;
    pr->last_s = now;
    double mb = (double)raw_bytes / 1e6, rate = mb / (now - pr->t0_s);
    char of[32] = "", eta[48] = "";
    if (pr->total_bytes) {
        snprintf(of, sizeof of, " of %.1f", (double)pr->total_bytes / 1e6);
        if (rate > 0 && raw_bytes <= pr->total_bytes) {
            uint64_t left_s = (uint64_t)(((double)pr->total_bytes / 1e6 - mb) / rate + 0.5);
            snprintf(eta, sizeof eta, ", %" PRIu64 ":%02" PRIu64 ":%02" PRIu64 " left",
                     left_s / 3600, left_s / 60 % 60, left_s % 60);
        }
    }
    fprintf(stderr, "\r\033[Kprepare: %" PRIu64 " documents, %.1f%s MB read, %.1f MB/s%s",
            n_documents, mb, of, rate, eta);
    fflush(stderr);
    pr->shown = true;
}

/* Take the line off the screen before anything else is printed. */
static void progress_clear(progress *pr) {
    if (!pr->shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    pr->shown = false;
}

/* ---- the inputs ------------------------------------------------------------ */

typedef struct {
    uint64_t text_bytes; /* text read (decompressed) */
    textblocks_counts counts;
} input_stats;

/* Every input, in order, through add_line; the end of a file ends a document.
 * With a cap, stops at the end of the document that reaches it. */
static keel_status add_inputs(preparer *p, const keel_prepare_args *a, const input_list *inputs,
                              int threads, input_stats *stats) {
    textblocks *tb;
    textblocks_options opt = {.text_key = a->text_key ? a->text_key : "text",
                              .column = a->column ? a->column : "text",
                              .strict_utf8 = a->strict_utf8};
    keel_status st = textblocks_open(p->tok, inputs->files, inputs->n_files, &opt, threads, &tb);
    if (st != KEEL_OK) return st;
    if (p->chat) textblocks_set_chat(tb, p->chat);
    progress pr;
    progress_init(&pr, inputs);
    const text_block *b;
    while (!p->capped && (st = textblocks_next(tb, &b)) == KEEL_OK && b) {
        for (size_t i = 0; i < b->n_lines && st == KEEL_OK && !p->capped; i++)
            st = add_line(p, b, &b->lines[i]);
        if (st == KEEL_OK && !p->capped && b->ends_input && p->in_document) st = end_document(p);
        if (st != KEEL_OK) break;
        progress_show(&pr, p->n_documents, textblocks_raw_bytes_read(tb));
    }
    progress_clear(&pr);
    if (st != KEEL_OK && textblocks_error(tb)[0]) keel_errorf("%s", textblocks_error(tb));
    stats->text_bytes = textblocks_bytes_read(tb);
    stats->counts = textblocks_counted(tb);
    textblocks_close(tb);
    return st;
}

/* ---- the output directory ------------------------------------------------- */

/* mkdir -p; *created gets the first directory it made ("" if none). */
static keel_status make_dirs(const char *dir, char created[PATH_MAX]) {
    char path[PATH_MAX];
    created[0] = '\0';
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        keel_errorf("--out %s: path too long", dir);
        return KEEL_ERR_INPUT;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0777) == 0) {
            if (!created[0]) snprintf(created, PATH_MAX, "%s", path);
        } else if (errno != EEXIST) {
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

/* Remove the directories make_dirs created (a failed prepare leaves nothing):
 * dir, then its parents up to `created`; rmdir leaves any that are not empty. */
static void remove_created_dirs(const char *dir, const char *created) {
    if (!created[0]) return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = '\0';
    for (;;) {
        rmdir(path);
        char *slash = strrchr(path, '/');
        if (!strcmp(path, created) || !slash || strlen(path) <= strlen(created)) break;
        *slash = '\0';
    }
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

/* The new shards are written into a staging directory inside --out and moved
 * over the old ones only once every one is written: a prepare that fails
 * (an input that cannot be read, a full disk) leaves the dataset that was
 * there as it was, --force or not. */
static keel_status make_stage(const char *out_dir, char *stage, size_t size) {
    snprintf(stage, size, "%s/.keel-prepare-XXXXXX", out_dir);
    if (mkdtemp(stage)) return KEEL_OK;
    keel_errorf("cannot create a staging directory in --out %s: %s", out_dir, strerror(errno));
    stage[0] = '\0';
    return KEEL_ERR_IO;
}

/* Move a split's staged files into out_dir, each over the old file of its name. */
static keel_status publish(const split_writer *w, const char *out_dir) {
    char from[PATH_MAX], to[PATH_MAX];
    for (uint64_t i = 0; i < w->n_files; i++) {
        shard_path(from, sizeof from, w->dir, w->name, i);
        shard_path(to, sizeof to, out_dir, w->name, i);
        if (rename(from, to) != 0) {
            keel_errorf("cannot move %s to %s: %s", from, to, strerror(errno));
            return KEEL_ERR_IO;
        }
    }
    return KEEL_OK;
}

/* ---- the command ---------------------------------------------------------- */

static bool is_chat(const keel_prepare_args *a) { return a->format && strcmp(a->format, "chat") == 0; }

/* --format text (the default) or chat; chat needs its template, text none. */
static keel_status check_format(const keel_prepare_args *a) {
    if (a->format && strcmp(a->format, "text") != 0 && !is_chat(a)) {
        keel_errorf("data prepare: --format '%s' is not a format keel knows; use text (documents) "
                    "or chat (conversations with a loss mask)", a->format);
        return KEEL_ERR_INPUT;
    }
    if (is_chat(a) && !a->chat_template) {
        keel_errorf("data prepare: --format chat needs --chat-template %s: the template of the "
                    "model you fine-tune (Llama 3 Instruct, Llama 2 chat)", CHAT_TEMPLATE_NAMES);
        return KEEL_ERR_INPUT;
    }
    if (!is_chat(a) && a->chat_template) {
        keel_errorf("data prepare: --chat-template applies to conversations; add --format chat");
        return KEEL_ERR_INPUT;
    }
    if (is_chat(a) && a->text_key) {
        keel_errorf("data prepare: --text-key names the text of --format text records; a chat "
                    "record holds its conversation at \"messages\" (drop --text-key)");
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* --format chat reads every input as JSON Lines (a pipe too) but a file its
 * name says is text (.txt, .txt.gz, .txt.zst) or Parquet. */
static keel_status chat_inputs(input_list *inputs) {
    for (size_t i = 0; i < inputs->n_files; i++) {
        prepare_input *f = &inputs->files[i];
        input_format format;
        instream_kind compression;
        if (f->format == INPUT_PARQUET) {
            keel_errorf("data prepare: input %s is Parquet; --format chat reads JSON Lines conversations "
                        "(one {\"messages\": [...]} a line): convert it to .jsonl", f->path);
            return KEEL_ERR_INPUT;
        }
        if (f->format == INPUT_TEXT && input_kind_of(f->path, &format, &compression)) {
            keel_errorf("data prepare: input %s is text (by its name); --format chat reads JSON "
                        "Lines conversations: give .jsonl or .json files (plain, .gz or .zst)",
                        f->path);
            return KEEL_ERR_INPUT;
        }
        f->format = INPUT_JSONL;
    }
    return KEEL_OK;
}

static keel_status check_args(const keel_prepare_args *a) {
    if (!a->model_path) {
        keel_errorf("data prepare: --model (a SentencePiece .model or a Hugging Face tokenizer.json) is required");
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
    if (a->threads < 0 || a->threads > KEEL_PREPARE_MAX_THREADS) {
        keel_errorf("data prepare: --threads %d is out of range; it must be in [1, %d]",
                    a->threads, KEEL_PREPARE_MAX_THREADS);
        return KEEL_ERR_INPUT;
    }
    if (!(a->val_fraction >= 0.0 && a->val_fraction < 1.0)) {
        keel_errorf("data prepare: --val-fraction %g is out of range; it must be in [0, 1)",
                    a->val_fraction);
        return KEEL_ERR_INPUT;
    }
    if (a->text_key && !a->text_key[0]) {
        keel_errorf("data prepare: --text-key is empty; name the JSON key that holds the text");
        return KEEL_ERR_INPUT;
    }
    if (a->column && !a->column[0]) {
        keel_errorf("data prepare: --column is empty; name the Parquet column that holds the text");
        return KEEL_ERR_INPUT;
    }
    return check_format(a);
}

static void print_split(const split_writer *w) {
    printf("%s: %" PRIu64 " tokens in %" PRIu64 " file%s\n", w->name, w->n_tokens, w->n_files,
           w->n_files == 1 ? "" : "s");
}

/* "inputs: 6 files: 4 JSON Lines, 1 Parquet, 1 text; 4 zstd, 1 gzip; 2 other files in
 * directories ignored" */
static void print_inputs(const input_list *inputs) {
    uint64_t n_json = 0, n_parquet = 0, n_gzip = 0, n_zstd = 0, n = inputs->n_files;
    for (size_t i = 0; i < inputs->n_files; i++) {
        n_json += inputs->files[i].format == INPUT_JSONL;
        n_parquet += inputs->files[i].format == INPUT_PARQUET;
        n_gzip += inputs->files[i].compression == INSTREAM_GZIP;
        n_zstd += inputs->files[i].compression == INSTREAM_ZSTD;
    }
    uint64_t n_text = n - n_json - n_parquet;
    printf("inputs: %" PRIu64 " file%s:", n, n == 1 ? "" : "s");
    if (n_json) printf(" %" PRIu64 " JSON Lines%s", n_json, n_parquet || n_text ? "," : "");
    if (n_parquet) printf(" %" PRIu64 " Parquet%s", n_parquet, n_text ? "," : "");
    if (n_text) printf(" %" PRIu64 " text", n_text);
    if (n_zstd) printf("; %" PRIu64 " zstd", n_zstd);
    if (n_gzip) printf("%s %" PRIu64 " gzip", n_zstd ? "," : ";", n_gzip);
    if (inputs->n_ignored)
        printf("; %" PRIu64 " other file%s in directories ignored", inputs->n_ignored,
               inputs->n_ignored == 1 ? "" : "s");
    printf("\n");
}

static void print_summary(const preparer *p, const keel_prepare_args *a, const input_list *inputs,
                          int threads, const input_stats *stats, double seconds) {
    uint64_t text_bytes = stats->text_bytes;
    print_inputs(inputs);
    const textblocks_counts *c = &stats->counts;
    if (c->records)
        printf("records: %" PRIu64 " JSON records, %" PRIu64 " of them empty (skipped)\n", c->records,
               c->empty_records);
    if (c->rows)
        printf("rows: %" PRIu64 " Parquet rows, %" PRIu64 " of them empty and %" PRIu64
               " null (skipped)\n", c->rows, c->empty_rows, c->null_rows);
    if (p->capped)
        printf("cap: --max-tokens %" PRIu64 " reached at the end of a document (%" PRIu64
               " tokens); the rest of the inputs was not read\n",
               p->max_tokens, p->train.n_tokens + p->val.n_tokens);
    print_split(&p->train);
    print_split(&p->val);
    printf("total: %" PRIu64 " tokens from %" PRIu64 " documents in %s\n",
           p->train.n_tokens + p->val.n_tokens, p->n_documents, a->out_dir);
    if (p->chat) {
        uint64_t total = p->train.n_tokens + p->val.n_tokens;
        printf("chat: %" PRIu64 " conversations (--chat-template %s): %" PRIu64 " of %" PRIu64
               " tokens trained on (%.1f%%: the assistant's turns), the longest %" PRIu64 " tokens\n",
               p->n_documents, chat_template_name(p->chat), p->n_trained, total,
               total ? 100.0 * (double)p->n_trained / (double)total : 0.0, p->longest);
    }
    printf("split: %" PRIu64 " of %" PRIu64 " document chunks to val (--val-fraction %g, "
           "--split-seed %" PRIu64 ")\n",
           p->n_val_chunks, p->n_chunks, a->val_fraction, a->split_seed);
    double mb = (double)text_bytes / 1e6;
    printf("text: %.2f MB in %.2f s: %.2f MB/s on %d thread%s\n", mb, seconds,
           seconds > 0 ? mb / seconds : 0.0, threads, threads == 1 ? "" : "s");
    if (a->val_fraction > 0 && p->val.n_tokens == 0)
        keel_log_warn("--val-fraction %g gave no val tokens: the inputs hold too few "
                      "documents (text blocks between blank lines, JSON records or Parquet rows)",
                      a->val_fraction);
}

/* Tokenize every input into the splits and write the last files. */
static keel_status run(preparer *p, const keel_prepare_args *a, const input_list *inputs,
                       int threads, input_stats *stats) {
    keel_status st = add_inputs(p, a, inputs, threads, stats);
    if (st == KEEL_OK) st = flush_file(&p->train);
    if (st == KEEL_OK) st = flush_file(&p->val);
    if (st != KEEL_OK) return st;
    if (p->train.n_tokens == 0) {
        if (p->val.n_tokens == 0)
            keel_errorf("data prepare: the inputs hold no text; nothing written");
        else
            keel_errorf("data prepare: all %" PRIu64 " tokens went to val; lower --val-fraction, "
                        "change --split-seed or give more documents",
                        p->val.n_tokens);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* --threads 0: one thread per online CPU. */
static int resolve_threads(int threads) {
    if (threads > 0) return threads;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 1 ? 1 : cpus > KEEL_PREPARE_MAX_THREADS ? KEEL_PREPARE_MAX_THREADS : (int)cpus;
}

keel_status keel_data_prepare(const keel_prepare_args *a) {
    keel_status st = check_args(a);
    if (st != KEEL_OK) return st;
    input_list inputs;
    st = input_list_resolve(a->inputs, a->n_inputs, &inputs);
    if (st != KEEL_OK) return st;
    if (is_chat(a)) st = chat_inputs(&inputs);
    keel_tokenizer *tok = NULL;
    if (st == KEEL_OK) st = keel_tokenizer_load(a->model_path, &tok);
    chat_template *chat = NULL;
    if (st == KEEL_OK && is_chat(a)) st = chat_template_open(a->chat_template, tok, a->model_path, &chat);
    if (st != KEEL_OK) {
        keel_tokenizer_free(tok);
        input_list_free(&inputs);
        return st;
    }
    char created[PATH_MAX], stage[PATH_MAX] = "";
    st = make_dirs(a->out_dir, created);
    if (st == KEEL_OK && !a->force) st = scan_old_shards(a->out_dir, false, 0, 0);
    if (st == KEEL_OK) st = make_stage(a->out_dir, stage, sizeof stage);
    if (st != KEEL_OK) {
        remove_created_dirs(a->out_dir, created);
        chat_template_free(chat);
        keel_tokenizer_free(tok);
        input_list_free(&inputs);
        return st;
    }

    uint64_t shard_tokens = a->shard_tokens ? a->shard_tokens : DEFAULT_SHARD_TOKENS;
    uint32_t vocab_size = (uint32_t)keel_tokenizer_vocab_size(tok);
    /* every shard says where its documents start; chat's say which tokens train */
    uint32_t stored = KEEL_SHARD_FLAG_DOC_STARTS | (chat ? KEEL_SHARD_FLAG_LOSS_MASK : 0);
    preparer p = {
        .tok = tok,
        /* a chat template writes its own BOS and EOS */
        .bos_id = chat ? -1 : keel_tokenizer_bos_id(tok),
        .eos_id = chat ? -1 : keel_tokenizer_eos_id(tok),
        .val_fraction = a->val_fraction,
        .split_seed = a->split_seed,
        .train = {.name = "train", .dir = stage, .vocab_size = vocab_size,
                  .shard_tokens = shard_tokens, .stored = stored},
        .val = {.name = "val", .dir = stage, .vocab_size = vocab_size,
                .shard_tokens = shard_tokens, .stored = stored},
        .hash = XXH3_createState(),
        .max_tokens = a->max_tokens,
        .chat = chat,
    };
    KEEL_CHECK(p.hash != NULL, "out of memory for the XXH3 state");
    XXH3_64bits_reset_withSeed(p.hash, p.split_seed);
    int threads = resolve_threads(a->threads);
    input_stats stats = {0};
    double t0 = keel_now_s();
    st = run(&p, a, &inputs, threads, &stats);
    double seconds = keel_now_s() - t0;
    if (st == KEEL_OK) st = publish(&p.train, a->out_dir);
    if (st == KEEL_OK) st = publish(&p.val, a->out_dir);
    if (st == KEEL_OK && a->force)
        st = scan_old_shards(a->out_dir, true, p.train.n_files, p.val.n_files);
    remove_written(&p.train); /* what is left in the stage: all of it after a failure */
    remove_written(&p.val);
    rmdir(stage);
    if (st == KEEL_OK) print_summary(&p, a, &inputs, threads, &stats, seconds);
    else remove_created_dirs(a->out_dir, created);
    keel_free(p.train.pending.v);
    keel_free(p.train.pending.flags);
    keel_free(p.val.pending.v);
    keel_free(p.val.pending.flags);
    keel_free(p.chunk.v);
    keel_free(p.chunk.flags);
    chat_template_free(chat);
    XXH3_freeState(p.hash);
    keel_tokenizer_free(tok);
    input_list_free(&inputs);
    return st;
}
