/* data/tokenizer.c: SentencePiece .model reader and BPE encoder/decoder that
 * gives the same ids and text as spm_encode / spm_decode (SentencePiece 0.1.97).
 *
 * What is reproduced, step by step as SentencePiece does it:
 *   - The model file: a protobuf ModelProto, parsed here by hand (pieces,
 *     trainer_spec, normalizer_spec, denormalizer_spec). Models are validated
 *     like ModelInterface::InitializePieces does (one unk, no duplicates, all
 *     256 byte pieces when byte_fallback is on).
 *   - Normalization (Normalizer::Normalize): the precompiled charsmap — a
 *     Darts-clone double-array trie whose values index a blob of replacement
 *     strings — applied longest-match-first, so nmt_nfkc, nfkc, nmt_nfkc_cf,
 *     nfkc_cf and custom --normalization_rule_tsv models all work, as does
 *     identity (no charsmap). Then add_dummy_prefix, remove_extra_whitespaces,
 *     escape_whitespaces (' ' -> U+2581), treat_whitespace_as_suffix,
 *     malformed UTF-8 -> U+FFFD one byte at a time, and user-defined symbols
 *     passed through untouched.
 *   - Encoding (bpe_model.cc): characters (user-defined symbols are frozen
 *     single symbols), then repeatedly merge the adjacent pair whose joined
 *     piece has the highest score (ties: leftmost) using a heap of candidate
 *     pairs over a linked list of symbols — O(n log n) per line. UNUSED pieces
 *     are re-split into the pieces they were merged from. Unknown pieces
 *     become <0xNN> byte pieces with byte_fallback, otherwise one unk id per
 *     run of unknown pieces.
 *   - Decoding (SentencePieceProcessor::Decode): control ids vanish, unk ids
 *     print unk_surface, runs of byte pieces are re-assembled as UTF-8 (each
 *     invalid byte -> U+FFFD), U+2581 -> ' ', the dummy-prefix space at the
 *     start is dropped (every leading space when remove_extra_whitespaces),
 *     then the denormalizer charsmap (if the model has one) runs.
 * tests/data/tokenizer_matches_spm.sh checks all this against the spm tools.
 * Not supported (rejected at load with a message): unigram, word and char
 * models. Sampling / BPE-dropout and extra options (bos/eos/reverse) are not
 * offered; callers add BOS/EOS ids themselves.
 *
 * A file that is JSON (a Hugging Face tokenizer.json) is handed to
 * tokenizer_hf.c whole; every public function below then dispatches to it. */
#include "keel/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "data/tokenizer_hf.h"

/* ---- model representation ------------------------------------------------ */

/* ModelProto.SentencePiece.Type */
enum {
    PIECE_NORMAL = 1,
    PIECE_UNKNOWN = 2,
    PIECE_CONTROL = 3,
    PIECE_USER_DEFINED = 4,
    PIECE_UNUSED = 5,
    PIECE_BYTE = 6,
};

/* TrainerSpec.ModelType */
enum { MODEL_UNIGRAM = 1, MODEL_BPE, MODEL_WORD, MODEL_CHAR };

static const char SPACE_SYMBOL[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's visible space */
static const char REPLACEMENT_CHAR[] = "\xef\xbf\xbd"; /* U+FFFD */

typedef struct {
    const char *str; /* points into keel_tokenizer.file; not NUL-terminated */
    uint32_t len;
    float score;
    uint8_t type;
} piece;

/* Open-addressing map from piece string to id; slots hold ids, -1 = empty. */
typedef struct {
    int32_t *slots;
    uint32_t mask;
} piece_table;

/* One normalizer (NormalizerSpec): flags plus an optional precompiled charsmap. */
typedef struct {
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    uint32_t *trie;      /* Darts-clone double-array units; NULL = identity */
    size_t trie_units;
    const char *repl;    /* NUL-separated replacement strings the trie values index */
    size_t repl_len;
} norm_spec;

struct keel_tokenizer {
    tokenizer_hf *hf;       /* a tokenizer.json: everything else is unused */
    char *path;             /* for messages */
    uint8_t *file;          /* the whole .model file; pieces point into it */
    piece *pieces;          /* (V) */
    int n_pieces;           /* V */
    piece_table mergeable;  /* NORMAL, USER_DEFINED, UNUSED: what BPE merges may form */
    piece_table reserved;   /* UNKNOWN, CONTROL, BYTE: looked up first by piece_to_id */
    uint32_t max_mergeable_len;
    uint32_t *user_lens;    /* distinct USER_DEFINED piece lengths, longest first */
    int n_user_lens;
    int32_t unk_id, bos_id, eos_id;
    int32_t byte_ids[256];  /* id of <0xNN>; valid when byte_fallback */
    bool byte_fallback, ws_as_suffix, has_unused;
    const char *unk_surface;
    size_t unk_surface_len;
    norm_spec normalizer;
    norm_spec denormalizer; /* trie == NULL: none */
};

/* ---- small growable buffers ----------------------------------------------- */

/* A model's charsmap can replace one byte by thousands, so the text a line
 * becomes is bounded by STRBUF_MAX instead of by the memory: past it (or
 * when memory runs out) the buffer stops growing and is marked failed, and
 * the caller's one line says so. */
#define STRBUF_MAX ((size_t)1 << 32)
typedef struct {
    char *p;
    size_t n, cap;
    bool failed;
} strbuf;

static bool strbuf_reserve(strbuf *b, size_t extra) {
    if (b->failed) return false;
    if (extra <= b->cap - b->n) return true;
    if (extra > STRBUF_MAX - b->n) return !(b->failed = true);
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return !(b->failed = true);
    b->p = p;
    b->cap = cap;
    return true;
}

static void strbuf_append(strbuf *b, const char *s, size_t n) {
    if (!strbuf_reserve(b, n + 1)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void ids_push(keel_ids *out, int32_t id) {
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 64;
        out->ids = keel_xrealloc(out->ids, out->cap * sizeof *out->ids, "token ids");
    }
    out->ids[out->n++] = id;
}

void keel_ids_free(keel_ids *ids) {
    keel_free(ids->ids);
    *ids = (keel_ids){0};
}

/* ---- UTF-8 (SentencePiece's string_util::DecodeUTF8 rules) -------------- */

static bool is_trail(uint8_t c) { return (c & 0xC0) == 0x80; }
static bool is_valid_codepoint(uint32_t c) { return c < 0xD800 || (c >= 0xE000 && c <= 0x10FFFF); }

/* Length of the valid UTF-8 character at s, or 0 if the bytes are malformed
 * (overlong, surrogate, truncated). A literal U+FFFD counts as valid. */
static size_t utf8_char_len(const char *str, size_t n) {
    const uint8_t *s = (const uint8_t *)str;
    if (s[0] < 0x80) return 1;
    if (n >= 2 && (s[0] & 0xE0) == 0xC0) {
        uint32_t cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
        if (is_trail(s[1]) && cp >= 0x80 && is_valid_codepoint(cp)) return 2;
    } else if (n >= 3 && (s[0] & 0xF0) == 0xE0) {
        uint32_t cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
        if (is_trail(s[1]) && is_trail(s[2]) && cp >= 0x800 && is_valid_codepoint(cp)) return 3;
    } else if (n >= 4 && (s[0] & 0xF8) == 0xF0) {
        uint32_t cp = ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) |
                      (s[3] & 0x3Fu);
        if (is_trail(s[1]) && is_trail(s[2]) && is_trail(s[3]) && cp >= 0x10000 &&
            is_valid_codepoint(cp))
            return 4;
    }
    return 0;
}

/* Bytes of the character starting at s judged by its lead byte alone
 * (string_util::OneCharLen), clipped to what is left. */
static size_t one_char_len(const char *s, size_t n) {
    static const uint8_t len_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    size_t len = len_by_high_nibble[(uint8_t)s[0] >> 4];
    return len < n ? len : n;
}

/* ---- piece lookup ------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) { return XXH3_64bits(s, n); }

static void table_init(piece_table *t, int n_pieces) {
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_pieces) cap *= 2;
    t->slots = keel_xmalloc(cap * sizeof *t->slots, "tokenizer piece table");
    memset(t->slots, 0xff, cap * sizeof *t->slots);
    t->mask = cap - 1;
}

static int32_t table_find(const piece_table *t, const piece *pieces, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->mask;; i = (i + 1) & t->mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (pieces[id].len == n && memcmp(pieces[id].str, s, n) == 0) return id;
    }
}

/* Inserts id; returns false if its string is already present. */
static bool table_insert(piece_table *t, const piece *pieces, int32_t id) {
    const piece *p = &pieces[id];
    uint32_t i = (uint32_t)hash_bytes(p->str, p->len) & t->mask;
    for (; t->slots[i] >= 0; i = (i + 1) & t->mask) {
        const piece *q = &pieces[t->slots[i]];
        if (q->len == p->len && memcmp(q->str, p->str, p->len) == 0) return false;
    }
    t->slots[i] = id;
    return true;
}

/* ModelInterface::PieceToId: reserved pieces first, then mergeable, else unk. */
static int32_t piece_to_id(const keel_tokenizer *tok, const char *s, size_t n) {
    int32_t id = table_find(&tok->reserved, tok->pieces, s, n);
    if (id < 0) id = table_find(&tok->mergeable, tok->pieces, s, n);
    return id < 0 ? tok->unk_id : id;
}

/* Longest user-defined symbol that prefixes s (PrefixMatcher), 0 if none. */
static size_t match_user_symbol(const keel_tokenizer *tok, const char *s, size_t n) {
    for (int k = 0; k < tok->n_user_lens; k++) {
        size_t len = tok->user_lens[k];
        if (len > n) continue;
        int32_t id = table_find(&tok->mergeable, tok->pieces, s, len);
        if (id >= 0 && tok->pieces[id].type == PIECE_USER_DEFINED) return len;
    }
    return 0;
}

/* ---- normalization ------------------------------------------------------- */

/* Darts-clone DoubleArrayUnit accessors. */
static bool unit_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }
static uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* Longest charsmap rule matching a prefix of s (Darts commonPrefixSearch).
 * Returns the bytes it consumes (0 = no rule) and sets *out to its
 * replacement. Every index is bounds-checked so a damaged trie cannot read
 * outside the model; a rule pointing outside the blob counts as no rule. */
static size_t charsmap_match(const norm_spec *ns, const char *str, size_t n, const char **out,
                             size_t *out_len) {
    const uint8_t *s = (const uint8_t *)str;
    const uint32_t *a = ns->trie;
    size_t node = unit_offset(a[0]);
    size_t best_len = 0;
    uint32_t best_value = 0;
    for (size_t i = 0; i < n; i++) {
        node ^= s[i];
        if (node >= ns->trie_units) break;
        uint32_t unit = a[node];
        if (unit_label(unit) != s[i]) break;
        node ^= unit_offset(unit);
        if (node >= ns->trie_units) break;
        if (unit_has_leaf(unit)) {
            best_len = i + 1;
            best_value = unit_value(a[node]);
        }
    }
    if (best_len == 0 || best_value >= ns->repl_len) return 0;
    const char *r = ns->repl + best_value;
    const char *nul = memchr(r, '\0', ns->repl_len - best_value);
    if (!nul) return 0;
    *out = r;
    *out_len = (size_t)(nul - r);
    return best_len;
}

/* One normalization step (Normalizer::NormalizePrefix): returns the input
 * bytes consumed and points *out (length *out_len) at what they become. */
static size_t normalize_prefix(const keel_tokenizer *tok, const norm_spec *ns, bool user_symbols,
                               const char *s, size_t n, const char **out, size_t *out_len) {
    if (user_symbols) {
        size_t len = match_user_symbol(tok, s, n);
        if (len) {
            *out = s;
            *out_len = len;
            return len;
        }
    }
    if (ns->trie) {
        size_t len = charsmap_match(ns, s, n, out, out_len);
        if (len) return len;
    }
    size_t len = utf8_char_len(s, n);
    if (len == 0) { /* malformed: U+FFFD for one byte */
        *out = REPLACEMENT_CHAR;
        *out_len = 3;
        return 1;
    }
    *out = s;
    *out_len = len;
    return len;
}

static void append_space(const norm_spec *ns, strbuf *out) {
    if (ns->escape_whitespaces)
        strbuf_append(out, SPACE_SYMBOL, 3);
    else
        strbuf_append(out, " ", 1);
}

static bool ends_with(const strbuf *b, const char *s, size_t n) {
    return b->n >= n && memcmp(b->p + b->n - n, s, n) == 0;
}

/* Normalizer::Normalize: text -> *out (cleared first). */
static void normalize(const keel_tokenizer *tok, const norm_spec *ns, bool user_symbols,
                      bool ws_as_suffix, const char *in, size_t n, strbuf *out) {
    out->n = 0;
    const char *sp;
    size_t sp_len;
    if (ns->remove_extra_whitespaces) { /* drop leading spaces */
        while (n > 0) {
            size_t used = normalize_prefix(tok, ns, user_symbols, in, n, &sp, &sp_len);
            if (sp_len != 1 || sp[0] != ' ') break;
            in += used;
            n -= used;
        }
    }
    if (n == 0) return;
    if (n < STRBUF_MAX / 4) strbuf_reserve(out, 3 * n + 8); /* the usual growth at most, at once */
    if (!ws_as_suffix && ns->add_dummy_prefix) append_space(ns, out);

    bool is_prev_space = ns->remove_extra_whitespaces;
    while (n > 0) {
        size_t used = normalize_prefix(tok, ns, user_symbols, in, n, &sp, &sp_len);
        while (is_prev_space && sp_len > 0 && sp[0] == ' ') {
            sp++;
            sp_len--;
        }
        if (sp_len > 0) {
            for (size_t i = 0; i < sp_len; i++) {
                if (ns->escape_whitespaces && sp[i] == ' ')
                    strbuf_append(out, SPACE_SYMBOL, 3);
                else
                    strbuf_append(out, &sp[i], 1);
            }
            is_prev_space = sp[sp_len - 1] == ' ';
        }
        in += used;
        n -= used;
        if (!ns->remove_extra_whitespaces) is_prev_space = false;
    }
    if (ns->remove_extra_whitespaces) { /* drop trailing spaces */
        const char *space = ns->escape_whitespaces ? SPACE_SYMBOL : " ";
        size_t space_len = strlen(space);
        while (ends_with(out, space, space_len)) out->n -= space_len;
    }
    if (ws_as_suffix && ns->add_dummy_prefix) append_space(ns, out);
}

/* ---- BPE ----------------------------------------------------------------- */

typedef struct {
    int32_t prev, next; /* -1 at either end */
    uint32_t start, len; /* bytes of the normalized text; len 0 = merged away */
    bool frozen;         /* user-defined symbol: never merged */
} symbol;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t len; /* left.len + right.len when pushed; a mismatch marks it stale */
} merge_cand;

/* For UNUSED pieces: the pair that last formed them (bpe_model.cc rev_merge). */
typedef struct {
    int32_t id; /* -1 = empty slot */
    uint32_t left_start, left_len, right_start, right_len;
} rev_merge;

typedef struct {
    const keel_tokenizer *tok;
    const char *text;   /* normalized */
    symbol *sym;
    merge_cand *heap;
    size_t heap_n, heap_cap;
    rev_merge *rev;     /* open addressing by piece id; NULL unless the model has UNUSED pieces */
    uint32_t rev_mask, rev_n;
    bool prev_unk;      /* for merging runs of unk ids */
} bpe_state;

/* Heap order: higher score first, then leftmost (bpe_model.cc's comparator). */
static bool cand_before(const merge_cand *a, const merge_cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(bpe_state *st, merge_cand c) {
    if (st->heap_n == st->heap_cap) {
        st->heap_cap = st->heap_cap ? st->heap_cap * 2 : 64;
        st->heap = keel_xrealloc(st->heap, st->heap_cap * sizeof *st->heap, "BPE merge heap");
    }
    size_t i = st->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &st->heap[parent])) break;
        st->heap[i] = st->heap[parent];
        i = parent;
    }
    st->heap[i] = c;
}

static merge_cand heap_pop(bpe_state *st) {
    merge_cand top = st->heap[0];
    merge_cand last = st->heap[--st->heap_n];
    size_t i = 0, n = st->heap_n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && cand_before(&st->heap[child + 1], &st->heap[child])) child++;
        if (!cand_before(&st->heap[child], &last)) break;
        st->heap[i] = st->heap[child];
        i = child;
    }
    if (n > 0) st->heap[i] = last;
    return top;
}

static rev_merge *rev_slot(const bpe_state *st, int32_t id) {
    uint32_t i = ((uint32_t)id * 2654435761u) & st->rev_mask;
    while (st->rev[i].id >= 0 && st->rev[i].id != id) i = (i + 1) & st->rev_mask;
    return &st->rev[i];
}

static void rev_put(bpe_state *st, int32_t id, const symbol *l, const symbol *r) {
    if (2 * (st->rev_n + 1) > st->rev_mask + 1) { /* grow */
        rev_merge *old = st->rev;
        uint32_t old_cap = st->rev ? st->rev_mask + 1 : 0;
        uint32_t cap = old_cap ? old_cap * 2 : 64;
        st->rev = keel_xmalloc(cap * sizeof *st->rev, "BPE reverse merges");
        for (uint32_t i = 0; i < cap; i++) st->rev[i].id = -1;
        st->rev_mask = cap - 1;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i].id >= 0) *rev_slot(st, old[i].id) = old[i];
        keel_free(old);
    }
    rev_merge *slot = rev_slot(st, id);
    if (slot->id < 0) st->rev_n++;
    *slot = (rev_merge){id, l->start, l->len, r->start, r->len};
}

/* Queue the merge of symbols left and right if their join is a piece. */
static void maybe_add_pair(bpe_state *st, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const symbol *l = &st->sym[left], *r = &st->sym[right];
    if (l->frozen || r->frozen) return;
    uint32_t len = l->len + r->len;
    if (len > st->tok->max_mergeable_len) return;
    const keel_tokenizer *tok = st->tok;
    int32_t id = table_find(&tok->mergeable, tok->pieces, st->text + l->start, len);
    if (id < 0) return;
    heap_push(st, (merge_cand){tok->pieces[id].score, left, right, len});
    if (tok->pieces[id].type == PIECE_UNUSED) rev_put(st, id, l, r);
}

/* Append the ids of one final piece (SentencePieceProcessor::
 * PopulateSentencePieceText): bytes for unknowns under byte_fallback,
 * otherwise one unk for a whole run of unknown pieces. */
static void emit_piece(bpe_state *st, const char *s, uint32_t len, int32_t id, keel_ids *out) {
    const keel_tokenizer *tok = st->tok;
    bool is_unk = tok->pieces[id].type == PIECE_UNKNOWN;
    if (is_unk && tok->byte_fallback) {
        for (uint32_t i = 0; i < len; i++) ids_push(out, tok->byte_ids[(uint8_t)s[i]]);
    } else if (!(is_unk && st->prev_unk)) {
        ids_push(out, id);
    }
    st->prev_unk = is_unk;
}

/* Emit a final symbol, splitting UNUSED pieces back into what formed them. */
static void resegment(bpe_state *st, uint32_t start, uint32_t len, keel_ids *out) {
    const keel_tokenizer *tok = st->tok;
    const char *s = st->text + start;
    int32_t id = piece_to_id(tok, s, len);
    if (tok->pieces[id].type == PIECE_UNUSED && st->rev) {
        const rev_merge *m = rev_slot(st, id);
        if (m->id == id) {
            resegment(st, m->left_start, m->left_len, out);
            resegment(st, m->right_start, m->right_len, out);
            return;
        }
    }
    emit_piece(st, s, len, id, out);
}

/* false: no memory for the symbols of a line this long. */
static bool bpe_encode(const keel_tokenizer *tok, const char *text, size_t n, keel_ids *out) {
    bpe_state st = {.tok = tok, .text = text};
    st.sym = keel_try_malloc(n * sizeof *st.sym);
    if (!st.sym) return false;
    int32_t n_sym = 0;
    for (size_t pos = 0; pos < n; n_sym++) {
        size_t len = match_user_symbol(tok, text + pos, n - pos);
        bool frozen = len > 0;
        if (!frozen) len = one_char_len(text + pos, n - pos);
        st.sym[n_sym] = (symbol){n_sym - 1, -1, (uint32_t)pos, (uint32_t)len, frozen};
        if (n_sym > 0) st.sym[n_sym - 1].next = n_sym;
        pos += len;
    }
    for (int32_t i = 1; i < n_sym; i++) maybe_add_pair(&st, i - 1, i);

    while (st.heap_n > 0) {
        merge_cand c = heap_pop(&st);
        symbol *l = &st.sym[c.left], *r = &st.sym[c.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != c.len) continue; /* stale */
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) st.sym[r->next].prev = c.left;
        r->len = 0;
        maybe_add_pair(&st, l->prev, c.left);
        maybe_add_pair(&st, c.left, l->next);
    }

    for (int32_t i = 0; i >= 0 && n_sym > 0; i = st.sym[i].next)
        resegment(&st, st.sym[i].start, st.sym[i].len, out);
    keel_free(st.sym);
    keel_free(st.heap);
    keel_free(st.rev);
    return true;
}

/* ---- protobuf wire format ------------------------------------------------ */

typedef struct {
    const uint8_t *p, *end;
} pb_reader;

typedef struct {
    uint32_t number;
    uint32_t wire;      /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t varint;
    const uint8_t *data; /* fixed32/64 and length-delimited payloads */
    size_t len;
} pb_field;

static bool pb_varint(pb_reader *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return false;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* Reads the next field: 1 = got one, 0 = end of message, -1 = malformed. */
static int pb_next(pb_reader *r, pb_field *f) {
    *f = (pb_field){0};
    if (r->p == r->end) return 0;
    uint64_t key, len;
    if (!pb_varint(r, &key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return -1;
    f->number = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    size_t left = (size_t)(r->end - r->p);
    switch (f->wire) {
    case 0: return pb_varint(r, &f->varint) ? 1 : -1;
    case 1: len = 8; break;
    case 5: len = 4; break;
    case 2:
        if (!pb_varint(r, &len)) return -1;
        left = (size_t)(r->end - r->p);
        break;
    default: return -1; /* groups (3, 4) and 6, 7 never appear in a ModelProto */
    }
    if (len > left) return -1;
    f->data = r->p;
    f->len = (size_t)len;
    r->p += len;
    return 1;
}

static float pb_float(const pb_field *f) {
    uint32_t bits = (uint32_t)f->data[0] | (uint32_t)f->data[1] << 8 |
                    (uint32_t)f->data[2] << 16 | (uint32_t)f->data[3] << 24;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* ---- ModelProto ---------------------------------------------------------- */

typedef struct {
    const uint8_t *data;
    size_t len;
    bool present;
} pb_bytes;

typedef struct {
    pb_bytes name, charsmap;
    bool add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    bool present;
} normalizer_proto;

typedef struct {
    uint64_t model_type;
    bool byte_fallback, ws_as_suffix;
    pb_bytes unk_piece, bos_piece, eos_piece, unk_surface;
} trainer_proto;

typedef struct {
    piece *pieces;
    int n_pieces, cap;
    trainer_proto trainer;
    normalizer_proto normalizer, denormalizer;
} model_proto;

/* Parse failures carry a reason for the one-line error message. */
typedef struct {
    char why[200];
} parse_error;

static bool failf(parse_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool failf(parse_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->why, sizeof err->why, fmt, ap);
    va_end(ap);
    return false;
}

static bool want_wire(const pb_field *f, uint32_t wire, const char *msg, parse_error *err) {
    if (f->wire == wire) return true;
    return failf(err, "field %u of %s has wire type %u, expected %u", f->number, msg, f->wire,
                 wire);
}

/* The piece tables hold ids as int32 and size themselves at 2 slots a piece. */
#define MAX_PIECES (1 << 28)

static bool parse_piece(const uint8_t *data, size_t len, model_proto *m, parse_error *err) {
    piece p = {.str = "", .len = 0, .score = 0.0f, .type = PIECE_NORMAL};
    pb_reader r = {data, data + len};
    pb_field f;
    int got;
    while ((got = pb_next(&r, &f)) > 0) {
        if (f.number == 1) {
            if (!want_wire(&f, 2, "a piece", err)) return false;
            if (f.len > UINT32_MAX) return failf(err, "piece %d is longer than 4 GiB", m->n_pieces);
            p.str = (const char *)f.data;
            p.len = (uint32_t)f.len;
        } else if (f.number == 2) {
            if (!want_wire(&f, 5, "a piece", err)) return false;
            p.score = pb_float(&f);
        } else if (f.number == 3) {
            if (!want_wire(&f, 0, "a piece", err)) return false;
            if (f.varint < PIECE_NORMAL || f.varint > PIECE_BYTE)
                return failf(err, "piece %d has unknown type %llu", m->n_pieces,
                             (unsigned long long)f.varint);
            p.type = (uint8_t)f.varint;
        }
    }
    if (got < 0) return failf(err, "piece %d is not valid protobuf", m->n_pieces);
    if (m->n_pieces == MAX_PIECES) return failf(err, "has more than %d pieces", MAX_PIECES);
    if (m->n_pieces == m->cap) {
        int cap = m->cap ? m->cap * 2 : 1024;
        piece *pieces = realloc(m->pieces, (size_t)cap * sizeof *m->pieces);
        if (!pieces) return failf(err, "has more pieces (%d) than the memory holds", m->n_pieces);
        m->pieces = pieces;
        m->cap = cap;
    }
    m->pieces[m->n_pieces++] = p;
    return true;
}

static bool parse_trainer(const uint8_t *data, size_t len, trainer_proto *t, parse_error *err) {
    pb_reader r = {data, data + len};
    pb_field f;
    int got;
    while ((got = pb_next(&r, &f)) > 0) {
        pb_bytes *str = NULL;
        switch (f.number) {
        case 3: /* model_type */
        case 24: /* treat_whitespace_as_suffix */
        case 35: /* byte_fallback */
            if (!want_wire(&f, 0, "trainer_spec", err)) return false;
            if (f.number == 3) t->model_type = f.varint;
            if (f.number == 24) t->ws_as_suffix = f.varint != 0;
            if (f.number == 35) t->byte_fallback = f.varint != 0;
            break;
        case 44: str = &t->unk_surface; break;
        case 45: str = &t->unk_piece; break;
        case 46: str = &t->bos_piece; break;
        case 47: str = &t->eos_piece; break;
        default: break;
        }
        if (str) {
            if (!want_wire(&f, 2, "trainer_spec", err)) return false;
            *str = (pb_bytes){f.data, f.len, true};
        }
    }
    if (got < 0) return failf(err, "trainer_spec is not valid protobuf");
    return true;
}

static bool parse_normalizer(const uint8_t *data, size_t len, normalizer_proto *ns,
                             const char *which, parse_error *err) {
    pb_reader r = {data, data + len};
    pb_field f;
    int got;
    ns->present = true;
    while ((got = pb_next(&r, &f)) > 0) {
        if (f.number == 1 || f.number == 2) {
            if (!want_wire(&f, 2, which, err)) return false;
            *(f.number == 1 ? &ns->name : &ns->charsmap) = (pb_bytes){f.data, f.len, true};
        } else if (f.number >= 3 && f.number <= 5) {
            if (!want_wire(&f, 0, which, err)) return false;
            bool v = f.varint != 0;
            if (f.number == 3) ns->add_dummy_prefix = v;
            if (f.number == 4) ns->remove_extra_whitespaces = v;
            if (f.number == 5) ns->escape_whitespaces = v;
        }
    }
    if (got < 0) return failf(err, "%s is not valid protobuf", which);
    return true;
}

static bool parse_model(const uint8_t *data, size_t len, model_proto *m, parse_error *err) {
    /* proto2 defaults */
    m->trainer.model_type = MODEL_UNIGRAM;
    m->normalizer = m->denormalizer = (normalizer_proto){
        .add_dummy_prefix = true, .remove_extra_whitespaces = true, .escape_whitespaces = true};
    pb_reader r = {data, data + len};
    pb_field f;
    int got;
    while ((got = pb_next(&r, &f)) > 0) {
        bool ok = true;
        if (f.number >= 1 && f.number <= 5 && f.number != 4 && !want_wire(&f, 2, "the model", err))
            return false;
        if (f.number == 1) ok = parse_piece(f.data, f.len, m, err);
        if (f.number == 2) ok = parse_trainer(f.data, f.len, &m->trainer, err);
        if (f.number == 3)
            ok = parse_normalizer(f.data, f.len, &m->normalizer, "normalizer_spec", err);
        if (f.number == 5)
            ok = parse_normalizer(f.data, f.len, &m->denormalizer, "denormalizer_spec", err);
        if (!ok) return false;
    }
    if (got < 0) return failf(err, "not a valid protobuf (truncated or not a .model file)");
    if (m->n_pieces == 0) return failf(err, "no pieces (not a SentencePiece model)");
    return true;
}

/* ---- building the tokenizer ---------------------------------------------- */

static bool load_charsmap(const normalizer_proto *np, norm_spec *ns, const char *which,
                          parse_error *err) {
    *ns = (norm_spec){np->add_dummy_prefix, np->remove_extra_whitespaces, np->escape_whitespaces,
                      NULL, 0, NULL, 0};
    if (!np->charsmap.present || np->charsmap.len == 0) return true;
    /* <u32 trie bytes, little-endian><double-array units><replacement strings> */
    const uint8_t *b = np->charsmap.data;
    size_t len = np->charsmap.len;
    if (len <= 4) return failf(err, "%s charsmap is broken (%zu bytes)", which, len);
    size_t trie_bytes = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
    if (trie_bytes > len - 4 || trie_bytes / 4 == 0) /* len > 4: no underflow */
        return failf(err, "%s charsmap trie size %zu does not fit its %zu bytes", which,
                     trie_bytes, len);
    ns->trie_units = trie_bytes / 4;
    ns->trie = keel_xmalloc(ns->trie_units * sizeof *ns->trie, "tokenizer charsmap");
    for (size_t i = 0; i < ns->trie_units; i++) {
        const uint8_t *u = b + 4 + 4 * i;
        ns->trie[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 |
                      (uint32_t)u[3] << 24;
    }
    ns->repl = (const char *)b + 4 + trie_bytes;
    ns->repl_len = len - 4 - trie_bytes;
    return true;
}

/* "<0xNN>" (uppercase hex, exactly) -> byte, else -1 (PieceToByte). */
static int piece_to_byte(const piece *p) {
    static const char hex[] = "0123456789ABCDEF";
    if (p->len != 6 || memcmp(p->str, "<0x", 3) != 0 || p->str[5] != '>') return -1;
    const char *hi = memchr(hex, p->str[3], 16), *lo = memchr(hex, p->str[4], 16);
    if (!hi || !lo) return -1;
    return (int)((hi - hex) * 16 + (lo - hex));
}

static int32_t control_id(const keel_tokenizer *tok, pb_bytes name, const char *fallback) {
    const char *s = name.present ? (const char *)name.data : fallback;
    size_t n = name.present ? name.len : strlen(fallback);
    int32_t id = piece_to_id(tok, s, n);
    return tok->pieces[id].type == PIECE_CONTROL ? id : -1;
}

static void add_user_len(keel_tokenizer *tok, uint32_t len) {
    for (int i = 0; i < tok->n_user_lens; i++)
        if (tok->user_lens[i] == len) return;
    tok->user_lens =
        keel_xrealloc(tok->user_lens, (size_t)(tok->n_user_lens + 1) * sizeof(uint32_t),
                      "user-defined symbol lengths");
    int i = tok->n_user_lens++;
    for (; i > 0 && tok->user_lens[i - 1] < len; i--) tok->user_lens[i] = tok->user_lens[i - 1];
    tok->user_lens[i] = len;
}

/* A piece for an error message: at most 24 bytes, control bytes as '?', so
 * the message stays on one line. */
static const char *printable(const piece *p, char *buf, size_t size) {
    size_t n = p->len < size - 1 ? p->len : size - 1;
    if (n > 24) n = 24;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)p->str[i] < 0x20 ? '?' : p->str[i];
    buf[n] = '\0';
    return buf;
}

/* Index the pieces and check them as ModelInterface::InitializePieces does. */
static bool index_pieces(keel_tokenizer *tok, parse_error *err) {
    table_init(&tok->mergeable, tok->n_pieces);
    table_init(&tok->reserved, tok->n_pieces);
    tok->unk_id = -1;
    bool byte_found[256] = {false};
    char name[32];
    for (int32_t id = 0; id < tok->n_pieces; id++) {
        const piece *p = &tok->pieces[id];
        if (p->len == 0) return failf(err, "piece %d is empty", id);
        bool mergeable = p->type == PIECE_NORMAL || p->type == PIECE_USER_DEFINED ||
                         p->type == PIECE_UNUSED;
        if (!table_insert(mergeable ? &tok->mergeable : &tok->reserved, tok->pieces, id))
            return failf(err, "piece %d '%s' is defined twice", id, printable(p, name, sizeof name));
        if (mergeable && p->len > tok->max_mergeable_len) tok->max_mergeable_len = p->len;
        if (p->type == PIECE_USER_DEFINED) add_user_len(tok, p->len);
        if (p->type == PIECE_UNUSED) tok->has_unused = true;
        if (p->type == PIECE_UNKNOWN) {
            if (tok->unk_id >= 0)
                return failf(err, "has two unknown pieces (%d and %d)", tok->unk_id, id);
            tok->unk_id = id;
        }
        if (p->type == PIECE_BYTE) {
            if (!tok->byte_fallback)
                return failf(err, "has byte piece %d but byte_fallback is off", id);
            int byte = piece_to_byte(p);
            if (byte < 0)
                return failf(err, "byte piece %d '%s' is invalid", id,
                             printable(p, name, sizeof name));
            byte_found[byte] = true;
        }
    }
    if (tok->unk_id < 0) return failf(err, "has no unknown piece (<unk>)");
    for (int b = 0; tok->byte_fallback && b < 256; b++) {
        if (!byte_found[b])
            return failf(err, "byte_fallback is on but piece <0x%02X> is missing", b);
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = piece_to_id(tok, name, 6);
    }
    return true;
}

/* Take over m's pieces and set up everything encode/decode need. */
static bool build_vocab(keel_tokenizer *tok, model_proto *m, parse_error *err) {
    static const char *model_names[] = {"unknown", "unigram", "bpe", "word", "char"};
    const trainer_proto *t = &m->trainer;
    if (t->model_type != MODEL_BPE) {
        const char *name = t->model_type <= MODEL_CHAR ? model_names[t->model_type] : "unknown";
        return failf(err, "is a %s model but keel reads only BPE models", name);
    }
    tok->pieces = m->pieces;
    tok->n_pieces = m->n_pieces;
    m->pieces = NULL;
    tok->byte_fallback = t->byte_fallback;
    tok->ws_as_suffix = t->ws_as_suffix;
    if (!index_pieces(tok, err)) return false;
    tok->bos_id = control_id(tok, t->bos_piece, "<s>");
    tok->eos_id = control_id(tok, t->eos_piece, "</s>");
    tok->unk_surface = t->unk_surface.present ? (const char *)t->unk_surface.data
                                              : " \xe2\x81\x87 "; /* " ⁇ " */
    tok->unk_surface_len = t->unk_surface.present ? t->unk_surface.len : strlen(tok->unk_surface);
    if (!load_charsmap(&m->normalizer, &tok->normalizer, "normalizer", err)) return false;
    return !m->denormalizer.present ||
           load_charsmap(&m->denormalizer, &tok->denormalizer, "denormalizer", err);
}

/* A .model file larger than this is not one (Gemma's 256k-piece model is 4 MiB). */
#define MAX_MODEL_BYTES ((size_t)1 << 30)

/* Parse the model in file[0, len) (taken over: freed on failure too). */
static keel_status load_owned(char *file, size_t len, const char *name, keel_tokenizer **out) {
    keel_tokenizer *tok = keel_xcalloc(sizeof *tok, "tokenizer");
    tok->path = keel_xstrdup(name);
    tok->file = (uint8_t *)file;
    model_proto m = {0};
    parse_error err = {{0}};
    if (!parse_model(tok->file, len, &m, &err) || !build_vocab(tok, &m, &err)) {
        keel_free(m.pieces); /* NULL once build_vocab took them */
        keel_errorf("tokenizer model %s: %s; pass a SentencePiece BPE .model file "
                    "(spm_train --model_type=bpe)", name, err.why);
        keel_tokenizer_free(tok);
        return KEEL_ERR_INPUT;
    }
    *out = tok;
    return KEEL_OK;
}

/* A tokenizer.json in json[0, len) (taken over) with its tokenizer_config.json
 * (config, may be NULL; taken over). */
static keel_status load_hf(char *json, size_t len, const char *name, char *config, size_t config_len,
                           const char *config_name, keel_tokenizer **out) {
    tokenizer_hf *hf;
    keel_status st = tokenizer_hf_parse(json, len, name, config, config_len, config_name, &hf);
    keel_free(json);
    keel_free(config);
    if (st != KEEL_OK) return st;
    keel_tokenizer *tok = keel_xcalloc(sizeof *tok, "tokenizer");
    tok->hf = hf;
    tok->path = keel_xstrdup(name);
    *out = tok;
    return KEEL_OK;
}

char *keel_tokenizer_config_path(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? keel_xstrdup(path) : keel_xstrdup(".");
    if (slash) dir[slash - path + (slash == path)] = '\0';
    char *config = keel_path_join(dir, "tokenizer_config.json");
    keel_free(dir);
    if (keel_path_exists(config)) return config;
    keel_free(config);
    return NULL;
}

keel_status keel_tokenizer_load(const char *path, keel_tokenizer **out) {
    *out = NULL;
    size_t len, config_len = 0;
    char *file, *config = NULL, why[160];
    if (keel_read_regular(path, MAX_MODEL_BYTES, &file, &len, why, sizeof why) != KEEL_OK) {
        keel_errorf("cannot read tokenizer %s: %s; pass the path of a SentencePiece .model or a "
                    "Hugging Face tokenizer.json", path, why);
        return KEEL_ERR_INPUT;
    }
    if (!tokenizer_hf_is_json(file, len)) return load_owned(file, len, path, out);
    char *config_path = keel_tokenizer_config_path(path);
    if (config_path &&
        keel_read_regular(config_path, MAX_MODEL_BYTES, &config, &config_len, why, sizeof why) != KEEL_OK) {
        keel_errorf("cannot read %s (beside tokenizer %s): %s", config_path, path, why);
        keel_free(config_path);
        keel_free(file);
        return KEEL_ERR_INPUT;
    }
    keel_status st = load_hf(file, len, path, config, config_len, config_path, out);
    keel_free(config_path);
    return st;
}

keel_status keel_tokenizer_load_buffer(const void *bytes, size_t len, const char *name,
                                       keel_tokenizer **out) {
    return keel_tokenizer_load_buffers(bytes, len, name, NULL, 0, NULL, out);
}

keel_status keel_tokenizer_load_buffers(const void *bytes, size_t len, const char *name, const void *config,
                                        size_t config_len, const char *config_name, keel_tokenizer **out) {
    *out = NULL;
    if (tokenizer_hf_is_json(bytes, len)) {
        char *json = keel_xmalloc(len ? len : 1, "tokenizer.json"), *cfg = NULL;
        if (len) memcpy(json, bytes, len);
        if (config) {
            cfg = keel_xmalloc(config_len + 1, "tokenizer_config.json");
            memcpy(cfg, config, config_len);
            cfg[config_len] = '\0';
        }
        return load_hf(json, len, name, cfg, config_len, config ? config_name : NULL, out);
    }
    char *copy = keel_xmalloc(len ? len : 1, "tokenizer model");
    if (len) memcpy(copy, bytes, len);
    return load_owned(copy, len, name, out);
}

void keel_tokenizer_free(keel_tokenizer *tok) {
    if (!tok) return;
    tokenizer_hf_free(tok->hf);
    keel_free(tok->path);
    keel_free(tok->file);
    keel_free(tok->pieces);
    keel_free(tok->mergeable.slots);
    keel_free(tok->reserved.slots);
    keel_free(tok->user_lens);
    keel_free(tok->normalizer.trie);
    keel_free(tok->denormalizer.trie);
    keel_free(tok);
}

int keel_tokenizer_vocab_size(const keel_tokenizer *tok) {
    return tok->hf ? tokenizer_hf_vocab_size(tok->hf) : tok->n_pieces;
}
int keel_tokenizer_bos_id(const keel_tokenizer *tok) {
    return tok->hf ? tokenizer_hf_bos_id(tok->hf) : tok->bos_id;
}
int keel_tokenizer_eos_id(const keel_tokenizer *tok) {
    return tok->hf ? tokenizer_hf_eos_id(tok->hf) : tok->eos_id;
}
int keel_tokenizer_special_id(const keel_tokenizer *tok, const char *token) {
    if (tok->hf) return tokenizer_hf_special_id(tok->hf, token);
    size_t n = strlen(token);
    if (n == 0) return -1;
    int32_t id = table_find(&tok->reserved, tok->pieces, token, n);
    if (id < 0) id = table_find(&tok->mergeable, tok->pieces, token, n);
    if (id < 0) return -1;
    uint8_t type = tok->pieces[id].type;
    return type == PIECE_CONTROL || type == PIECE_USER_DEFINED ? id : -1;
}
const char *keel_tokenizer_file_name(const keel_tokenizer *tok) {
    return tok->hf ? "tokenizer.json" : "tokenizer.model";
}

/* ---- public encode / decode ---------------------------------------------- */

keel_status keel_tokenizer_encode(const keel_tokenizer *tok, const char *text, size_t len,
                                  keel_ids *out) {
    out->n = 0;
    if (tok->hf) return tokenizer_hf_encode(tok->hf, text, len, out);
    strbuf normalized = {0};
    normalize(tok, &tok->normalizer, true, tok->ws_as_suffix, text, len, &normalized);
    keel_status st = KEEL_OK;
    if (normalized.failed || normalized.n > (size_t)INT32_MAX) { /* symbols are indexed with int32 */
        keel_errorf("a line of %zu bytes is too long to tokenize with %s (over 2 GiB once "
                    "normalized, or more than the memory holds); split it into shorter lines", len,
                    tok->path);
        st = KEEL_ERR_INPUT;
    } else if (normalized.n > 0 && !bpe_encode(tok, normalized.p, normalized.n, out)) {
        keel_errorf("a line of %zu bytes needs more memory than there is to tokenize with %s; split "
                    "it into shorter lines", len, tok->path);
        st = KEEL_ERR_INPUT;
    }
    keel_free(normalized.p);
    return st;
}

/* Append the run of byte pieces ids[from, to) as UTF-8, each invalid byte as
 * U+FFFD. (Indexes, not a pointer: ids may be NULL when there are none.) */
static void flush_bytes(const keel_tokenizer *tok, const int32_t *ids, size_t from, size_t to, strbuf *out) {
    if (from >= to) return;
    size_t n = to - from;
    char *bytes = keel_xmalloc(n, "decoded bytes");
    for (size_t i = 0; i < n; i++) bytes[i] = (char)piece_to_byte(&tok->pieces[ids[from + i]]);
    for (size_t pos = 0; pos < n;) {
        size_t len = utf8_char_len(bytes + pos, n - pos);
        if (len == 0) {
            strbuf_append(out, REPLACEMENT_CHAR, 3);
            len = 1;
        } else {
            strbuf_append(out, bytes + pos, len);
        }
        pos += len;
    }
    keel_free(bytes);
}

/* The text of one non-byte piece (DecodeSentencePiece). With strip_space
 * a leading U+2581 is dropped (it is the dummy prefix); returns true when
 * that consumed the one dummy-prefix space, so later pieces keep theirs. */
static bool decode_piece(const keel_tokenizer *tok, int32_t id, bool strip_space, strbuf *out) {
    const piece *p = &tok->pieces[id];
    if (p->type == PIECE_CONTROL) return false;
    if (p->type == PIECE_UNKNOWN) {
        strbuf_append(out, tok->unk_surface, tok->unk_surface_len);
        return false;
    }
    const char *s = p->str;
    size_t n = p->len;
    bool stripped = false;
    const norm_spec *ns = &tok->normalizer;
    if (strip_space && (ns->add_dummy_prefix || ns->remove_extra_whitespaces) && n >= 3 &&
        memcmp(s, SPACE_SYMBOL, 3) == 0) {
        s += 3;
        n -= 3;
        /* with remove_extra_whitespaces every leading space goes, so keep stripping */
        stripped = !ns->remove_extra_whitespaces;
    }
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && memcmp(s + i, SPACE_SYMBOL, 3) == 0) {
            strbuf_append(out, " ", 1);
            i += 3;
        } else {
            strbuf_append(out, s + i, 1);
            i++;
        }
    }
    return stripped;
}

keel_status keel_tokenizer_decode_len(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                      char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    int vocab = keel_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            keel_errorf("token id %d is out of range for tokenizer %s (vocab %d); ids must be "
                        "in [0, %d)", ids[i], tok->path, vocab, vocab);
            return KEEL_ERR_INPUT;
        }
    }
    if (tok->hf) return tokenizer_hf_decode(tok->hf, ids, n, text, len);
    strbuf out = {0};
    size_t byte_start = 0;
    bool strip_space = true, space_stripped = false;
    for (size_t i = 0; i < n; i++) {
        const piece *p = &tok->pieces[ids[i]];
        int32_t id = piece_to_id(tok, p->str, p->len); /* as Decode(pieces) re-derives it */
        if (tok->pieces[id].type == PIECE_BYTE) continue;
        flush_bytes(tok, ids, byte_start, i, &out);
        byte_start = i + 1;
        if (space_stripped || out.n > 0) strip_space = false;
        space_stripped = decode_piece(tok, id, strip_space, &out);
    }
    flush_bytes(tok, ids, byte_start, n, &out);
    if (tok->denormalizer.trie && !out.failed) {
        strbuf denorm = {0};
        normalize(tok, &tok->denormalizer, false, false, out.p, out.n, &denorm);
        keel_free(out.p);
        out = denorm;
    }
    if (!strbuf_reserve(&out, 1)) {
        keel_errorf("decoding %zu ids with %s gives more than %zu GiB of text (or more than the "
                    "memory holds); decode fewer at a time", n, tok->path, STRBUF_MAX >> 30);
        keel_free(out.p);
        return KEEL_ERR_INPUT;
    }
    out.p[out.n] = '\0';
    *text = out.p;
    *len = out.n;
    return KEEL_OK;
}

keel_status keel_tokenizer_decode(const keel_tokenizer *tok, const int32_t *ids, size_t n,
                                  char **text) {
    size_t len;
    return keel_tokenizer_decode_len(tok, ids, n, text, &len);
}
