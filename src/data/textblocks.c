/* data/textblocks.c: input text read in blocks of whole lines, encoded on a pool
 * of threads, handed back in input order (see textblocks.h). */
#include "data/textblocks.h"

#include "data/chat.h"
#include "data/jsonl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A block is read until it holds this many bytes, then cut after its last
 * line end: enough text that handing a block to a thread costs nothing next
 * to encoding it (~40 ms at 6 MB/s), small enough that a few megabytes of
 * corpus still make blocks for every thread. */
#define BLOCK_BYTES (256u << 10)
/* Blocks read ahead per encoding thread, so a thread finds work while the
 * caller writes out the oldest block. */
#define SLOTS_PER_THREAD 2

/* Bytes of a slot's error line: a file, a line number and what is wrong. */
#define ERROR_BYTES 1280

typedef struct {
    const prepare_input *input; /* the file of the block */
    uint64_t first_line;        /* JSON Lines: the number of the block's first line in it */
    char *text;                 /* the block as read (decompressed) */
    size_t text_len, text_cap;
    char *doc;                  /* JSON Lines: the records' texts, which the lines point into */
    size_t doc_len, doc_cap;
    text_line *lines;
    size_t n_lines, lines_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    uint8_t *mask; /* chat: per id */
    size_t mask_cap;
    keel_ids scratch; /* one line's ids */
    chat_doc chat;    /* chat: one record's conversation */
    uint64_t n_records, n_empty_records;
    bool ends_input;
    bool encoded;            /* under mu */
    keel_status read_status; /* of reading the block: it is not encoded */
    keel_status status;      /* of reading and encoding */
    char error[ERROR_BYTES]; /* the line saying why, when status is not KEEL_OK */
} slot;

struct textblocks {
    const keel_tokenizer *tok;
    const prepare_input *inputs;
    size_t n_inputs;
    const char *text_key;
    const chat_template *chat; /* NULL: records hold text */

    /* Reading: only the caller's thread. */
    size_t input; /* the file being read, n_inputs when all are read (or reading failed) */
    instream *in;
    char *carry; /* a partial line read after the last complete one */
    size_t carry_len, carry_cap;
    uint64_t line_no;    /* JSON Lines: the number of the carried line */
    bool json_start;     /* JSON Lines: nothing but whitespace read yet */
    bool bom_pending;    /* JSON Lines: the file's first bytes not yet looked at */
    uint64_t raw_bytes_done; /* of the files read to their end */
    /* Of the blocks handed out: only the caller's thread. */
    uint64_t bytes_handed, records_handed, empty_records_handed;
    text_block view;
    bool handed;       /* view is out with the caller */
    const char *error; /* textblocks_error */

    /* Block seq lives in slots[seq % n_slots]. read_seq blocks have been read,
     * encode_seq of them claimed for encoding, out_seq handed to the caller
     * (the last one of those is still in use until the next call). */
    slot *slots;
    int n_slots;
    uint64_t read_seq, encode_seq, out_seq;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* a block was read, or stop */
    pthread_cond_t done_cv; /* a block was encoded */
    bool stop;
    pthread_t *workers;
    int n_workers;
};

/* p (of *cap elements of elem bytes) with room for need elements. */
static void *grow(void *p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return p;
    size_t cap2 = *cap ? *cap : 4096;
    while (cap2 < need) cap2 *= 2;
    *cap = cap2;
    return keel_xrealloc(p, cap2 * elem, what);
}

static bool is_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

static text_line *new_line(slot *s) {
    s->lines = grow(s->lines, &s->lines_cap, s->n_lines + 1, sizeof *s->lines, "text lines");
    return &s->lines[s->n_lines++];
}

/* The line text[start, end) (its "\r"s at the end cut off), encoded; a blank
 * line is kept, not encoded, where it ends a document (keep_blank), else left
 * out. */
static keel_status add_line(const keel_tokenizer *tok, slot *s, const char *text, size_t start,
                            size_t end, bool keep_blank) {
    size_t len = end - start;
    while (len > 0 && text[start + len - 1] == '\r') len--;
    bool blank = is_blank(text + start, len);
    if (blank && !keep_blank) return KEEL_OK;
    text_line *l = new_line(s);
    *l = (text_line){.start = start, .len = len, .first_id = s->n_ids, .blank = blank};
    if (blank) return KEEL_OK;
    keel_status st = keel_tokenizer_encode(tok, text + start, len, &s->scratch);
    if (st != KEEL_OK) return st;
    s->ids = grow(s->ids, &s->ids_cap, s->n_ids + s->scratch.n + 1, sizeof *s->ids, "line ids");
    memcpy(s->ids + s->n_ids, s->scratch.ids, s->scratch.n * sizeof *s->ids);
    s->n_ids += s->scratch.n;
    l->n_ids = s->scratch.n;
    return KEEL_OK;
}

/* Call add_line on each line of text[from, to) (a final line without "\n"
 * counts, as for getline). */
static keel_status add_lines(const keel_tokenizer *tok, slot *s, const char *text, size_t from,
                             size_t to, bool keep_blank) {
    size_t pos = from;
    while (pos < to) {
        const char *nl = memchr(text + pos, '\n', to - pos);
        size_t end = nl ? (size_t)(nl - text) : to;
        keel_status st = add_line(tok, s, text, pos, end, keep_blank);
        if (st != KEEL_OK) return st;
        pos = end + 1;
    }
    return KEEL_OK;
}

/* One record's text as a document: its lines (blank ones left out), then a
 * blank line that ends it; an empty record gives no lines. */
static keel_status add_record(const keel_tokenizer *tok, slot *s, const char *text, size_t len) {
    size_t start = s->doc_len, lines_before = s->n_lines;
    s->doc = grow(s->doc, &s->doc_cap, s->doc_len + len + 1, 1, "record texts");
    memcpy(s->doc + start, text, len);
    s->doc_len += len;
    s->n_records++;
    keel_status st = add_lines(tok, s, s->doc, start, s->doc_len, false);
    if (st != KEEL_OK) return st;
    if (s->n_lines == lines_before) {
        s->n_empty_records++;
        return KEEL_OK;
    }
    *new_line(s) = (text_line){.start = s->doc_len, .first_id = s->n_ids, .blank = true};
    return KEEL_OK;
}

/* A chat record: its conversation rendered and encoded (chat.h) as one line
 * whose ids carry the mask, then the blank line that ends its document. */
static keel_status add_chat_record(const textblocks *tb, slot *s, const char *line, size_t len,
                                   char *why, size_t why_n) {
    bool is_record;
    keel_status st = chat_record_encode(tb->chat, line, len, &s->chat, &is_record, why, why_n);
    if (st != KEEL_OK || !is_record) return st;
    const chat_doc *d = &s->chat;
    s->n_records++;
    size_t start = s->doc_len;
    s->doc = grow(s->doc, &s->doc_cap, s->doc_len + d->text_len + 1, 1, "record texts");
    memcpy(s->doc + start, d->text, d->text_len);
    s->doc_len += d->text_len;
    s->ids = grow(s->ids, &s->ids_cap, s->n_ids + d->ids.n + 1, sizeof *s->ids, "line ids");
    s->mask = grow(s->mask, &s->mask_cap, s->n_ids + d->ids.n + 1, 1, "loss mask");
    memcpy(s->ids + s->n_ids, d->ids.ids, d->ids.n * sizeof *s->ids);
    memcpy(s->mask + s->n_ids, d->mask, d->ids.n);
    *new_line(s) = (text_line){.start = start, .len = d->text_len, .first_id = s->n_ids, .n_ids = d->ids.n};
    s->n_ids += d->ids.n;
    *new_line(s) = (text_line){.start = s->doc_len, .first_id = s->n_ids, .blank = true};
    return KEEL_OK;
}

/* Each line of a JSON Lines block through jsonl_record_text and add_record
 * (or add_chat_record). */
static keel_status encode_records(const textblocks *tb, slot *s) {
    size_t pos = 0;
    uint64_t line_no = s->first_line;
    char why[ERROR_BYTES - 256];
    while (pos < s->text_len) {
        const char *nl = memchr(s->text + pos, '\n', s->text_len - pos);
        size_t end = nl ? (size_t)(nl - s->text) : s->text_len;
        bool is_record = false;
        char *text = NULL;
        size_t len;
        why[0] = '\0';
        keel_status st = tb->chat ? add_chat_record(tb, s, s->text + pos, end - pos, why, sizeof why)
                                  : jsonl_record_text(s->text + pos, end - pos, tb->text_key,
                                                      &is_record, &text, &len, why, sizeof why);
        if (st != KEEL_OK) {
            if (why[0]) /* else the tokenizer printed why */
                snprintf(s->error, sizeof s->error, "data prepare: %s:%" PRIu64 ": %s",
                         s->input->path, line_no, why);
            return st;
        }
        if (is_record) {
            st = add_record(tb->tok, s, text, len);
            keel_free(text);
            if (st != KEEL_OK) return st;
        }
        pos = end + 1;
        line_no++;
    }
    return KEEL_OK;
}

/* Split a slot's text into lines and encode each. Runs on any thread;
 * touches only the slot. */
static keel_status encode_block(const textblocks *tb, slot *s) {
    s->n_lines = 0;
    s->n_ids = 0;
    s->doc_len = 0;
    s->n_records = s->n_empty_records = 0;
    if (s->read_status != KEEL_OK) return s->read_status;
    if (s->input->format == INPUT_JSONL) return encode_records(tb, s);
    return add_lines(tb->tok, s, s->text, 0, s->text_len, true);
}

/* ---- reading (the caller's thread) ---------------------------------------- */

static keel_status open_next_input(textblocks *tb, slot *s) {
    const prepare_input *f = &tb->inputs[tb->input];
    /* a file, or a pipe (--input <(zcat corpus.gz)); never a device */
    char why[256];
    if (instream_open_file(f->path, f->compression, &tb->in, why, sizeof why) != KEEL_OK) {
        snprintf(s->error, sizeof s->error,
                 "data prepare: cannot read input %s: %s; give text or JSON Lines files (plain, "
                 ".gz or .zst)",
                 f->path, why);
        return KEEL_ERR_INPUT;
    }
    tb->line_no = 1;
    tb->json_start = tb->bom_pending = f->format == INPUT_JSONL;
    return KEEL_OK;
}

/* Read into s until it holds want bytes or the file ends (*eof). */
static keel_status fill(textblocks *tb, slot *s, size_t want, bool *eof) {
    *eof = false;
    s->text = grow(s->text, &s->text_cap, want, 1, "text block");
    while (s->text_len < want) {
        char why[512];
        size_t got;
        keel_status st = instream_read(tb->in, s->text + s->text_len, want - s->text_len, &got,
                                       why, sizeof why);
        if (st != KEEL_OK) {
            const char *path = s->input->path;
            if (st == KEEL_ERR_IO)
                snprintf(s->error, sizeof s->error, "data prepare: cannot read input %s: %s", path,
                         why);
            else
                snprintf(s->error, sizeof s->error, "data prepare: input %s is %s", path, why);
            return st;
        }
        if (got == 0) {
            *eof = true;
            break;
        }
        s->text_len += got;
    }
    return KEEL_OK;
}

/* A JSON Lines file's start: a UTF-8 byte order mark is dropped, and a file
 * whose first byte that is not whitespace is '[' (a JSON array) refused. */
static keel_status check_json_start(textblocks *tb, slot *s) {
    if (tb->bom_pending && s->text_len >= 3 && !memcmp(s->text, "\xef\xbb\xbf", 3)) {
        memmove(s->text, s->text + 3, s->text_len - 3);
        s->text_len -= 3;
    }
    tb->bom_pending = false;
    size_t i = 0;
    while (i < s->text_len && (s->text[i] == ' ' || s->text[i] == '\t' || s->text[i] == '\r' ||
                               s->text[i] == '\n'))
        i++;
    if (i == s->text_len) return KEEL_OK; /* only whitespace so far */
    tb->json_start = false;
    if (s->text[i] != '[') return KEEL_OK;
    snprintf(s->error, sizeof s->error,
             "data prepare: input %s holds a JSON array; keel reads JSON Lines, one object per "
             "line: write it as such (jq -c '.[]' FILE > FILE.jsonl)",
             s->input->path);
    return KEEL_ERR_INPUT;
}

static uint64_t count_lines(const char *text, size_t len) {
    uint64_t n = 0;
    for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p))); p++) n++;
    return n;
}

/* Read the next block of the current input into s: the carried partial line,
 * then text up to BLOCK_BYTES, cut after the last "\n" (a longer line makes a
 * bigger block; a JSON Lines record of JSONL_MAX_RECORD_BYTES or more is
 * refused before it is read whole).
 * At the end of the file the rest is the block, ends_input. The cuts depend
 * only on the text, never on the slot or the thread count. An error's line
 * goes to s->error. */
static keel_status read_block(textblocks *tb, slot *s) {
    s->input = &tb->inputs[tb->input];
    s->error[0] = '\0';
    s->text_len = 0;
    s->ends_input = false;
    if (!tb->in) {
        keel_status st = open_next_input(tb, s);
        if (st != KEEL_OK) return st;
    }
    bool json = s->input->format == INPUT_JSONL;
    s->first_line = tb->line_no;
    s->text = grow(s->text, &s->text_cap, tb->carry_len + 1, 1, "text block");
    if (tb->carry_len > 0) memcpy(s->text, tb->carry, tb->carry_len);
    s->text_len = tb->carry_len;
    tb->carry_len = 0;
    size_t want = BLOCK_BYTES;
    for (;;) {
        bool eof;
        keel_status st = fill(tb, s, want, &eof);
        if (st == KEEL_OK && json && tb->json_start) st = check_json_start(tb, s);
        if (st != KEEL_OK) return st;
        if (eof) break;
        const char *nl = memrchr(s->text, '\n', s->text_len);
        if (nl) {
            size_t keep = (size_t)(nl - s->text) + 1;
            tb->carry_len = s->text_len - keep;
            tb->carry = grow(tb->carry, &tb->carry_cap, tb->carry_len + 1, 1, "text carry");
            memcpy(tb->carry, s->text + keep, tb->carry_len);
            s->text_len = keep;
            if (json) tb->line_no += count_lines(s->text, keep);
            return KEEL_OK;
        }
        /* one line longer than the block so far */
        if (json && s->text_len >= JSONL_MAX_RECORD_BYTES) {
            snprintf(s->error, sizeof s->error,
                     "data prepare: %s:%" PRIu64 ": a record of 1 GiB or more (no line end in its "
                     "first %llu bytes); split the document into records under 1 GiB",
                     s->input->path, tb->line_no, JSONL_MAX_RECORD_BYTES);
            return KEEL_ERR_INPUT;
        }
        want *= 2;
        if (json && want > JSONL_MAX_RECORD_BYTES) want = JSONL_MAX_RECORD_BYTES;
    }
    tb->raw_bytes_done += instream_raw_bytes(tb->in);
    instream_close(tb->in);
    tb->in = NULL;
    tb->input++;
    s->ends_input = true;
    return KEEL_OK;
}

/* ---- the pool ------------------------------------------------------------- */

static slot *slot_of(textblocks *tb, uint64_t seq) { return &tb->slots[seq % (uint64_t)tb->n_slots]; }

/* Encode the oldest block nobody has claimed; called and returns with mu held. */
static void encode_claimed(textblocks *tb) {
    slot *s = slot_of(tb, tb->encode_seq++);
    pthread_mutex_unlock(&tb->mu);
    keel_status st = encode_block(tb, s);
    pthread_mutex_lock(&tb->mu);
    s->status = st;
    s->encoded = true;
    pthread_cond_broadcast(&tb->done_cv);
}

static void *worker(void *arg) {
    textblocks *tb = arg;
    pthread_mutex_lock(&tb->mu);
    for (;;) {
        while (!tb->stop && tb->encode_seq == tb->read_seq) pthread_cond_wait(&tb->work_cv, &tb->mu);
        if (tb->stop) break;
        encode_claimed(tb);
    }
    pthread_mutex_unlock(&tb->mu);
    return NULL;
}

keel_status textblocks_open(const keel_tokenizer *tok, const prepare_input *inputs,
                            size_t n_inputs, const char *text_key, int n_threads,
                            textblocks **out) {
    KEEL_CHECK(n_threads >= 1, "threads %d", n_threads);
    textblocks *tb = keel_xcalloc(sizeof *tb, "text reader");
    tb->tok = tok;
    tb->inputs = inputs;
    tb->n_inputs = n_inputs;
    tb->text_key = text_key;
    /* One thread alone needs one slot: it reads, encodes and hands out in turn. */
    tb->n_slots = n_threads == 1 ? 1 : SLOTS_PER_THREAD * n_threads;
    tb->slots = keel_xcalloc((size_t)tb->n_slots * sizeof *tb->slots, "text slots");
    pthread_mutex_init(&tb->mu, NULL);
    pthread_cond_init(&tb->work_cv, NULL);
    pthread_cond_init(&tb->done_cv, NULL);
    tb->workers = keel_xcalloc((size_t)n_threads * sizeof *tb->workers, "text workers");
    for (int i = 0; i < n_threads - 1; i++) {
        int err = pthread_create(&tb->workers[i], NULL, worker, tb);
        if (err != 0) {
            keel_errorf("data prepare: cannot start encoding thread %d of %d: %s; lower --threads",
                        i + 2, n_threads, strerror(err));
            textblocks_close(tb);
            *out = NULL;
            return KEEL_ERR_IO;
        }
        tb->n_workers++;
    }
    *out = tb;
    return KEEL_OK;
}

/* Read blocks into the free slots (all but the one the caller may still hold).
 * A block that cannot be read is queued as it is, its error with it, and
 * reading stops: the error comes out in input order, after every block before
 * it — what a caller that stops early (--max-tokens) sees never depends on how
 * far the reading ran ahead. */
static void read_ahead(textblocks *tb) {
    while (tb->input < tb->n_inputs && tb->read_seq < tb->out_seq + (uint64_t)tb->n_slots) {
        slot *s = slot_of(tb, tb->read_seq);
        s->read_status = read_block(tb, s);
        if (s->read_status != KEEL_OK) {
            instream_close(tb->in);
            tb->in = NULL;
            tb->input = tb->n_inputs;
        }
        pthread_mutex_lock(&tb->mu);
        s->encoded = false;
        tb->read_seq++;
        pthread_cond_signal(&tb->work_cv);
        pthread_mutex_unlock(&tb->mu);
    }
}

/* A bad record in a .gz or .zst may be the damage of the file itself, whose
 * checksum is read only at its end (a gzip member's CRC, a zstd frame's):
 * then the file is read through once more and the damage, if any, is the
 * error told. */
static void blame_damage(slot *s) {
    if (s->input->compression == INSTREAM_PLAIN || !s->error[0]) return;
    instream *in;
    char why[512];
    if (instream_open_file(s->input->path, s->input->compression, &in, why, sizeof why) != KEEL_OK)
        return;
    static char sink[1 << 16]; /* only the caller's thread reads it */
    size_t got;
    keel_status st;
    while ((st = instream_read(in, sink, sizeof sink, &got, why, sizeof why)) == KEEL_OK && got) {}
    instream_close(in);
    if (st == KEEL_ERR_INPUT)
        snprintf(s->error, sizeof s->error, "data prepare: input %s is %s", s->input->path, why);
}

keel_status textblocks_next(textblocks *tb, const text_block **out) {
    *out = NULL;
    /* The block handed out last time (if any) is done with: its slot is free. */
    if (tb->handed) tb->out_seq++;
    tb->handed = false;
    read_ahead(tb);
    if (tb->out_seq == tb->read_seq) return KEEL_OK; /* the inputs are all handed out */

    slot *s = slot_of(tb, tb->out_seq);
    pthread_mutex_lock(&tb->mu);
    /* Waiting for the oldest block, encode others' work rather than idle. */
    while (!s->encoded) {
        if (tb->encode_seq < tb->read_seq)
            encode_claimed(tb);
        else
            pthread_cond_wait(&tb->done_cv, &tb->mu);
    }
    pthread_mutex_unlock(&tb->mu);
    if (s->status != KEEL_OK) {
        if (s->read_status == KEEL_OK) blame_damage(s);
        tb->error = s->error;
        return s->status;
    }
    tb->handed = true;
    tb->bytes_handed += s->text_len;
    tb->records_handed += s->n_records;
    tb->empty_records_handed += s->n_empty_records;
    bool json = s->input->format == INPUT_JSONL;
    tb->view = (text_block){.text = json ? s->doc : s->text, .lines = s->lines, .n_lines = s->n_lines,
                            .ids = s->ids, .mask = tb->chat ? s->mask : NULL,
                            .ends_input = s->ends_input};
    *out = &tb->view;
    return KEEL_OK;
}

void textblocks_set_chat(textblocks *tb, const chat_template *chat) {
    KEEL_CHECK(tb->read_seq == 0, "textblocks_set_chat after the reading began");
    tb->chat = chat;
}

const char *textblocks_error(const textblocks *tb) { return tb->error ? tb->error : ""; }

uint64_t textblocks_bytes_read(const textblocks *tb) { return tb->bytes_handed; }

uint64_t textblocks_raw_bytes_read(const textblocks *tb) {
    return tb->raw_bytes_done + (tb->in ? instream_raw_bytes(tb->in) : 0);
}

uint64_t textblocks_records(const textblocks *tb, uint64_t *n_empty) {
    *n_empty = tb->empty_records_handed;
    return tb->records_handed;
}

void textblocks_close(textblocks *tb) {
    if (!tb) return;
    pthread_mutex_lock(&tb->mu);
    tb->stop = true;
    pthread_cond_broadcast(&tb->work_cv);
    pthread_mutex_unlock(&tb->mu);
    for (int i = 0; i < tb->n_workers; i++) pthread_join(tb->workers[i], NULL);
    pthread_mutex_destroy(&tb->mu);
    pthread_cond_destroy(&tb->work_cv);
    pthread_cond_destroy(&tb->done_cv);
    for (int i = 0; i < tb->n_slots; i++) {
        slot *s = &tb->slots[i];
        keel_free(s->text);
        keel_free(s->doc);
        keel_free(s->lines);
        keel_free(s->ids);
        keel_free(s->mask);
        keel_ids_free(&s->scratch);
        chat_doc_free(&s->chat);
    }
    instream_close(tb->in);
    keel_free(tb->slots);
    keel_free(tb->workers);
    keel_free(tb->carry);
    keel_free(tb);
}
