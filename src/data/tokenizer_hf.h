/* data/tokenizer_hf.h: the Hugging Face tokenizer.json model behind
 * keel/tokenizer.h (BPE, byte-level as GPT-2 and Llama 3 ship it or
 * SentencePiece-style as Llama 2 and Mistral do). Internal to the data
 * module: src/data/tokenizer.c reads the files and dispatches here when a
 * tokenizer file is JSON.
 *
 *     tokenizer_hf *t;
 *     if (tokenizer_hf_parse(json, len, "tok/tokenizer.json", NULL, 0, NULL, &t) != KEEL_OK) return ...;
 *     tokenizer_hf_encode(t, "Hello world", 11, &ids);
 *     tokenizer_hf_free(t);
 */
#ifndef KEEL_DATA_TOKENIZER_HF_H
#define KEEL_DATA_TOKENIZER_HF_H

#include "keel/tokenizer.h"

typedef struct tokenizer_hf tokenizer_hf;

/* True when bytes[0, len) is a JSON document (its first byte that is not
 * JSON white space is '{'), i.e. a tokenizer.json rather than a .model. */
bool tokenizer_hf_is_json(const void *bytes, size_t len);

/* Parse a tokenizer.json in json[0, len) (`name` stands for the file in
 * messages) and, when config is not NULL, the tokenizer_config.json beside it
 * in config[0, config_len) (config_name in messages) for BOS and EOS
 * (bos_token / eos_token, a string or {"content": ...}; absent, null or no
 * file: -1). Neither buffer needs a NUL and neither is kept. On bad input
 * (not JSON, not BPE, a component keel does not reproduce, an inconsistent
 * vocabulary or merge, an invalid regex) prints one line naming the file and
 * the cause, sets *out to NULL and returns KEEL_ERR_INPUT. The caller owns
 * *out; it is read-only for encode and decode on any number of threads. */
keel_status tokenizer_hf_parse(const char *json, size_t len, const char *name, const char *config,
                               size_t config_len, const char *config_name, tokenizer_hf **out);
void tokenizer_hf_free(tokenizer_hf *t);

/* 1 + the largest id of the vocabulary and the added tokens. */
int tokenizer_hf_vocab_size(const tokenizer_hf *t);
int tokenizer_hf_bos_id(const tokenizer_hf *t); /* -1 if none */
int tokenizer_hf_eos_id(const tokenizer_hf *t); /* -1 if none */

/* The id of the added token whose content is `token`, when it is matched
 * in the text as given (not normalized) without lstrip, rstrip or
 * single_word (keel_tokenizer_special_id); else -1. */
int tokenizer_hf_special_id(const tokenizer_hf *t, const char *token);
/* Hugging Face's ids for text[0, len) (Tokenizer.encode without special
 * tokens; invalid UTF-8 first replaced by U+FFFD per maximal subpart, as
 * Python's errors="replace" reads it), appended to *out after clearing it.
 * Fails (KEEL_ERR_INPUT, one line) only when a pattern's match limit is hit
 * or a line is over 2 GiB. */
keel_status tokenizer_hf_encode(const tokenizer_hf *t, const char *text, size_t len, keel_ids *out);
/* Hugging Face's Tokenizer.decode(ids, skip_special_tokens=False): *text is
 * malloc'd, NUL-terminated (it may hold NULs: *len is its length). Ids must
 * be in [0, vocab) (the caller checks); an id no token has gives nothing. */
keel_status tokenizer_hf_decode(const tokenizer_hf *t, const int32_t *ids, size_t n, char **text,
                                size_t *len);

#endif
