/* data/tokenizer_hf.c: Hugging Face tokenizer.json (BPE) encoder and decoder
 * that gives the same ids and text as the tokenizers library (0.23); the
 * file is read by tokenizer_hf_load.c into tokenizer_hf_model.h's model.
 *
 * What is reproduced, step by step as tokenizers does it (Tokenizer.encode
 * without special tokens, Tokenizer.decode keeping them):
 *   - Added tokens (AddedVocabulary): ids assigned as tokenizers assigns them
 *     on load (a token already in the vocabulary keeps its id, a new one gets
 *     the next id after the model's vocabulary, in file order), then split out
 *     of the text leftmost-longest — tokens with normalized=false from the
 *     text as given, then those with normalized=true from each normalized
 *     piece — with single_word, lstrip and rstrip as find_matches applies
 *     them. Special tokens in the text are matched (encode_special_tokens off).
 *   - Normalizers: Prepend, Replace (a string or a regex), Sequence.
 *   - Pre-tokenizers: Split (a string or a regex; every behaviour, invert),
 *     ByteLevel (add_prefix_space, use_regex with GPT-2's pattern, the
 *     byte-to-character map), Metaspace (replacement, prepend_scheme, split),
 *     Sequence. Regexes run in PCRE2 (tokenizer_hf_regex.c).
 *   - Model BPE (models/bpe/model.rs, word.rs): ignore_merges (a pre-token
 *     that is in the vocabulary is one token), characters looked up one by
 *     one, byte_fallback to <0xNN> tokens, unk_token with fuse_unk, then
 *     Word::merge_all: the lowest-ranked merge first, ties by position, from
 *     a heap of candidate pairs whose stale entries are skipped.
 *   - Decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
 *     Sequence; no decoder joins the tokens with spaces.
 * Input that is not valid UTF-8 is read as Python's bytes.decode("utf-8",
 * errors="replace") reads it (one U+FFFD per maximal subpart). The
 * post-processor (BOS/EOS templates), truncation and padding are ignored:
 * keel adds BOS/EOS itself. Anything else — another model, normalizer,
 * pre-tokenizer or decoder, BPE dropout, subword prefixes — is refused at load
 * with one line, since it would change the ids or the text.
 *
 * Speed: each encode call borrows one of a few per-thread contexts (its
 * buffers, PCRE2 state and a cache from pre-token to ids, HF's per-word cache)
 * from a pool of mutex-guarded slots, so the loaded tokenizer stays read-only
 * to its callers and threads do not share a cache line while encoding. */
#include "data/tokenizer_hf_model.h"

#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- limits ------------------------------------------------------------------ */

#define MAX_LINE ((size_t)INT32_MAX) /* symbols are indexed with int32 */
#define CACHE_SLOTS 65536u    /* per context; cleared when half full or its arenas are */
#define CACHE_KEY_MAX 255     /* pre-tokens this long or shorter are cached */
#define CACHE_ARENA_BYTES ((size_t)1 << 21)
#define CACHE_ARENA_IDS ((size_t)1 << 18)

static const char REPLACEMENT_CHAR[] = "\xef\xbf\xbd"; /* U+FFFD */

/* ---- growable buffers -------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void buf_reserve(buf *b, size_t extra) {
    if (extra <= b->cap - b->n) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->n < extra) cap *= 2;
    b->p = keel_xrealloc(b->p, cap, "tokenizer text");
    b->cap = cap;
}

static void buf_put(buf *b, const char *s, size_t n) {
    buf_reserve(b, n + 1);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void ids_push(keel_ids *out, int32_t id) {
    if (out->n == out->cap) {
        out->cap = out->cap ? out->cap * 2 : 64;
        out->ids = keel_xrealloc(out->ids, out->cap * sizeof *out->ids, "token ids");
    }
    out->ids[out->n++] = id;
}


/* ---- UTF-8 ----------------------------------------------------------------- */

/* Length of the well-formed UTF-8 character at s (Unicode table 3-7), or 0
 * with *bad set to the bytes of its maximal subpart (at least 1): what
 * Python's errors="replace" and Rust's from_utf8_lossy turn into one U+FFFD. */
static size_t utf8_next(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        uint8_t lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
        if (i >= n || s[i] < lo_i || s[i] > hi_i) {
            *bad = i;
            return 0;
        }
    }
    return need + 1;
}

/* Offset of the first byte that is not well-formed UTF-8, or n. */
size_t hf_utf8_valid_prefix(const char *str, size_t n) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        size_t bad, len = utf8_next(s + i, n - i, &bad);
        if (!len) return i;
        i += len;
    }
    return n;
}

/* s[0, n) with every ill-formed subpart replaced by U+FFFD, into *out. */
static void utf8_lossy(const char *s, size_t n, buf *out) {
    out->n = 0;
    buf_reserve(out, n + n / 2 + 4);
    for (size_t i = 0; i < n;) {
        size_t bad, len = utf8_next((const uint8_t *)s + i, n - i, &bad);
        if (len) {
            buf_put(out, s + i, len);
            i += len;
        } else {
            buf_put(out, REPLACEMENT_CHAR, 3);
            i += bad;
        }
    }
}


/* The code point at s[0] of valid UTF-8 (len bytes). */
static uint32_t code_point(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    if (len == 1) return s[0];
    if (len == 2) return (s[0] & 0x1Fu) << 6 | (s[1] & 0x3Fu);
    if (len == 3) return (s[0] & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu);
    return (s[0] & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
}

/* ---- maps ------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n) { return XXH3_64bits(s, n); }

static void map_grow(str_map *m) {
    uint32_t cap = m->mask ? 2 * (m->mask + 1) : 1024;
    uint32_t *slots = keel_xcalloc(cap * sizeof *slots, "tokenizer map");
    m->mask = cap - 1;
    keel_free(m->slots);
    m->slots = slots;
}

static uint32_t *map_slot(const str_map *m, const char *strings, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        uint32_t e = m->slots[i];
        if (!e) return &m->slots[i];
        span k = m->keys[e - 1];
        if (k.len == n && memcmp(strings + k.off, s, n) == 0) return &m->slots[i];
    }
}

int32_t hf_map_get(const str_map *m, const char *strings, const char *s, size_t n) {
    if (!m->mask) return -1;
    uint32_t e = *map_slot(m, strings, s, n);
    return e ? m->vals[e - 1] : -1;
}

/* key -> val (a key already there takes the new value: serde's HashMap). */
void hf_map_put(str_map *m, const char *strings, span key, int32_t val) {
    if (!m->mask || 2 * (m->n + 1) > m->mask + 1) {
        map_grow(m);
        for (uint32_t e = 0; e < m->n; e++)
            *map_slot(m, strings, strings + m->keys[e].off, m->keys[e].len) = e + 1;
    }
    uint32_t *slot = map_slot(m, strings, strings + key.off, key.len);
    if (*slot) {
        m->vals[*slot - 1] = val;
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 1024;
        m->keys = keel_xrealloc(m->keys, m->cap * sizeof *m->keys, "tokenizer map");
        m->vals = keel_xrealloc(m->vals, m->cap * sizeof *m->vals, "tokenizer map");
    }
    m->keys[m->n] = key;
    m->vals[m->n] = val;
    *slot = ++m->n;
}

void hf_map_free(str_map *m) {
    keel_free(m->slots);
    keel_free(m->keys);
    keel_free(m->vals);
}


static const merge_slot *merge_find(const tokenizer_hf *t, int32_t a, int32_t b) {
    if (!t->merges) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = mix64(key) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        const merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == EMPTY_KEY) return NULL;
    }
}

/* ---- the per-thread encode context ------------------------------------------ */

typedef struct {
    int32_t c;
    int32_t prev, next;
    uint32_t len; /* 0 = merged into its left neighbour */
} symbol;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} merge_cand;

typedef struct {
    size_t start, end;
    bool is_match; /* after the behavior: remove */
} range;

typedef struct {
    uint64_t hash; /* 0 = empty */
    uint32_t key_off, ids_off;
    uint16_t key_len, n_ids;
} cache_entry;

typedef struct encode_ctx {
    hf_match_state *ms;
    buf fixed;           /* the line made valid UTF-8 */
    buf norm[2];         /* normalization */
    buf stage_in[MAX_STEPS], stage_out[MAX_STEPS]; /* per pre-tokenizer step */
    range *ranges[MAX_STEPS + 2];
    size_t ranges_cap[MAX_STEPS + 2];
    symbol *sym;
    size_t sym_cap;
    merge_cand *heap;
    size_t heap_cap;
    int32_t *word_ids;
    size_t word_ids_cap;
    cache_entry *cache;
    uint32_t cache_n;
    buf cache_keys;
    int32_t *cache_ids;
    size_t cache_ids_n;
    char why[300];       /* why the last call failed */
} encode_ctx;

/* Record why encoding failed (the caller prints it once); returns false. */
static bool whyf(encode_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool whyf(encode_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    return false;
}

static encode_ctx *ctx_new(void) {
    encode_ctx *c = keel_xcalloc(sizeof *c, "tokenizer context");
    c->ms = hf_match_state_new();
    return c; /* the cache comes with the first word put in it */
}

static void ctx_free(encode_ctx *c) {
    if (!c) return;
    hf_match_state_free(c->ms);
    keel_free(c->fixed.p);
    keel_free(c->norm[0].p);
    keel_free(c->norm[1].p);
    for (int i = 0; i < MAX_STEPS; i++) {
        keel_free(c->stage_in[i].p);
        keel_free(c->stage_out[i].p);
    }
    for (int i = 0; i < MAX_STEPS + 2; i++) keel_free(c->ranges[i]);
    keel_free(c->sym);
    keel_free(c->heap);
    keel_free(c->word_ids);
    keel_free(c->cache);
    keel_free(c->cache_keys.p);
    keel_free(c->cache_ids);
    keel_free(c);
}

static _Atomic unsigned next_thread_hint;
static _Thread_local unsigned thread_hint = UINT32_MAX;

/* A free context of t's pool (locked; its slot in *slot), or NULL when every
 * slot is busy: the caller then makes one for the call. */
static encode_ctx *ctx_acquire(const tokenizer_hf *t, ctx_slot **slot) {
    if (thread_hint == UINT32_MAX) thread_hint = atomic_fetch_add(&next_thread_hint, 1) & 0x7fffffff;
    for (unsigned k = 0; k < t->n_slots; k++) {
        ctx_slot *s = &t->slots[(thread_hint + k) % t->n_slots];
        if (pthread_mutex_trylock(&s->lock) != 0) continue;
        if (!s->ctx) s->ctx = ctx_new();
        *slot = s;
        return s->ctx;
    }
    *slot = NULL;
    return NULL;
}

/* ---- the per-word cache ------------------------------------------------------ */

static void cache_clear(encode_ctx *c) {
    memset(c->cache, 0, CACHE_SLOTS * sizeof *c->cache);
    c->cache_n = 0;
    c->cache_keys.n = 0;
    c->cache_ids_n = 0;
}

static uint64_t cache_hash(const char *s, size_t n) { return hash_bytes(s, n) | 1; /* 0 = empty */ }

static const cache_entry *cache_get(const encode_ctx *c, const char *s, size_t n, uint64_t h) {
    if (!c->cache) return NULL;
    for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_entry *e = &c->cache[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->key_len == n && memcmp(c->cache_keys.p + e->key_off, s, n) == 0) return e;
    }
}

static void cache_put(encode_ctx *c, const char *s, size_t n, uint64_t h, const int32_t *ids, size_t n_ids) {
    if (n > CACHE_KEY_MAX || n_ids > CACHE_KEY_MAX * 4) return;
    if (!c->cache) {
        c->cache = keel_xcalloc(CACHE_SLOTS * sizeof *c->cache, "tokenizer cache");
        c->cache_ids = keel_xmalloc(CACHE_ARENA_IDS * sizeof *c->cache_ids, "tokenizer cache");
        buf_reserve(&c->cache_keys, CACHE_ARENA_BYTES);
    }
    if (2 * (c->cache_n + 1) > CACHE_SLOTS || c->cache_keys.n + n > CACHE_ARENA_BYTES ||
        c->cache_ids_n + n_ids > CACHE_ARENA_IDS)
        cache_clear(c);
    uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);
    while (c->cache[i].hash) i = (i + 1) & (CACHE_SLOTS - 1);
    c->cache[i] = (cache_entry){h, (uint32_t)c->cache_keys.n, (uint32_t)c->cache_ids_n, (uint16_t)n,
                                (uint16_t)n_ids};
    buf_put(&c->cache_keys, s, n);
    memcpy(c->cache_ids + c->cache_ids_n, ids, n_ids * sizeof *ids);
    c->cache_ids_n += n_ids;
    c->cache_n++;
}

/* ---- BPE (models/bpe/model.rs merge_word, word.rs merge_all) --------------- */

static void *grow(void *p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return p;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    *cap = cap2;
    return keel_xrealloc(p, cap2 * elem, what);
}

static int32_t char_id(const tokenizer_hf *t, const char *s, size_t len) {
    if (len <= 2) return t->char_ids[code_point(s, len)];
    return hf_map_get(&t->vocab, t->strings, s, len);
}

static void sym_add(encode_ctx *c, size_t *n, int32_t id, uint32_t len) {
    c->sym = grow(c->sym, &c->sym_cap, *n + 1, sizeof *c->sym, "BPE symbols");
    int32_t i = (int32_t)*n;
    if (i > 0) c->sym[i - 1].next = i;
    c->sym[i] = (symbol){id, i - 1, -1, len};
    (*n)++;
}

static bool cand_less(merge_cand a, merge_cand b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(encode_ctx *c, size_t *n, merge_cand m) {
    c->heap = grow(c->heap, &c->heap_cap, *n + 1, sizeof *c->heap, "BPE merges");
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(m, c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = m;
}

static merge_cand heap_pop(encode_ctx *c, size_t *n) {
    merge_cand top = c->heap[0], last = c->heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && cand_less(c->heap[child + 1], c->heap[child])) child++;
        if (!cand_less(c->heap[child], last)) break;
        c->heap[i] = c->heap[child];
        i = child;
    }
    if (*n > 0) c->heap[i] = last;
    return top;
}

static void push_pair(const tokenizer_hf *t, encode_ctx *c, size_t *n_heap, int32_t pos) {
    const symbol *a = &c->sym[pos];
    const merge_slot *m = merge_find(t, a->c, c->sym[a->next].c);
    if (m) heap_push(c, n_heap, (merge_cand){m->rank, (uint32_t)pos, m->new_id});
}

/* Word::merge_all over c->sym[0, n). */
static void merge_all(const tokenizer_hf *t, encode_ctx *c, size_t n) {
    size_t n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, c, &n_heap, (int32_t)i);
    while (n_heap > 0) {
        merge_cand top = heap_pop(c, &n_heap);
        symbol *s = &c->sym[top.pos];
        if (s->len == 0 || s->next == -1) continue;
        int32_t next_pos = s->next;
        symbol right = c->sym[next_pos];
        const merge_slot *m = merge_find(t, s->c, right.c);
        if (!m || m->new_id != top.new_id) continue; /* a stale candidate */
        s->c = top.new_id;
        s->len += right.len;
        s->next = right.next;
        c->sym[next_pos].len = 0;
        if (right.next >= 0) c->sym[right.next].prev = (int32_t)top.pos;
        if (s->prev >= 0) push_pair(t, c, &n_heap, s->prev);
        if (s->next >= 0) push_pair(t, c, &n_heap, (int32_t)top.pos);
    }
}

/* BPE::merge_word then the ids of what is left, into c->word_ids[0, *n_ids).
 * False (message printed) when an unknown character needs an unk_token
 * that the vocabulary lacks. */
static bool merge_word(const tokenizer_hf *t, encode_ctx *c, const char *w, size_t n, size_t *n_ids) {
    size_t n_sym = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0; /* a pending unk: unk_len > 0 */
    for (size_t i = 0; i < n;) {
        size_t len = char_len(w + i);
        if (len > n - i) len = n - i;
        int32_t id = char_id(t, w + i, len);
        if (id >= 0) {
            if (unk_len) sym_add(c, &n_sym, unk_id, unk_len), unk_len = 0;
            sym_add(c, &n_sym, id, (uint32_t)len);
        } else {
            bool bytes_ok = t->byte_fallback;
            for (size_t k = 0; bytes_ok && k < len; k++) bytes_ok = t->byte_ids[(uint8_t)w[i + k]] >= 0;
            if (bytes_ok) { /* as model.rs: a pending unk is not flushed first */
                for (size_t k = 0; k < len; k++) sym_add(c, &n_sym, t->byte_ids[(uint8_t)w[i + k]], 1);
            } else if (t->unk_id != -1) {
                if (t->unk_id < 0)
                    return whyf(c, "the text has a character outside the vocabulary and model.unk_token "
                                   "'%s' is not in the vocabulary either", str_of(t, t->unk_token));
                if (unk_len && t->fuse_unk) {
                    unk_len += (uint32_t)len;
                } else {
                    if (unk_len) sym_add(c, &n_sym, unk_id, unk_len);
                    unk_id = t->unk_id;
                    unk_len = (uint32_t)len;
                }
            } /* no unk_token: the character is dropped */
        }
        i += len;
    }
    if (unk_len) sym_add(c, &n_sym, unk_id, unk_len);
    merge_all(t, c, n_sym);
    *n_ids = 0;
    c->word_ids = grow(c->word_ids, &c->word_ids_cap, n_sym + 1, sizeof *c->word_ids, "BPE ids");
    for (size_t i = 0; i < n_sym; i++)
        if (c->sym[i].len) c->word_ids[(*n_ids)++] = c->sym[i].c;
    return true;
}

/* The model on one pre-token (BPE::tokenize): ids appended to out. */
static bool model_encode(const tokenizer_hf *t, encode_ctx *c, const char *w, size_t n, keel_ids *out) {
    if (n == 0) return true;
    if (n > MAX_LINE) return whyf(c, "a pre-token of %zu bytes is over 2 GiB; split the text into shorter lines", n);
    uint64_t h = 0;
    if (n <= CACHE_KEY_MAX) {
        h = cache_hash(w, n);
        const cache_entry *e = cache_get(c, w, n, h);
        if (e) {
            for (uint16_t i = 0; i < e->n_ids; i++) ids_push(out, c->cache_ids[e->ids_off + i]);
            return true;
        }
    }
    if (t->ignore_merges) {
        int32_t id = hf_map_get(&t->vocab, t->strings, w, n);
        if (id >= 0) {
            ids_push(out, id);
            if (h) cache_put(c, w, n, h, &id, 1);
            return true;
        }
    }
    size_t n_ids;
    if (!merge_word(t, c, w, n, &n_ids)) return false;
    for (size_t i = 0; i < n_ids; i++) ids_push(out, c->word_ids[i]);
    if (h) cache_put(c, w, n, h, c->word_ids, n_ids);
    return true;
}

/* ---- patterns: find_matches ------------------------------------------------- */

static range *ranges_slot(encode_ctx *c, int level, size_t need) {
    c->ranges[level] = grow(c->ranges[level], &c->ranges_cap[level], need, sizeof(range), "text ranges");
    return c->ranges[level];
}

/* Pattern::find_matches of pat over s[0, n): ranges covering s, each a match
 * or not, into c->ranges[level][0, *count). False (message printed) when
 * the regex gave up. */
static bool find_matches(const tokenizer_hf *t, encode_ctx *c, const pattern *pat, const char *s, size_t n,
                         int level, size_t *count) {
    size_t k = 0, prev = 0;
    range *r = ranges_slot(c, level, 4);
    if (n == 0) {
        r[0] = (range){0, 0, false};
        *count = 1;
        return true;
    }
    hf_find_iter it = {0};
    for (;;) {
        size_t start, end;
        if (pat->re) {
            char why[160];
            int rc = hf_regex_next(pat->re, c->ms, s, n, &it, &start, &end, why, sizeof why);
            if (rc < 0) return whyf(c, "a regex failed on a line of %zu bytes (%s); split the text into shorter lines", n, why);
            if (rc == 0) break;
        } else {
            const char *lit = str_of(t, pat->literal);
            size_t lit_len = pat->literal.len;
            const char *hit = it.last_end <= n ? memmem(s + it.last_end, n - it.last_end, lit, lit_len) : NULL;
            if (!hit) break;
            start = (size_t)(hit - s);
            end = start + lit_len;
            it.last_end = end;
        }
        r = ranges_slot(c, level, k + 3);
        if (prev != start) r[k++] = (range){prev, start, false};
        r[k++] = (range){start, end, true};
        prev = end;
    }
    r = ranges_slot(c, level, k + 1);
    if (prev != n) r[k++] = (range){prev, n, false};
    *count = k;
    return true;
}

/* NormalizedString::split's behaviours over r[0, *n) in place; afterwards
 * is_match means "remove". */
static void apply_behavior(range *r, size_t *n, split_behavior behavior) {
    size_t k = 0;
    bool previous_match = false;
    switch (behavior) {
    case ISOLATED:
        for (size_t i = 0; i < *n; i++) r[i].is_match = false;
        return;
    case REMOVED: return;
    case CONTIGUOUS:
        for (size_t i = 0; i < *n; i++) {
            bool m = r[i].is_match;
            if (m == previous_match && k > 0) r[k - 1].end = r[i].end;
            else r[k++] = (range){r[i].start, r[i].end, false};
            previous_match = m;
        }
        break;
    case MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < *n; i++) {
            bool m = r[i].is_match;
            if (m && !previous_match && k > 0) r[k - 1].end = r[i].end;
            else r[k++] = (range){r[i].start, r[i].end, false};
            previous_match = m;
        }
        break;
    case MERGED_WITH_NEXT: { /* the same from the end: a match joins the piece after it */
        size_t w = *n;
        for (size_t i = *n; i-- > 0;) {
            bool m = r[i].is_match;
            if (m && !previous_match && w < *n) r[w].start = r[i].start;
            else r[--w] = (range){r[i].start, r[i].end, false};
            previous_match = m;
        }
        k = *n - w;
        memmove(r, r + w, k * sizeof *r);
        break;
    }
    }
    *n = k;
}

/* ---- pre-tokenization -------------------------------------------------------- */

static bool pre_tokenize(const tokenizer_hf *t, encode_ctx *c, int step, const char *s, size_t n, bool at_start,
                         keel_ids *out);

/* Hand the pieces r[0, count) of s (not removed, not empty) to the next step. */
static bool pass_pieces(const tokenizer_hf *t, encode_ctx *c, int step, const char *s, const range *r,
                        size_t count, bool at_start, keel_ids *out) {
    for (size_t i = 0; i < count; i++) {
        if (r[i].is_match || r[i].end == r[i].start) continue;
        if (!pre_tokenize(t, c, step + 1, s + r[i].start, r[i].end - r[i].start, at_start && r[i].start == 0,
                          out))
            return false;
    }
    return true;
}

static bool byte_level(const tokenizer_hf *t, encode_ctx *c, int step, const char *s, size_t n, bool at_start,
                       keel_ids *out) {
    const pre_step *p = &t->pre[step];
    if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
        buf *in = &c->stage_in[step];
        in->n = 0;
        buf_put(in, " ", 1);
        buf_put(in, s, n);
        s = in->p;
        n = in->n;
    }
    size_t count = 1;
    if (p->use_regex) {
        pattern gpt2 = {t->gpt2_re, {0, 0}};
        if (!find_matches(t, c, &gpt2, s, n, step, &count)) return false;
    } else {
        ranges_slot(c, step, 1)[0] = (range){0, n, false};
    }
    buf *mapped = &c->stage_out[step];
    for (size_t i = 0; i < count; i++) {
        range piece = c->ranges[step][i];
        if (piece.end == piece.start) continue;
        mapped->n = 0;
        buf_reserve(mapped, 2 * (piece.end - piece.start) + 1);
        for (size_t k = piece.start; k < piece.end; k++) {
            uint8_t b = (uint8_t)s[k];
            memcpy(mapped->p + mapped->n, t->byte_chars[b], 2);
            mapped->n += t->byte_chars_len[b];
        }
        if (!pre_tokenize(t, c, step + 1, mapped->p, mapped->n, at_start && piece.start == 0, out)) return false;
    }
    return true;
}

static bool metaspace(const tokenizer_hf *t, encode_ctx *c, int step, const char *s, size_t n, bool at_start,
                      keel_ids *out) {
    const pre_step *p = &t->pre[step];
    const char *rep = str_of(t, p->replacement);
    size_t rep_len = p->replacement.len;
    buf *in = &c->stage_in[step];
    in->n = 0;
    buf_reserve(in, n * rep_len + rep_len + 1);
    /* does the text, its spaces replaced, start with the replacement? */
    bool starts = (n > 0 && s[0] == ' ') || (n >= rep_len && memcmp(s, rep, rep_len) == 0);
    if (!starts && (p->scheme == PREPEND_ALWAYS || (p->scheme == PREPEND_FIRST && at_start)))
        buf_put(in, rep, rep_len);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') buf_put(in, rep, rep_len);
        else buf_put(in, s + i, 1);
    }
    size_t count = 1;
    range *r;
    if (p->split) {
        pattern pat = {NULL, p->replacement};
        if (!find_matches(t, c, &pat, in->p, in->n, step, &count)) return false;
        r = c->ranges[step];
        apply_behavior(r, &count, MERGED_WITH_NEXT);
    } else {
        r = ranges_slot(c, step, 1);
        r[0] = (range){0, in->n, false};
    }
    return pass_pieces(t, c, step, in->p, r, count, at_start, out);
}

/* Step `step` of the pre-tokenizer on one piece; past the last step the
 * piece goes to the model. */
static bool pre_tokenize(const tokenizer_hf *t, encode_ctx *c, int step, const char *s, size_t n, bool at_start,
                         keel_ids *out) {
    if (n == 0) return true;
    if (step == t->n_pre) return model_encode(t, c, s, n, out);
    const pre_step *p = &t->pre[step];
    switch (p->kind) {
    case PRE_BYTE_LEVEL: return byte_level(t, c, step, s, n, at_start, out);
    case PRE_METASPACE: return metaspace(t, c, step, s, n, at_start, out);
    case PRE_SPLIT: break;
    }
    size_t count = 0;
    if (!find_matches(t, c, &p->pat, s, n, step, &count)) return false;
    range *r = c->ranges[step];
    if (p->invert)
        for (size_t i = 0; i < count; i++) r[i].is_match = !r[i].is_match;
    apply_behavior(r, &count, p->behavior);
    return pass_pieces(t, c, step, s, r, count, at_start, out);
}

/* ---- normalization ------------------------------------------------------------ */

/* The normalizer on s[0, n): returns the text (s itself when there is no
 * normalizer, else one of c->norm). */
static bool normalize(const tokenizer_hf *t, encode_ctx *c, const char *s, size_t n, const char **out,
                      size_t *out_n) {
    int which = 0;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *ns = &t->norm[i];
        buf *dst = &c->norm[which];
        dst->n = 0;
        if (ns->kind == NORM_PREPEND) {
            if (n == 0) continue;
            buf_put(dst, str_of(t, ns->content), ns->content.len);
            buf_put(dst, s, n);
        } else {
            size_t count = 0;
            if (!find_matches(t, c, &ns->pat, s, n, MAX_STEPS, &count)) return false;
            const range *r = c->ranges[MAX_STEPS];
            for (size_t k = 0; k < count; k++) {
                if (r[k].is_match) buf_put(dst, str_of(t, ns->content), ns->content.len);
                else buf_put(dst, s + r[k].start, r[k].end - r[k].start);
            }
        }
        s = dst->p ? dst->p : "";
        n = dst->n;
        which ^= 1;
    }
    *out = s;
    *out_n = n;
    return true;
}

bool hf_normalize(const tokenizer_hf *t, const char *s, size_t n, char **out, size_t *out_n, char *why,
                  size_t why_n) {
    encode_ctx *c = ctx_new();
    const char *ns;
    size_t nn;
    bool ok = normalize(t, c, s, n, &ns, &nn);
    if (ok) {
        *out = keel_xmalloc(nn + 1, "normalized token");
        memcpy(*out, ns, nn);
        *out_n = nn;
    } else {
        snprintf(why, why_n, "%s", c->why);
    }
    ctx_free(c);
    return ok;
}

/* ---- added tokens (AddedVocabulary::find_matches) ------------------------- */

/* Byte offset of the character before s[pos] (pos > 0). */
static size_t char_before(const char *s, size_t pos) {
    size_t i = pos - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    return i;
}

static bool is_class_char(const hf_regex *re, encode_ctx *c, const char *s, size_t n, size_t pos) {
    return hf_regex_match_at(re, c->ms, s, n, pos) > 0;
}

/* The longest token of set that starts at s[q], or -1. */
static int32_t longest_at(const tokenizer_hf *t, const match_set *set, const char *s, size_t n, size_t q) {
    uint8_t b = (uint8_t)s[q];
    for (uint32_t k = set->first[b]; k < set->first[b + 1]; k++) {
        const added_token *a = &t->added[set->order[k]];
        if (a->pattern.len <= n - q && memcmp(s + q, str_of(t, a->pattern), a->pattern.len) == 0)
            return (int32_t)set->order[k];
    }
    return -1;
}

/* Split s[0, n) around the tokens of set: each piece without a token goes on
 * to `next` (the normalizer or the pre-tokenizer), each token's id to out. */
typedef bool (*piece_fn)(const tokenizer_hf *t, encode_ctx *c, const char *s, size_t n, bool at_start,
                         keel_ids *out);

static bool split_added(const tokenizer_hf *t, encode_ctx *c, const match_set *set, const char *s, size_t n,
                        bool at_start, piece_fn next, keel_ids *out) {
    if (set->n == 0) return next(t, c, s, n, at_start, out);
    size_t start_offset = 0, q = 0;
    while (q < n) {
        if (set->first[(uint8_t)s[q]] == set->first[(uint8_t)s[q] + 1]) {
            q++;
            continue;
        }
        int32_t k = longest_at(t, set, s, n, q);
        if (k < 0) {
            q++;
            continue;
        }
        const added_token *a = &t->added[k];
        size_t start = q, stop = q + a->pattern.len;
        q = stop;
        if (a->single_word) {
            bool start_space = start == 0 || !is_class_char(t->word_re, c, s, n, char_before(s, start));
            bool stop_space = stop == n || !is_class_char(t->word_re, c, s, n, stop);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t new_start = start;
            while (new_start > 0) {
                size_t prev = char_before(s, new_start);
                if (!is_class_char(t->space_re, c, s, n, prev)) break;
                new_start = prev;
            }
            start = new_start > start_offset ? new_start : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                size_t len = hf_regex_match_at(t->space_re, c->ms, s, n, stop);
                if (!len) break;
                stop += len;
            }
        }
        if (start_offset < start && !next(t, c, s + start_offset, start - start_offset, at_start && start_offset == 0, out))
            return false;
        ids_push(out, a->id);
        start_offset = stop;
    }
    if (start_offset < n) return next(t, c, s + start_offset, n - start_offset, at_start && start_offset == 0, out);
    return true;
}

static bool normalized_piece(const tokenizer_hf *t, encode_ctx *c, const char *s, size_t n, bool at_start,
                             keel_ids *out) {
    return pre_tokenize(t, c, 0, s, n, at_start, out);
}

static bool raw_piece(const tokenizer_hf *t, encode_ctx *c, const char *s, size_t n, bool at_start,
                      keel_ids *out) {
    const char *ns;
    size_t nn;
    if (!normalize(t, c, s, n, &ns, &nn)) return false;
    if (nn > MAX_LINE) return whyf(c, "a line normalizes to over 2 GiB; split it into shorter lines");
    return split_added(t, c, &t->norm_set, ns, nn, at_start, normalized_piece, out);
}

/* ---- public encode ------------------------------------------------------------ */

static bool encode_with(const tokenizer_hf *t, encode_ctx *c, const char *text, size_t len, keel_ids *out) {
    if (hf_utf8_valid_prefix(text, len) != len) {
        utf8_lossy(text, len, &c->fixed);
        text = c->fixed.p;
        len = c->fixed.n;
    }
    if (len > MAX_LINE) return whyf(c, "a line of %zu bytes is over 2 GiB; split it into shorter lines", len);
    return split_added(t, c, &t->raw_set, text, len, true, raw_piece, out);
}

keel_status tokenizer_hf_encode(const tokenizer_hf *t, const char *text, size_t len, keel_ids *out) {
    out->n = 0;
    ctx_slot *slot;
    encode_ctx *c = ctx_acquire(t, &slot);
    encode_ctx *own = c ? NULL : (c = ctx_new());
    bool ok = encode_with(t, c, len ? text : "", len, out);
    if (!ok) keel_errorf("tokenizer %s: %s", t->name, c->why);
    if (slot) pthread_mutex_unlock(&slot->lock);
    ctx_free(own);
    return ok ? KEEL_OK : KEEL_ERR_INPUT;
}

/* ---- decode --------------------------------------------------------------------- */

/* A list of strings: token i is text.p[off[i], off[i] + len[i]). */
typedef struct {
    buf text;
    size_t *off, *len;
    size_t n, cap;
} tok_list;

static void list_add(tok_list *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->off = keel_xrealloc(l->off, l->cap * sizeof *l->off, "decoded tokens");
        l->len = keel_xrealloc(l->len, l->cap * sizeof *l->len, "decoded tokens");
    }
    l->off[l->n] = l->text.n;
    l->len[l->n] = n;
    buf_put(&l->text, s, n);
    l->n++;
}

/* Append to the last token (there is one). */
static void list_append(tok_list *l, const char *s, size_t n) {
    buf_put(&l->text, s, n);
    l->len[l->n - 1] += n;
}

static const char *list_at(const tok_list *l, size_t i) { return l->text.p + l->off[i]; }

static void list_free(tok_list *l) {
    keel_free(l->text.p);
    keel_free(l->off);
    keel_free(l->len);
}

static int hex_digit(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> its byte as ByteFallback reads it (u8::from_str_radix of NN,
 * which takes a '+' sign), else -1. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (s[3] == '+' && lo >= 0) return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

static void flush_bytes(tok_list *dst, buf *bytes) {
    if (!bytes->n) return;
    if (hf_utf8_valid_prefix(bytes->p, bytes->n) == bytes->n) {
        list_add(dst, bytes->p, bytes->n);
    } else {
        for (size_t i = 0; i < bytes->n; i++) list_add(dst, REPLACEMENT_CHAR, 3);
    }
    bytes->n = 0;
}

static void dec_byte_fallback(const tok_list *src, tok_list *dst) {
    buf bytes = {0};
    for (size_t i = 0; i < src->n; i++) {
        int b = byte_token(list_at(src, i), src->len[i]);
        if (b >= 0) {
            char ch = (char)b;
            buf_put(&bytes, &ch, 1);
            continue;
        }
        flush_bytes(dst, &bytes);
        list_add(dst, list_at(src, i), src->len[i]);
    }
    flush_bytes(dst, &bytes);
    keel_free(bytes.p);
}

static void dec_byte_level(const tokenizer_hf *t, const tok_list *src, tok_list *dst) {
    buf bytes = {0};
    for (size_t i = 0; i < src->n; i++) {
        const char *s = list_at(src, i);
        size_t n = src->len[i], mark = bytes.n;
        bool all = true;
        for (size_t k = 0; k < n && all;) {
            size_t len = char_len(s + k);
            uint32_t cp = code_point(s + k, len);
            all = cp < 0x144 && t->char_bytes[cp] >= 0;
            if (all) {
                char ch = (char)t->char_bytes[cp];
                buf_put(&bytes, &ch, 1);
            }
            k += len;
        }
        if (!all) { /* a token with a character outside the map keeps its own bytes */
            bytes.n = mark;
            buf_put(&bytes, s, n);
        }
    }
    buf fixed = {0};
    utf8_lossy(bytes.p ? bytes.p : "", bytes.n, &fixed);
    list_add(dst, fixed.p ? fixed.p : "", fixed.n);
    keel_free(fixed.p);
    keel_free(bytes.p);
}

static void dec_strip(const tokenizer_hf *t, const dec_step *d, const tok_list *src, tok_list *dst) {
    const char *ch = str_of(t, d->content);
    size_t ch_len = d->content.len;
    for (size_t i = 0; i < src->n; i++) {
        const char *s = list_at(src, i);
        size_t n = src->len[i];
        size_t start_cut = 0; /* bytes */
        for (size_t k = 0; k < d->start && start_cut < n; k++) {
            if (n - start_cut >= ch_len && memcmp(s + start_cut, ch, ch_len) == 0) start_cut += ch_len;
            else break;
        }
        size_t stop_cut = n;
        for (size_t k = 0; k < d->stop && stop_cut > 0; k++) {
            if (stop_cut >= ch_len && memcmp(s + stop_cut - ch_len, ch, ch_len) == 0) stop_cut -= ch_len;
            else break;
        }
        list_add(dst, s + start_cut, stop_cut > start_cut ? stop_cut - start_cut : 0);
    }
}

static void dec_metaspace(const tokenizer_hf *t, const dec_step *d, const tok_list *src, tok_list *dst) {
    const char *rep = str_of(t, d->content);
    size_t rep_len = d->content.len;
    for (size_t i = 0; i < src->n; i++) {
        const char *s = list_at(src, i);
        size_t n = src->len[i];
        list_add(dst, "", 0);
        for (size_t k = 0; k < n;) {
            size_t len = char_len(s + k);
            if (len == rep_len && memcmp(s + k, rep, rep_len) == 0) {
                if (!(i == 0 && d->scheme != PREPEND_NEVER)) list_append(dst, " ", 1);
            } else {
                list_append(dst, s + k, len);
            }
            k += len;
        }
    }
}

static bool dec_replace(const tokenizer_hf *t, encode_ctx *c, const dec_step *d, const tok_list *src,
                        tok_list *dst) {
    for (size_t i = 0; i < src->n; i++) {
        const char *s = list_at(src, i);
        size_t count = 0;
        if (!find_matches(t, c, &d->pat, s, src->len[i], 0, &count)) return false;
        list_add(dst, "", 0);
        const range *r = c->ranges[0];
        for (size_t k = 0; k < count; k++) {
            if (r[k].is_match) list_append(dst, str_of(t, d->content), d->content.len);
            else list_append(dst, s + r[k].start, r[k].end - r[k].start);
        }
    }
    return true;
}

static bool decode_step(const tokenizer_hf *t, encode_ctx *c, const dec_step *d, const tok_list *src,
                        tok_list *dst) {
    switch (d->kind) {
    case DEC_BYTE_LEVEL: dec_byte_level(t, src, dst); break;
    case DEC_BYTE_FALLBACK: dec_byte_fallback(src, dst); break;
    case DEC_FUSE:
        list_add(dst, "", 0);
        for (size_t i = 0; i < src->n; i++) list_append(dst, list_at(src, i), src->len[i]);
        break;
    case DEC_STRIP: dec_strip(t, d, src, dst); break;
    case DEC_METASPACE: dec_metaspace(t, d, src, dst); break;
    case DEC_REPLACE: return dec_replace(t, c, d, src, dst);
    }
    return true;
}

keel_status tokenizer_hf_decode(const tokenizer_hf *t, const int32_t *ids, size_t n, char **text,
                                size_t *len) {
    *text = NULL;
    *len = 0;
    tok_list lists[2];
    memset(lists, 0, sizeof lists);
    tok_list *cur = &lists[0], *next = &lists[1];
    for (size_t i = 0; i < n; i++) {
        span s = t->id_str[ids[i]];
        if (s.len != UINT32_MAX) list_add(cur, str_of(t, s), s.len);
    }
    /* a context (its regex state and ranges) from the pool, as encode has */
    ctx_slot *slot;
    encode_ctx *c = ctx_acquire(t, &slot);
    encode_ctx *own = c ? NULL : (c = ctx_new());
    keel_status st = KEEL_OK;
    for (int k = 0; k < t->n_dec; k++) {
        next->n = 0;
        next->text.n = 0;
        if (!decode_step(t, c, &t->dec[k], cur, next)) {
            keel_errorf("tokenizer %s: %s", t->name, c->why);
            st = KEEL_ERR_INPUT;
            break;
        }
        tok_list *swap = cur;
        cur = next;
        next = swap;
    }
    if (slot) pthread_mutex_unlock(&slot->lock);
    ctx_free(own);
    if (st == KEEL_OK) {
        buf out = {0};
        for (size_t i = 0; i < cur->n; i++) {
            if (i && !t->has_decoder) buf_put(&out, " ", 1);
            buf_put(&out, list_at(cur, i), cur->len[i]);
        }
        buf_reserve(&out, 1);
        out.p[out.n] = 0;
        *text = out.p;
        *len = out.n;
    }
    list_free(&lists[0]);
    list_free(&lists[1]);
    return st;
}

void tokenizer_hf_free(tokenizer_hf *t) {
    if (!t) return;
    for (unsigned i = 0; i < t->n_slots; i++) {
        ctx_free(t->slots[i].ctx);
        pthread_mutex_destroy(&t->slots[i].lock);
    }
    keel_free(t->slots);
    for (int i = 0; i < t->n_regexes; i++) hf_regex_free(t->regexes[i]);
    hf_map_free(&t->vocab);
    keel_free(t->merges);
    keel_free(t->char_ids);
    keel_free(t->added);
    keel_free(t->raw_set.order);
    keel_free(t->norm_set.order);
    keel_free(t->id_str);
    keel_free(t->strings);
    keel_free(t->name);
    keel_free(t);
}

int tokenizer_hf_vocab_size(const tokenizer_hf *t) { return t->V; }
int tokenizer_hf_bos_id(const tokenizer_hf *t) { return t->bos_id; }
int tokenizer_hf_eos_id(const tokenizer_hf *t) { return t->eos_id; }

int tokenizer_hf_special_id(const tokenizer_hf *t, const char *token) {
    size_t n = strlen(token);
    for (uint32_t i = 0; i < t->n_added; i++) {
        const added_token *a = &t->added[i];
        if (a->content.len != n || memcmp(str_of(t, a->content), token, n) != 0) continue;
        return a->normalized || a->lstrip || a->rstrip || a->single_word ? -1 : a->id;
    }
    return -1;
}
