/* data/textblocks.c: input text read in blocks of whole lines, encoded on a pool
 * of threads, handed back in input order (see textblocks.h). */
#include "data/textblocks.h"

#include "data/chat.h"
#include "data/jsonl.h"
#include "data/parquet.h"
#include "data/tokenizer_hf_model.h" /* hf_utf8_valid_prefix: --strict-utf8 */

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
    uint64_t first_line;        /* text, JSON Lines: the number of the block's first line in it */
    char *text;                 /* the block as read (decompressed); Parquet: its rows' strings */
    size_t text_len, text_cap;
    size_t *row_ends;           /* Parquet: where each row's string ends in text */
    size_t n_row_texts, row_ends_cap;
    char *doc;                  /* JSON Lines, Parquet: the records' texts, which the lines point into */
    size_t doc_len, doc_cap;
    text_line *lines;
    size_t n_lines, lines_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    uint8_t *mask; /* chat: per id */
    size_t mask_cap;
    keel_ids scratch; /* one line's ids */
    chat_doc chat;    /* chat: one record's conversation */
    uint64_t n_records, n_empty_records;          /* JSON Lines, counted as encoded */
    uint64_t n_rows, n_empty_rows, n_null_rows;   /* Parquet, counted as read */
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
    textblocks_options opt;
    const chat_template *chat; /* NULL: records hold text */

    /* Reading: only the caller's thread. */
    size_t input; /* the file being read, n_inputs when all are read (or reading failed) */
    instream *in;
    parquet_reader *pq;  /* Parquet: the file being read */
    parquet_run run;     /* Parquet: the run of rows being read, */
    uint64_t run_left;   /*   of which this many are not in a block yet */
    char *carry; /* a partial line read after the last complete one */
    size_t carry_len, carry_cap;
    uint64_t line_no;    /* JSON Lines: the number of the carried line */
    bool json_start;     /* JSON Lines: nothing but whitespace read yet */
    bool bom_pending;    /* JSON Lines: the file's first bytes not yet looked at */
    uint64_t raw_bytes_done; /* of the files read to their end */
    /* Of the blocks handed out: only the caller's thread. */
    uint64_t bytes_handed;
    textblocks_counts counted;
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

static uint64_t count_lines(const char *text, size_t len) {
    uint64_t n = 0;
    for (const char *p = text, *end = text + len; (p = memchr(p, '\n', (size_t)(end - p))); p++) n++;
    return n;
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
 * blank line that ends it; an empty record gives no lines (*empty). */
static keel_status add_record(const keel_tokenizer *tok, slot *s, const char *text, size_t len,
                              bool *empty) {
    size_t start = s->doc_len, lines_before = s->n_lines;
    s->doc = grow(s->doc, &s->doc_cap, s->doc_len + len + 1, 1, "record texts");
    memcpy(s->doc + start, text, len);
    s->doc_len += len;
    keel_status st = add_lines(tok, s, s->doc, start, s->doc_len, false);
    *empty = s->n_lines == lines_before;
    if (st != KEEL_OK || *empty) return st;
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

/* --strict-utf8: text[0, len) is valid UTF-8, or *bad is the offset of the
 * first byte that is not, and `bytes` shows it and up to 3 more of its line
 * ("bytes from there: 0xc3 0x28"). */
static bool valid_utf8(const char *text, size_t len, size_t *bad, char *bytes, size_t bytes_n) {
    *bad = hf_utf8_valid_prefix(text, len);
    if (*bad == len) return true;
    size_t used = 0;
    bytes[0] = '\0';
    for (size_t i = *bad; i < len && i < *bad + 4 && text[i] != '\n' && used < bytes_n; i++) {
        int w = snprintf(bytes + used, bytes_n - used, "%s0x%02x", i > *bad ? " " : "bytes from there: ",
                         (unsigned char)text[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    return false;
}

#define STRICT_UTF8_FIX "fix it where it comes from, or leave out --strict-utf8 to let the tokenizer take the bytes as they are"

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
                                  : jsonl_record_text(s->text + pos, end - pos, tb->opt.text_key,
                                                      &is_record, &text, &len, why, sizeof why);
        if (st != KEEL_OK) {
            if (why[0]) /* else the tokenizer printed why */
                snprintf(s->error, sizeof s->error, "data prepare: %s:%" PRIu64 ": %s",
                         s->input->path, line_no, why);
            return st;
        }
        if (is_record) {
            size_t bad;
            char bytes[48];
            if (tb->opt.strict_utf8 && !valid_utf8(text, len, &bad, bytes, sizeof bytes)) {
                snprintf(s->error, sizeof s->error, "data prepare: %s:%" PRIu64 ": invalid UTF-8 at "
                         "byte %zu of the record's \"%s\" value (%s); " STRICT_UTF8_FIX,
                         s->input->path, line_no, bad + 1, tb->opt.text_key, bytes);
                keel_free(text);
                return KEEL_ERR_INPUT;
            }
            bool empty;
            st = add_record(tb->tok, s, text, len, &empty);
            keel_free(text);
            if (st != KEEL_OK) return st;
            s->n_records++;
            s->n_empty_records += empty;
        }
        pos = end + 1;
        line_no++;
    }
    return KEEL_OK;
}

/* A Parquet block's rows (none of them blank: those were counted as read)
 * through add_record. */
static keel_status encode_rows(const textblocks *tb, slot *s) {
    size_t start = 0;
    for (size_t i = 0; i < s->n_row_texts; i++) {
        bool empty;
        keel_status st = add_record(tb->tok, s, s->text + start, s->row_ends[i] - start, &empty);
        if (st != KEEL_OK) return st;
        start = s->row_ends[i];
    }
    return KEEL_OK;
}

/* --strict-utf8 over a text block: the first byte that is not valid UTF-8,
 * named by its line (a line end is never inside a character). */
static keel_status check_text_utf8(slot *s) {
    size_t bad;
    char bytes[48];
    if (valid_utf8(s->text, s->text_len, &bad, bytes, sizeof bytes)) return KEEL_OK;
    const char *nl = bad ? memrchr(s->text, '\n', bad) : NULL;
    size_t line_start = nl ? (size_t)(nl - s->text) + 1 : 0;
    snprintf(s->error, sizeof s->error, "data prepare: %s:%" PRIu64 ": invalid UTF-8 at byte %zu of "
             "the line (%s); " STRICT_UTF8_FIX, s->input->path,
             s->first_line + count_lines(s->text, line_start), bad - line_start + 1, bytes);
    return KEEL_ERR_INPUT;
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
    if (s->input->format == INPUT_PARQUET) return encode_rows(tb, s);
    if (tb->opt.strict_utf8) {
        keel_status st = check_text_utf8(s);
        if (st != KEEL_OK) return st;
    }
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

/* A record's text has no line that is not blank: every byte a space, tab,
 * CR or line end (add_record would find it empty). */
static bool blank_record(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') return false;
    return true;
}

static keel_status open_parquet(textblocks *tb, slot *s) {
    const prepare_input *f = s->input;
    char why[768];
    keel_status st;
    if (f->compression != INSTREAM_PLAIN) {
        snprintf(why, sizeof why, "is a compressed Parquet file (.%s); Parquet is read from its end and "
                 "compresses its own pages: decompress it first (%s -d)",
                 f->compression == INSTREAM_GZIP ? "gz" : "zst", f->compression == INSTREAM_GZIP ? "gzip" : "zstd");
        st = KEEL_ERR_INPUT;
    } else {
        st = parquet_open_file(f->path, tb->opt.column, &tb->pq, why, sizeof why);
    }
    if (st != KEEL_OK) snprintf(s->error, sizeof s->error, "data prepare: input %s %s", f->path, why);
    tb->run_left = 0;
    return st;
}

/* The next block of a Parquet file into s: rows copied whole until the block
 * holds BLOCK_BYTES (cut where the rows are: never depends on the slot or the
 * thread count). Null and blank rows are only counted: a run of them costs
 * nothing per row. At the end of the file the block has ends_input. */
static keel_status read_parquet_block(textblocks *tb, slot *s) {
    s->n_row_texts = 0;
    s->n_rows = s->n_empty_rows = s->n_null_rows = 0;
    if (!tb->pq) {
        keel_status st = open_parquet(tb, s);
        if (st != KEEL_OK) return st;
    }
    for (;;) {
        if (tb->run_left == 0) {
            bool end;
            char why[768];
            keel_status st = parquet_next(tb->pq, &tb->run, &end, why, sizeof why);
            if (st != KEEL_OK) {
                snprintf(s->error, sizeof s->error, "data prepare: input %s %s", s->input->path, why);
                return st;
            }
            if (end) break;
            const parquet_run *r = &tb->run;
            size_t bad;
            char bytes[48];
            if (!r->text || blank_record(r->text, r->len)) { /* no document: counted */
                s->n_rows += r->count;
                *(r->text ? &s->n_empty_rows : &s->n_null_rows) += r->count;
                continue;
            }
            if (tb->opt.strict_utf8 && !valid_utf8(r->text, r->len, &bad, bytes, sizeof bytes)) {
                snprintf(s->error, sizeof s->error, "data prepare: %s: row %" PRIu64 ", column \"%s\": "
                         "invalid UTF-8 at byte %zu of its value (%s); " STRICT_UTF8_FIX, s->input->path,
                         r->first_row, tb->opt.column, bad + 1, bytes);
                return KEEL_ERR_INPUT;
            }
            tb->run_left = r->count;
        }
        if (s->text_len >= BLOCK_BYTES) return KEEL_OK;
        for (; tb->run_left > 0 && s->text_len < BLOCK_BYTES; tb->run_left--) {
            const parquet_run *r = &tb->run;
            s->text = grow(s->text, &s->text_cap, s->text_len + r->len + 1, 1, "text block");
            memcpy(s->text + s->text_len, r->text, r->len);
            s->text_len += r->len;
            s->row_ends = grow(s->row_ends, &s->row_ends_cap, s->n_row_texts + 1, sizeof *s->row_ends,
                               "parquet rows");
            s->row_ends[s->n_row_texts++] = s->text_len;
            s->n_rows++;
        }
    }
    tb->raw_bytes_done += s->input->size_bytes;
    parquet_close(tb->pq);
    tb->pq = NULL;
    tb->input++;
    s->ends_input = true;
    return KEEL_OK;
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
    if (s->input->format == INPUT_PARQUET) return read_parquet_block(tb, s);
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
            tb->line_no += count_lines(s->text, keep);
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
                            size_t n_inputs, const textblocks_options *opt, int n_threads,
                            textblocks **out) {
    KEEL_CHECK(n_threads >= 1, "threads %d", n_threads);
    textblocks *tb = keel_xcalloc(sizeof *tb, "text reader");
    tb->tok = tok;
    tb->inputs = inputs;
    tb->n_inputs = n_inputs;
    tb->opt = *opt;
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
            parquet_close(tb->pq);
            tb->pq = NULL;
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
    tb->counted.records += s->n_records;
    tb->counted.empty_records += s->n_empty_records;
    if (s->input->format == INPUT_PARQUET) {
        tb->counted.rows += s->n_rows;
        tb->counted.empty_rows += s->n_empty_rows;
        tb->counted.null_rows += s->n_null_rows;
    }
    bool records = s->input->format != INPUT_TEXT;
    tb->view = (text_block){.text = records ? s->doc : s->text, .lines = s->lines, .n_lines = s->n_lines,
                            .ids = s->ids, .mask = tb->chat ? s->mask : NULL, .ends_input = s->ends_input};
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
    return tb->raw_bytes_done + (tb->in ? instream_raw_bytes(tb->in) : 0) +
           (tb->pq ? parquet_raw_bytes(tb->pq) : 0);
}

textblocks_counts textblocks_counted(const textblocks *tb) { return tb->counted; }

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
        keel_free(s->row_ends);
        keel_ids_free(&s->scratch);
        chat_doc_free(&s->chat);
    }
    instream_close(tb->in);
    parquet_close(tb->pq);
    keel_free(tb->slots);
    keel_free(tb->workers);
    keel_free(tb->carry);
    keel_free(tb);
}
