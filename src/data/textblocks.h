/* data/textblocks.h: the text side of `keel data prepare` — input files read
 * (decompressed where they are .gz or .zst) in blocks of whole lines whose
 * lines are encoded on a pool of threads and handed back in input order. A
 * text file's lines are the lines of the file; a JSON Lines file's are the
 * lines of each record's text followed by a blank line that ends its
 * document, and a Parquet file's the same of each row's string. Internal to
 * the data module (prepare.c).
 *
 *     textblocks *tb;
 *     textblocks_options opt = {.text_key = "text", .column = "text"};
 *     if (textblocks_open(tok, inputs, n_inputs, &opt, threads, &tb) != KEEL_OK) return ...;
 *     const text_block *b;
 *     while ((st = textblocks_next(tb, &b)) == KEEL_OK && b) {
 *         for (size_t i = 0; i < b->n_lines; i++) use(b->text + b->lines[i].start, ...);
 *     }
 *     textblocks_close(tb);
 */
#ifndef KEEL_DATA_TEXTBLOCKS_H
#define KEEL_DATA_TEXTBLOCKS_H

#include "data/inputs.h"
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
 * hold no lines at all. In a JSON Lines file each record's text is split at
 * its "\n"s into lines as a text file's are; its blank lines are left out
 * (they do not end its document) and a blank line follows its last line (the
 * record's end ends the document); a record whose text has no line that is
 * not blank gives no lines at all (an empty record). A Parquet row's string
 * is a record's text; a null row gives no lines either. */
typedef struct {
    const char *text;
    const text_line *lines;
    size_t n_lines;
    const int32_t *ids;
    const uint8_t *mask; /* per id the loss mask (chat records), or NULL: no mask (text) */
    bool ends_input;
} text_block;

typedef struct textblocks textblocks;

typedef struct {
    const char *text_key; /* the member of a JSON Lines record that holds its text */
    const char *column;   /* the Parquet column that holds the text */
    bool strict_utf8;     /* text that is not valid UTF-8 is an error (else the tokenizer's) */
} textblocks_options;

/* Start reading `inputs` (in order; the array, the options' strings and tok
 * must outlive *out) with n_threads >= 1 threads encoding: the caller's own
 * thread (inside textblocks_next) and n_threads - 1 workers. The blocks and
 * their ids do not depend on n_threads. Returns KEEL_ERR_IO with one line if
 * a thread cannot start. The caller owns *out (textblocks_close). */
keel_status textblocks_open(const keel_tokenizer *tok, const prepare_input *inputs,
                            size_t n_inputs, const textblocks_options *opt, int n_threads,
                            textblocks **out);
/* Before the first textblocks_next: read every input as JSON Lines chat
 * records (data/chat.h) instead. A record becomes one line — its rendered
 * conversation, whose ids are the template's tokens (BOS and EOS included)
 * and carry the loss mask — then the blank line that ends its document;
 * text_key is not used. chat must outlive tb. */
struct chat_template;
void textblocks_set_chat(textblocks *tb, const struct chat_template *chat);
/* The next block in input order in *out, valid until the next call or
 * textblocks_close; *out = NULL after the last one. Bad input fails when the
 * reading comes to it in order, whatever the thread count, with one line in
 * textblocks_error (not printed: the caller prints it) naming the file, and
 * the line or row where there is one: a file that cannot be opened or read
 * (KEEL_ERR_INPUT or KEEL_ERR_IO), a truncated or corrupt .gz or .zst, a JSON
 * Lines file that holds an array, a record that is malformed, not an object,
 * without a string at text_key, or of JSONL_MAX_RECORD_BYTES or more, a
 * Parquet file that parquet_open_file or parquet_next refuses (a .parquet.gz
 * too), and with strict_utf8 text that is not valid UTF-8 — a line, a
 * record's text, a row's string — named with the byte (KEEL_ERR_INPUT); with chat, a record whose
 * conversation chat_record_encode refuses (KEEL_ERR_INPUT). */
keel_status textblocks_next(textblocks *tb, const text_block **out);
/* The line that says why textblocks_next failed ("" when the failure printed
 * its own, or none). */
const char *textblocks_error(const textblocks *tb);
/* Bytes of text (decompressed) in the blocks handed out so far. */
uint64_t textblocks_bytes_read(const textblocks *tb);
/* Bytes of the input files as stored (compressed) read so far, read-ahead
 * included: the progress through the inputs' on-disk size. */
uint64_t textblocks_raw_bytes_read(const textblocks *tb);
/* JSON Lines records and Parquet rows in the blocks handed out so far, and
 * how many gave no document. */
typedef struct {
    uint64_t records, empty_records;        /* JSON Lines */
    uint64_t rows, empty_rows, null_rows;   /* Parquet */
} textblocks_counts;
textblocks_counts textblocks_counted(const textblocks *tb);
/* Stop the workers and free everything (also in the middle of the input). */
void textblocks_close(textblocks *tb);

#endif
