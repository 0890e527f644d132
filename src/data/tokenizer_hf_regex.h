/* data/tokenizer_hf_regex.h: the regular expressions of a tokenizer.json
 * (written for Hugging Face tokenizers' Oniguruma) run by PCRE2. Internal to
 * the data module (tokenizer_hf.c).
 *
 *     char why[200];
 *     hf_regex *re = hf_regex_compile(pattern, strlen(pattern), why, sizeof why);
 *     hf_match_state *ms = hf_match_state_new();     // one per thread
 *     hf_find_iter it = {0};
 *     size_t start, end;
 *     while (hf_regex_next(re, ms, s, n, &it, &start, &end) == 1) use(start, end);
 *     hf_match_state_free(ms);
 *     hf_regex_free(re);
 *
 * A compiled pattern is read-only (any number of threads may match it); the
 * state a match needs (PCRE2's match data, limits and JIT stack) is per
 * thread. Subjects must be valid UTF-8 (they are not checked again). */
#ifndef KEEL_DATA_TOKENIZER_HF_REGEX_H
#define KEEL_DATA_TOKENIZER_HF_REGEX_H

#include <stdbool.h>
#include <stddef.h>

typedef struct hf_regex hf_regex;
typedef struct hf_match_state hf_match_state;

/* Compile an Oniguruma-syntax pattern of len bytes. Oniguruma's Unicode
 * meanings of \s \S (White_Space), \w \W (letters, marks, numbers, connector
 * punctuation), \h \H (hex digits) and \uHHHH are spelled out for PCRE2,
 * which is then given the pattern with UTF, UCP and MULTILINE (Oniguruma's
 * Ruby syntax: ^ and $ match at line ends) and JIT-compiled where it can be.
 * NULL on failure, with PCRE2's message and the offset in the pattern in
 * why. The caller frees with hf_regex_free. */
hf_regex *hf_regex_compile(const char *pattern, size_t len, char *why, size_t why_n);
void hf_regex_free(hf_regex *re);

/* A thread's matching state; free with hf_match_state_free. */
hf_match_state *hf_match_state_new(void);
void hf_match_state_free(hf_match_state *ms);

/* Where the next search starts: Oniguruma's find_iter as the onig crate
 * runs it (an empty match right after the previous match is skipped by
 * moving one character on). Zero-initialise per subject. */
typedef struct {
    size_t last_end, last_match_end;
    bool has_last_match;
} hf_find_iter;

/* The next match of re in s[0, n): 1 with [*start, *end), 0 when there is
 * none, -1 when PCRE2 gave up (a match or memory limit: a pathological
 * pattern), with the reason in why. */
int hf_regex_next(const hf_regex *re, hf_match_state *ms, const char *s, size_t n, hf_find_iter *it,
                  size_t *start, size_t *end, char *why, size_t why_n);

/* Length in bytes of the match of re anchored at s[pos] in s[0, n), or 0 when
 * it does not match there (or PCRE2 gave up). For one-character classes. */
size_t hf_regex_match_at(const hf_regex *re, hf_match_state *ms, const char *s, size_t n, size_t pos);

#endif
