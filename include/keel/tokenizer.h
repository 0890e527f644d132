/* tokenizer (part of the data module): SentencePiece .model reader and a BPE
 * encoder/decoder with byte fallback that reproduces SentencePiece's ids.
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

/* Load a SentencePiece model file. On bad input (missing, not a ModelProto,
 * truncated, inconsistent vocabulary, or not a BPE model: unigram, word and
 * char models are rejected) prints one line naming the file and what is wrong,
 * sets *out to NULL and returns KEEL_ERR_INPUT. Caller owns *out. A loaded
 * tokenizer is read-only: encode and decode may run on many threads at once. */
keel_status keel_tokenizer_load(const char *path, keel_tokenizer **out);
/* The same for a model already in memory: bytes[0, len) (copied), `name`
 * standing for the file in messages. keel_tokenizer_load reads the file and
 * parses it with this (tests/fuzz/fuzz_tokenizer_model.c fuzzes it). */
keel_status keel_tokenizer_load_buffer(const void *bytes, size_t len, const char *name,
                                       keel_tokenizer **out);
void keel_tokenizer_free(keel_tokenizer *tok);
int keel_tokenizer_vocab_size(const keel_tokenizer *tok);
int keel_tokenizer_bos_id(const keel_tokenizer *tok); /* -1 if none */
int keel_tokenizer_eos_id(const keel_tokenizer *tok); /* -1 if none */

/* Encode `len` bytes of UTF-8 text (one line; no newline handling needed by the
 * caller beyond what SentencePiece itself does). Ids are appended to *out
 * after clearing it. Same ids as `spm_encode --output_format=id`. Fails
 * (KEEL_ERR_INPUT, one line) only for a line over 2 GiB once normalized. */
keel_status keel_tokenizer_encode(const keel_tokenizer *tok, const char *text, size_t len,
                                  keel_ids *out);
/* Decode ids to text; *text is malloc'd and NUL-terminated, caller frees it
 * (free or keel_free). Same text as `spm_decode --input_format=id`. An id
 * outside [0, vocab) prints one line and returns KEEL_ERR_INPUT. */
keel_status keel_tokenizer_decode(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **text);
/* As keel_tokenizer_decode, and sets *len to the text's length in bytes: the
 * text can hold NUL bytes (from byte pieces like <0x00>), which a plain
 * C string would cut short. */
keel_status keel_tokenizer_decode_len(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                      char **text, size_t *len);

#endif
