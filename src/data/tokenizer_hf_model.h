/* data/tokenizer_hf_model.h: a loaded tokenizer.json — what
 * tokenizer_hf_load.c fills from the file and tokenizer_hf.c runs. Internal to
 * the data module; everyone else goes through data/tokenizer_hf.h. */
#ifndef KEEL_DATA_TOKENIZER_HF_MODEL_H
#define KEEL_DATA_TOKENIZER_HF_MODEL_H

#include <pthread.h>
#include <stdint.h>

#include "data/tokenizer_hf.h"
#include "data/tokenizer_hf_regex.h"

#define MAX_STEPS 16 /* normalizer / pre-tokenizer / decoder steps, nested sequences flattened */

typedef struct {
    uint32_t off, len; /* bytes of tokenizer_hf.strings */
} span;
#define NO_SPAN UINT32_MAX /* a span's len when there is none */

/* String -> int32 map, open addressing; slots hold entry index + 1 (0 = empty). */
typedef struct {
    uint32_t *slots;
    uint32_t mask;
    span *keys;
    int32_t *vals;
    uint32_t n, cap;
} str_map;

/* (left id, right id) -> (rank, new id): the merges. */
typedef struct {
    uint64_t key; /* left << 32 | right; EMPTY_KEY = free */
    uint32_t rank;
    int32_t new_id;
} merge_slot;
#define EMPTY_KEY UINT64_MAX

/* A literal or a regex, as Split, Replace and the Metaspace split use. */
typedef struct {
    hf_regex *re; /* NULL: the literal */
    span literal;
} pattern;

typedef enum { NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct {
    norm_kind kind;
    pattern pat;  /* Replace */
    span content; /* Prepend: what; Replace: by what */
} norm_step;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE } pre_kind;
typedef enum { ISOLATED, REMOVED, MERGED_WITH_PREVIOUS, MERGED_WITH_NEXT, CONTIGUOUS } split_behavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;
typedef struct {
    pre_kind kind;
    pattern pat; /* Split */
    split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    span replacement;                 /* Metaspace */
    prepend_scheme scheme;
    bool split;
} pre_step;

typedef enum { DEC_BYTE_LEVEL, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE } dec_kind;
typedef struct {
    dec_kind kind;
    pattern pat;     /* Replace */
    span content;    /* Replace: by what; Strip: the character; Metaspace: the replacement */
    size_t start, stop; /* Strip */
    prepend_scheme scheme; /* Metaspace */
} dec_step;

typedef struct {
    span content;
    span cached;  /* the normalized form kept for this id (normalized_cache); len NO_SPAN = none */
    span pattern; /* what the text is searched for: cached or content */
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
} added_token;

/* Added tokens of one kind (normalized or not), by first byte then longest
 * first: a leftmost-longest search without an automaton. */
typedef struct {
    uint32_t *order; /* indexes of tokenizer_hf.added */
    uint32_t n;
    uint32_t first[257]; /* order[first[b], first[b+1]) start with byte b */
} match_set;

struct encode_ctx;
typedef struct {
    pthread_mutex_t lock;
    struct encode_ctx *ctx; /* made on first use */
} ctx_slot;

struct tokenizer_hf {
    char *name;
    char *strings; /* every token, pattern and literal, NUL-terminated, spans into it */
    size_t strings_len, strings_cap;

    str_map vocab;          /* the model's */
    merge_slot *merges;
    uint64_t merges_mask;
    int32_t *char_ids;      /* (0x800) id of each 1- and 2-byte character, -1 = none */
    int32_t byte_ids[256];  /* <0xNN>, -1 = none */
    int32_t unk_id;         /* -1 = no unk_token; -2 = an unk_token the vocabulary lacks */
    span unk_token;
    bool byte_fallback, fuse_unk, ignore_merges;

    added_token *added;
    uint32_t n_added;
    match_set raw_set, norm_set;
    hf_regex *word_re, *space_re; /* single_word, lstrip / rstrip: Rust's \w and \s */

    norm_step norm[MAX_STEPS];
    int n_norm;
    pre_step pre[MAX_STEPS];
    int n_pre;
    dec_step dec[MAX_STEPS];
    int n_dec;
    bool has_decoder;
    hf_regex *gpt2_re; /* ByteLevel's use_regex */
    hf_regex *regexes[4 * MAX_STEPS];
    int n_regexes;

    char byte_chars[256][2]; /* ByteLevel: byte -> its character's UTF-8 */
    uint8_t byte_chars_len[256];
    int16_t char_bytes[0x144]; /* ByteLevel decoding: code point -> byte, -1 = none */

    span *id_str; /* (V) the text each id decodes from; len UINT32_MAX = no token */
    int32_t V;
    int32_t bos_id, eos_id;

    ctx_slot *slots;
    unsigned n_slots;
};

static inline const char *str_of(const tokenizer_hf *t, span s) { return t->strings + s.off; }

/* Bytes of the character at s[0] of valid UTF-8. */
static inline size_t char_len(const char *s) {
    uint8_t c = (uint8_t)s[0];
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

/* ---- what tokenizer_hf.c lends the loader ---- */

/* The id of s[0, n) in m (keys are spans of strings), or -1. */
int32_t hf_map_get(const str_map *m, const char *strings, const char *s, size_t n);
/* key -> val; a key already there takes the new value (serde's HashMap). */
void hf_map_put(str_map *m, const char *strings, span key, int32_t val);
void hf_map_free(str_map *m);
/* Offset of the first byte of s[0, n) that is not well-formed UTF-8, or n. */
size_t hf_utf8_valid_prefix(const char *s, size_t n);
/* t's normalizer on s[0, n): a new buffer (*out, keel_free, *out_n bytes),
 * or false with the reason in why (a regex that gave up). */
bool hf_normalize(const tokenizer_hf *t, const char *s, size_t n, char **out, size_t *out_n, char *why,
                  size_t why_n);

#endif
