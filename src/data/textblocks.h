/* data/textblocks.h: the text side of `keel data prepare` — input files read
 * (decompressed where they are .gz or .zst) in blocks of whole lines whose
 * lines are encoded on a pool of threads and handed back in input order. A
 * text file's lines are the lines of the file; a JSON Lines file's are the
 * lines of each record's text followed by a blank line that ends its
 * document. Internal to the data module (prepare.c).
 *
 *     textblocks *tb;
 *     if (textblocks_open(tok, inputs, n_inputs, "text", threads, &tb) != KEEL_OK) return ...;
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
 * not blank gives no lines at all (an empty record). */
typedef struct {
    const char *text;
    const text_line *lines;
    size_t n_lines;
    const int32_t *ids;
    const uint8_t *mask; /* per id the loss mask (chat records), or NULL: no mask (text) */
    bool ends_input;
} text_block;

typedef struct textblocks textblocks;

/* Start reading `inputs` (in order; the array, text_key and tok must outlive
 * *out) with n_threads >= 1 threads encoding: the caller's own thread (inside
 * textblocks_next) and n_threads - 1 workers. text_key names the member of a
 * JSON Lines record that holds its text. The blocks and their ids do not
 * depend on n_threads. Returns KEEL_ERR_IO with one line if a thread cannot
 * start. The caller owns *out (textblocks_close). */
keel_status textblocks_open(const keel_tokenizer *tok, const prepare_input *inputs,
                            size_t n_inputs, const char *text_key, int n_threads,
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
 * the line where there is one: a file that cannot be opened or read
 * (KEEL_ERR_INPUT or KEEL_ERR_IO), a truncated or corrupt .gz or .zst, a JSON
 * Lines file that holds an array, a record that is malformed, not an object,
 * without a string at text_key, or of JSONL_MAX_RECORD_BYTES or more
 * (KEEL_ERR_INPUT); with chat, a record whose conversation chat_record_encode
 * refuses (KEEL_ERR_INPUT). */
keel_status textblocks_next(textblocks *tb, const text_block **out);
/* The line that says why textblocks_next failed ("" when the failure printed
 * its own, or none). */
const char *textblocks_error(const textblocks *tb);
/* Bytes of text (decompressed) in the blocks handed out so far. */
uint64_t textblocks_bytes_read(const textblocks *tb);
/* Bytes of the input files as stored (compressed) read so far, read-ahead
 * included: the progress through the inputs' on-disk size. */
uint64_t textblocks_raw_bytes_read(const textblocks *tb);
/* JSON Lines records in the blocks handed out so far, and how many of them
 * were empty (no document). */
uint64_t textblocks_records(const textblocks *tb, uint64_t *n_empty);
/* Stop the workers and free everything (also in the middle of the input). */
void textblocks_close(textblocks *tb);

#endif
