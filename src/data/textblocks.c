/* data/textblocks.c: input text read in blocks of whole lines, encoded on a pool
 * of threads, handed back in input order (see textblocks.h). */
#include "data/textblocks.h"

#include <errno.h>
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

typedef struct {
    char *text;
    size_t text_len, text_cap;
    text_line *lines;
    size_t n_lines, lines_cap;
    int32_t *ids;
    size_t n_ids, ids_cap;
    keel_ids scratch; /* one line's ids */
    bool ends_input;
    bool encoded;       /* under mu */
    keel_status status; /* of encoding */
} slot;

struct textblocks {
    const keel_tokenizer *tok;
    const char *const *inputs;
    int n_inputs;

    /* Reading: only the caller's thread. */
    int input; /* the file being read, n_inputs when all are read */
    FILE *f;
    char *carry; /* a partial line read after the last complete one */
    size_t carry_len, carry_cap;
    uint64_t bytes_read;
    text_block view;
    bool handed; /* view is out with the caller */

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

static keel_status add_line(const keel_tokenizer *tok, slot *s, size_t start, size_t end) {
    size_t len = end - start;
    while (len > 0 && s->text[start + len - 1] == '\r') len--;
    s->lines = grow(s->lines, &s->lines_cap, s->n_lines + 1, sizeof *s->lines, "text lines");
    text_line *l = &s->lines[s->n_lines++];
    *l = (text_line){.start = start, .len = len, .first_id = s->n_ids,
                     .blank = is_blank(s->text + start, len)};
    if (l->blank) return KEEL_OK;
    keel_status st = keel_tokenizer_encode(tok, s->text + start, len, &s->scratch);
    if (st != KEEL_OK) return st;
    s->ids = grow(s->ids, &s->ids_cap, s->n_ids + s->scratch.n + 1, sizeof *s->ids, "line ids");
    memcpy(s->ids + s->n_ids, s->scratch.ids, s->scratch.n * sizeof *s->ids);
    s->n_ids += s->scratch.n;
    l->n_ids = s->scratch.n;
    return KEEL_OK;
}

/* Split a slot's text into lines (a final line without "\n" counts, as for
 * getline) and encode each. Runs on any thread; touches only the slot. */
static keel_status encode_block(const keel_tokenizer *tok, slot *s) {
    s->n_lines = 0;
    s->n_ids = 0;
    size_t pos = 0;
    while (pos < s->text_len) {
        const char *nl = memchr(s->text + pos, '\n', s->text_len - pos);
        size_t end = nl ? (size_t)(nl - s->text) : s->text_len;
        keel_status st = add_line(tok, s, pos, end);
        if (st != KEEL_OK) return st;
        pos = end + 1;
    }
    return KEEL_OK;
}

/* ---- reading (the caller's thread) ---------------------------------------- */

static keel_status open_next_input(textblocks *tb) {
    const char *path = tb->inputs[tb->input];
    /* a text file, or a pipe (--input <(zcat corpus.gz)); never a device */
    int fd;
    char why[160];
    keel_status st = keel_open_read(path, true, &fd, why, sizeof why);
    if (st == KEEL_OK && !(tb->f = fdopen(fd, "rb"))) {
        snprintf(why, sizeof why, "%s", strerror(errno));
        close(fd);
        st = KEEL_ERR_IO;
    }
    if (st != KEEL_OK) {
        keel_errorf("cannot read input %s: %s; give text files", path, why);
        return KEEL_ERR_INPUT;
    }
    return KEEL_OK;
}

/* Read the next block of the current input into s: the carried partial line,
 * then text up to BLOCK_BYTES, cut after the last "\n" (a longer line makes a
 * bigger block). At the end of the file the rest is the block, ends_input.
 * The cuts depend only on the text, never on the slot or the thread count. */
static keel_status read_block(textblocks *tb, slot *s) {
    if (!tb->f) {
        keel_status st = open_next_input(tb);
        if (st != KEEL_OK) return st;
    }
    size_t want = BLOCK_BYTES;
    s->text = grow(s->text, &s->text_cap, tb->carry_len + 1, 1, "text block");
    if (tb->carry_len > 0) memcpy(s->text, tb->carry, tb->carry_len);
    s->text_len = tb->carry_len;
    tb->carry_len = 0;
    s->ends_input = false;
    for (;;) {
        if (s->text_len >= want) {
            const char *nl = memrchr(s->text, '\n', s->text_len);
            if (nl) {
                size_t keep = (size_t)(nl - s->text) + 1;
                tb->carry_len = s->text_len - keep;
                tb->carry = grow(tb->carry, &tb->carry_cap, tb->carry_len + 1, 1, "text carry");
                memcpy(tb->carry, s->text + keep, tb->carry_len);
                s->text_len = keep;
                return KEEL_OK;
            }
            want *= 2; /* one line longer than the block so far */
            continue;
        }
        s->text = grow(s->text, &s->text_cap, want, 1, "text block");
        size_t got = fread(s->text + s->text_len, 1, want - s->text_len, tb->f);
        s->text_len += got;
        tb->bytes_read += got;
        if (got == 0) break; /* fread returns 0 only at the end or on an error */
    }
    if (ferror(tb->f)) {
        keel_errorf("cannot read input %s: %s", tb->inputs[tb->input], strerror(errno));
        return KEEL_ERR_IO;
    }
    fclose(tb->f);
    tb->f = NULL;
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
    keel_status st = encode_block(tb->tok, s);
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

keel_status textblocks_open(const keel_tokenizer *tok, const char *const *inputs, int n_inputs,
                            int n_threads, textblocks **out) {
    KEEL_CHECK(n_threads >= 1 && n_inputs >= 0, "threads %d, inputs %d", n_threads, n_inputs);
    textblocks *tb = keel_xcalloc(sizeof *tb, "text reader");
    tb->tok = tok;
    tb->inputs = inputs;
    tb->n_inputs = n_inputs;
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

/* Read blocks into the free slots (all but the one the caller may still hold). */
static keel_status read_ahead(textblocks *tb) {
    while (tb->input < tb->n_inputs && tb->read_seq < tb->out_seq + (uint64_t)tb->n_slots) {
        slot *s = slot_of(tb, tb->read_seq);
        keel_status st = read_block(tb, s);
        if (st != KEEL_OK) return st;
        pthread_mutex_lock(&tb->mu);
        s->encoded = false;
        tb->read_seq++;
        pthread_cond_signal(&tb->work_cv);
        pthread_mutex_unlock(&tb->mu);
    }
    return KEEL_OK;
}

keel_status textblocks_next(textblocks *tb, const text_block **out) {
    *out = NULL;
    /* The block handed out last time (if any) is done with: its slot is free. */
    if (tb->handed) tb->out_seq++;
    tb->handed = false;
    keel_status st = read_ahead(tb);
    if (st != KEEL_OK) return st;
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
    if (s->status != KEEL_OK) return s->status;
    tb->handed = true;
    tb->view = (text_block){.text = s->text, .lines = s->lines, .n_lines = s->n_lines,
                            .ids = s->ids, .ends_input = s->ends_input};
    *out = &tb->view;
    return KEEL_OK;
}

uint64_t textblocks_bytes_read(const textblocks *tb) { return tb->bytes_read; }

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
        keel_free(s->lines);
        keel_free(s->ids);
        keel_ids_free(&s->scratch);
    }
    if (tb->f) fclose(tb->f);
    keel_free(tb->slots);
    keel_free(tb->workers);
    keel_free(tb->carry);
    keel_free(tb);
}
