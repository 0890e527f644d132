/* data/tokenizer_hf_load.c: a Hugging Face tokenizer.json (and the
 * tokenizer_config.json beside it) read into the model tokenizer_hf.c runs.
 *
 * Each component is read as the tokenizers library (0.23) deserializes it and
 * anything keel does not reproduce is refused with one line naming the file
 * and the component (see tokenizer_hf.c for what is reproduced). Loading also
 * does what tokenizers does on load: the merges become a (left, right) ->
 * (rank, new id) table and must name tokens of the vocabulary, added tokens
 * get their ids (AddedVocabulary::add_tokens) and normalized forms, and the
 * ids must be dense enough to index (a crafted file cannot ask for gigabytes
 * with a few bytes). cJSON parses; integers go through keel_json_int. */
#include "data/tokenizer_hf_model.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_NESTING 8         /* Sequence inside Sequence */
#define MAX_VOCAB (1 << 24)   /* ids below 16M (Llama 3: 128256; Gemma: 256000) */

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    char why[300];
} parse_error;

static bool failf(parse_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool failf(parse_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->why, sizeof err->why, fmt, ap);
    va_end(ap);
    return false;
}

/* A string from the file for a message: at most 40 bytes, control bytes as '?'. */
static const char *shown(const char *s, char *out, size_t size) {
    size_t n = strlen(s);
    if (n > 40) n = 40;
    if (n > size - 1) n = size - 1;
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)s[i] < 0x20 ? '?' : s[i];
    out[n] = 0;
    return out;
}

/* s[0, n) appended to t->strings (s may point into them: it is found again after they move). */
static span add_string(tokenizer_hf *t, const char *s, size_t n) {
    if (t->strings_cap - t->strings_len < n + 1) {
        uintptr_t base = (uintptr_t)t->strings, at = (uintptr_t)s;
        bool inside = t->strings && at >= base && at < base + t->strings_len;
        size_t cap = t->strings_cap ? t->strings_cap : 1 << 16;
        while (cap - t->strings_len < n + 1) cap *= 2;
        t->strings = keel_xrealloc(t->strings, cap, "tokenizer strings");
        t->strings_cap = cap;
        if (inside) s = t->strings + (at - base);
    }
    span sp = {(uint32_t)t->strings_len, (uint32_t)n};
    memcpy(t->strings + t->strings_len, s, n);
    t->strings[t->strings_len + n] = 0;
    t->strings_len += n + 1;
    return sp;
}

static const cJSON *get(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

static bool is_null(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* obj.key as a bool (absent or null: def). */
static bool get_bool(const cJSON *obj, const char *key, bool def, const char *where, bool *out, parse_error *err) {
    const cJSON *v = get(obj, key);
    if (is_null(v)) *out = def;
    else if (cJSON_IsBool(v)) *out = cJSON_IsTrue(v);
    else return failf(err, "%s.%s must be true or false", where, key);
    return true;
}

/* obj.key as a string (absent or null: NULL when optional). */
static bool get_string(const cJSON *obj, const char *key, bool optional, const char *where, const char **out,
                       parse_error *err) {
    const cJSON *v = get(obj, key);
    *out = NULL;
    if (is_null(v) && optional) return true;
    if (!cJSON_IsString(v) || !v->valuestring) return failf(err, "%s.%s must be a string", where, key);
    *out = v->valuestring;
    return true;
}

/* One character of a string field (Metaspace's replacement, Strip's content). */
static bool get_char(const cJSON *obj, const char *key, const char *where, const char **out, parse_error *err) {
    if (!get_string(obj, key, false, where, out, err)) return false;
    size_t n = strlen(*out);
    if (n == 0 || char_len(*out) != n) return failf(err, "%s.%s must be one character", where, key);
    return true;
}

static const char *type_of(const cJSON *obj) {
    const cJSON *v = get(obj, "type");
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : NULL;
}

static bool add_regex(tokenizer_hf *t, const char *src, size_t n, const char *where, hf_regex **out,
                      parse_error *err) {
    if (t->n_regexes == (int)(sizeof t->regexes / sizeof t->regexes[0]))
        return failf(err, "has too many regexes (at most %d)", t->n_regexes);
    char why[200];
    *out = hf_regex_compile(src, n, why, sizeof why);
    if (!*out) return failf(err, "%s regex is invalid: %s", where, why);
    t->regexes[t->n_regexes++] = *out;
    return true;
}

/* {"String": s} or {"Regex": r} (Split's and Replace's pattern). */
static bool parse_pattern(tokenizer_hf *t, const cJSON *obj, const char *where, pattern *p, parse_error *err) {
    const cJSON *v = get(obj, "pattern");
    const cJSON *s = get(v, "String"), *r = get(v, "Regex");
    *p = (pattern){0};
    if (cJSON_IsString(s) && s->valuestring) {
        if (!s->valuestring[0]) return failf(err, "%s has an empty String pattern", where);
        p->literal = add_string(t, s->valuestring, strlen(s->valuestring));
        return true;
    }
    if (cJSON_IsString(r) && r->valuestring) return add_regex(t, r->valuestring, strlen(r->valuestring), where, &p->re, err);
    return failf(err, "%s.pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

static bool parse_normalizer(tokenizer_hf *t, const cJSON *n, int depth, parse_error *err) {
    if (is_null(n)) return true;
    const char *type = type_of(n);
    if (!type) return failf(err, "normalizer has no type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(n, "normalizers"), *item;
        if (!cJSON_IsArray(list)) return failf(err, "normalizer Sequence has no normalizers list");
        if (depth >= MAX_NESTING) return failf(err, "normalizer Sequences are nested too deep");
        cJSON_ArrayForEach(item, list) if (!parse_normalizer(t, item, depth + 1, err)) return false;
        return true;
    }
    if (t->n_norm == MAX_STEPS) return failf(err, "has more than %d normalizers", MAX_STEPS);
    norm_step *ns = &t->norm[t->n_norm];
    const char *s;
    if (strcmp(type, "Prepend") == 0) {
        if (!get_string(n, "prepend", false, "normalizer Prepend", &s, err)) return false;
        *ns = (norm_step){.kind = NORM_PREPEND, .content = add_string(t, s, strlen(s))};
    } else if (strcmp(type, "Replace") == 0) {
        *ns = (norm_step){.kind = NORM_REPLACE};
        if (!parse_pattern(t, n, "normalizer Replace", &ns->pat, err) ||
            !get_string(n, "content", false, "normalizer Replace", &s, err))
            return false;
        ns->content = add_string(t, s, strlen(s));
    } else {
        char name[48];
        return failf(err, "normalizer %s is not supported (keel reproduces Prepend, Replace and Sequence)",
                     shown(type, name, sizeof name));
    }
    t->n_norm++;
    return true;
}

static bool parse_scheme(const cJSON *obj, const char *where, prepend_scheme *out, parse_error *err) {
    const cJSON *v = get(obj, "prepend_scheme");
    bool add_prefix_space = true;
    if (!get_bool(obj, "add_prefix_space", true, where, &add_prefix_space, err)) return false;
    *out = PREPEND_ALWAYS;
    if (!is_null(v)) {
        if (!cJSON_IsString(v) || !v->valuestring) return failf(err, "%s.prepend_scheme must be a string", where);
        if (strcmp(v->valuestring, "always") == 0) *out = PREPEND_ALWAYS;
        else if (strcmp(v->valuestring, "first") == 0) *out = PREPEND_FIRST;
        else if (strcmp(v->valuestring, "never") == 0) *out = PREPEND_NEVER;
        else return failf(err, "%s.prepend_scheme must be always, first or never", where);
    }
    if (!add_prefix_space) { /* the older form: add_prefix_space false means never */
        if (*out != PREPEND_NEVER && !is_null(v))
            return failf(err, "%s: add_prefix_space false does not match prepend_scheme", where);
        *out = PREPEND_NEVER;
    }
    return true;
}

static bool parse_pre_tokenizer(tokenizer_hf *t, const cJSON *p, int depth, parse_error *err) {
    if (is_null(p)) return true;
    const char *type = type_of(p);
    if (!type) return failf(err, "pre_tokenizer has no type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(p, "pretokenizers"), *item;
        if (!cJSON_IsArray(list)) return failf(err, "pre_tokenizer Sequence has no pretokenizers list");
        if (depth >= MAX_NESTING) return failf(err, "pre_tokenizer Sequences are nested too deep");
        cJSON_ArrayForEach(item, list) if (!parse_pre_tokenizer(t, item, depth + 1, err)) return false;
        return true;
    }
    if (t->n_pre == MAX_STEPS) return failf(err, "has more than %d pre-tokenizers", MAX_STEPS);
    pre_step *ps = &t->pre[t->n_pre];
    *ps = (pre_step){0};
    if (strcmp(type, "Split") == 0) {
        static const char *behaviors[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                          "Contiguous"};
        const char *b;
        ps->kind = PRE_SPLIT;
        if (!parse_pattern(t, p, "pre_tokenizer Split", &ps->pat, err) ||
            !get_string(p, "behavior", false, "pre_tokenizer Split", &b, err) ||
            !get_bool(p, "invert", false, "pre_tokenizer Split", &ps->invert, err))
            return false;
        int k = 0;
        while (k < 5 && strcmp(b, behaviors[k]) != 0) k++;
        if (k == 5) return failf(err, "pre_tokenizer Split.behavior must be one of Isolated, Removed, "
                                      "MergedWithPrevious, MergedWithNext, Contiguous");
        ps->behavior = (split_behavior)k;
    } else if (strcmp(type, "ByteLevel") == 0) {
        ps->kind = PRE_BYTE_LEVEL;
        if (!get_bool(p, "add_prefix_space", true, "pre_tokenizer ByteLevel", &ps->add_prefix_space, err) ||
            !get_bool(p, "use_regex", true, "pre_tokenizer ByteLevel", &ps->use_regex, err))
            return false;
        if (ps->use_regex && !t->gpt2_re &&
            !add_regex(t, GPT2_PATTERN, strlen(GPT2_PATTERN), "ByteLevel", &t->gpt2_re, err))
            return false;
    } else if (strcmp(type, "Metaspace") == 0) {
        const char *r;
        ps->kind = PRE_METASPACE;
        if (!get_char(p, "replacement", "pre_tokenizer Metaspace", &r, err) ||
            !parse_scheme(p, "pre_tokenizer Metaspace", &ps->scheme, err) ||
            !get_bool(p, "split", true, "pre_tokenizer Metaspace", &ps->split, err))
            return false;
        ps->replacement = add_string(t, r, strlen(r));
    } else {
        char name[48];
        return failf(err, "pre_tokenizer %s is not supported (keel reproduces Split, ByteLevel, Metaspace "
                          "and Sequence)", shown(type, name, sizeof name));
    }
    t->n_pre++;
    return true;
}

static bool parse_decoder(tokenizer_hf *t, const cJSON *d, int depth, parse_error *err) {
    if (is_null(d)) return true;
    t->has_decoder = true;
    const char *type = type_of(d);
    if (!type) return failf(err, "decoder has no type");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = get(d, "decoders"), *item;
        if (!cJSON_IsArray(list)) return failf(err, "decoder Sequence has no decoders list");
        if (depth >= MAX_NESTING) return failf(err, "decoder Sequences are nested too deep");
        cJSON_ArrayForEach(item, list) if (!parse_decoder(t, item, depth + 1, err)) return false;
        return true;
    }
    if (t->n_dec == MAX_STEPS) return failf(err, "has more than %d decoders", MAX_STEPS);
    dec_step *ds = &t->dec[t->n_dec];
    *ds = (dec_step){0};
    const char *s;
    if (strcmp(type, "ByteLevel") == 0) {
        ds->kind = DEC_BYTE_LEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        ds->kind = DEC_BYTE_FALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        ds->kind = DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        ds->kind = DEC_REPLACE;
        if (!parse_pattern(t, d, "decoder Replace", &ds->pat, err) ||
            !get_string(d, "content", false, "decoder Replace", &s, err))
            return false;
        ds->content = add_string(t, s, strlen(s));
    } else if (strcmp(type, "Strip") == 0) {
        int64_t start, stop;
        ds->kind = DEC_STRIP;
        if (!get_char(d, "content", "decoder Strip", &s, err)) return false;
        if (!keel_json_int(get(d, "start"), 0, 1 << 20, &start) || !keel_json_int(get(d, "stop"), 0, 1 << 20, &stop))
            return failf(err, "decoder Strip.start and .stop must be integers in [0, 2^20]");
        ds->content = add_string(t, s, strlen(s));
        ds->start = (size_t)start;
        ds->stop = (size_t)stop;
    } else if (strcmp(type, "Metaspace") == 0) {
        ds->kind = DEC_METASPACE;
        if (!get_char(d, "replacement", "decoder Metaspace", &s, err) ||
            !parse_scheme(d, "decoder Metaspace", &ds->scheme, err))
            return false;
        ds->content = add_string(t, s, strlen(s));
    } else {
        char name[48];
        return failf(err, "decoder %s is not supported (keel reproduces ByteLevel, Replace, ByteFallback, "
                          "Fuse, Strip, Metaspace and Sequence)", shown(type, name, sizeof name));
    }
    t->n_dec++;
    return true;
}

/* ---- the model: vocabulary and merges -------------------------------------- */

static bool parse_vocab(tokenizer_hf *t, const cJSON *vocab, parse_error *err) {
    if (!cJSON_IsObject(vocab)) return failf(err, "model.vocab must be an object of token: id");
    const cJSON *e;
    char name[48];
    cJSON_ArrayForEach(e, vocab) {
        int64_t id;
        if (!e->string) return failf(err, "model.vocab has an entry without a name");
        if (!keel_json_int(e, 0, MAX_VOCAB - 1, &id))
            return failf(err, "model.vocab['%s'] must be an integer id in [0, %d)", shown(e->string, name, sizeof name),
                         MAX_VOCAB);
        span key = add_string(t, e->string, strlen(e->string)); /* (it may move t->strings) */
        hf_map_put(&t->vocab, t->strings, key, (int32_t)id);
    }
    return true;
}

static bool add_merge(tokenizer_hf *t, const char *a, const char *b, uint32_t rank, parse_error *err) {
    char name[48];
    size_t la = strlen(a), lb = strlen(b);
    int32_t ia = hf_map_get(&t->vocab, t->strings, a, la), ib = hf_map_get(&t->vocab, t->strings, b, lb);
    if (ia < 0 || ib < 0)
        return failf(err, "merge %u: token '%s' is not in the vocabulary", rank, shown(ia < 0 ? a : b, name, sizeof name));
    char *joined = keel_xmalloc(la + lb + 1, "merge");
    memcpy(joined, a, la);
    memcpy(joined + la, b, lb);
    int32_t id = hf_map_get(&t->vocab, t->strings, joined, la + lb);
    joined[la + lb] = 0;
    if (id < 0) failf(err, "merge %u: '%s' is not in the vocabulary", rank, shown(joined, name, sizeof name));
    keel_free(joined);
    if (id < 0) return false;
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint64_t i = mix64(key) & t->merges_mask;
    while (t->merges[i].key != EMPTY_KEY && t->merges[i].key != key) i = (i + 1) & t->merges_mask;
    t->merges[i] = (merge_slot){key, rank, id}; /* a pair given twice: the later rank (a HashMap) */
    return true;
}

static bool parse_merges(tokenizer_hf *t, const cJSON *merges, parse_error *err) {
    if (!cJSON_IsArray(merges)) return failf(err, "model.merges must be a list");
    size_t n = (size_t)cJSON_GetArraySize(merges), cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    t->merges = keel_xmalloc(cap * sizeof *t->merges, "merges");
    memset(t->merges, 0xff, cap * sizeof *t->merges);
    t->merges_mask = cap - 1;
    uint32_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (cJSON_IsString(m) && m->valuestring) { /* "a b" */
            const char *s = m->valuestring;
            if (strncmp(s, "#version", 8) == 0) continue;
            const char *space = strchr(s, ' ');
            if (!space || strchr(space + 1, ' '))
                return failf(err, "merge %u is not two tokens separated by one space", rank);
            char *a = keel_xmalloc((size_t)(space - s) + 1, "merge");
            memcpy(a, s, (size_t)(space - s));
            a[space - s] = 0;
            bool ok = add_merge(t, a, space + 1, rank, err);
            keel_free(a);
            if (!ok) return false;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) { /* ["a", "b"] */
            if (!add_merge(t, m->child->valuestring, m->child->next->valuestring, rank, err)) return false;
        } else {
            return failf(err, "merge %u must be \"a b\" or [\"a\", \"b\"]", rank);
        }
        rank++;
    }
    return true;
}

static bool parse_model(tokenizer_hf *t, const cJSON *model, parse_error *err) {
    if (!cJSON_IsObject(model)) return failf(err, "has no model");
    const char *type = type_of(model);
    char name[48];
    if (!type && get(model, "merges")) type = "BPE"; /* tokenizers reads an untyped model by its fields */
    if (!type) return failf(err, "model has no type");
    if (strcmp(type, "BPE") != 0)
        return failf(err, "model type %s is not supported (keel reads BPE models only)", shown(type, name, sizeof name));
    const cJSON *dropout = get(model, "dropout");
    if (!is_null(dropout) && (!cJSON_IsNumber(dropout) || dropout->valuedouble != 0))
        return failf(err, "model.dropout is set (BPE dropout is random; keel's ids are not)");
    const char *prefix, *suffix, *unk;
    if (!get_string(model, "continuing_subword_prefix", true, "model", &prefix, err) ||
        !get_string(model, "end_of_word_suffix", true, "model", &suffix, err) ||
        !get_string(model, "unk_token", true, "model", &unk, err) ||
        !get_bool(model, "fuse_unk", false, "model", &t->fuse_unk, err) ||
        !get_bool(model, "byte_fallback", false, "model", &t->byte_fallback, err) ||
        !get_bool(model, "ignore_merges", false, "model", &t->ignore_merges, err))
        return false;
    if ((prefix && prefix[0]) || (suffix && suffix[0]))
        return failf(err, "model.continuing_subword_prefix / end_of_word_suffix are not supported");
    if (!parse_vocab(t, get(model, "vocab"), err) || !parse_merges(t, get(model, "merges"), err)) return false;
    t->unk_id = -1;
    if (unk) {
        t->unk_token = add_string(t, unk, strlen(unk));
        int32_t id = hf_map_get(&t->vocab, t->strings, unk, strlen(unk));
        t->unk_id = id >= 0 ? id : -2;
    }
    return true;
}

/* ---- added tokens ----------------------------------------------------------- */

static bool same_token(const tokenizer_hf *t, const added_token *a, const added_token *b) {
    return a->content.len == b->content.len &&
           memcmp(str_of(t, a->content), str_of(t, b->content), a->content.len) == 0 &&
           a->single_word == b->single_word && a->lstrip == b->lstrip && a->rstrip == b->rstrip &&
           a->normalized == b->normalized && a->special == b->special;
}

/* The normalizer applied to s[0, n) into *out (an added token's normalized form). */
static bool normalize_content(tokenizer_hf *t, const char *s, size_t n, span *out, parse_error *err) {
    char *normed, why[300];
    size_t nn;
    if (!hf_normalize(t, s, n, &normed, &nn, why, sizeof why))
        return failf(err, "an added token cannot be normalized: %s", why);
    /* the strings are indexed with uint32 spans; a normalizer that blows a token up is refused */
    if (nn > ((size_t)1 << 20) || t->strings_len + nn >= (size_t)UINT32_MAX / 2) {
        keel_free(normed);
        return failf(err, "an added token normalizes to %zu bytes (over 1 MiB, or too many such)", nn);
    }
    *out = add_string(t, normed, nn);
    keel_free(normed);
    return true;
}

/* id -> slot of tokenizer_hf.added (open addressing; key -1 = empty). */
typedef struct {
    int32_t *keys;
    uint32_t *vals;
    uint32_t mask;
} id_map;

/* The value of id, inserted (*found false, value to be set) if it is not there. */
static uint32_t *id_slot(id_map *m, int32_t id, bool *found) {
    uint32_t i = (uint32_t)mix64((uint64_t)id) & m->mask;
    while (m->keys[i] != -1 && m->keys[i] != id) i = (i + 1) & m->mask;
    *found = m->keys[i] == id;
    m->keys[i] = id;
    return &m->vals[i];
}

/* One entry of added_tokens into a (its content added to the strings). */
static bool parse_added_entry(tokenizer_hf *t, const cJSON *e, uint32_t k, added_token *a, parse_error *err) {
    const char *content;
    int64_t file_id;
    *a = (added_token){.normalized = true, .cached = {0, NO_SPAN}};
    if (!get_string(e, "content", false, "added_tokens[]", &content, err)) return false;
    if (!keel_json_int(get(e, "id"), 0, UINT32_MAX, &file_id))
        return failf(err, "added_tokens[%u].id must be an integer in [0, 2^32)", k);
    if (!get_bool(e, "single_word", false, "added_tokens[]", &a->single_word, err) ||
        !get_bool(e, "lstrip", false, "added_tokens[]", &a->lstrip, err) ||
        !get_bool(e, "rstrip", false, "added_tokens[]", &a->rstrip, err) ||
        !get_bool(e, "normalized", true, "added_tokens[]", &a->normalized, err) ||
        !get_bool(e, "special", false, "added_tokens[]", &a->special, err))
        return false;
    a->content = add_string(t, content, strlen(content));
    return true;
}

/* AddedVocabulary::add_tokens as tokenizers 0.23 runs it on load: the id in
 * the file is not used (tokenizers only warns when it differs); a token keeps
 * the id its content already has (an earlier added token's, else the
 * model's), else gets the next one after the model's vocabulary. A later
 * token of the same id replaces an earlier one; a normalized form once
 * computed for an id stays (normalized_cache). */
static bool parse_added(tokenizer_hf *t, const cJSON *list, parse_error *err) {
    if (is_null(list)) return true;
    if (!cJSON_IsArray(list)) return failf(err, "added_tokens must be a list");
    uint32_t count = (uint32_t)cJSON_GetArraySize(list), cap = 16;
    while (cap < 2 * count + 2) cap *= 2;
    t->added = keel_xcalloc((count ? count : 1) * sizeof *t->added, "added tokens");
    id_map slots = {keel_xmalloc(cap * sizeof(int32_t), "added tokens"),
                    keel_xmalloc(cap * sizeof(uint32_t), "added tokens"), cap - 1};
    memset(slots.keys, 0xff, cap * sizeof(int32_t));
    str_map id_of_content = {0};
    int64_t next_id = t->vocab.n;
    const cJSON *e;
    uint32_t k = 0;
    bool ok = true;
    cJSON_ArrayForEach(e, list) {
        added_token a;
        if (!(ok = parse_added_entry(t, e, k++, &a, err))) break;
        if (a.content.len == 0) continue;
        const char *content = str_of(t, a.content);
        int32_t known = hf_map_get(&id_of_content, t->strings, content, a.content.len);
        bool found;
        if (known >= 0) { /* an id in id_of_content always has its slot */
            uint32_t *slot = id_slot(&slots, known, &found);
            if (same_token(t, &t->added[*slot], &a)) continue;
        }
        int64_t id = known >= 0 ? known : hf_map_get(&t->vocab, t->strings, content, a.content.len);
        if (id < 0) id = next_id++;
        if (id >= MAX_VOCAB) {
            ok = failf(err, "added token %u would get id %lld, over %d", k - 1, (long long)id, MAX_VOCAB);
            break;
        }
        a.id = (int32_t)id;
        uint32_t *slot = id_slot(&slots, a.id, &found);
        if (found) a.cached = t->added[*slot].cached;
        else *slot = t->n_added++;
        if (a.normalized && t->n_norm > 0) {
            span normed = {0, 0};
            if (!(ok = normalize_content(t, content, a.content.len, &normed, err))) break;
            content = str_of(t, a.content); /* normalize_content may have moved the strings */
            if (normed.len != a.content.len || memcmp(str_of(t, normed), content, normed.len) != 0) a.cached = normed;
        }
        t->added[*slot] = a;
        hf_map_put(&id_of_content, t->strings, a.content, a.id);
    }
    for (uint32_t i = 0; i < t->n_added; i++) {
        added_token *at = &t->added[i];
        at->pattern = at->normalized && at->cached.len != NO_SPAN ? at->cached : at->content;
    }
    hf_map_free(&id_of_content);
    keel_free(slots.keys);
    keel_free(slots.vals);
    return ok;
}

/* Sort a set's tokens by first byte, longest first; two equal patterns in one
 * set are refused (tokenizers' automaton builder refuses them too). */
static int by_pattern(const void *pa, const void *pb, void *arg) {
    const tokenizer_hf *t = arg;
    const added_token *a = &t->added[*(const uint32_t *)pa], *b = &t->added[*(const uint32_t *)pb];
    uint8_t fa = (uint8_t)t->strings[a->pattern.off], fb = (uint8_t)t->strings[b->pattern.off];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->pattern.len != b->pattern.len) return a->pattern.len > b->pattern.len ? -1 : 1;
    return memcmp(t->strings + a->pattern.off, t->strings + b->pattern.off, a->pattern.len);
}

static bool build_set(tokenizer_hf *t, match_set *set, bool normalized, parse_error *err) {
    set->order = keel_xmalloc((t->n_added ? t->n_added : 1) * sizeof *set->order, "added tokens");
    set->n = 0;
    for (uint32_t i = 0; i < t->n_added; i++) {
        if (t->added[i].normalized != normalized) continue;
        if (t->added[i].pattern.len == 0) return failf(err, "added token %d normalizes to nothing", t->added[i].id);
        set->order[set->n++] = i;
    }
    qsort_r(set->order, set->n, sizeof *set->order, by_pattern, t);
    for (uint32_t i = 0; i + 1 < set->n; i++)
        if (by_pattern(&set->order[i], &set->order[i + 1], t) == 0)
            return failf(err, "added tokens %d and %d match the same text", t->added[set->order[i]].id,
                         t->added[set->order[i + 1]].id);
    memset(set->first, 0, sizeof set->first);
    for (uint32_t i = 0; i < set->n; i++) set->first[(uint8_t)t->strings[t->added[set->order[i]].pattern.off] + 1]++;
    for (int b = 0; b < 256; b++) set->first[b + 1] += set->first[b];
    return true;
}

/* ---- tables and ids ----------------------------------------------------------- */

/* GPT-2's byte-to-character map (pre_tokenizers/byte_level.rs bytes_char):
 * printable Latin-1 bytes stand for themselves, the other 68 bytes for
 * U+0100 onwards in byte order. */
static void build_byte_map(tokenizer_hf *t) {
    int n = 0;
    for (int cp = 0; cp < 0x144; cp++) t->char_bytes[cp] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + n++;
        if (cp < 0x80) {
            t->byte_chars[b][0] = (char)cp;
            t->byte_chars_len[b] = 1;
        } else {
            t->byte_chars[b][0] = (char)(0xC0 | (cp >> 6));
            t->byte_chars[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_chars_len[b] = 2;
        }
        t->char_bytes[cp] = (int16_t)b;
    }
}

static void build_char_ids(tokenizer_hf *t) {
    t->char_ids = keel_xmalloc(0x800 * sizeof *t->char_ids, "character ids");
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char s[2];
        size_t n = 1;
        if (cp < 0x80) s[0] = (char)cp;
        else s[0] = (char)(0xC0 | (cp >> 6)), s[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
        t->char_ids[cp] = hf_map_get(&t->vocab, t->strings, s, n);
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_ids[b] = hf_map_get(&t->vocab, t->strings, s, 6);
    }
}

/* The text each id decodes from (an added token's normalized form wins, as
 * simple_id_to_token has it) and the vocabulary size. */
static bool build_ids(tokenizer_hf *t, parse_error *err) {
    int32_t max_id = -1;
    for (uint32_t e = 0; e < t->vocab.n; e++)
        if (t->vocab.vals[e] > max_id) max_id = t->vocab.vals[e];
    for (uint32_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    if (max_id < 0) return failf(err, "has an empty vocabulary");
    size_t entries = t->vocab.n + t->n_added;
    if ((size_t)max_id >= 2 * entries + 1024)
        return failf(err, "ids go up to %d for %zu tokens (too sparse to be a vocabulary)", max_id, entries);
    t->V = max_id + 1;
    t->id_str = keel_xmalloc((size_t)t->V * sizeof *t->id_str, "token strings");
    for (int32_t i = 0; i < t->V; i++) t->id_str[i] = (span){0, UINT32_MAX};
    char a[48], b[48];
    for (uint32_t e = 0; e < t->vocab.n; e++) {
        int32_t id = t->vocab.vals[e];
        if (t->id_str[id].len != UINT32_MAX)
            return failf(err, "tokens '%s' and '%s' both have id %d", shown(str_of(t, t->id_str[id]), a, sizeof a),
                         shown(str_of(t, t->vocab.keys[e]), b, sizeof b), id);
        t->id_str[id] = t->vocab.keys[e];
    }
    for (uint32_t i = 0; i < t->n_added; i++) {
        const added_token *at = &t->added[i];
        t->id_str[at->id] = at->cached.len != NO_SPAN ? at->cached : at->content;
    }
    return true;
}

/* bos_token / eos_token of tokenizer_config.json: a string or {"content": s}. */
static bool config_token(const tokenizer_hf *t, const cJSON *cfg, const char *key, int32_t *id, parse_error *err) {
    const cJSON *v = get(cfg, key);
    *id = -1;
    if (is_null(v)) return true;
    if (cJSON_IsObject(v)) v = get(v, "content");
    if (!cJSON_IsString(v) || !v->valuestring)
        return failf(err, "%s must be a string or {\"content\": string}", key);
    const char *s = v->valuestring;
    size_t n = strlen(s);
    for (uint32_t i = 0; i < t->n_added; i++)
        if (t->added[i].content.len == n && memcmp(str_of(t, t->added[i].content), s, n) == 0) {
            *id = t->added[i].id;
            return true;
        }
    *id = hf_map_get(&t->vocab, t->strings, s, n);
    char name[48];
    if (*id < 0) return failf(err, "%s '%s' is not a token of the tokenizer", key, shown(s, name, sizeof name));
    return true;
}

static cJSON *parse_json(const char *bytes, size_t len, parse_error *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(bytes, len, &end, false);
    if (!j) {
        size_t at = end && end >= bytes && end <= bytes + len ? (size_t)(end - bytes) : 0;
        failf(err, "is not valid JSON (truncated or damaged near byte %zu of %zu)", at, len);
    }
    return j;
}

bool tokenizer_hf_is_json(const void *bytes, size_t len) {
    const char *s = bytes;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') continue;
        return s[i] == '{';
    }
    return false;
}

static bool parse_tokenizer(tokenizer_hf *t, const cJSON *j, parse_error *err) {
    if (!cJSON_IsObject(j)) return failf(err, "is not a JSON object");
    const cJSON *version = get(j, "version");
    if (!is_null(version) && (!cJSON_IsString(version) || strcmp(version->valuestring, "1.0") != 0))
        return failf(err, "has version other than \"1.0\"");
    build_byte_map(t);
    if (!parse_model(t, get(j, "model"), err) || !parse_normalizer(t, get(j, "normalizer"), 0, err) ||
        !parse_pre_tokenizer(t, get(j, "pre_tokenizer"), 0, err) || !parse_decoder(t, get(j, "decoder"), 0, err) ||
        !parse_added(t, get(j, "added_tokens"), err) || !build_ids(t, err) ||
        !build_set(t, &t->raw_set, false, err) || !build_set(t, &t->norm_set, true, err))
        return false;
    build_char_ids(t);
    bool need_word = false, need_space = false;
    for (uint32_t i = 0; i < t->n_added; i++) {
        need_word |= t->added[i].single_word;
        need_space |= t->added[i].lstrip || t->added[i].rstrip;
    }
    /* Rust's regex \w and \s, which AddedVocabulary uses */
    static const char WORD[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
    static const char SPACE[] = "\\p{White_Space}";
    if (need_word && !add_regex(t, WORD, strlen(WORD), "single_word", &t->word_re, err)) return false;
    if (need_space && !add_regex(t, SPACE, strlen(SPACE), "lstrip", &t->space_re, err)) return false;
    return true;
}

keel_status tokenizer_hf_parse(const char *json, size_t len, const char *name, const char *config,
                               size_t config_len, const char *config_name, tokenizer_hf **out) {
    *out = NULL;
    tokenizer_hf *t = keel_xcalloc(sizeof *t, "tokenizer");
    t->name = keel_xstrdup(name);
    t->bos_id = t->eos_id = -1;
    parse_error err = {{0}};
    const char *bad = name; /* the file the error is in */
    cJSON *j = NULL, *cfg = NULL;
    bool ok = hf_utf8_valid_prefix(json, len) == len || failf(&err, "is not valid UTF-8 (at byte %zu)",
                                                           hf_utf8_valid_prefix(json, len));
    ok = ok && (j = parse_json(json, len, &err)) && parse_tokenizer(t, j, &err);
    if (ok && config) {
        bad = config_name;
        ok = (cfg = parse_json(config, config_len, &err)) &&
             (cJSON_IsObject(cfg) || failf(&err, "is not a JSON object")) &&
             config_token(t, cfg, "bos_token", &t->bos_id, &err) && config_token(t, cfg, "eos_token", &t->eos_id, &err);
    }
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    if (!ok && bad == config_name) {
        keel_errorf("%s (beside tokenizer %s): %s; its bos_token and eos_token must name tokens of the "
                    "tokenizer (or be null)", config_name, name, err.why);
    } else if (!ok) {
        keel_errorf("tokenizer %s: %s; pass a Hugging Face BPE tokenizer.json (byte-level as Llama 3's or "
                    "SentencePiece-style as Llama 2's) or a SentencePiece .model", name, err.why);
    }
    if (!ok) {
        tokenizer_hf_free(t);
        return KEEL_ERR_INPUT;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    t->n_slots = cpus < 4 ? 4 : cpus > 64 ? 64 : (unsigned)cpus;
    t->slots = keel_xcalloc(t->n_slots * sizeof *t->slots, "tokenizer contexts");
    for (unsigned i = 0; i < t->n_slots; i++) pthread_mutex_init(&t->slots[i].lock, NULL);
    *out = t;
    return KEEL_OK;
}
