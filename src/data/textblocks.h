/* data/textblocks.h: the text side of `keel data prepare` — input files read
 * in blocks of whole lines whose lines are encoded on a pool of threads and
 * handed back in input order. Internal to the data module (prepare.c).
 *
 *     textblocks *tb;
 *     if (textblocks_open(tok, inputs, n_inputs, threads, &tb) != KEEL_OK) return ...;
 *     const text_block *b;
 *     while ((st = textblocks_next(tb, &b)) == KEEL_OK && b) {
 *         for (size_t i = 0; i < b->n_lines; i++) use(b->text + b->lines[i].start, ...);
 *     }
 *     textblocks_close(tb);
 */
#ifndef KEEL_DATA_TEXTBLOCKS_H
#define KEEL_DATA_TEXTBLOCKS_H

#include "keel/tokenizer.h"

/* One line of a block. Its text is text[start, start + len): the line without
 * its end ("\n" and the "\r"s before it). Its ids (as spm_encode gives them,
 * no BOS/EOS) are ids[first_id, first_id + n_ids); a blank line is not
 * encoded (n_ids = 0). */
typedef struct {
    size_t start, len;
    size_t first_id, n_ids;
    bool blank; /* empty or only spaces, tabs and CRs: it ends a document */
} text_line;

/* Whole lines of one input file, in order. Blocks never span two files; the
 * last block of a file has ends_input set (its end ends a document) and may
 * hold no lines at all. */
typedef struct {
    const char *text;
    const text_line *lines;
    size_t n_lines;
    const int32_t *ids;
    bool ends_input;
} text_block;

typedef struct textblocks textblocks;

/* Start reading `inputs` (in order; the array and tok must outlive *out) with
 * n_threads >= 1 threads encoding: the caller's own thread (inside
 * textblocks_next) and n_threads - 1 workers. The blocks and their ids do not
 * depend on n_threads. Returns KEEL_ERR_IO with one line if a thread cannot
 * start. The caller owns *out (textblocks_close). */
keel_status textblocks_open(const keel_tokenizer *tok, const char *const *inputs, int n_inputs,
                            int n_threads, textblocks **out);
/* The next block in input order in *out, valid until the next call or
 * textblocks_close; *out = NULL after the last one. A file that cannot be
 * opened or read prints one line naming it (KEEL_ERR_INPUT or KEEL_ERR_IO). */
keel_status textblocks_next(textblocks *tb, const text_block **out);
/* Bytes of text read so far. */
uint64_t textblocks_bytes_read(const textblocks *tb);
/* Stop the workers and free everything (also in the middle of the input). */
void textblocks_close(textblocks *tb);

#endif
