/* data/tokenizer_hf_regex.c: tokenizer.json regular expressions (Oniguruma
 * syntax, as Hugging Face tokenizers compiles them) translated for and run by
 * PCRE2.
 *
 * The two engines agree on the syntax tokenizer.json files use (classes,
 * \p{L} and \p{N}, (?i:...), lookahead, counted repeats) and both search
 * leftmost-first with backtracking, so the matches are the same once the
 * shorthands that mean different things are spelled out: Oniguruma's \s is
 * Unicode's White_Space (PCRE2's also takes U+180E), its \w is letters,
 * marks, numbers and connector punctuation (PCRE2's: letters, numbers, '_'),
 * its \h a hex digit (PCRE2's: horizontal space), and it reads \uHHHH. No
 * Unicode table is written here: PCRE2 knows White_Space and the categories. */
#include "data/tokenizer_hf_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "keel/core.h"

struct hf_regex {
    pcre2_code *code;
};

struct hf_match_state {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
};

/* Bounds on one pcre2_match call, so a pathological pattern from a file fails
 * with a message instead of running for minutes or taking the memory: the
 * match limit is PCRE2's default, the heap limit 64 MiB (PCRE2's is 20 GB). */
#define MATCH_LIMIT 10000000u
#define HEAP_LIMIT_KIB (64u * 1024u)

/* The translated pattern; src[k] is the offset in the original of what byte k
 * came from, so PCRE2's error offsets can be given in the file's pattern. */
typedef struct {
    char *p;
    size_t *src;
    size_t n, cap, at; /* at: the original offset being translated */
} out_buf;

static void put(out_buf *o, const char *s, size_t n) {
    if (o->n + n + 1 > o->cap) {
        while (o->n + n + 1 > o->cap) o->cap = o->cap ? 2 * o->cap : 256;
        o->p = keel_xrealloc(o->p, o->cap, "regex pattern");
        o->src = keel_xrealloc(o->src, o->cap * sizeof *o->src, "regex pattern");
    }
    memcpy(o->p + o->n, s, n);
    for (size_t k = 0; k < n; k++) o->src[o->n + k] = o->at;
    o->n += n;
    o->p[o->n] = 0;
}

static void puts_(out_buf *o, const char *s) { put(o, s, strlen(s)); }

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Oniguruma's pattern in PCRE2's words (see the file's comment). Inside a
 * class the negated shorthands \W and \H have no class-member spelling and
 * are left to PCRE2. */
static void translate(const char *p, size_t n, out_buf *o) {
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        o->at = i;
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            const char *rep = NULL;
            switch (d) {
            case 's': rep = "\\p{White_Space}"; break;
            case 'S': rep = "\\P{White_Space}"; break;
            case 'w': rep = in_class ? "\\p{L}\\p{M}\\p{N}\\p{Pc}" : "[\\p{L}\\p{M}\\p{N}\\p{Pc}]"; break;
            case 'W': rep = in_class ? NULL : "[^\\p{L}\\p{M}\\p{N}\\p{Pc}]"; break;
            case 'h': rep = in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
            case 'H': rep = in_class ? NULL : "[^0-9a-fA-F]"; break;
            default: break;
            }
            if (rep) {
                puts_(o, rep);
                i += 2;
            } else if (d == 'u' && i + 6 <= n && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
                       is_hex(p[i + 4]) && is_hex(p[i + 5])) {
                puts_(o, "\\x{");
                put(o, p + i + 2, 4);
                puts_(o, "}");
                i += 6;
            } else {
                put(o, p + i, 2);
                i += 2;
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            size_t k = i + 1;
            if (k < n && p[k] == '^') k++;
            if (k < n && p[k] == ']') k++; /* a ']' first is a literal in both engines */
            put(o, p + i, k - i);
            i = k;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
            const char *close = NULL;
            for (size_t k = i + 2; k + 1 < n; k++)
                if (p[k] == ':' && p[k + 1] == ']') {
                    close = p + k + 2;
                    break;
                }
            if (close) {
                put(o, p + i, (size_t)(close - (p + i)));
                i = (size_t)(close - p);
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        put(o, p + i, 1);
        i++;
    }
    if (!o->p) put(o, "", 0);
}

hf_regex *hf_regex_compile(const char *pattern, size_t len, char *why, size_t why_n) {
    out_buf o = {0};
    translate(pattern, len, &o);
    int err;
    PCRE2_SIZE at;
    pcre2_code *code =
        pcre2_compile((PCRE2_SPTR)o.p, o.n,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, &err, &at, NULL);
    size_t at_in_file = at < o.n ? o.src[at] : len; /* PCRE2's offset, in the file's pattern */
    keel_free(o.p);
    keel_free(o.src);
    if (!code) {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(err, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error %d", err);
        snprintf(why, why_n, "PCRE2: %s at offset %zu", (const char *)msg, at_in_file);
        return NULL;
    }
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* the interpreter runs it where JIT cannot */
    hf_regex *re = keel_xmalloc(sizeof *re, "regex");
    re->code = code;
    return re;
}

void hf_regex_free(hf_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    keel_free(re);
}

hf_match_state *hf_match_state_new(void) {
    hf_match_state *ms = keel_xcalloc(sizeof *ms, "regex match state");
    ms->md = pcre2_match_data_create(1, NULL);
    ms->mctx = pcre2_match_context_create(NULL);
    if (!ms->md || !ms->mctx) {
        keel_errorf("out of memory creating PCRE2 match data");
        abort();
    }
    pcre2_set_match_limit(ms->mctx, MATCH_LIMIT);
    pcre2_set_heap_limit(ms->mctx, HEAP_LIMIT_KIB);
    ms->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (ms->jit_stack) pcre2_jit_stack_assign(ms->mctx, NULL, ms->jit_stack);
    return ms;
}

void hf_match_state_free(hf_match_state *ms) {
    if (!ms) return;
    pcre2_match_data_free(ms->md);
    pcre2_match_context_free(ms->mctx);
    pcre2_jit_stack_free(ms->jit_stack);
    keel_free(ms);
}

/* Bytes of the UTF-8 character at s[0] (valid UTF-8), at least 1. */
static size_t char_len(const char *s, size_t n) {
    uint8_t c = (uint8_t)s[0];
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return len < n ? len : n;
}

static int run(const hf_regex *re, hf_match_state *ms, const char *s, size_t n, size_t from,
               uint32_t options, size_t *start, size_t *end, char *why, size_t why_n) {
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, options | PCRE2_NO_UTF_CHECK, ms->md, ms->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        if (pcre2_get_error_message(rc, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error %d", rc);
        if (why) snprintf(why, why_n, "PCRE2: %s", (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ms->md);
    /* \K can move a match's start; a match outside [from, n] is not one this
     * caller can use as a piece */
    if (ov[0] < from || ov[0] > ov[1] || ov[1] > n) {
        if (why) snprintf(why, why_n, "the pattern gave a match outside the text (\\K?)");
        return -1;
    }
    *start = ov[0];
    *end = ov[1];
    return 1;
}

int hf_regex_next(const hf_regex *re, hf_match_state *ms, const char *s, size_t n, hf_find_iter *it,
                  size_t *start, size_t *end, char *why, size_t why_n) {
    for (;;) {
        if (it->last_end > n) return 0;
        size_t a, b;
        int rc = run(re, ms, s, n, it->last_end, 0, &a, &b, why, why_n);
        if (rc <= 0) return rc;
        if (a == b && it->has_last_match && it->last_match_end == b) {
            /* the onig crate: no empty match right after the last match; step one character */
            it->last_end += it->last_end < n ? char_len(s + it->last_end, n - it->last_end) : 1;
            continue;
        }
        it->last_end = b;
        it->last_match_end = b;
        it->has_last_match = true;
        *start = a;
        *end = b;
        return 1;
    }
}

size_t hf_regex_match_at(const hf_regex *re, hf_match_state *ms, const char *s, size_t n, size_t pos) {
    size_t a, b;
    if (run(re, ms, s, n, pos, PCRE2_ANCHORED, &a, &b, NULL, 0) != 1) return 0;
    return b - a;
}
