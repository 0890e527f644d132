/* tokenizer (part of the data module): SentencePiece .model reader and a BPE
 * encoder/decoder with byte fallback that reproduces SentencePiece's ids, and
 * Hugging Face tokenizer.json (BPE) that reproduces the tokenizers library's.
 *
 *     keel_tokenizer *tok;
 *     if (keel_tokenizer_load("tok.model", &tok) != KEEL_OK) return 2;
 *     keel_ids ids = {0};
 *     keel_tokenizer_encode(tok, "Hello world", 11, &ids);   // no BOS added
 *     ...
 *     keel_ids_free(&ids);
 *     keel_tokenizer_free(tok);
 */
#ifndef KEEL_TOKENIZER_H
#define KEEL_TOKENIZER_H

#include "keel/core.h"

typedef struct keel_tokenizer keel_tokenizer;

/* A growable array of token ids; zero-initialise, reuse, free with keel_ids_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} keel_ids;
void keel_ids_free(keel_ids *ids);

/* Load a SentencePiece model file, or a Hugging Face tokenizer.json (told
 * apart by the content: JSON starts with '{'; the tokenizer_config.json
 * beside it, when there is one, gives BOS and EOS — bos_token / eos_token —
 * else they are -1). On bad input (missing, not a ModelProto, truncated,
 * inconsistent vocabulary, or not a BPE model: unigram, word and char models,
 * WordPiece and Unigram tokenizer.json and components keel does not
 * reproduce are rejected) prints one line naming the file and what is wrong,
 * sets *out to NULL and returns KEEL_ERR_INPUT. Caller owns *out. A loaded
 * tokenizer is read-only: encode and decode may run on many threads at once. */
keel_status keel_tokenizer_load(const char *path, keel_tokenizer **out);
/* The same for a model already in memory: bytes[0, len) (copied), `name`
 * standing for the file in messages. keel_tokenizer_load reads the file and
 * parses it with this (tests/fuzz/fuzz_tokenizer_model.c fuzzes it). */
keel_status keel_tokenizer_load_buffer(const void *bytes, size_t len, const char *name,
                                       keel_tokenizer **out);
/* The same with the tokenizer_config.json that goes with a tokenizer.json in
 * config[0, config_len) (copied; NULL: none, as for a file with no config
 * beside it; ignored for a SentencePiece model), config_name standing for it
 * in messages: what keel_tokenizer_load does with the two files, for bytes
 * already read (an import checks exactly the bytes it carries). */
keel_status keel_tokenizer_load_buffers(const void *bytes, size_t len, const char *name, const void *config,
                                        size_t config_len, const char *config_name, keel_tokenizer **out);
void keel_tokenizer_free(keel_tokenizer *tok);
int keel_tokenizer_vocab_size(const keel_tokenizer *tok);
int keel_tokenizer_bos_id(const keel_tokenizer *tok); /* -1 if none */
int keel_tokenizer_eos_id(const keel_tokenizer *tok); /* -1 if none */
/* The id of `token` (NUL-ended) as a special token — one that encoding
 * takes whole wherever the text holds it and that leaves the text beside it
 * as it is, so a chat template's text can be encoded piece by piece between
 * such tokens to the ids of the whole: for a tokenizer.json an added token
 * with that content, not normalized, without lstrip, rstrip or single_word;
 * for a .model a control or user-defined piece. -1 when there is none. */
int keel_tokenizer_special_id(const keel_tokenizer *tok, const char *token);
/* The name Hugging Face gives a file of this kind: "tokenizer.model"
 * (SentencePiece) or "tokenizer.json" (a string literal). */
const char *keel_tokenizer_file_name(const keel_tokenizer *tok);
/* The tokenizer_config.json in the directory of the tokenizer file at path
 * (a new string: keel_free), or NULL when there is none. */
char *keel_tokenizer_config_path(const char *path);

/* Encode `len` bytes of UTF-8 text (one line; no newline handling needed by the
 * caller beyond what SentencePiece itself does). Ids are appended to *out
 * after clearing it. Same ids as `spm_encode --output_format=id`, or for a
 * tokenizer.json as tokenizers' encode(text, add_special_tokens=False) on the
 * text read with errors="replace" (special tokens in the text are matched).
 * Fails (KEEL_ERR_INPUT, one line) only for a line over 2 GiB once
 * normalized (or a tokenizer.json regex hitting PCRE2's match limit). */
keel_status keel_tokenizer_encode(const keel_tokenizer *tok, const char *text, size_t len,
                                  keel_ids *out);
/* Decode ids to text; *text is malloc'd and NUL-terminated, caller frees it
 * (free or keel_free). Same text as `spm_decode --input_format=id` (for a
 * tokenizer.json: decode(ids, skip_special_tokens=False)). An id outside
 * [0, vocab) prints one line and returns KEEL_ERR_INPUT. */
keel_status keel_tokenizer_decode(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **text);
/* As keel_tokenizer_decode, and sets *len to the text's length in bytes: the
 * text can hold NUL bytes (from byte pieces like <0x00>), which a plain
 * C string would cut short. */
keel_status keel_tokenizer_decode_len(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                      char **text, size_t *len);

#endif
