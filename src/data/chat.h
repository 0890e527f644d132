/* data/chat.h: chat fine-tuning records for `keel data prepare --format chat`
 * — a JSON Lines record's "messages" checked, rendered with a model's chat
 * template (Llama 3 Instruct, Llama 2 chat) exactly as its Hugging Face
 * template renders it, and tokenized to the ids transformers'
 * apply_chat_template gives, with a loss mask that is 1 on the tokens of the
 * assistant's turns. Internal to the data module (prepare.c opens the
 * template, textblocks.c encodes records on its threads; fuzzed by
 * tests/fuzz/fuzz_chat_record.c).
 *
 *     chat_template *ct;
 *     if (chat_template_open("llama3", tok, "tok/tokenizer.json", &ct) != KEEL_OK) return ...;
 *     chat_doc doc = {0};
 *     char why[512];
 *     bool is_record;
 *     if (chat_record_encode(ct, line, len, &doc, &is_record, why, sizeof why) != KEEL_OK)
 *         report(path, line_no, why);   // why is "" when the tokenizer printed its own line
 *     else if (is_record) use(doc.text, doc.text_len, doc.ids.ids, doc.mask, doc.ids.n);
 *     chat_doc_free(&doc);
 *     chat_template_free(ct);
 */
#ifndef KEEL_DATA_CHAT_H
#define KEEL_DATA_CHAT_H

#include "keel/tokenizer.h"

typedef struct chat_template chat_template;

/* The names chat_template_open knows, for messages: "llama3 or llama2". */
extern const char CHAT_TEMPLATE_NAMES[];

/* The template `name` ("llama3": Llama 3 Instruct; "llama2": Llama 2 chat)
 * over tok, whose file is tok_path (named in messages). Checks that tok has
 * the special tokens the template writes (llama3: BOS, <|start_header_id|>,
 * <|end_header_id|>, <|eot_id|>; llama2: BOS and EOS), each one the
 * tokenizer matches whole in text (keel_tokenizer_special_id). Errors print
 * one line naming the template or the token and the file (KEEL_ERR_INPUT).
 * tok must outlive *out; the caller owns *out (chat_template_free). */
keel_status chat_template_open(const char *name, const keel_tokenizer *tok, const char *tok_path,
                               chat_template **out);
void chat_template_free(chat_template *ct);
/* "llama3" or "llama2" (a string literal). */
const char *chat_template_name(const chat_template *ct);

/* One record's conversation, as chat_record_encode leaves it (reused from
 * record to record: zero-initialise once, chat_doc_free at the end). */
typedef struct {
    char *text; /* the rendered conversation, special tokens written as their text, NUL-ended */
    size_t text_len, text_cap;
    keel_ids ids;  /* its tokens: no BOS/EOS beyond the template's own */
    uint8_t *mask; /* (ids.n) 1: trained on as a target (the assistant's turns), 0: not */
    size_t mask_cap;
    size_t n_messages;
    /* scratch of the rendering and encoding */
    void *parts; /* chat.c's parts of the rendered text */
    size_t parts_cap; /* bytes */
    keel_ids prefix;
} chat_doc;
void chat_doc_free(chat_doc *doc);

/* line[0, len) (no line end, need not be NUL-ended) is a blank line (only
 * JSON whitespace: *is_record = false) or one JSON object whose "messages"
 * is a conversation: an optional system message first, then user and
 * assistant messages in turn, starting with the user and ending with the
 * assistant, each {"role": ..., "content": "..."} (other keys ignored; a
 * content is read up to a \u0000 in it). The conversation is rendered into
 * doc->text and encoded into doc->ids and doc->mask (*is_record = true).
 * Bad input is KEEL_ERR_INPUT with `why` saying what is wrong and the fix,
 * without the file and line (the caller adds them); a tokenizer failure
 * (a text over 2 GiB) returns its status with why "" (the tokenizer printed
 * its line). Safe on many threads at once, each with its own doc. */
keel_status chat_record_encode(const chat_template *ct, const char *line, size_t len, chat_doc *doc,
                               bool *is_record, char *why, size_t why_n);

#endif
